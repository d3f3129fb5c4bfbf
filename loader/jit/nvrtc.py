"""Compiling kernel-only CUDA C++ in-process with NVRTC, into the content-addressed cache.

NVRTC (through NVIDIA's ``cuda-bindings``, which torch's CUDA wheels install) compiles a small kernel in
tens of milliseconds without starting a process, and without a GPU when the arch is given. The program
is compiled from exactly the bytes that were hashed: the source and every local header it includes are
handed to NVRTC from memory, so an edit during a compile can never be cached under the old key. The
cubin is kept in the cache's ``obj/`` like any object (sha256 recorded and verified before use).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import BuildError, KernelkitError
from . import cache, sources

FORMAT = "kernelkit-nvrtc-1"
DEFAULT_OPTIONS = ("--std=c++17", "-lineinfo")


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
    start reads them from a small file in the cache, keyed by what decides which NVRTC is found."""
    env = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CUDA_PATHFINDER_SEARCH")]
    key = hashlib.sha256("\0".join([FORMAT, sys.prefix, *env]).encode()).hexdigest()[:24]
    path = cache.cache_dir() / f"nvrtc-{key}.json"
    try:
        facts = json.loads(path.read_text())
        if isinstance(facts.get("version"), list) and isinstance(facts.get("include"), (str, type(None))):
            return facts
    except (OSError, ValueError, AttributeError):
        pass
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelkitError(f"NVRTC cannot be loaded: {err}")
    include = _find_cuda_include()
    facts = {"version": [int(major), int(minor)], "include": str(include) if include else None}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with contextlib.suppress(OSError):  # a read-only cache: found again next time
        tmp.write_text(json.dumps(facts))
        os.replace(tmp, path)
    return facts


def version() -> Tuple[int, int]:
    major, minor = _facts()["version"]
    return int(major), int(minor)


def cuda_include_dir() -> Optional[Path]:
    include = _facts()["include"]
    return Path(include) if include else None


def _find_cuda_include() -> Optional[Path]:
    """Where cuda_fp16.h and friends are: the CUDA toolkit, else the headers NVIDIA's wheels ship."""
    from . import toolchain  # a cold start only: its facts come from torch's cpp_extension

    home = toolchain.facts().get("cuda_home")
    candidates = [Path(str(home)) / "include"] if home else []
    for entry in sys.path:
        candidates += sorted(Path(entry).glob("nvidia/cu*/include")) + [Path(entry) / "nvidia/cuda_runtime/include"]
    return next((d for d in candidates if (d / "cuda_fp16.h").is_file()), None)


def arch_for(arch) -> str:
    """One arch for a cubin, as digits ("90"): ``arch`` (``"9.0"``, ``"sm_90"``, 90), else KERNELKIT_ARCH,
    else the current GPU; without a GPU an arch must be given."""
    if arch is None:
        arch = os.environ.get("KERNELKIT_ARCH") or None
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            raise KernelkitError("load_kernels: no CUDA device to compile for; pass arch='9.0' (or set KERNELKIT_ARCH) "
                                 "to compile without one")
        return "{}{}".format(*torch.cuda.get_device_capability())
    text = str(arch).strip().lower().replace("sm_", "").replace("compute_", "").replace("+ptx", "")
    archs = [a for a in re.split(r"[;,\s]+", text) if a]
    if len(archs) != 1 or not re.fullmatch(r"\d+(\.\d)?[af]?", archs[0]):
        raise KernelkitError(f"arch: expected one CUDA arch such as '9.0' or 'sm_90' (a cubin holds one), got {arch!r}")
    a = archs[0]
    return a.replace(".", "") if "." in a else a


def _headers(text: str, base: Path, include_paths: Sequence[Path]) -> List[Tuple[str, str, str]]:
    """Local headers ``text`` includes, transitively: (name as written, path shown, content). System
    headers (found in no local directory) are left to NVRTC and the CUDA include directory."""
    found: Dict[str, Tuple[str, str, str]] = {}
    stack = [(text, base)]
    while stack:
        body, here = stack.pop()
        for kind, name in sources.includes(body):
            if name in found:
                continue
            dirs = ([here] if kind == '"' else []) + list(include_paths)
            path = next((d / name for d in dirs if (d / name).is_file()), None)
            if path is None:
                continue
            content = path.read_text(errors="replace")
            found[name] = (name, shown(path), content)
            stack.append((content, path.parent))
    return sorted(found.values())


def shown(path: Path) -> str:
    """``path`` as messages name it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path.resolve())


def plan(name: str, text: str, display: str, base: Path, include_paths: Sequence[Path] = (),
         options: Sequence[str] = (), arch=None, name_expressions: Sequence[str] = ()) -> Program:
    """Read everything a compile depends on and key it. Writes nothing."""
    dirs = [Path(p).expanduser().resolve() for p in include_paths] + [sources.INCLUDE]
    headers = tuple(_headers(text, base, dirs))
    arch = arch_for(arch)
    options = tuple(str(o) for o in options)
    for o in options:
        if re.match(r"^(-arch|--gpu-architecture|-I|--include-path)", o):
            raise KernelkitError(f"options: {o!r} is set by kernelkit; use arch= or include_paths= instead")
    h = hashlib.sha256()
    for part in (FORMAT, "nvrtc=%d.%d" % version(), arch, str(cuda_include_dir()), *options, "\0",
                 *name_expressions, "\0", text):
        h.update(part.encode() + b"\0")
    for include_name, _, content in headers:
        h.update(include_name.encode() + b"\0" + content.encode() + b"\0")
    return Program(name, display, text, headers, options, arch, tuple(name_expressions), h.hexdigest())


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
    lowered = meta.get("lowered") if isinstance(meta, dict) else None
    if meta.get("format") != FORMAT or not isinstance(lowered, dict) or not all(
            isinstance(v, str) for v in lowered.values()):
        return None
    return Compiled(cubin, lowered, 0.0, True)


def _check(result, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelkitError(f"NVRTC {what} failed: {result}")


def _compile(program: Program) -> Compiled:
    from ..diagnostics import parse_diagnostics  # these two only when compiling: a warm start needs neither
    from .progress import Status

    nvrtc = _nvrtc()
    include = [f"--include-path={d}" for d in (cuda_include_dir(),) if d is not None]
    options = [f"--gpu-architecture=sm_{program.arch}", *DEFAULT_OPTIONS, *include, *program.options]
    with Status(f"{program.name}: compiling with NVRTC (sm_{program.arch})") as status:
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
        seconds = status.elapsed
    tmp = cache.private_tmpdir(f"{program.name}-nvrtc-") / "kernels.cubin"
    tmp.write_bytes(cubin)
    info = {"format": FORMAT, "name": program.name, "arch": program.arch, "lowered": lowered,
            "source": program.display, "seconds": round(seconds, 4)}
    final = cache.store_object(program.key, tmp, info)
    with_warnings = log.strip()
    if with_warnings:
        import logging

        logging.getLogger("kernelkit").info("%s: NVRTC says:\n%s", program.display, with_warnings)
    return Compiled(final, lowered, seconds, False)


def _log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")
