"""``verify``: each row's entries checked as the store table says (libraries, objects and precompiled headers against
their recorded sha256, generated sources against the hash their place names, records for being JSON objects),
the corrupt ones removed under their locks on request."""
from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from .. import store
from .files import read_json, read_regular, unsafe_is_a_problem
from .generated import discard_source, generated_source_key
from .libraries import library_status
from .locks import try_flock
from .objects import object_path, object_problem
from .pch import PCH_CLAIM, pch_problem
from .table import named, row_entries


def _object_status(key: str) -> Optional[str]:
    obj = object_path(key)
    if not os.path.lexists(obj):
        return "metadata without its object"
    if not obj.with_suffix(".json").exists():
        return "object without its metadata"
    return unsafe_is_a_problem(lambda: object_problem(key))


def _pch_status(root: Path) -> Optional[str]:
    fd = try_flock(root / PCH_CLAIM)
    if fd is None:
        return None  # being built: its builder writes the record last
    try:
        return pch_problem(root)
    finally:
        os.close(fd)


def _source_status(path: Path) -> Optional[str]:
    """A generated source (load_inline's text, a binding TU, a split's host and device TUs) lives under the hash
    of its text and name: anything else there is damage, which the build would refuse as edited."""
    try:
        data = read_regular(path)
    except OSError as e:
        return f"unreadable generated source ({e.strerror or e})"
    if generated_source_key(data, path.name) != path.parent.name:
        return "generated source does not hold the text its name hashes"
    return None


def _remove_source_if(path: Path, keep: Callable[[], bool]) -> bool:
    """Sources take no lock (every writer writes the same text, atomically): removed unless rewritten meanwhile."""
    if keep():
        return False
    discard_source(path)
    return not path.exists()


def _source_paths(row: store.Store) -> List[Path]:
    out = []
    for d in named(row):
        with contextlib.suppress(OSError):  # removed by a gc or clear meanwhile, or not a dir
            out += [f for f in d.iterdir() if not f.name.startswith(".")]  # .name.XXXX.tmp: a write in progress
    return sorted(out)


def _library_checks(row: store.Store) -> Iterator[tuple]:
    for e in row_entries(row):
        status = functools.partial(library_status, e.path)
        yield "library", e.path, status, status, e.remove_if


def _object_checks(row: store.Store) -> Iterator[tuple]:
    for e in row_entries(row):
        status = functools.partial(_object_status, e.path.stem)
        yield "object", e.path, status, status, e.remove_if


def _pch_checks(row: store.Store) -> Iterator[tuple]:
    for e in row_entries(row):
        status_locked = functools.partial(pch_problem, e.path)  # the claim held: what its builder left
        yield "pch", e.path, functools.partial(_pch_status, e.path), status_locked, e.remove_if


def _source_checks(row: store.Store) -> Iterator[tuple]:
    for path in _source_paths(row):
        status = functools.partial(_source_status, path)
        yield "source", path, status, status, functools.partial(_remove_source_if, path)


def _record_status(path: Path) -> Optional[str]:
    return None if read_json(path) is not None else "not a JSON object (damaged, or not a regular file)"


def _record_checks(row: store.Store) -> Iterator[tuple]:
    for e in row_entries(row):
        status = functools.partial(_record_status, e.path)
        yield row.name, e.path, status, status, e.remove_if


#: how verify checks a row's entries, by its verify check
_CHECKERS = {store.SO_SHA256: _library_checks, store.OBJECT_SHA256: _object_checks, store.PCH_SHA256: _pch_checks,
             store.TEXT_HASH: _source_checks, store.JSON: _record_checks, store.NOTHING: lambda _row: iter(())}


def _checks() -> Iterator[tuple]:
    """(kind, path, status(), status once its lock is held, remove_if(keep)) for every entry of every row."""
    for row in store.STORES:
        yield from _CHECKERS[row.verify](row)


def verify(fix: bool = False) -> List[Dict[str, object]]:
    """Check each row's entries as the store table says (``store.STORES``): libraries, objects and precompiled
    headers against their recorded sha256 (and libraries' manifests for sense and safety), generated sources
    against the hash their place names, records for being JSON objects. One dict per entry: kind (a record's
    store), entry, status ('ok' or 'corrupt'), reason, removed. ``fix``: remove the corrupt ones (under their
    locks; an entry in use is left and reported)."""
    found = []
    for kind, path, status, status_locked, remove_if in _checks():
        problem = status()
        gone = not os.path.lexists(path) and not (kind == "object" and os.path.lexists(path.with_suffix(".json")))
        if problem is not None and gone:
            continue  # removed by another process while we looked: nothing to report
        removed = bool(fix and problem and remove_if(lambda status_locked=status_locked: status_locked() is None))
        found.append({"kind": kind, "entry": f"{path.parent.name}/{path.name}",
                      "status": "ok" if problem is None else "corrupt", "reason": problem or "",
                      "removed": removed})
    return found
