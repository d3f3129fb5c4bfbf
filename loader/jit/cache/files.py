"""Reading, writing and removing the cache's files safely: regular files only (a FIFO in place of an entry must not
block a reader), each file published whole by a rename, an entry renamed away before it is deleted."""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple, TypeVar

from ... import replace_file
from ...errors import CacheSecurityError, CacheUnwritable
from ..sources import sha256_file
from .root import subdir, writing

log = logging.getLogger("kernelkit")
T = TypeVar("T")


def private_tmpdir(prefix: str) -> Path:
    tmp = subdir("tmp")
    with writing(tmp):
        return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp))


def publish_file(tmp: Path, final: Path) -> None:
    os.chmod(tmp, 0o600 if final.suffix != ".so" else 0o700)
    os.replace(tmp, final)  # atomic on one filesystem: readers see all of it or none


def publish_small(final: Path, text: str) -> None:
    """Write a small record all at once (readers see the old or the new text); best effort."""
    with contextlib.suppress(OSError, CacheUnwritable):
        with writing(final):
            replace_file.write(final, text)


def remove_path(path: Path) -> None:
    """Rename first, so a reader never sees a half-deleted entry, then delete."""
    trash = subdir("tmp") / f"trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    except OSError:
        trash = path
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            trash.unlink()


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file; OSError for anything else (a link, a FIFO, a device), without blocking
    on it: a FIFO in place of a cache file must not hang a load or ``cache verify``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return f.read()


def read_json(path: Path) -> Optional[dict]:
    """A JSON object from ``path``; None if it is missing, unreadable, not a regular file, not JSON or not
    an object."""
    try:
        value = json.loads(read_regular(path))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def number(value: object, default):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def hash_problem(path: Path, recorded: object) -> Optional[str]:
    """Why ``path`` does not match the sha256 recorded for it (None if it does). Raises FileNotFoundError
    when it was removed meanwhile (by another process's gc or clear: gone, not corrupt)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return f"{path.name} is not a regular file"
        actual = sha256_file(path)
    except FileNotFoundError:
        raise
    except OSError as e:  # replaced by a FIFO or a device just now, or unreadable
        return f"{path.name} cannot be read ({e.strerror or e})"
    return None if actual == recorded else f"{path.name} does not match its recorded sha256"


def plain_name(value: object) -> bool:
    """A file name inside its directory: no path, no '..' (a manifest must not point elsewhere)."""
    return isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\0" not in value


def unsafe_is_a_problem(check: Callable[[], Optional[str]]) -> Optional[str]:
    try:
        return check()
    except CacheSecurityError as e:
        return f"unsafe: {e}"
    except FileNotFoundError:  # removed by another process's gc or clear while it was being checked
        return "removed while it was being checked"


def intact(path: Path, inspect: Callable[[], Tuple[Optional[str], T]], what: str,
            remove_corrupt: Callable[[], object]) -> Optional[T]:
    """What ``inspect()`` returns with no problem found for the entry at ``path``; else None, after
    logging and removing the entry (``remove_corrupt``) unless another process's gc or clear removed it
    while it was being checked (then it is gone, not corrupt)."""
    try:
        problem, value = inspect()
    except FileNotFoundError:
        return None
    if problem is None:
        return value
    if not os.path.lexists(path):
        return None
    log.warning("%s is corrupt (%s); rebuilding it", what, problem)
    remove_corrupt()
    return None


def holds(path: Path, data: bytes) -> bool:
    try:
        return path.is_file() and path.read_bytes() == data
    except OSError:
        return False


def last_used(path: Path, stamp: Path) -> float:
    """When ``stamp`` (touched on every use) was last touched; the entry's own mtime if it has none."""
    for p in (stamp, path):
        try:
            return os.stat(p, follow_symlinks=False).st_mtime
        except OSError:
            continue
    return 0.0


def listing(folder: Path) -> List[Path]:
    """The children of ``folder``, sorted; none if it is missing (or was removed meanwhile)."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def size_of(*paths: Path) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += du(p) if p.is_dir() and not p.is_symlink() else os.lstat(p).st_size
    return total


def du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total
