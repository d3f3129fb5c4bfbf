"""A card's NVRTC device code (``Spec.nvrtc_sources``): compiled as instant kernels are, launched by name from
the card's compiled binding (``<kernelkit/kernels.h>``).

The binding library is planned, keyed and cached from the card's other files only. The files in
``nvrtc_sources`` are compiled here with NVRTC (``load_kernels``' compile, cache and error mapping), loaded
for the current GPU, and every kernel's handle is handed to the loaded library. An edit of a kernel file
therefore costs one NVRTC compile (tens of milliseconds) and a hand-over: the binding is neither rebuilt
nor relinked, and its ops launch the new kernels from their next call.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import KernelkitError
from ..jit import nvrtc, toolchain
from ..jit.cards import Card
from . import kernels

#: program key -> its build loaded for launching (an unchanged or undone edit reuses its loaded cubin)
_LOADED: Dict[str, "kernels._Build"] = {}


@dataclasses.dataclass(frozen=True)
class CardKernels:
    """A card's NVRTC kernels as one load compiled them; equal when the kernels and where they run are."""

    card: str
    files: Tuple[str, ...]  # the nvrtc_sources as messages name them
    key: str  # over every program compiled: any edit of a kernel file (or its headers) changes it
    problem: str  # why no kernel can launch in this process; "" when they can
    #: one module per file (``kernelkit.KernelModule``: its cubin, kernels, arch), absent when nothing compiled
    modules: Tuple["kernels.KernelModule", ...] = dataclasses.field(default=(), compare=False)
    #: (name expression, CUkernel handle, file, [(size, declaration)]) of each kernel that can launch here
    entries: Tuple[tuple, ...] = dataclasses.field(default=(), compare=False)

    def hand_to(self, lib) -> None:
        """Give ``lib`` (the card's loaded binding) these kernels; its ops launch them from their next call."""
        lib.set_nvrtc_kernels(self.entries, ", ".join(self.files), self.problem)
        lib.nvrtc = self


def _gpu_arch() -> Optional[str]:
    return "{}{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def _archs(arch, compile_only: bool) -> Tuple[List[str], Optional[str]]:
    """(the archs to compile for, the current GPU's or None): ``toolchain.arch_list``'s order, but a process
    without a GPU compiles only when told to.
    Where the list holds the current GPU's arch only that one is compiled: the others would be compile-only
    checks, and the edit path stays one NVRTC compile per file."""
    here = _gpu_arch()
    try:
        wanted = [nvrtc.arch_for(a) for a in toolchain.arch_list(arch, no_gpu=())]
    except ValueError as e:
        raise KernelkitError(str(e)) from None
    if not compile_only and here in [a.rstrip("af") for a in wanted]:
        return [next(a for a in wanted if a.rstrip("af") == here)], here
    return list(dict.fromkeys(wanted)), here


def _problem(archs: Sequence[str], here: Optional[str]) -> str:
    if not archs:
        return "no CUDA device in this process, so the kernels were not compiled (pass arch='9.0' to compile them)"
    built = ", ".join(f"sm_{a}" for a in archs)
    if here is None:
        return f"no CUDA device in this process (compiled for {built} only)"
    return (f"compiled for {built}, but the current GPU is sm_{here}; load the card with arch=None (the current "
            f"GPU) or arch='{here[:-1]}.{here[-1]}'")


def obtain(card: Card, arch=None, include_paths: Sequence[str] = (), *, compile_only: bool = False,
            group=None) -> Optional[CardKernels]:
    """Compile the card's ``nvrtc_sources`` (None when it has none) and, in a process with a GPU of a
    compiled arch, load them there. Compile errors are BuildErrors citing the file and line, as for
    ``load_kernels``. ``compile_only``: every listed arch, nothing loaded (``load(..., load=False)``)."""
    files = card.nvrtc_sources()
    if not files:
        return None
    archs, here = _archs(arch, compile_only)
    dirs = [card.dir] + [Path(p).resolve() for p in include_paths]
    modules, entries, keys, owners = [], [], [], {}
    for path, exprs in files.items():
        if not path.is_file():
            raise KernelkitError(f"card {card.name}: nvrtc_sources: {path} does not exist")
        builds = [kernels.compile_kernels(path, f"{card.name}:{path.name}", include_paths=dirs, arch=a,
                                          name_expressions=exprs, group=group) for a in archs]
        if not builds:
            continue
        keys += [b.program.key for b in builds]
        for name in builds[0].signatures:
            if name in owners:
                raise KernelkitError(f"card {card.name}: kernel {name!r} is defined in both {owners[name]} and "
                                     f"{builds[0].program.display}; kernels are found by name, so give each its own")
            owners[name] = builds[0].program.display
        live = next((b for b in builds if not compile_only and b.program.arch.rstrip("af") == here), None)
        if live is not None:
            live = _LOADED.setdefault(live.program.key, live)
            entries += [(name, handle, live.program.display, params)
                        for name, (handle, params) in live.handles().items()]
        modules.append(kernels.install(live or builds[0]))
    shown = tuple(nvrtc.shown(p) for p in files)
    key = hashlib.sha256("\0".join(keys).encode()).hexdigest()
    return CardKernels(card.name, shown, key, "" if entries or compile_only else _problem(archs, here),
                       tuple(modules), tuple(entries))
