"""ddpm_step reference: diffusers' DDPMScheduler.step in pure PyTorch, and the table form the kernel uses.

Configuration (Diffusion Policy's): ``beta_schedule="squaredcos_cap_v2"``, ``num_train_timesteps=100``,
``prediction_type="epsilon"``, ``clip_sample=True`` (range 1), ``variance_type="fixed_small"``, no
thresholding; inference timesteps spaced like diffusers (``"leading"`` is its default, ``"linspace"``
and ``"trailing"`` too).

:class:`DDPMScheduler` is written formula for formula after ``diffusers.DDPMScheduler`` (``step``,
``_get_variance``, ``previous_timestep``, ``set_timesteps``), float32 0-d tensors included. Its
:meth:`~DDPMScheduler.coefficients` folds everything that depends only on the timestep into a small
float32 table, one row per train timestep, so one step is elementwise with the timestep read from a
tensor (graph-capturable); :func:`ddpm_step` is that step in torch ops, the kernelkit op's reference.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

#: columns of the coefficient table
COL_SQRT_ONE_MINUS_ALPHA_BAR, COL_SQRT_ALPHA_BAR, COL_COEF_X0, COL_COEF_XT, COL_STD = range(5)
NUM_COLS = 5


def betas_for_alpha_bar(num_diffusion_timesteps: int, max_beta: float = 0.999) -> torch.Tensor:
    """diffusers' ``betas_for_alpha_bar`` with ``alpha_transform_type="cosine"`` (squaredcos_cap_v2)."""

    def alpha_bar_fn(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = []
    for i in range(num_diffusion_timesteps):
        t1 = i / num_diffusion_timesteps
        t2 = (i + 1) / num_diffusion_timesteps
        betas.append(min(1 - alpha_bar_fn(t2) / alpha_bar_fn(t1), max_beta))
    return torch.tensor(betas, dtype=torch.float32)


class DDPMScheduler:
    """The subset of ``diffusers.DDPMScheduler`` Diffusion Policy uses, same arithmetic."""

    def __init__(self, num_train_timesteps: int = 100, clip_sample: bool = True, clip_sample_range: float = 1.0,
                 timestep_spacing: str = "leading", steps_offset: int = 0):
        if timestep_spacing not in ("leading", "linspace", "trailing"):
            raise ValueError(f"timestep_spacing must be 'leading', 'linspace' or 'trailing', got {timestep_spacing!r}")
        self.num_train_timesteps = num_train_timesteps
        self.clip_sample, self.clip_sample_range = clip_sample, clip_sample_range
        self.timestep_spacing, self.steps_offset = timestep_spacing, steps_offset
        self.betas = betas_for_alpha_bar(num_train_timesteps)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)
        self.one = torch.tensor(1.0)
        self.num_inference_steps: Optional[int] = None
        self.timesteps = torch.arange(num_train_timesteps - 1, -1, -1, dtype=torch.int64)

    def set_timesteps(self, num_inference_steps: int) -> None:
        n, T = num_inference_steps, self.num_train_timesteps
        if not 1 <= n <= T:
            raise ValueError(f"num_inference_steps must be in [1, {T}], got {n}")
        self.num_inference_steps = n
        if self.timestep_spacing == "linspace":
            ts = torch.linspace(0, T - 1, n, dtype=torch.float64).round().flip(0).to(torch.int64)
        elif self.timestep_spacing == "leading":
            ts = (torch.arange(0, n, dtype=torch.int64) * (T // n)).flip(0) + self.steps_offset
        else:  # trailing
            ts = torch.tensor([round(x) for x in _arange_float(T, 0, -T / n)], dtype=torch.int64) - 1
        self.timesteps = ts

    def previous_timestep(self, timestep: int) -> int:
        if self.num_inference_steps:
            index = int((self.timesteps == timestep).nonzero()[0][0])
            return -1 if index == self.timesteps.shape[0] - 1 else int(self.timesteps[index + 1])
        return timestep - 1  # num_train_timesteps // num_train_timesteps

    def _alpha_prods(self, t: int):
        prev_t = self.previous_timestep(t)
        alpha_prod_t = self.alphas_cumprod[t]
        alpha_prod_t_prev = self.alphas_cumprod[prev_t] if prev_t >= 0 else self.one
        return alpha_prod_t, alpha_prod_t_prev

    def _get_variance(self, t: int) -> torch.Tensor:
        alpha_prod_t, alpha_prod_t_prev = self._alpha_prods(t)
        current_beta_t = 1 - alpha_prod_t / alpha_prod_t_prev
        variance = (1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * current_beta_t
        return torch.clamp(variance, min=1e-20)  # variance_type "fixed_small"

    def _coefficients(self, t: int):
        alpha_prod_t, alpha_prod_t_prev = self._alpha_prods(t)
        beta_prod_t = 1 - alpha_prod_t
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        current_alpha_t = alpha_prod_t / alpha_prod_t_prev
        current_beta_t = 1 - current_alpha_t
        pred_original_sample_coeff = (alpha_prod_t_prev ** 0.5 * current_beta_t) / beta_prod_t
        current_sample_coeff = current_alpha_t ** 0.5 * beta_prod_t_prev / beta_prod_t
        std = self._get_variance(t) ** 0.5 if t > 0 else torch.tensor(0.0)
        return beta_prod_t ** 0.5, alpha_prod_t ** 0.5, pred_original_sample_coeff, current_sample_coeff, std

    def step(self, model_output: torch.Tensor, timestep: int, sample: torch.Tensor,
             noise: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``diffusers.DDPMScheduler.step(...).prev_sample``; ``noise`` is the variance noise (drawn with
        ``generator`` when None)."""
        t = int(timestep)
        sqrt_beta_prod_t, sqrt_alpha_prod_t, coef_x0, coef_xt, _ = self._coefficients(t)
        pred_original_sample = (sample - sqrt_beta_prod_t * model_output) / sqrt_alpha_prod_t
        if self.clip_sample:
            pred_original_sample = pred_original_sample.clamp(-self.clip_sample_range, self.clip_sample_range)
        pred_prev_sample = coef_x0 * pred_original_sample + coef_xt * sample
        variance = 0
        if t > 0:
            if noise is None:
                noise = torch.randn(model_output.shape, generator=generator, device=model_output.device,
                                    dtype=model_output.dtype)
            variance = (self._get_variance(t) ** 0.5) * noise
        return pred_prev_sample + variance

    def coefficients(self, device=None) -> torch.Tensor:
        """(num_train_timesteps, 5) float32: per train timestep t of the current schedule, sqrt(1 - ᾱ_t),
        sqrt(ᾱ_t), the x0 and x_t coefficients and the noise std (0 at t = 0); NaN rows for timesteps the
        schedule never visits (a wrong timestep then shows up as NaN, not as a silent wrong answer)."""
        table = torch.full((self.num_train_timesteps, NUM_COLS), float("nan"), dtype=torch.float32)
        for t in self.timesteps.tolist():
            table[t] = torch.stack([torch.as_tensor(c, dtype=torch.float32) for c in self._coefficients(t)])
        return table.to(device) if device is not None else table


def _arange_float(start: float, stop: float, step: float):
    out, x = [], float(start)
    while (step < 0 and x > stop) or (step > 0 and x < stop):
        out.append(x)
        x += step
    return out


def ddpm_step(model_output: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor, coeffs: torch.Tensor,
              noise: torch.Tensor, clip_sample_range: float = 1.0) -> torch.Tensor:
    """One DDPM step from the coefficient table: ``timestep`` is a 1-element int64 tensor (read on the
    device, no host sync), ``noise`` the variance noise (ignored at t = 0). Computed in float32 for
    half/bfloat16 (float64 stays float64), like the kernel. Pure tensor ops: torch.compile and CUDA graphs
    can capture it."""
    if not clip_sample_range >= 0:  # NaN too; a negative range would clamp with min > max
        raise ValueError(f"ddpm_step: clip_sample_range must be >= 0, got {clip_sample_range}")
    acc = torch.float64 if sample.dtype == torch.float64 else torch.float32
    t = timestep.reshape(()).long()
    c = coeffs.index_select(0, t.reshape(1)).reshape(NUM_COLS).to(acc)
    eps, x, z = model_output.to(acc), sample.to(acc), noise.to(acc)
    x0 = (x - c[COL_SQRT_ONE_MINUS_ALPHA_BAR] * eps) / c[COL_SQRT_ALPHA_BAR]
    x0 = x0.clamp(-clip_sample_range, clip_sample_range)
    prev = c[COL_COEF_X0] * x0 + c[COL_COEF_XT] * x
    prev = prev + torch.where(t > 0, c[COL_STD] * z, torch.zeros_like(z))
    return prev.to(sample.dtype)


def ddpm_step_philox(model_output, timestep, sample, coeffs, clip_sample_range: float = 1.0, generator=None):
    """:func:`ddpm_step` with the noise drawn from ``generator`` (a different stream of numbers than the
    kernel's in-kernel Philox: compare statistically)."""
    z = torch.randn(sample.shape, dtype=sample.dtype, device=sample.device, generator=generator)
    return ddpm_step(model_output, timestep, sample, coeffs, z, clip_sample_range)
