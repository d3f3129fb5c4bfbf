"""Stand-in libraries for torch's: a relink whose objects reference nothing new in torch skips reading torch.

Why: a link reads the symbol tables of libtorch_cpu.so and libtorch_cuda.so (~450 MB each), most of a
0.5 s link, on every kernel edit, though the edit changed device objects only. After a real link, each torch
library it resolved symbols from gets a stand-in: the same file name and SONAME, defining exactly those
symbols with the types the link recorded. The stand-ins serve later links of this process only once the
stand-in link of the same objects proved to give the same dynamic interface as the real one (``interface``:
needed libraries, dynamic symbols with types and versions, relocations by type and symbol, section sizes),
and only while every object they link references nothing the stand-ins were not made for. The bytes differ
(the linker lays out its tables in the order of its symbol hash), the interface does not.
KERNELKIT_LINK_STAND_INS=off (or KERNELKIT_FAST=off) turns them off.
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from ... import settings
from ...errors import BuildError
from .. import cache, reaper, running, toolchain
from ..running import count, state
from ..units import Target

log = logging.getLogger("kernelkit")

_TYPES = {"FUNC": "@function", "OBJECT": "@object", "TLS": "@tls_object", "NOTYPE": "@notype"}
_KEPT_DYNAMIC = ("NEEDED", "SONAME", "RPATH", "RUNPATH", "FLAGS", "FLAGS_1", "SYMBOLIC", "TEXTREL", "BIND_NOW")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Stand-ins made for one set of link flags: where they are, what they define, the real files they stand for."""

    where: Path
    covered: FrozenSet[str]  # what the proving link's objects referenced and took from no object of theirs
    real: Tuple[Tuple[str, Tuple[int, int, int]], ...]  # (real library, its (inode, size, mtime)) at making

    def still_true(self) -> bool:
        return all(_identity(path) == ident for path, ident in self.real)


_LOCK = threading.Lock()
#: (library name, *link flags) -> its recipe, or None where the stand-ins could not be proven (not tried again)
_RECIPES: Dict[Tuple[str, ...], Optional[Recipe]] = {}
#: (library name, *link flags) -> the thread proving its stand-ins (make_recipe_later), running or done
_PROOFS: Dict[Tuple[str, ...], threading.Thread] = {}
#: an object's (dev, inode, size, mtime) -> its (undefined, defined) external symbols
_SYMBOLS: Dict[Tuple[int, int, int, int], Tuple[FrozenSet[str], FrozenSet[str]]] = {}
_DIR: List[Path] = []


def enabled() -> bool:
    return settings.fast_path("link_stand_ins") and shutil.which("nm") is not None \
        and shutil.which("readelf") is not None


def command(name: str, ldflags: Sequence[str], cmd: List[str], objects: Sequence[Path]) -> Optional[List[str]]:
    """``cmd`` linking against the stand-ins, when a proven recipe for ``name`` and ``ldflags`` covers ``objects``."""
    if not enabled():
        return None
    _wait_for_proof((name, *ldflags))
    with _LOCK:
        recipe = _RECIPES.get((name, *ldflags))
    if recipe is None or not recipe.still_true():
        return None
    try:
        if not _needed(objects) <= recipe.covered:
            return None
    except (OSError, subprocess.SubprocessError):
        return None
    return _with_stand_ins(cmd, recipe.where)


def wants_recipe(name: str, ldflags: Sequence[str]) -> bool:
    """Whether a real link should be traced to make stand-ins: none made yet, or the ones made no longer cover
    the objects (not where they could not be proven)."""
    if not enabled():
        return False
    _wait_for_proof((name, *ldflags))
    with _LOCK:
        return (name, *ldflags) not in _RECIPES or _RECIPES[(name, *ldflags)] is not None


def trace_flags(objects: Sequence[Path], into: Path) -> List[str]:
    """Flags for the real link that make the linker say which file defines each symbol the objects reference
    (in a response file: a binding object references hundreds)."""
    rsp = into / "trace.rsp"
    rsp.write_text("".join(f"-Wl,--trace-symbol={s}\n" for s in sorted(undefined(objects))))
    return [f"@{rsp}"]


def make_recipe_later(name: str, ldflags: Sequence[str], cmd: List[str], objects: Sequence[Path], out: Path,
                      trace: str) -> None:
    """``make_recipe`` on a thread of its own, so the build that linked ``out`` returns without waiting for the
    proof (a second link, against the stand-ins); a later link of the same flags waits for it. The thread
    works on hard links of ``objects`` and a copy of ``out``, which the build removes or moves when it returns."""
    key = (name, *ldflags)
    scratch = Path(tempfile.mkdtemp(prefix="proof-", dir=_stand_in_dir()))
    try:
        pinned = [_pin(o, scratch / f"{i}-{o.name}") for i, o in enumerate(objects)]
        # a copy: a hard link's removal would change the library's ctime, which a warm-load record stamps
        lib = Path(shutil.copy2(out, scratch / out.name))
    except OSError as e:
        shutil.rmtree(scratch, ignore_errors=True)
        log.debug("no link stand-ins for %s: %s", out.name, e)
        return
    at = cmd.index("-o")
    own_cmd = [cmd[0], *map(str, pinned), *cmd[at:]]

    def prove() -> None:
        try:
            make_recipe(name, ldflags, own_cmd, pinned, lib, trace, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    thread = threading.Thread(target=prove, name=f"kernelkit-stand-ins-{name}", daemon=True)
    with _LOCK:  # started before another thread can find it: joining a thread not yet started raises
        if not _PROOFS:
            atexit.register(_finish_proofs)  # after _stand_in_dir's removal was registered: runs before it
        thread.start()
        _PROOFS[key] = thread


def link(target: Target, cmd: List[str]) -> Optional[bool]:
    """Link against proven stand-ins (True), or link for real with a trace that makes them for later links of these
    flags (True); None: neither applies, or that link failed (the core links plainly, which says what is wrong)."""
    what, objects = f"linking {target.name}", [Path(a) for a in cmd[1:cmd.index("-o")]]
    fast = command(target.name, target.ldflags, cmd, objects)
    if fast is not None:
        try:
            running.run_tool(fast, what, target, "links")
            count("stand_in_links")
            return True
        except BuildError:
            log.debug("the link against stand-ins failed: linking for real, which says what is wrong")
    current = state(target)
    if current is None or not wants_recipe(target.name, target.ldflags):
        return None
    try:
        trace = trace_flags(objects, current.pins)
    except (OSError, subprocess.SubprocessError):
        return None
    if not trace:
        return None
    try:
        output = running.run_tool(cmd + trace, what, target, "links")
    except BuildError:
        return None  # the plain link gives the error without the trace's lines (or passes now)
    make_recipe_later(target.name, target.ldflags, cmd, objects, Path(cmd[cmd.index("-o") + 1]), output)
    return True


def _pin(path: Path, to: Path) -> Path:
    try:
        os.link(path, to)
    except OSError:  # a filesystem without hard links
        shutil.copy2(path, to)
    return to


def _wait_for_proof(key: Tuple[str, ...]) -> None:
    with _LOCK:
        thread = _PROOFS.get(key)
    if thread is not None:
        thread.join()


def _finish_proofs() -> None:
    """At exit: let a proof end its linker before the stand-ins' directory is removed."""
    with _LOCK:
        threads = list(_PROOFS.values())
    for t in threads:
        t.join()


def make_recipe(name: str, ldflags: Sequence[str], cmd: List[str], objects: Sequence[Path], out: Path, trace: str,
                scratch: Path) -> None:
    """After a real link (``cmd``, traced, wrote ``out``): make stand-ins for the torch libraries it resolved
    symbols from, link the same objects against them, and keep them if that library's interface is the same."""
    recipe = None
    try:
        recipe = _prove(cmd, objects, out, trace, scratch)
    except Exception as e:  # noqa: BLE001 -- a failed proof only means real links, never a failed build
        log.debug("no link stand-ins for %s: %s", out.name, e)
    with _LOCK:
        _RECIPES[(name, *ldflags)] = recipe


def _prove(cmd: List[str], objects: Sequence[Path], out: Path, trace: str, scratch: Path) -> Optional[Recipe]:
    torch_dirs = {os.path.realpath(p) for p in toolchain.torch_library_paths(False)}  # torch's own, not CUDA's
    libs: Dict[str, Set[str]] = collections.defaultdict(set)
    definitions = _definitions(trace)
    for symbol, path in definitions.items():
        if os.path.dirname(os.path.realpath(path)) in torch_dirs:
            libs[path].add(symbol)
    kinds, versioned = _undefined_kinds(out)
    libs = {path: symbols for path, symbols in libs.items() if not symbols & versioned}  # a stand-in has none
    if not libs:
        return None
    where = Path(tempfile.mkdtemp(prefix=f"{out.stem}-", dir=_stand_in_dir()))
    for path, symbols in libs.items():
        _write_stand_in(Path(path), sorted(symbols), kinds, where)
    trial = scratch / f"stand-in-{out.name}"
    proc = reaper.run(_with_stand_ins([*cmd[:cmd.index("-o") + 1], str(trial), *cmd[cmd.index("-o") + 2:]], where),
                      check=False)
    if proc.returncode != 0 or interface(trial) != interface(out):
        log.debug("link stand-ins for %s not proven: %s", out.name, proc.stderr[-300:] or "interfaces differ")
        return None
    real = tuple((os.path.realpath(p), _identity(p)) for p in libs)
    own = {os.path.realpath(o) for o in objects}  # a symbol one of them defined is torch's once it no longer does
    taken = {s for s, path in definitions.items() if os.path.realpath(path) in own}
    return Recipe(where, undefined(objects) - taken, real)


def _definitions(trace: str) -> Dict[str, str]:
    """symbol -> the file the linker took its definition from, read from ``--trace-symbol`` lines
    ("<ld>: <file>: definition of <symbol>"); the first definition is the one a link binds."""
    found: Dict[str, str] = {}
    for line in trace.splitlines():
        head, sep, symbol = line.rpartition(": definition of ")
        if sep:
            found.setdefault(symbol.strip(), head.split(": ")[-1].strip())
    return found


def _undefined_kinds(lib: Path) -> Tuple[Dict[str, Tuple[str, str]], Set[str]]:
    """symbol -> (type, binding) of each undefined dynamic symbol of a linked library (the type is the
    definition's: the linker copies it from the library it resolved the symbol from), and the versioned ones."""
    kinds, versioned = {}, set()
    for fields in _dynsyms(lib):
        if fields[6] == "UND" and len(fields) > 7:
            name, _, version = fields[7].partition("@")
            if version:
                versioned.add(name)
            else:
                kinds[name] = (fields[3], fields[4])
    return kinds, versioned


def _write_stand_in(real: Path, symbols: List[str], kinds: Dict[str, Tuple[str, str]], where: Path) -> None:
    lines = [".text"]
    for s in symbols:
        typ, bind = kinds.get(s, ("NOTYPE", "GLOBAL"))
        lines += [f".weak {s}" if bind == "WEAK" else f".globl {s}", f".type {s}, {_TYPES[typ]}"]
        lines += [".section .tbss,\"awT\",@nobits", f"{s}:", ".zero 8", ".text"] if typ == "TLS" else \
            [f"{s}:", ".zero 8"]
    asm = where / f"{real.name}.s"
    asm.write_text("\n".join(lines) + "\n")
    soname = _soname(real)
    reaper.run([toolchain.cxx(), "-shared", "-nostdlib", *([f"-Wl,-soname,{soname}"] if soname else []), str(asm),
                "-o", str(where / real.name)])


def _soname(lib: Path) -> Optional[str]:
    for line in _readelf("-d", lib).splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rsplit("]", 1)[0]
    return None


def _with_stand_ins(cmd: List[str], where: Path) -> List[str]:
    """The stand-ins' dir searched first for ``-l`` (a -L path leaves nothing in the library it makes)."""
    at = cmd.index("-o") + 2
    return [*cmd[:at], f"-L{where}", *cmd[at:]]


def undefined(objects: Sequence[Path]) -> FrozenSet[str]:
    """Every symbol some object references and does not define itself (``nm -u``)."""
    return frozenset().union(*(undef for undef, _ in _symbols(objects)))


def _needed(objects: Sequence[Path]) -> FrozenSet[str]:
    """What the link of ``objects`` must take from a library: referenced by one and defined by none."""
    tables = _symbols(objects)
    return frozenset().union(*(u for u, _ in tables)) - frozenset().union(*(d for _, d in tables))


def _symbols(objects: Sequence[Path]) -> List[Tuple[FrozenSet[str], FrozenSet[str]]]:
    """(undefined, defined) external symbols of each object, from one ``nm`` for the files not read before
    (most of an edit's objects are new), remembered per file."""
    idents = []
    for o in objects:
        st = os.stat(o)
        idents.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    with _LOCK:
        todo = {str(o): ident for o, ident in zip(objects, idents) if ident not in _SYMBOLS}
    if todo:
        found: Dict[str, Tuple[Set[str], Set[str]]] = {path: (set(), set()) for path in todo}
        for line in reaper.run(["nm", "-g", "-A", "--format=posix", *todo]).stdout.splitlines():
            path, _, rest = line.rpartition(": ")  # "<object>: <symbol> <type> [<value> <size>]"
            fields = rest.split()
            if path in found and len(fields) >= 2:
                found[path][fields[1] not in "Uwv"].add(fields[0])
        with _LOCK:
            for path, ident in todo.items():
                _SYMBOLS[ident] = (frozenset(found[path][0]), frozenset(found[path][1]))
    with _LOCK:
        return [_SYMBOLS[ident] for ident in idents]


def interface(lib: Path) -> Tuple[tuple, ...]:
    """What a dynamic loader sees of a library, apart from where the linker put things: its dynamic entries
    that are not addresses, its dynamic symbols (type, binding, visibility, defined or not, size if defined,
    name@version), its relocations by type and symbol, and its sections' names, types and sizes."""
    dynamic = tuple(_dynamic_entries(lib))
    symbols = sorted((f[3], f[4], f[5], "UND" if f[6] == "UND" else "DEF", "" if f[6] == "UND" else f[2],
                      f[7] if len(f) > 7 else "") for f in _dynsyms(lib))
    relocations = sorted(collections.Counter(_relocations(lib)).items())
    sections = tuple(_sections(lib))
    return dynamic, tuple(symbols), tuple(relocations), sections


def _dynamic_entries(lib: Path):
    for line in _readelf("-d", lib).splitlines():
        fields = line.split(None, 2)
        if len(fields) == 3 and fields[1].startswith("(") and fields[1].strip("()") in _KEPT_DYNAMIC:
            yield fields[1], fields[2].strip()


def _dynsyms(lib: Path):
    for line in _readelf("--dyn-syms", lib).splitlines():
        fields = line.split()
        if len(fields) >= 7 and fields[0].endswith(":") and fields[0][:-1].isdigit():
            yield fields


def _relocations(lib: Path):
    for line in _readelf("-r", lib).splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2].startswith("R_"):
            yield fields[2], fields[4] if len(fields) > 4 and not fields[4].startswith("+") else ""


def _sections(lib: Path):
    for line in _readelf("-S", lib).splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) >= 6 and fields[0].startswith("[") and fields[0][1:-1].isdigit():
            yield fields[1], fields[2], fields[5]


def _readelf(option: str, lib: Path) -> str:
    return reaper.run(["readelf", "-W", option, str(lib)]).stdout


def _identity(path: str) -> Tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _stand_in_dir() -> Path:
    """This process's stand-ins, in the cache's tmp/: removed at exit, or by the watchdog if it dies first."""
    with _LOCK:
        if not _DIR:
            path = cache.private_tmpdir("stand-ins-")
            reaper.watch_dir(path)
            atexit.register(shutil.rmtree, path, True)
            _DIR.append(path)
        return _DIR[0]
