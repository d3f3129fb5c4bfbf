"""Collecting the cache: ``gc`` by each row's gc rule, ``clear`` by its clear rule, and the size cap, which takes the
least recently used entries first; ``maybe_gc`` runs them after a build, at most once a day (the cap: every few
minutes). Entries another process holds are left alone."""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

from ... import settings
from ...errors import CacheUnwritable, KernelkitError
from .. import store
from .files import du
from .root import cache_dir
from .table import KIND_DIRS, ROWS, Entry, row_entries

log = logging.getLogger("kernelkit")

DEFAULT_MAX_AGE_DAYS = settings.CACHE_MAX_AGE_DAYS.default
STALE_TMP_SECONDS = 3600.0  # private build dirs and fresh sources younger than this may belong to a live build
STALE_LOCK_SECONDS = 86400.0
GC_INTERVAL_SECONDS = 86400.0
CAP_INTERVAL_SECONDS = 300.0  # the size cap walks the cache: after a build, at most this often
CAP_GRACE_SECONDS = 600.0  # entries used this recently may be in a build's or a load's hands: the cap leaves them


def gc(max_age_days: float = DEFAULT_MAX_AGE_DAYS, now: Optional[float] = None,
       max_bytes: Optional[int] = None) -> Dict[str, int]:
    """Remove what each row's gc rule (``store.STORES``) says has had its day -- entries unused for
    ``max_age_days``, build dirs left by dead builds, idle lock files, what lies in no row's place -- then hold
    the cache to ``max_bytes`` (:func:`enforce_size_cap`). Entries another process holds are left alone. Returns
    how many entries of each row went (partial writes of killed writers count as tmp)."""
    now = time.time() if now is None else now
    cutoff = now - max_age_days * 86400
    removed = {row.name: _sweep(row, _gc_cut(row.gc, cutoff, now)) for row in ROWS}
    removed["tmp"] += _remove_partial_writes(now - STALE_TMP_SECONDS)
    for row, n in _cap(max_bytes, now).items():
        removed[row.name] += n
    for row in ROWS:  # what goes with an object the cap took
        if row.gc == store.WITH_OBJECT:
            removed[row.name] += _sweep(row, _gc_cut(row.gc, cutoff, now))
    return removed


def _gc_cut(rule: str, cutoff: float, now: float) -> float:
    """gc removes an entry under ``rule`` last used before this (``cutoff``: the max age's)."""
    return {store.AGED: cutoff, store.AGED_SOURCES: min(cutoff, now - STALE_TMP_SECONDS),
            store.STALE: now - STALE_TMP_SECONDS, store.IDLE: now - STALE_LOCK_SECONDS, store.WITH_OBJECT: 0.0,
            store.KEPT: -math.inf, store.NEVER: -math.inf}[rule]


def _clear_cut(rule: str, now: float) -> float:
    """clear removes an entry under ``rule`` last used before this: sources and build dirs younger than an hour
    may belong to a live build."""
    return {store.AGED: math.inf, store.AGED_SOURCES: now - STALE_TMP_SECONDS, store.STALE: now - STALE_TMP_SECONDS,
            store.IDLE: math.inf, store.WITH_OBJECT: 0.0, store.KEPT: math.inf, store.NEVER: -math.inf}[rule]


def _sweep(row: store.Store, cut: float) -> int:
    """Remove the row's entries last used before ``cut``; each is asked again once it is ours to remove."""
    n = 0
    for e in row_entries(row):
        if e.used() < cut and e.remove_if(lambda e=e: e.used() >= cut):
            n += 1
    return n


def _remove_partial_writes(cutoff: float) -> int:
    """``.<name>.XXXX.tmp`` files (``kernelkit.replace_file``) older than ``cutoff``: left by a writer that was
    killed between writing and renaming, inside entries that are still in use."""
    n = 0
    for parent, _, files in os.walk(cache_dir()):  # unlike rglob, it passes over a directory removed meanwhile
        for name in files:
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    path = os.path.join(parent, name)
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        n += 1
    return n


def maybe_gc() -> None:
    """Collect at most once a day and hold the cache to its size cap (checked at most every few minutes), after
    a build (never on the warm path). Never fails the build."""
    try:
        if _due("last-gc", GC_INTERVAL_SECONDS):
            removed = gc(_max_age_days(), max_bytes=_max_bytes())
        elif _due("last-size-check", CAP_INTERVAL_SECONDS):
            removed = enforce_size_cap(_max_bytes())
        else:
            return
    except (OSError, CacheUnwritable) as e:
        log.warning("cache gc failed: %s", e)
        return
    if any(removed.values()):
        log.info("cache gc removed %s", {k: n for k, n in removed.items() if n})


def _due(stamp_name: str, interval: float) -> bool:
    """Whether ``interval`` seconds have passed since the stamp was last touched; touches it if so."""
    stamp = cache_dir() / stamp_name
    with contextlib.suppress(OSError):
        if time.time() - stamp.stat().st_mtime < interval:
            return False
    stamp.touch()
    return True


def max_bytes() -> Optional[int]:
    """KERNELKIT_CACHE_MAX_SIZE: the cache's size cap in bytes (None: none)."""
    return settings.CACHE_MAX_SIZE.get()


def _max_bytes() -> Optional[int]:
    """:func:`max_bytes`; a bad value is reported and replaced by the default: gc never fails a build."""
    try:
        return max_bytes()
    except KernelkitError as e:
        log.warning("%s; using %d bytes", e, settings.CACHE_MAX_SIZE.default)
        return settings.CACHE_MAX_SIZE.default


def enforce_size_cap(limit: Optional[int], now: Optional[float] = None) -> Dict[str, int]:
    """Remove the least recently used libraries, objects, precompiled headers, generated sources and records
    until the cache holds at most ``limit`` bytes (None: no cap). Entries used in the last ``CAP_GRACE_SECONDS``
    (sources: the last hour) and entries another process holds stay, even over the cap. Returns how many of
    each kind went."""
    removed = dict.fromkeys(KIND_DIRS, 0)
    for row, n in _cap(limit, now).items():
        removed[row.kind] += n
    return removed


def _cap(limit: Optional[int], now: Optional[float]) -> Dict[store.Store, int]:
    """:func:`enforce_size_cap`, counted by row."""
    removed: Dict[store.Store, int] = {}
    if limit is None:
        return removed
    now = time.time() if now is None else now
    total = du(cache_dir())
    for used, size, row, remove in sorted(_evictable(now), key=lambda c: c[0]):
        if total <= limit or used > now - CAP_GRACE_SECONDS:
            break
        if remove():
            total -= size
            removed[row] = removed.get(row, 0) + 1
    return removed


def _evictable(now: float) -> List[Tuple[float, int, store.Store, Callable[[], bool]]]:
    """(last use, bytes, row, remove) of every entry the size cap may take: what clear would take of the rows of
    a kind ``info`` sizes; ``remove`` leaves an entry used since it was listed."""
    found = []
    for row in [r for r in ROWS if r.kind in KIND_DIRS]:
        cut = _clear_cut(row.gc, now)
        for e in row_entries(row):
            used = e.used()
            if used < cut:
                keep = functools.partial(_used_since, e, used)
                found.append((used, e.size(), row, functools.partial(e.remove_if, keep)))
    return found


def _used_since(entry: Entry, used: float) -> bool:
    return entry.used() > used


def _max_age_days() -> float:
    """KERNELKIT_CACHE_MAX_AGE_DAYS; a bad value is reported and replaced by the default: gc never fails a build."""
    try:
        return settings.CACHE_MAX_AGE_DAYS.get()
    except KernelkitError as e:
        log.warning("%s; using %g", e, DEFAULT_MAX_AGE_DAYS)
        return DEFAULT_MAX_AGE_DAYS


def clear() -> int:
    """Remove what each row's clear rule (``store.STORES``) takes: every library, object, precompiled header and
    record, and the generated sources and build dirs not touched in the last hour; entries another process is
    building or removing are left. Returns how many were removed (lock files and shape records, which go with the
    entries they serve, not counted)."""
    now = time.time()
    removed = {row: _sweep(row, _clear_cut(row.gc, now)) for row in ROWS}
    return sum(n for row, n in removed.items() if row.gc not in (store.IDLE, store.WITH_OBJECT))
