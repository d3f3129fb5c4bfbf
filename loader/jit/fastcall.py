"""The eager fast path of ``kernelkit.ops``: one small C++ module (``csrc/kernelkit/fastcall.cpp``) that
calls a torch op through the dispatcher without torch.ops' generic Python argument matching.

It is built once per torch/Python/compiler into the kernelkit cache, like a card, in a background thread
started by the first op that asks for it; until it is loaded the ops use their torch.ops callables and
are then rebound (``on_ready``). Anything it cannot do falls back to the op's torch.ops callable: a failed
build (no compiler, no Python headers), an op whose schema has argument types it does not convert, or a
call it does not handle (tensor subclasses, modes, tracing).

``KERNELKIT_FASTCALL=off`` (or ``KERNELKIT_FAST=off``) turns it off. Unset, a cached or prebuilt module is
always loaded, but a missing one is built in the background only with ``MIN_BUILD_CPUS`` or more CPUs: the
10-14 s compile would compete with the user's work on a small machine and is often thrown away with a
short-lived process. ``KERNELKIT_FASTCALL=on`` builds it in the background whatever the CPU count;
``module()`` always does.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, List, Optional

import torch

from .. import settings
from . import obtain, progress, sources
from .library import import_extension
from .plan import make_target
from .units import Target, plan_unit

log = logging.getLogger("kernelkit")

MODULE_NAME = "_kernelkit_fastcall"
SOURCE = sources.CSRC / "fastcall.cpp"
AOT_NAME = "fastcall"  # its name among the AOT targets (python -m kernelkit.aot fastcall)

MIN_BUILD_CPUS = 4  # fewer CPUs: no background build unless KERNELKIT_FASTCALL=on asks for one

_LOCK = threading.Lock()  # building/loading the module
_START = threading.Lock()  # starting the background thread that does it
_STATE = {"module": None, "tried": False, "error": None, "thread": None}
_ON_READY: List[Callable[[], None]] = []


def enabled() -> bool:
    """Whether the fast call path is on (read whenever an op is wrapped)."""
    return settings.fast_path("fastcall")


def background_build_pays() -> bool:
    """Whether a background build of a missing module is worth it here: asked for (``KERNELKIT_FASTCALL=on``)
    or enough CPUs to compile beside the user's work."""
    if settings.FASTCALL.get() == "on":
        return True
    return (os.cpu_count() or 1) >= MIN_BUILD_CPUS


def ready_made(t: Target) -> bool:
    """Whether the module for ``t`` is prebuilt or in the cache, so loading it compiles nothing."""
    return obtain.local(t) is not None


def target() -> Target:
    text = SOURCE.read_text()
    unit = plan_unit("cpp", SOURCE, text, [sources.INCLUDE], [], [], "kernelkit/fastcall.cpp", optimize="-O2")
    return make_target("fastcall", [unit], False, MODULE_NAME, [], {"kernelkit/fastcall.cpp": text.splitlines()})


def module():
    """Build (once per torch/Python/compiler, into the cache) or load the module and return it; None when
    disabled or when that failed (the reason is in ``error()``). Blocks until done."""
    if not enabled():
        return None
    if _STATE["tried"]:
        return _STATE["module"]
    with _LOCK:
        if not _STATE["tried"]:
            try:
                t = target()
                so = obtain.obtain(t)[0]
                _STATE["module"] = import_extension(MODULE_NAME, so)
            except Exception as e:  # noqa: BLE001 - an optimisation: any failure means the torch.ops path
                _STATE["error"] = f"{type(e).__name__}: {e}"
                log.warning("kernelkit: the fast op call path is unavailable, kernelkit.ops calls go through "
                            "torch.ops (%s)", _STATE["error"].splitlines()[0])
            _STATE["tried"] = True
            if _STATE["module"] is not None:
                for callback in list(_ON_READY):  # before the lock is released: module() returning means done
                    try:
                        callback()
                    except Exception:  # noqa: BLE001 - a failing subscriber must not hide the module
                        log.exception("kernelkit: a fast call path subscriber failed")
    return _STATE["module"]


def _background() -> None:
    """Load the module if it is ready-made; build it first only where that pays (announced, once)."""
    try:
        fresh = not ready_made(target())
    except Exception:  # noqa: BLE001 - module() meets the same problem and reports it
        fresh = True
    if fresh and not background_build_pays():
        log.info("kernelkit: not building the fast call module in the background on %s CPU(s) (set "
                 "KERNELKIT_FASTCALL=on to); kernelkit.ops calls go through torch.ops", os.cpu_count())
        return
    if fresh:
        progress.say("building kernelkit's fast call module in the background (once per torch version)")
    module()


def start() -> None:
    """Start loading (or building, where it pays) the module in a background thread, once per process."""
    if _STATE["tried"] or not enabled():
        return
    with _START:
        if _STATE["thread"] is None:
            _STATE["thread"] = threading.Thread(target=_background, name="kernelkit-fastcall", daemon=True)
            _STATE["thread"].start()


def on_ready(callback: Callable[[], None]) -> None:
    """Call ``callback()`` once the module is loaded (kernelkit.ops then rebinds its ops to it)."""
    _ON_READY.append(callback)


def error() -> Optional[str]:
    return _STATE["error"]


def wrap(overload: torch._ops.OpOverload):
    """A callable with the op's calling convention: the fast one when the module is loaded, else torch.ops'
    (and the module's build or load starts in the background). Never blocks."""
    slow = getattr(overload, "_op", overload)
    mod = _STATE["module"] if enabled() else None
    if mod is None:
        start()
        return slow
    schema = overload._schema
    fast = mod.make(schema.name, schema.overload_name, slow)
    return slow if fast is None else fast
