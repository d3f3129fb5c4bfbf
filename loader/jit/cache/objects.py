"""Compiled objects in ``obj/`` (translation units, NVRTC cubins, scanned outlines): stored with their key and sha256,
verified before use; and the ``shapes/`` records that let a text of the same host shape reuse one."""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

from ..sources import sha256_file
from .files import (
    hash_problem,
    intact,
    plain_name,
    publish_file,
    publish_small,
    read_json,
    read_regular,
    remove_path,
    unsafe_is_a_problem,
)
from .locks import remove_under_lock
from .root import cache_dir, check_safe, subdir, writing


def object_path(key: str) -> Path:
    return subdir("obj") / f"{key}.o"


def object_problem(key: str) -> Optional[str]:
    """Why the object for ``key`` cannot be used (None if it is intact). Raises CacheSecurityError if it
    is not ours or is writable by others."""
    obj = object_path(key)
    if not obj.is_file() or obj.is_symlink():
        return "not a regular file" if os.path.lexists(obj) else "missing"
    check_safe(obj)
    meta = read_json(obj.with_suffix(".json")) or {}
    recorded = meta.get("sha256")
    if not isinstance(recorded, str):
        return "its metadata is missing, unreadable or records no sha256"
    if meta.get("key") != key:  # an object and its metadata copied or renamed over another key's
        return ("its metadata records another key" if "key" in meta else
                "its metadata records no key (written before keys were recorded: no current key uses it)")
    return hash_problem(obj, recorded)


def cached_object(key: str, held: bool = False) -> Optional[Path]:
    """The object for ``key`` if present and intact (its sha256 matches the one recorded at build). A
    corrupt one is removed under its lock (``held``: the caller holds it already) and None returned."""
    obj = object_path(key)
    meta = obj.with_suffix(".json")
    if not os.path.lexists(obj) or (obj.is_file() and not meta.exists()):
        return None  # not built, or being published (the object is renamed into place before its meta)

    def remove_corrupt() -> bool:
        return remove_object_if(key, lambda: unsafe_is_a_problem(lambda: object_problem(key)) is None, held)

    if intact(obj, lambda: (object_problem(key), obj), f"cached object {obj.name}", remove_corrupt) is None:
        return None
    with contextlib.suppress(OSError):
        os.utime(meta)  # last use, for gc
    return obj


def remove_object_if(key: str, keep: Callable[[], bool], held: bool = False) -> bool:
    def remove() -> None:
        remove_path(object_path(key))
        with contextlib.suppress(OSError):
            object_path(key).with_suffix(".json").unlink()

    return remove_under_lock(key, keep, remove, held)


def object_info(key: str) -> dict:
    """What was recorded with the object for ``key`` when it was stored ({} if nothing readable)."""
    return read_json(object_path(key).with_suffix(".json")) or {}


def store_object(key: str, built: Path, info: dict) -> Path:
    final = object_path(key)
    meta_tmp = built.with_suffix(".json")
    with writing(meta_tmp):
        meta_tmp.write_text(json.dumps({**info, "key": key, "sha256": sha256_file(built), "created": time.time()}))
        if os.path.lexists(final) and not final.is_file():
            remove_path(final)  # a directory where the object belongs (corrupt); we hold its lock
        publish_file(built, final)  # object first: a meta without its object is ignored
        publish_file(meta_tmp, final.with_suffix(".json"))
    return final


def remember_shape(shape: str, key: str) -> None:
    """Record that ``key``'s object was compiled from a text of host shape ``shape`` (``keys.host_shape_key``):
    a later text of that shape reuses its host side. Best effort: a cache that cannot be written keeps none."""
    publish_small(subdir("shapes") / shape, key)


def shaped_object(shape: str) -> Optional[Path]:
    """An intact object compiled from a text of host shape ``shape`` (its metadata says so), or None."""
    try:
        key = read_regular(cache_dir() / "shapes" / shape).decode("ascii", "replace").strip()
    except OSError:
        return None
    if not plain_name(key) or key.startswith(".") or not os.path.lexists(object_path(key)):
        return None
    obj = cached_object(key)
    meta = read_json(object_path(key).with_suffix(".json")) or {}
    return obj if obj is not None and meta.get("shape") == shape else None
