"""sigmoid card: stable sigmoid and its fused backward from the output (spec, fake kernels; autograd is in the C++ binding)."""
import kernelkit
from kernelkit.reference.sigmoid import sigmoid as reference

SPEC = kernelkit.Spec(
    name="sigmoid",
    reference=reference,
    # 4 * N(0, 1), spread over [-12, 12]: both branches of the stable formula, and saturation
    make_inputs=kernelkit.elementwise_inputs(1, scale=4.0),
    shapes=kernelkit.ELEMENTWISE_SHAPES,
    bench_sizes=kernelkit.ELEMENTWISE_BENCH_SIZES,
    grad_inputs=(0,),
    doc="numerically stable sigmoid; backward g * s * (1 - s) from the saved output, fused",
)


def setup(lib):
    kernelkit.register_elementwise_fakes(lib, "sigmoid", "sigmoid_backward")
