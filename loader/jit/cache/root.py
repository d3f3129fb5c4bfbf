"""The cache's root: where it is, made private and refused when it is not, and the folders of the store table's
rows under it (``subdir``)."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Dict, Iterator

from ... import settings
from ...errors import CacheSecurityError, CacheUnwritable
from .. import store

LAYOUT = "v1"


def cache_dir() -> Path:
    """KERNELKIT_CACHE_DIR, else the user cache dir (platformdirs), plus the layout version; both
    directories created private (0700 whatever the umask) and refused if not private."""
    root = settings.CACHE_DIR.get()
    if root is None:
        import platformdirs  # only when no cache dir is configured

        root = Path(platformdirs.user_cache_dir("kernelkit", appauthor=False))
    path = root / LAYOUT
    if not path.is_dir():
        if root.is_dir():
            _check_private_root(root)  # never create anything in a directory that is refused
        try:
            with writing(path):
                _make_private_dirs(path)
        except CacheUnwritable as e:  # a read-only image: loads read nothing here, a build says why it can't
            _UNCREATED[path] = e
            return path
    _check_private_root(root)
    check_safe(path)
    return path


_UNCREATED: Dict[Path, CacheUnwritable] = {}


def raise_uncreated(path: Path) -> None:
    """Raise why ``path`` or a folder under it could not be created, for the first one that still is not there;
    forget the ones made since."""
    for d, error in [(d, e) for d, e in _UNCREATED.items() if d.is_relative_to(path)]:
        if not d.is_dir() and (d == path or not subdir(d.relative_to(path).as_posix()).is_dir()):
            raise error
        del _UNCREATED[d]


def _make_private_dirs(path: Path) -> None:
    """mkdir -p, each new directory 0700: mkdir's mode is masked by the umask, chmod's is not."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(p, 0o700)


def _check_private_root(root: Path) -> None:
    """The directory holding the layout dir: whoever can write it can swap the whole cache."""
    st = os.stat(root)  # a symlinked root is fine: what it points to must be private
    if st.st_uid != os.getuid():
        raise CacheSecurityError(f"cache directory {root} is owned by uid {st.st_uid}, not by you (uid "
                                 f"{os.getuid()}): refusing to use it. Point KERNELKIT_CACHE_DIR at a "
                                 "directory of your own.")
    if st.st_mode & 0o022:
        raise CacheSecurityError(
            f"cache directory {root} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"refusing to use it, since anyone could plant code there. Fix with: chmod go-w '{root}', or "
            "point KERNELKIT_CACHE_DIR at a directory of your own (a new one is created private).")


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError from creating or writing ``path`` in the cache into an error that says what to do."""
    try:
        yield
    except TimeoutError:  # an OSError too: filelock.Timeout, another process holds the lock
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CacheUnwritable(
                f"kernelkit cannot write its cache at {path}: no space left on the device (or the disk quota "
                "is used up). Free space with `kernelkit cache gc --max-age-days 7` or `kernelkit cache clear`, "
                "or point KERNELKIT_CACHE_DIR at a disk with room.") from None
        raise CacheUnwritable(
            f"kernelkit cannot write its cache at {path}: {e.strerror or e}. Builds need a writable cache "
            "(loading cached builds only reads it): point KERNELKIT_CACHE_DIR at a directory of your own."
        ) from None


def check_safe(path: Path) -> None:
    """Refuse anything another user owns or that others can write: loading it would run their code."""
    st = os.stat(path, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise CacheSecurityError(f"{path} is a symbolic link; kernelkit does not follow links in its cache")
    if st.st_uid != os.getuid():
        raise CacheSecurityError(
            f"{path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}): refusing to use it. "
            "Point KERNELKIT_CACHE_DIR at a directory of your own.")
    if st.st_mode & 0o022:
        raise CacheSecurityError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): refusing to load "
            f"it. Fix with: chmod go-w '{path}' (or clear the cache entry).")


def subdir(name: str) -> Path:
    """The folder ``name`` of a row of the store table (``store.STORES``), created private if missing.
    ValueError for any other name: nothing is written under the cache outside the table."""
    if name not in store.FOLDERS:
        raise ValueError(f"{name!r} is not the folder of a row of kernelkit's cache (kernelkit.jit.store.STORES): "
                         f"its folders are {', '.join(sorted(store.FOLDERS))}")
    d = cache_dir() / name
    if not d.is_dir():
        try:
            with writing(d):
                _make_private_dirs(d)
        except CacheUnwritable as e:  # read-only: nothing to find in it; a build raises this
            _UNCREATED[d] = e
    return d
