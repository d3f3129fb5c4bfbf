"""Linked libraries in ``lib/<name>-<key16>/``: a .so and its manifest (sha256), published by renaming a complete
build dir into place, verified (safety and sha256) before every load."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional, Tuple

from ..sources import sha256_file
from .files import hash_problem, intact, plain_name, private_tmpdir, read_json, remove_path, unsafe_is_a_problem
from .locks import locked, remove_under_lock
from .root import check_safe, subdir, writing


def _entry_name(name: str, key: str) -> str:
    return f"{name}-{key[:16]}"


def library_dir(name: str, key: str) -> Path:
    return subdir("lib") / _entry_name(name, key)


def library_lock(name: str, key: str) -> str:
    """The lock id of a library entry: derived from its directory name, so whoever finds the directory
    (gc, clear, verify) takes the same lock as whoever builds it, even when its manifest is unreadable."""
    return f"lib-{_entry_name(name, key)}"  # what remove_library_if takes for the entry's directory


def read_manifest(entry: Path) -> Optional[dict]:
    return read_json(entry / "manifest.json")


def write_manifest(entry: Path, manifest: dict) -> None:
    path = entry / "manifest.json"
    with writing(path):
        path.write_text(json.dumps(manifest, indent=1))
        os.chmod(path, 0o600)


def inspect_library(entry: Path, key: Optional[str] = None) -> Tuple[Optional[str], Optional[Path]]:
    """(why the library entry cannot be loaded, None if it is complete and intact; its .so). ``key``: the
    full key it must have (else any key that matches the entry's name). Raises CacheSecurityError for an
    entry or library that is a link, not ours, or writable by others."""
    if entry.is_symlink():
        check_safe(entry)
    if not entry.is_dir():
        return "a file where an entry directory should be", None
    manifest = read_manifest(entry)
    if manifest is None:
        return "manifest.json is missing, unreadable or not a JSON object", None
    name, mkey, so_name = manifest.get("name"), manifest.get("key"), manifest.get("so")
    if not (isinstance(name, str) and isinstance(mkey, str)) or entry.name != _entry_name(name, mkey):
        return "its manifest names another library or key", None
    if key is not None and mkey != key:
        return "its manifest records another key", None
    if not plain_name(so_name):
        return f"its manifest names {so_name!r} as the library, not a file name inside the entry", None
    so = entry / so_name
    if not os.path.lexists(so):
        return f"{so_name} is missing", None
    check_safe(entry)
    check_safe(so)
    problem = hash_problem(so, manifest.get("sha256"))
    return (problem, None) if problem else (None, so)


def library_status(entry: Path, key: Optional[str] = None) -> Optional[str]:
    return unsafe_is_a_problem(lambda: inspect_library(entry, key)[0])


def remove_library_if(entry: Path, keep: Callable[[], bool], held: bool = False) -> bool:
    return remove_under_lock(f"lib-{entry.name}", keep, lambda: remove_path(entry), held)


def remove_library(name: str, key: str) -> bool:
    """Remove an entry that can never load (a library naming an undefined symbol), under its lock."""
    return remove_library_if(library_dir(name, key), lambda: False)


def verified_library(name: str, key: str, held: bool = False) -> Optional[Path]:
    """Path of the cached .so for (name, key) if it is complete, ours, not writable by others, and its
    sha256 matches the manifest. A corrupt entry is removed under its lock (``held``: the caller holds it
    already) and rebuilt by the caller."""
    entry = library_dir(name, key)
    if not os.path.lexists(entry):
        return None
    so = intact(entry, lambda: inspect_library(entry, key), f"cache entry {entry.name}",
                 lambda: remove_library_if(entry, lambda: library_status(entry, key) is None, held))
    if so is None:
        return None
    with contextlib.suppress(OSError):
        os.utime(entry / "manifest.json")  # last use, for gc
    return so


def publish_library(tmpdir: Path, name: str, key: str) -> Path:
    """Move a complete build dir into place. Losing a race to an identical build is fine."""
    entry = library_dir(name, key)
    try:
        os.rename(tmpdir, entry)
    except OSError:
        if not entry.is_dir():
            raise
        shutil.rmtree(tmpdir, ignore_errors=True)
    return entry


def land_library(target, data: bytes, origin: dict) -> Optional[Path]:
    """The verified .so for ``target`` (a library fetched or received, its bytes ``data`` checked already), landed
    in the entry layout of a local build, under the library's lock; an entry another process published meanwhile
    is used as it is. ``origin``: the manifest's build_seconds, the toolchain fingerprint (the caller's: the
    toolchain imports the cache) and where the bytes came from (fetched_from and signed_by, received_from_rank)."""
    with locked(library_lock(target.name, target.key), target.name):
        so = verified_library(target.name, target.key, held=True)
        if so is not None:
            return so
        tmp = private_tmpdir(f"lib-{target.name}-")
        try:
            out = tmp / target.so_name
            with writing(out):
                out.write_bytes(data)
            write_manifest(tmp, {  # build_seconds keeps its place; origin's other fields follow units
                "name": target.name, "key": target.key, "so": target.so_name, "sha256": sha256_file(out),
                "created": time.time(), "build_seconds": None, "pymodule": target.pymodule,
                "units": [{"file": u.display, "key": u.key} for u in target.units], **origin,
            })
            os.chmod(out, 0o700)
            os.chmod(tmp, 0o700)
            publish_library(tmp, target.name, target.key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return verified_library(target.name, target.key, held=True)
