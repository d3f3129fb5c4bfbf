"""The remote cache this process uses now, from the settings (``KERNELKIT_REMOTE_CACHE`` and its kin), and what the
process has learnt about it: a store that did not answer is not asked again, and each reason to skip the store is
said once."""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable, Dict, Optional, Set, Tuple

from ... import settings
from ..progress import say
from . import signing, stores

log = logging.getLogger("kernelkit")

#: what a transfer is allowed beyond the timeout: a request for a large library may take its size over this rate
_BYTES_PER_SECOND = 8 << 20


@dataclasses.dataclass
class Remote:
    url: str
    shown: str  # the URL without credentials
    store: object  # a stores.FsspecStore or stores.RedisStore
    signer: Optional[object]  # signs what this process publishes; None: it never writes
    trusted: Dict[str, object]  # key id -> checker: the signatures this process accepts
    read: bool
    write: bool
    timeout: float

    def call(self, request: Callable, size: int = 0):
        """``request()`` within the timeout (and the time ``size`` bytes take at a modest rate); Unreachable if not."""
        return stores.bounded(request, self.timeout + size / _BYTES_PER_SECOND)


_LOCK = threading.Lock()
_OPEN: Dict[tuple, Remote] = {}
_GIVEN_UP: Dict[str, str] = {}  # url -> why this process stopped asking it
_SAID: Set[str] = set()


def once(message: str, warn: bool = False) -> None:
    """Say ``message`` the first time only (``warn``: as a warning, which KERNELKIT_VERBOSE=0 does not silence)."""
    with _LOCK:
        if message in _SAID:
            return
        _SAID.add(message)
    if warn:
        log.warning("kernelkit: %s", message)
    else:
        say(message)


def give_up(remote: Remote, why: str, publishing: bool = False) -> None:
    with _LOCK:
        _GIVEN_UP[remote.url] = why
    doing = "did not take a publish" if publishing else "unreachable"
    once(f"remote cache {remote.shown} {doing} ({why}): building locally; this process will not ask it again", True)


def forget() -> None:
    """Forget the stores opened, given up on and the lines said (tests; a long-lived process whose store is back)."""
    with _LOCK:
        _OPEN.clear()
        _GIVEN_UP.clear()
        _SAID.clear()


def _settings() -> tuple:
    return tuple(s.get() for s in (settings.REMOTE_CACHE, settings.REMOTE_CACHE_MODE, settings.REMOTE_CACHE_TIMEOUT,
                                   settings.REMOTE_CACHE_SECRET, settings.REMOTE_CACHE_SIGNING_KEY,
                                   settings.REMOTE_CACHE_TRUSTED_KEYS))


def current() -> Tuple[Optional[Remote], str]:
    """(the remote cache to use, why there is none: a one-line reason)."""
    config = _settings()
    url = config[0]
    if not url:
        return None, f"{settings.REMOTE_CACHE.name} is not set"
    shown = stores.shown(url)
    if url in _GIVEN_UP:
        return None, f"the remote cache {shown} did not answer ({_GIVEN_UP[url]})"
    with _LOCK:
        remote = _OPEN.get(config)
    if remote is None:
        remote, why = _open(url, shown, *config[1:3])
        if remote is None:
            once(why)
            return None, why
        with _LOCK:
            _OPEN[config] = remote
    return remote, ""


def _open(url: str, shown: str, mode: str, timeout: float) -> Tuple[Optional[Remote], str]:
    try:
        signer, trusted = signing.keys()
    except ImportError as e:
        return None, _missing(shown, e)
    if not trusted:
        return None, (f"remote cache {shown} not used: no {settings.REMOTE_CACHE_SECRET.name} and no "
                      f"{settings.REMOTE_CACHE_TRUSTED_KEYS.name} to verify its entries with")
    if mode != "read" and signer is None:
        once(f"remote cache {shown}: reading only (no {settings.REMOTE_CACHE_SIGNING_KEY.name} or "
             f"{settings.REMOTE_CACHE_SECRET.name} to sign entries with)")
    try:
        store = stores.open_store(url, timeout)
    except ImportError as e:
        return None, _missing(shown, e)
    except Exception as e:  # noqa: BLE001 - a URL fsspec cannot open is a store that is not there
        return None, f"remote cache {shown} not used: {type(e).__name__}: {e}".splitlines()[0]
    return Remote(url, shown, store, signer, trusted, read=mode != "write",
                  write=mode != "read" and signer is not None, timeout=timeout), ""


def _missing(shown: str, error: ImportError) -> str:
    return f"remote cache {shown} not used: {error.name or error} is not installed (pip install 'kernelkit[remote]')"
