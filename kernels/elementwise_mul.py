"""elementwise_mul card: out = a * b with autograd (spec, fake kernels; autograd is in the C++ binding)."""
import torch

import kernelkit
from kernelkit import ops as _ops
from kernelkit.reference.elementwise_mul import elementwise_mul as reference
from kernelkit.kernels.vector_add import BENCH_SIZES, SHAPES, bytes_moved, make_inputs

SPEC = kernelkit.Spec(
    name="elementwise_mul",
    reference=reference,
    make_inputs=make_inputs,
    shapes=SHAPES,
    bench_sizes=BENCH_SIZES,
    bytes_moved=bytes_moved,
    grad_inputs=(0, 1),
    doc="c = a * b, broadcasting; grad_a = g * b, grad_b = g * a",
)


def setup(lib):
    @torch.library.register_fake(lib.qualname("elementwise_mul"))
    def _(a, b):
        return _ops._fake_binary("elementwise_mul", a, "a", b, "b")

    _ops._bind(lib, ("elementwise_mul",))
