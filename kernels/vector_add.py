"""vector_add card: out = a + alpha * b (spec, fake kernels, the public function :func:`vector_add`, and the
known-wrong twins the checker must reject; autograd is in the C++ binding)."""
from typing import Optional

import torch

import kernelkit
from kernelkit import cardkit
from kernelkit.reference.vector_add import vector_add as reference

CARD = "vector_add"


def vector_add(a: torch.Tensor, b: torch.Tensor, *, alpha=1, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a + alpha * b``, broadcasting like :func:`torch.add` (card ``kernels/vector_add``).

    Args:
        a, b: float32/float64/float16/bfloat16 tensors of one dtype on one device (CPU or CUDA); any
            strides (non-contiguous inputs are copied to contiguous first).
        alpha: real scalar multiplier of ``b`` (computed in float32 for half/bfloat16, like torch).
        out: optional preallocated result of the broadcast shape, same dtype and device; may be ``a`` or
            ``b`` itself. Returned. Not differentiable (like ``torch.add(out=...)``).

    Differentiable in ``a`` and ``b`` when ``out`` is None.
    """
    if out is None:
        return cardkit.current_op(CARD, "vector_add")(a, b, alpha)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or out.requires_grad):
        raise RuntimeError("kernelkit.ops.vector_add(): out= does not support automatic differentiation "
                           "(inputs or out require grad)")
    cardkit.current_op(CARD, "vector_add_out")(a, b, alpha, out)
    return out


SPEC = kernelkit.Spec(
    name=CARD,
    reference=reference,
    make_inputs=cardkit.elementwise_inputs(2),
    op=vector_add,
    shapes=cardkit.ELEMENTWISE_SHAPES,
    bench_sizes=cardkit.ELEMENTWISE_BENCH_SIZES,
    grad_inputs=(0, 1),
    out_arg="out",
    torch_op=reference,  # the reference is torch.add itself
    torch_op_name="torch.add",
    doc="c = a + alpha * b, broadcasting, optional out=",
)


def setup(lib):
    cardkit.register_elementwise_fakes(lib, "vector_add")

    @torch.library.register_fake(lib.qualname("vector_add_out"))
    def _(a, b, alpha, out):
        del alpha  # the output's shape does not depend on it
        expected = cardkit.fake_binary("vector_add", a, "a", b, "b")
        cardkit.check_pair("vector_add", expected, "a", out, "out")
        if out.shape != expected.shape:
            raise RuntimeError(f"vector_add: out must have shape {list(expected.shape)}, got {list(out.shape)}")


# ---- known-wrong versions: kernelkit.check must reject every one (tests/test_wrong_twins.py) ----------------


def _write_past_end(a, b, alpha=1, *, out=None):
    """The seed's ``i <= N``: writes one element past the end of ``out`` (every value inside is right)."""
    result = reference(a, b, alpha)
    if out is None:
        return result
    n = result.numel()
    flat = torch.as_strided(out, (n + 1,), (1,), out.storage_offset())
    flat[:n] = result.reshape(-1)
    flat[n] = 0.0
    return out


def _ignores_out(a, b, alpha=1, **_out):
    """Returns a fresh result and never writes the caller's ``out``."""
    return reference(a, b, alpha)


class _DropsGradOfB(torch.autograd.Function):
    """A backward that returns a gradient for ``a`` only, as if ``b`` were a constant."""

    @staticmethod
    def forward(_ctx, a, b, alpha):
        return reference(a, b, alpha)

    @staticmethod
    def backward(_ctx, grad):
        return grad, None, None


def _drops_grad_of_b(a, b, alpha=1, *, out=None):
    return _DropsGradOfB.apply(a, b, alpha) if out is None else reference(a, b, alpha, out=out)


WRONG = {**cardkit.wrong_twins(reference), "write_past_end": _write_past_end, "ignores_out": _ignores_out,
         "drops_grad_of_b": _drops_grad_of_b}
