"""The launcher: kernelkit's small C++ module (``loader/csrc/launch.cpp``) that loads cubins and packs
arguments into ``cuLaunchKernel``, built once per Python into the cache like any target.

A warm start finds it through a small record (its path and sha256, keyed by the source and the Python)
instead of planning its build, which would import the whole build machinery: that keeps a new process's
first instant kernel within milliseconds of ``import kernelkit``.
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
from pathlib import Path
from typing import Optional

import torch

from .. import replace_file, settings
from ..errors import CacheSecurityError
from ..jit import cache, keys
from ..jit.library import import_extension
from ..jit.sources import CSRC, INCLUDE, sha256_file
from ..version import __version__

MODULE_NAME = "_kernelkit_launch"
SOURCE = CSRC / "launch.cpp"
_LOCK = threading.Lock()
_MODULE = []


def target():
    """The launcher's build target, planned like any other (``kernelkit.aot`` and the tests use it too)."""
    from ..jit import plan, units  # the build machinery: only when the launcher is built
    from ..jit.nvrtc import cuda_include_dir

    text = SOURCE.read_text()
    include = cuda_include_dir()
    flags = [f"-I{include}"] if include is not None else []
    unit = units.plan_unit("cpp", SOURCE, text, [INCLUDE], flags, [], "kernelkit/launch.cpp", optimize="-O2")
    return plan.make_target("launch", [unit], False, MODULE_NAME, [], {"kernelkit/launch.cpp": text.splitlines()})


def _record() -> Path:
    key = keys.launcher_record_key(SOURCE.read_bytes(), sys.version, sys.prefix, torch.__version__, __version__)
    return cache.record_path("launcher", key)


def _recorded() -> Optional[Path]:
    """The launcher built before for this source and Python, if its record and its library check out
    (KERNELKIT_FAST=off: never, the launcher is planned)."""
    if not settings.fast_path("records"):
        return None
    try:
        record = json.loads(_record().read_text())
        so = Path(record["so"])
        cache.check_safe(so)
        return so if sha256_file(so) == record["sha256"] else None
    except (OSError, ValueError, KeyError, TypeError, CacheSecurityError):
        return None


def _built() -> Path:
    from ..jit import obtain  # planning and building: a cold start only

    so, _, _ = obtain.obtain(target())
    with contextlib.suppress(OSError):  # without a record the next start plans again: slower, still right
        replace_file.write(_record(), json.dumps({"so": str(so), "sha256": sha256_file(so)}))
    return so


def module():
    """The launcher module, built on first use (about a second) and then loaded from the cache."""
    if _MODULE:
        return _MODULE[0]
    with _LOCK:
        if not _MODULE:
            so = _recorded() or _built()
            mod = import_extension(MODULE_NAME, so)
            mod.init(torch.Tensor, torch._C._cuda_getCurrentRawStream, torch.cuda.current_device)
            _MODULE.append(mod)
    return _MODULE[0]
