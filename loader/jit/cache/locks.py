"""The cache's locks: flock-based (a holder killed with SIGKILL releases at once), and removal under an entry's lock."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Callable, Iterator, Optional

from ... import settings
from ...errors import LockTimeout
from .root import subdir, writing


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


def remove_under_lock(lock_id: str, keep: Callable[[], bool], remove: Callable[[], None],
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
