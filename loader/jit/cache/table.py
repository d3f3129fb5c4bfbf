"""The store table's entries (``store.STORES``): how each row's entries are found, dated, sized and removed, by what
whoever removes one holds. gc, clear, the size cap, verify and the listings go through ``row_entries``."""
from __future__ import annotations

import contextlib
import functools
import math
import os
from pathlib import Path
from typing import Callable, List, NamedTuple

from .. import store
from .files import last_used, listing, plain_name, read_regular, remove_path, size_of
from .libraries import remove_library_if
from .locks import try_locked
from .objects import object_path, remove_object_if
from .pch import PCH_META, remove_pch_if
from .root import cache_dir

#: what ``info`` sizes and the cap evicts, by kind: the folders of its rows
KIND_DIRS = {kind: tuple(row.folder for row in store.STORES if row.kind == kind) for kind in store.KINDS}


class Entry(NamedTuple):
    path: Path
    used: Callable[[], float]  # when it was last used: what gc's age and the size cap's order go by
    size: Callable[[], int]
    remove_if: Callable[[Callable[[], bool]], bool]  # remove it unless keep(), asked once it is ours to remove


def named(row: store.Store) -> List[Path]:
    return [p for p in listing(cache_dir() / row.folder) if store.is_entry(row, p.name)]


def _unclaimed(folder: Path) -> List[Path]:
    """What lies in ``folder``, and in the row folders under it, in no row's place."""
    root = cache_dir()
    found = []
    for p in listing(folder):
        rel = p.relative_to(root).as_posix()
        if store.holds_rows(rel) and p.is_dir() and not p.is_symlink():
            found += _unclaimed(p)
        elif store.owner(rel) is None:
            found.append(p)
    return found


def _remove_if(path: Path, keep: Callable[[], bool]) -> bool:
    """No lock: nothing builds into a source, a record or a build dir in place."""
    if keep():
        return False
    remove_path(path)
    return True


def _remove_lock_if(path: Path, keep: Callable[[], bool]) -> bool:
    """Removed while held by us: filelock re-opens the path when the file it waited on was unlinked, so no waiter
    ends up holding a lock nobody else sees."""
    with try_locked(path.stem) as ours:
        if ours and not keep():
            with contextlib.suppress(OSError):
                path.unlink()
                return True
    return False


def _shape_used(record: Path) -> float:
    """A shape record is used while the object it names is there, and never once it is gone."""
    try:
        key = read_regular(record).decode("ascii", "replace").strip()
    except OSError:
        return -math.inf
    return last_used(record, record) if plain_name(key) and object_path(key).is_file() else -math.inf


def _library_entries(row: store.Store) -> List[Entry]:
    return [Entry(e, functools.partial(last_used, e, e / "manifest.json"), functools.partial(size_of, e),
                   functools.partial(remove_library_if, e)) for e in named(row)]


def _object_entries(row: store.Store) -> List[Entry]:
    """One per key: its object, or its metadata alone."""
    out = []
    for key in sorted({p.stem for p in named(row)}):
        obj, meta = object_path(key), object_path(key).with_suffix(".json")
        out.append(Entry(obj, functools.partial(last_used, obj, meta), functools.partial(size_of, obj, meta),
                          functools.partial(remove_object_if, key)))
    return out


def _pch_entries(row: store.Store) -> List[Entry]:
    return [Entry(r, functools.partial(last_used, r, r / PCH_META), functools.partial(size_of, r),
                   functools.partial(remove_pch_if, r)) for r in named(row) if r.is_dir()]


def _lock_entries(row: store.Store) -> List[Entry]:
    return [Entry(p, functools.partial(last_used, p, p), functools.partial(size_of, p),
                   functools.partial(_remove_lock_if, p)) for p in named(row)]


def _newest(path: Path) -> float:
    """When a file in ``path`` last changed (``path``'s own mtime if it holds none): a folder in no row's place is
    as old as what it holds."""
    times = [last_used(path, path)] if not path.is_dir() or path.is_symlink() else []
    for parent, _, files in os.walk(path):
        times += [last_used(Path(parent, f), Path(parent, f)) for f in files]
    return max(times, default=last_used(path, path))


def _plain_entries(row: store.Store) -> List[Entry]:
    if row is store.UNCLAIMED:
        paths, used = _unclaimed(cache_dir()), _newest
    else:
        paths, used = named(row), _shape_used if row.gc == store.WITH_OBJECT else lambda p: last_used(p, p)
    return [Entry(p, functools.partial(used, p), functools.partial(size_of, p), functools.partial(_remove_if, p))
            for p in paths]


#: how a row's entries are found and removed, by what whoever removes one holds
_LISTERS = {store.LIBRARY_LOCK: _library_entries, store.KEY_LOCK: _object_entries, store.CLAIM: _pch_entries,
            store.HELD: _lock_entries, store.NO_LOCK: _plain_entries}
ROWS = (*store.STORES, store.UNCLAIMED)


def row_entries(row: store.Store) -> List[Entry]:
    return _LISTERS[row.lock](row)
