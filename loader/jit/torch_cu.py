"""Building a ``.cu`` that includes torch's headers (the shape of users' torch-style code) the fast way.

nvcc as written parses torch's headers in three front ends (~45 s per edit). When ``split`` can prove it
builds what nvcc builds, the file becomes a host TU for g++ (cached by its text, which a kernel-body edit
leaves unchanged) and a torch-free device TU for nvcc (about a second), joined into one relocatable object
(``ld -r``) cached under the unit's key, so the rest of the build sees one object per source as always. The
host TU includes the file's leading torch includes as a header of their own (its preamble), which gcc takes
precompiled where KERNELKIT_PCH allows: a host edit then costs the host code, not torch's headers again.
Anything the split refuses, or a step that fails for a reason that is not plainly the user's code, builds
the file as written: slower, never different.

An edit inside the bodies of device-only functions keeps a TU's host shape (``keys.host_shape_key``): then
only its device code is compiled (``nvcc --fatbin``) and placed into the object of the earlier text, for the
device TU of a split and for a file built as written alike (``build.compile_as_written``;
``KERNELKIT_DEVICE_REBUILD=0`` turns it off).

``KERNELKIT_TORCH_CU``: ``auto`` (default) splits where it can; ``split`` insists (a file that cannot be split
is an error saying why); ``full`` builds every such file as written.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import List, Optional, Tuple

from ..diagnostics import Diagnostic
from ..errors import BuildError, KernelkitError
from . import build as _build
from . import cache, keys, sources, split
from .progress import say

STRATEGIES = ("auto", "split", "full")
#: diagnostics that may mean the device TU's prelude lacks a declaration torch's headers gave the file
_MISSING = re.compile(r"undefined|not declared|no member|has no member|incomplete type|not a template|"
                      r"unknown type|does not name a type|no instance of|identifier .* is undefined")


def strategy() -> str:
    value = os.environ.get("KERNELKIT_TORCH_CU", "auto").strip().lower() or "auto"
    if value not in STRATEGIES:
        raise KernelkitError(f"KERNELKIT_TORCH_CU={value!r}: expected one of {', '.join(STRATEGIES)}")
    return value


def applies(unit: _build.Unit) -> bool:
    """A torch-style ``.cu`` that includes torch's headers (what the other strategies are for)."""
    return unit.kind == "cu" and unit.uses_torch


def prepare(unit: _build.Unit) -> None:
    """Give a torch-including .cu this module's builder, and a key that names the strategy asked for."""
    if applies(unit):
        unit.builder = compile_unit
        unit.key = keys.build_variant_key(unit.key, f"torch-cu={strategy()}")


def compile_unit(unit: _build.Unit, target: _build.Target, out: Path, depfile: Path) -> None:
    """Write ``unit``'s object at ``out``: through the split where it applies, else nvcc on the file."""
    chosen = strategy()
    reason = _split_into(unit, target, out) if chosen != "full" else "KERNELKIT_TORCH_CU=full"
    if reason is None:
        return
    if chosen == "split":
        raise KernelkitError(f"{unit.display}: KERNELKIT_TORCH_CU=split, but the file cannot be split: {reason}. "
                             "Unset it (auto) to build such a file as written.")
    t0 = time.perf_counter()
    _build.compile_as_written(unit, target, out, depfile)
    seconds = time.perf_counter() - t0
    if unit.device_only:
        say(f"{unit.display}: device code only ({reason}; the host side of an earlier build reused) {seconds:.1f} s")
        return
    say(f"{unit.display}: full nvcc build ({reason}) {seconds:.1f} s")
    if seconds >= _build.SLOW_TORCH_UNIT_SECONDS:
        _build.torch_cost_advice(unit, seconds, f" (kernelkit could not split it: {reason})")


def _split_into(unit: _build.Unit, target: _build.Target, out: Path) -> Optional[str]:
    """None when ``out`` holds the split build; else why the file is to be built as written."""
    text = unit.path.read_text(errors="surrogateescape")
    original, offset = _user_file(unit, text)
    if offset:  # kernelkit's own mark goes: the split cites lines of this file, moved back by _relined
        lines = text.split("\n")
        text = "\n".join(lines[:offset - 1] + [""] + lines[offset:])
    include_dirs = [unit.path.parent, *_include_dirs(unit.flags)]
    # a generated file lives under its content's hash: the split names it as the user knows it, so that
    # the host TU (its #line marks, its launchers' names) stays the same across kernel-body edits
    cited = original if offset else str(unit.path)
    result = split.split_source(text, cited, split.local_headers(include_dirs))
    if isinstance(result, split.Unsplittable):
        return f"{result.reason}" + (f" at line {result.line - offset}" if result.line > offset else "")
    host_flags = split.host_flags(unit.flags)
    if host_flags is None:
        return "a flag in extra_cuda_cflags has no known meaning for the host compiler"
    objects, notes = {}, {}
    # the device TU first where it can be (a typo in a kernel is reported in about a second); template
    # launchers need the host object first, which says what to instantiate
    for what in ("host", "device") if result.templated else ("device", "host"):
        if what == "host":
            part = _host_unit(result, original, offset, unit, host_flags)
        else:
            try:
                text = split.device_text(result, objects.get("host"))
            except split.InstantiationError as e:
                return str(e)
            part = _sub_unit("cu", _relined(text, original, offset), f"{unit.path.stem}.device.cu", unit,
                             unit.flags)
        objects[what], why, notes[what] = _compiled(part, target, unit, what)
        if objects[what] is None:
            return why
    _build.join_objects([objects["host"], objects["device"]], out, target)
    say(f"{unit.display}: split ({len(result.kernels)} kernel(s)): device TU {notes['device']}, host TU {notes['host']}")
    return None


def _user_file(unit: _build.Unit, text: str) -> Tuple[str, int]:
    """The path the user knows and the lines kernelkit put before their code: load_inline's ``cuda.cu`` starts
    with torch's implicit includes and a ``#line 1 "name/cuda.cu"`` mark."""
    lines = text.split("\n", 8)
    for i, line in enumerate(lines[:6]):
        m = re.fullmatch(r'#line 1 "(.+)"', line.strip())
        if m and all(ln.strip().startswith("#include") for ln in lines[:i]):
            return m.group(1), i + 1
    return str(unit.path), 0


_MARK = re.compile(r'^#line (\d+) "(.*)"$', re.M)


def _relined(text: str, original: str, offset: int) -> str:
    """Where kernelkit generated the file (load_inline's cuda.cu: its implicit includes before the user's code)
    the split's ``#line`` marks count its lines: they are moved back to the user's own (the includes' lines
    are cited as the first)."""
    if not offset:
        return text
    wanted = _quoted(original)

    def move(m):
        return m.group(0) if m.group(2) != wanted else f'#line {max(int(m.group(1)) - offset, 1)} "{wanted}"'

    return _MARK.sub(move, text)


def _quoted(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')


def _include_dirs(flags: List[str]) -> List[Path]:
    """The user's own include dirs (torch's, CUDA's and the system's hold no headers of theirs to inline)."""
    dirs, tokens = [], iter(flags)
    for f in tokens:
        if f in ("-I", "--include-path"):
            dirs.append(Path(next(tokens, "")))
        elif f.startswith("-I") and len(f) > 2:
            dirs.append(Path(f[2:]))
    return [d for d in dirs if not sources.under(d.resolve(), keys.toolchain_dirs())]


def _host_unit(result: split.Split, original: str, offset: int, unit: _build.Unit,
               flags: List[str]) -> _build.Unit:
    """The host TU. Where the file starts with torch's includes, that start (the split's preamble) is a header
    of its own, named by its content and included first, which gcc can take precompiled (``build._pch_plan``)."""
    name = f"{unit.path.stem}.host.cpp"
    if not result.preamble:
        return _sub_unit("cpp", _relined(result.host, original, offset), name, unit, flags)
    digest = sources.sha256_bytes(result.preamble.encode())[:16]
    header = cache.write_source(result.preamble, f"kk_host_preamble_{digest}.h")
    text = f"#include <{header.name}>\n" + _relined(result.host_rest, original, offset)
    return _sub_unit("cpp", text, name, unit, flags, pch_header=header)


def _sub_unit(kind: str, text: str, filename: str, unit: _build.Unit, flags: List[str],
              pch_header: Optional[Path] = None) -> _build.Unit:
    """A generated TU, cached by its own text: ``-I`` of the user's directory, where its quoted includes
    were found when the file was compiled as written (and of its preamble's, after it)."""
    path = cache.write_source(text, filename)
    extra = [f for f in flags if f not in (f"-I{unit.path.parent}",)]
    dirs = [unit.path.parent] + ([pch_header.parent] if pch_header else [])
    return _build.plan_unit(kind, path, text, dirs, extra, [], f"{unit.display} ({kind} part)",
                            optimize=None, torch_style=True, pch_header=pch_header)


def _compiled(part: _build.Unit, target: _build.Target, unit: _build.Unit,
              what: str) -> Tuple[Optional[Path], str, str]:
    """(object, "", "cached" or its seconds) or (None, why the file is to be built as written, ""). A compile
    error that is plainly the user's (every error in their file, none a missing declaration) is raised at
    once: nvcc on the file as written would only say it again, slower."""
    cached = cache.cached_object(part.key) is not None
    t0 = time.perf_counter()
    try:
        obj = _build.compile_cached(part, target)
    except BuildError as e:
        if _users_error(e.diagnostics, target, unit):
            raise BuildError(f"compiling {unit.display} (split into host and device TUs; KERNELKIT_TORCH_CU=full "
                             "builds it as written)", e.diagnostics, e.log, e.command) from None
        first = next((d for d in e.diagnostics if d.severity in ("error", "fatal error")), None)
        return None, f"the {what} part did not compile ({first.message if first else 'no diagnostic'})", ""
    how = " (device code only)" if part.device_only else ""
    return obj, "", "cached" if cached else f"{time.perf_counter() - t0:.1f} s{how}"


def _users_error(diagnostics: List[Diagnostic], target: _build.Target, unit: _build.Unit) -> bool:
    """Every error cites the user's file, and none can be a declaration the split left behind: a name that
    is not found is the user's only when it is written nowhere else in their file (a typo), and is no torch
    name (which torch's headers, absent from the device TU, would have declared)."""
    errors = [d for d in diagnostics if d.severity in ("error", "fatal error")]
    mine = {unit.display, target.display.get(str(unit.path), str(unit.path)), str(unit.path)}
    if not errors or any(d.file not in mine for d in errors):
        return False
    text = unit.path.read_text(errors="replace")
    return all(not _MISSING.search(d.message) or _a_typo(d, text) for d in errors)


_NAMED = re.compile(r"[\"'‘’]([A-Za-z_][\w:]*)[\"'‘’]")
_TORCH_NAME = re.compile(r"^(?:at|c10|torch|caffe2)(?:::|$)|^(?:C10|AT|TORCH|CUDA_KERNEL)_")


def _a_typo(d: Diagnostic, text: str) -> bool:
    names = _NAMED.findall(d.message)
    return bool(names) and all(not _TORCH_NAME.search(n) and text.count(n.split("::")[-1]) <= 1 for n in names)
