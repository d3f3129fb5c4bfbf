"""Run builds: translation units become content-addressed objects, objects become a library.

Why not one ``torch.utils.cpp_extension.load`` call per build: its freshness is ninja mtimes in one
build dir per name, so a content-keyed library would recompile every TU on every edit. Here each TU is
its own cache entry, so a kernel-body edit recompiles the small torch-free device TU (~1 s) and relinks,
while the torch-facing binding TU (~15-40 s) is compiled once per header content. Include paths, library
paths and nvcc flags still come from torch.utils.cpp_extension.

This is the core: every unit compiled by its compiler as written, linked against torch. The fast paths
(``jit.fast``) are asked first at each step and the core does the plain thing where they answer None.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import List, Optional, Tuple

from ..errors import BuildError, KernelkitError, SourcesChanged
from . import cache, commands, fast, inputs, keys, running, sources, toolchain
from .advice import SLOW_TORCH_UNIT_SECONDS, torch_cost_advice
from .progress import Status, say
from .running import build_state, in_parallel, private_dir, state
from .sources import sha256_file
from .units import Target, Unit, target_key

log = logging.getLogger("kernelkit")


def _link(target: Target, cmd: List[str]) -> None:
    """Link; a file the link flags name that changed since planning or during the link fails the build,
    so a library is never cached under the key of an archive's old content."""
    files = sources.link_inputs(target.ldflags, keys.toolchain_dirs())
    before = sources.snapshot(files)

    def changed(when: str) -> SourcesChanged:
        named = ", ".join(map(str, files)) or "one of them, now removed"
        return SourcesChanged(f"{target.name}: a file the link flags name ({named}) {when}; nothing was cached. "
                              "Load again to build what is on disk now.")

    if target_key(target.name, target.units, target.ldflags) != target.key:
        raise changed("changed after planning")
    try:
        if not fast.link(target, cmd):
            running.run_tool(cmd, f"linking {target.name}", target, "links")
    except BuildError:
        if sources.snapshot(files) != before:  # the linker read an archive half written by an edit
            raise changed("changed while it was being linked") from None
        raise
    if sources.snapshot(files) != before:
        raise changed("changed while it was being linked")


def compile_as_written(unit: Unit, target: Target, out: Path, depfile: Path) -> dict:
    """Run the compiler on the unit's file (unless a fast path compiles it faster); what it learned, to be kept
    with the object."""
    made = fast.compile_as_written(unit, target, out, depfile)
    if made is None:
        running.run_tool(unit.command(out, ["-MD", "-MF", str(depfile)]), f"compiling {unit.display}", target, "compiles")
    return {**(made or {}), **fast.facts(unit)}


def compile_cached(unit: Unit, target: Target) -> Path:
    """The unit's object, compiled unless cached; pinned for the link when a build() is running."""
    for _ in range(3):
        pinned = _pin(_compile_once(unit, target), target)
        if pinned is not None:
            return pinned
    raise KernelkitError(f"the object of {unit.display} kept being removed from the cache while this build "
                         "needed it (a `kernelkit cache clear` or gc in a loop?)")


CORE = fast.Core(compile_cached, compile_as_written)


def _pin(obj: Path, target: Target) -> Optional[Path]:
    """A hard link to ``obj`` in the build's private dir (None: gc or clear removed it just now)."""
    current = state(target)
    if current is None:
        return obj
    pin = current.pins / obj.name
    try:
        os.link(obj, pin)
    except FileExistsError:  # the same TU twice in one target
        pass
    except FileNotFoundError:
        return None
    except OSError:  # a filesystem without hard links: a copy pins it as well
        try:
            shutil.copyfile(obj, pin)
        except FileNotFoundError:
            return None
    return pin


def _compile_once(unit: Unit, target: Target) -> Path:
    hit = cache.cached_object(unit.key)
    if hit:
        return hit
    with cache.locked(unit.key, unit.display):
        hit = cache.cached_object(unit.key, held=True)  # another process may have built it while we waited
        if hit:
            return hit
        cache.touch_source(unit.path)
        before = inputs.snapshot(unit)
        if unit.digest and not inputs.as_planned(unit):  # nothing to compile: it could not be cached
            raise inputs.changed_error(unit, target, before, during=False)
        with private_dir("obj-") as tmp:
            out, depfile = tmp / f"{unit.key}.o", tmp / f"{unit.key}.d"
            try:
                made = _compile_to(unit, target, out, depfile)
            except BuildError:
                # the compiler may have read a file half-written by an edit: that is no error in the sources
                if unit.digest and (inputs.snapshot(unit) != before or not inputs.as_planned(unit)):
                    raise inputs.changed_error(unit, target, before, during=True) from None
                raise
            if unit.digest:
                inputs.check(unit, target, depfile, before)
            info = {"display": unit.display, "kind": unit.kind, **made}
            obj = cache.store_object(unit.key, out, info)
            fast.stored(unit, info)
            commands.remember(unit, unit.command(out, ["-MD", "-MF", str(depfile)]), made)
            return obj


def _compile_to(unit: Unit, target: Target, out: Path, depfile: Path) -> dict:
    made = fast.compile(unit, target, out, depfile, CORE)
    return made if made is not None else compile_as_written(unit, target, out, depfile)


def _compile_noting_torch_cost(unit: Unit, target: Target, fresh: bool) -> Path:
    """Compile; when a .cu that includes torch was slow to compile, say once what it cost and how to avoid it."""
    t0 = time.perf_counter()
    obj = compile_cached(unit, target)
    seconds = time.perf_counter() - t0
    # a unit a fast path claimed (a torch-style .cu: jit.fast.torch_cu) says itself what it did and why
    if fresh and unit.kind == "cu" and unit.uses_torch and not unit.strategy and seconds >= SLOW_TORCH_UNIT_SECONDS:
        torch_cost_advice(unit, seconds, "")
    return obj


def _label(unit: Unit) -> str:
    return f"{unit.display} in {unit.shard[1]} dtype shards" if unit.shard else unit.display


def build(target: Target) -> Tuple[Path, bool, float]:
    """Return (path of the verified .so, whether it came from the cache, seconds spent building)."""
    built = _build(target)
    commands.after_build(target)  # KERNELKIT_COMPILE_COMMANDS=DIR: the editors' database, kept current
    return built


def _build(target: Target) -> Tuple[Path, bool, float]:
    so = cache.verified_library(target.name, target.key)
    if so is not None:
        return so, True, 0.0

    cache.require_writable()

    def waiting() -> None:
        say(f"waiting for another process that is building {target.name} ...")

    with cache.locked(cache.library_lock(target.name, target.key), target.name, on_wait=waiting):
        so = cache.verified_library(target.name, target.key, held=True)
        if so is not None:
            return so, True, 0.0
        todo = [u for u in target.units if cache.cached_object(u.key) is None]
        names = ", ".join(dict.fromkeys(_label(u) for u in todo)) or "link only"
        reused = len(target.units) - len(todo)
        desc = f"building {target.name} [{names}]" + (f", {reused} cached object(s) reused" if reused else "")
        t0 = time.perf_counter()
        with Status(desc), build_state(target) as current:
            objects = in_parallel(lambda u: _compile_noting_torch_cost(u, target, u in todo), target.units, target)
            with private_dir(f"lib-{target.name}-") as tmp:
                out = tmp / target.so_name
                cmd = [toolchain.cxx(), *[str(o) for o in objects], "-o", str(out), *target.ldflags,
                       *target.import_alias_flags()]
                _link(target, cmd)
                seconds = time.perf_counter() - t0
                manifest = {
                    "name": target.name, "key": target.key, "so": target.so_name, "sha256": sha256_file(out),
                    "created": time.time(), "build_seconds": round(seconds, 3), "pymodule": target.pymodule,
                    "units": [{"file": u.display, "key": u.key} for u in target.units],
                    "fingerprint": toolchain.fingerprint(),
                }
                cache.write_manifest(tmp, manifest)
                os.chmod(out, 0o700)
                os.chmod(tmp, 0o700)
                entry = cache.publish_library(tmp, target.name, target.key)
    for work in current.later.values():  # the build's cores are free now
        work()
    cache.maybe_gc()
    return entry / target.so_name, False, seconds

