"""elementwise_mul card: out = a * b with autograd (spec, fake kernel, and the known-wrong twins the checker must
reject; autograd is in the C++ binding)."""
import torch

import kernelkit
from kernelkit import cardkit
from kernelkit.reference.elementwise_mul import elementwise_mul as reference

SPEC = kernelkit.Spec(
    name="elementwise_mul",
    reference=reference,
    make_inputs=cardkit.elementwise_inputs(2),
    shapes=cardkit.ELEMENTWISE_SHAPES,
    bench_sizes=cardkit.ELEMENTWISE_BENCH_SIZES,
    grad_inputs=(0, 1),
    torch_op=reference,  # the reference is torch.mul itself
    torch_op_name="torch.mul",
    doc="c = a * b, broadcasting; grad_a = g * b, grad_b = g * a",
)


def setup(lib):
    cardkit.register_elementwise_fakes(lib, "elementwise_mul")


# ---- known-wrong versions: kernelkit.check must reject every one (tests/test_wrong_twins.py) ----------------


class _SwappedGrads(torch.autograd.Function):
    """A backward that hands each input the gradient of the other: grad_a = g * a (must be g * b)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return reference(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad * a, grad * b


def _swapped_grads(a, b):
    return _SwappedGrads.apply(a, b)


def _returns_float64(a, b):
    """Computes in double and forgets to cast back."""
    return reference(a.double(), b.double())


WRONG = {**cardkit.wrong_twins(reference), "swapped_grads": _swapped_grads, "returns_float64": _returns_float64}
