"""Run a program with torch.utils.cpp_extension's ``load``/``load_inline`` routed through kernelkit, without
editing it (like ``python -m cProfile``)::

    python -m kernelkit.patch train.py --epochs 3
    python -m kernelkit.patch -m torch.distributed.run --nproc-per-node 8 train.py

The patch is applied when ``torch.utils.cpp_extension`` is first imported, before the program's own
``from torch.utils.cpp_extension import load`` runs, so every way of calling it is routed. Python processes the
program starts (torchrun's ranks, spawned workers) inherit it: this command puts ``KERNELKIT_PATCH_TORCH=1``
and the directory of a small ``sitecustomize`` (which chains to any other ``sitecustomize``) into their
environment. Setting those two yourself does the same for any command; ``KERNELKIT_PATCH_TORCH=1`` alone takes
effect where the program imports kernelkit (``patch_when_imported``). Nothing is installed anywhere.

This module imports neither torch nor the loader: it waits for the program to import torch.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import runpy
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from . import settings

#: the directory holding the sitecustomize that applies the patch in child processes
SITE_DIR = Path(__file__).resolve().parent / "patch_site"
_TARGET = "torch.utils.cpp_extension"


def wanted() -> bool:
    """Whether ``KERNELKIT_PATCH_TORCH`` asks for the patch (on: 1/on/true/yes)."""
    return settings.PATCH_TORCH.get()


def _apply() -> None:
    from .cpp_extension import patch_torch

    patch_torch()


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds torch.utils.cpp_extension through the other finders and patches it once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patching(spec.loader)
                return spec
        return None


class _Patching(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _remove_hook()
        sys.modules[_TARGET] = module  # the import system sets it after exec_module; the patch reads it now
        _apply()


_HOOK: List[_PatchAfterImport] = []


def _remove_hook() -> None:
    while _HOOK:
        hook = _HOOK.pop()
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)


def patch_when_imported() -> None:
    """Patch now if torch.utils.cpp_extension is imported, else as soon as it is (torch is not imported here)."""
    if _TARGET in sys.modules:
        _apply()
    elif not _HOOK:
        _HOOK.append(_PatchAfterImport())
        sys.meta_path.insert(0, _HOOK[0])


def child_environment(env: Optional[dict] = None) -> dict:
    """``env`` (default: this process's) with the patch on for Python processes started with it."""
    env = dict(os.environ if env is None else env)
    env[settings.PATCH_TORCH.name] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *paths])
    return env


def _usage() -> str:
    return "usage: python -m kernelkit.patch [-m module | script.py] [args ...]"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\n" + _usage(), file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    problem = _problem(args)
    if problem:
        print(f"kernelkit.patch: {problem}\n{_usage()}", file=sys.stderr)
        return 2
    os.environ.update({k: v for k, v in child_environment().items() if k in (settings.PATCH_TORCH.name, "PYTHONPATH")})
    patch_when_imported()
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))  # as `python script.py` sets it
        runpy.run_path(args[0], run_name="__main__")
    return 0


def _problem(args: Sequence[str]) -> Optional[str]:
    if args[0] == "-m":
        return None if len(args) > 1 else "-m needs a module name"
    if args[0].startswith("-"):
        return f"unknown option {args[0]} (expected a script, or -m module)"
    if not os.path.isfile(args[0]):
        return f"{args[0]}: no such file (expected a Python script, or -m module)"
    return None


if __name__ == "__main__":
    sys.exit(main())
