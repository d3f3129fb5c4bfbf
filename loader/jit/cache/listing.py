"""What the cache holds: its libraries (``entries``), each row's entries and usage, and ``info``'s sizes by folder,
kind and row, for ``kernelkit cache list`` and ``info``."""
from __future__ import annotations

from typing import Dict, List

from .. import store
from .collect import max_bytes
from .files import du, last_used, listing, number, plain_name
from .libraries import read_manifest
from .root import cache_dir, subdir
from .table import KIND_DIRS, ROWS, row_entries


def entries() -> List[dict]:
    """Every library entry, described from its manifest (from its directory's name where the manifest is
    malformed)."""
    out = []
    for entry in sorted(subdir("lib").iterdir()):
        m = read_manifest(entry) or {}
        so = entry / m["so"] if plain_name(m.get("so")) else None
        try:
            size = so.stat().st_size if so is not None and so.is_file() else 0
        except OSError:
            size = 0
        name, key = m.get("name"), m.get("key")
        dir_name, _, dir_key = entry.name.rpartition("-")
        out.append({"entry": entry.name, "name": name if isinstance(name, str) else dir_name or "?",
                    "key": key[:16] if isinstance(key, str) else dir_key, "size": size,
                    "created": number(m.get("created"), 0.0),
                    "last_used": last_used(entry, entry / "manifest.json"),
                    "build_seconds": number(m.get("build_seconds"), None), "path": str(entry),
                    # a build another rank of a group= job sent (docs/distributed.md: what that trusts)
                    "received_from_rank": m.get("received_from_rank") if isinstance(m.get("received_from_rank"), int) else None,
                    # a build fetched from a remote cache (docs/remote-cache.md): the store's URL, as shown
                    "fetched_from": m.get("fetched_from") if isinstance(m.get("fetched_from"), str) else None})
    return out


def store_entries(name: str) -> List[dict]:
    """The entries of the store ``name`` (a row of ``store.STORES``, or "unclaimed"): where each lies under the
    cache root, its bytes and its last use."""
    row = store.UNCLAIMED if name == store.UNCLAIMED.name else store.row(name)
    root = cache_dir()
    return [{"entry": e.path.relative_to(root).as_posix(), "bytes": e.size(), "last_used": max(e.used(), 0.0)}
            for e in row_entries(row)]


def store_usage() -> List[Dict[str, object]]:
    """Each row of the store table, and what lies in no row's place: its entries' count and bytes, and the rules
    it is kept by."""
    out = []
    for row in ROWS:
        found = row_entries(row)
        out.append({"name": row.name, "folder": row.folder, "entries": len(found),
                    "bytes": sum(e.size() for e in found), "kind": row.kind, "gc": row.gc, "verify": row.verify,
                    "recipes": list(row.recipes), "schema": row.schema})
    return out


def info() -> Dict[str, object]:
    """Counts, total bytes, bytes per subdirectory (lib, obj, pch, src, tmp, ...), per kind (``KIND_DIRS``,
    largest first, the rest as "other": build dirs, locks, tuning winners) and per store (``store_usage``), and
    the size cap: where the space went."""
    root = cache_dir()
    per_dir = {p.name: du(p) for p in listing(root) if p.is_dir()}
    total = du(root)
    stores = store_usage()
    kinds = dict.fromkeys(KIND_DIRS, 0)
    for s in stores:
        if s["kind"] in kinds:
            kinds[s["kind"]] += s["bytes"]
    kinds["other"] = total - sum(kinds.values())
    count = {s["name"]: s["entries"] for s in stores}
    return {"path": str(root), "libraries": count["libraries"], "objects": count["objects"], "pch": count["pch"],
            "bytes": total, "subdirs": per_dir, "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "stores": stores, "max_bytes": max_bytes()}
