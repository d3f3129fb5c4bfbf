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

__all__ = ["ddpm_step", "conv1d_gn_mish", "channels_last_weight", "preferred_weight_layout", "use_kernelkit",
           "CONV_IMPLS", "CHANNELS_LAST_MIN_WEIGHTS"]

#: conv1d_gn_mish implementations: auto picks "direct" for convolutions with few taps (Cin * K <= 64, the
#: U-Net's first layer), else "cudnn" or "fused", whichever a cost model of both predicts faster
CONV_IMPLS = {"auto": 0, "fused": 1, "cudnn": 2, "direct": 3}


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
    "direct" (one kernel computing the convolution per output: for few taps Cin * K), "auto" (direct up to
    64 taps while a (batch, group) slab's work stays small, else cuDNN or fused by a cost model of both:
    the split kernel's time grows with B * L * Cout * Cin * K, cuDNN's with the weight's size, less so for a
    channels-last weight, see ``channels_last_weight``).
    """
    code = CONV_IMPLS.get(impl, impl) if isinstance(impl, str) else int(impl)
    if not isinstance(code, int):
        raise ValueError(f"conv1d_gn_mish: impl must be one of {sorted(CONV_IMPLS)} or 0/1/2, got {impl!r}")
    return _ops._op("conv1d_gn_mish", "conv1d_gn_mish")(x, weight, bias, gamma, beta, groups, eps, scale, shift,
                                                        residual, code)


def channels_last_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (Cout, Cin, K) with the same values, stored (Cout, K, Cin): the layout in which
    :func:`conv1d_gn_mish` hands it to cuDNN as a channels-last filter. cuDNN's fastest float32
    convolutions on Hopper read that layout, and transpose a (Cout, Cin, K) filter on every call (a 1024 x
    1024 x 5 filter: 87 us per call at batch 64 on an H200, 31 us stored this way). Every path of the op
    reads either layout in place."""
    if weight.dim() != 3:
        raise ValueError(f"channels_last_weight: weight must be 3-D (Cout, Cin, K), got shape {tuple(weight.shape)}")
    return weight.transpose(1, 2).contiguous().transpose(1, 2)


#: use_kernelkit stores convolution weights channels-last from this many elements on. cuDNN's channels-last
#: algorithm for smaller filters is slower than its transposing one (256x256x5, H100/H200: 33-36 vs 26-28 us
#: per call at batch 16-32), and the split kernel reads them faster contiguous.
CHANNELS_LAST_MIN_WEIGHTS = 1 << 19


def preferred_weight_layout(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` as :func:`use_kernelkit` stores it: :func:`channels_last_weight` from
    ``CHANNELS_LAST_MIN_WEIGHTS`` elements on, else contiguous (same values either way)."""
    if weight.numel() >= CHANNELS_LAST_MIN_WEIGHTS:
        return channels_last_weight(weight)
    return weight.contiguous()


def use_kernelkit(model, enable: bool = True):
    """Route the Conv1dBlocks (and their FiLM/residual) of a ``reference.unet1d.ConditionalUnet1D`` through
    :func:`conv1d_gn_mish` (``enable=False``: back to plain PyTorch). On CUDA the blocks' convolution
    weights of ``CHANNELS_LAST_MIN_WEIGHTS`` elements or more move to :func:`channels_last_weight`'s layout
    (same values and shapes; back to contiguous with ``enable=False``). Returns the model."""
    from .reference.unet1d import Conv1dBlock

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Conv1dBlock) and m.block[0].weight.is_cuda:
                w = m.block[0].weight
                w.data = preferred_weight_layout(w.data) if enable else w.data.contiguous()
    return model.set_conv_block_op(conv1d_gn_mish if enable else None)
