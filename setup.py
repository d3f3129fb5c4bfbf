"""Opt-in ahead-of-time build. pyproject.toml holds the package's configuration; this file only adds the
prebuilt card libraries when asked:

    KERNELKIT_AOT=1 [KERNELKIT_ARCH=8.0,9.0] [KERNELKIT_AOT_OPS=sigmoid,vector_add] \
        pip install --no-build-isolation .        # or: pip wheel --no-build-isolation --no-deps .

(KERNELKIT_AOT_KERNELS_DIR: build the cards of another directory; KERNELKIT_AOT_BUILD_DIR: build dir.)

``--no-build-isolation``: the build compiles against the torch that will run it (the prebuilt libraries
are matched by torch version at load time). Without KERNELKIT_AOT, ``pip install [-e] .`` compiles
nothing and kernelkit builds cards just in time.
"""
import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent

DEPENDENCIES = [
    "torch>=2.6",
    "ninja",
    "filelock>=3.12",
    "platformdirs>=3",
    "numpy",
    "matplotlib",
    "scipy",
    "wurlitzer>=3.1",  # device printf in the cell: C-level fd capture (kernelkit.inspect.capture)
    "tree-sitter>=0.23",  # the split of torch-style .cu files parses them (kernelkit.jit.fast.split)
    "tree-sitter-cuda>=0.21",
]


def _pinned_to_this_torch(dependencies: list) -> list:
    """A wheel with prebuilt libraries needs the torch they were built against (another one rejects them and
    builds again): its version without the local part, so 2.11.0 matches 2.11.0+cu130 as pip installs it."""
    import torch

    public = torch.__version__.split("+")[0]
    return [f"torch=={public}" if d.startswith("torch") else d for d in dependencies]


def _kernelkit():
    """This tree's kernelkit (not an installed one): its package maps loader/, kernels/, reference/. Importing it
    imports no torch; its settings module reads the KERNELKIT_AOT* variables."""
    spec = importlib.util.spec_from_file_location("kernelkit", HERE / "loader" / "__init__.py",
                                                  submodule_search_locations=[str(HERE / "loader"), str(HERE)])
    kk = importlib.util.module_from_spec(spec)
    sys.modules["kernelkit"] = kk
    spec.loader.exec_module(kk)
    from kernelkit import settings

    return settings


def _aot_kwargs(settings) -> dict:
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("KERNELKIT_AOT=1 compiles against the installed torch, which this build environment lacks: "
                 "run pip with --no-build-isolation (after installing torch)")
    from kernelkit import aot

    ops = settings.AOT_OPS.get().replace(",", " ").split()
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    kwargs = aot.setup_kwargs(ops or None, kernels_dir=settings.AOT_KERNELS_DIR.get())
    kwargs["install_requires"] = _pinned_to_this_torch(DEPENDENCIES)
    base = settings.AOT_BUILD_DIR.get()
    if base:  # out of the tree; objects in <base>/temp are kept between builds (ninja redoes what changed)
        os.makedirs(base, exist_ok=True)
        kwargs["options"] = {"build": {"build_base": str(base)}, "build_ext": {"build_temp": str(base / "temp")},
                             "egg_info": {"egg_base": str(base)}}
    return kwargs


SETTINGS = _kernelkit()
setup(**(_aot_kwargs(SETTINGS) if SETTINGS.AOT.get() else {"install_requires": DEPENDENCIES}))
