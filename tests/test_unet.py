"""The Diffusion Policy U-Net and its denoise loop: shapes and the kernelkit switch on CPU; on the GPU the
kernelkit loop (eager, CUDA graph, torch.compile) against pure PyTorch with the same noise."""
import pytest
import torch

import kernelkit.diffusion as kd
from kernelkit.reference import unet1d
from kernelkit.reference.ddpm_step import ddpm_step as ref_step

HORIZON, ACTION_DIM, OBS_DIM = 16, 2, 40


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture(scope="module")
def model_cpu():
    return unet1d.make_unet(seed=0)


def _inputs(batch, steps, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, HORIZON, ACTION_DIM, generator=g)
    obs = torch.randn(batch, OBS_DIM, generator=g)
    noise = torch.randn(steps, batch, HORIZON, ACTION_DIM, generator=g)
    return x.to(device), obs.to(device), noise.to(device)


def test_conv_block_shapes(model_cpu):
    shapes = unet1d.conv_block_shapes(model_cpu, HORIZON)
    assert len(shapes) == 25  # 12 residual blocks x 2 + the final block
    assert set(shapes) == set(unet1d.UNET_CONV_SHAPES) | {(256, 256, 16)}
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
    sched = unet1d.DenoiseSchedule(4)
    x, obs, noise = _inputs(2, 4, "cpu")
    with torch.no_grad():
        expected = unet1d.denoise(model_cpu, sched, x, obs, noise)
        try:
            kd.use_kernelkit(model_cpu)
            got = unet1d.denoise(model_cpu, sched, x, obs, noise, kd.ddpm_step)
        finally:
            kd.use_kernelkit(model_cpu, False)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(p.is_contiguous() for p in model_cpu.parameters())  # CPU weights keep their layout


# ---- GPU -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models_gpu():
    ref_model = unet1d.make_unet(seed=0, device="cuda")
    kk_model = kd.use_kernelkit(unet1d.make_unet(seed=0, device="cuda"))
    return ref_model, kk_model


@pytest.mark.gpu
def test_switch_moves_conv_weights_to_channels_last_and_back():
    model = unet1d.make_unet(seed=0, device="cuda")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    blocks = [m.block[0].weight for m in model.modules() if isinstance(m, unet1d.Conv1dBlock)]
    kd.use_kernelkit(model)
    big = [w.numel() >= kd.CHANNELS_LAST_MIN_WEIGHTS for w in blocks]
    assert 0 < sum(big) < len(blocks)  # the U-Net has both: 256x256x5 filters stay contiguous
    for w, channels_last in zip(blocks, big):
        _, cin, k = w.shape
        assert w.stride() == ((cin * k, 1, cin) if channels_last else (cin * k, k, 1)), w.shape
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    kd.use_kernelkit(model, False)
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
    sched = unet1d.DenoiseSchedule(100, device="cuda")
    x, obs, noise = _inputs(batch, 100, "cuda")
    with torch.no_grad():
        expected = unet1d.denoise(ref_model, sched, x, obs, noise, ref_step)
        eager = unet1d.denoise(kk_model, sched, x, obs, noise, kd.ddpm_step)
    graphed = unet1d.CUDAGraphDenoiser(kk_model, sched, x, obs, noise, kd.ddpm_step)
    got = graphed().clone()
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)  # same kernels, captured
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
    # replays with new inputs give the new answers
    for seed in (1, 2):
        x2, obs2, noise2 = _inputs(batch, 100, "cuda", seed=seed)
        got2 = graphed(x2, obs2, noise2).clone()
        with torch.no_grad():
            expected2 = unet1d.denoise(ref_model, sched, x2, obs2, noise2, ref_step)
        torch.testing.assert_close(got2, expected2, rtol=2e-3, atol=2e-3)
        assert not torch.allclose(got2, got)


@pytest.mark.gpu
def test_pytorch_loop_graphs_too(models_gpu):
    ref_model, _ = models_gpu
    sched = unet1d.DenoiseSchedule(10, device="cuda")
    x, obs, noise = _inputs(2, 10, "cuda")
    with torch.no_grad():
        expected = unet1d.denoise(ref_model, sched, x, obs, noise, ref_step)
    got = unet1d.CUDAGraphDenoiser(ref_model, sched, x, obs, noise, ref_step)()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_graphed_philox_loop_draws_new_noise(models_gpu):
    _, kk_model = models_gpu
    sched = unet1d.DenoiseSchedule(10, device="cuda")
    x, obs, _ = _inputs(4, 10, "cuda")
    graphed = unet1d.CUDAGraphDenoiser(kk_model, sched, x, obs, None, kd.ddpm_step)
    a, b = graphed().clone(), graphed().clone()
    assert torch.isfinite(a).all() and not torch.equal(a, b)
    assert a.abs().max() <= 1.0 + 1e-6  # the last step (t = 0) returns the clipped x0


@pytest.mark.gpu
def test_torch_compile_step_fullgraph(models_gpu):
    _, kk_model = models_gpu
    sched = unet1d.DenoiseSchedule(3, device="cuda")
    x, obs, noise = _inputs(2, 3, "cuda")

    def step(xx, t, o, z):
        return unet1d.denoise_step(kk_model, sched.coeffs, xx, t, o, z, kd.ddpm_step)

    compiled = torch.compile(step, fullgraph=True)
    with torch.no_grad():
        ex, got = x, x
        for i in range(len(sched)):
            t = sched.timesteps[i]
            ex = step(ex, t, obs, noise[i])
            got = compiled(got, t, obs, noise[i])
    torch.testing.assert_close(got, ex, rtol=1e-4, atol=1e-4)
