"""The launcher: kernelkit's small C++ module (``loader/csrc/launch.cpp``) that loads cubins and packs
arguments into ``cuLaunchKernel``, built once per Python/compiler into the cache like any target."""
from __future__ import annotations

import threading

import torch

from ..jit import api, toolchain
from ..jit import build as _build
from ..jit.library import import_extension
from ..jit.nvrtc import cuda_include_dir
from ..jit.plan import make_target

MODULE_NAME = "_kernelkit_launch"
SOURCE = toolchain.CSRC / "launch.cpp"
_LOCK = threading.Lock()
_MODULE = []


def target() -> _build.Target:
    text = SOURCE.read_text()
    include = cuda_include_dir()
    flags = [f"-I{include}"] if include is not None else []
    unit = _build.plan_unit("cpp", SOURCE, text, [toolchain.INCLUDE], flags, [], "kernelkit/launch.cpp", optimize="-O2")
    return make_target("launch", [unit], False, MODULE_NAME, [], {"kernelkit/launch.cpp": text.splitlines()})


def module():
    """The launcher module, built on first use (about a second) and then loaded from the cache."""
    if _MODULE:
        return _MODULE[0]
    with _LOCK:
        if not _MODULE:
            so, _, _ = api.obtain(target())
            mod = import_extension(MODULE_NAME, so)
            mod.init(torch.Tensor, torch._C._cuda_getCurrentRawStream, torch.cuda.current_device)
            _MODULE.append(mod)
    return _MODULE[0]
