"""vector_add card: out = a + alpha * b (spec, fake kernels; autograd is in the C++ binding)."""
import torch

import kernelkit
from kernelkit import ops as _ops
from kernelkit.reference.vector_add import vector_add as reference


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    """Two fresh N(0, 1) tensors of ``shape`` (drawn on the generator's device, then moved)."""
    gdev = generator.device if generator is not None else device
    a = torch.randn(shape, dtype=dtype, device=gdev, generator=generator).to(device)
    b = torch.randn(shape, dtype=dtype, device=gdev, generator=generator).to(device)
    return a, b


def bytes_moved(args, out) -> int:
    a, b = args[0], args[1]
    return a.numel() * a.element_size() + b.numel() * b.element_size() + out.numel() * out.element_size()


#: check shapes shared by the elementwise cards: 1, odd, non-multiples of the vector width, empty, 2-D/3-D
SHAPES = ((1,), (7,), (1023,), (4097,), (100003,), (0,), (33, 65), (3, 0, 5))
#: 2^12 .. 2^28 elements
BENCH_SIZES = tuple((1 << k,) for k in (12, 16, 20, 24, 26, 28))

SPEC = kernelkit.Spec(
    name="vector_add",
    reference=reference,
    make_inputs=make_inputs,
    shapes=SHAPES,
    bench_sizes=BENCH_SIZES,
    bytes_moved=bytes_moved,
    grad_inputs=(0, 1),
    doc="c = a + alpha * b, broadcasting, optional out=",
)


def setup(lib):
    """Fake kernels for this build's namespace; point kernelkit.ops at it."""

    @torch.library.register_fake(lib.qualname("vector_add"))
    def _(a, b, alpha=1):
        return _ops._fake_binary("vector_add", a, "a", b, "b")

    @torch.library.register_fake(lib.qualname("vector_add_out"))
    def _(a, b, alpha, out):
        expected = _ops._fake_binary("vector_add", a, "a", b, "b")
        _ops._check_pair("vector_add", expected, "a", out, "out")
        if out.shape != expected.shape:
            raise RuntimeError(f"vector_add: out must have shape {list(expected.shape)}, got {list(out.shape)}")
        return None

    _ops._bind(lib, ("vector_add", "vector_add_out"))
