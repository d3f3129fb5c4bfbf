"""Model surgery: put kernelkit's fused ops into the U-Net (``unet.py``) and its denoise loop (``denoise.py``).

    >>> from diffusion_policy import denoise, surgery, unet
    >>> model = surgery.use_kernelkit(unet.make_unet(device="cuda"))  # fused Conv1dBlocks
    >>> sched = denoise.DenoiseSchedule(100, device="cuda")
    >>> actions = denoise.denoise(model, sched, x, obs, None, surgery.kernelkit_step)  # Philox noise in the kernel
    >>> graphed = denoise.CUDAGraphDenoiser(model, sched, x, obs, None, surgery.kernelkit_step)  # one CUDA graph

Both ops are real torch ops of the cards ``conv1d_gn_mish`` and ``ddpm_step`` (``kernelkit.ops``), so
``torch.compile(fullgraph=True)`` and CUDA graph capture work. Neither has a backward: run the model under
``torch.no_grad()`` or ``torch.inference_mode()``.
"""
from __future__ import annotations

from typing import Optional

import torch

import kernelkit
from kernelkit.kernels import conv1d_gn_mish as conv_card

from .unet import ConditionalUnet1D, Conv1dBlock


def kernelkit_step(model_output: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor, coeffs: torch.Tensor,
                   noise: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One DDPMScheduler.step in one kernel, with the step-function signature ``denoise`` takes: ``noise``
    given, it is the variance noise; None draws it in the kernel with Philox from the default CUDA generator
    (graph-safe: each replay of a captured loop draws new numbers)."""
    if noise is None:
        return kernelkit.ops.ddpm_step_philox(model_output, timestep, sample, coeffs)
    return kernelkit.ops.ddpm_step(model_output, timestep, sample, coeffs, noise)


def channels_last_min_weights() -> int:
    """Filters of at least this many weights are stored channels-last (the threshold is the op's, reported by
    its build: cuDNN's channels-last algorithm is slower for smaller filters, which the split kernel also
    reads faster contiguous)."""
    return conv_card.config()["channels_last_min_weights"]


def preferred_weight_layout(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as :func:`use_kernelkit` stores it: ``channels_last_weight`` (the card's) from
    :func:`channels_last_min_weights` elements on, else contiguous (same values either way)."""
    if weight.numel() >= channels_last_min_weights():
        return conv_card.channels_last_weight(weight)
    return weight.contiguous()


def use_kernelkit(model: ConditionalUnet1D, enable: bool = True) -> ConditionalUnet1D:
    """Route the Conv1dBlocks (and their FiLM/residual) of ``model`` through kernelkit's ``conv1d_gn_mish``
    (``enable=False``: back to plain PyTorch). On CUDA the blocks' convolution weights move to
    :func:`preferred_weight_layout` (same values and shapes; back to contiguous with ``enable=False``).
    Returns the model."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Conv1dBlock) and m.block[0].weight.is_cuda:
                w = m.block[0].weight
                w.data = preferred_weight_layout(w.data) if enable else w.data.contiguous()
    return model.set_conv_block_op(kernelkit.ops.conv1d_gn_mish if enable else None)
