"""sigmoid card: stable sigmoid and its fused backward from the output (spec, fake kernels; autograd is in the C++ binding)."""
import torch

import kernelkit
from kernelkit import ops as _ops
from kernelkit.kernels.vector_add import BENCH_SIZES, SHAPES
from kernelkit.reference.sigmoid import sigmoid as reference


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    """Fresh inputs spread over [-12, 12] (both branches of the stable formula, and saturation)."""
    gdev = generator.device if generator is not None else device
    x = torch.randn(shape, dtype=torch.float32, device=gdev, generator=generator) * 4
    return (x.to(device=device, dtype=dtype),)


def bytes_moved(args, out) -> int:
    return args[0].numel() * args[0].element_size() + out.numel() * out.element_size()


SPEC = kernelkit.Spec(
    name="sigmoid",
    reference=reference,
    make_inputs=make_inputs,
    shapes=SHAPES,
    bench_sizes=BENCH_SIZES,
    bytes_moved=bytes_moved,
    grad_inputs=(0,),
    doc="numerically stable sigmoid; backward g * s * (1 - s) from the saved output, fused",
)


def setup(lib):
    @torch.library.register_fake(lib.qualname("sigmoid"))
    def _(x):
        _ops._check_floating("sigmoid", x, "x")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake(lib.qualname("sigmoid_backward"))
    def _(grad, out):
        return _ops._fake_binary("sigmoid_backward", grad, "grad", out, "out")

    _ops._bind(lib, ("sigmoid", "sigmoid_backward"))
