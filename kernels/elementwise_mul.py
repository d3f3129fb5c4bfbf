"""elementwise_mul card: out = a * b with autograd (spec, fake kernel; autograd is in the C++ binding)."""
import kernelkit
from kernelkit.reference.elementwise_mul import elementwise_mul as reference

SPEC = kernelkit.Spec(
    name="elementwise_mul",
    reference=reference,
    make_inputs=kernelkit.elementwise_inputs(2),
    shapes=kernelkit.ELEMENTWISE_SHAPES,
    bench_sizes=kernelkit.ELEMENTWISE_BENCH_SIZES,
    grad_inputs=(0, 1),
    doc="c = a * b, broadcasting; grad_a = g * b, grad_b = g * a",
)


def setup(lib):
    kernelkit.register_elementwise_fakes(lib, "elementwise_mul")
