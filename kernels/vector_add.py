"""vector_add card: out = a + alpha * b (spec, fake kernels; autograd is in the C++ binding)."""
import torch

import kernelkit
from kernelkit.reference.vector_add import vector_add as reference

SPEC = kernelkit.Spec(
    name="vector_add",
    reference=reference,
    make_inputs=kernelkit.elementwise_inputs(2),
    shapes=kernelkit.ELEMENTWISE_SHAPES,
    bench_sizes=kernelkit.ELEMENTWISE_BENCH_SIZES,
    grad_inputs=(0, 1),
    doc="c = a + alpha * b, broadcasting, optional out=",
)


def setup(lib):
    kernelkit.register_elementwise_fakes(lib, "vector_add")

    @torch.library.register_fake(lib.qualname("vector_add_out"))
    def _(a, b, alpha, out):
        expected = kernelkit.fake_binary("vector_add", a, "a", b, "b")
        kernelkit.check_pair("vector_add", expected, "a", out, "out")
        if out.shape != expected.shape:
            raise RuntimeError(f"vector_add: out must have shape {list(expected.shape)}, got {list(out.shape)}")
