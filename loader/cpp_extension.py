"""``torch.utils.cpp_extension``'s JIT half, through kernelkit: switch with one import.

    from kernelkit import cpp_extension          # was: from torch.utils import cpp_extension
    ext = cpp_extension.load("my_ext", ["my_ext.cpp", "my_kernel.cu"], extra_cuda_cflags=["-O3"])

``load`` and ``load_inline`` take torch's arguments in torch's order and return what torch returns, built
through kernelkit's content-addressed cache (one cached object per source, no ninja, errors mapped to your
lines, no ``_v1``/``_v2`` names after an edit). Everything else (``include_paths``, ``CUDA_HOME``,
``BuildExtension``, ``CUDAExtension``, ...) is torch's own, so setup.py code keeps working unchanged.
"""
from __future__ import annotations

from .jit.api import load, load_inline
from .jit.toolchain import cpp_extension as _torch_cpp_extension

__all__ = ["load", "load_inline", "include_paths", "library_paths", "CUDA_HOME", "BuildExtension", "CppExtension",
           "CUDAExtension", "verify_ninja_availability", "is_ninja_available", "get_default_build_root"]


def __getattr__(name: str):
    """Every other name is torch's (read when asked, so torch's module stays the one source of truth)."""
    try:
        return getattr(_torch_cpp_extension(), name)
    except AttributeError:
        raise AttributeError(f"module 'kernelkit.cpp_extension' has no attribute {name!r} (nor has "
                             "torch.utils.cpp_extension)") from None


def __dir__():
    return sorted(set(__all__) | set(dir(_torch_cpp_extension())))
