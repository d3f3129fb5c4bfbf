"""sample_normal card: fused normal sampling for CEM, X = mu[:, None] + sigma[:, None] * z (spec, fakes, the
public function :func:`sample_normal`, and the known-wrong twins the checker must reject)."""
import os
from typing import Optional

import torch

import kernelkit
from kernelkit import cardkit
from kernelkit.reference.sample_normal import sample_normal as reference
from kernelkit.reference.sample_normal import target

CARD = "sample_normal"


def sample_normal(mu: torch.Tensor, sigma: torch.Tensor, n: int, *, generator: Optional[torch.Generator] = None,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Draw ``n`` samples from N(mu_i, sigma_i^2) per row: ``X[i, j] = mu[i] + sigma[i] * z[i, j]``.

    The fused CEM sampler (card ``kernels/sample_normal``). Returns a ``(d, n)`` tensor for ``mu`` and
    ``sigma`` of shape ``(d,)`` (same dtype — float32/float64/float16/bfloat16 — and device). Every
    ``z[i, j]`` is an independent N(0, 1) draw.

    On CUDA, z is generated inside the kernel with Philox4x32-10 from ``generator`` (default: the
    device's default CUDA generator), like torch's own random ops: the same seed gives the same samples,
    the generator advances on every call, and each replay of a captured CUDA graph draws fresh samples.
    float64 uses cuRAND's exact double Box-Muller; float32/float16/bfloat16 use the GPU's approximate
    log/sqrt/sin/cos, within ~1e-6 (1 + |z|) of the exact transform of the same random bits
    (``kernelkit.reference.philox`` reproduces every sample). On CPU it uses ``torch.randn`` with the
    CPU generator (a different stream of numbers than CUDA).

    Args:
        n: samples per row (>= 0). No limit on ``n`` or ``d``.
        generator: a ``torch.Generator`` on the tensors' device type.
        out: optional preallocated ``(d, n)`` tensor to fill (avoids an allocation per CEM iteration);
            ``n`` must equal ``out.shape[1]``. Returned.

    Not differentiable. Under ``torch.compile`` pass ``generator=None``.
    """
    if out is None:
        if generator is None:  # keyword parsing costs ~0.3 us of host time per call
            return cardkit.current_op(CARD, "sample_normal")(mu, sigma, n)
        return cardkit.current_op(CARD, "sample_normal")(mu, sigma, n, generator=generator)
    if out.dim() != 2 or out.shape[1] != n:
        raise ValueError(f"kernelkit.ops.sample_normal: out must have shape (d, n) = ({mu.shape[0] if mu.dim() else '?'}, "
                         f"{n}), got {tuple(out.shape)}")
    cardkit.current_op(CARD, "sample_normal_out")(mu, sigma, out, generator=generator)
    return out


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
    name=CARD,
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
        del generator  # the output's shape does not depend on it
        _check(mu, sigma)
        if n < 0:
            raise RuntimeError(f"sample_normal: n must be >= 0, got {n}")
        return mu.new_empty((mu.shape[0], n))

    @torch.library.register_fake(lib.qualname("sample_normal_out"))
    def _(mu, sigma, out, *, generator=None):
        del generator  # the output's shape does not depend on it
        _check(mu, sigma)
        cardkit.check_pair("sample_normal", mu, "mu", out, "out")
        if out.dim() != 2 or out.shape[0] != mu.shape[0]:
            raise RuntimeError(f"sample_normal: out must have shape ({mu.shape[0]}, n), got {list(out.shape)}")
        return None


def _check(mu, sigma):
    cardkit.check_pair("sample_normal", mu, "mu", sigma, "sigma")
    if mu.dim() != 1:
        raise RuntimeError(f"sample_normal: mu must be 1-D (d,), got shape {list(mu.shape)}")
    if sigma.shape != mu.shape:
        raise RuntimeError(f"sample_normal: sigma must have the shape of mu {list(mu.shape)}, got {list(sigma.shape)}")


# ---- known-wrong versions: kernelkit.check must reject every one (tests/test_wrong_twins.py) ----------------


def _normals(mu: torch.Tensor, *shape: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    return torch.randn(*shape, dtype=mu.dtype, device=mu.device, generator=generator)


def _generator(mu: torch.Tensor, seed: int) -> torch.Generator:
    return torch.Generator(device=mu.device).manual_seed(seed)


def _shared_z(mu, sigma, n):
    """The seed's bug: one z per column, shared by every row (dimension)."""
    return mu[:, None] + sigma[:, None] * _normals(mu, n)[None, :]


def _variance_not_std(mu, sigma, n):
    """Scales z by the variance instead of the standard deviation."""
    return mu[:, None] + (sigma * sigma)[:, None] * _normals(mu, mu.shape[0], n)


def _offset_not_advanced(mu, sigma, n):
    """Philox offset never advanced: every call draws the same numbers (each CUDA-graph replay too)."""
    return mu[:, None] + sigma[:, None] * _normals(mu, mu.shape[0], n, generator=_generator(mu, 0))


def _ignores_seed(mu, sigma, n):
    """Seeds a generator of its own afresh on every call, not torch's: torch.manual_seed reproduces nothing."""
    seed = int.from_bytes(os.urandom(4), "little")
    return mu[:, None] + sigma[:, None] * _normals(mu, mu.shape[0], n, generator=_generator(mu, seed))


WRONG = {"shared_z": _shared_z, "variance_not_std": _variance_not_std, "offset_not_advanced": _offset_not_advanced,
         "ignores_seed": _ignores_seed}
