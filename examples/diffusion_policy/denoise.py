"""Diffusion Policy's DDPM denoise loop over the U-Net (no host synchronisation), one iteration of it for
``torch.compile``, and the whole loop captured as one CUDA graph.

The step function is pluggable: ``kernelkit.reference.ddpm_step.ddpm_step`` (pure PyTorch, the default) or
``surgery.kernelkit_step`` (kernelkit's fused step, Philox noise drawn in the kernel when none is given).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from kernelkit.reference.ddpm_step import DDPMScheduler
from kernelkit.reference.ddpm_step import ddpm_step as ddpm_step_reference

StepFn = Callable[..., torch.Tensor]  # (model_output, timestep, sample, coeffs, noise) -> prev sample


class DenoiseSchedule:
    """What the loop needs on the device: the inference timesteps (int64) and the coefficient table."""

    def __init__(self, num_inference_steps: int = 100, num_train_timesteps: int = 100, device=None,
                 timestep_spacing: str = "leading"):
        self.scheduler = DDPMScheduler(num_train_timesteps=num_train_timesteps, timestep_spacing=timestep_spacing)
        self.scheduler.set_timesteps(num_inference_steps)
        self.timesteps = self.scheduler.timesteps.to(device)
        self.coeffs = self.scheduler.coefficients(device)

    def __len__(self) -> int:
        return self.timesteps.shape[0]


def denoise(model: nn.Module, schedule: DenoiseSchedule, noisy_action: torch.Tensor, obs_cond: Optional[torch.Tensor],
            noise: Optional[torch.Tensor], step_fn: StepFn = ddpm_step_reference) -> torch.Tensor:
    """Run the DDPM loop from ``noisy_action`` (B, T, A): for each timestep, predict the noise with ``model``
    and take one ``step_fn``. ``noise`` (steps, B, T, A) gives the variance noise of each step (the same
    tensors make two implementations comparable); None asks ``step_fn`` to draw it (kernelkit's Philox
    step). No host synchronisation: the timestep of step i is ``schedule.timesteps[i]``, a device view."""
    x = noisy_action
    for i in range(len(schedule)):
        t = schedule.timesteps[i]
        eps = model(x, t, obs_cond)
        x = step_fn(eps, t, x, schedule.coeffs, None if noise is None else noise[i])
    return x


def denoise_step(model: nn.Module, coeffs: torch.Tensor, x: torch.Tensor, t: torch.Tensor,
                 obs_cond: Optional[torch.Tensor], z: Optional[torch.Tensor],
                 step_fn: StepFn = ddpm_step_reference) -> torch.Tensor:
    """One iteration of :func:`denoise` (what ``torch.compile`` compiles once and a Python loop replays)."""
    return step_fn(model(x, t, obs_cond), t, x, coeffs, z)


class CUDAGraphDenoiser:
    """The whole denoise loop captured as one CUDA graph with static inputs.

    Warm-up runs on a side stream, then ``torch.cuda.graph`` captures ``denoise`` reading the static
    tensors ``noisy_action``, ``obs_cond`` and ``noise`` (None: the step draws its own noise, e.g.
    kernelkit's graph-safe Philox, and every replay draws new numbers). ``__call__`` copies new inputs in,
    replays, and returns the static output (overwritten by the next replay: clone it to keep it).
    """

    def __init__(self, model: nn.Module, schedule: DenoiseSchedule, noisy_action: torch.Tensor,
                 obs_cond: Optional[torch.Tensor], noise: Optional[torch.Tensor], step_fn: StepFn = ddpm_step_reference,
                 warmup: int = 2):
        def clone(t):
            return None if t is None else t.detach().clone()

        self.noisy_action, self.obs_cond, self.noise = clone(noisy_action), clone(obs_cond), clone(noise)
        run = lambda: denoise(model, schedule, self.noisy_action, self.obs_cond, self.noise, step_fn)  # noqa: E731
        side = torch.cuda.Stream(self.noisy_action.device)
        side.wait_stream(torch.cuda.current_stream(self.noisy_action.device))
        with torch.no_grad():
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    run()
            torch.cuda.current_stream(self.noisy_action.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.output = run()

    def __call__(self, noisy_action: Optional[torch.Tensor] = None, obs_cond: Optional[torch.Tensor] = None,
                 noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        for static, new, name in ((self.noisy_action, noisy_action, "noisy_action"), (self.obs_cond, obs_cond, "obs_cond"),
                                  (self.noise, noise, "noise")):
            if new is None:
                continue
            if static is None or static.shape != new.shape:
                raise ValueError(f"CUDAGraphDenoiser: {name} must have the captured shape "
                                 f"{None if static is None else tuple(static.shape)}, got {tuple(new.shape)}")
            static.copy_(new)
        self.graph.replay()
        return self.output
