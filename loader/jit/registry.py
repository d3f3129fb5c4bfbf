"""The builds loaded in this process and the current build of each card: the one place the loader writes
and ``kernelkit.ops`` reads.

A card's ops are bound automatically: every op its library defines (its ``KERNELKIT_LIBRARY`` block),
listed from the dispatcher. Binding is lazy (on the first ``kernelkit.ops`` call of the card) and follows
the loader: when a card that is called gets a new current build, its ops are rebound at once.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import fastcall
from .library import Library

_LOCK = threading.RLock()  # loaders in any thread vs the fastcall builder thread's rebind
#: build key -> every card/inline build loaded in this process (a .so cannot be unloaded)
BY_KEY: Dict[str, Library] = {}
#: card/inline name -> its current (newest loaded, or switched back to) build
LATEST: Dict[str, Library] = {}
#: card name -> {op name: OpOverload} of the bound build; a plain dict, so torch.compile guards on it (a
#: reload triggers a recompile, not a stale op)
CURRENT: Dict[str, Dict[str, torch._ops.OpOverload]] = {}
#: card name -> {op name: eager callable}: kernelkit.fastcall's where its module is loaded, else the
#: OpOverload's C++ callable
FAST: Dict[str, Dict[str, object]] = {}
#: build key -> (what load returned, the built file) of every torch-style extension loaded in this process
EXTENSIONS: Dict[str, Tuple[object, Path]] = {}
#: card name -> its router (set by kernelkit.autotune of the card): wraps the bound build's eager callables
#: so that each call may run another build of the card (the one tuned for the call's shape bucket)
ROUTERS: Dict[str, Callable[[Dict[str, object]], Dict[str, object]]] = {}


def add(lib: Library, make_current: bool = True) -> None:
    """Record a newly loaded build and (unless told not to) make it its name's current one."""
    with _LOCK:
        BY_KEY[lib.key] = lib
        if make_current:
            activate(lib)


def activate(lib: Library) -> None:
    """Make ``lib`` its name's current build (a new build, or an earlier one again after an undone edit)."""
    with _LOCK:
        LATEST[lib.name] = lib
        if lib.name in CURRENT:  # kernelkit.ops calls this card: point it at the new build now
            bind(lib)


def by_key(key: str) -> Optional[Library]:
    return BY_KEY.get(key)


def extension(key: str) -> Optional[Tuple[object, Path]]:
    return EXTENSIONS.get(key)


def add_extension(key: str, result: object, path: Path) -> None:
    with _LOCK:
        EXTENSIONS[key] = (result, path)


def extensions() -> List[Tuple[object, Path]]:
    """A snapshot of the torch-style extensions loaded: (what load returned, the built file) each."""
    with _LOCK:
        return list(EXTENSIONS.values())


def latest(name: str) -> Optional[Library]:
    return LATEST.get(name)


def current() -> Dict[str, Library]:
    """A snapshot of each name's current build: readers iterate it while loaders in other threads add builds."""
    with _LOCK:
        return dict(LATEST)


def overloads(lib: Library) -> Dict[str, torch._ops.OpOverload]:
    """Every op with a default overload that ``lib`` defines, by name."""
    found = {}
    for name in lib.op_names():
        packet = getattr(lib.ops, name)
        if "default" in packet.overloads():
            found[name] = packet.default
    return found


def eager(ops: Dict[str, torch._ops.OpOverload]) -> Dict[str, object]:
    """The eager callables of ``ops``: kernelkit.fastcall's where its module is loaded, else their C++ callables."""
    return {name: fastcall.wrap(ov) for name, ov in ops.items()}


def bind(lib: Library) -> Dict[str, object]:
    """Point card ``lib.name``'s ops at ``lib``: every op with a default overload it defines. Returns the
    eager callables by op name."""
    ops = overloads(lib)
    with _LOCK:
        fast = _routed(lib.name, eager(ops))
        CURRENT[lib.name] = ops
        FAST[lib.name] = fast
    return fast


def route(card: str, router: Callable[[Dict[str, object]], Dict[str, object]]) -> None:
    """Let ``router`` wrap card ``card``'s eager callables from now on (rebinding a bound card at once)."""
    with _LOCK:
        ROUTERS[card] = router
        if card in CURRENT and card in LATEST:
            bind(LATEST[card])


def _routed(card: str, fast: Dict[str, object]) -> Dict[str, object]:
    router = ROUTERS.get(card)
    return router(fast) if router is not None else fast


def _use_fastcall() -> None:
    """Rebind every bound card's ops to the fast call path (kernelkit.fastcall runs it once loaded)."""
    with _LOCK:
        for card, ops in CURRENT.items():
            FAST[card] = _routed(card, eager(ops))


fastcall.on_ready(_use_fastcall)
