"""sigmoid card: stable sigmoid and its fused backward from the output (spec, fake kernels, and the known-wrong
twins the checker must reject; autograd is in the C++ binding)."""
import torch

import kernelkit
from kernelkit import cardkit
from kernelkit.reference.sigmoid import sigmoid as reference

SPEC = kernelkit.Spec(
    name="sigmoid",
    reference=reference,
    # 4 * N(0, 1), spread over [-12, 12]: both branches of the stable formula, and saturation
    make_inputs=cardkit.elementwise_inputs(1, scale=4.0),
    shapes=cardkit.ELEMENTWISE_SHAPES,
    bench_sizes=cardkit.ELEMENTWISE_BENCH_SIZES,
    grad_inputs=(0,),
    torch_op=torch.sigmoid,  # the reference spells out the stable formula; bench times torch's own op too
    doc="numerically stable sigmoid; backward g * s * (1 - s) from the saved output, fused",
)


def setup(lib):
    cardkit.register_elementwise_fakes(lib, "sigmoid", "sigmoid_backward")


# ---- known-wrong versions: kernelkit.check must reject every one (tests/test_wrong_twins.py) ----------------


class _BackwardFromInput(torch.autograd.Function):
    """Saves the input where the backward expects the output: g * x * (1 - x) instead of g * s * (1 - s)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return reference(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x * (1 - x)


def _backward_from_input(x):
    return _BackwardFromInput.apply(x)


WRONG = {**cardkit.wrong_twins(reference), "backward_from_input": _backward_from_input}
