"""Plan and run builds: translation units become content-addressed objects, objects become a library.

Why not one ``torch.utils.cpp_extension.load`` call per build: its freshness is ninja mtimes in one
build dir per name, so a content-keyed library would recompile every TU on every edit. Here each TU is
its own cache entry, so a kernel-body edit recompiles the small torch-free device TU (~1 s) and relinks,
while the torch-facing binding TU (~15-40 s) is compiled once per header content. Include paths, library
paths and nvcc flags still come from torch.utils.cpp_extension.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import cache, toolchain
from .errors import BuildError, parse_diagnostics
from .progress import Status, say
from .sources import digest_tree, scan_includes, sha256_bytes, sha256_file

log = logging.getLogger("kernelkit")

#: counters a test (or a curious user) can read: how many compiler/linker processes this process ran
STATS = {"compiles": 0, "links": 0, "pch_builds": 0, "pch_used": 0, "pch_rejected": 0}


@dataclasses.dataclass
class Unit:
    """One translation unit: compiled alone, cached by ``key``."""

    kind: str  # "cu" or "cpp"
    path: Path  # the file handed to the compiler
    display: str  # its name as the user knows it
    flags: List[str]
    key: str
    deps: List[Path]
    digest: str = ""  # the TU's text + local headers, by content (what an AOT source key is made of)
    pch_defines: Optional[List[str]] = None  # a binding TU that starts with <kernelkit/binding.h>

    def command(self, out: Path, extra: Sequence[str] = ()) -> List[str]:
        compiler = toolchain.nvcc() if self.kind == "cu" else toolchain.cxx()
        return toolchain.launcher() + [compiler, *extra, *self.flags, "-c", str(self.path), "-o", str(out)]


@dataclasses.dataclass
class Target:
    """A library to build: its units, how to link them, and how to show errors in the user's terms."""

    name: str
    units: List[Unit]
    ldflags: List[str]
    key: str
    with_cuda: bool
    pymodule: Optional[str]  # the pybind11 module name, when functions are bound for Python
    display: Dict[str, str]  # compiler path -> user-facing name
    texts: Dict[str, List[str]]  # user-facing name -> lines, to quote the offending line

    @property
    def so_name(self) -> str:
        return f"kk_{self.name}_{self.key[:16]}.so"


def plan_unit(kind: str, path: Path, text: str, include_dirs: Sequence[Path], extra: Sequence[str],
              archs: Sequence[str], display: str, optimize: str = "-O3",
              pch_defines: Optional[List[str]] = None) -> Unit:
    deps, uses_torch = scan_includes(text, path.parent, include_dirs)
    incs = [f"-I{d}" for d in include_dirs]
    if kind == "cu":
        flags = [toolchain.cxx_standard_flag(), optimize, "--expt-relaxed-constexpr", "-lineinfo",
                 "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                 *toolchain.gencode_flags(archs), *incs]
        if uses_torch:  # only then pay for torch's include paths and its half-operator switches
            flags += [f"-I{p}" for p in toolchain.torch_include_paths(True)]
            flags += toolchain.torch_nvcc_flags() + [f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}"]
        compiler_id = toolchain.nvcc_fingerprint()
    else:
        flags = [toolchain.cxx_standard_flag(), optimize, "-fPIC", "-fvisibility=hidden",
                 f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}", *incs,
                 *[f"-I{p}" for p in toolchain.torch_include_paths(toolchain.torch_has_cuda())],
                 f"-I{toolchain.python_include()}", *toolchain.pybind_abi_flags()]
        compiler_id = ""
    flags += list(extra)
    # Local include dirs enter the key by what they provide (the headers in ``deps``, hashed by content),
    # not by where they are: the same card in another checkout reuses the same objects.
    local = {f"-I{d}" for d in include_dirs}
    key_flags = ["-I<local>" if f in local else f for f in flags]
    digest = digest_tree(text.encode(), deps)
    key = sha256_bytes(b"unit", kind.encode(), toolchain.fingerprint().encode(), compiler_id.encode(),
                       "\0".join(key_flags).encode(), digest.encode())
    return Unit(kind, path, display, flags, key, deps, digest, pch_defines)


def link_flags(with_cuda: bool, pymodule: bool, extra: Sequence[str]) -> List[str]:
    flags = ["-shared", "-Wl,-Bsymbolic"]  # bind our own symbols first: reloads never call old code
    libstdcxx = toolchain.runtime_libstdcxx()
    if libstdcxx:  # the process's own libstdc++, never a second (static) copy
        flags.append(libstdcxx)
    for p in toolchain.torch_library_paths(with_cuda):
        flags += [f"-L{p}", f"-Wl,-rpath,{p}"]
    flags += ["-lc10", "-ltorch_cpu", "-ltorch"]
    if with_cuda:
        flags += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
    if pymodule:
        flags += ["-ltorch_python"]
    return flags + list(extra)


def target_key(name: str, units: Sequence[Unit], ldflags: Sequence[str]) -> str:
    return sha256_bytes(b"target", name.encode(), toolchain.fingerprint().encode(),
                        "\0".join(ldflags).encode(), *[u.key.encode() for u in units])


# ----------------------------------------------------------------------------------------------- running
def _run(cmd: List[str], what: str, target: Target, counter: str) -> str:
    STATS[counter] += 1
    log.debug("running: %s", " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        diags = parse_diagnostics(proc.stdout, target.display, target.texts)
        raise BuildError(what, diags, proc.stdout, cmd)
    if proc.stdout.strip():
        log.debug("%s output:\n%s", what, proc.stdout)
    return proc.stdout


# ------------------------------------------------------------------------------------ precompiled header
def pch_enabled() -> bool:
    return os.environ.get("KERNELKIT_PCH", "1") != "0" and toolchain.is_gcc()


def _pch_plan(unit: Unit) -> Tuple[Path, List[str]]:
    """Where the precompiled <kernelkit/binding.h> for this TU's flags lives, and the command making it.
    Card include dirs are left out (gcc does not need -I to match), so every card shares one PCH."""
    flags = [f for f in unit.flags
             if not (f.startswith("-I") and f[2:] not in toolchain.torch_include_paths(True)
                     and f[2:] not in toolchain.torch_include_paths(False) and f[2:] != str(toolchain.CSRC)
                     and f[2:] != toolchain.python_include())]
    defines = [f"-D{d}" for d in unit.pch_defines or []]
    header = toolchain.CSRC / "kernelkit" / "binding.h"
    deps, _ = scan_includes(header.read_text(), header.parent, [toolchain.CSRC])
    key = sha256_bytes(b"pch", toolchain.fingerprint().encode(), "\0".join(flags + defines).encode(),
                       digest_tree(header.read_bytes(), deps).encode())[:24]
    pch_root = cache.subdir("pch") / key
    cmd = [toolchain.cxx(), *flags, *defines, "-x", "c++-header", str(header)]
    return pch_root, cmd


def _pch_flags(unit: Unit) -> List[str]:
    """Flags that use a ready PCH; if there is none yet, start building it in a detached process (it
    outlives this one and is renamed into place when complete), so this build is not slowed down."""
    if unit.pch_defines is None or not pch_enabled():
        return []
    root, cmd = _pch_plan(unit)
    gch = root / "kernelkit" / "binding.h.gch"
    if gch.is_file():
        STATS["pch_used"] += 1
        return [f"-I{root}", "-Winvalid-pch"]  # gcc skips a PCH it cannot use and reads the header
    (root / "kernelkit").mkdir(parents=True, exist_ok=True)
    claim = root / "building"
    try:  # one builder per PCH; a claim older than 15 minutes is a dead builder's
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    except FileExistsError:
        if time.time() - claim.stat().st_mtime < 900:
            return []
        claim.touch()
    tmp = gch.with_name(f".binding.h.gch.{os.getpid()}")
    q = shlex.quote
    script = f"{shlex.join(cmd)} -o {q(str(tmp))} && mv -f {q(str(tmp))} {q(str(gch))}; rm -f {q(str(tmp))} {q(str(claim))}"
    subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    STATS["pch_builds"] += 1
    return []


def _compile(unit: Unit, target: Target) -> Path:
    hit = cache.cached_object(unit.key)
    if hit:
        return hit
    with cache.locked(unit.key, unit.display):
        hit = cache.cached_object(unit.key)  # another process may have built it while we waited
        if hit:
            return hit
        tmp = cache.private_tmpdir("obj-")
        try:
            out = tmp / f"{unit.key}.o"
            pch = _pch_flags(unit)
            output = _run(unit.command(out, pch), f"compiling {unit.display}", target, "compiles")
            if pch and "invalid-pch" in output:  # still correct (gcc read the header), just not faster
                STATS["pch_rejected"] += 1
                log.warning("precompiled binding.h was not usable for %s:\n%s", unit.display, output[-800:])
            return cache.store_object(unit.key, out, {"display": unit.display, "kind": unit.kind})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def build(target: Target) -> Tuple[Path, bool, float]:
    """Return (path of the verified .so, whether it came from the cache, seconds spent building)."""
    so = cache.verified_library(target.name, target.key)
    if so is not None:
        return so, True, 0.0

    def waiting() -> None:
        say(f"waiting for another process that is building {target.name} ...")

    with cache.locked(target.key, target.name, on_wait=waiting):
        so = cache.verified_library(target.name, target.key)
        if so is not None:
            return so, True, 0.0
        todo = [u for u in target.units if cache.cached_object(u.key) is None]
        names = ", ".join(u.display for u in todo) or "link only"
        reused = len(target.units) - len(todo)
        desc = f"building {target.name} [{names}]" + (f", {reused} cached object(s) reused" if reused else "")
        t0 = time.perf_counter()
        with Status(desc):
            workers = max(1, min(len(target.units), os.cpu_count() or 1))
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                objects = list(pool.map(lambda u: _compile(u, target), target.units))
            tmp = cache.private_tmpdir(f"lib-{target.name}-")
            try:
                out = tmp / target.so_name
                cmd = [toolchain.cxx(), *[str(o) for o in objects], "-o", str(out), *target.ldflags]
                _run(cmd, f"linking {target.name}", target, "links")
                seconds = time.perf_counter() - t0
                manifest = {
                    "name": target.name, "key": target.key, "so": target.so_name, "sha256": sha256_file(out),
                    "created": time.time(), "build_seconds": round(seconds, 3), "pymodule": target.pymodule,
                    "units": [{"file": u.display, "key": u.key} for u in target.units],
                    "fingerprint": toolchain.fingerprint(),
                }
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
                os.chmod(out, 0o700)
                os.chmod(tmp, 0o700)
                entry = cache.publish_library(tmp, target.name, target.key)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    cache.maybe_gc()
    return entry / target.so_name, False, seconds
