"""One way to get a built library for a target: a verified cache entry, then a prebuilt (AOT) library, then the
remote cache a team shares (``remote``: fetched, verified and landed in the local cache), then a build, which is
published to the remote cache. The local cache stays the only place a library is loaded from. Every caller (the
loaders, the fast call and launcher modules, ``kernelkit run``, the distributed exchange) goes through
:func:`obtain`, so the order is the same everywhere."""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

from . import build as _build
from . import cache, prebuilt, remote
from .progress import say
from .units import Target


def local(target: Target, prebuilt_ok: bool = True) -> Tuple[Path, bool, float] | None:
    """(path, True, 0.0) when the cache or a prebuilt holds ``target``; None when it must be built."""
    so = cache.verified_library(target.name, target.key)
    if so is not None:
        return so, True, 0.0
    ready = prebuilt.find_prebuilt(target) if prebuilt_ok else None
    if ready is not None:
        say(f"{target.name}: using prebuilt {ready}")
        return ready, True, 0.0
    return None


def obtain(target: Target, prebuilt_ok: bool = True) -> Tuple[Path, bool, float]:
    """(path, cached, seconds spent building). Takes no process-wide lock: the cache's file locks keep
    concurrent builders of one entry apart, and builds of different entries run side by side."""
    found = local(target, prebuilt_ok)
    if found is not None:
        return found
    fetched = remote.fetch(target)
    if fetched is not None:
        return fetched, True, 0.0
    so, cached, seconds = _build.build(target)
    if not cached:  # built here: the team's next process fetches it (one that waited on another's build does not)
        remote.publish(target, so, seconds)
    return so, cached, seconds
