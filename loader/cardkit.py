"""Helpers for a card's spec file (``<op>.py``): seeded inputs, shared shape sets, bytes moved, fake (meta)
kernels whose checks and messages mirror the C++ helpers of ``<kernelkit/torch_glue.h>``, and known-wrong
twins for the card's ``WRONG``.

Cards use them as ``kernelkit.cardkit.<name>`` (``kernelkit.cardkit.elementwise_inputs``, ...; docs/helpers.md).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from . import ops as _ops

#: the dtypes every elementwise card supports (KK_DISPATCH_FLOATING)
FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: check shapes for elementwise cards: 1, odd, non-multiples of the vector width, empty, 2-D/3-D
ELEMENTWISE_SHAPES = ((1,), (7,), (1023,), (4097,), (100003,), (0,), (33, 65), (3, 0, 5))
#: benchmark sizes for elementwise cards: 2^12 .. 2^28 elements
ELEMENTWISE_BENCH_SIZES = tuple((1 << k,) for k in (12, 16, 20, 24, 26, 28))


def randn(shape, dtype: torch.dtype = torch.float32, device="cpu", generator=None, *, scale: float = 1.0,
          shift: float = 0.0) -> torch.Tensor:
    """``shift + scale * N(0, 1)`` of ``shape``, drawn from ``generator`` on the generator's own device (a CPU
    generator can seed CUDA inputs), in float64 for float64 else float32, then cast to ``dtype`` on ``device``."""
    gdev = generator.device if generator is not None else device
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(shape, dtype=draw, device=gdev, generator=generator)
    if scale != 1.0 or shift != 0.0:
        x = x * scale + shift
    return x.to(device=device, dtype=dtype)


def uniform(shape, low: float, high: float, dtype: torch.dtype = torch.float32, device="cpu",
            generator=None) -> torch.Tensor:
    """U(low, high) of ``shape``, drawn like :func:`randn`."""
    gdev = generator.device if generator is not None else device
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.rand(shape, dtype=draw, device=gdev, generator=generator) * (high - low) + low
    return x.to(device=device, dtype=dtype)


def elementwise_inputs(count: int, *, scale: float = 1.0) -> Callable[..., tuple]:
    """A spec's ``make_inputs`` for an elementwise op: ``count`` fresh ``scale * N(0, 1)`` tensors of ``shape``."""
    if count < 1:
        raise ValueError(f"count: expected at least one input, got {count}")

    def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
        return tuple(randn(shape, dtype, device, generator, scale=scale) for _ in range(count))

    make_inputs.__doc__ = f"{count} fresh N(0, {scale}^2) tensors of ``shape``."
    return make_inputs


def default_bytes_moved(args: Sequence[Any], out: Any) -> int:
    """Bytes of every tensor argument and output, each read or written once: what ``kernelkit.bench`` uses when
    a spec sets no ``bytes_moved``."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(t.numel() * t.element_size() for t in (*args, *outs) if isinstance(t, torch.Tensor))


# ---- fake kernels: shape/dtype rules mirroring the C++ checks -----------------------------------------


def check_floating(op: str, t: torch.Tensor, name: str) -> None:
    """``op: name must be a float32, float64, float16 or bfloat16 tensor, got ...`` (kk::check_floating)."""
    if t.dtype not in FLOATING:
        raise RuntimeError(f"{op}: {name} must be a float32, float64, float16 or bfloat16 tensor, got {t.dtype}")


def check_pair(op: str, a: torch.Tensor, an: str, b: torch.Tensor, bn: str) -> None:
    """Both floating, one device, one dtype (kk::check_floating + kk::check_same_device_dtype)."""
    check_floating(op, a, an)
    check_floating(op, b, bn)
    if a.device != b.device:
        raise RuntimeError(f"{op}: {an} and {bn} must be on the same device, got {an} on {a.device} and {bn} on "
                           f"{b.device}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{op}: {an} and {bn} must have the same dtype, got {an} {a.dtype} and {bn} {b.dtype}")


def fake_unary(op: str, x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """The result of kk::unary_elementwise on ``x``, as an empty tensor (for a fake kernel)."""
    check_floating(op, x, name)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def fake_binary(op: str, a: torch.Tensor, an: str, b: torch.Tensor, bn: str) -> torch.Tensor:
    """The result of kk::binary_elementwise on ``a``, ``b`` (broadcast), as an empty tensor."""
    check_pair(op, a, an, b, bn)
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise RuntimeError(f"{op}: shapes of {an} {tuple(a.shape)} and {bn} {tuple(b.shape)} cannot be broadcast "
                           "together") from None
    return a.new_empty(shape)


def register_elementwise_fakes(lib, *op_names: str) -> None:
    """Register :func:`fake_unary` / :func:`fake_binary` as the fake kernels of ``lib``'s ops ``op_names``,
    by the op's leading Tensor arguments (one or two; later arguments, e.g. a Scalar, are ignored), naming
    them as the schema does. Call it from the card's ``setup(lib)``."""
    for op in op_names:
        schema = getattr(lib.ops, op).default._schema
        names = []
        for arg in schema.arguments:
            if not isinstance(arg.type, torch.TensorType):
                break
            names.append(arg.name)
        if len(names) not in (1, 2) or [str(r.type) for r in schema.returns] != ["Tensor"]:
            raise ValueError(f"register_elementwise_fakes: {op} must take one or two leading Tensor arguments "
                             f"and return one Tensor, its schema is {schema}")
        torch.library.register_fake(lib.qualname(op))(_elementwise_fake(op, names))


def _elementwise_fake(op: str, names: Sequence[str]) -> Callable:
    if len(names) == 1:
        return lambda x, *_rest, **_kw: fake_unary(op, x, names[0])
    return lambda a, b, *_rest, **_kw: fake_binary(op, a, names[0], b, names[1])


#: ``current_op(card, op=None)``: the callable of op ``op`` (default: the card's own op) of ``card``'s current
#: build, for a card's own Python function: ask on every call (a hot reload changes it). Under torch.compile,
#: its OpOverload. kernelkit.ops's own function, not a wrapper: it runs on every call of such a function.
current_op = _ops._op


# ---- known-wrong twins: a correct function with a real kernel bug, for a card's ``WRONG`` -----------------
# A card lists the bugs its checker must catch as ``WRONG = {name: fn}`` (pure PyTorch, the op's signature);
# tests run ``kernelkit.check`` on each in place of the op and require a failure. These build the bugs any
# elementwise-shaped op can have from the card's correct function (its reference).


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory read as a contiguous tensor from its first element, whatever its strides."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return torch.as_strided(t, t.shape, strides, t.storage_offset())


def _store(result: torch.Tensor, out: Optional[torch.Tensor], count: int) -> torch.Tensor:
    """The first ``count`` elements (row-major) of ``result`` stored into ``out`` (a fresh tensor when None);
    the others keep whatever the memory held."""
    target = out if out is not None else torch.empty(result.shape, dtype=result.dtype, device=result.device)
    mask = torch.zeros(result.numel(), dtype=torch.bool, device=result.device)
    mask[:count] = True
    mask = mask.view(result.shape)
    target[mask] = result[mask]
    return target


def _returned(result: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    return result if out is None else out.copy_(result)


def _cast(args: tuple, dtypes: Sequence[torch.dtype], to: torch.dtype) -> tuple:
    return tuple(a.to(to) if isinstance(a, torch.Tensor) and a.dtype in dtypes else a for a in args)


def _skip_last(fn, args, out):  # a grid of (n - 1) / block blocks
    res = fn(*args)
    return _store(res, out, max(res.numel() - 1, 0))


def _skip_tail(fn, args, out, width):  # a vectorised loop without its scalar tail
    res = fn(*args)
    return _store(res, out, res.numel() - res.numel() % width)


def _assumes_contiguous(fn, args, out):  # indexes data_ptr()[i], ignoring strides
    res = fn(*(_dense(a) if isinstance(a, torch.Tensor) else a for a in args))
    if out is not None:
        _dense(out).copy_(res)
    return res if out is None else out


def _into_input(fn, args, out, index):  # "saves memory" by writing the result over an input
    return _returned(args[index].copy_(fn(*args)), out)


def _returns_float32(fn, args, out):  # half/bfloat16 computed in float, never cast back
    res = fn(*_cast(args, (torch.float16, torch.bfloat16), torch.float32))
    if out is not None:
        out.copy_(res)
    return res


def _float64_via_float32(fn, args, out):  # an accumulator type fixed at float
    res = fn(*_cast(args, (torch.float64,), torch.float32))
    double = any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in args)
    return _returned(res.to(torch.float64) if double else res, out)


#: the bugs :func:`wrong_twins` builds
GENERIC_BUGS = ("skip_last", "skip_tail", "assumes_contiguous", "into_input", "returns_float32",
                "float64_via_float32")


def wrong_twins(fn: Callable, *bugs: str, index: int = 0, width: int = 4) -> Dict[str, Callable]:
    """``{bug: twin}``: for each of ``bugs`` (default: all of :data:`GENERIC_BUGS`) a copy of the correct
    ``fn`` with that bug, taking ``fn``'s arguments and an optional ``out=``. ``skip_last``: the last output
    element is never written; ``skip_tail``: elements past the last whole vector of ``width`` are never
    written; ``assumes_contiguous``: reads every tensor argument, and writes ``out``, as dense memory from
    its first element; ``into_input``: writes the result over positional input ``index`` (of the output's
    shape); ``returns_float32``: float16/bfloat16 computed in float32 and returned so; ``float64_via_float32``:
    float64 computed in float32. For a card's ``WRONG``."""
    made = {"skip_last": _skip_last, "skip_tail": functools.partial(_skip_tail, width=width),
            "assumes_contiguous": _assumes_contiguous, "into_input": functools.partial(_into_input, index=index),
            "returns_float32": _returns_float32, "float64_via_float32": _float64_via_float32}
    unknown = [b for b in bugs if b not in made]
    if unknown:
        raise ValueError(f"wrong_twins: bugs: expected names from {', '.join(GENERIC_BUGS)}, got {unknown[0]!r}")
    return {bug: _twin(bug, made[bug], fn) for bug in bugs or GENERIC_BUGS}


def _twin(bug: str, with_bug: Callable, fn: Callable) -> Callable:
    def twin(*args, out: Optional[torch.Tensor] = None, **kwargs):
        return with_bug(functools.partial(fn, **kwargs) if kwargs else fn, args, out)

    name = getattr(fn, "__name__", "op")
    twin.__name__ = twin.__qualname__ = f"{name}_{bug}"
    twin.__doc__ = f"{name} with the bug {bug!r} (kernelkit.cardkit.wrong_twins)"
    return twin
