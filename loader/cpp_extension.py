"""``torch.utils.cpp_extension``'s JIT half, through kernelkit: switch with one import.

    from kernelkit import cpp_extension          # was: from torch.utils import cpp_extension
    ext = cpp_extension.load("my_ext", ["my_ext.cpp", "my_kernel.cu"], extra_cuda_cflags=["-O3"])

``load`` and ``load_inline`` take torch's arguments in torch's order and return what torch returns, built
through kernelkit's content-addressed cache (one cached object per source, no ninja, errors mapped to your
lines, no ``_v1``/``_v2`` names after an edit). Everything else (``include_paths``, ``CUDA_HOME``,
``BuildExtension``, ``CUDAExtension``, ...) is torch's own, so setup.py code keeps working unchanged.

Code you cannot edit (a third-party package calling ``torch.utils.cpp_extension.load``) is routed through
kernelkit by :func:`patch_torch`, by ``python -m kernelkit.patch script.py ...``, or by
``KERNELKIT_PATCH_TORCH=1`` (see :mod:`kernelkit.patch`).
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
from typing import Callable, Dict, List

from .jit.toolchain import cpp_extension as _torch_cpp_extension
from .loading import load, load_inline

__all__ = ["load", "load_inline", "include_paths", "library_paths", "CUDA_HOME", "BuildExtension", "CppExtension",
           "CUDAExtension", "verify_ninja_availability", "is_ninja_available", "get_default_build_root",
           "patch_torch", "unpatch", "is_patched"]

log = logging.getLogger("kernelkit")
_ROUTED = ("load", "load_inline")
_ORIGINALS: Dict[str, Callable] = {}  # torch's functions while the patch is on
_ANNOUNCED: List[bool] = []
#: torch's keywords kernelkit does not build: such calls go to torch's own function
_TORCH_ONLY = ("sycl_sources", "extra_sycl_cflags", "with_sycl")


def patch_torch() -> bool:
    """Route ``torch.utils.cpp_extension.load``/``load_inline`` through kernelkit for every caller in this
    process (third-party packages too), with torch's signature and results. Returns False if it was on already.

    Calls that pass SYCL arguments go to torch's own function. A module that bound torch's function to its own
    name before the patch (``from torch.utils.cpp_extension import load`` run earlier) keeps calling torch:
    patch first (``python -m kernelkit.patch`` patches before the script runs); such modules are named in a
    warning. :func:`unpatch` restores torch's functions.
    """
    torch_ext = _torch_cpp_extension()
    if _ORIGINALS:
        return False
    for name in _ROUTED:
        original = getattr(torch_ext, name)
        _ORIGINALS[name] = original
        setattr(torch_ext, name, _routed(name, original))
    if not _ANNOUNCED:
        _ANNOUNCED.append(True)
        print("kernelkit: torch.utils.cpp_extension.load/load_inline are routed through kernelkit's cache "
              "(kernelkit.cpp_extension.unpatch() restores torch's)", file=sys.stderr)
    _warn_early_bindings()
    return True


def unpatch() -> bool:
    """Restore torch's ``load``/``load_inline``. Returns False if the patch was not on."""
    if not _ORIGINALS:
        return False
    torch_ext = _torch_cpp_extension()
    for name, original in _ORIGINALS.items():
        if getattr(getattr(torch_ext, name), "__kernelkit_routed__", False):
            setattr(torch_ext, name, original)
    _ORIGINALS.clear()
    return True


def is_patched() -> bool:
    return bool(_ORIGINALS)


def _routed(name: str, original: Callable) -> Callable:
    signature = inspect.signature(original)
    ours = {"load": load, "load_inline": load_inline}[name]

    @functools.wraps(original)
    def routed(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)  # torch's own TypeError for a call torch would refuse
        if any(bound.arguments.get(k) for k in _TORCH_ONLY):
            return original(*args, **kwargs)
        return ours(*args, **kwargs)

    routed.__kernelkit_routed__ = True
    return routed


def _warn_early_bindings() -> None:
    """Name the modules that hold torch's functions under their own names (their calls are not routed)."""
    originals = {id(f): n for n, f in _ORIGINALS.items()}
    holders = []
    for mod_name, module in list(sys.modules.items()):
        if mod_name.startswith(("torch.", "kernelkit.")) or module is None:
            continue
        found = [f"{attr}" for attr, value in list(getattr(module, "__dict__", {}).items()) if id(value) in originals]
        holders += [f"{mod_name}.{attr}" for attr in found]
    if holders:
        log.warning("kernelkit.patch_torch: %s bound torch's function before the patch and keep calling torch's "
                    "loader; patch before importing them (python -m kernelkit.patch, or KERNELKIT_PATCH_TORCH=1)",
                    ", ".join(sorted(holders)[:5]) + (" ..." if len(holders) > 5 else ""))


def __getattr__(name: str):
    """Every other name is torch's (read when asked, so torch's module stays the one source of truth)."""
    try:
        return getattr(_torch_cpp_extension(), name)
    except AttributeError:
        raise AttributeError(f"module 'kernelkit.cpp_extension' has no attribute {name!r} (nor has "
                             "torch.utils.cpp_extension)") from None


def __dir__():
    return sorted(set(__all__) | set(dir(_torch_cpp_extension())))
