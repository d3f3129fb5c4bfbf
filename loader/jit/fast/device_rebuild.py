"""Device-only rebuilds: a .cu whose host side is unchanged (same host shape: its text with device function bodies
left out) gets only its device code compiled (nvcc --fatbin), placed into a copy of the earlier object's
``.nv_fatbin`` section. Why: nvcc's host pass over torch's headers is most of a torch .cu's compile.
KERNELKIT_DEVICE_REBUILD=off (or KERNELKIT_FAST=off) turns it off.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from ... import settings
from ...errors import BuildError
from .. import cache, keys, running, toolchain
from ..units import Target, Unit


def host_shape(unit: Unit) -> Optional[str]:
    """The host shape of a .cu unit's text; None where device code is never rebuilt alone for it (also
    KERNELKIT_DEVICE_REBUILD=off or KERNELKIT_FAST=off: every compile runs nvcc on the whole file)."""
    if unit.kind != "cu" or not unit.digest or not settings.fast_path("device_rebuild"):
        return None
    try:
        return keys.host_shape_key(unit.kind, unit.flags, unit.local_dirs, toolchain.fingerprint(),
                                   toolchain.nvcc_fingerprint(), unit.path.read_text(errors="surrogateescape"),
                                   unit.deps, unit.roots, unit.strategy or "compiler")
    except OSError:  # gone meanwhile: the compile says so
        return None


def compile_device_only(unit: Unit, target: Target, out: Path, depfile: Path) -> Optional[dict]:
    """``out``: an object of the unit's host shape with the device code of its text, when there is such an object
    and a binutils objcopy to do it; None otherwise."""
    shape = host_shape(unit)
    old = cache.shaped_object(shape) if shape else None
    objcopy = shutil.which("objcopy")
    if old is None or objcopy is None:
        return None
    fatbin = out.with_name(out.stem + ".fatbin")
    running.run_tool(toolchain.launcher() + [toolchain.nvcc(), *unit.flags, "--fatbin", str(unit.path), "-o", str(fatbin),
                                     "-MD", "-MF", str(depfile)], f"compiling {unit.display}", target, "compiles")
    try:
        shutil.copyfile(old, out)
        running.run_tool([objcopy, "--update-section", f".nv_fatbin={fatbin}", str(out)],
                 f"placing the device code of {unit.display}", target, "device_rebuilds")
    except (OSError, BuildError):  # removed by a gc meanwhile, or an object without device code
        return None
    return {**facts(unit), "device_only": True}


def facts(unit: Unit) -> dict:
    """What to store with an object compiled as written: its host shape."""
    shape = host_shape(unit)
    return {"shape": shape} if shape else {}


def stored(unit: Unit, info: dict) -> None:
    """Once an object with a host shape is stored (never before: a build that fails its input check must not
    displace the index's last good object), index it so a later text of that shape reuses its host side."""
    if info.get("shape"):
        cache.remember_shape(info["shape"], unit.key)
