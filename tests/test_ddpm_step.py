"""ddpm_step card: the DDPM step vs diffusers' formula (CPU), the op vs its reference (CPU on CI, CUDA under
`gpu`), in-kernel Philox noise, errors, fake/opcheck, CUDA graphs, and a compile-only build for sm_90."""
import pytest
import torch
from ops_helpers import DEVICES, FLOAT_DTYPES, assert_close, lib, noncontig

import kernelkit
from kernelkit.kernels import ddpm_step as kd  # the card module: its public ddpm_step
from kernelkit.reference.ddpm_step import DDPMScheduler
from kernelkit.reference.ddpm_step import ddpm_step as ref
from kernelkit.reference.ddpm_step import ddpm_step_philox as ref_philox

CARD = "ddpm_step"
SPACINGS = ("leading", "linspace", "trailing")


def spec():
    return lib(CARD).spec


def _inputs(shape, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    eps, x, z = (torch.randn(shape, generator=g) * s for s in (1.0, 1.5, 1.0))
    return eps.to(device, dtype), x.to(device, dtype), z.to(device, dtype)


# ---- the schedule and the reference (CPU) -------------------------------------------------------------


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("steps", (100, 10, 16))
def test_table_step_equals_scheduler_step(spacing, steps):
    s = DDPMScheduler(timestep_spacing=spacing)
    s.set_timesteps(steps)
    coeffs = s.coefficients()
    eps, x, z = _inputs((3, 16, 2), "cpu")
    for t in s.timesteps.tolist():
        torch.testing.assert_close(ref(eps, torch.tensor(t), x, coeffs, z), s.step(eps, t, x, z), rtol=0, atol=0)
    visited = set(s.timesteps.tolist())
    assert all(torch.isnan(coeffs[t]).all() != (t in visited) for t in range(100))


def test_schedule_constants():
    s = DDPMScheduler()
    assert s.betas.shape == (100,) and s.betas.dtype == torch.float32
    assert float(s.betas.max()) == pytest.approx(0.999) and float(s.betas.min()) > 0  # capped at 0.999
    assert s.timesteps.tolist() == list(range(99, -1, -1))
    s.set_timesteps(10)
    assert s.timesteps.tolist() == list(range(90, -1, -10))  # 'leading', diffusers' default
    c = s.coefficients()
    assert float(c[0, 4]) == 0.0  # no noise at t = 0


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("steps", (100, 10))
def test_matches_diffusers(spacing, steps):
    diffusers = pytest.importorskip("diffusers")
    d = diffusers.DDPMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2", clip_sample=True,
                                prediction_type="epsilon", timestep_spacing=spacing)
    d.set_timesteps(steps)
    s = DDPMScheduler(timestep_spacing=spacing)
    s.set_timesteps(steps)
    assert d.timesteps.tolist() == s.timesteps.tolist()
    eps, x, _ = _inputs((2, 16, 2), "cpu")
    for t in s.timesteps.tolist():
        g1, g2 = torch.Generator().manual_seed(t), torch.Generator().manual_seed(t)
        expected = d.step(eps, t, x, generator=g1).prev_sample
        torch.testing.assert_close(s.step(eps, t, x, generator=g2), expected, rtol=1e-6, atol=1e-6)


# ---- the op -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_matches_reference(device, dtype):
    coeffs = DDPMScheduler().coefficients(device)
    for i, shape in enumerate(spec().shapes):
        eps, x, z = _inputs(shape, device, dtype, seed=i)
        for t in (99, 57, 1, 0):
            tt = torch.tensor(t, device=device)
            assert_close(kd.ddpm_step(eps, tt, x, coeffs, z), ref(eps, tt, x, coeffs, z), spec())


@pytest.mark.parametrize("device", DEVICES)
def test_noncontiguous_and_fewer_steps(device):
    s = DDPMScheduler()
    s.set_timesteps(10)
    coeffs = s.coefficients(device)
    eps, x, z = _inputs((64, 16, 2), device)
    ev, xv, zv = noncontig(eps), x.transpose(0, 2).contiguous().transpose(0, 2), noncontig(z)
    for t in s.timesteps.tolist():
        tt = torch.tensor([t], device=device)  # (1,) works as well as ()
        assert_close(kd.ddpm_step(ev, tt, xv, coeffs, zv), ref(ev, tt, xv, coeffs, zv))


@pytest.mark.parametrize("device", DEVICES)
def test_timestep_outside_schedule_gives_nan(device):
    s = DDPMScheduler()
    s.set_timesteps(10)
    coeffs = s.coefficients(device)
    eps, x, z = _inputs((5, 7), device)
    for t in (-1, 100, 55):  # out of range, out of range, not a timestep of this schedule
        assert kd.ddpm_step(eps, torch.tensor(t, device=device), x, coeffs, z).isnan().all()


def test_errors_cpu():
    coeffs = DDPMScheduler().coefficients()
    eps, x, z = _inputs((4, 3), "cpu")
    t = torch.tensor(5)
    cases = [
        ((eps, t.int(), x, coeffs, z), "timestep must be an int64 tensor"),
        ((eps, torch.tensor([1, 2]), x, coeffs, z), "timestep must hold exactly one element"),
        ((eps[:3], t, x, coeffs, z), "model_output must have the shape of sample"),
        ((eps.double(), t, x, coeffs, z), "must have the same dtype"),
        ((eps, t, x, coeffs[:, :4], z), "coeffs must be a float32"),
        ((eps, t, x, coeffs.double(), z), "coeffs must be a float32"),
        ((eps, t, x, coeffs, z[:2]), "noise must have the shape of sample"),
        ((eps.int(), t, x.int(), coeffs, z), "must be a float32, float64, float16 or bfloat16 tensor"),
    ]
    for args, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            kd.ddpm_step(*args)


@pytest.mark.gpu
def test_errors_cuda_devices():
    coeffs = DDPMScheduler().coefficients("cuda")
    eps, x, z = _inputs((4, 3), "cuda")
    with pytest.raises(RuntimeError, match="timestep must be on the device of sample"):
        kd.ddpm_step(eps, torch.tensor(5), x, coeffs, z)
    with pytest.raises(RuntimeError, match="coeffs must be on the device of sample"):
        kd.ddpm_step(eps, torch.tensor(5, device="cuda"), x, coeffs.cpu(), z)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    l = lib(CARD)
    coeffs = DDPMScheduler().coefficients(device)
    eps, x, z = _inputs((3, 16, 2), device)
    t = torch.tensor(42, device=device)
    torch.library.opcheck(l.ddpm_step.default, (eps, t, x, coeffs, z, 1.0))
    torch.library.opcheck(l.ddpm_step_philox.default, (eps, t, x, coeffs, 1.0),
                          test_utils=("test_schema", "test_faketensor"))


# ---- in-kernel Philox noise (CUDA) --------------------------------------------------------------------


def _philox_noise(out, eps, t, x, coeffs):
    """Recover z from a Philox step: (out - step without noise) / std_t."""
    base = ref(eps, t, x, coeffs, torch.zeros_like(x))
    return (out.double() - base.double()) / coeffs[int(t)][4].double()


@pytest.mark.gpu
def test_philox_seeded_statistics_and_t0():
    from scipy import stats

    coeffs = DDPMScheduler().coefficients("cuda")
    eps, x, _ = _inputs((64, 16, 2), "cuda")
    t = torch.tensor(50, device="cuda")
    g = torch.Generator("cuda")
    a = kd.ddpm_step(eps, t, x, coeffs, generator=g.manual_seed(1))
    b = kd.ddpm_step(eps, t, x, coeffs, generator=g.manual_seed(1))
    c = kd.ddpm_step(eps, t, x, coeffs, generator=g)  # advanced: new numbers
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    big = _inputs((1 << 18,), "cuda")
    z = _philox_noise(kd.ddpm_step(big[0], t, big[1], coeffs, generator=g), big[0], t, big[1], coeffs)
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02
    assert stats.kstest(z.cpu().numpy(), "norm").pvalue > 1e-4
    zz = z[: 1 << 18].reshape(-1, 4)  # neighbours within a Philox chunk are independent
    assert abs(float(torch.corrcoef(zz.T)[0, 1:].abs().max())) < 0.02
    t0 = torch.tensor(0, device="cuda")
    torch.testing.assert_close(kd.ddpm_step(eps, t0, x, coeffs), ref(eps, t0, x, coeffs, torch.zeros_like(x)))
    assert torch.isfinite(ref_philox(eps, t, x, coeffs)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
@pytest.mark.parametrize("n,view", [(4097, False), (1 << 14, False), (7, False), (4097, True), (1 << 14, True)])
def test_philox_noise_is_the_documented_draw(dtype, n, view):
    """Element 4c + k gets normal k of Philox subsequence c at the generator's offset (reference/philox.py),
    for whole 4-element chunks (one access per operand), the ragged last chunk, and unaligned views (element
    by element); a second call draws from the next offset. z is recovered from the step's output."""
    from kernelkit.reference.philox import normal4

    coeffs = DDPMScheduler().coefficients("cuda")
    eps, x, _ = _inputs((n + 1,), "cuda", dtype)
    if view:  # one element in: not aligned to a 4-element chunk
        eps, x = eps[1:], x[1:]
    else:
        eps, x = eps[:n], x[:n]
    t = torch.tensor(50, device="cuda")
    std = coeffs[50][4].double().item()
    g = torch.Generator("cuda").manual_seed(0x5EED_1234)
    base = ref(eps.double(), t, x.double(), coeffs, torch.zeros_like(x, dtype=torch.float64))
    double = dtype == torch.float64
    for call, offset in enumerate((0, 8 if double else 4)):
        out = kd.ddpm_step(eps, t, x, coeffs, generator=g)
        got = (out.double() - base) / std
        z, r = normal4(0x5EED_1234, torch.arange((n + 3) // 4), offset, double)
        z, r = z.reshape(-1)[:n], r.reshape(-1)[:n]
        if double:
            tol = 1e-11 * (1 + z.abs())
        else:  # the float transform's bound (sample_normal's test) plus the step's rounding, over std
            tol = 3e-6 * (1 + z.abs()) + 5e-7 / r.clamp(min=1e-3) + 2.0 ** -20 * (1 + base.abs().cpu()) / std
        worst = ((got.cpu() - z).abs() / tol).max().item()
        assert worst <= 1, f"call {call}: error up to {worst:.2f}x the bound"


@pytest.mark.gpu
def test_cuda_graph_replays_read_timestep_and_draw_new_noise():
    coeffs = DDPMScheduler().coefficients("cuda")
    eps, x, z = _inputs((8, 16, 2), "cuda")
    t = torch.tensor(99, device="cuda")
    kd.ddpm_step(eps, t, x, coeffs, z)  # load before capture
    kd.ddpm_step(eps, t, x, coeffs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_z = kd.ddpm_step(eps, t, x, coeffs, z)
        out_p = kd.ddpm_step(eps, t, x, coeffs)
    seen = []
    for step in (99, 30, 0):
        t.fill_(step)
        graph.replay()
        assert_close(out_z, ref(eps, t, x, coeffs, z))
        seen.append(out_p.clone())
    assert not torch.equal(seen[0], seen[1])
    torch.testing.assert_close(seen[2], ref(eps, t, x, coeffs, z))  # t = 0: no noise


@pytest.mark.gpu
def test_torch_compile_fullgraph():
    coeffs = DDPMScheduler().coefficients("cuda")
    eps, x, z = _inputs((2, 16, 2), "cuda")
    t = torch.tensor(10, device="cuda")
    fn = torch.compile(lambda e, tt, s, n: kd.ddpm_step(e, tt, s, coeffs, n) * 2, fullgraph=True)
    assert_close(fn(eps, t, x, z), ref(eps, t, x, coeffs, z) * 2)


def test_compiles_for_sm90():
    """The CUDA code and the binding build without a GPU (compile-only)."""
    info = kernelkit.load(CARD, arch="9.0", load=False)
    assert info.path.exists()


@pytest.mark.parametrize("device", DEVICES)
def test_spec_check(device):
    result = kernelkit.check(spec(), device=device, trials=2)
    assert result.ok, result.details()


# ---- refused arguments: a clip range that is not a range, gradients ----------------------------------


@pytest.mark.parametrize("clip", (-1.0, float("nan")), ids=("negative", "nan"))
@pytest.mark.parametrize("philox", (False, True), ids=("noise", "philox"))
def test_bad_clip_sample_range_is_refused(clip, philox):
    """A negative range clamps with min > max and NaN clamps nothing: both used to diverge silently."""
    coeffs = DDPMScheduler().coefficients()
    eps, x, z = _inputs((4, 3), "cpu")
    with pytest.raises(RuntimeError, match="clip_sample_range must be >= 0"):
        kd.ddpm_step(eps, torch.tensor(5), x, coeffs, None if philox else z, clip_sample_range=clip)
    with pytest.raises(ValueError, match="clip_sample_range must be >= 0"):
        ref(eps, torch.tensor(5), x, coeffs, z, clip)


@pytest.mark.parametrize("clip", (0.0, float("inf")))
def test_zero_and_infinite_clip_sample_range_match_the_reference(clip):
    coeffs = DDPMScheduler().coefficients()
    eps, x, z = _inputs((4, 3), "cpu")
    t = torch.tensor(5)
    assert_close(kd.ddpm_step(eps, t, x, coeffs, z, clip_sample_range=clip), ref(eps, t, x, coeffs, z, clip))


@pytest.mark.parametrize("clip", (-1.0, float("nan")), ids=("negative", "nan"))
def test_fake_kernel_refuses_a_bad_clip_sample_range(clip):
    from torch._subclasses.fake_tensor import FakeTensorMode

    l = lib(CARD)
    coeffs = DDPMScheduler().coefficients()
    eps, x, z = _inputs((4, 3), "cpu")
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(v) for v in (eps, torch.tensor(5), x, coeffs)]
        with pytest.raises(RuntimeError, match="clip_sample_range must be >= 0"):
            l.ddpm_step.default(*args, mode.from_tensor(z), clip)
        with pytest.raises(RuntimeError, match="clip_sample_range must be >= 0"):
            l.ddpm_step_philox.default(*args, clip)


@pytest.mark.parametrize("philox", (False, True), ids=("noise", "philox"))
def test_gradients_are_refused_naming_the_input(philox):
    """The step has no backward: an input that requires grad is an error, not an output without a grad."""
    coeffs = DDPMScheduler().coefficients()
    eps, x, z = _inputs((4, 3), "cpu")
    t = torch.tensor(5)
    noise = None if philox else z
    with pytest.raises(RuntimeError, match="ddpm_step(_philox)?: not differentiable, but sample requires grad"):
        kd.ddpm_step(eps, t, x.requires_grad_(), coeffs, noise)
    with torch.no_grad():
        out = kd.ddpm_step(eps, t, x, coeffs, noise)
    assert out.shape == x.shape and not out.requires_grad
