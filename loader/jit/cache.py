"""The on-disk cache: content-addressed objects and libraries, written atomically, verified before use.

Layout under ``cache_dir()`` (mode 0700, as is the directory it lives in): every file belongs to a row of the
store table (``store.STORES``: each row's folder, key recipe, format version, gc rule and verify check)::

    lib/<name>-<key16>/           one linked library: the .so and manifest.json (sha256 of the .so)
    obj/<key>.o, obj/<key>.json   compiled translation units, NVRTC cubins and scanned kernel outlines, shared by
                                  every library that uses them (the json records the key and the sha256: a copy
                                  over another key's is corrupt)
    pch/<key>/                    a precompiled header (<kernelkit/binding.h>, a split's host preamble), its
                                  pch.json (sha256) and the ``building`` claim its detached builder holds
    src/<key>/                    sources written for load_inline, and generated TUs and headers
    shapes/<key>                  the key of an object compiled from a text of that host shape
    tune/<key>.json               autotuning winners (kept until a clear)
    plans/<key>.json              warm plans of torch-style extensions (``jit.fast.recall``)
    records/<store>/<key>.json    small records a warm start reads instead of working them out again (a split's
                                  frames and torch names, toolchain and NVRTC facts, the launcher, torch's
                                  signatures, device bandwidth, compile reports): ``record_path``, ``write_record``
    tmp/                          private build dirs; renamed into place only when complete
    locks/<id>.lock               filelock locks (flock: released by the kernel if the holder dies)
    last-gc, last-size-check      when gc and the size cap last ran

Keys are derived in ``keys`` (what invalidates what). Only regular files are read: a FIFO or device in
place of an entry is reported corrupt without being opened for reading (it would block forever). ``subdir`` and
the record functions refuse a folder or store the table lacks; what lies in no row's place (left by an older
kernelkit) is collected by age.

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
import math
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, TypeVar

from .. import replace_file, settings
from ..errors import CacheSecurityError, CacheUnwritable, KernelkitError, LockTimeout
from . import store
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
#: what ``info`` sizes and the cap evicts, by kind: the folders of its rows
KIND_DIRS = {kind: tuple(row.folder for row in store.STORES if row.kind == kind) for kind in store.KINDS}
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
        for d, error in [(d, e) for d, e in _UNCREATED.items() if d.is_relative_to(path)]:
            if not d.is_dir() and (d == path or not subdir(d.relative_to(path).as_posix()).is_dir()):
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
    data = text.encode()
    path = cache_dir() / "src" / generated_source_key(data, filename) / filename
    if not _holds(path, data):
        try:
            _write_source(path, data)
        except CacheUnwritable:
            _UNWRITTEN[path] = data
    return path


_UNWRITTEN: Dict[Path, bytes] = {}


def generated_source_key(data: bytes, filename: str) -> str:
    """The folder in src/ of a generated source: its text and name, hashed. Derived here, not in ``keys``:
    keys imports the toolchain, which imports this module."""
    return sha256_bytes(data, filename.encode())[:24]


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
    record = read_record("tune", key)
    return record if isinstance(record.get("best"), dict) else None


def tune_records() -> List[dict]:
    """Every stored autotuning winner, newest first."""
    found = [r for r in (_read_json(e.path) for e in _entries(store.row("tune"))) if r and "best" in r]
    return sorted(found, key=lambda r: -_number(r.get("created"), 0.0))


def store_tune_record(key: str, record: dict) -> None:
    """Store an autotuning winner; a cache that cannot be written keeps none (the next process tunes again)."""
    write_record("tune", key, record)


def record_path(name: str, key: str) -> Path:
    """Where the JSON record ``key`` of the store ``name`` lives (its folder made if it can be). ValueError for a
    store that is no row of JSON records (``store.STORES``) or a key that is no plain file name."""
    row = store.row(name)
    if row.verify != store.JSON:
        raise ValueError(f"the store {name!r} holds no JSON records")
    if not _plain_name(key) or key.startswith("."):
        raise ValueError(f"{key!r} is not a record key (a plain file name)")
    return subdir(row.folder) / f"{key}.json"


def read_record(name: str, key: str) -> dict:
    """The JSON record ``key`` of the store ``name`` (what a build or a warm start learned, e.g. a split's proofs),
    or {} if there is none or it is unreadable."""
    return _read_json(record_path(name, key)) or {}


def write_record(name: str, key: str, record: dict) -> None:
    """Store a small record (readers see the old or the new one); a cache that cannot be written keeps none."""
    _publish_small(record_path(name, key), json.dumps(record))


def _publish_small(final: Path, text: str) -> None:
    """Write a small record all at once (readers see the old or the new text); best effort."""
    with contextlib.suppress(OSError, CacheUnwritable):
        with writing(final):
            replace_file.write(final, text)


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


# ----------------------------------------------------------------------------------- the store table's entries
class _Entry(NamedTuple):
    path: Path
    used: Callable[[], float]  # when it was last used: what gc's age and the size cap's order go by
    size: Callable[[], int]
    remove_if: Callable[[Callable[[], bool]], bool]  # remove it unless keep(), asked once it is ours to remove


def _listing(folder: Path) -> List[Path]:
    """The children of ``folder``, sorted; none if it is missing (or was removed meanwhile)."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _named(row: store.Store) -> List[Path]:
    return [p for p in _listing(cache_dir() / row.folder) if store.is_entry(row, p.name)]


def _unclaimed(folder: Path) -> List[Path]:
    """What lies in ``folder``, and in the row folders under it, in no row's place."""
    root = cache_dir()
    found = []
    for p in _listing(folder):
        rel = p.relative_to(root).as_posix()
        if store.holds_rows(rel) and p.is_dir() and not p.is_symlink():
            found += _unclaimed(p)
        elif store.owner(rel) is None:
            found.append(p)
    return found


def _size(*paths: Path) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += _du(p) if p.is_dir() and not p.is_symlink() else os.lstat(p).st_size
    return total


def _remove_if(path: Path, keep: Callable[[], bool]) -> bool:
    """No lock: nothing builds into a source, a record or a build dir in place."""
    if keep():
        return False
    _remove(path)
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
        key = _read_regular(record).decode("ascii", "replace").strip()
    except OSError:
        return -math.inf
    return _last_used(record, record) if _plain_name(key) and object_path(key).is_file() else -math.inf


def _library_entries(row: store.Store) -> List[_Entry]:
    return [_Entry(e, functools.partial(_last_used, e, e / "manifest.json"), functools.partial(_size, e),
                   functools.partial(_remove_library_if, e)) for e in _named(row)]


def _object_entries(row: store.Store) -> List[_Entry]:
    """One per key: its object, or its metadata alone."""
    out = []
    for key in sorted({p.stem for p in _named(row)}):
        obj, meta = object_path(key), object_path(key).with_suffix(".json")
        out.append(_Entry(obj, functools.partial(_last_used, obj, meta), functools.partial(_size, obj, meta),
                          functools.partial(_remove_object_if, key)))
    return out


def _pch_entries(row: store.Store) -> List[_Entry]:
    return [_Entry(r, functools.partial(_last_used, r, r / PCH_META), functools.partial(_size, r),
                   functools.partial(_remove_pch_if, r)) for r in _named(row) if r.is_dir()]


def _lock_entries(row: store.Store) -> List[_Entry]:
    return [_Entry(p, functools.partial(_last_used, p, p), functools.partial(_size, p),
                   functools.partial(_remove_lock_if, p)) for p in _named(row)]


def _newest(path: Path) -> float:
    """When a file in ``path`` last changed (``path``'s own mtime if it holds none): a folder in no row's place is
    as old as what it holds."""
    times = [_last_used(path, path)] if not path.is_dir() or path.is_symlink() else []
    for parent, _, files in os.walk(path):
        times += [_last_used(Path(parent, f), Path(parent, f)) for f in files]
    return max(times, default=_last_used(path, path))


def _plain_entries(row: store.Store) -> List[_Entry]:
    if row is store.UNCLAIMED:
        paths, used = _unclaimed(cache_dir()), _newest
    else:
        paths, used = _named(row), _shape_used if row.gc == store.WITH_OBJECT else lambda p: _last_used(p, p)
    return [_Entry(p, functools.partial(used, p), functools.partial(_size, p), functools.partial(_remove_if, p))
            for p in paths]


#: how a row's entries are found and removed, by what whoever removes one holds
_LISTERS = {store.LIBRARY_LOCK: _library_entries, store.KEY_LOCK: _object_entries, store.CLAIM: _pch_entries,
            store.HELD: _lock_entries, store.NO_LOCK: _plain_entries}
_ROWS = (*store.STORES, store.UNCLAIMED)


def _entries(row: store.Store) -> List[_Entry]:
    return _LISTERS[row.lock](row)


def _gc_cut(rule: str, cutoff: float, now: float) -> float:
    """gc removes an entry under ``rule`` last used before this (``cutoff``: the max age's)."""
    return {store.AGED: cutoff, store.AGED_SOURCES: min(cutoff, now - STALE_TMP_SECONDS),
            store.STALE: now - STALE_TMP_SECONDS, store.IDLE: now - STALE_LOCK_SECONDS, store.WITH_OBJECT: 0.0,
            store.KEPT: -math.inf, store.NEVER: -math.inf}[rule]


def _clear_cut(rule: str, now: float) -> float:
    """clear removes an entry under ``rule`` last used before this: sources and build dirs younger than an hour
    may belong to a live build."""
    return {store.AGED: math.inf, store.AGED_SOURCES: now - STALE_TMP_SECONDS, store.STALE: now - STALE_TMP_SECONDS,
            store.IDLE: math.inf, store.WITH_OBJECT: 0.0, store.KEPT: math.inf, store.NEVER: -math.inf}[rule]


def _sweep(row: store.Store, cut: float) -> int:
    """Remove the row's entries last used before ``cut``; each is asked again once it is ours to remove."""
    n = 0
    for e in _entries(row):
        if e.used() < cut and e.remove_if(lambda e=e: e.used() >= cut):
            n += 1
    return n


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


def store_entries(name: str) -> List[dict]:
    """The entries of the store ``name`` (a row of ``store.STORES``, or "unclaimed"): where each lies under the
    cache root, its bytes and its last use."""
    row = store.UNCLAIMED if name == store.UNCLAIMED.name else store.row(name)
    root = cache_dir()
    return [{"entry": e.path.relative_to(root).as_posix(), "bytes": e.size(), "last_used": max(e.used(), 0.0)}
            for e in _entries(row)]


def store_usage() -> List[Dict[str, object]]:
    """Each row of the store table, and what lies in no row's place: its entries' count and bytes, and the rules
    it is kept by."""
    out = []
    for row in _ROWS:
        found = _entries(row)
        out.append({"name": row.name, "folder": row.folder, "entries": len(found),
                    "bytes": sum(e.size() for e in found), "kind": row.kind, "gc": row.gc, "verify": row.verify,
                    "recipes": list(row.recipes), "schema": row.schema})
    return out


def _du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def info() -> Dict[str, object]:
    """Counts, total bytes, bytes per subdirectory (lib, obj, pch, src, tmp, ...), per kind (``KIND_DIRS``,
    largest first, the rest as "other": build dirs, locks, tuning winners) and per store (``store_usage``), and
    the size cap: where the space went."""
    root = cache_dir()
    per_dir = {p.name: _du(p) for p in _listing(root) if p.is_dir()}
    total = _du(root)
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


def gc(max_age_days: float = DEFAULT_MAX_AGE_DAYS, now: Optional[float] = None,
       max_bytes: Optional[int] = None) -> Dict[str, int]:
    """Remove what each row's gc rule (``store.STORES``) says has had its day -- entries unused for
    ``max_age_days``, build dirs left by dead builds, idle lock files, what lies in no row's place -- then hold
    the cache to ``max_bytes`` (:func:`enforce_size_cap`). Entries another process holds are left alone. Returns
    how many entries of each row went (partial writes of killed writers count as tmp)."""
    now = time.time() if now is None else now
    cutoff = now - max_age_days * 86400
    removed = {row.name: _sweep(row, _gc_cut(row.gc, cutoff, now)) for row in _ROWS}
    removed["tmp"] += _remove_partial_writes(now - STALE_TMP_SECONDS)
    for row, n in _cap(max_bytes, now).items():
        removed[row.name] += n
    for row in _ROWS:  # what goes with an object the cap took
        if row.gc == store.WITH_OBJECT:
            removed[row.name] += _sweep(row, _gc_cut(row.gc, cutoff, now))
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
        log.info("cache gc removed %s", {k: n for k, n in removed.items() if n})


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
    for row, n in _cap(limit, now).items():
        removed[row.kind] += n
    return removed


def _cap(limit: Optional[int], now: Optional[float]) -> Dict[store.Store, int]:
    """:func:`enforce_size_cap`, counted by row."""
    removed: Dict[store.Store, int] = {}
    if limit is None:
        return removed
    now = time.time() if now is None else now
    total = _du(cache_dir())
    for used, size, row, remove in sorted(_evictable(now), key=lambda c: c[0]):
        if total <= limit or used > now - CAP_GRACE_SECONDS:
            break
        if remove():
            total -= size
            removed[row] = removed.get(row, 0) + 1
    return removed


def _evictable(now: float) -> List[Tuple[float, int, store.Store, Callable[[], bool]]]:
    """(last use, bytes, row, remove) of every entry the size cap may take: what clear would take of the rows of
    a kind ``info`` sizes; ``remove`` leaves an entry used since it was listed."""
    found = []
    for row in [r for r in _ROWS if r.kind in KIND_DIRS]:
        cut = _clear_cut(row.gc, now)
        for e in _entries(row):
            used = e.used()
            if used < cut:
                keep = functools.partial(_used_since, e, used)
                found.append((used, e.size(), row, functools.partial(e.remove_if, keep)))
    return found


def _used_since(entry: _Entry, used: float) -> bool:
    return entry.used() > used


def _max_age_days() -> float:
    """KERNELKIT_CACHE_MAX_AGE_DAYS; a bad value is reported and replaced by the default: gc never fails a build."""
    try:
        return settings.CACHE_MAX_AGE_DAYS.get()
    except KernelkitError as e:
        log.warning("%s; using %g", e, DEFAULT_MAX_AGE_DAYS)
        return DEFAULT_MAX_AGE_DAYS


def clear() -> int:
    """Remove what each row's clear rule (``store.STORES``) takes: every library, object, precompiled header and
    record, and the generated sources and build dirs not touched in the last hour; entries another process is
    building or removing are left. Returns how many were removed (lock files and shape records, which go with the
    entries they serve, not counted)."""
    now = time.time()
    removed = {row: _sweep(row, _clear_cut(row.gc, now)) for row in _ROWS}
    return sum(n for row, n in removed.items() if row.gc not in (store.IDLE, store.WITH_OBJECT))


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
    if generated_source_key(data, path.name) != path.parent.name:
        return "generated source does not hold the text its name hashes"
    return None


def _remove_source_if(path: Path, keep: Callable[[], bool]) -> bool:
    """Sources take no lock (every writer writes the same text, atomically): removed unless rewritten meanwhile."""
    if keep():
        return False
    discard_source(path)
    return not path.exists()


def _source_paths(row: store.Store) -> List[Path]:
    out = []
    for d in _named(row):
        with contextlib.suppress(OSError):  # removed by a gc or clear meanwhile, or not a dir
            out += [f for f in d.iterdir() if not f.name.startswith(".")]  # .name.XXXX.tmp: a write in progress
    return sorted(out)


def _library_checks(row: store.Store) -> Iterator[tuple]:
    for e in _entries(row):
        status = functools.partial(_library_status, e.path)
        yield "library", e.path, status, status, e.remove_if


def _object_checks(row: store.Store) -> Iterator[tuple]:
    for e in _entries(row):
        status = functools.partial(_object_status, e.path.stem)
        yield "object", e.path, status, status, e.remove_if


def _pch_checks(row: store.Store) -> Iterator[tuple]:
    for e in _entries(row):
        status_locked = functools.partial(pch_problem, e.path)  # the claim held: what its builder left
        yield "pch", e.path, functools.partial(_pch_status, e.path), status_locked, e.remove_if


def _source_checks(row: store.Store) -> Iterator[tuple]:
    for path in _source_paths(row):
        status = functools.partial(_source_status, path)
        yield "source", path, status, status, functools.partial(_remove_source_if, path)


def _record_status(path: Path) -> Optional[str]:
    return None if _read_json(path) is not None else "not a JSON object (damaged, or not a regular file)"


def _record_checks(row: store.Store) -> Iterator[tuple]:
    for e in _entries(row):
        status = functools.partial(_record_status, e.path)
        yield row.name, e.path, status, status, e.remove_if


#: how verify checks a row's entries, by its verify check
_CHECKERS = {store.SO_SHA256: _library_checks, store.OBJECT_SHA256: _object_checks, store.PCH_SHA256: _pch_checks,
             store.TEXT_HASH: _source_checks, store.JSON: _record_checks, store.NOTHING: lambda _row: iter(())}


def _checks() -> Iterator[tuple]:
    """(kind, path, status(), status once its lock is held, remove_if(keep)) for every entry of every row."""
    for row in store.STORES:
        yield from _CHECKERS[row.verify](row)


def verify(fix: bool = False) -> List[Dict[str, object]]:
    """Check each row's entries as the store table says (``store.STORES``): libraries, objects and precompiled
    headers against their recorded sha256 (and libraries' manifests for sense and safety), generated sources
    against the hash their place names, records for being JSON objects. One dict per entry: kind (a record's
    store), entry, status ('ok' or 'corrupt'), reason, removed. ``fix``: remove the corrupt ones (under their
    locks; an entry in use is left and reported)."""
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
