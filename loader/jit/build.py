"""Plan and run builds: translation units become content-addressed objects, objects become a library.

Why not one ``torch.utils.cpp_extension.load`` call per build: its freshness is ninja mtimes in one
build dir per name, so a content-keyed library would recompile every TU on every edit. Here each TU is
its own cache entry, so a kernel-body edit recompiles the small torch-free device TU (~1 s) and relinks,
while the torch-facing binding TU (~15-40 s) is compiled once per header content. Include paths, library
paths and nvcc flags still come from torch.utils.cpp_extension.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from .. import settings
from ..diagnostics import parse_diagnostics
from ..errors import BuildError, KernelkitError, SourcesChanged
from . import cache, keys, reaper, sources, stand_ins, syntax, toolchain
from .progress import Status, say
from .sources import INCLUDE, digest_tree, scan_includes, sha256_file

log = logging.getLogger("kernelkit")

#: counters a test (or a curious user) can read: how many compiler/linker processes this process ran
STATS = {"compiles": 0, "links": 0, "joins": 0, "pch_builds": 0, "pch_used": 0, "pch_rejected": 0,
         "device_rebuilds": 0, "stand_in_links": 0, "proofs": 0, "binds": 0}
_STATS_LOCK = threading.Lock()  # builds run in threads (autotune, a card's units): `+=` on a dict is not atomic


def _count(counter: str) -> None:
    with _STATS_LOCK:
        STATS[counter] += 1


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
    uses_torch: bool = False  # includes torch's headers: a .cu that does takes tens of seconds to compile
    roots: List[Path] = dataclasses.field(default_factory=list)  # what the digest names deps relative to
    local_dirs: List[Path] = dataclasses.field(default_factory=list)  # include dirs the key names "-I<local>"
    #: how its object is made when not by running the compiler on it: ``(unit, target, out, depfile)``
    #: (a torch-including .cu: jit.torch_cu splits it, or compiles it as written)
    builder: Optional[Callable[["Unit", "Target", Path, Path], None]] = None
    #: set by compile_as_written: the host shape of the text it compiled (``keys.host_shape_key``), and
    #: whether only its device code was compiled (the host side reused from an object of that shape)
    shape: Optional[str] = None
    device_only: bool = False
    #: a header the TU includes first, by its file name through an include dir, to precompile for its flags
    #: (a split's host preamble: torch's headers, parsed once per machine rather than per host edit)
    pch_header: Optional[Path] = None
    #: (index, count): one of the dtype shards a card's .cu is compiled as (jit.shards); None: the file whole
    shard: Optional[Tuple[int, int]] = None

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
    standalone: bool = False  # an executable (torch's is_standalone), not a shared library

    @property
    def so_name(self) -> str:
        return self.name if self.standalone else f"kk_{self.name}_{self.key[:16]}.so"

    @property
    def import_name(self) -> Optional[str]:
        """The name Python imports the module under: unique per build, because Python and pybind11 hand back
        the module already imported under a name instead of running the new library's init."""
        if self.pymodule is None:
            return None
        return f"{self.pymodule}_kk{self.key[:16]}" if self.pymodule == self.name else self.pymodule

    def import_alias_flags(self) -> List[str]:
        """A torch-style module's init function is named for TORCH_EXTENSION_NAME, which stays the same across
        edits so that unchanged objects are reused: the link adds the per-build name as an alias."""
        if self.import_name is None or self.import_name == self.pymodule:
            return []
        return [f"-Wl,--defsym=PyInit_{self.import_name}=PyInit_{self.pymodule}"]


def plan_unit(kind: str, path: Path, text: str, include_dirs: Sequence[Path], extra: Sequence[str],
              archs: Sequence[str], display: str, optimize: Optional[str] = "-O3",
              pch_defines: Optional[List[str]] = None, torch_style: bool = False,
              pch_header: Optional[Path] = None) -> Unit:
    """``torch_style``: ``extra`` already holds every flag torch's own JIT build would pass (the
    torch.utils.cpp_extension drop-in); only the local include dirs are added."""
    incs = [f"-I{d}" for d in include_dirs]
    deps, uses_torch, roots = keys.unit_inputs(kind, path, text, [*incs, *extra])
    compiler_id = toolchain.nvcc_fingerprint() if kind == "cu" else ""
    if torch_style:
        flags = [*incs, *([optimize] if optimize else [])]
    elif kind == "cu":
        flags = [toolchain.cxx_standard_flag(), optimize, "--expt-relaxed-constexpr", "-lineinfo",
                 "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                 *toolchain.gencode_flags(archs), *incs]
        if uses_torch:  # only then pay for torch's include paths and its half-operator switches
            flags += [f"-I{p}" for p in toolchain.torch_include_paths(True)]
            flags.append(f"-I{toolchain.python_include()}")  # <torch/extension.h> pulls Python.h
            flags += toolchain.torch_nvcc_flags() + [f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}"]
    else:
        flags = [toolchain.cxx_standard_flag(), optimize, "-fPIC", "-fvisibility=hidden",
                 f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}", *incs,
                 *[f"-I{p}" for p in toolchain.torch_include_paths(toolchain.torch_has_cuda())],
                 f"-I{toolchain.python_include()}", *toolchain.pybind_abi_flags()]
    flags += list(extra)
    if kind == "cu":
        sources.refuse_shell_expansion([*flags, str(path), str(cache.cache_dir())], f"compiling {display} with nvcc")
    digest = digest_tree(text.encode(), deps, roots)
    key = keys.unit_key(kind, flags, include_dirs, digest, toolchain.fingerprint(), compiler_id)
    return Unit(kind, path, display, flags, key, deps, digest, pch_defines, uses_torch, roots, list(include_dirs),
                pch_header=pch_header)


def with_define(unit: Unit, define: str, **changes) -> Unit:
    """``unit`` compiled with one more ``-D`` that no file it reads tests in an ``#if`` (so it reads the same files:
    its planned inputs stand, and only its key changes)."""
    flags = [*unit.flags, f"-D{define}"]
    compiler_id = toolchain.nvcc_fingerprint() if unit.kind == "cu" else ""
    key = keys.unit_key(unit.kind, flags, unit.local_dirs, unit.digest, toolchain.fingerprint(), compiler_id)
    return dataclasses.replace(unit, flags=flags, key=key, **changes)


def link_flags(with_cuda: bool, pymodule: bool, extra: Sequence[str], standalone: bool = False) -> List[str]:
    # a library binds its own symbols first (-Bsymbolic): a reload never calls an older build's code
    flags = [] if standalone else ["-shared", "-Wl,-Bsymbolic"]
    libstdcxx = toolchain.runtime_libstdcxx()
    if libstdcxx:  # the process's own libstdc++, never a second (static) copy
        flags.append(libstdcxx)
    for p in toolchain.torch_library_paths(with_cuda):
        flags += [f"-L{p}", f"-Wl,-rpath,{p}"]
    flags += ["-lc10", "-ltorch_cpu", "-ltorch"]
    if with_cuda:
        flags += ["-lc10_cuda", "-ltorch_cuda", toolchain.cudart_link_flag()]
    if pymodule:
        flags += ["-ltorch_python"]
    return flags + list(extra)


def target_key(name: str, units: Sequence[Unit], ldflags: Sequence[str]) -> str:
    return keys.target_key(name, toolchain.fingerprint(), ldflags, [u.key for u in units], keys.link_files(ldflags))


# ----------------------------------------------------------------------------------------------- running
class Children:
    """The compiler process groups one build is running, so an interrupted build can end them at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: Set[subprocess.Popen] = set()
        self.cancelled = False

    def add(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.add(proc)
            cancelled = self.cancelled
        if cancelled:  # started by a worker just as the build was interrupted
            reaper.end_group(proc)

    def discard(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def kill_all(self) -> None:
        with self.lock:
            self.cancelled = True
            procs = list(self.procs)
        for proc in procs:
            reaper.end_group(proc)


@dataclasses.dataclass
class _BuildState:
    """What one build() keeps while it runs: its compilers, and a private dir where the objects to link
    are pinned (hard-linked), so a gc or clear of obj/ in another process cannot pull one from under it."""

    children: Children
    pins: Path
    #: precompiled headers a compile wanted, to be built once this build is done (a machine of few cores)
    pch_later: List[Tuple[Path, str, List[str]]] = dataclasses.field(default_factory=list)


_BUILDS: Dict[int, _BuildState] = {}  # id(target) -> its running build


@contextlib.contextmanager
def _build_state(target: Target) -> Iterator[_BuildState]:
    with private_dir(f"pins-{target.name}-") as pins:
        _BUILDS[id(target)] = _BuildState(Children(), pins)
        try:
            yield _BUILDS[id(target)]
        finally:
            del _BUILDS[id(target)]


@contextlib.contextmanager
def private_dir(prefix: str) -> Iterator[Path]:
    """A private dir in the cache's tmp/ for one step of a build, removed after it (a no-op when it was
    renamed into the cache), or by the watchdog if this process dies first."""
    path = cache.private_tmpdir(prefix)
    reaper.watch_dir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        reaper.unwatch_dir(path)


def _spawn(cmd: List[str]) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (so that it and its children can be ended together), which
    the watchdog ends should this process die first (_run tells it when the group has ended)."""
    reaper.ready()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:  # the program itself is missing or not executable
        launcher = toolchain.launcher()
        if launcher and cmd[:len(launcher)] == launcher:
            raise KernelkitError(f"the compiler launcher {launcher[0]!r} (KERNELKIT_COMPILER_LAUNCHER) cannot be "
                                 f"run: {e.strerror or e}. Install it, fix the path, or unset "
                                 "KERNELKIT_COMPILER_LAUNCHER.") from None
        raise KernelkitError(f"cannot run {cmd[0]!r}: {e.strerror or e}") from None
    reaper.watch_group(proc.pid)
    return proc


def run_tool(cmd: List[str], what: str, target: Target, counter: str, children: Optional["Children"] = None) -> str:
    """Run a compiler or binutils tool for ``target``'s build (ended with it if interrupted, or with ``children``
    when given); a failure raises BuildError with its diagnostics in the user's terms."""
    _count(counter)
    log.debug("running: %s", " ".join(cmd))
    state = _BUILDS.get(id(target))
    children = children or (state.children if state else Children())
    proc = _spawn(cmd)
    children.add(proc)
    try:
        output, _ = proc.communicate()
    except BaseException:  # KeyboardInterrupt while waiting: the compiler must not outlive the build
        reaper.end_group(proc)
        raise
    finally:
        children.discard(proc)
        reaper.unwatch_group(proc.pid)
    if proc.returncode != 0:
        diags = parse_diagnostics(output, target.display, target.texts)
        raise BuildError(what, diags, output, cmd)
    if output.strip():
        log.debug("%s output:\n%s", what, output)
    return output


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
        _link_once(target, cmd)
    except BuildError:
        if sources.snapshot(files) != before:  # the linker read an archive half written by an edit
            raise changed("changed while it was being linked") from None
        raise
    if sources.snapshot(files) != before:
        raise changed("changed while it was being linked")


def _link_once(target: Target, cmd: List[str]) -> None:
    """Link against torch's libraries' stand-ins where proven for these flags and objects; else link for real,
    and where no stand-ins were tried for these flags yet, make them from what this link resolved."""
    what, objects = f"linking {target.name}", [Path(a) for a in cmd[1:cmd.index("-o")]]
    fast = stand_ins.command(target.name, target.ldflags, cmd, objects)
    if fast is not None:
        try:
            run_tool(fast, what, target, "links")
            _count("stand_in_links")
            return
        except BuildError:
            log.debug("the link against stand-ins failed: linking for real, which says what is wrong")
    if not stand_ins.wants_recipe(target.name, target.ldflags):
        run_tool(cmd, what, target, "links")
        return
    scratch = _BUILDS[id(target)].pins
    try:
        trace = stand_ins.trace_flags(objects, scratch)
    except (OSError, subprocess.SubprocessError):
        trace = []
    try:
        output = run_tool(cmd + trace, what, target, "links")
    except BuildError:
        if not trace:
            raise
        run_tool(cmd, what, target, "links")  # the error without the trace's lines (or a link that passes now)
        return
    if trace:
        stand_ins.make_recipe_later(target.name, target.ldflags, cmd, objects, Path(cmd[cmd.index("-o") + 1]), output)


def _in_parallel(fn: Callable[[Unit], Path], units: Sequence[Unit], target: Target) -> List[Path]:
    """``[fn(u) for u in units]`` on a thread per core. A compile error lets the others finish (their
    objects are cached for the next try); an interruption cancels what has not started, ends the running
    compilers and is re-raised at once."""
    workers = max(1, min(len(units), os.cpu_count() or 1))
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:
        # the slowest first (torch's headers take tens of seconds), so no long compile waits for a free thread
        longest_first = sorted(units, key=lambda u: (not u.uses_torch, u.kind != "cu"))
        futures = {id(u): pool.submit(fn, u) for u in longest_first}
        concurrent.futures.wait(futures.values())
        return [futures[id(u)].result() for u in units]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        _BUILDS[id(target)].children.kill_all()
        raise
    finally:
        pool.shutdown(wait=False)


# ------------------------------------------------------------------------------------ precompiled header
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


def pch_enabled() -> bool:
    """KERNELKIT_PCH=off (or KERNELKIT_FAST=off) turns the precompiled header off; it is on with gcc otherwise."""
    return settings.fast_path("pch") and toolchain.is_gcc()


def _pch_at_once() -> bool:
    """Whether a missing PCH is built as soon as a compile wants it: with 4 cores or more, or KERNELKIT_PCH=on.
    Otherwise once the build that wanted it is done, niced: its ~25 s of a core would slow a small machine's
    build, and a host edit comes minutes later."""
    return settings.PCH.get() == "on" or (os.cpu_count() or 1) >= PCH_AT_ONCE_CPUS


def _pch_plan(unit: Unit) -> Tuple[Path, str, List[str]]:
    """Where the precompiled header for this TU's flags lives, its file there, and the command making it."""
    if unit.pch_header is not None:
        return _preamble_pch_plan(unit, unit.pch_header)
    return _binding_pch_plan(unit)


def _preamble_pch_plan(unit: Unit, header: Path) -> Tuple[Path, str, List[str]]:
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


def _binding_pch_plan(unit: Unit) -> Tuple[Path, str, List[str]]:
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


def pch_flags(unit: Unit, target: Optional[Target] = None) -> List[str]:
    """Flags that use a ready, verified PCH; if there is none yet, start building it in a detached
    process (it outlives this one and is renamed into place when complete), so this build is not slowed:
    at once, or when ``target``'s build is done (``_pch_at_once``)."""
    if (unit.pch_defines is None and unit.pch_header is None) or not pch_enabled():
        return []
    root, gch, cmd = _pch_plan(unit)
    if cache.pch_ready(root):
        _count("pch_used")
        return [f"-I{root}", "-Winvalid-pch"]  # gcc skips a PCH it cannot use and reads the header
    state = _BUILDS.get(id(target)) if target is not None else None
    if state is None or _pch_at_once():
        _start_pch_build(root, gch, cmd)
    elif all(plan[0] != root for plan in state.pch_later):
        state.pch_later.append((root, gch, cmd))
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
    _count("pch_builds")
    if not _PCH_ANNOUNCED:
        _PCH_ANNOUNCED = True
        say("building a precompiled header of torch's headers in the background (~25 s of one core, once per "
            "set of flags); later compiles of bindings and host code use it. KERNELKIT_PCH=0 turns this off.")


def _drop_pch(unit: Unit) -> None:
    root, _, _ = _pch_plan(unit)
    fd = cache.try_flock(root / cache.PCH_CLAIM)
    if fd is not None:
        try:
            cache.drop_pch(root)
        finally:
            os.close(fd)


# ------------------------------------------------------------------------------ compiling, checked inputs
def snapshot(unit: Unit) -> Dict[Path, Optional[tuple]]:
    """The TU and each local header it includes, as they are now: identity (inode, size, mtime, ctime:
    an edit that is undone again still changes those) and sha256. None: missing. A generated source is
    taken by content only: other processes may rewrite it, always with the same text."""
    out: Dict[Path, Optional[tuple]] = {}
    for p in [unit.path, *unit.deps]:
        try:
            st = os.stat(p)
            identity = () if cache.is_generated_source(p) else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            out[p] = (*identity, sha256_file(p))
        except OSError:
            out[p] = None
    return out


def _as_planned(unit: Unit) -> bool:
    """Whether the TU and its local headers hash to the digest the unit's key was made from."""
    try:
        return any(digest_tree(t, unit.deps, unit.roots) == unit.digest for t in _planned_texts(unit.path.read_bytes()))
    except OSError:
        return False


def _planned_texts(raw: bytes) -> Set[bytes]:
    """The TU's bytes as plan_unit may have hashed them: as written (an inline source), or as read_text()
    gives them (newlines normalised; undecodable bytes kept or replaced)."""
    out = {raw}
    for errors in ("surrogateescape", "replace"):
        text = raw.decode("utf-8", errors).replace("\r\n", "\n").replace("\r", "\n")
        out.add(text.encode("utf-8", "surrogateescape"))
    return out


def _changed(unit: Unit, target: Target, before: Dict[Path, Optional[tuple]], during: bool) -> SourcesChanged:
    """The error for sources that no longer match the unit's key. A generated source in the cache that
    was damaged is removed, so the next load writes it again."""
    after = snapshot(unit)
    changed = [p for p in after if after[p] != before.get(p)] if during else []
    names = ", ".join(target.display.get(str(p), str(p)) for p in changed or [unit.path, *unit.deps])
    when = ("changed while it was being compiled" if changed else
            "no longer match what the build was planned from (changed after planning)")
    advice = "Load again to build what is on disk now."
    if cache.is_generated_source(unit.path):
        cache.discard_source(unit.path)
        advice = f"The generated source {unit.path} in the cache was damaged and is removed; load again."
    return SourcesChanged(f"{unit.display}: {names} {when}; nothing was cached (the object would carry the "
                          f"key of the old content). {advice}")


def _depfile_inputs(depfile: Path) -> Optional[List[Path]]:
    """The files a compiler read, from the make rule it wrote with -MD -MF (None: it wrote none)."""
    try:
        text = depfile.read_text(errors="surrogateescape")
    except OSError:
        return None
    rule = text.replace("\\\n", " ")
    match = re.search(r":(?:\s|$)", rule)
    if match is None:
        return None
    prereqs = rule[match.end():].split("\n", 1)[0]
    tokens = re.findall(r"(?:\\.|[^\s\\])+", prereqs)
    return sources.resolved(re.sub(r"\\(.)", r"\1", t).replace("$$", "$") for t in tokens)


def _check_inputs(unit: Unit, target: Target, depfile: Path, before: Dict[Path, Optional[tuple]]) -> None:
    """After a compile: every file the compiler read outside the toolchain's dirs is one the key covers,
    unchanged since planning (by content) and untouched while compiling (by identity: an edit undone again
    is caught too)."""
    if snapshot(unit) != before or not _as_planned(unit):
        raise _changed(unit, target, before, during=True)
    read = _depfile_inputs(depfile)
    if read is None:  # a launcher that drops -MD: the planned files were checked above
        log.debug("no dependency file from compiling %s", unit.display)
        return
    covered = set(sources.resolved([unit.path, *unit.deps]))
    # nvcc lists the names #line marks give as if it had read them: a split's TUs cite the user's files so
    marked = set(sources.resolved(name for p in [unit.path, *unit.deps]
                                  for name in syntax.line_names(cache.source_bytes(p).decode("utf-8", "replace"))))
    unseen = [p for p in read if p not in covered | marked and not sources.under(p, keys.toolchain_dirs())
              and p.exists()]
    if unseen:
        raise SourcesChanged(
            f"{unit.display}: the compiler read {', '.join(map(str, unseen))}, which kernelkit's include scan "
            "did not find (an #include through a macro, or #include_next?), so the cache key does not cover it; "
            "nothing was cached. Include it by name (#include \"...\" or <...> through an include flag).")


def _compile_to(unit: Unit, target: Target, out: Path, depfile: Path) -> None:
    unit.shape, unit.device_only = None, False
    if unit.builder is not None:
        unit.builder(unit, target, out, depfile)
    else:
        compile_as_written(unit, target, out, depfile)


def compile_as_written(unit: Unit, target: Target, out: Path, depfile: Path) -> None:
    """Run the compiler on the unit's file; a PCH that gcc cannot read (a hard error, not a skip) is dropped
    and the TU compiled again without it. A .cu whose host side is cached (an object of its host shape) has
    only its device code compiled."""
    what, deps = f"compiling {unit.display}", ["-MD", "-MF", str(depfile)]
    unit.shape = _host_shape(unit)
    if unit.shape is not None and _rebuilt_device_code(unit, target, out, depfile):
        unit.device_only = True
        return
    pch = pch_flags(unit, target)
    try:
        output = run_tool(unit.command(out, pch + deps), what, target, "compiles")
    except BuildError as e:
        if not pch or not _PCH_FAILED.search(e.log):
            raise
        _count("pch_rejected")
        log.warning("a precompiled header could not be read for %s; dropping it and compiling without", unit.display)
        _drop_pch(unit)
        pch, output = [], run_tool(unit.command(out, deps), what, target, "compiles")
    if pch and "invalid-pch" in output:  # still correct (gcc read the header), just not faster
        _count("pch_rejected")
        log.warning("a precompiled header was not usable for %s:\n%s", unit.display, output[-800:])


def _host_shape(unit: Unit) -> Optional[str]:
    """The host shape of a .cu unit's text; None where device code is never rebuilt alone for it (also
    KERNELKIT_DEVICE_REBUILD=off or KERNELKIT_FAST=off: every compile runs nvcc on the whole file)."""
    if unit.kind != "cu" or not unit.digest or not settings.fast_path("device_rebuild"):
        return None
    try:
        return keys.host_shape_key(unit.kind, unit.flags, unit.local_dirs, toolchain.fingerprint(), toolchain.nvcc_fingerprint(),
                                   unit.path.read_text(errors="surrogateescape"), unit.deps, unit.roots,
                                   "builder" if unit.builder is not None else "compiler")
    except OSError:  # gone meanwhile: the compile says so
        return None


def _rebuilt_device_code(unit: Unit, target: Target, out: Path, depfile: Path) -> bool:
    """``out``: an object of the unit's host shape with the device code of its text (nvcc --fatbin, placed
    into the ``.nv_fatbin`` section), when there is such an object and a binutils objcopy to do it."""
    old, objcopy = cache.shaped_object(unit.shape), shutil.which("objcopy")
    if old is None or objcopy is None:
        return False
    fatbin = out.with_name(out.stem + ".fatbin")
    run_tool(toolchain.launcher() + [toolchain.nvcc(), *unit.flags, "--fatbin", str(unit.path), "-o", str(fatbin),
                                 "-MD", "-MF", str(depfile)], f"compiling {unit.display}", target, "compiles")
    try:
        shutil.copyfile(old, out)
        run_tool([objcopy, "--update-section", f".nv_fatbin={fatbin}", str(out)],
             f"placing the device code of {unit.display}", target, "device_rebuilds")
    except (OSError, BuildError):  # removed by a gc meanwhile, or an object without device code
        return False
    return True


def join_objects(objects: Sequence[Path], out: Path, target: Target) -> None:
    """One relocatable object from several (``ld -r``): a split TU is cached and linked as one object."""
    run_tool([toolchain.cxx(), "-r", "-nostdlib", *map(str, objects), "-o", str(out)], f"joining the objects of {target.name}",
         target, "joins")


def compile_cached(unit: Unit, target: Target) -> Path:
    """The unit's object from the cache, or compiled and cached now (a part of a split TU)."""
    return _compile(unit, target)


def _compile(unit: Unit, target: Target) -> Path:
    """The unit's object, compiled unless cached; pinned for the link when a build() is running."""
    for _ in range(3):
        pinned = _pin(_compile_once(unit, target), target)
        if pinned is not None:
            return pinned
    raise KernelkitError(f"the object of {unit.display} kept being removed from the cache while this build "
                         "needed it (a `kernelkit cache clear` or gc in a loop?)")


def _pin(obj: Path, target: Target) -> Optional[Path]:
    """A hard link to ``obj`` in the build's private dir (None: gc or clear removed it just now)."""
    state = _BUILDS.get(id(target))
    if state is None:
        return obj
    pin = state.pins / obj.name
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
        before = snapshot(unit)
        if unit.digest and not _as_planned(unit):  # nothing to compile: it could not be cached
            raise _changed(unit, target, before, during=False)
        with private_dir("obj-") as tmp:
            out, depfile = tmp / f"{unit.key}.o", tmp / f"{unit.key}.d"
            try:
                _compile_to(unit, target, out, depfile)
            except BuildError:
                # the compiler may have read a file half-written by an edit: that is no error in the sources
                if unit.digest and (snapshot(unit) != before or not _as_planned(unit)):
                    raise _changed(unit, target, before, during=True) from None
                raise
            if unit.digest:
                _check_inputs(unit, target, depfile, before)
            shape = {"shape": unit.shape} if unit.shape else {}
            obj = cache.store_object(unit.key, out, {"display": unit.display, "kind": unit.kind, **shape})
            if unit.shape:
                cache.remember_shape(unit.shape, unit.key)
            return obj


SLOW_TORCH_UNIT_SECONDS = 8.0
_HINTED: set = set()


def _compile_noting_torch_cost(unit: Unit, target: Target, fresh: bool) -> Path:
    """Compile; when a .cu that includes torch was slow to compile, say once what it cost and how to avoid it."""
    t0 = time.perf_counter()
    obj = _compile(unit, target)
    seconds = time.perf_counter() - t0
    # a unit with a builder (a torch-style .cu: jit.torch_cu) says itself what it did and why
    if fresh and unit.kind == "cu" and unit.uses_torch and unit.builder is None and seconds >= SLOW_TORCH_UNIT_SECONDS:
        torch_cost_advice(unit, seconds, "")
    return obj


def torch_cost_advice(unit: Unit, seconds: float, why: str) -> None:
    """Once per file: what including torch's headers in a .cu cost, and how to avoid it by hand."""
    if unit.display in _HINTED:
        return
    _HINTED.add(unit.display)
    say(f"{unit.display} includes torch's headers, so every edit of it recompiles them{why}: this took "
        f"{seconds:.0f} s. Kernels in a .cu without torch headers (launchers taking pointers and a "
        "cudaStream_t, called from your .cpp) recompile in about a second: see the README, "
        "'Porting from torch.utils.cpp_extension'.")


def _label(unit: Unit) -> str:
    return f"{unit.display} in {unit.shard[1]} dtype shards" if unit.shard else unit.display


def build(target: Target) -> Tuple[Path, bool, float]:
    """Return (path of the verified .so, whether it came from the cache, seconds spent building)."""
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
        with Status(desc), _build_state(target) as state:
            objects = _in_parallel(lambda u: _compile_noting_torch_cost(u, target, u in todo), target.units, target)
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
    for root, gch, cmd in state.pch_later:  # the build's cores are free now
        _start_pch_build(root, gch, cmd, nice=True)
    cache.maybe_gc()
    return entry / target.so_name, False, seconds
