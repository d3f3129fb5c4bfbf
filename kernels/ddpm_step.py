"""ddpm_step card: the fused DDPMScheduler.step (spec, fake kernels, the public function :func:`ddpm_step`,
which ``SPEC.op`` points at, and the known-wrong twins the checker must reject)."""
from typing import Optional

import torch

import kernelkit
from kernelkit import cardkit
from kernelkit.reference.ddpm_step import NUM_COLS, DDPMScheduler
from kernelkit.reference.ddpm_step import ddpm_step as reference

_TABLES = {}  # device -> the 100-step squaredcos_cap_v2 coefficient table (built once per device)


def coefficient_table(device) -> torch.Tensor:
    device = torch.device(device)
    if device not in _TABLES:
        _TABLES[device] = DDPMScheduler(num_train_timesteps=100).coefficients(device)
    return _TABLES[device]


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
        return cardkit.current_op("ddpm_step", "ddpm_step")(model_output, timestep, sample, coeffs, noise,
                                                            clip_sample_range)
    return cardkit.current_op("ddpm_step", "ddpm_step_philox")(model_output, timestep, sample, coeffs, clip_sample_range,
                                                              generator=generator)


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    """(model_output, timestep, sample, coeffs, noise): N(0, 1) eps and noise, sample ~ N(0, 1.5^2) (some
    x0 predictions get clipped), a random timestep of the 100-step schedule (t = 0 included)."""
    gdev = generator.device if generator is not None else device
    eps = torch.randn(shape, dtype=torch.float32, device=gdev, generator=generator)
    x = torch.randn(shape, dtype=torch.float32, device=gdev, generator=generator) * 1.5
    z = torch.randn(shape, dtype=torch.float32, device=gdev, generator=generator)
    t = torch.randint(0, 100, (), device=gdev, generator=generator)
    eps, x, z = (v.to(device=device, dtype=dtype) for v in (eps, x, z))
    return eps, t.to(device), x, coefficient_table(device), z


def bytes_moved(args, out) -> int:
    return (args[0].numel() + args[2].numel() + args[4].numel() + out.numel()) * out.element_size()


SPEC = kernelkit.Spec(
    name="ddpm_step",
    reference=reference,
    make_inputs=make_inputs,
    op=ddpm_step,
    shapes=((1, 16, 2), (64, 16, 2), (7,), (1023,), (4097,), (0,), (3, 5, 7)),
    bench_sizes=((1, 16, 2), (64, 16, 2), (256, 16, 7), (1 << 20,), (1 << 24,)),
    bytes_moved=bytes_moved,
    tolerances={torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)},
    doc="DDPMScheduler.step (epsilon, clip_sample, squaredcos_cap_v2) fused; timestep read on the device",
)


def _check(model_output, timestep, sample, coeffs, noise=None):
    op = "ddpm_step"
    cardkit.check_pair(op, sample, "sample", model_output, "model_output")
    if model_output.shape != sample.shape:
        raise RuntimeError(f"{op}: model_output must have the shape of sample {list(sample.shape)}, got "
                           f"{list(model_output.shape)}")
    if timestep.dtype != torch.int64 or timestep.numel() != 1:
        raise RuntimeError(f"{op}: timestep must be an int64 tensor holding exactly one element, got {timestep.dtype} "
                           f"of shape {list(timestep.shape)}")
    if timestep.device != sample.device:
        raise RuntimeError(f"{op}: timestep must be on the device of sample ({sample.device}), got {timestep.device}")
    if coeffs.dtype != torch.float32 or coeffs.dim() != 2 or coeffs.shape[1] != NUM_COLS or coeffs.device != sample.device:
        raise RuntimeError(f"{op}: coeffs must be a float32 (T, {NUM_COLS}) table on {sample.device}, got {coeffs.dtype} "
                           f"of shape {list(coeffs.shape)} on {coeffs.device}")
    if noise is not None:
        cardkit.check_pair(op, sample, "sample", noise, "noise")
        if noise.shape != sample.shape:
            raise RuntimeError(f"{op}: noise must have the shape of sample {list(sample.shape)}, got {list(noise.shape)}")


def _check_clip(clip_sample_range):
    if not clip_sample_range >= 0:  # NaN too
        raise RuntimeError(f"ddpm_step: clip_sample_range must be >= 0 (x0 is clamped to [-r, r]; inf turns clipping "
                           f"off), got {clip_sample_range}")


def setup(lib):
    @torch.library.register_fake(lib.qualname("ddpm_step"))
    def _(model_output, timestep, sample, coeffs, noise, clip_sample_range=1.0):
        _check_clip(clip_sample_range)
        _check(model_output, timestep, sample, coeffs, noise)
        return sample.new_empty(sample.shape)

    @torch.library.register_fake(lib.qualname("ddpm_step_philox"))
    def _(model_output, timestep, sample, coeffs, clip_sample_range=1.0, *, generator=None):
        del generator  # the output's shape does not depend on it
        _check_clip(clip_sample_range)
        _check(model_output, timestep, sample, coeffs)
        return sample.new_empty(sample.shape)


# ---- known-wrong versions: kernelkit.check must reject every one (tests/test_wrong_twins.py) ----------------


def _no_clip(model_output, timestep, sample, coeffs, noise, _clip_sample_range=1.0):
    """Never clamps the x0 prediction (clip_sample ignored)."""
    return reference(model_output, timestep, sample, coeffs, noise, float("inf"))


def _next_row(model_output, timestep, sample, coeffs, noise, clip_sample_range=1.0):
    """Reads the coefficients of timestep t + 1: an off-by-one in the table index."""
    later = (timestep + 1).clamp(max=coeffs.shape[0] - 1)
    return reference(model_output, later, sample, coeffs, noise, clip_sample_range)


WRONG = {**cardkit.wrong_twins(reference, "skip_last", "skip_tail", "assumes_contiguous", "returns_float32",
                               "float64_via_float32"),
         **cardkit.wrong_twins(reference, "into_input", index=2),  # over sample, an in-place step
         "no_clip": _no_clip, "next_row": _next_row}
