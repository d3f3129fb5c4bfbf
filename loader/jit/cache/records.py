"""Small JSON records under the store table's record folders (``record_path``), autotuning winners among them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from .. import store
from .files import number, plain_name, publish_small, read_json
from .root import subdir
from .table import row_entries


def record_path(name: str, key: str) -> Path:
    """Where the JSON record ``key`` of the store ``name`` lives (its folder made if it can be). ValueError for a
    store that is no row of JSON records (``store.STORES``) or a key that is no plain file name."""
    row = store.row(name)
    if row.verify != store.JSON:
        raise ValueError(f"the store {name!r} holds no JSON records")
    if not plain_name(key) or key.startswith("."):
        raise ValueError(f"{key!r} is not a record key (a plain file name)")
    return subdir(row.folder) / f"{key}.json"


def read_record(name: str, key: str) -> dict:
    """The JSON record ``key`` of the store ``name`` (what a build or a warm start learned, e.g. a split's proofs),
    or {} if there is none or it is unreadable."""
    return read_json(record_path(name, key)) or {}


def write_record(name: str, key: str, record: dict) -> None:
    """Store a small record (readers see the old or the new one); a cache that cannot be written keeps none."""
    publish_small(record_path(name, key), json.dumps(record))


def tune_record(key: str) -> Optional[dict]:
    """The autotuning record stored under ``key`` (``keys.tune_key``), or None."""
    record = read_record("tune", key)
    return record if isinstance(record.get("best"), dict) else None


def tune_records() -> List[dict]:
    """Every stored autotuning winner, newest first."""
    found = [r for r in (read_json(e.path) for e in row_entries(store.row("tune"))) if r and "best" in r]
    return sorted(found, key=lambda r: -number(r.get("created"), 0.0))


def store_tune_record(key: str, record: dict) -> None:
    """Store an autotuning winner; a cache that cannot be written keeps none (the next process tunes again)."""
    write_record("tune", key, record)
