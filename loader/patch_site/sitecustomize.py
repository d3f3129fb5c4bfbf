"""Applies kernelkit's torch.utils.cpp_extension patch in a Python process started with this directory on
PYTHONPATH and KERNELKIT_PATCH_TORCH=1 (``python -m kernelkit.patch`` sets both for its children); then runs
the sitecustomize this one shadows, if there is one."""
import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _patch() -> None:
    from kernelkit import patch

    if patch.wanted():
        patch.patch_when_imported()


try:
    _patch()
except ImportError as e:  # kernelkit not importable in this interpreter: run unpatched, and say so
    sys.stderr.write(f"kernelkit.patch: not applied in this process ({e})\n")
_chain()
