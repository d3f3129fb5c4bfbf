"""Precompiled headers in ``pch/<key>/``: the header, its ``pch.json`` (size and sha256) and the ``building`` claim
its detached builder holds while it works."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Callable, Dict, Optional

from ...errors import CacheSecurityError
from .files import hash_problem, read_json
from .locks import try_flock
from .root import check_safe

log = logging.getLogger("kernelkit")

PCH_META = "pch.json"
PCH_CLAIM = "building"
_PCH_VERIFIED: Dict[tuple, bool] = {}  # (path, inode, size, mtime) -> hashed and matched, in this process


def pch_problem(root: Path) -> Optional[str]:
    """Why the precompiled header in ``root`` cannot be used (None if it matches its recorded sha256)."""
    meta = read_json(root / PCH_META)
    if meta is None or not isinstance(meta.get("file"), str) or ".." in Path(meta["file"]).parts:
        return "no record of a finished build (pch.json)"
    gch = root / meta["file"]
    try:
        check_safe(gch)
        st = os.stat(gch)
    except CacheSecurityError as e:
        return f"unsafe: {e}"
    except OSError:
        return f"{meta['file']} is missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{meta['file']} is not a regular file"
    if st.st_size != meta.get("size"):
        return f"{meta['file']} has {st.st_size} bytes, {meta.get('size')} were recorded (truncated?)"
    seen = (str(gch), st.st_ino, st.st_size, st.st_mtime_ns)
    if seen not in _PCH_VERIFIED:  # hashing ~0.5 GB costs ~1 s: once per process per file
        problem = hash_problem(gch, meta.get("sha256"))
        if problem:
            return problem
        _PCH_VERIFIED[seen] = True
    return None


def pch_ready(root: Path) -> bool:
    """Whether ``root`` holds a verified precompiled header; a corrupt one is dropped (unless its builder
    is at work) so that the caller starts a new build."""
    if not (root / PCH_META).exists():
        return False
    problem = pch_problem(root)
    if problem is None:
        with contextlib.suppress(OSError):
            os.utime(root / PCH_META)  # last use, for gc
        return True
    fd = try_flock(root / PCH_CLAIM)
    if fd is not None:
        try:
            if pch_problem(root) is not None:
                log.warning("precompiled header in %s is unusable (%s); dropping it", root, problem)
                drop_pch(root)
        finally:
            os.close(fd)
    return False


def drop_pch(root: Path) -> None:
    """Remove a precompiled header, its record and builders' partial files; the caller holds the claim."""
    with contextlib.suppress(OSError):
        (root / PCH_META).unlink()
    for p in root.rglob("*.gch*"):
        with contextlib.suppress(OSError):
            p.unlink()


def remove_pch_if(root: Path, keep: Callable[[], bool]) -> bool:
    fd = try_flock(root / PCH_CLAIM)
    if fd is None:  # its builder is at work
        return False
    try:
        if keep():
            return False
        shutil.rmtree(root, ignore_errors=True)
        return True
    finally:
        os.close(fd)
