"""Torch-style CUDA extensions in the three styles tutorials use, built by torch and by kernelkit from the
same sources: the two builds must agree bit for bit (same code, same seed) and match a PyTorch reference."""
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension as torch_ext

import kernelkit

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).parent / "fixtures" / "torch_ext"
sys.path.insert(0, str(FIXTURES))
import sigmoid_inline  # noqa: E402


def _both(tmp_path_factory, build_torch, build_kernelkit):
    return build_kernelkit(), build_torch(str(tmp_path_factory.mktemp("torch_build")))


@pytest.fixture(scope="module")
def cem(tmp_path_factory):
    """sample.cu + sample.cpp through load(name, sources, extra_cuda_cflags=[...])."""
    srcs = [str(FIXTURES / "sample.cu"), str(FIXTURES / "sample.cpp")]
    return _both(tmp_path_factory,
                 lambda bd: torch_ext.load("kk_cem", srcs, extra_cuda_cflags=["-O3"], build_directory=bd),
                 lambda: kernelkit.load("kk_cem", srcs, extra_cuda_cflags=["-O3"]))


@pytest.fixture(scope="module")
def sigmoid(tmp_path_factory):
    """load_inline(cpp_sources=declaration, cuda_sources=kernel + wrapper, functions=[...])."""
    kw = dict(cpp_sources=sigmoid_inline.CPP, cuda_sources=sigmoid_inline.cuda_source(), functions=["sigmoid"])
    return _both(tmp_path_factory, lambda bd: torch_ext.load_inline("kk_sig", build_directory=bd, **kw),
                 lambda: kernelkit.load_inline("kk_sig", **kw))


@pytest.fixture(scope="module")
def mul(tmp_path_factory):
    """One .cu with its own PYBIND11_MODULE."""
    src = [str(FIXTURES / "mul.cu")]
    return _both(tmp_path_factory, lambda bd: torch_ext.load("kk_mul", src, build_directory=bd),
                 lambda: kernelkit.load("kk_mul", src))


@pytest.mark.parametrize("d, n", [(1, 1), (7, 1000), (1000, 1023)])
def test_cem_sampling_matches_torchs_build(cem, d, n):
    ours, theirs = cem
    g = torch.Generator(device="cuda").manual_seed(d * n)
    mu = torch.randn(d, device="cuda", generator=g)
    sigma = torch.rand(d, device="cuda", generator=g) + 0.5
    a, b = ours.sample(mu, sigma, n, 1234), theirs.sample(mu, sigma, n, 1234)
    assert a.shape == (d, n) and torch.equal(a, b)
    if d * n >= 10000:  # the right distribution per row: standardised draws have mean 0, variance 1
        z = (a - mu[:, None]) / sigma[:, None]
        assert abs(z.mean().item()) < 0.02 and abs(z.var().item() - 1) < 0.03
    with pytest.raises(RuntimeError, match="must be float32"):
        ours.sample(mu.double(), sigma.double(), n, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("n", [1, 1000, 1 << 20])
def test_sigmoid_inline_matches_torchs_build_and_reference(sigmoid, dtype, n):
    ours, theirs = sigmoid
    x = torch.randn(n, device="cuda", dtype=dtype) * 8
    a, b = ours.sigmoid(x), theirs.sigmoid(x)
    assert torch.equal(a, b)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(a.double(), torch.sigmoid(x.double()), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(1,), (1000,), (513, 257), (0,)])
def test_mul_single_file_matches_torchs_build(mul, shape):
    ours, theirs = mul
    a = torch.randn(shape, device="cuda")
    b = torch.randn(shape, device="cuda")
    out_ours, out_theirs = ours.mul(a, b), theirs.mul(a, b)
    assert torch.equal(out_ours, out_theirs)
    torch.testing.assert_close(out_ours, a * b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="same shape"):
        ours.mul(a, torch.randn(2, 2, device="cuda"))


def test_sigmoid_edit_reloads_in_process_and_recompiles_the_cuda_unit_only(sigmoid):
    before = kernelkit.STATS["compiles"]
    edited = kernelkit.load_inline("kk_sig", sigmoid_inline.CPP, sigmoid_inline.cuda_source("2.0f"),
                                   functions=["sigmoid"])
    assert kernelkit.STATS["compiles"] - before == 1  # cuda.cu's device TU; its host TU and main.cpp reused
    x = torch.randn(4096, device="cuda")
    torch.testing.assert_close(edited.sigmoid(x), 2 * torch.sigmoid(x))
    torch.testing.assert_close(sigmoid[0].sigmoid(x), torch.sigmoid(x))  # the first build is untouched


def test_cem_on_a_side_stream(cem):
    ours, _ = cem
    mu = torch.randn(64, device="cuda")
    sigma = torch.rand(64, device="cuda") + 0.1
    expected = ours.sample(mu, sigma, 4096, 7)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = ours.sample(mu, sigma, 4096, 7)
    side.synchronize()
    assert torch.equal(got, expected)


def test_build_directory_copy_loads_in_torch(mul, tmp_path):
    """The copy kernelkit leaves in build_directory is the same library torch users would find there."""
    ours, _ = mul
    kernelkit.load("kk_mul", [str(FIXTURES / "mul.cu")], build_directory=str(tmp_path))
    assert (tmp_path / "kk_mul.so").read_bytes() == Path(ours.__file__).read_bytes()
    shutil.rmtree(tmp_path)


@pytest.fixture(scope="module")
def cem_ported():
    """The CEM sampler ported for fast rebuilds: kernels in a torch-free .cu, torch in the .cpp."""
    return kernelkit.load("kk_cem_ported", [str(FIXTURES / "sample_kernel.cu"), str(FIXTURES / "sample_ported.cpp")],
                          extra_cuda_cflags=["-O3"])


def test_ported_cem_gives_the_same_numbers(cem, cem_ported):
    mu = torch.randn(33, device="cuda")
    sigma = torch.rand(33, device="cuda") + 0.5
    assert torch.equal(cem_ported.sample(mu, sigma, 777, 99), cem[0].sample(mu, sigma, 777, 99))


def test_ported_kernel_edit_recompiles_only_the_torch_free_unit(cem_ported, tmp_path):
    for f in ("sample_kernel.cu", "sample_ported.cpp"):
        shutil.copy(FIXTURES / f, tmp_path / f)
    srcs = [str(tmp_path / "sample_kernel.cu"), str(tmp_path / "sample_ported.cpp")]
    kernel = tmp_path / "sample_kernel.cu"
    kernel.write_text(kernel.read_text().replace("sigma[row] * curand_normal", "2.0f * sigma[row] * curand_normal"))
    before = kernelkit.STATS["compiles"]
    edited = kernelkit.load("kk_cem_ported", srcs, extra_cuda_cflags=["-O3"])
    assert kernelkit.STATS["compiles"] - before == 1
    target = kernelkit.jit.plan.plan_extension("kk_cem_ported", [Path(s) for s in srcs], extra_cuda_cflags=["-O3"])
    assert [u.uses_torch for u in target.units] == [False, True]  # the edited .cu never parses torch's headers
    mu = torch.randn(4, device="cuda")
    sigma = torch.rand(4, device="cuda") + 0.5
    torch.testing.assert_close(edited.sample(mu, sigma, 1000, 5) - mu[:, None],
                               2 * (cem_ported.sample(mu, sigma, 1000, 5) - mu[:, None]))
