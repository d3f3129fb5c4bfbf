"""Files replaced whole: written under a temporary name of their own in the target's directory, then renamed over
the target, so a reader sees the old file or the new one, never a torn one. The temporary name is unique per
call (not per process), because builds and autotune write the same cache files from several threads."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Union


def write(path: Path, data: Union[bytes, str]) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8), private (0600) as everything in the cache is. An OSError
    leaves no temporary file behind and propagates."""
    _replace(path, lambda f, _tmp: f.write(data.encode() if isinstance(data, str) else data))


def copy(src: Path, dst: Path) -> None:
    """Replace ``dst`` with a copy of ``src``, its permission bits and times included (as ``shutil.copy2``)."""
    def fill(f: BinaryIO, tmp: str) -> None:
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f)
        f.flush()  # before the times are copied: a later flush would set them again
        shutil.copystat(src, tmp)

    _replace(dst, fill)


def copy_executable(src: Path, dst: Path) -> None:
    """``copy`` for a program: written by a child process (``cp``), because a write descriptor of this process,
    which another thread's fork hands its child until that child execs, makes running the file fail with
    ETXTBSY ("Text file busy") for that while."""
    tmp = str(dst.parent / f".{dst.name}.{uuid.uuid4().hex}.tmp")  # cp creates it: this process never opens it
    try:
        proc = subprocess.run(["cp", "--preserve=mode,timestamps", str(src), tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise OSError(f"copying {src} to {dst} failed: {proc.stderr.strip()}")
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _replace(path: Path, fill: Callable[[BinaryIO, str], object]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
