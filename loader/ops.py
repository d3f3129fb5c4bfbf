"""kernelkit.ops: every card's ops as plain Python functions.

``kernelkit.ops.<name>`` is the op ``<name>`` of the card ``<name>`` (or of the card whose name is a prefix of
it, e.g. ``sigmoid_backward`` of ``sigmoid``), wherever the card lives: built in, on ``KERNELKIT_PATH``, or
loaded from ``kernels_dir=``. Each call runs the card's current build (``kernels/<op>.cu`` +
``kernels/<op>.h``): the card is built and loaded on the first call (a few seconds the first time, then from
the cache), and ``kernelkit.load("<op>")`` after an edit hot-reloads it for the next call. The ops are real
torch ops: autograd (where the card registers it), ``torch.compile(fullgraph=True)`` (no graph breaks) and
CUDA graphs work.

A card that wants a Python-side signature (keywords, ``out=``, argument checks) defines a function named like
the op in its own Python file (``kernels/vector_add.py`` defines ``vector_add``, calling
``kernelkit.cardkit.current_op``); ``kernelkit.ops.<name>`` is then that function, for a user's card on
``KERNELKIT_PATH`` as for a built-in one. This module holds only the machinery.

    >>> import torch, kernelkit
    >>> kernelkit.ops.sigmoid(torch.randn(1000, device="cuda"))
"""
from __future__ import annotations

import functools
import types
from typing import Callable, Dict, List, Optional

import torch

from . import loading
from .errors import KernelkitError
from .jit import registry
from .jit.cards import find as _find_card
from .jit.cards import search_path as _search_path

__all__: List[str] = []  # every op is found by name on first use (__getattr__)

# the registry's own dicts (the loader keeps them current): torch.compile guards on _CURRENT's entries
_CURRENT = registry.CURRENT
_FAST = registry.FAST


def _sync(card: str) -> Dict[str, object]:
    """Bind the card's current build (loaded, and set up, on first use); return its eager callables."""
    fns = _FAST.get(card)
    return fns if fns is not None else registry.bind(loading.library(card))


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


def _op(card: str, op: Optional[str] = None):
    """The callable for ``op`` (default: the card's own op, named like the card) of ``card``'s current build:
    the OpOverload under torch.compile, its C++ callable in eager. ``kernelkit.cardkit.current_op`` is this
    function, so a card's own Python function pays no extra call for asking on every call."""
    if op is None:
        op = card
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
    defines one, as a function of this module."""
    lib = registry.latest(card)
    try:
        found = lib.card if lib is not None and lib.card is not None else _find_card(card)
        module = found.module()
    except (KernelkitError, ValueError):
        return None
    fn = getattr(module, name, None) if module is not None else None
    if not callable(fn) or getattr(fn, "__module__", None) != module.__name__:
        return None
    return _named_here(fn, name) if isinstance(fn, types.FunctionType) else fn


def _named_here(fn: types.FunctionType, name: str) -> types.FunctionType:
    """A copy of ``fn`` (same code, globals, defaults) that is ``kernelkit.ops.<name>``: found by that name in
    another process (``kernelkit.profile``, pickle), and called without an extra Python frame."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    functools.update_wrapper(copy, fn)
    copy.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    copy.__module__, copy.__qualname__ = __name__, name
    return copy


def __dir__():
    loaded = [op for card in registry.current() for op in _FAST.get(card, ())]
    return sorted(set(globals()) | set(loaded))
