"""The store table: every file kernelkit writes under ``cache.cache_dir()`` belongs to one row of ``STORES``.

A row says where its entries live (a folder under the cache root, and the names an entry may have there), which
key recipe names them (a function, mostly in ``keys``), the version of their format, when ``cache.gc`` and
``cache.clear`` remove them, what ``cache.verify`` checks, and what whoever removes one holds so that no live
build loses it. ``cache.gc``, ``clear``, ``verify``, ``info`` and ``kernelkit cache list``/``info`` go through
the table in its order; ``cache.subdir`` and the record functions (``cache.record_path``, ``read_record``,
``write_record``) refuse a folder or a store that is not a row. What lies under the root outside every row
(a file an older kernelkit wrote elsewhere) is ``UNCLAIMED``: collected by age like a record.

This module imports nothing of kernelkit: ``cache`` and ``keys`` both read it.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import PurePosixPath
from typing import Dict, Optional, Tuple

# gc rules: when gc (and clear) remove an entry
AGED = "unused for the max age (clear: at once)"
AGED_SOURCES = "unused for the max age and an hour (clear: after an hour)"  # a live build may be about to use it
STALE = "an hour after its last change"  # a private build dir: its build died
IDLE = "idle a day and not held (clear: when not held)"
WITH_OBJECT = "when the object it names is gone"
KEPT = "never (clear: at once)"  # autotuning winners cost minutes of timing to find again
NEVER = "never"

# verify checks: what ``cache verify`` makes sure of
SO_SHA256 = "the .so matches the sha256 in its manifest"
OBJECT_SHA256 = "the object matches the sha256 and key in its metadata"
PCH_SHA256 = "the header matches the size and sha256 in pch.json"
TEXT_HASH = "the text hashes to its folder's name"
JSON = "it is a JSON object"
NOTHING = "nothing"

# what whoever removes an entry holds
LIBRARY_LOCK = "the library's lock (cache.library_lock)"
KEY_LOCK = "the lock of its key"
CLAIM = "its builder's claim (flock on the entry's building file)"
HELD = "itself: a lock file is removed while ours"
NO_LOCK = "nothing: written whole, renamed away whole"

#: what ``cache.info`` sizes and the size cap evicts, by kind (other rows count as "other")
KINDS = ("libraries", "objects", "precompiled headers", "sources", "records")


@dataclasses.dataclass(frozen=True)
class Store:
    """One row: a kind of file kernelkit keeps under the cache root."""

    name: str  # how gc's counts, verify and ``kernelkit cache list --store`` name it
    folder: str  # under the cache root ("." for the root itself)
    patterns: Tuple[str, ...]  # the names an entry may have in ``folder`` (fnmatch)
    recipes: Tuple[str, ...]  # the functions that derive the entries' names ("module.function" in kernelkit.jit)
    schema: int  # the entries' format version: a record's key folds it in; 0: keys.SCHEMA alone versions them
    gc: str  # one of the gc rules above
    verify: str  # one of the verify checks above
    lock: str = NO_LOCK  # what whoever removes an entry holds
    kind: str = "other"  # one of KINDS, or "other"


_RECORD = dict(patterns=("*.json",), gc=AGED, verify=JSON, kind="records")
_OBJECT_KEYS = ("keys.unit_key", "keys.build_variant_key", "keys.program_key", "keys.scan_key")

#: in the order gc and clear go through them: lock files last, since removing the others takes their locks
STORES: Tuple[Store, ...] = (
    Store("libraries", "lib", ("*",), ("keys.target_key",), 0, AGED, SO_SHA256, LIBRARY_LOCK, "libraries"),
    Store("objects", "obj", ("*.o", "*.json"), _OBJECT_KEYS, 0, AGED, OBJECT_SHA256, KEY_LOCK, "objects"),
    Store("pch", "pch", ("*",), ("keys.pch_key",), 0, AGED, PCH_SHA256, CLAIM, "precompiled headers"),
    Store("sources", "src", ("*",), ("cache.generated_source_key",), 0, AGED_SOURCES, TEXT_HASH, kind="sources"),
    Store("shapes", "shapes", ("*",), ("keys.host_shape_key",), 0, WITH_OBJECT, NOTHING),
    Store("tune", "tune", ("*.json",), ("keys.tune_key",), 0, KEPT, JSON),
    Store("plans", "plans", recipes=("keys.plan_key",), schema=2, **_RECORD),
    Store("frames", "records/frames", recipes=("keys.build_variant_key",), schema=0, **_RECORD),
    Store("torch-names", "records/torch-names", recipes=("keys.build_variant_key",), schema=0, **_RECORD),
    Store("torch-headers", "records/torch-headers", recipes=("keys.torch_headers_key",), schema=1, **_RECORD),
    Store("toolchain", "records/toolchain", recipes=("toolchain.facts_key",), schema=8, **_RECORD),
    Store("nvrtc", "records/nvrtc", recipes=("keys.nvrtc_facts_key",), schema=1, **_RECORD),
    Store("launcher", "records/launcher", recipes=("keys.launcher_record_key",), schema=1, **_RECORD),
    Store("torch-signatures", "records/torch-signatures", recipes=("keys.torch_signatures_key",), schema=1,
          **_RECORD),
    Store("bandwidth", "records/bandwidth", recipes=("keys.bandwidth_key",), schema=1, **_RECORD),
    Store("reports", "records/reports", recipes=("keys.report_key",), schema=1, **_RECORD),
    # each compiled TU's command, by its object's key (kernelkit ide: compile_commands.json for editors)
    Store("commands", "records/commands", recipes=_OBJECT_KEYS, schema=0, **_RECORD),
    Store("tmp", "tmp", ("*",), (), 0, STALE, NOTHING),
    Store("locks", "locks", ("*.lock",), (), 0, IDLE, NOTHING, HELD),  # named by the entry each guards
    Store("stamps", ".", ("last-gc", "last-size-check"), (), 0, NEVER, NOTHING),  # when gc last ran
)

#: what lies under the cache root in no row's place: collected by age, and evicted by the size cap with the records
#: (it is mostly records an older kernelkit wrote elsewhere)
UNCLAIMED = Store("unclaimed", ".", (), (), 0, AGED, NOTHING, kind="records")

_BY_NAME: Dict[str, Store] = {s.name: s for s in STORES}
_BY_FOLDER: Dict[str, Tuple[Store, ...]] = {folder: tuple(s for s in STORES if s.folder == folder)
                                            for folder in dict.fromkeys(s.folder for s in STORES)}
FOLDERS = frozenset(s.folder for s in STORES if s.folder != ".")


def row(name: str) -> Store:
    """The row called ``name``; ValueError if the table has none (a writer must add its row first)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"{name!r} is not a store of kernelkit's cache: its rows are {', '.join(_BY_NAME)} "
                         "(kernelkit.jit.store.STORES)") from None


def is_entry(store: Store, name: str) -> bool:
    """Whether ``name`` in the row's folder is one of its entries (a hidden name is a write in progress)."""
    return not name.startswith(".") and any(fnmatch.fnmatchcase(name, p) for p in store.patterns)


def _belongs(store: Store, name: str) -> bool:
    """An entry, or a write of one in progress (``replace_file``'s ``.<name>.XXXX.tmp``)."""
    return is_entry(store, name) or (name.startswith(".") and name.endswith(".tmp"))


def owner(rel: str) -> Optional[Store]:
    """The row the path ``rel`` (relative to the cache root, any depth) belongs to; None if none claims it."""
    parts = PurePosixPath(rel).parts
    for depth in range(len(parts) - 1, -1, -1):  # the deepest folder first: records/frames before the root
        for store in _BY_FOLDER.get("/".join(parts[:depth]) or ".", ()):
            if _belongs(store, parts[depth]):
                return store
    return None


def holds_rows(rel: str) -> bool:
    """Whether the folder ``rel`` is a row's folder or holds one (records/)."""
    return rel in FOLDERS or any(f.startswith(rel + "/") for f in FOLDERS)
