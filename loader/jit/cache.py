"""The on-disk cache: content-addressed objects and libraries, written atomically, verified before use.

Layout under ``cache_dir()`` (mode 0700, as is the directory it lives in)::

    obj/<key>.o, obj/<key>.json   compiled translation units, shared by every library that uses them (the
                                  json records the key and the sha256: a copy over another key's is corrupt)
    lib/<name>-<key16>/           one linked library: the .so and manifest.json (sha256 of the .so)
    pch/<key>/                    a precompiled header (<kernelkit/binding.h>, a split's host preamble), its
                                  pch.json (sha256) and the ``building`` claim its detached builder holds
    locks/<id>.lock               filelock locks (flock: released by the kernel if the holder dies)
    src/<key>/                    sources written for load_inline, and generated TUs and headers
    tmp/                          private build dirs; renamed into place only when complete

Keys are derived in ``keys`` (what invalidates what). Only regular files are read: a FIFO or device in
place of an entry is reported corrupt without being opened for reading (it would block forever).

Whoever removes an entry holds that entry's lock (``library_lock`` / the object's key / the PCH claim), so
gc, clear and corruption handling never remove what another process is building or has just published.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from .. import replace_file, settings
from ..errors import CacheSecurityError, CacheUnwritable, KernelkitError, LockTimeout
from .sources import sha256_bytes, sha256_file

log = logging.getLogger("kernelkit")
T = TypeVar("T")

LAYOUT = "v1"
DEFAULT_MAX_AGE_DAYS = settings.CACHE_MAX_AGE_DAYS.default
STALE_TMP_SECONDS = 3600.0  # private build dirs and fresh sources younger than this may belong to a live build
STALE_LOCK_SECONDS = 86400.0
GC_INTERVAL_SECONDS = 86400.0
CAP_INTERVAL_SECONDS = 300.0  # the size cap walks the cache: after a build, at most this often
CAP_GRACE_SECONDS = 600.0  # entries used this recently may be in a build's or a load's hands: the cap leaves them
#: what ``info`` sizes and the cap evicts, by kind: its directory
KIND_DIRS = {"libraries": "lib", "objects": "obj", "precompiled headers": "pch", "sources": "src", "records": "records"}
PCH_META = "pch.json"
PCH_CLAIM = "building"


# ------------------------------------------------------------------------------------------------ root
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
_PENDING_LOCK = threading.Lock()


def require_writable() -> Path:
    """The cache directory, for a build: raises the reason it or a subdirectory could not be created, if one
    could not, and writes the generated sources a read-only cache left in memory (or raises why it cannot)."""
    path = cache_dir()
    with _PENDING_LOCK:  # builds run in threads (autotune, a card's units): one of them writes what is pending
        for d, error in [(d, e) for d, e in _UNCREATED.items() if d == path or d.parent == path]:
            if not d.is_dir():
                if d == path:
                    raise error
                subdir(d.name)
                if not d.is_dir():
                    raise error
            del _UNCREATED[d]
        for source, data in [(f, b) for f, b in _UNWRITTEN.items() if f.is_relative_to(path)]:
            if not _holds(source, data):
                _write_source(source, data)
            del _UNWRITTEN[source]
    return path


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
    d = cache_dir() / name
    if not d.is_dir():
        try:
            with writing(d):
                d.mkdir(exist_ok=True, mode=0o700)
                os.chmod(d, 0o700)
        except CacheUnwritable as e:  # read-only: nothing to find in it; a build raises this
            _UNCREATED[d] = e
    return d


# ------------------------------------------------------------------------------------------------ locks
def lock_timeout() -> float:
    return settings.LOCK_TIMEOUT.get()


def _filelock(lock_id: str):
    import filelock  # only builds and removals lock; a warm load never imports it

    return filelock.FileLock(str(subdir("locks") / f"{lock_id}.lock"), mode=0o600)


@contextlib.contextmanager
def locked(lock_id: str, what: str, on_wait=None) -> Iterator[None]:
    """Hold the lock ``lock_id``. flock-based, so a holder killed with SIGKILL releases it at once."""
    lock = _filelock(lock_id)
    try:
        with writing(Path(lock.lock_file)):
            lock.acquire(timeout=0)
    except TimeoutError:  # filelock.Timeout
        if on_wait:
            on_wait()
        try:
            lock.acquire(timeout=lock_timeout())
        except TimeoutError:
            raise LockTimeout(
                f"timed out after {lock_timeout():.0f} s waiting for another process building {what} "
                f"(lock {lock.lock_file}); raise KERNELKIT_LOCK_TIMEOUT to wait longer") from None
    try:
        with contextlib.suppress(OSError):
            os.utime(lock.lock_file)  # last use: gc removes lock files unused for a day
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def try_locked(lock_id: str) -> Iterator[bool]:
    """Yield True holding the lock ``lock_id``, or False at once if another holder has it (another
    process, or another part of this one: flock does not nest)."""
    lock = _filelock(lock_id)
    try:
        lock.acquire(timeout=0)
    except TimeoutError:  # filelock.Timeout
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def try_flock(path: Path) -> Optional[int]:
    """An open descriptor holding an exclusive flock on ``path`` (created 0600), or None if someone holds
    it. A raw descriptor, unlike a FileLock, can be handed to a detached process that keeps the claim."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:  # its directory was just removed, or is not ours to write: nothing to claim
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_under_lock(lock_id: str, keep: Callable[[], bool], remove: Callable[[], None],
                       held: bool = False) -> bool:
    """Run ``remove`` holding the lock ``lock_id`` unless ``keep()``, asked once the lock is ours, says the
    entry is fine now (replaced by a good build, or used, meanwhile). ``held``: the caller holds the lock.
    Skipped, returning False, while another holder has it."""
    if held:
        remove()
        return True
    with try_locked(lock_id) as ours:
        if ours and not keep():
            remove()
            return True
    return False


def _remove(path: Path) -> None:
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


def private_tmpdir(prefix: str) -> Path:
    tmp = subdir("tmp")
    with writing(tmp):
        return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp))


def publish_file(tmp: Path, final: Path) -> None:
    os.chmod(tmp, 0o600 if final.suffix != ".so" else 0o700)
    os.replace(tmp, final)  # atomic on one filesystem: readers see all of it or none


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file; OSError for anything else (a link, a FIFO, a device), without blocking
    on it: a FIFO in place of a cache file must not hang a load or ``cache verify``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return f.read()


def _read_json(path: Path) -> Optional[dict]:
    """A JSON object from ``path``; None if it is missing, unreadable, not a regular file, not JSON or not
    an object."""
    try:
        value = json.loads(_read_regular(path))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _hash_problem(path: Path, recorded: object) -> Optional[str]:
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


def _plain_name(value: object) -> bool:
    """A file name inside its directory: no path, no '..' (a manifest must not point elsewhere)."""
    return isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\0" not in value


def _unsafe_is_a_problem(check: Callable[[], Optional[str]]) -> Optional[str]:
    try:
        return check()
    except CacheSecurityError as e:
        return f"unsafe: {e}"
    except FileNotFoundError:  # removed by another process's gc or clear while it was being checked
        return "removed while it was being checked"


def _intact(path: Path, inspect: Callable[[], Tuple[Optional[str], T]], what: str,
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


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.is_file() and path.read_bytes() == data
    except OSError:
        return False


def write_source(text: str, filename: str) -> Path:
    """Generated or inline sources live in the cache under their content hash, written again when the
    file there is not that text (truncated by a full disk, or tampered with). A read-only cache leaves the
    text in memory: planning and loading a cached or prebuilt library need only the path and the text, and a
    build (``require_writable``) writes it or says why it cannot."""
    path = cache_dir() / "src" / sha256_bytes(text.encode(), filename.encode())[:24] / filename
    data = text.encode()
    if not _holds(path, data):
        try:
            _write_source(path, data)
        except CacheUnwritable:
            _UNWRITTEN[path] = data
    return path


_UNWRITTEN: Dict[Path, bytes] = {}


def _write_source(path: Path, data: bytes) -> None:
    d = path.parent
    with writing(d):
        subdir("src")
        d.mkdir(exist_ok=True, mode=0o700)
        replace_file.write(path, data)


def source_bytes(path: Path) -> bytes:
    """A source's bytes, also where ``write_source`` could not write it."""
    held = _UNWRITTEN.get(path)
    return held if held is not None and not path.is_file() else path.read_bytes()


def is_generated_source(path: Path) -> bool:
    """Whether ``path`` is a source kernelkit wrote into ``src/`` (for load_inline and card bindings)."""
    return path.parent.parent == cache_dir() / "src"


def touch_source(path: Path) -> None:
    """Mark a generated source's dir as just used, so gc and clear leave it to a build that reuses it."""
    if is_generated_source(path):
        with contextlib.suppress(OSError):
            os.utime(path.parent)


def discard_source(path: Path) -> None:
    """Remove a damaged generated source; the next load writes it again from the text it was made of."""
    if is_generated_source(path):
        with contextlib.suppress(OSError):
            path.unlink()


# --------------------------------------------------------------------------------------------- objects
def object_path(key: str) -> Path:
    return subdir("obj") / f"{key}.o"


def _object_problem(key: str) -> Optional[str]:
    """Why the object for ``key`` cannot be used (None if it is intact). Raises CacheSecurityError if it
    is not ours or is writable by others."""
    obj = object_path(key)
    if not obj.is_file() or obj.is_symlink():
        return "not a regular file" if os.path.lexists(obj) else "missing"
    check_safe(obj)
    meta = _read_json(obj.with_suffix(".json")) or {}
    recorded = meta.get("sha256")
    if not isinstance(recorded, str):
        return "its metadata is missing, unreadable or records no sha256"
    if meta.get("key") != key:  # an object and its metadata copied or renamed over another key's
        return ("its metadata records another key" if "key" in meta else
                "its metadata records no key (written before keys were recorded: no current key uses it)")
    return _hash_problem(obj, recorded)


def cached_object(key: str, held: bool = False) -> Optional[Path]:
    """The object for ``key`` if present and intact (its sha256 matches the one recorded at build). A
    corrupt one is removed under its lock (``held``: the caller holds it already) and None returned."""
    obj = object_path(key)
    meta = obj.with_suffix(".json")
    if not os.path.lexists(obj) or (obj.is_file() and not meta.exists()):
        return None  # not built, or being published (the object is renamed into place before its meta)

    def remove_corrupt() -> bool:
        return _remove_object_if(key, lambda: _unsafe_is_a_problem(lambda: _object_problem(key)) is None, held)

    if _intact(obj, lambda: (_object_problem(key), obj), f"cached object {obj.name}", remove_corrupt) is None:
        return None
    with contextlib.suppress(OSError):
        os.utime(meta)  # last use, for gc
    return obj


def _remove_object_if(key: str, keep: Callable[[], bool], held: bool = False) -> bool:
    def remove() -> None:
        _remove(object_path(key))
        with contextlib.suppress(OSError):
            object_path(key).with_suffix(".json").unlink()

    return _remove_under_lock(key, keep, remove, held)


def object_info(key: str) -> dict:
    """What was recorded with the object for ``key`` when it was stored ({} if nothing readable)."""
    return _read_json(object_path(key).with_suffix(".json")) or {}


def store_object(key: str, built: Path, info: dict) -> Path:
    final = object_path(key)
    meta_tmp = built.with_suffix(".json")
    with writing(meta_tmp):
        meta_tmp.write_text(json.dumps({**info, "key": key, "sha256": sha256_file(built), "created": time.time()}))
        if os.path.lexists(final) and not final.is_file():
            _remove(final)  # a directory where the object belongs (corrupt); we hold its lock
        publish_file(built, final)  # object first: a meta without its object is ignored
        publish_file(meta_tmp, final.with_suffix(".json"))
    return final


def remember_shape(shape: str, key: str) -> None:
    """Record that ``key``'s object was compiled from a text of host shape ``shape`` (``keys.host_shape_key``):
    a later text of that shape reuses its host side. Best effort: a cache that cannot be written keeps none."""
    _publish_small(subdir("shapes") / shape, key)


def shaped_object(shape: str) -> Optional[Path]:
    """An intact object compiled from a text of host shape ``shape`` (its metadata says so), or None."""
    try:
        key = _read_regular(cache_dir() / "shapes" / shape).decode("ascii", "replace").strip()
    except OSError:
        return None
    if not _plain_name(key) or key.startswith(".") or not os.path.lexists(object_path(key)):
        return None
    obj = cached_object(key)
    meta = _read_json(object_path(key).with_suffix(".json")) or {}
    return obj if obj is not None and meta.get("shape") == shape else None


def tune_record(key: str) -> Optional[dict]:
    """The autotuning record stored under ``key`` (``keys.tune_key``), or None."""
    record = _read_json(cache_dir() / "tune" / f"{key}.json")
    return record if isinstance(record, dict) and isinstance(record.get("best"), dict) else None


def tune_records() -> List[dict]:
    """Every stored autotuning winner, newest first."""
    d = cache_dir() / "tune"
    found = [r for r in (_read_json(p) for p in (d.glob("*.json") if d.is_dir() else [])) if r and "best" in r]
    return sorted(found, key=lambda r: -_number(r.get("created"), 0.0))


def store_tune_record(key: str, record: dict) -> None:
    """Store an autotuning winner; a cache that cannot be written keeps none (the next process tunes again)."""
    _publish_small(subdir("tune") / f"{key}.json", json.dumps(record))


def read_record(kind: str, key: str) -> dict:
    """The small JSON record ``key`` of ``kind`` (records/<kind>/: what a build learned, e.g. a split's proofs),
    or {} if there is none or it is unreadable."""
    record = _read_json(cache_dir() / "records" / kind / f"{key}.json")
    return record if isinstance(record, dict) else {}


def write_record(kind: str, key: str, record: dict) -> None:
    """Store a small record (readers see the old or the new one); a cache that cannot be written keeps none."""
    folder = subdir("records") / kind
    with contextlib.suppress(OSError, CacheUnwritable):
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    _publish_small(folder / f"{key}.json", json.dumps(record))


def _publish_small(final: Path, text: str) -> None:
    """Write a small record all at once (readers see the old or the new text); best effort."""
    with contextlib.suppress(OSError, CacheUnwritable):
        with writing(final):
            replace_file.write(final, text)


def _remove_dangling_shapes() -> None:
    """Shape records whose object is gone (gc, clear) point nowhere: remove them."""
    shapes = cache_dir() / "shapes"
    for record in list(shapes.iterdir()) if shapes.is_dir() else []:
        with contextlib.suppress(OSError):
            key = _read_regular(record).decode("ascii", "replace").strip()
            if not (_plain_name(key) and object_path(key).is_file()):
                record.unlink()


# ------------------------------------------------------------------------------------------- libraries
def _entry_name(name: str, key: str) -> str:
    return f"{name}-{key[:16]}"


def library_dir(name: str, key: str) -> Path:
    return subdir("lib") / _entry_name(name, key)


def library_lock(name: str, key: str) -> str:
    """The lock id of a library entry: derived from its directory name, so whoever finds the directory
    (gc, clear, verify) takes the same lock as whoever builds it, even when its manifest is unreadable."""
    return f"lib-{_entry_name(name, key)}"  # what _remove_library_if takes for the entry's directory


def read_manifest(entry: Path) -> Optional[dict]:
    return _read_json(entry / "manifest.json")


def write_manifest(entry: Path, manifest: dict) -> None:
    path = entry / "manifest.json"
    with writing(path):
        path.write_text(json.dumps(manifest, indent=1))
        os.chmod(path, 0o600)


def _inspect_library(entry: Path, key: Optional[str] = None) -> Tuple[Optional[str], Optional[Path]]:
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
    if not _plain_name(so_name):
        return f"its manifest names {so_name!r} as the library, not a file name inside the entry", None
    so = entry / so_name
    if not os.path.lexists(so):
        return f"{so_name} is missing", None
    check_safe(entry)
    check_safe(so)
    problem = _hash_problem(so, manifest.get("sha256"))
    return (problem, None) if problem else (None, so)


def _library_status(entry: Path, key: Optional[str] = None) -> Optional[str]:
    return _unsafe_is_a_problem(lambda: _inspect_library(entry, key)[0])


def _remove_library_if(entry: Path, keep: Callable[[], bool], held: bool = False) -> bool:
    return _remove_under_lock(f"lib-{entry.name}", keep, lambda: _remove(entry), held)


def remove_library(name: str, key: str) -> bool:
    """Remove an entry that can never load (a library naming an undefined symbol), under its lock."""
    return _remove_library_if(library_dir(name, key), lambda: False)


def verified_library(name: str, key: str, held: bool = False) -> Optional[Path]:
    """Path of the cached .so for (name, key) if it is complete, ours, not writable by others, and its
    sha256 matches the manifest. A corrupt entry is removed under its lock (``held``: the caller holds it
    already) and rebuilt by the caller."""
    entry = library_dir(name, key)
    if not os.path.lexists(entry):
        return None
    so = _intact(entry, lambda: _inspect_library(entry, key), f"cache entry {entry.name}",
                 lambda: _remove_library_if(entry, lambda: _library_status(entry, key) is None, held))
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


# ---------------------------------------------------------------------------------- precompiled headers
_PCH_VERIFIED: Dict[tuple, bool] = {}  # (path, inode, size, mtime) -> hashed and matched, in this process


def pch_problem(root: Path) -> Optional[str]:
    """Why the precompiled header in ``root`` cannot be used (None if it matches its recorded sha256)."""
    meta = _read_json(root / PCH_META)
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
        problem = _hash_problem(gch, meta.get("sha256"))
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


def _pch_roots() -> List[Path]:
    return sorted(p for p in subdir("pch").iterdir() if p.is_dir())


# -------------------------------------------------------------------------------- listing, gc, clearing
def _number(value: object, default):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _last_used(path: Path, stamp: Path) -> float:
    """When ``stamp`` (touched on every use) was last touched; the entry's own mtime if it has none."""
    for p in (stamp, path):
        try:
            return os.stat(p, follow_symlinks=False).st_mtime
        except OSError:
            continue
    return 0.0


def entries() -> List[dict]:
    """Every library entry, described from its manifest (from its directory's name where the manifest is
    malformed)."""
    out = []
    for entry in sorted(subdir("lib").iterdir()):
        m = read_manifest(entry) or {}
        so = entry / m["so"] if _plain_name(m.get("so")) else None
        try:
            size = so.stat().st_size if so is not None and so.is_file() else 0
        except OSError:
            size = 0
        name, key = m.get("name"), m.get("key")
        dir_name, _, dir_key = entry.name.rpartition("-")
        out.append({"entry": entry.name, "name": name if isinstance(name, str) else dir_name or "?",
                    "key": key[:16] if isinstance(key, str) else dir_key, "size": size,
                    "created": _number(m.get("created"), 0.0),
                    "last_used": _last_used(entry, entry / "manifest.json"),
                    "build_seconds": _number(m.get("build_seconds"), None), "path": str(entry),
                    # a build another rank of a group= job sent (docs/distributed.md: what that trusts)
                    "received_from_rank": m.get("received_from_rank") if isinstance(m.get("received_from_rank"), int) else None})
    return out


def _du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def info() -> Dict[str, object]:
    """Counts, total bytes, bytes per subdirectory (lib, obj, pch, src, tmp, ...) and per kind (``KIND_DIRS``,
    largest first, the rest as "other": build dirs, locks, small records), and the size cap: where the space went."""
    root = cache_dir()
    per_dir = {p.name: _du(p) for p in sorted(root.iterdir()) if p.is_dir()}
    total = _du(root)
    kinds = {kind: per_dir.get(d, 0) for kind, d in KIND_DIRS.items()}
    kinds["other"] = total - sum(kinds.values())
    return {"path": str(root), "libraries": len(list(subdir("lib").iterdir())),
            "objects": len(list(subdir("obj").glob("*.o"))), "pch": len(_pch_roots()), "bytes": total,
            "subdirs": per_dir, "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])), "max_bytes": max_bytes()}


def _object_keys() -> List[str]:
    return sorted({p.stem for p in subdir("obj").iterdir() if p.suffix in (".o", ".json")})


def _remove_pch_if(root: Path, keep: Callable[[], bool]) -> bool:
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


def _record_kinds() -> List[Path]:
    root = cache_dir() / "records"
    return [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []


def _remove_unused(parent: Path, cutoff: float) -> int:
    """Remove the children of ``parent`` (src/, tmp/) not modified since ``cutoff``."""
    n = 0
    for p in list(parent.iterdir()):
        if _last_used(p, p) < cutoff:
            _remove(p)
            n += 1
    return n


def _remove_partial_writes(cutoff: float) -> int:
    """``.<name>.XXXX.tmp`` files (``kernelkit.replace_file``) older than ``cutoff``: left by a writer that was
    killed between writing and renaming, inside entries that are still in use."""
    n = 0
    for parent, _, files in os.walk(cache_dir()):  # unlike rglob, it passes over a directory removed meanwhile
        for name in files:
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    path = os.path.join(parent, name)
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        n += 1
    return n


def _remove_idle_locks(cutoff: float) -> int:
    """Lock files not used since ``cutoff`` and not held. Removed while held by us: filelock re-opens the
    path when the file it waited on was unlinked, so no waiter ends up holding a lock nobody else sees."""
    n = 0
    for p in list(subdir("locks").glob("*.lock")):
        if _last_used(p, p) >= cutoff:
            continue
        with try_locked(p.stem) as ours:
            if ours:
                with contextlib.suppress(OSError):
                    p.unlink()
                    n += 1
    return n


def gc(max_age_days: float = DEFAULT_MAX_AGE_DAYS, now: Optional[float] = None,
       max_bytes: Optional[int] = None) -> Dict[str, int]:
    """Remove libraries, objects, precompiled headers and generated sources unused for ``max_age_days``,
    build dirs left by dead builds, and idle lock files; then hold the cache to ``max_bytes``
    (:func:`enforce_size_cap`). Entries another process holds are left alone."""
    now = time.time() if now is None else now
    cutoff = now - max_age_days * 86400

    def old(path: Path, stamp: Path) -> Callable[[], bool]:
        return lambda: _last_used(path, stamp) < cutoff

    removed = {"libraries": 0, "objects": 0, "pch": 0, "sources": 0, "records": 0, "tmp": 0, "locks": 0}
    for entry in list(subdir("lib").iterdir()):
        is_old = old(entry, entry / "manifest.json")
        if is_old() and _remove_library_if(entry, lambda is_old=is_old: not is_old()):
            removed["libraries"] += 1
    for key in _object_keys():
        is_old = old(object_path(key), object_path(key).with_suffix(".json"))
        if is_old() and _remove_object_if(key, lambda is_old=is_old: not is_old()):
            removed["objects"] += 1
    for root in _pch_roots():
        is_old = old(root, root / PCH_META)
        if is_old() and _remove_pch_if(root, lambda is_old=is_old: not is_old()):
            removed["pch"] += 1
    removed["sources"] = _remove_unused(subdir("src"), min(cutoff, now - STALE_TMP_SECONDS))
    removed["records"] = sum(_remove_unused(kind, cutoff) for kind in _record_kinds())
    removed["tmp"] = _remove_unused(subdir("tmp"), now - STALE_TMP_SECONDS)
    removed["tmp"] += _remove_partial_writes(now - STALE_TMP_SECONDS)
    removed["locks"] = _remove_idle_locks(now - STALE_LOCK_SECONDS)
    for kind, n in enforce_size_cap(max_bytes, now).items():
        removed[{"precompiled headers": "pch"}.get(kind, kind)] += n
    _remove_dangling_shapes()
    return removed


def maybe_gc() -> None:
    """Collect at most once a day and hold the cache to its size cap (checked at most every few minutes), after
    a build (never on the warm path). Never fails the build."""
    try:
        if _due("last-gc", GC_INTERVAL_SECONDS):
            removed = gc(_max_age_days(), max_bytes=_max_bytes())
        elif _due("last-size-check", CAP_INTERVAL_SECONDS):
            removed = enforce_size_cap(_max_bytes())
        else:
            return
    except (OSError, CacheUnwritable) as e:
        log.warning("cache gc failed: %s", e)
        return
    if any(removed.values()):
        log.info("cache gc removed %s", removed)


def _due(stamp_name: str, interval: float) -> bool:
    """Whether ``interval`` seconds have passed since the stamp was last touched; touches it if so."""
    stamp = cache_dir() / stamp_name
    with contextlib.suppress(OSError):
        if time.time() - stamp.stat().st_mtime < interval:
            return False
    stamp.touch()
    return True


def max_bytes() -> Optional[int]:
    """KERNELKIT_CACHE_MAX_SIZE: the cache's size cap in bytes (None: none)."""
    return settings.CACHE_MAX_SIZE.get()


def _max_bytes() -> Optional[int]:
    """:func:`max_bytes`; a bad value is reported and replaced by the default: gc never fails a build."""
    try:
        return max_bytes()
    except KernelkitError as e:
        log.warning("%s; using %d bytes", e, settings.CACHE_MAX_SIZE.default)
        return settings.CACHE_MAX_SIZE.default


def enforce_size_cap(limit: Optional[int], now: Optional[float] = None) -> Dict[str, int]:
    """Remove the least recently used libraries, objects, precompiled headers, generated sources and records
    until the cache holds at most ``limit`` bytes (None: no cap). Entries used in the last ``CAP_GRACE_SECONDS``
    (sources: the last hour) and entries another process holds stay, even over the cap. Returns how many of
    each kind went."""
    removed = dict.fromkeys(KIND_DIRS, 0)
    if limit is None:
        return removed
    now = time.time() if now is None else now
    total = _du(cache_dir())
    for used, size, kind, remove in sorted(_evictable(now), key=lambda c: c[0]):
        if total <= limit or used > now - CAP_GRACE_SECONDS:
            break
        if remove():
            total -= size
            removed[kind] += 1
    return removed


def _evictable(now: float) -> List[Tuple[float, int, str, Callable[[], bool]]]:
    """(last use, bytes, kind, remove) of every entry the size cap may take: ``remove`` leaves an entry used
    since it was listed."""
    def entry(kind: str, path: Path, stamp: Path, size: int, remove_if: Callable[[Callable[[], bool]], bool]):
        used = _last_used(path, stamp)
        return used, size, kind, lambda: remove_if(lambda: _last_used(path, stamp) > used)

    def plain(path: Path) -> Callable[[Callable[[], bool]], bool]:
        def remove_if(keep: Callable[[], bool]) -> bool:  # no lock: nothing builds into a source or record in place
            if keep():
                return False
            _remove(path)
            return True

        return remove_if

    found = [entry("libraries", e, e / "manifest.json", _du(e), functools.partial(_remove_library_if, e))
             for e in subdir("lib").iterdir()]
    for key in _object_keys():
        obj = object_path(key)
        size = sum(p.stat().st_size for p in (obj, obj.with_suffix(".json")) if p.is_file())
        found.append(entry("objects", obj, obj.with_suffix(".json"), size, functools.partial(_remove_object_if, key)))
    found += [entry("precompiled headers", r, r / PCH_META, _du(r), functools.partial(_remove_pch_if, r))
              for r in _pch_roots()]
    found += [entry("sources", p, p, _du(p), plain(p)) for p in subdir("src").iterdir()
              if _last_used(p, p) < now - STALE_TMP_SECONDS]  # younger ones may belong to a live build
    found += [entry("records", f, f, f.stat().st_size, plain(f)) for kind in _record_kinds() for f in kind.iterdir()]
    return found


def _max_age_days() -> float:
    """KERNELKIT_CACHE_MAX_AGE_DAYS; a bad value is reported and replaced by the default: gc never fails a build."""
    try:
        return settings.CACHE_MAX_AGE_DAYS.get()
    except KernelkitError as e:
        log.warning("%s; using %g", e, DEFAULT_MAX_AGE_DAYS)
        return DEFAULT_MAX_AGE_DAYS


def clear() -> int:
    """Remove every library, object and precompiled header, and the generated sources and build dirs not
    touched in the last hour; entries another process is building or removing are left. Returns how many
    were removed."""
    now = time.time()
    n = sum(_remove_library_if(e, lambda: False) for e in list(subdir("lib").iterdir()))
    n += sum(_remove_object_if(k, lambda: False) for k in _object_keys())
    n += sum(_remove_pch_if(r, lambda: False) for r in _pch_roots())
    n += _remove_unused(subdir("src"), now - STALE_TMP_SECONDS)
    n += _remove_unused(subdir("tmp"), now - STALE_TMP_SECONDS)
    n += _remove_unused(subdir("tune"), now + 1)  # autotuning winners: clear asks to start over
    n += sum(_remove_unused(kind, now + 1) for kind in _record_kinds())
    _remove_idle_locks(now + 1)
    _remove_dangling_shapes()
    return n


# -------------------------------------------------------------------------------------------- verifying
def _object_status(key: str) -> Optional[str]:
    obj = object_path(key)
    if not os.path.lexists(obj):
        return "metadata without its object"
    if not obj.with_suffix(".json").exists():
        return "object without its metadata"
    return _unsafe_is_a_problem(lambda: _object_problem(key))


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
        data = _read_regular(path)
    except OSError as e:
        return f"unreadable generated source ({e.strerror or e})"
    if sha256_bytes(data, path.name.encode())[:24] != path.parent.name:
        return "generated source does not hold the text its name hashes"
    return None


def _remove_source_if(path: Path, keep: Callable[[], bool]) -> bool:
    """Sources take no lock (every writer writes the same text, atomically): removed unless rewritten meanwhile."""
    if keep():
        return False
    discard_source(path)
    return not path.exists()


def _source_paths() -> List[Path]:
    out = []
    for d in subdir("src").iterdir():
        with contextlib.suppress(OSError):  # removed by a gc or clear meanwhile, or not a dir
            out += [f for f in d.iterdir() if not f.name.startswith(".")]  # .name.XXXX.tmp: a write in progress
    return sorted(out)


def _checks() -> Iterator[tuple]:
    """(kind, path, status(), status once its lock is held, remove_if(keep)) for every cache entry."""
    for entry in sorted(subdir("lib").iterdir()):
        status = functools.partial(_library_status, entry)
        yield "library", entry, status, status, functools.partial(_remove_library_if, entry)
    for key in _object_keys():
        status = functools.partial(_object_status, key)
        yield "object", object_path(key), status, status, functools.partial(_remove_object_if, key)
    for root in _pch_roots():
        yield ("pch", root, functools.partial(_pch_status, root), functools.partial(pch_problem, root),
               functools.partial(_remove_pch_if, root))
    for path in _source_paths():
        status = functools.partial(_source_status, path)
        yield "source", path, status, status, functools.partial(_remove_source_if, path)


def verify(fix: bool = False) -> List[Dict[str, object]]:
    """Check every library, object and precompiled header against its recorded sha256 (and libraries'
    manifests for sense and safety), and every generated source against the hash its place names. One dict per entry: kind, entry, status ('ok' or 'corrupt'), reason,
    removed. ``fix``: remove the corrupt ones (under their locks; an entry in use is left and reported)."""
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
