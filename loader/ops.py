"""kernelkit.ops: every card's ops as plain Python functions.

``kernelkit.ops.<name>`` is the op ``<name>`` of the card ``<name>`` (or of the card whose name is a prefix of
it, e.g. ``sigmoid_backward`` of ``sigmoid``), wherever the card lives: built in, on ``KERNELKIT_PATH``, or
loaded from ``kernels_dir=``. Each call runs the card's current build (``kernels/<op>.cu`` +
``kernels/<op>.h``): the card is built and loaded on the first call (a few seconds the first time, then from
the cache), and ``kernelkit.load("<op>")`` after an edit hot-reloads it for the next call. The ops are real
torch ops: autograd (where the card registers it), ``torch.compile(fullgraph=True)`` (no graph breaks) and
CUDA graphs work. Functions written out below exist where a card wants a Python-side signature.

    >>> import torch, kernelkit
    >>> kernelkit.ops.sigmoid(torch.randn(1000, device="cuda"))
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from .errors import KernelkitError
from .jit import api, registry
from .jit.cards import find as _find_card
from .jit.cards import search_path as _search_path

__all__ = ["vector_add", "sample_normal"]

# the registry's own dicts (the loader keeps them current): torch.compile guards on _CURRENT's entries
_CURRENT = registry.CURRENT
_FAST = registry.FAST


def _sync(card: str) -> Dict[str, object]:
    """Bind the card's current build (loaded, and set up, on first use); return its eager callables."""
    fns = _FAST.get(card)
    return fns if fns is not None else registry.bind(api.library(card))


def _namespace(card: str) -> str:
    _sync(card)
    return registry.latest(card).ns


# Under torch.compile Dynamo runs this at trace time as an opaque call with a constant result, instead of
# tracing the build machinery (which would be a graph break) when the card is not loaded yet.
# (torch._dynamo.assume_constant_result only sets this marker; calling it would import all of Dynamo,
# ~1 s, on every warm load of a card)
_namespace_for_trace = _namespace
_namespace_for_trace._dynamo_marked_constant = True

_is_compiling = torch.compiler.is_compiling


def _op(card: str, op: str):
    """The callable for ``op`` of ``card``'s current build: the OpOverload under torch.compile, its C++
    callable in eager."""
    if _is_compiling():
        _namespace_for_trace(card)  # syncs/loads the card before Dynamo reads (and guards on) _CURRENT
        return _CURRENT[card][op]
    fn = _sync(card).get(op)
    if fn is None:
        lib = registry.latest(card)
        raise AttributeError(f"kernelkit.ops.{op}: card {card!r} ({lib.card.dir if lib.card else 'inline'}) "
                             f"defines no op {op!r}; it defines: {', '.join(lib.op_names()) or 'none'}")
    return fn


def _public(card: str, op: str) -> Callable:
    """The function ``kernelkit.ops.<op>``: calls op ``op`` of ``card``'s current build on every call."""

    def call(*args, **kwargs):
        if not _is_compiling():  # the eager path: two dict lookups
            fns = _FAST.get(card)
            fn = fns.get(op) if fns is not None else None
            if fn is not None:
                return fn(*args, **kwargs)
        return _op(card, op)(*args, **kwargs)

    call.__name__ = call.__qualname__ = op
    call.__module__ = __name__
    call.__doc__ = (f"The op {op!r} of card {card!r}, its current build (see the card's spec and header for "
                    "its contract).")
    return call


def _candidates(name: str) -> List[str]:
    """Cards that may define op ``name``: ``name`` itself, then its prefixes ending before an underscore."""
    return [name] + [name[:i] for i in range(len(name) - 1, 0, -1) if name[i] == "_"]


def _card_for(name: str) -> Optional[str]:
    cards = _candidates(name)
    for card in cards:  # a loaded build first, from whatever directory it was loaded
        lib = registry.latest(card)
        if lib is not None and (card == name or name in lib.op_names()):
            return card
    for card in cards:
        try:
            _find_card(card)
            return card
        except (KernelkitError, ValueError):
            continue
    return None


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    card = _card_for(name)
    if card is None:
        dirs = ", ".join(map(str, _search_path()))
        raise AttributeError(f"kernelkit.ops has no op {name!r}: no loaded card defines it and no card named "
                             f"{name!r} (or a prefix of it, for ops like <card>_backward) is on the search path "
                             f"({dirs})")
    fn = globals()[name] = _card_function(card, name) or _public(card, name)
    return fn


def _card_function(card: str, name: str) -> Optional[Callable]:
    """The card's own Python function ``name`` (a wrapper with a Python-side signature), if its spec file
    defines one."""
    lib = registry.latest(card)
    try:
        found = lib.card if lib is not None and lib.card is not None else _find_card(card)
        module = found.module()
    except (KernelkitError, ValueError):
        return None
    fn = getattr(module, name, None) if module is not None else None
    return fn if callable(fn) and getattr(fn, "__module__", None) == module.__name__ else None


def __dir__():
    loaded = [op for card in registry.current() for op in _FAST.get(card, ())]
    return sorted(set(globals()) | set(loaded))


# ----------------------------------------------------------------------------------------------------
# the functions with a Python-side signature


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
