"""kernelkit.ops: the built-in kernel cards as plain Python functions.

Each function calls the torch op of the newest loaded build of its card (``kernels/<op>.cu`` +
``kernels/<op>.h``). The card is built and loaded on the first call (a few seconds the first time, then
from the cache); ``kernelkit.load("<op>")`` after editing the card hot-reloads it and later calls run the
new code. The ops are real torch ops: autograd (where differentiable), ``torch.compile(fullgraph=True)``
(no graph breaks) and CUDA graphs work.

    >>> import torch, kernelkit
    >>> kernelkit.ops.sigmoid(torch.randn(1000, device="cuda"))
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence

import torch

from .jit import api, fastcall

__all__ = ["vector_add", "elementwise_mul", "sigmoid", "sigmoid_backward", "sample_normal"]

# card name -> {op name: OpOverload} of the build kernelkit.ops currently calls; a plain dict so that
# torch.compile guards on it (a reload triggers a recompile, not a stale op).
_CURRENT: Dict[str, Dict[str, torch._ops.OpOverload]] = {}
# card name -> {op name: its eager callable}: kernelkit.fastcall's (Python arguments straight to the
# dispatcher), else the OpOverload's C++ callable. Always the loader's newest build of the card: a new
# build's setup() binds it (_bind), and the loader's on_activate hook rebinds when it switches back to an
# earlier build.
_FAST: Dict[str, Dict[str, object]] = {}
# namespace -> op names its card's setup() bound (to rebind that build without running setup again).
_BOUND_NS: Dict[str, Sequence[str]] = {}
_BIND_LOCK = threading.Lock()  # _bind (any thread that loads a card) vs _use_fastcall (the builder thread)


def _bind(lib, op_names: Sequence[str]) -> None:
    """Point the public functions of card ``lib.name`` at ``lib``'s ops.

    Called by each card's ``setup(lib)`` (kernels/<op>.py), which the loader runs after every new build.
    """
    ops = lib.ops
    overloads = {name: getattr(ops, name).default for name in op_names}
    with _BIND_LOCK:
        _CURRENT[lib.name] = overloads
        _FAST[lib.name] = _callables(overloads)
        _BOUND_NS[lib.ns] = tuple(op_names)


def _callables(overloads: Dict[str, torch._ops.OpOverload]) -> Dict[str, object]:
    """The eager callables of ``overloads`` (fastcall's where its module is loaded)."""
    return {name: fastcall.wrap(ov) for name, ov in overloads.items()}


def _use_fastcall() -> None:
    """Rebind every card's ops to the fast call path (run by kernelkit.fastcall once its module loads)."""
    with _BIND_LOCK:
        for card, overloads in _CURRENT.items():
            _FAST[card] = _callables(overloads)


def _on_activate(lib) -> None:
    if lib.ns in _BOUND_NS:
        _bind(lib, _BOUND_NS[lib.ns])


def _sync(card: str):
    """Bind the card's newest build (kernelkit.library: loaded, and set up, on first use); return it."""
    lib = api.library(card)
    if lib.ns in _BOUND_NS:
        _bind(lib, _BOUND_NS[lib.ns])
        return lib
    module = lib.card.module() if getattr(lib, "card", None) is not None else None
    if module is None or not hasattr(module, "setup"):
        raise RuntimeError(f"kernelkit.ops: card {card!r} has no setup(lib) that binds its ops")
    module.setup(lib)  # normally already run by the loader; binds via _bind
    return lib


def _namespace(card: str) -> str:
    return _sync(card).ns


# Under torch.compile Dynamo runs this at trace time as an opaque call with a constant result, instead of
# tracing the build machinery (which would be a graph break) when the card is not loaded yet.
# (torch._dynamo.assume_constant_result only sets this marker; calling it would import all of Dynamo,
# ~1 s, on every warm load of a card)
_namespace_for_trace = _namespace
_namespace_for_trace._dynamo_marked_constant = True

_is_compiling = torch.compiler.is_compiling


def _op(card: str, op: str):
    """The callable for ``op`` of ``card``'s newest build: the OpOverload under torch.compile, its C++
    callable in eager (two dict lookups: this is on every call's path)."""
    if _is_compiling():
        _namespace_for_trace(card)  # syncs/loads the card before Dynamo reads (and guards on) _CURRENT
        return _CURRENT[card][op]
    fns = _FAST.get(card)
    if fns is None:
        _sync(card)
        fns = _FAST[card]
    return fns[op]


def _register_hook() -> None:
    api.on_activate(_on_activate)
    fastcall.on_ready(_use_fastcall)


_register_hook()


# ----------------------------------------------------------------------------------------------------
# shape/dtype rules shared by the fake (meta) kernels, mirroring the C++ checks

_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _check_floating(op: str, t: torch.Tensor, name: str) -> None:
    if t.dtype not in _FLOATING:
        raise RuntimeError(f"{op}: {name} must be a float32, float64, float16 or bfloat16 tensor, got {t.dtype}")


def _check_pair(op: str, a: torch.Tensor, an: str, b: torch.Tensor, bn: str) -> None:
    _check_floating(op, a, an)
    _check_floating(op, b, bn)
    if a.device != b.device:
        raise RuntimeError(f"{op}: {an} and {bn} must be on the same device, got {an} on {a.device} and {bn} on "
                           f"{b.device}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{op}: {an} and {bn} must have the same dtype, got {an} {a.dtype} and {bn} {b.dtype}")


def _fake_binary(op: str, a: torch.Tensor, an: str, b: torch.Tensor, bn: str) -> torch.Tensor:
    _check_pair(op, a, an, b, bn)
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise RuntimeError(f"{op}: shapes of {an} {tuple(a.shape)} and {bn} {tuple(b.shape)} cannot be broadcast "
                           "together") from None
    return a.new_empty(shape)


# ----------------------------------------------------------------------------------------------------
# the public functions


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
        return _op("vector_add", "vector_add")(a, b, alpha)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or out.requires_grad):
        raise RuntimeError("kernelkit.ops.vector_add(): out= does not support automatic differentiation "
                           "(inputs or out require grad)")
    _op("vector_add", "vector_add_out")(a, b, alpha, out)
    return out


def elementwise_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a * b`` elementwise, broadcasting like :func:`torch.mul` (card ``kernels/elementwise_mul``).

    float32/float64/float16/bfloat16, one dtype and device for both. Differentiable: grad_a = g * b,
    grad_b = g * a, each summed over the dimensions its input was broadcast along; only the gradients
    that are needed are computed.
    """
    return _op("elementwise_mul", "elementwise_mul")(a, b)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Numerically stable logistic sigmoid (card ``kernels/sigmoid``).

    ``1 / (1 + exp(-x))`` for x >= 0 and ``exp(x) / (1 + exp(x))`` otherwise, so large |x| (e.g. ±1e5)
    gives exactly 1 or 0, never inf/NaN. float32/float64/float16/bfloat16 (half types computed in
    float32). Differentiable: the backward is the fused kernel :func:`sigmoid_backward` applied to the
    saved output.
    """
    return _op("sigmoid", "sigmoid")(x)


def sigmoid_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``grad * out * (1 - out)`` in one pass: the gradient of :func:`sigmoid` from its output ``out``."""
    return _op("sigmoid", "sigmoid_backward")(grad, out)


def sample_normal(mu: torch.Tensor, sigma: torch.Tensor, n: int, *, generator: Optional[torch.Generator] = None,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Draw ``n`` samples from N(mu_i, sigma_i^2) per row: ``X[i, j] = mu[i] + sigma[i] * z[i, j]``.

    The fused CEM sampler (card ``kernels/sample_normal``). Returns a ``(d, n)`` tensor for ``mu`` and
    ``sigma`` of shape ``(d,)`` (same dtype — float32/float64/float16/bfloat16 — and device). Every
    ``z[i, j]`` is an independent N(0, 1) draw.

    On CUDA, z is generated inside the kernel with Philox4x32-10 from ``generator`` (default: the
    device's default CUDA generator), like torch's own random ops: the same seed gives the same samples,
    the generator advances on every call, and each replay of a captured CUDA graph draws fresh samples.
    float64 uses cuRAND's exact double Box-Muller; float32/float16/bfloat16 use the GPU's approximate
    log/sqrt/sin/cos, within ~1e-6 (1 + |z|) of the exact transform of the same random bits
    (``kernelkit.reference.philox`` reproduces every sample). On CPU it uses ``torch.randn`` with the
    CPU generator (a different stream of numbers than CUDA).

    Args:
        n: samples per row (>= 0). No limit on ``n`` or ``d``.
        generator: a ``torch.Generator`` on the tensors' device type.
        out: optional preallocated ``(d, n)`` tensor to fill (avoids an allocation per CEM iteration);
            ``n`` must equal ``out.shape[1]``. Returned.

    Not differentiable. Under ``torch.compile`` pass ``generator=None``.
    """
    if out is None:
        if generator is None:  # keyword parsing costs ~0.3 us of host time per call
            return _op("sample_normal", "sample_normal")(mu, sigma, n)
        return _op("sample_normal", "sample_normal")(mu, sigma, n, generator=generator)
    if out.dim() != 2 or out.shape[1] != n:
        raise ValueError(f"kernelkit.ops.sample_normal: out must have shape (d, n) = ({mu.shape[0] if mu.dim() else '?'}, "
                         f"{n}), got {tuple(out.shape)}")
    _op("sample_normal", "sample_normal_out")(mu, sigma, out, generator=generator)
    return out
