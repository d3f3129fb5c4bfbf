"""Warm plans of torch-style extensions: what a full plan read, recorded by file identity, so that a new
process loading unchanged sources skips the include scan and the hashing of every source.

A record maps one call (the name, the resolved sources, every compile and link flag, the toolchain, the
working directory and the include environment: ``call_key``) to the target key the full plan derived, with
the identity (inode, size, mtime, ctime) of every file the plan read and of every directory its include
search looked into, present or absent. Any difference -- an edit, a header created where the search would
now find it, a retargeted link, a created include dir -- sends the load down the full plan, which writes the
record again. ctime cannot be set back from user space, so an edit undone again is still seen. A file or
directory changed within one timestamp tick of the plan (``FINE_RACY_SECONDS``; ``RACY_SECONDS`` where the
timestamps are whole seconds) is not recorded: a second edit in the same tick could leave its identity unchanged.

The library a record points to is verified by sha256 (``cache.verified_library``) the first time; the record
then keeps the identity the library had while its hash matched, and a later load with the same identity
skips the hashing (tens of milliseconds for a large CUDA library). A tampered or truncated library has
another size or ctime, so it is hashed again and refused. Ownership and permissions are checked every time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

from ... import replace_file, settings
from ...errors import CacheSecurityError
from .. import cache, keys, sources, toolchain
from ..units import Target, Unit, defined_namespaces

RACY_SECONDS = 2.0  # a filesystem that keeps whole seconds (FAT keeps even ones)
FINE_RACY_SECONDS = 0.1  # one with finer timestamps, which come from the kernel's coarse clock (a tick of 1-10 ms)
_ENV = ("CPATH", "CPLUS_INCLUDE_PATH")
#: target key -> call key of each plan this process made in full and recorded: its load can stamp the library
_RECORDED: Dict[str, str] = {}


@dataclasses.dataclass
class Recalled(Target):
    """A target read back from a record: enough to find, check and open its cached library, not to build it."""

    call: str = ""
    namespaces: List[str] = dataclasses.field(default_factory=list)  # what its TORCH_LIBRARY blocks define
    library: Optional[list] = None  # [path, identity] of the library when its sha256 last matched


def call_key(name: str, paths: Sequence[Path], flags_by_kind: Dict[str, List[str]], ldflags: Sequence[str],
             pymodule: Optional[str], standalone: bool) -> str:
    """Everything a torch-style plan derives its target from, besides the files it reads."""
    compilers = [toolchain.fingerprint()] + ([toolchain.nvcc_fingerprint()] if "cu" in flags_by_kind else [])
    # the settings that can change a build too (a build strategy chosen by one changes unit keys): another
    # value plans in full, while one that changes nothing built (KERNELKIT_VERBOSE) keeps the record
    environment = [f"{k}={os.environ[k]}" for k in _ENV if k in os.environ]
    environment += [f"{k}={v!r}" for k, v in settings.build_environment()]
    parts = [name, *compilers, os.getcwd(), *environment,
             json.dumps(flags_by_kind, sort_keys=True), "\0".join(ldflags), str(pymodule), str(standalone),
             *map(str, paths)]
    return keys.plan_key(parts)


def _identity(path) -> Optional[List[int]]:
    """(device, inode, size, mtime, ctime): the last two say when it last changed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _racy(ident: List[int], since: float) -> bool:
    """Whether a file changed within one timestamp tick before ``since``, when a second change could keep its
    identity. Timestamps that are all whole seconds may come from a filesystem that keeps no finer ones."""
    whole = all(t % 1_000_000_000 == 0 for t in ident[-2:])
    return max(ident[-2:]) >= (since - (RACY_SECONDS if whole else FINE_RACY_SECONDS)) * 1e9


def _record_path(call: str) -> Path:
    return cache.record_path("plans", call[:32])


def recall(call: str) -> Optional[Recalled]:
    """The target recorded for ``call`` if every file and directory it watches is as it was, else None."""
    path = _record_path(call)
    try:
        cache.check_safe(path)
        record = json.loads(path.read_bytes())
        if record.get("call") != call:
            return None
        if any(_identity(p) != ident for p, ident in record["watch"].items()):
            return None
        t = record["target"]
        # no deps: a recalled target is opened, never built, and the watch above covered what they were
        units = [Unit(u["kind"], Path(u["path"]), u["display"], [], u["key"], []) for u in t["units"]]
        return Recalled(t["name"], units, [], t["key"], t["with_cuda"], t["pymodule"], {}, {},
                        standalone=t["standalone"], call=call, namespaces=list(t["namespaces"]),
                        library=record.get("library"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, CacheSecurityError):
        return None  # no record, or one this version cannot read: plan in full


def verified_library(target: Recalled) -> Optional[Path]:
    """The recalled target's cached library if it is intact: hashed unless it still has the identity it had
    when its sha256 last matched."""
    if target.library:
        so = Path(target.library[0])
        try:
            cache.check_safe(so.parent)
            cache.check_safe(so)
            same = _identity(so) == target.library[1]
        except (OSError, CacheSecurityError):
            same = False
        if same:
            with contextlib.suppress(OSError):
                os.utime(so.parent / "manifest.json")  # last use, for gc (as cache.verified_library does)
            return so
    before = _identity(cache.library_dir(target.name, target.key))
    so = cache.verified_library(target.name, target.key)
    if so is not None:
        _stamp(target.call, so, before)
    return so


def _stamp(call: str, so: Path, entry_before: Optional[List[int]]) -> None:
    """Record the identity of a library whose sha256 just matched, unless it may have changed meanwhile."""
    ident = _identity(so)
    if ident is None or entry_before is None or _racy(ident, time.time()):
        return
    if _identity(so.parent) != entry_before:  # the entry was replaced while it was being hashed
        return
    path = _record_path(call)
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return
    if record.get("call") == call:
        record["library"] = [str(so), ident]
        _write(path, record)


def remember(call: str, target: Target, started: float) -> None:
    """Record ``target`` for ``call`` unless something it read changed since ``started`` (or just before it),
    or reads differently now than the plan read it. Never fails the load."""
    try:
        watched = _watched(target)
    except OSError:
        return
    before = {str(p): _identity(p) for p in watched}
    if any(i is not None and _racy(i, started) for i in before.values()):
        return  # racy: an edit within one timestamp tick of this one could keep the identity
    if not _reads_as_planned(target) or {str(p): _identity(p) for p in watched} != before:
        return  # changed while the plan ran: the key may not match what is there now
    units = [{"kind": u.kind, "path": str(u.path), "display": u.display, "key": u.key,
              "deps": [str(d) for d in u.deps]} for u in target.units]
    record = {"call": call, "watch": before,
              "target": {"name": target.name, "key": target.key, "with_cuda": target.with_cuda,
                         "pymodule": target.pymodule, "standalone": target.standalone, "units": units,
                         "namespaces": namespaces(target)}}
    _write(_record_path(call), record)
    _RECORDED[target.key] = call


def entry_before_hash(target: Target) -> Optional[List[int]]:
    """The identity of the library entry of a target this process planned and recorded, taken before the load
    hashes its library (None for any other target: there is no record to stamp)."""
    return _identity(cache.library_dir(target.name, target.key)) if target.key in _RECORDED else None


def stamp_verified(target: Target, so: Path, entry_before: Optional[List[int]]) -> None:
    """After a full plan's load found its library's sha256 matching: keep the library's identity in the plan's
    record, as a recalled plan's load does, so the next process need not hash it again."""
    call = _RECORDED.get(target.key)
    if call is not None:
        _stamp(call, so, entry_before)


def _write(path: Path, record: dict) -> None:
    with contextlib.suppress(OSError):
        replace_file.write(path, json.dumps(record))


def namespaces(target: Target) -> List[str]:
    """The namespaces the target's TORCH_LIBRARY blocks define: a recalled plan carries them (no file is read)."""
    return target.namespaces if isinstance(target, Recalled) else defined_namespaces(target)


def _reads_as_planned(target: Target) -> bool:
    """Each unit's text and headers hash as they did when the plan keyed them."""
    return all(sources.digest_tree(cache.source_bytes(u.path).decode(errors="replace").encode(), u.deps, u.roots)
               == u.digest
               for u in target.units)


def _watched(target: Target) -> Set[Path]:
    """Every file the plan read and every directory where a lookup could find another file."""
    outside = keys.toolchain_dirs()
    out: Set[Path] = set()
    for u in target.units:
        search = sources.include_search(u.flags, u.kind == "cu", outside)
        out.update([u.path, *u.deps, *search.quote, *search.angle, *_flag_dirs(u.flags, u.kind == "cu")])
        if search.forced:
            out.add(Path.cwd())  # -include looks in the working directory first
        for f in [u.path, *u.deps]:
            out.add(f.parent)
            out.update(_nested_lookups(f, [f.parent, *search.quote, *search.angle], search.angle))
    out.update(sources.link_inputs(target.ldflags, outside))
    out.update(_library_dirs(target.ldflags))
    # a generated source's dir holds that file alone, and a build marks the dir as used for gc (its mtime)
    generated = Path(os.path.realpath(cache.subdir("src")))  # as the watched paths are: resolved
    return {p for p in out if not sources.under(p, outside) and p.parent != generated}


def _library_dirs(ldflags: Sequence[str]) -> List[Path]:
    """The -L dirs where -l libraries are looked for (one created there changes which is linked)."""
    values = [ldflags[i + 1] if f == "-L" and i + 1 < len(ldflags) else f[2:]
              for i, f in enumerate(ldflags) if f.startswith("-L")]
    return [Path(os.path.abspath(v)) for v in values if v]


def _flag_dirs(flags: Sequence[str], nvcc: bool) -> List[Path]:
    """Include dirs as the flags and environment name them, existing or not (one created later changes
    what the search finds)."""
    own, host = sources._host_tokens(flags) if nvcc else (list(flags), [])
    found = sources._include_flags(own, nvcc) + sources._include_flags(host, False)
    named = [v for what, v in found if what != "forced"] + [d for v in _ENV for d in sources._env_dirs(v)]
    return [Path(os.path.abspath(os.path.expanduser(v))) for v in named]


def _nested_lookups(path: Path, quote_bases: Iterable[Path], angle_bases: Iterable[Path]) -> List[Path]:
    """For ``#include "a/b.h"``, the directories ``<base>/a`` the search looks into: a file created there
    changes their identity, not the base's."""
    out = []
    for kind, name in sources.every_include(path.read_text(errors="replace")):
        if "/" in name:
            out += [(b / name).parent for b in (quote_bases if kind == '"' else angle_bases)]
    return out
