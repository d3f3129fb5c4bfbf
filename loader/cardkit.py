"""Helpers for a card's spec file (``<op>.py``): seeded inputs, shared shape sets, bytes moved, and fake
(meta) kernels whose checks and messages mirror the C++ helpers of ``<kernelkit/torch_glue.h>``.

All are exported from the package: ``kernelkit.randn``, ``kernelkit.elementwise_inputs``, ... (docs/helpers.md).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

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
        return lambda x, *rest, **kw: fake_unary(op, x, names[0])
    return lambda a, b, *rest, **kw: fake_binary(op, a, names[0], b, names[1])


def current_op(card: str, op: Optional[str] = None) -> Callable:
    """The callable of op ``op`` (default: the card's own op) of ``card``'s current build, for a card's own
    Python wrapper: ask on every call (a hot reload changes it). Under torch.compile, its OpOverload."""
    return _ops._op(card, op or card)
