"""The Diffusion Policy example (examples/diffusion_policy): the U-Net's shapes, the kernelkit switch and the
cost-model fit on CPU; on the GPU the kernelkit loop (eager, CUDA graph, torch.compile) against pure PyTorch
with the same noise. Also: kernelkit itself never imports the example."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelkit.kernels import conv1d_gn_mish as conv_card
from kernelkit.reference.conv1d_gn_mish import UNET_CONV_SHAPES
from kernelkit.reference.ddpm_step import ddpm_step as ref_step

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))  # the example is a plain package there (its README)

from diffusion_policy import denoise, refit_cost_model, surgery, unet  # noqa: E402

HORIZON, ACTION_DIM, OBS_DIM = 16, 2, 40


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture(scope="module")
def model_cpu():
    return unet.make_unet(seed=0)


def _inputs(batch, steps, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, HORIZON, ACTION_DIM, generator=g)
    obs = torch.randn(batch, OBS_DIM, generator=g)
    noise = torch.randn(steps, batch, HORIZON, ACTION_DIM, generator=g)
    return x.to(device), obs.to(device), noise.to(device)


def test_conv_block_shapes(model_cpu):
    """The card's U-Net shape list (plain data in the reference) is the model's."""
    shapes = unet.conv_block_shapes(model_cpu, HORIZON)
    assert len(shapes) == 25  # 12 residual blocks x 2 + the final block
    assert set(shapes) == set(UNET_CONV_SHAPES) | {(256, 256, 16)}
    assert shapes[-1] == (256, 256, 16)


def test_forward_shapes_and_params(model_cpu):
    n = sum(p.numel() for p in model_cpu.parameters())
    assert 60e6 < n < 70e6, n  # Diffusion Policy's CNN U-Net at 256/512/1024 has ~65M parameters
    x, obs, _ = _inputs(3, 1, "cpu")
    with torch.no_grad():
        assert model_cpu(x, torch.tensor(7), obs).shape == x.shape
        assert model_cpu(x, 7, obs).shape == x.shape
    names = {k for k, _ in model_cpu.named_parameters()}
    assert "down_modules.0.0.blocks.0.block.0.weight" in names and "mid_modules.1.cond_encoder.1.weight" in names


def test_kernelkit_switch_cpu(model_cpu):
    """The CPU ops compose ATen: the switch must reproduce the PyTorch loop exactly (wiring of FiLM,
    residual and the step)."""
    sched = denoise.DenoiseSchedule(4)
    x, obs, noise = _inputs(2, 4, "cpu")
    with torch.no_grad():
        expected = denoise.denoise(model_cpu, sched, x, obs, noise)
        try:
            surgery.use_kernelkit(model_cpu)
            got = denoise.denoise(model_cpu, sched, x, obs, noise, surgery.kernelkit_step)
        finally:
            surgery.use_kernelkit(model_cpu, False)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(p.is_contiguous() for p in model_cpu.parameters())  # CPU weights keep their layout


def test_kernelkit_model_refuses_gradients(model_cpu):
    """The fused conv has no backward: with grad mode on, the model's parameters (which require grad) are
    refused loudly instead of silently getting no gradient."""
    x, obs, _ = _inputs(1, 1, "cpu")
    try:
        surgery.use_kernelkit(model_cpu)
        with pytest.raises(RuntimeError, match="conv1d_gn_mish: not differentiable, but .*weight.* requires grad"):
            model_cpu(x, 3, obs)
    finally:
        surgery.use_kernelkit(model_cpu, False)


def test_preferred_weight_layout():
    """use_kernelkit's layout: channels-last from the card's threshold (its C++ reports it), else
    contiguous; the values never change."""
    threshold = surgery.channels_last_min_weights()
    assert threshold == conv_card.config()["cost"]["cudnn_cl_small_filter"]
    big = torch.randn(512, 512, 5)
    small = conv_card.channels_last_weight(torch.randn(256, 256, 5))
    assert big.numel() >= threshold > small.numel()
    got = surgery.preferred_weight_layout(big)
    assert got.stride() == (512 * 5, 1, 512) and torch.equal(got, big)
    got = surgery.preferred_weight_layout(small)
    assert got.is_contiguous() and torch.equal(got, small)


def test_refit_recovers_known_constants():
    """The cost-model fit, on times generated from known constants (with 1% multiplicative noise), gives
    those constants back, and its picks are then never slower than the faster path by more than the noise."""
    cost = {"split_fixed_us": 12.0, "split_macs_per_ps": 5.5, "split_macs_per_ps_cl": 4.0, "cudnn_fixed_us": 18.0,
            "cudnn_us_per_mweight": 9.0, "cudnn_cl_fixed_us": 22.0, "cudnn_cl_us_per_mweight": 3.0,
            "cudnn_cl_small_us": 30.0, "cudnn_cl_small_filter": 1 << 19, "cudnn_cl_always_weights": 1 << 62}
    g = torch.Generator().manual_seed(3)
    cases = []
    for batch in (1, 4, 16, 64, 128):
        for cin, cout, length in UNET_CONV_SHAPES[1:]:
            for cl in (False, True):
                c = refit_cost_model.Case(batch, cin, cout, length, cl, 0.0, 0.0)
                p = refit_cost_model.predict(cost, c)
                jitter = 1 + 0.01 * torch.randn(2, generator=g)
                c.fused_us, c.cudnn_us = p["fused"] * float(jitter[0]), p["cudnn"] * float(jitter[1])
                cases.append(c)
    thresholds = ("cudnn_cl_small_filter", "cudnn_cl_always_weights")  # kept, not fitted
    start = {k: cost[k] if k in thresholds else 1.0 for k in refit_cost_model.FIELDS}
    new = refit_cost_model.fit(cases, start)
    for k in refit_cost_model.FIELDS:
        assert new[k] == pytest.approx(cost[k], rel=0.05), k
    assert refit_cost_model.pick_loss(new, cases) < 1.05


def test_refit_without_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    r = subprocess.run([sys.executable, "-m", "diffusion_policy.refit_cost_model"], cwd=ROOT / "examples",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "refit_cost_model: needs a CUDA GPU (it times conv1d_gn_mish's paths on the current one)"]


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or "")


def test_toolkit_does_not_import_the_application():
    """No module of the package (loader/, reference/) and no card (kernels/) imports the example or its
    U-Net: the application is built on kernelkit, not part of it."""
    files = [f for d in ("loader", "kernels", "reference") for f in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20
    for f in files:
        text = f.read_text()
        bad = [m for m in _imports(f) if "diffusion_policy" in m or "unet" in m or m.startswith("examples")]
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"
        assert "sys.path" not in text or "examples" not in text, f"{f.relative_to(ROOT)} may put examples/ on sys.path"


# ---- GPU -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models_gpu():
    ref_model = unet.make_unet(seed=0, device="cuda")
    kk_model = surgery.use_kernelkit(unet.make_unet(seed=0, device="cuda"))
    return ref_model, kk_model


@pytest.mark.gpu
def test_switch_moves_conv_weights_to_channels_last_and_back():
    model = unet.make_unet(seed=0, device="cuda")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    blocks = [m.block[0].weight for m in model.modules() if isinstance(m, unet.Conv1dBlock)]
    surgery.use_kernelkit(model)
    big = [w.numel() >= surgery.channels_last_min_weights() for w in blocks]
    assert 0 < sum(big) < len(blocks)  # the U-Net has both: 256x256x5 filters stay contiguous
    for w, channels_last in zip(blocks, big):
        _, cin, k = w.shape
        assert w.stride() == ((cin * k, 1, cin) if channels_last else (cin * k, k, 1)), w.shape
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    surgery.use_kernelkit(model, False)
    assert all(p.is_contiguous() for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.gpu
@pytest.mark.parametrize("batch", (1, 64))
def test_forward_matches(models_gpu, batch):
    ref_model, kk_model = models_gpu
    x, obs, _ = _inputs(batch, 1, "cuda")
    t = torch.tensor(37, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(kk_model(x, t, obs), ref_model(x, t, obs), rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", (1, 64))
def test_graphed_loop_matches_pytorch(models_gpu, batch):
    ref_model, kk_model = models_gpu
    sched = denoise.DenoiseSchedule(100, device="cuda")
    x, obs, noise = _inputs(batch, 100, "cuda")
    with torch.no_grad():
        expected = denoise.denoise(ref_model, sched, x, obs, noise, ref_step)
        eager = denoise.denoise(kk_model, sched, x, obs, noise, surgery.kernelkit_step)
    graphed = denoise.CUDAGraphDenoiser(kk_model, sched, x, obs, noise, surgery.kernelkit_step)
    got = graphed().clone()
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)  # same kernels, captured
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
    # replays with new inputs give the new answers
    for seed in (1, 2):
        x2, obs2, noise2 = _inputs(batch, 100, "cuda", seed=seed)
        got2 = graphed(x2, obs2, noise2).clone()
        with torch.no_grad():
            expected2 = denoise.denoise(ref_model, sched, x2, obs2, noise2, ref_step)
        torch.testing.assert_close(got2, expected2, rtol=2e-3, atol=2e-3)
        assert not torch.allclose(got2, got)


@pytest.mark.gpu
def test_pytorch_loop_graphs_too(models_gpu):
    ref_model, _ = models_gpu
    sched = denoise.DenoiseSchedule(10, device="cuda")
    x, obs, noise = _inputs(2, 10, "cuda")
    with torch.no_grad():
        expected = denoise.denoise(ref_model, sched, x, obs, noise, ref_step)
    got = denoise.CUDAGraphDenoiser(ref_model, sched, x, obs, noise, ref_step)()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_graphed_philox_loop_draws_new_noise(models_gpu):
    _, kk_model = models_gpu
    sched = denoise.DenoiseSchedule(10, device="cuda")
    x, obs, _ = _inputs(4, 10, "cuda")
    graphed = denoise.CUDAGraphDenoiser(kk_model, sched, x, obs, None, surgery.kernelkit_step)
    a, b = graphed().clone(), graphed().clone()
    assert torch.isfinite(a).all() and not torch.equal(a, b)
    assert a.abs().max() <= 1.0 + 1e-6  # the last step (t = 0) returns the clipped x0


@pytest.mark.gpu
def test_torch_compile_step_fullgraph(models_gpu):
    _, kk_model = models_gpu
    sched = denoise.DenoiseSchedule(3, device="cuda")
    x, obs, noise = _inputs(2, 3, "cuda")

    def step(xx, t, o, z):
        return denoise.denoise_step(kk_model, sched.coeffs, xx, t, o, z, surgery.kernelkit_step)

    compiled = torch.compile(step, fullgraph=True)
    with torch.no_grad():
        ex, got = x, x
        for i in range(len(sched)):
            t = sched.timesteps[i]
            ex = step(ex, t, obs, noise[i])
            got = compiled(got, t, obs, noise[i])
    torch.testing.assert_close(got, ex, rtol=1e-4, atol=1e-4)
