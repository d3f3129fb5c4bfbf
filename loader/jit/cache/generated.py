"""Generated and inline sources in ``src/<key>/``, under the hash of their text and name; a read-only cache keeps
them in memory until a build (``require_writable``) writes them or says why it cannot."""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Dict

from ... import replace_file
from ...errors import CacheUnwritable
from ..sources import sha256_bytes
from .files import holds
from .root import cache_dir, raise_uncreated, subdir, writing

_PENDING_LOCK = threading.Lock()


def require_writable() -> Path:
    """The cache directory, for a build: raises the reason it or a subdirectory could not be created, if one
    could not, and writes the generated sources a read-only cache left in memory (or raises why it cannot)."""
    path = cache_dir()
    with _PENDING_LOCK:  # builds run in threads (autotune, a card's units): one of them writes what is pending
        raise_uncreated(path)
        for source, data in [(f, b) for f, b in _UNWRITTEN.items() if f.is_relative_to(path)]:
            if not holds(source, data):
                _write_source(source, data)
            del _UNWRITTEN[source]
    return path


def write_source(text: str, filename: str) -> Path:
    """Generated or inline sources live in the cache under their content hash, written again when the
    file there is not that text (truncated by a full disk, or tampered with). A read-only cache leaves the
    text in memory: planning and loading a cached or prebuilt library need only the path and the text, and a
    build (``require_writable``) writes it or says why it cannot."""
    data = text.encode()
    path = cache_dir() / "src" / generated_source_key(data, filename) / filename
    if not holds(path, data):
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
