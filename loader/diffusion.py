"""kernelkit.diffusion: the Diffusion Policy kernels as Python functions, and the switch that puts them into
the U-Net of ``kernelkit.reference.unet1d``.

    >>> import kernelkit.diffusion as kd
    >>> from kernelkit.reference import unet1d
    >>> model = kd.use_kernelkit(unet1d.make_unet(device="cuda"))       # fused Conv1dBlocks
    >>> sched = unet1d.DenoiseSchedule(100, device="cuda")
    >>> actions = unet1d.denoise(model, sched, x, obs, None, kd.ddpm_step)  # Philox noise in the kernel
    >>> graphed = unet1d.CUDAGraphDenoiser(model, sched, x, obs, None, kd.ddpm_step)  # one CUDA graph

Both functions call real torch ops (cards ``kernels/ddpm_step`` and ``kernels/conv1d_gn_mish``) with fake
kernels, so ``torch.compile(fullgraph=True)`` and CUDA graph capture work.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import ops as _ops

__all__ = ["ddpm_step", "conv1d_gn_mish", "use_kernelkit", "CONV_IMPLS"]

#: conv1d_gn_mish implementations: auto picks cuDNN for the convolution when B * L >= 256
CONV_IMPLS = {"auto": 0, "fused": 1, "cudnn": 2}


def ddpm_step(model_output: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor, coeffs: torch.Tensor,
              noise: Optional[torch.Tensor] = None, *, clip_sample_range: float = 1.0,
              generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One DDPMScheduler.step (epsilon prediction, clip_sample, fixed_small variance) in one kernel.

    Args:
        model_output: predicted noise, same shape/dtype/device as ``sample`` (float32/64/16, bfloat16).
        timestep: 1-element int64 tensor on the device of ``sample`` holding the current train timestep
            (read by the kernel: no host sync, so a whole loop can be captured in a CUDA graph). A timestep
            outside the table, or one the schedule never visits, gives NaN.
        coeffs: the schedule's (T, 5) float32 table, ``reference.ddpm_step.DDPMScheduler(...).coefficients(device)``.
        noise: the variance noise z (ignored at t = 0); None draws it in the kernel with Philox from
            ``generator`` (default CUDA generator): graph-safe, each replay draws new numbers.
        clip_sample_range: x0 is clamped to [-r, r] (``inf`` disables clipping).
    """
    if noise is not None:
        return _ops._op("ddpm_step", "ddpm_step")(model_output, timestep, sample, coeffs, noise, clip_sample_range)
    return _ops._op("ddpm_step", "ddpm_step_philox")(model_output, timestep, sample, coeffs, clip_sample_range,
                                                     generator=generator)


def conv1d_gn_mish(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], gamma: torch.Tensor,
                   beta: torch.Tensor, groups: int = 8, eps: float = 1e-5, scale: Optional[torch.Tensor] = None,
                   shift: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None, *,
                   impl: Union[str, int] = "auto") -> torch.Tensor:
    """``mish(group_norm(conv1d(x, weight, bias, padding=K//2), groups, gamma, beta, eps))`` fused, then
    ``* scale[..., None] + shift[..., None]`` (FiLM, (B, Cout)) and ``+ residual`` (B, Cout, L) if given.

    x (B, Cin, L); weight (Cout, Cin, K), K odd; Cout divisible by ``groups``. CUDA: float32; CPU: composed
    from ATen ops. ``impl``: "fused" (two kernels: split convolution, then GroupNorm+Mish+epilogue),
    "cudnn" (cuDNN convolution, honouring ``torch.backends.cudnn.allow_tf32``, then the fused epilogue),
    "auto" (cuDNN from B * L >= 256 on).
    """
    code = CONV_IMPLS.get(impl, impl) if isinstance(impl, str) else int(impl)
    if not isinstance(code, int):
        raise ValueError(f"conv1d_gn_mish: impl must be one of {sorted(CONV_IMPLS)} or 0/1/2, got {impl!r}")
    return _ops._op("conv1d_gn_mish", "conv1d_gn_mish")(x, weight, bias, gamma, beta, groups, eps, scale, shift,
                                                        residual, code)


def use_kernelkit(model, enable: bool = True):
    """Route the Conv1dBlocks (and their FiLM/residual) of a ``reference.unet1d.ConditionalUnet1D`` through
    :func:`conv1d_gn_mish` (``enable=False``: back to plain PyTorch). Returns the model."""
    return model.set_conv_block_op(conv1d_gn_mish if enable else None)
