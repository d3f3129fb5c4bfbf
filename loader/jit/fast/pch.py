"""Precompiled headers of torch's headers, for host TUs that start with them: <kernelkit/binding.h> (a card's
binding), a split host TU's preamble, and the torch header a C++ file includes first (an extension's ``.cpp``,
load_inline's ``main.cpp``). Why: gcc parses torch's headers in ~25 s per TU; with the PCH a binding or host edit
skips that. A missing PCH is built in a detached process (at once on 4+ cores, else niced once the
build that wanted it is done), verified by sha256 before use; a PCH gcc cannot read is dropped and the TU
compiled without it. KERNELKIT_PCH=off (or KERNELKIT_FAST=off) turns it off.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from ... import settings
from ...errors import BuildError
from .. import cache, keys, running, sources, syntax, toolchain
from ..progress import say
from ..running import count, state
from ..sources import INCLUDE, digest_tree, scan_includes
from ..units import Target, Unit

log = logging.getLogger("kernelkit")

_PCH_BUILDER = r"""
import hashlib, json, os, subprocess, sys
niceness, tmp, gch, meta, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
os.nice(niceness)
try:
    if subprocess.run(cmd + ["-o", tmp], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode == 0:
        h = hashlib.sha256()
        with open(tmp, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        os.chmod(tmp, 0o600)
        record = {"file": os.path.relpath(gch, os.path.dirname(meta)), "sha256": h.hexdigest(),
                  "size": os.path.getsize(tmp)}
        with open(meta + ".tmp", "w") as f:
            json.dump(record, f)
        os.chmod(meta + ".tmp", 0o600)
        os.replace(meta + ".tmp", meta)
        os.replace(tmp, gch)
finally:
    if os.path.exists(tmp):
        os.unlink(tmp)
"""  # run detached by `python -c`, holding the claim's flock (an inherited descriptor) until it exits
_PCH_ANNOUNCED = False
PCH_AT_ONCE_CPUS = 4
_PCH_FAILED = re.compile(r"reading precompiled header|PCH file")


def enabled() -> bool:
    """KERNELKIT_PCH=off (or KERNELKIT_FAST=off) turns the precompiled header off; it is on with gcc otherwise."""
    return settings.fast_path("pch") and toolchain.is_gcc()


def at_once() -> bool:
    """Whether a missing PCH is built as soon as a compile wants it: with 4 cores or more, or KERNELKIT_PCH=on.
    Otherwise once the build that wanted it is done, niced: its ~25 s of a core would slow a small machine's
    build, and a host edit comes minutes later."""
    return settings.PCH.get() == "on" or (os.cpu_count() or 1) >= PCH_AT_ONCE_CPUS


def plan(unit: Unit) -> Optional[Tuple[Path, str, List[str]]]:
    """Where the precompiled header for this TU's flags lives, its file there, and the command making it; None for
    a TU that starts with no header worth it."""
    if unit.pch_header is not None:
        return _preamble_plan(unit, unit.pch_header)
    if unit.pch_defines is not None:
        return _binding_plan(unit)
    return _leading_plan(unit) if unit.kind == "cpp" and unit.uses_torch else None


def _preamble_plan(unit: Unit, header: Path) -> Tuple[Path, str, List[str]]:
    """A split host TU's preamble, keyed by its text, what it reads outside the toolchain, and the TU's flags but
    what its ``<...>`` includes cannot see: the include dirs of generated files (gcc does not need -I to match),
    the user's ``-iquote`` dir, and ``-DTORCH_EXTENSION_NAME`` (torch's headers never use it, so gcc accepts the PCH
    under any name). One PCH serves every edit of the file, and every extension with the same includes and flags."""
    text = header.read_text()
    deps, _, roots = keys.unit_inputs("cpp", header, text, unit.flags)
    generated = {f"-I{d}" for d in unit.local_dirs}
    flags, tokens = [], iter(unit.flags)
    for f in tokens:
        if f == "-iquote":
            next(tokens, None)
        elif f not in generated and not f.startswith("-DTORCH_EXTENSION_NAME="):
            flags.append(f)
    key = keys.pch_key(toolchain.fingerprint(), flags, [], digest_tree(text.encode(), deps, roots))
    return cache.subdir("pch") / key, f"{header.name}.gch", [toolchain.cxx(), *flags,
                                                              *[f"-I{d}" for d in unit.local_dirs], "-x",
                                                              "c++-header", str(header)]


def _leading_plan(unit: Unit) -> Optional[Tuple[Path, str, List[str]]]:
    """A C++ file whose first line is ``#include <h>`` for a header of torch's: ``h`` precompiled with the file's
    flags (less ``-DTORCH_EXTENSION_NAME``, which torch's headers never use: gcc checks that a macro defined only at
    use does not touch the PCH), and found by gcc as ``<root>/h.gch`` ahead of ``h`` itself. A header of that name
    among the file's own include dirs (outside the toolchain's) is the user's, and gets none."""
    name = syntax.leading_include(cache.source_bytes(unit.path).decode("utf-8", "surrogateescape"))
    if name is None or any((d / name).is_file() for d in sources.include_search(unit.flags, False,
                                                                              keys.toolchain_dirs()).angle):
        return None
    torch_dirs = [Path(p).resolve() for p in toolchain.torch_include_paths(False)]
    search = sources.include_search(unit.flags, False)
    header = next((d / name for d in search.angle if (d / name).is_file()), None)
    if header is None or not sources.under(header.resolve(), torch_dirs):
        return None
    flags = [f for f in unit.flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    text = header.read_text(errors="replace")
    deps, _, roots = keys.unit_inputs("cpp", header, text, flags)
    key = keys.pch_key(toolchain.fingerprint(), flags, [f"<{name}>"], digest_tree(text.encode(), deps, roots))
    return cache.subdir("pch") / key, f"{name}.gch", [toolchain.cxx(), *flags, "-x", "c++-header", str(header)]


def _binding_plan(unit: Unit) -> Tuple[Path, str, List[str]]:
    """The precompiled <kernelkit/binding.h>: card include dirs are left out (gcc does not need -I to match),
    so every card shares one PCH."""
    kept = {*toolchain.torch_include_paths(True), *toolchain.torch_include_paths(False), str(INCLUDE),
            toolchain.python_include()}
    flags, tokens = [], iter(unit.flags)
    for f in tokens:
        group = [f, next(tokens, "")] if f == "-I" else [f]  # -I dir: two tokens
        inc = group[-1] if f == "-I" else f[2:] if f.startswith("-I") else None
        if inc is None or inc in kept:
            flags += group
    defines = [f"-D{d}" for d in unit.pch_defines or []]
    header = INCLUDE / "kernelkit" / "binding.h"
    forced = keys.forced_files(sources.include_search(flags, False, keys.toolchain_dirs()))  # read before it
    deps, _ = scan_includes(header.read_text(), header.parent, [INCLUDE], forced=forced)
    key = keys.pch_key(toolchain.fingerprint(), flags, defines, digest_tree(header.read_bytes(), deps, [INCLUDE]))
    cmd = [toolchain.cxx(), *flags, *defines, "-x", "c++-header", str(header)]
    return cache.subdir("pch") / key, "kernelkit/binding.h.gch", cmd


def flags(unit: Unit, target: Optional[Target] = None) -> List[str]:
    """Flags that use a ready, verified PCH; if there is none yet, start building it in a detached
    process (it outlives this one and is renamed into place when complete), so this build is not slowed:
    at once, or when ``target``'s build is done (``at_once``)."""
    planned = plan(unit) if enabled() else None
    if planned is None:
        return []
    root, gch, cmd = planned
    if cache.pch_ready(root):
        count("pch_used")
        return [f"-I{root}", "-Winvalid-pch"]  # gcc skips a PCH it cannot use and reads the header
    current = state(target) if target is not None else None
    if current is None or at_once():
        _start_pch_build(root, gch, cmd)
    else:  # the build's cores are free once it is done: then, niced
        current.later[f"pch {root}"] = lambda: _start_pch_build(root, gch, cmd, nice=True)
    return []


def _start_pch_build(root: Path, gch_name: str, cmd: List[str], nice: bool = False) -> None:
    """Start the detached PCH builder unless one is at work (it holds the claim's flock until it exits,
    so a killed builder never blocks the next); a dead builder's partial files are removed first. ``nice``:
    at the lowest priority (after a build on a small machine, whose user's work comes first)."""
    global _PCH_ANNOUNCED
    with cache.writing(root):
        (root / gch_name).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = cache.try_flock(root / cache.PCH_CLAIM)
    if fd is None:
        return
    try:
        cache.drop_pch(root)
        gch = root / gch_name
        tmp = gch.with_name(f".{gch.name}.{os.getpid()}")
        subprocess.Popen([sys.executable, "-c", _PCH_BUILDER, "19" if nice else "0", str(tmp), str(gch),
                          str(root / cache.PCH_META), *cmd],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, pass_fds=(fd,))
    finally:
        os.close(fd)  # the builder's inherited copy keeps the claim
    count("pch_builds")
    if not _PCH_ANNOUNCED:
        _PCH_ANNOUNCED = True
        say("building a precompiled header of torch's headers in the background (~25 s of one core, once per "
            "set of flags); later compiles of bindings and host code use it. KERNELKIT_PCH=0 turns this off.")


def _drop_pch(unit: Unit) -> None:
    root, _, _ = plan(unit)  # planned: the unit was compiled with it
    fd = cache.try_flock(root / cache.PCH_CLAIM)
    if fd is not None:
        try:
            cache.drop_pch(root)
        finally:
            os.close(fd)



def compile_with_pch(unit: Unit, target: Target, out: Path, depfile: Path) -> Optional[dict]:
    """The unit compiled with its ready PCH; None where it wants none or none is ready yet (one is started)."""
    pch = flags(unit, target)
    if not pch:
        return None
    what, deps = f"compiling {unit.display}", ["-MD", "-MF", str(depfile)]
    try:
        output = running.run_tool(unit.command(out, pch + deps), what, target, "compiles")
    except BuildError as e:
        if not _PCH_FAILED.search(e.log):
            raise
        count("pch_rejected")  # a hard error, not a skip: drop the PCH, compile without it
        log.warning("a precompiled header could not be read for %s; dropping it and compiling without", unit.display)
        _drop_pch(unit)
        running.run_tool(unit.command(out, deps), what, target, "compiles")
        return {}
    if "invalid-pch" in output:  # still correct (gcc read the header), just not faster
        count("pch_rejected")
        log.warning("a precompiled header was not usable for %s:\n%s", unit.display, output[-800:])
    return {}
