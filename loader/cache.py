"""The on-disk cache: content-addressed objects and libraries, written atomically, verified before use.

Layout under ``cache_dir()`` (mode 0700)::

    obj/<key>.o, obj/<key>.json   compiled translation units, shared by every library that uses them
    lib/<name>-<key16>/           one linked library: the .so and manifest.json (sha256 of the .so)
    locks/<key>.lock              filelock locks (flock: released by the kernel if the holder dies)
    src/<key>/                    sources written for load_inline
    tmp/                          private build dirs; renamed into place only when complete
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from .errors import CacheSecurityError, CacheUnwritable, LockTimeout
from .sources import sha256_file

log = logging.getLogger("kernelkit")

LAYOUT = "v1"
DEFAULT_LOCK_TIMEOUT = 900.0  # a cold build of a large card on a small machine can take minutes
STALE_TMP_SECONDS = 3600.0
GC_INTERVAL_SECONDS = 86400.0


def cache_dir() -> Path:
    """KERNELKIT_CACHE_DIR, else the user cache dir (platformdirs); created private (0700)."""
    env = os.environ.get("KERNELKIT_CACHE_DIR")
    if env:
        root = Path(env).expanduser()
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("kernelkit", appauthor=False))
    root = root / LAYOUT
    if not root.is_dir():
        with writing(root):
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(root, 0o700)
    check_safe(root)
    return root


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError from creating or writing ``path`` in the cache into an error that says what to do."""
    try:
        yield
    except TimeoutError:  # an OSError too: filelock.Timeout, another process holds the lock
        raise
    except OSError as e:
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
        with writing(d):
            d.mkdir(exist_ok=True, mode=0o700)
    return d


def lock_timeout() -> float:
    return float(os.environ.get("KERNELKIT_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT))


@contextlib.contextmanager
def locked(key: str, what: str, on_wait=None) -> Iterator[None]:
    """Hold the lock for ``key``. flock-based, so a holder killed with SIGKILL releases it at once."""
    import filelock  # only builds lock; a warm load never imports it

    lock = filelock.FileLock(str(subdir("locks") / f"{key}.lock"), mode=0o600)
    try:
        with writing(Path(lock.lock_file)):
            lock.acquire(timeout=0)
    except filelock.Timeout:
        if on_wait:
            on_wait()
        try:
            lock.acquire(timeout=lock_timeout())
        except filelock.Timeout:
            raise LockTimeout(
                f"timed out after {lock_timeout():.0f} s waiting for another process building {what} "
                f"(lock {lock.lock_file}); raise KERNELKIT_LOCK_TIMEOUT to wait longer") from None
    try:
        yield
    finally:
        lock.release()


def private_tmpdir(prefix: str) -> Path:
    tmp = subdir("tmp")
    with writing(tmp):
        return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp))


def publish_file(tmp: Path, final: Path) -> None:
    os.chmod(tmp, 0o600 if final.suffix != ".so" else 0o700)
    os.replace(tmp, final)  # atomic on one filesystem: readers see all of it or none


# --------------------------------------------------------------------------------------------- objects
def object_path(key: str) -> Path:
    return subdir("obj") / f"{key}.o"


def cached_object(key: str) -> Optional[Path]:
    """The object for ``key`` if present and intact (its sha256 matches the one recorded at build)."""
    obj = object_path(key)
    meta = obj.with_suffix(".json")
    if not (obj.is_file() and meta.is_file()):
        return None
    try:
        check_safe(obj)
        recorded = json.loads(meta.read_text())["sha256"]
    except CacheSecurityError:
        raise
    except (OSError, ValueError, KeyError):
        recorded = None
    if recorded != sha256_file(obj):
        log.warning("cached object %s is corrupt; rebuilding it", obj.name)
        with contextlib.suppress(OSError):
            obj.unlink()
        return None
    os.utime(meta)  # last use, for gc
    return obj


def store_object(key: str, built: Path, info: dict) -> Path:
    final = object_path(key)
    meta_tmp = built.with_suffix(".json")
    meta_tmp.write_text(json.dumps({**info, "sha256": sha256_file(built), "created": time.time()}))
    publish_file(built, final)  # object first: a meta without its object is ignored
    publish_file(meta_tmp, final.with_suffix(".json"))
    return final


# ------------------------------------------------------------------------------------------- libraries
def library_dir(name: str, key: str) -> Path:
    return subdir("lib") / f"{name}-{key[:16]}"


def read_manifest(entry: Path) -> Optional[dict]:
    try:
        return json.loads((entry / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def verified_library(name: str, key: str) -> Optional[Path]:
    """Path of the cached .so for (name, key) if it is complete, ours, not writable by others, and its
    sha256 matches the manifest. A corrupt entry is removed (and rebuilt by the caller)."""
    entry = library_dir(name, key)
    if not entry.is_dir():
        return None
    manifest = read_manifest(entry)
    so = entry / manifest["so"] if manifest and "so" in manifest else None
    if so is None or not so.is_file() or manifest.get("key") != key:
        log.warning("cache entry %s is incomplete; rebuilding it", entry.name)
        remove_entry(entry)
        return None
    check_safe(entry)
    check_safe(so)
    if sha256_file(so) != manifest.get("sha256"):
        log.warning("cached library %s does not match its recorded sha256 (corrupt); rebuilding it", so.name)
        remove_entry(entry)
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


def remove_entry(entry: Path) -> None:
    # rename first so a reader never sees a half-deleted entry
    trash = subdir("tmp") / f"trash-{entry.name}-{os.getpid()}-{time.monotonic_ns()}"
    with contextlib.suppress(OSError):
        os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


# -------------------------------------------------------------------------------- listing, gc, clearing
def entries() -> List[dict]:
    out = []
    lib = subdir("lib")
    for entry in sorted(lib.iterdir()):
        m = read_manifest(entry) or {}
        so = entry / m.get("so", "")
        size = so.stat().st_size if so.is_file() else 0
        try:
            used = (entry / "manifest.json").stat().st_mtime
        except OSError:
            used = 0.0
        out.append({"entry": entry.name, "name": m.get("name", "?"), "key": m.get("key", "?")[:16],
                    "size": size, "created": m.get("created", 0.0), "last_used": used,
                    "build_seconds": m.get("build_seconds"), "path": str(entry)})
    return out


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def info() -> Dict[str, object]:
    root = cache_dir()
    return {"path": str(root), "libraries": len(list(subdir("lib").iterdir())),
            "objects": len(list(subdir("obj").glob("*.o"))), "bytes": _du(root)}


def gc(max_age_days: float = 30.0, now: Optional[float] = None) -> Dict[str, int]:
    """Remove libraries and objects unused for ``max_age_days``, and build dirs left by dead builds."""
    now = time.time() if now is None else now
    removed = {"libraries": 0, "objects": 0, "tmp": 0}
    cutoff = now - max_age_days * 86400
    for e in entries():
        if e["last_used"] < cutoff:
            remove_entry(Path(e["path"]))
            removed["libraries"] += 1
    for meta in subdir("obj").glob("*.json"):
        try:
            if meta.stat().st_mtime < cutoff:
                meta.with_suffix(".o").unlink(missing_ok=True)
                meta.unlink(missing_ok=True)
                removed["objects"] += 1
        except OSError:
            pass
    for t in subdir("tmp").iterdir():
        try:
            if t.stat().st_mtime < now - STALE_TMP_SECONDS:
                shutil.rmtree(t, ignore_errors=True) if t.is_dir() else t.unlink()
                removed["tmp"] += 1
        except OSError:
            pass
    return removed


def maybe_gc() -> None:
    """Collect at most once a day, after a build (never on the warm path)."""
    stamp = cache_dir() / "last-gc"
    try:
        if time.time() - stamp.stat().st_mtime < GC_INTERVAL_SECONDS:
            return
    except OSError:
        pass
    stamp.touch()
    days = float(os.environ.get("KERNELKIT_CACHE_MAX_AGE_DAYS", 30))
    removed = gc(days)
    if any(removed.values()):
        log.info("cache gc removed %s", removed)


def clear() -> int:
    n = 0
    for name in ("lib", "obj", "src", "tmp"):
        d = cache_dir() / name
        if d.is_dir():
            n += sum(1 for _ in d.iterdir())
            shutil.rmtree(d, ignore_errors=True)
    return n
