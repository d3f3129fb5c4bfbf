"""ddpm_step card: the fused DDPMScheduler.step (spec, fake kernels). Public functions: kernelkit.diffusion."""
import torch

import kernelkit
from kernelkit import diffusion
from kernelkit import ops as _ops
from kernelkit.reference.ddpm_step import NUM_COLS, DDPMScheduler
from kernelkit.reference.ddpm_step import ddpm_step as reference

_TABLES = {}  # device -> the 100-step squaredcos_cap_v2 coefficient table (built once per device)


def coefficient_table(device) -> torch.Tensor:
    device = torch.device(device)
    if device not in _TABLES:
        _TABLES[device] = DDPMScheduler(num_train_timesteps=100).coefficients(device)
    return _TABLES[device]


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
    op=diffusion.ddpm_step,  # kernelkit.ops has no per-card wrapper for it
    shapes=((1, 16, 2), (64, 16, 2), (7,), (1023,), (4097,), (0,), (3, 5, 7)),
    bench_sizes=((1, 16, 2), (64, 16, 2), (256, 16, 7), (1 << 20,), (1 << 24,)),
    bytes_moved=bytes_moved,
    tolerances={torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)},
    doc="DDPMScheduler.step (epsilon, clip_sample, squaredcos_cap_v2) fused; timestep read on the device",
)


def _check(model_output, timestep, sample, coeffs, noise=None):
    op = "ddpm_step"
    _ops._check_pair(op, sample, "sample", model_output, "model_output")
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
        _ops._check_pair(op, sample, "sample", noise, "noise")
        if noise.shape != sample.shape:
            raise RuntimeError(f"{op}: noise must have the shape of sample {list(sample.shape)}, got {list(noise.shape)}")


def setup(lib):
    @torch.library.register_fake(lib.qualname("ddpm_step"))
    def _(model_output, timestep, sample, coeffs, noise, clip_sample_range=1.0):
        _check(model_output, timestep, sample, coeffs, noise)
        return sample.new_empty(sample.shape)

    @torch.library.register_fake(lib.qualname("ddpm_step_philox"))
    def _(model_output, timestep, sample, coeffs, clip_sample_range=1.0, *, generator=None):
        _check(model_output, timestep, sample, coeffs)
        return sample.new_empty(sample.shape)

    _ops._bind(lib, ("ddpm_step", "ddpm_step_philox"))
