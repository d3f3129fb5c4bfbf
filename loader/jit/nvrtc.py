"""Compiling kernel-only CUDA C++ in-process with NVRTC, into the content-addressed cache.

NVRTC (through NVIDIA's ``cuda-bindings``, which torch's CUDA wheels install) compiles a small kernel in
tens of milliseconds without starting a process, and without a GPU when the arch is given. The program
is compiled from exactly the bytes that were hashed: the source and every local header it includes are
handed to NVRTC from memory, so an edit during a compile can never be cached under the old key. The
cubin is kept in the cache's ``obj/`` like any object (sha256 recorded and verified before use).

NVRTC is never left to find a local header on disk: ``--no-source-include`` keeps it from searching the
source's directory, headers named through an object-like macro (``#define H "k.cuh"`` / ``#include H``, or
``-DH=...``) and forced includes (``--pre-include``) are resolved, hashed and handed from memory like the
others, and an include kernelkit cannot resolve is refused before compiling. What NVRTC reads from disk is
the CUDA include directory's headers only (covered by NVRTC's version and that directory in the key).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .. import settings
from ..errors import BuildError, KernelkitError
from . import cache, keys, sources
from .outline import Outline, scan

FORMAT = "kernelkit-nvrtc-3"
# --no-source-include: NVRTC looks for no header next to the source (or in the working directory), so every
# local header it opens is one kernelkit hashed and handed over from memory
DEFAULT_OPTIONS = ("--std=c++17", "-lineinfo", "--no-source-include")
SCAN_FORMAT = "kernelkit-scan-1"  # outline.scan's stored outlines: bump it whenever what scan reads changes
_FORCED_INCLUDES = ("--pre-include", "-include")  # NVRTC's spellings, as "--pre-include=x.h" or two tokens
_STT_FUNC, _STO_CUDA_ENTRY = 2, 0x10  # a cubin's ELF: function symbols flagged as kernels (entry points)


class Program(NamedTuple):  # NamedTuples, not dataclasses: building a dataclass at import slows a warm start
    """What one compile needs; ``key`` covers all of it."""
    name: str
    display: str  # the source's name in messages: a path, or "<name>.cu" for a string
    text: str
    headers: Tuple[Tuple[str, str, str], ...]  # (include name as written, path shown, content)
    options: Tuple[str, ...]
    arch: str  # "90"
    name_expressions: Tuple[str, ...]
    key: str


class Compiled(NamedTuple):
    cubin: Path
    lowered: Dict[str, str]  # name expression -> the symbol in the cubin
    seconds: float
    cached: bool
    entries: Tuple[Tuple[str, str], ...] = ()  # every kernel in the cubin: (symbol, demangled; "" for C linkage)


@functools.lru_cache(maxsize=None)
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise KernelkitError("instant kernels need NVIDIA's cuda-bindings (pip install cuda-bindings; torch's CUDA "
                             f"wheels bring it): {e}") from None
    return nvrtc


@functools.lru_cache(maxsize=None)
def _facts() -> dict:
    """NVRTC's version and the CUDA include directory. Finding them loads NVRTC (tens of ms), so a warm
    start reads them from a small file in the cache, keyed by what decides which NVRTC is found and used
    only while the files an upgrade replaces (libnvrtc, cuda-bindings, the CUDA headers) are unchanged."""
    env = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CUDA_PATHFINDER_SEARCH")]
    key = keys.nvrtc_facts_key(sys.prefix, [FORMAT, *env])
    facts = cache.read_record("nvrtc", key)
    if isinstance(facts.get("version"), list) and isinstance(facts.get("include"), (str, type(None))) \
            and _unchanged(facts.get("files")):
        return facts
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelkitError(f"NVRTC cannot be loaded: {err}")
    include = _find_cuda_include(int(major))
    facts = {"version": [int(major), int(minor)], "include": str(include) if include else None,
             "files": {f: _identity(f) for f in _upgraded_files(include)}}
    cache.write_record("nvrtc", key, facts)  # best effort: a read-only cache finds them again next time
    return facts


def _upgraded_files(include: Optional[Path]) -> List[str]:
    """The files an upgrade of NVRTC replaces: the libnvrtc libraries this process mapped (Linux), cuda-bindings'
    version file and the CUDA include directory's cuda_fp16.h."""
    files = []
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            fields = [line.split(None, 5) for line in maps if "libnvrtc" in line]
        files += sorted({f[5].strip() for f in fields if len(f) == 6})
    bindings = sys.modules.get("cuda.bindings")
    if getattr(bindings, "__file__", None):
        files.append(str(Path(bindings.__file__).with_name("_version.py")))
    if include is not None:
        files.append(str(include / "cuda_fp16.h"))
    return [f for f in files if _identity(f) is not None]


def _identity(path: str) -> Optional[str]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}"


def _unchanged(files) -> bool:
    """Whether every file a facts record names still has the size and mtime recorded (a few stats)."""
    return isinstance(files, dict) and all(_identity(f) == identity for f, identity in files.items())


def version() -> Tuple[int, int]:
    major, minor = _facts()["version"]
    return int(major), int(minor)


def cuda_include_dir() -> Optional[Path]:
    include = _facts()["include"]
    return Path(include) if include else None


def _find_cuda_include(major: int) -> Optional[Path]:
    """Where cuda_fp16.h and friends are for NVRTC of CUDA ``major``: the CUDA toolkit, else the headers NVIDIA's
    wheels ship, the first of those of NVRTC's own major version (torch's CUDA 12 wheels next to a CUDA 13
    toolkit: NVRTC 12 with CUDA 13's headers may fail or differ), else the first found."""
    from . import toolchain  # a cold start only: its facts come from torch's cpp_extension

    home = toolchain.facts().get("cuda_home")
    candidates = [Path(str(home)) / "include"] if home else []
    for entry in sys.path:
        candidates += sorted(Path(entry).glob("nvidia/cu*/include")) + [Path(entry) / "nvidia/cuda_runtime/include"]
    found = [d for d in candidates if (d / "cuda_fp16.h").is_file()]
    same = [d for d in found if (toolchain.cuda_header_version(d) or "").split(".")[0] == str(major)]
    return (same or found or [None])[0]


def arch_for(arch) -> str:
    """One arch for a cubin, as digits ("90"): ``arch`` (``"9.0"``, ``"sm_90"``, 90), else KERNELKIT_ARCH, else
    the current GPU; without a GPU an arch must be given. KERNELKIT_ARCH may list several, as for nvcc builds
    (``"8.0;9.0+PTX"``): the current GPU's when listed, else the last one. ``+PTX`` is accepted and changes
    nothing: an instant kernel is compiled where it runs, for that GPU, so no later GPU needs its PTX."""
    if arch is not None:
        archs = _parse_archs(arch, "arch")
        if len(archs) != 1:
            raise KernelkitError(f"arch: expected one CUDA arch such as '9.0' or 'sm_90' (a cubin holds one), "
                                 f"got {arch!r}")
        return archs[0]
    env = settings.ARCH.get()
    listed = _parse_archs(env, settings.ARCH.name) if env else []
    if len(listed) == 1:
        return listed[0]
    here = _gpu_arch()
    if listed:
        return next((a for a in listed if a.rstrip("af") == here), listed[-1])
    if here is None:
        raise KernelkitError("load_kernels: no CUDA device to compile for; pass arch='9.0' (or set KERNELKIT_ARCH) "
                             "to compile without one")
    return here


def _gpu_arch() -> Optional[str]:
    import torch

    return "{}{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


def _parse_archs(spec, what: str) -> List[str]:
    """``"9.0"``, ``"sm_90a"``, ``"8.0;9.0+PTX"``, 90 -> ["90"], ["90a"], ["80", "90"], ["90"]."""
    text = str(spec).strip().lower().replace("sm_", "").replace("compute_", "").replace("+ptx", "")
    archs = [a for a in re.split(r"[;,\s]+", text) if a]
    if not archs or not all(re.fullmatch(r"\d+(\.\d)?[af]?", a) for a in archs):
        raise KernelkitError(f"{what}: expected CUDA archs such as '9.0', 'sm_90' or '8.0;9.0+PTX', got {spec!r}")
    return list(dict.fromkeys(a.replace(".", "") for a in archs))


class _Headers:
    """The local headers a program includes, transitively, found as NVRTC would look for them (the includer's
    directory for ``"..."``, then the include paths), with includes through object-like macros and forced
    includes resolved: (name as written, path shown, content) of each, to hand to NVRTC from memory."""

    def __init__(self, display: str, base: Path, include_paths: Sequence[Path], options: Sequence[str]):
        self.display, self.base, self.include_paths = display, base, list(include_paths)
        self.found: Dict[str, Tuple[str, str, str]] = {}
        self.macros: Dict[str, List[str]] = _option_macros(options)
        self.deferred: List[tuple] = []  # (macro include, directory, file shown, line): resolved once all is read

    def gather(self, text: str, forced: Sequence[str]) -> List[Tuple[str, str, str]]:
        include = cuda_include_dir()
        for name in forced:
            if not self._add('"', name, self.base) and not (include is not None and (include / name).is_file()):
                dirs = ", ".join(str(d) for d in [self.base, *self.include_paths])
                raise KernelkitError(f"options: forced include {name!r} is in none of {dirs} (nor the CUDA include "
                                     "directory)")
        self._read(text, self.base, self.display)
        progress = True
        while self.deferred and progress:  # a macro may be defined in a header read after the include naming it
            waiting, self.deferred, progress = self.deferred, [], False
            for include, here, where in waiting:
                names = _expand(include.name, self.macros)
                if names is None:
                    self.deferred.append((include, here, where))
                for kind, name in names or ():
                    progress = True
                    self._add(kind, name, here)
        if self.deferred:
            include, _, where = self.deferred[0]
            raise KernelkitError(
                f"{where}:{include.line}: #include {include.name}: kernelkit cannot tell which header this names, so "
                "NVRTC would read it unhashed (an edit would keep the old cubin); include the header by name "
                f"(#include \"x.cuh\"), or #define {include.name} as a \"quoted\" or <angled> name in the source or with "
                "-D in options")
        return sorted(self.found.values())

    def _read(self, text: str, here: Path, where: str) -> None:
        outline = scanned(text)
        for name, values in outline.macros.items():
            self.macros.setdefault(name, []).extend(values)
        for include in outline.includes:
            if include.kind == "macro":
                self.deferred.append((include, here, where))
            else:
                self._add(include.kind, include.name, here)

    def _add(self, kind: str, name: str, here: Path) -> bool:
        """Read the header ``name`` (and what it includes) if it is local; False if it is not (a system header)."""
        if name in self.found:
            return True
        dirs = ([here] if kind == '"' else []) + self.include_paths
        path = next((d / name for d in dirs if (d / name).is_file()), None)
        if path is None:
            return False
        content = path.read_text(errors="replace")
        self.found[name] = (name, shown(path), content)
        self._read(content, path.parent, shown(path))
        return True


@functools.lru_cache(maxsize=256)
def scanned(text: str) -> Outline:
    """``outline.scan(text)``, kept in the cache's ``obj/`` by content (gc'd like any object), so that a warm
    start reads a small file instead of loading tree-sitter and parsing (milliseconds on a busy machine)."""
    key = keys.scan_key(SCAN_FORMAT, text)
    found = cache.cached_object(key)
    if found is not None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return Outline.from_json(found.read_text())
    outline = scan(text)
    try:
        tmpdir = cache.private_tmpdir("scan-")
        try:
            tmp = tmpdir / "outline.txt"  # its metadata goes to outline.json
            tmp.write_text(outline.to_json())
            with cache.locked(key, "the scan of an NVRTC source"):
                cache.store_object(key, tmp, {"format": SCAN_FORMAT})
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
    except OSError:  # a read-only or full cache: scanned again next time
        pass
    return outline


def _expand(macro: str, macros: Dict[str, List[str]], depth: int = 0) -> Optional[List[Tuple[str, str]]]:
    """The header names an ``#include MACRO`` can stand for, one per definition of the macro (any branch):
    ``[('"', "k.cuh")]``; None when a definition is not a plain header name (or another such macro)."""
    if not macro.isidentifier() or macro not in macros or depth > 8:
        return None
    out: List[Tuple[str, str]] = []
    for value in macros[macro]:
        if value.startswith('"') and '"' in value[1:]:
            out.append(('"', value[1:value.index('"', 1)]))
        elif value.startswith("<") and ">" in value:
            out.append(("<", value[1:value.index(">")]))
        else:
            inner = _expand(value.split()[0], macros, depth + 1) if value.split() else None
            if inner is None:
                return None
            out += inner
    return out


def _option_macros(options: Sequence[str]) -> Dict[str, List[str]]:
    """Object-like macros the options define (``-DH="k.cuh"``, ``--define-macro=H=...``, or two tokens)."""
    found: Dict[str, List[str]] = {}
    for i, o in enumerate(options):
        if o in ("-D", "--define-macro"):
            definition = options[i + 1] if i + 1 < len(options) else ""
        elif o.startswith("--define-macro="):
            definition = o[len("--define-macro="):]
        elif o.startswith("-D"):
            definition = o[2:]
        else:
            continue
        name, _, value = definition.partition("=")
        found.setdefault(name.strip(), []).append(value.strip() or "1")
    return found


def _forced_includes(options: Sequence[str]) -> List[str]:
    """The headers ``--pre-include``/``-include`` options force into the program, as written."""
    names = []
    for i, o in enumerate(options):
        for flag in _FORCED_INCLUDES:
            if o == flag:
                if i + 1 == len(options):
                    raise KernelkitError(f"options: {o} needs a header name after it")
                names.append(options[i + 1])
            elif o.startswith(flag + "="):
                names.append(o[len(flag) + 1:])
    return names


def shown(path: Path) -> str:
    """``path`` as messages name it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve())


def plan(name: str, text: str, display: str, base: Path, include_paths: Sequence[Path] = (),
         options: Sequence[str] = (), arch=None, name_expressions: Sequence[str] = ()) -> Program:
    """Read everything a compile depends on and key it. Writes nothing."""
    options = tuple(str(o) for o in options)
    for o in options:
        if re.match(r"^(-arch|--gpu-architecture|-I|--include-path)", o):
            raise KernelkitError(f"options: {o!r} is set by kernelkit; use arch= or include_paths= instead")
        if re.match(r"^--?(use-pch|pch-dir)", o):
            raise KernelkitError(f"options: {o!r} makes NVRTC read a precompiled header file kernelkit cannot key; "
                                 "leave it out")
    dirs = [Path(p).expanduser().resolve() for p in include_paths] + [sources.INCLUDE]
    headers = tuple(_Headers(display, base, dirs, options).gather(text, _forced_includes(options)))
    arch = arch_for(arch)
    key = keys.program_key(version(), arch, str(cuda_include_dir()), options, name_expressions, text,
                           [(include_name, content) for include_name, _, content in headers],
                           "\0".join([FORMAT, *DEFAULT_OPTIONS]))
    return Program(name, display, text, headers, options, arch, tuple(name_expressions), key)


def obtain(program: Program) -> Compiled:
    """The program's cubin: from the cache, else compiled now (one process compiles; the others wait)."""
    hit = _cached(program)
    if hit is not None:
        return hit
    with cache.locked(program.key, f"the instant kernels {program.name}"):
        hit = _cached(program)
        if hit is not None:
            return hit
        return _compile(program)


def _cached(program: Program) -> Optional[Compiled]:
    cubin = cache.cached_object(program.key)
    if cubin is None:
        return None
    try:
        meta = json.loads(cubin.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    lowered, kernels = meta.get("lowered"), meta.get("kernels")
    if not isinstance(lowered, dict) or not all(isinstance(v, str) for v in lowered.values()):
        return None
    if not isinstance(kernels, list) or not all(isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)
                                                for e in kernels):
        return None
    return Compiled(cubin, lowered, 0.0, True, tuple((symbol, demangled) for symbol, demangled in kernels))


def _check(result, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelkitError(f"NVRTC {what} failed: {result}")


def _compile(program: Program) -> Compiled:
    from .progress import Status  # only when compiling: a warm start does not need it

    include = [f"--include-path={d}" for d in (cuda_include_dir(),) if d is not None]
    options = [f"--gpu-architecture=sm_{program.arch}", *DEFAULT_OPTIONS, *include, *program.options]
    with Status(f"{program.name}: compiling with NVRTC (sm_{program.arch})") as status:
        cubin, lowered, log = _run(program, options)
        seconds = status.elapsed
    entries = kernel_entries(cubin)
    info = {"format": FORMAT, "name": program.name, "arch": program.arch, "lowered": lowered,
            "kernels": [list(e) for e in entries], "source": program.display, "seconds": round(seconds, 4)}
    final = store(program, cubin, info)
    if log.strip():
        import logging

        logging.getLogger("kernelkit").info("%s: NVRTC says:\n%s", program.display, log.strip())
    return Compiled(final, lowered, seconds, False, entries)


def _run(program: Program, options: List[str]) -> Tuple[bytes, Dict[str, str], str]:
    """NVRTC's compile of ``program``: (the cubin, each name expression's symbol, NVRTC's log)."""
    from ..diagnostics import parse_diagnostics  # only when compiling: a warm start does not need it

    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(program.text.encode(), program.display.encode(), len(program.headers),
                                         [h[2].encode() for h in program.headers],
                                         [h[0].encode() for h in program.headers])
    _check(err, "nvrtcCreateProgram")
    try:
        for expr in program.name_expressions:
            _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode())[0], f"adding the name expression {expr!r}")
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        log = _log(prog)
        if result == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION:
            raise KernelkitError(f"options: NVRTC rejected one of {list(program.options)}: {log.strip()}")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            shown = {h[0]: h[1] for h in program.headers}
            texts = {program.display: program.text.splitlines(), **{h[1]: h[2].splitlines() for h in program.headers}}
            raise BuildError(f"compiling {program.display} with NVRTC", parse_diagnostics(log, shown, texts), log,
                             ["nvrtc", *options])
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
        lowered = {}
        for expr in program.name_expressions:
            err, sym = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(err, f"nvrtcGetLoweredName({expr!r})")
            lowered[expr] = sym.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, lowered, log


def store(program: Program, cubin: bytes, info: dict) -> Path:
    """Publish ``cubin`` with its metadata ``info`` under the program's key (the caller holds its lock); the
    private temporary directory it is written in first is removed, whatever happens."""
    tmpdir = cache.private_tmpdir("nvrtc-")
    try:
        tmp = tmpdir / "kernels.cubin"
        with cache.writing(tmp):
            tmp.write_bytes(cubin)
        return cache.store_object(program.key, tmp, info)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def kernel_entries(cubin: bytes) -> List[Tuple[str, str]]:
    """Every kernel a cubin holds, as (symbol, demangled name; "" for C linkage), from its ELF symbol table:
    the functions flagged as entry points (``st_other`` 0x10, a CUDA flag that pyelftools does not decode)."""
    if cubin[:4] != b"\x7fELF" or cubin[4:6] != b"\x02\x01":
        raise KernelkitError("NVRTC returned a cubin that is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    entries = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2 or not entsize:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name, info, other = struct.unpack_from("<IBB", cubin, at)
            if info & 0xF == _STT_FUNC and other & _STO_CUDA_ENTRY:
                symbol = cubin[strings + name:cubin.index(b"\0", strings + name)].decode()
                entries.append((symbol, _demangle(symbol)))
    return entries


@functools.lru_cache(maxsize=None)
def _demangler():
    """The C++ runtime's ``__cxa_demangle`` (libstdc++, which torch loads) and libc's ``free``; None without them."""
    import ctypes

    try:
        fn = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                                ctypes.POINTER(ctypes.c_int)]
    free.argtypes = [ctypes.c_void_p]
    return fn, free


def _demangle(symbol: str) -> str:
    """``"_ZN2ns5scaleEPf"`` -> ``"ns::scale(float*)"``; "" for a C-linkage name (or without a demangler)."""
    import ctypes

    found = _demangler() if symbol.startswith("_Z") else None
    if found is None:
        return ""
    fn, free = found
    status = ctypes.c_int()
    text = fn(symbol.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not text:
        return ""
    try:
        return ctypes.string_at(text).decode(errors="replace")
    finally:
        free(text)


def _log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")
