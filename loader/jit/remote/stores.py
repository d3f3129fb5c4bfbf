"""The stores a remote cache lives on, through their own client libraries: any fsspec URL (``file://``, ``s3://``
with s3fs, ``gs://``, ``hf://``, ...) and ``redis://``. A store knows four verbs on named blobs of bytes (get,
put, exists, list) and never learns what it stores; every call is bounded by a deadline, and anything but a
plain miss (a refused connection, a timeout, a full disk) is :class:`Unreachable`. A get may be limited: it then
reads at most ``limit + 1`` bytes (a ranged read), so a blob over its limit is told by its length without the rest
of it crossing the wire or entering memory.

The client libraries are imported when a store is opened, so ``import kernelkit`` stays light.
"""
from __future__ import annotations

import errno
import os
import tempfile
import threading
import urllib.parse
from typing import Callable, List, Optional, TypeVar

T = TypeVar("T")


class Unreachable(Exception):
    """The store did not answer, or answered with an error: the caller builds locally and stops asking it."""


def shown(url: str) -> str:
    """The URL without a password or query, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def bounded(call: Callable[[], T], seconds: float) -> T:
    """``call()``'s result, or Unreachable when it takes more than ``seconds`` (it is left to finish in a daemon
    thread: a hung request must not hold the load, nor the process's exit)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=run, name="kernelkit-remote-cache", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise Unreachable(f"no answer within {seconds:g} s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, (Unreachable, FileNotFoundError)):
            raise error
        raise Unreachable(f"{type(error).__name__}: {error}".splitlines()[0]) from error
    return box["value"]


class FsspecStore:
    """Blobs as files under an fsspec URL; on a local filesystem (``file://``, a mounted team drive) each put is
    written beside its name and renamed into place, so a reader sees all of a blob or none of it."""

    def __init__(self, url: str, timeout: float):
        import fsspec

        protocol = url.split("://", 1)[0].lower()
        options: dict = {"skip_instance_cache": True}
        if protocol in ("s3", "s3a"):  # s3fs: botocore's own deadlines, one attempt (the caller's deadline rules)
            options["config_kwargs"] = {"connect_timeout": timeout, "read_timeout": timeout,
                                        "retries": {"max_attempts": 1}}
        self.fs, root = fsspec.core.url_to_fs(url, **options)
        self.root = root.rstrip("/")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def get(self, name: str, limit: Optional[int] = None) -> Optional[bytes]:
        """The blob, or its first ``limit + 1`` bytes (one ranged request); None if there is none."""
        path = self._path(name)
        try:
            if limit is None:
                return self.fs.cat_file(path)
            return self.fs.cat_file(path, start=0, end=limit + 1)
        except FileNotFoundError:
            return None
        except OSError as e:  # S3 answers any range of an empty object with 416 (s3fs: EINVAL)
            if limit is not None and e.errno == errno.EINVAL and self.fs.size(path) == 0:
                return b""
            raise

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # readable by the team that shares the drive; writable by its writer alone
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self._path(name)))

    def list(self, prefix: str = "") -> List[str]:
        try:
            found = self.fs.find(self._path(prefix).rstrip("/"))
        except FileNotFoundError:
            return []
        root = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        return sorted(str(p)[len(root):] for p in found if str(p).startswith(root))


class RedisStore:
    """Blobs as Redis strings named ``kernelkit:<name>`` in the URL's database (``redis://host:port/db``;
    ``rediss://`` for TLS, a password in the URL or in redis' own ways)."""

    PREFIX = "kernelkit:"

    def __init__(self, url: str, timeout: float):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def get(self, name: str, limit: Optional[int] = None) -> Optional[bytes]:
        """The blob, or its first ``limit + 1`` bytes (GETRANGE, with EXISTS in one transaction: a missing key and
        an empty value both read as b""); None if there is none."""
        if limit is None:
            return self.client.get(self.PREFIX + name)
        with self.client.pipeline() as p:
            there, head = p.exists(self.PREFIX + name).getrange(self.PREFIX + name, 0, limit).execute()
        return head if there else None

    def put(self, name: str, data: bytes) -> None:
        self.client.set(self.PREFIX + name, data)

    def exists(self, name: str) -> bool:
        return bool(self.client.exists(self.PREFIX + name))

    def list(self, prefix: str = "") -> List[str]:
        return sorted(k.decode()[len(self.PREFIX):] for k in self.client.scan_iter(match=f"{self.PREFIX}{prefix}*"))


def open_store(url: str, timeout: float):
    """The store at ``url``: Redis for ``redis://``/``rediss://``/``unix://``, fsspec for every other URL.
    ImportError when its client library is missing (``pip install kernelkit[remote]``)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme in ("redis", "rediss", "unix"):
        return RedisStore(url, timeout)
    return FsspecStore(url if "://" in url else f"file://{os.path.abspath(url)}", timeout)
