"""kernelkit.ops.sample_normal: X = mu[:, None] + sigma[:, None] * z, z iid N(0, 1) (statistics, not equality).

CPU (CI): the at::randn path end to end. CUDA (`gpu`): the in-kernel Philox sampler, graph-safe. The statistics
over the spec's shapes and dtypes (row means and variances, KS, independence across rows and columns), strided
inputs and seeding under torch.manual_seed are the shared battery's (tests/test_cards.py: kernelkit.check);
here what is specific to the sampler.
"""
import pytest
import torch
from ops_helpers import (
    DEVICES,
    check_independent_rows,
    check_normal_rows,
    ks_pvalue,
    lib,
    max_cross_correlation,
    noncontig,
)

import kernelkit
from kernelkit import ops

CARD = "sample_normal"


def seed_all(seed):
    torch.manual_seed(seed)  # CPU and every CUDA device


def shared_z_sampler(mu, sigma, n):
    """The seed's bug, in pure torch: one z row reused for every dimension (the card's own known-wrong twin)."""
    return kernelkit.cards()[CARD].module().WRONG["shared_z"](mu, sigma, n)


def test_correlation_test_catches_the_shared_z_bug():
    seed_all(0)
    mu, sigma = torch.randn(64), torch.rand(64) + 0.5
    x = shared_z_sampler(mu, sigma, 4096)
    check_normal_rows(x, mu, sigma, z_bound=50)  # each row alone can look fine...
    assert max_cross_correlation((x - mu[:, None]) / sigma[:, None]) > 0.99  # ...but the rows are one row
    with pytest.raises(AssertionError, match="rows are correlated"):
        check_independent_rows(x, mu, sigma)


@pytest.mark.parametrize("device", DEVICES)
def test_an_explicit_generator(device):
    """generator= (the shared battery's seeding case covers torch.manual_seed)."""
    mu, sigma = torch.randn(10, device=device), torch.rand(10, device=device) + 0.5
    seed_all(1234)
    a = ops.sample_normal(mu, sigma, 333)
    gen = torch.Generator(device=device)
    gen.manual_seed(7)
    c = ops.sample_normal(mu, sigma, 333, generator=gen)
    gen.manual_seed(7)
    assert torch.equal(c, ops.sample_normal(mu, sigma, 333, generator=gen))
    assert not torch.equal(c, a)


@pytest.mark.parametrize("device", DEVICES)
def test_out(device):
    mu, sigma = torch.randn(20, device=device), torch.rand(20, device=device) + 0.5
    out = torch.full((20, 2000), float("nan"), device=device)
    assert ops.sample_normal(mu, sigma, 2000, out=out) is out
    check_normal_rows(out, mu, sigma)
    nc = noncontig(torch.full((20, 2000), float("nan"), device=device))
    ops.sample_normal(mu, sigma, 2000, out=nc)
    check_normal_rows(nc, mu, sigma)
    with pytest.raises(ValueError, match="out must have shape"):
        ops.sample_normal(mu, sigma, 5, out=out)
    with pytest.raises(RuntimeError, match="out must have shape"):
        ops.sample_normal(mu, sigma, 2000, out=torch.empty(21, 2000, device=device))
    with pytest.raises(RuntimeError, match="out must have dtype"):
        ops.sample_normal(mu, sigma, 2000, out=out.double())


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    mu, sigma = torch.randn(5, device=device), torch.rand(5, device=device)
    with pytest.raises(RuntimeError, match="mu and sigma must have the same dtype"):
        ops.sample_normal(mu, sigma.double(), 3)
    with pytest.raises(RuntimeError, match="sigma must have the shape of mu"):
        ops.sample_normal(mu, sigma[:4], 3)
    with pytest.raises(RuntimeError, match="mu must be 1-D"):
        ops.sample_normal(mu[None], sigma[None], 3)
    with pytest.raises(RuntimeError, match="n must be >= 0"):
        ops.sample_normal(mu, sigma, -1)
    with pytest.raises(RuntimeError, match="mu must be a float32"):
        ops.sample_normal(mu.int(), sigma.int(), 3)
    other = "cuda" if device == "cpu" else "cpu"
    if other == "cpu" or torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="generator must be a"):
            ops.sample_normal(mu, sigma, 3, generator=torch.Generator(device=other))


@pytest.mark.gpu
def test_device_mix_errors():
    mu = torch.randn(5, device="cuda")
    with pytest.raises(RuntimeError, match="mu and sigma must be on the same device"):
        ops.sample_normal(mu, mu.cpu(), 3)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_out_op(device):
    """sample_normal_out (the shared battery's opcheck reaches only sample_normal)."""
    mu, sigma = torch.randn(6, device=device, dtype=torch.float64), torch.rand(6, device=device, dtype=torch.float64)
    out = torch.empty(6, 100, device=device, dtype=torch.float64)
    torch.library.opcheck(lib(CARD).ops.sample_normal_out.default, (mu, sigma, out))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def cem_step(mu, sigma, out):
        x = ops.sample_normal(mu, sigma, 4096)
        y = ops.sample_normal(mu, sigma, 4096)  # must not be CSE'd into x
        ops.sample_normal(mu, sigma, out.shape[1], out=out)
        return x, y

    mu, sigma = torch.randn(16, device=device), torch.rand(16, device=device) + 0.5
    out = torch.empty(16, 512, device=device)
    x, y = cem_step(mu, sigma, out)
    assert not torch.equal(x, y)
    check_normal_rows(x, mu, sigma)
    check_normal_rows(out, mu, sigma)


@pytest.mark.gpu
def test_cuda_graph_replay_gives_fresh_samples():
    d, n = 48, 4099  # n not a multiple of 4: the scalar store path
    mu, sigma = torch.randn(d, device="cuda"), torch.rand(d, device="cuda") + 0.5
    out = torch.empty(d, n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.sample_normal(mu, sigma, n, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.sample_normal(mu, sigma, n, out=out)
        y = ops.sample_normal(mu, sigma, 1024)
    samples = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        samples.append((out.clone(), y.clone()))
        check_normal_rows(out, mu, sigma)
        check_independent_rows(out, mu, sigma)
        check_normal_rows(y, mu, sigma)
    assert not torch.equal(samples[0][0], samples[1][0]) and not torch.equal(samples[1][0], samples[2][0])
    assert not torch.equal(samples[0][1], samples[1][1])
    assert not torch.equal(samples[0][0][:, :1024], samples[0][1])  # two kernels in one graph differ too
    # and the whole graph is reproducible from a seed
    torch.cuda.manual_seed(99)
    graph.replay()
    a = out.clone()
    torch.cuda.manual_seed(99)
    graph.replay()
    assert torch.equal(a, out)


@pytest.mark.gpu
@pytest.mark.parametrize("d,n", [(100000, 1024), (1, 1 << 24), (70000, 3)])
def test_large_and_skinny(d, n):
    seed_all(5)
    mu, sigma = torch.randn(d, device="cuda"), torch.rand(d, device="cuda") + 0.5
    x = ops.sample_normal(mu, sigma, n)
    assert torch.isfinite(x).all()
    rows = torch.randperm(d)[:256].cuda()
    check_normal_rows(x[rows], mu[rows], sigma[rows], z_bound=6)
    assert ks_pvalue(x[rows][:, :4096], mu[rows], sigma[rows]) > 1e-4
    if n >= 1024 and d >= 64:
        check_independent_rows(x[rows[:64]], mu[rows[:64]], sigma[rows[:64]])


@pytest.mark.gpu
def test_misaligned_out_and_double_stream():
    mu, sigma = torch.randn(40, device="cuda", dtype=torch.float64), torch.rand(40, device="cuda", dtype=torch.float64) + 1
    buf = torch.empty(40 * 1024 + 1, device="cuda", dtype=torch.float64)
    out = buf[1:].view(40, 1024)  # contiguous but not 32-byte aligned: scalar stores
    ops.sample_normal(mu, sigma, 1024, out=out)
    check_normal_rows(out, mu, sigma)
    check_independent_rows(out, mu, sigma)
    assert ks_pvalue(out, mu, sigma) > 1e-4


# ---- bit-level: the CUDA sampler against reference/philox.py ------------------------------------------

# Random123's known-answer vectors for Philox4x32-10: counter, key, expected output
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_reference_philox_known_answers():
    from kernelkit.reference.philox import philox4x32_10

    for ctr, key, expected in PHILOX_KAT:
        assert philox4x32_10(torch.tensor(ctr), torch.tensor(key)).tolist() == list(expected)
    batch = philox4x32_10(torch.tensor([c for c, _, _ in PHILOX_KAT]), torch.tensor([k for _, k, _ in PHILOX_KAT]))
    assert batch.tolist() == [list(e) for _, _, e in PHILOX_KAT]


@pytest.mark.parametrize("double", (False, True), ids=("float", "double"))
def test_reference_transforms_are_standard_normal(double):
    """The transforms the CUDA sampler uses (float: 23-bit angle) give N(0, 1) rows, independent."""
    from kernelkit.reference.philox import sample_normal_z

    z, _ = sample_normal_z(64, 2048, seed=2024, offset=8, double=double)
    zero, one = torch.zeros(64, dtype=torch.float64), torch.ones(64, dtype=torch.float64)
    check_normal_rows(z, zero, one)
    assert ks_pvalue(z, zero, one) > 1e-4
    check_independent_rows(z, zero, one)
    z2, _ = sample_normal_z(64, 2048, seed=2024, offset=12, double=double)
    assert max_cross_correlation(torch.cat([z[:8], z2[:8]])) < 0.2  # the next offset is a new stream


def _check_against_reference(x, mu, sigma, seed, offset, rows=None):
    """x (d, n) from the CUDA sampler == mu + sigma * z(seed, offset) of reference/philox.py, to the
    documented accuracy of the float transform (exact math for float64)."""
    from kernelkit.reference.philox import sample_normal_z

    d, n = x.shape
    rows = torch.arange(d) if rows is None else torch.as_tensor(rows)
    double = x.dtype == torch.float64
    z, r = sample_normal_z(d, n, seed, offset, double, rows=rows)
    m, s = mu[rows].double().cpu()[:, None], sigma[rows].double().cpu()[:, None]
    got = (x[rows.to(x.device)].double().cpu() - m) / s
    if double:
        tol = 1e-12 * (1 + z.abs() + m.abs() / s)
    else:
        eps = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[x.dtype]
        tol = 3e-6 * (1 + z.abs()) + 5e-7 / r.clamp(min=1e-3) + eps * (z.abs() + (m.abs() + 1) / s)
    err = (got - z).abs()
    worst = (err / tol).max().item()
    assert worst <= 1, f"{x.dtype} {tuple(x.shape)}: error up to {worst:.2f}x the bound"
    return worst


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("d,n", [(37, 1024), (5, 4), (300, 12), (37, 13), (3, 4097), (7, 1)])
def test_cuda_matches_reference_bits(dtype, d, n):
    """Every element is the documented Philox draw: right subsequence, offset, row, transform; flat
    (n % 4 == 0) and ragged rows alike; the generator advances between calls."""
    mu = (torch.arange(d, dtype=torch.float64) * 0.25 - 4).to(dtype).cuda()  # distinct per row
    sigma = (1 + torch.arange(d, dtype=torch.float64) / d).to(dtype).cuda()
    g = torch.Generator(device="cuda").manual_seed(0x1234_5678_9ABC)
    first = ops.sample_normal(mu, sigma, n, generator=g)
    out = torch.full((d, n), float("nan"), dtype=dtype, device="cuda")
    ops.sample_normal(mu, sigma, n, generator=g, out=out)  # draws from the next offset
    step = 8 if dtype == torch.float64 else 4  # Philox draws per subsequence and call
    _check_against_reference(first, mu, sigma, 0x1234_5678_9ABC, 0)
    _check_against_reference(out, mu, sigma, 0x1234_5678_9ABC, step)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_cuda_matches_reference_bits_many_blocks(dtype):
    """A sweep-sized draw (5.12M chunks): many tiles per launch, and several grid-stride passes where the
    launch is persistent (DRAM-rich GPUs such as the H200 run 4 waves of 2112 blocks x 1024 chunks)."""
    d, n = 20000, 1024
    mu = torch.linspace(-2, 2, d, dtype=dtype, device="cuda")
    sigma = torch.linspace(0.5, 1.5, d, dtype=dtype, device="cuda")
    x = ops.sample_normal(mu, sigma, n, generator=torch.Generator(device="cuda").manual_seed(7))
    rows = [0, 1, 8447, 8448, 8449, 12345, 16896, 16897, d - 1]  # pass and block boundaries at 2112 x 4 rows
    _check_against_reference(x, mu, sigma, 7, 0, rows=rows)


@pytest.mark.gpu
@pytest.mark.parametrize("d,n", [(2000, 1023), (200003, 3), (60001, 17), (7, 100003), (64, 1024)])
def test_cuda_ragged_and_misaligned_match_reference_bits(d, n):
    """Rows of n % 4 != 0 over many tiles (row ends inside a warp, rows shorter than a chunk, the last
    tile ending mid-warp), and an output one element off 16-byte alignment (any n): every warp stores its
    chunks' elements as one range; the samples are the documented draws and nothing outside is written."""
    mu = torch.linspace(-2, 2, d, device="cuda")
    sigma = torch.linspace(0.5, 1.5, d, device="cuda")
    x = ops.sample_normal(mu, sigma, n, generator=torch.Generator(device="cuda").manual_seed(5))
    rows = sorted({0, 1, 2, d // 3, d // 2, d - 2, d - 1} | {r for r in (1024 // ((n + 3) // 4), 8191) if r < d})
    _check_against_reference(x, mu, sigma, 5, 0, rows=rows)
    buf = torch.full((d * n + 2,), float("nan"), device="cuda")
    out = buf[1:1 + d * n].view(d, n)  # 4 bytes past an allocation's alignment
    ops.sample_normal(mu, sigma, n, generator=torch.Generator(device="cuda").manual_seed(5), out=out)
    assert torch.equal(out, x)
    assert buf[0].isnan() and buf[-1].isnan()


@pytest.mark.gpu
def test_cuda_matches_reference_past_2_32_chunks(big_gpu_memory):
    """d * n / 4 > 2^32: the 64-bit row division and subsequences past 32 bits (32 GiB in float16)."""
    d, n = (1 << 18) + 3, 1 << 16
    big_gpu_memory(d * n * 2 + (4 << 30))
    mu = torch.linspace(-3, 3, d, device="cuda").half()
    sigma = torch.linspace(0.5, 1.5, d, device="cuda").half()
    x = ops.sample_normal(mu, sigma, n, generator=torch.Generator(device="cuda").manual_seed(11))
    rows = [0, 1 << 15, (1 << 17) + 1, d - 2, d - 1]  # chunk indices 0 .. past 2^31 .. past 2^32
    _check_against_reference(x, mu, sigma, 11, 0, rows=rows)
    del x


# ---- gradients: refused, naming the argument --------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_of", ("mu", "sigma"))
def test_gradients_are_refused_naming_the_argument(device, grad_of):
    """No gradient flows through the samples: on the CPU this failed inside addcmul's out= with a message
    about addcmul, on CUDA the samples silently had no gradient."""
    args = {"mu": torch.zeros(3, device=device), "sigma": torch.ones(3, device=device)}
    args[grad_of].requires_grad_()
    with pytest.raises(RuntimeError, match=f"sample_normal: not differentiable, but {grad_of} requires grad"):
        ops.sample_normal(args["mu"], args["sigma"], 5)
    with pytest.raises(RuntimeError, match=f"not differentiable, but {grad_of} requires grad"):
        ops.sample_normal(args["mu"], args["sigma"], 5, out=torch.empty(3, 5, device=device))
    with torch.no_grad():
        assert ops.sample_normal(args["mu"], args["sigma"], 5).shape == (3, 5)
