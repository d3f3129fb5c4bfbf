"""sample_normal card: fused normal sampling for CEM, X = mu[:, None] + sigma[:, None] * z (spec, fakes)."""
import torch

import kernelkit
from kernelkit.reference.sample_normal import sample_normal as reference
from kernelkit.reference.sample_normal import target


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    """``shape`` is (d, n): mu ~ N(0, 1), sigma ~ U(0.5, 1.5), both (d,); returns (mu, sigma, n)."""
    d, n = shape
    gdev = generator.device if generator is not None else device
    mu = torch.randn(d, dtype=dtype, device=gdev, generator=generator).to(device)
    sigma = (torch.rand(d, dtype=dtype, device=gdev, generator=generator) + 0.5).to(device)
    return mu, sigma, n


def bytes_moved(args, out) -> int:
    mu, sigma = args[0], args[1]
    return (mu.numel() + sigma.numel() + out.numel()) * out.element_size()


#: the seed's sweep (d = 10..5000 at N = 1024) plus d = 20000 and 100000
BENCH_D = (10, 50, 100, 500, 1000, 2000, 5000, 20000, 100000)

SPEC = kernelkit.Spec(
    name="sample_normal",
    reference=reference,
    make_inputs=make_inputs,
    shapes=((1, 1), (7, 13), (33, 1024), (5, 1), (3, 4097), (0, 10), (10, 0), (257, 3)),
    bench_sizes=tuple((d, 1024) for d in BENCH_D),
    bytes_moved=bytes_moved,
    random=True,
    target=target,
    doc="X[i, j] = mu_i + sigma_i * z_ij, z iid N(0, 1) drawn in-kernel with Philox (graph-safe)",
)


def setup(lib):
    @torch.library.register_fake(lib.qualname("sample_normal"))
    def _(mu, sigma, n, *, generator=None):
        _check(mu, sigma)
        if n < 0:
            raise RuntimeError(f"sample_normal: n must be >= 0, got {n}")
        return mu.new_empty((mu.shape[0], n))

    @torch.library.register_fake(lib.qualname("sample_normal_out"))
    def _(mu, sigma, out, *, generator=None):
        _check(mu, sigma)
        kernelkit.check_pair("sample_normal", mu, "mu", out, "out")
        if out.dim() != 2 or out.shape[0] != mu.shape[0]:
            raise RuntimeError(f"sample_normal: out must have shape ({mu.shape[0]}, n), got {list(out.shape)}")
        return None



def _check(mu, sigma):
    kernelkit.check_pair("sample_normal", mu, "mu", sigma, "sigma")
    if mu.dim() != 1:
        raise RuntimeError(f"sample_normal: mu must be 1-D (d,), got shape {list(mu.shape)}")
    if sigma.shape != mu.shape:
        raise RuntimeError(f"sample_normal: sigma must have the shape of mu {list(mu.shape)}, got {list(sigma.shape)}")
