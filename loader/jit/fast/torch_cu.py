"""Building a ``.cu`` that includes torch's headers (the shape of users' torch-style code) the fast way.

nvcc as written parses torch's headers in three front ends (~45 s per edit). When ``split`` can take the file
apart, it becomes a host TU for g++ (``jit.host_lines``: cached by its text with its line numbers left out, so an
edit that moves lines compiles nothing there) and a torch-free device TU for nvcc (about a second), joined into
one relocatable object cached under the unit's key, so the rest of the build sees one object per source as
always. Before a split's object is first used for a file, the proof (``jit.split_proof``) compares its device
code with nvcc's on the file as written, while the host TU compiles; an edit later uses the split at once where
it names nothing the proof has not seen (``_covered``), and is proven again in the background. A mismatch builds
the file as written, then and from then on, saying why; so does anything the split refuses, or a step that
fails for a reason that is not plainly the user's code: slower, never different.

``KERNELKIT_TORCH_CU``: ``auto`` (default) splits where it can; ``split`` insists (a file that cannot be split
is an error saying why); ``full`` builds every such file as written.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from ... import settings
from ...diagnostics import Diagnostic
from ...errors import BuildError, KernelkitError
from .. import cache, inputs, keys, prebuilt, running, sources, toolchain, units
from ..advice import SLOW_TORCH_UNIT_SECONDS, torch_cost_advice
from ..progress import say
from ..units import Target, Unit
from . import host_lines, split, split_proof, torch_headers
from .split import instantiate

log = logging.getLogger("kernelkit")

VERSION = "split-3"  # the construction: a change gives every split object a new key
#: diagnostics that may mean the device TU lacks a declaration torch's headers gave the file
_MISSING = re.compile(r"undefined|not declared|no member|has no member|incomplete type|not a template|"
                      r"unknown type|does not name a type|no instance of|identifier .* is undefined")


def strategy() -> str:
    """The strategy asked for: KERNELKIT_TORCH_CU, or ``full`` where KERNELKIT_FAST=0 turns the split off."""
    value = settings.TORCH_CU.get()
    return value if settings.fast_path("torch_cu_split") else "full"


def applies(unit: Unit) -> bool:
    """A torch-style ``.cu`` that includes torch's headers (what the other strategies are for)."""
    return unit.kind == "cu" and unit.uses_torch


NAME = "torch_cu"  # what the unit's strategy says once this module claimed it


def claim(unit: Unit) -> Optional[Unit]:
    """A torch-including .cu, claimed: its key names the strategy asked for. None: not such a file."""
    if not applies(unit):
        return None
    return dataclasses.replace(unit, strategy=NAME,
                               key=keys.build_variant_key(unit.key, f"torch-cu={strategy()}/{VERSION}"))


def compile_split(unit: Unit, target: Target, out: Path, depfile: Path, core) -> Optional[dict]:
    """Write a claimed unit's object at ``out``: through the split where it applies, else nvcc on the file (through
    ``core``, saying why and what it cost). None: a unit this module did not claim."""
    if unit.strategy != NAME:
        return None
    chosen = strategy()
    fallback = _split_into(unit, target, out, core) if chosen != "full" else \
        _Fallback("KERNELKIT_TORCH_CU=full" if settings.TORCH_CU.get() == "full" else "KERNELKIT_FAST=0")
    if fallback is None:
        return {"split": True}
    reason = fallback.reason
    if chosen == "split":
        raise KernelkitError(f"{unit.display}: KERNELKIT_TORCH_CU=split, but the file cannot be split: {reason}. "
                             "Unset it (auto) to build such a file as written.")
    t0 = time.perf_counter()
    made = core.compile_as_written(unit, target, out, depfile)
    seconds = time.perf_counter() - t0
    if fallback.host_key:  # the file as written compiled: that host TU's failure was the split's, every time
        _remember_host_failure(fallback, reason)
    if made.get("device_only"):
        say(f"{unit.display}: device code only ({reason}; the host side of an earlier build reused) {seconds:.1f} s")
        return made
    say(f"{unit.display}: full nvcc build ({reason}) {seconds:.1f} s")
    if seconds >= SLOW_TORCH_UNIT_SECONDS:
        torch_cost_advice(unit, seconds, f" (kernelkit could not split it: {reason})")
    return made


# ------------------------------------------------------------------------------------------- the split
class _Fallback(NamedTuple):
    """Why a file is built as written; where its host TU failed to compile, that TU's key in the frame's record
    (``frame``), to remember once the file as written compiles (the failure was then the split's)."""
    reason: str
    part: str = ""  # "host" or "device": the part that did not compile
    frame: str = ""
    host_key: str = ""


def _split_into(unit: Unit, target: Target, out: Path, core) -> Optional[_Fallback]:
    """None when ``out`` holds the split build; else why the file is to be built as written."""
    before = inputs.snapshot(unit)
    text, cited, first = user_text(unit)
    result = split.split_source(text, cited, split.local_headers(_include_dirs(unit.flags)), torch_headers.heavy,
                                first_line=first)
    if isinstance(result, split.Unsplittable):
        return _Fallback(result.reason + (f" at line {result.line}" if result.line else ""))
    frame = _frame_key(unit, result)
    record = _frame_record(frame)
    if record.get("refused"):
        return _Fallback(f"{record['refused']} (found earlier for this file)")
    host_flags = split.host_flags(unit.flags)
    if host_flags is None:
        return _Fallback("a flag in extra_cuda_cflags has no known meaning for the host compiler")
    if not _arch_flags(unit.flags)[1]:  # the proof compiles the file's PTX for each arch: none read, none proven
        return _Fallback("its flags name no GPU code kernelkit can read (an -arch or -gencode value such as native "
                         "or lto_XX)")
    if "," in str(unit.path.parent):
        return _Fallback("a comma in the name of the file's folder (nvcc splits -Xcompiler values at commas)")
    host_unit = _host_unit(result, unit, host_flags)
    lines = host_lines.lines_key(host_unit, result.host)  # hashes the host TU's headers: once per build
    host_key = lines[:32]
    if host_key in record.get("host_failed", {}):
        return _Fallback(f"{record['host_failed'][host_key]} (found earlier for this host code)")
    names_key = _torch_names_key(unit, result)
    _wait_for_names(names_key)  # recorded by an earlier build of this process, sooner than a proof of this one
    covered = _covered(record, result, cache.read_record("torch-names", names_key).get("names"))
    proof = None if covered else Proof(unit, target, nice=False, names_key=names_key, result=result)
    pool, used = concurrent.futures.ThreadPoolExecutor(1), False
    try:
        parts = _compiled_parts(result, unit, host_unit, lines, target, pool, core)
        if isinstance(parts, _Fallback):
            return parts._replace(frame=frame, host_key=host_key) if parts.part == "host" else parts
        device_unit, device, host, table = parts
        why = _proven(proof, unit, device_unit, frame, record, result, before) if proof is not None else None
        if why is not None:
            return _Fallback(why)
        used = True
    finally:
        pool.shutdown(wait=False)  # a device TU's error is said at once; the host TU's object is cached for later
        if proof is not None:
            proof.cancel(names_too=not used)
    try:
        _bind(result, device, host, table, out, target)
    except BuildError as e:  # the parts compiled but do not join (a name both define): the split's failure
        why = f"the split's objects do not join: {_join_failure(str(e))}"
        _store_frame(frame, {**_frame_record(frame), "refused": why})
        return _Fallback(why)
    if covered:
        _audit_later(unit, target, (device_unit, device_unit.path.read_text(errors="surrogateescape")), frame,
                     before)
    say(f"{unit.display}: split ({len(result.kernels)} kernel(s)): device TU {device.note}, host TU {host.note}"
        + ("" if covered else ", its device code proven the same as the file's as written"))
    return None


def _proven(proof: "Proof", unit: Unit, device_unit: Unit, frame: str, record: dict,
            result: split.Split, before) -> Optional[str]:
    """None when the proof found the device TU's code the file's own (the frame's record then holds the names it
    saw); else why not, which the record keeps unless the file changed under the proof."""
    why = proof.difference(device_unit, device_unit.path.read_text(errors="surrogateescape"))
    if why is None:
        _store_frame(frame, {**record, "proven": sorted(set(record.get("proven", [])) | set(result.names))})
    elif inputs.snapshot(unit) == before:
        _store_frame(frame, {**record, "refused": why})
    return why


def user_text(unit: Unit) -> Tuple[str, str, int]:
    """The text to split, the path it cites and the number of its first line. A generated source names itself
    with a ``#line 1 "<path>"`` mark: as its first line (load_inline's ``cuda.cu``, named as torch would have
    written it), or after the includes kernelkit put before the user's code (kernelkit's inline form)."""
    text = unit.path.read_text(errors="surrogateescape")
    if not cache.is_generated_source(unit.path):
        return text, str(unit.path), 1
    lines = text.split("\n")
    for i, line in enumerate(lines[:8]):
        if line.startswith('#line 1 "') and line.endswith('"'):
            if not all(ln.startswith("#include <") for ln in lines[:i]):
                break
            cited = line[len('#line 1 "'):-1].replace('\\"', '"').replace("\\\\", "\\")
            return "\n".join(lines[:i] + lines[i + 1:]), cited, 1 - i
    return text, str(unit.path), 1


def _include_dirs(flags: List[str]) -> List[Path]:
    """The user's own include dirs, in the compiler's order (torch's, CUDA's and the system's hold no headers of
    theirs): their headers are written into both TUs."""
    search = sources.include_search(flags, True, keys.toolchain_dirs())
    return [*search.quote, *search.angle]


class _Part:
    """A compiled part of a split: its object and how it came (seconds, or cached), for the build line."""

    def __init__(self, obj: Path, note: str):
        self.obj, self.note = obj, note


def _compiled_parts(result: split.Split, unit: Unit, host_unit: Unit, lines: str, target: Target, pool, core):
    """(device unit, device part, host part, line table) or why the file is to be built as written. Host and
    device TUs compile side by side, but a templated file's device TU instantiates what the host object calls.
    A device TU that lacks a declaration is tried once more with every light header in its prelude."""
    host = pool.submit(_host_part, host_unit, lines, result, target, unit, core)
    undefined: List = []
    if result.templated:
        host_obj, table = host.result()
        if isinstance(host_obj, _Fallback):
            return host_obj
        undefined = instantiate.symbols(host_obj.obj, undefined=True)
    device_unit = device = None
    for whole in (False, True):
        try:
            text = split.device_text(result, undefined, whole_prelude=whole)
        except split.InstantiationError as e:
            return _Fallback(str(e))
        if whole and text == device_unit.path.read_text(errors="surrogateescape"):
            break  # the prelude was whole already
        device_unit = _sub_unit("cu", text, f"{unit.path.stem}.device.cu", unit, unit.flags)
        device = _compiled(device_unit, target, unit, "device", core)
        if not isinstance(device, _Fallback):
            break
    host_obj, table = host.result()
    if isinstance(device, _Fallback):
        return device
    if isinstance(host_obj, _Fallback):
        return host_obj
    return device_unit, device, host_obj, table


def _host_unit(result: split.Split, unit: Unit, flags: List[str]) -> Unit:
    """The host TU. Where the file starts with torch's includes, that start (the split's preamble) is a header
    of its own, named by its content and included first, which gcc can take precompiled (``fast.pch``)."""
    name = f"{unit.path.stem}.host.cpp"
    tu = result.host
    if not tu.preamble:
        return _sub_unit("cpp", tu.text, name, unit, flags)
    header = cache.write_source(tu.preamble, tu.preamble_name)
    return _sub_unit("cpp", tu.text, name, unit, flags, pch_header=header)


def _host_part(host_unit: Unit, lines: str, result: split.Split, target: Target, unit: Unit, core):
    cached = cache.cached_object(lines) is not None
    t0 = time.perf_counter()
    try:
        obj, table = host_lines.compile_host(host_unit, result.host, target, core, lines)
    except BuildError as e:
        return _failed(e, target, unit, "host", result.device_kept, judged=not result.host.left_out), None
    note = "cached" if cached else f"{time.perf_counter() - t0:.1f} s"
    return _Part(obj, note), table


def _sub_unit(kind: str, text: str, filename: str, unit: Unit, flags: List[str],
              pch_header: Optional[Path] = None) -> Unit:
    """A generated TU, cached by its own text. Its quoted includes that were not written into it are looked for
    where the file's own would be (``-iquote`` its dir: no ``<...>`` include changes; none for a file kernelkit
    generated, whose dir is named for its text and holds nothing else), and the preamble's dir."""
    path = cache.write_source(text, filename)
    here = [] if cache.is_generated_source(unit.path) else [str(unit.path.parent)]
    quote = [f for d in here for f in (["-Xcompiler", f"-iquote,{d}"] if kind == "cu" else ["-iquote", d])]
    extra = [*quote, *flags]
    dirs = [pch_header.parent] if pch_header else []
    return units.plan_unit(kind, path, text, dirs, extra, [], f"{unit.display} ({kind} part)",
                            optimize=None, torch_style=True, pch_header=pch_header)


def _compiled(part: Unit, target: Target, unit: Unit, what: str, core):
    """The part compiled (cached when it was) or why the file is to be built as written. A compile error that is
    plainly the user's (every error in their file, none a missing declaration) is raised at once: nvcc on the
    file as written would only say it again, slower."""
    cached = cache.cached_object(part.key) is not None
    t0 = time.perf_counter()
    try:
        obj = core.compile_cached(part, target)
    except BuildError as e:
        return _failed(e, target, unit, what)
    return _Part(obj, "cached" if cached else f"{time.perf_counter() - t0:.1f} s")


def _failed(e: BuildError, target: Target, unit: Unit, what: str,
            nvcc_judges: FrozenSet[Tuple[str, int]] = frozenset(), judged: bool = True) -> _Fallback:
    """The user's error, raised; else why the part is to be built as written. ``judged``: whether this part's
    compiler may judge the user's code at all (not a host TU that left out a header the file includes)."""
    if judged and _users_error(e.diagnostics, target, unit, nvcc_judges):
        raise BuildError(f"compiling {unit.display} (split into host and device TUs; KERNELKIT_TORCH_CU=full "
                         "builds it as written)", e.diagnostics, e.log, e.command) from None
    first = next((d for d in e.diagnostics if d.severity in ("error", "fatal error")), None)
    return _Fallback(f"the {what} part did not compile ({first.message if first else 'no diagnostic'})", what)


def _users_error(diagnostics: List[Diagnostic], target: Target, unit: Unit,
                 nvcc_judges: FrozenSet[Tuple[str, int]] = frozenset()) -> bool:
    """Every error cites the user's file, on no line whose meaning depends on the compiler (``nvcc_judges``:
    lines the host TU's g++, which lacks nvcc's ``__CUDACC__`` view of CUDA's headers, shares with device code),
    and none can be a declaration the split left behind: a name that is not found is the user's only when it is
    written nowhere else in their file (a typo), and is no torch name (which torch's headers, absent from the
    device TU, would have declared)."""
    errors = [d for d in diagnostics if d.severity in ("error", "fatal error")]
    mine = {unit.display, target.display.get(str(unit.path), str(unit.path)), str(unit.path)}
    if not errors or any(d.file not in mine or (Path(d.file).name, d.line) in nvcc_judges for d in errors):
        return False
    text = unit.path.read_text(errors="replace")
    return all(not _MISSING.search(d.message) or _a_typo(d, text) for d in errors)


_NAMED = re.compile(r"[\"'‘’]([A-Za-z_][\w:]*)[\"'‘’]")
_TORCH_NAME = re.compile(r"^(?:at|c10|torch|caffe2)(?:::|$)|^(?:C10|AT|TORCH|CUDA_KERNEL)_")


def _a_typo(d: Diagnostic, text: str) -> bool:
    names = _NAMED.findall(d.message)
    return bool(names) and all(not _TORCH_NAME.search(n) and text.count(n.split("::")[-1]) <= 1 for n in names)


# ------------------------------------------------------------------------------------------- binding
def _bind(result: split.Split, device: _Part, host: _Part, table: Optional[Path], out: Path,
          target: Target) -> None:
    """One object from the parts: the device TU's first (its runtime registration then runs before the host
    TU's static initialisers, as in the file as written), with the host-side symbols nvcc made local that the
    host object asks for given those names, then made local again once joined."""
    undefined = instantiate.symbols(host.obj, undefined=True)
    defined = instantiate.symbols(device.obj, undefined=False)
    aliases = instantiate.local_aliases(undefined, defined, set(result.entities))
    objects = [device.obj, host.obj] + ([table] if table else [])
    if not aliases:
        running.join_objects(objects, out, target)
        return
    named = out.with_name(out.stem + ".device.o")
    symbols = _readelf_symbols(device.obj)
    adds = [f for new, old in aliases.items() for f in ("--add-symbol", _symbol_at(symbols, old, new))]
    running.run_tool(["objcopy", *adds, str(device.obj), str(named)], f"joining the objects of {target.name}",
                    target, "binds")
    running.join_objects([named] + objects[1:], out, target)
    localized = [f"--localize-symbol={new}" for new in aliases]
    running.run_tool(["objcopy", *localized, str(out)], f"joining the objects of {target.name}", target, "binds")


def _symbol_at(symbols: List[Dict[str, str]], old: str, new: str) -> str:
    """``new=<section>:<value>,global,<type>`` for objcopy: where the object defines its local symbol ``old``."""
    for row in symbols:
        if row["name"] == old:
            kind = "function" if row["type"] == "FUNC" else "object"
            return f"{new}={row['section']}:0x{row['value']},global,{kind}"
    raise KernelkitError(f"the device object does not define {old}")


def _readelf_symbols(obj: Path) -> List[Dict[str, str]]:
    out = subprocess.run(["readelf", "-sW", str(obj)], capture_output=True, text=True, check=True).stdout
    sections = _sections(obj)
    rows = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[0].endswith(":") and cols[6].isdigit():
            rows.append({"value": cols[1], "type": cols[3], "section": sections.get(int(cols[6]), cols[6]),
                         "name": cols[7]})
    return rows


def _sections(obj: Path) -> Dict[int, str]:
    out = subprocess.run(["readelf", "-SW", str(obj)], capture_output=True, text=True, check=True).stdout
    found = {}
    for m in re.finditer(r"\[\s*(\d+)\]\s+(\S+)", out):
        found[int(m.group(1))] = m.group(2)
    return found


# ------------------------------------------------------------------------------------------- the proof
def _frame_key(unit: Unit, result: split.Split) -> str:
    """What a proof covers besides the names device code uses: the device TU with its device code left out,
    the flags and the toolchain (an edit inside device code keeps it)."""
    return keys.build_variant_key(keys.unit_key(unit.kind, unit.flags, unit.local_dirs,
                                                sources.sha256_bytes(result.frame.encode("utf-8", "surrogateescape")),
                                                toolchain.fingerprint(), toolchain.nvcc_fingerprint()),
                                  f"split-frame/{VERSION}")[:32]


def _join_failure(message: str) -> str:
    """What the linker said when the split's objects did not join, in the user's names: a name both define (a
    namespace-scope variable that is not const, which each TU defines), else its first line without paths."""
    twice = re.search(r"multiple definition of [`'](.+?)'", message)
    if twice is not None:
        name = re.sub(r"kk_anon_[0-9a-f]+::", "(anonymous namespace)::", twice.group(1))
        return f"both TUs define {name}, a namespace-scope variable of host code"
    line = next((ln for ln in message.splitlines() if ln.strip()), "")
    return re.sub(r"\S*/", "", line).strip()[:200]


def _frame_record(frame: str) -> dict:
    return cache.read_record("frames", frame)


def _remember_host_failure(fallback: _Fallback, reason: str) -> None:
    """The frame's record keeps why this host TU (by its key, which a kernel edit keeps) cannot be compiled, so
    the next edit builds as written at once instead of failing the host TU again first."""
    record = _frame_record(fallback.frame)
    _store_frame(fallback.frame, {**record, "host_failed": {**record.get("host_failed", {}),
                                                            fallback.host_key: reason}})


def _store_frame(frame: str, record: dict) -> None:
    cache.write_record("frames", frame, record)


def _covered(record: dict, result: split.Split, torch_names: Optional[List[str]]) -> bool:
    """Whether a proof of this frame saw every name this device code uses, but names that appear nowhere in
    torch's headers (a new local, a new helper of the user's): no lookup of those can find what the device TU
    left out."""
    proven = record.get("proven")
    if proven is None or torch_names is None:
        return False
    return not (set(result.names) - set(proven)) & set(torch_names)


def _torch_names_key(unit: Unit, result: split.Split) -> str:
    """What the names torch's headers declare and define depend on: the toolchain, the flags, which headers."""
    return keys.build_variant_key(keys.unit_key(unit.kind, unit.flags, unit.local_dirs,
                                                "\n".join(result.torch_includes), toolchain.fingerprint(),
                                                toolchain.nvcc_fingerprint()), "torch-names")[:32]


def _arch_flags(flags: List[str]) -> Tuple[List[str], List[str]]:
    """(flags less the GPU code and output ones, each virtual arch ``compute_XX`` the flags build for): the GPU
    code as ``prebuilt.split_flags`` reads it, the one reader of nvcc's spellings."""
    incs, codes, rest = prebuilt.split_flags([f for f in flags if f not in ("-c", "--compile")])
    return [f"-I{d}" for d in incs] + rest, sorted({"compute_" + c.split("_", 1)[1] for c in codes})


class Proof:
    """The file's PTX as written (what torch's build compiles for its device side), compiled in the background
    from the moment it is asked for, so that it runs beside the split's own compiles. With a ``names_key`` whose
    record is missing, the same thread then records the names torch's headers declare, at the lowest priority:
    the build waits for the PTX only (a new file's first build would otherwise pay a second parse of torch's
    headers), and a later edit waits for the record only if it is still being written (``_wait_for_names``)."""

    def __init__(self, unit: Unit, target: Target, nice: bool, names_key: str = "",
                 result: Optional[split.Split] = None):
        self.unit, self.target, self.nice = unit, target, nice
        self.names_key, self.result = names_key, result
        self.children, self.names_children = running.Children(), running.Children()
        self.ptx: Dict[str, str] = {}
        self.error: Optional[BaseException] = None
        self.ptx_ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"kernelkit-proof-{unit.path.name}", daemon=True)
        if names_key:
            with _AUDIT_LOCK:
                _NAMES[names_key] = self
        self.thread.start()

    def _run(self) -> None:
        try:
            keep = self.names_key and not cache.read_record("torch-names", self.names_key)
            with running.private_dir("proof-keep-") as kept:
                self.ptx = _ptx(self.unit.path, self.unit.flags, self.unit.display, self.target, self.nice,
                                self.children, keep=kept if keep else None)
                self.ptx_ready.set()
                if keep:
                    self._record_torch_names(kept)
        except BaseException as e:  # noqa: BLE001 - before the PTX: handed to whoever waits for the proof
            if self.ptx_ready.is_set():  # a record not written is written by the next first build
                log.debug("the torch-names record of %s was not written: %s", self.unit.display, e)
            else:
                self.error = e
        finally:
            self.ptx_ready.set()  # whatever failed: the waiter must never hang
            with _AUDIT_LOCK:
                if _NAMES.get(self.names_key) is self:
                    del _NAMES[self.names_key]

    def _record_torch_names(self, kept: Path) -> None:
        """The names torch's umbrella headers declare more often than the prelude (read from nvcc's preprocessed
        text of the file and of the whole prelude) and the macros they define otherwise: what a later edit's new
        names are checked against (``_covered``)."""
        preprocessed = next(kept.glob(f"{self.unit.path.stem}*.cpp1.ii"), None)
        if preprocessed is None:
            return
        probe = kept / "kk_prelude_probe.cu"
        prelude = split.full_prelude()
        probe.write_text(prelude + "__global__ void kk_prelude_probe() {}\n")
        _ptx(probe, self.unit.flags, self.unit.display, self.target, True, self.names_children, keep=kept)
        probed = next(kept.glob("kk_prelude_probe*.cpp1.ii"))
        includes = "".join(f"#include {name}\n" for name in self.result.torch_includes)
        macros = torch_headers.defined_macros(includes, self.unit.flags)
        prelude_macros = torch_headers.defined_macros(prelude, self.unit.flags)
        if macros is None or prelude_macros is None:
            return
        names = torch_headers.risky_names(torch_headers.declared_names(preprocessed.read_text(errors="replace")),
                                          torch_headers.declared_names(probed.read_text(errors="replace")),
                                          macros, prelude_macros)
        cache.write_record("torch-names", self.names_key, {"names": sorted(names)})

    def difference(self, device_unit: Unit, device_text: str) -> Optional[str]:
        """None when the device TU's PTX is the file's as written for every arch; else why not. A file whose
        device side does not compile as written fails here with nvcc's errors, as torch's build would. The device
        TU is compiled from a copy of ``device_text`` (its includes do not depend on where it is)."""
        with running.private_dir("proof-device-") as tmp:
            copy = tmp / device_unit.path.name
            copy.write_text(device_text, errors="surrogateescape")
            split_ptx = _ptx(copy, device_unit.flags, device_unit.display, self.target, self.nice, self.children)
        self.ptx_ready.wait()
        if self.error is not None:
            raise self.error
        for arch in sorted(self.ptx):
            why = split_proof.difference(self.ptx[arch], split_ptx.get(arch, ""))
            if why is not None:
                return f"{why} ({arch})"
        return None

    def cancel(self, names_too: bool = True) -> None:
        self.children.kill_all()
        if names_too:
            self.names_children.kill_all()


def _ptx(path: Path, flags: List[str], display: str, target: Target, nice: bool,
         children: running.Children, keep: Optional[Path] = None) -> Dict[str, str]:
    """arch -> the PTX nvcc makes of ``path`` with ``flags``, for each arch they build for (``keep``: where the
    first arch's intermediate files are kept)."""
    rest, archs = _arch_flags(flags)
    if not archs:
        raise KernelkitError(f"{display}: no arch in its flags to compile its device code for")
    low = ["nice", "-n", "19"] if nice and shutil.which("nice") else []
    out = {}
    with running.private_dir("proof-") as tmp:
        for arch in archs:
            ptx = tmp / f"{arch}.ptx"
            kept = ["--keep", "--keep-dir", str(keep)] if keep is not None and arch == archs[0] else []
            running.run_tool(low + toolchain.launcher() + [toolchain.nvcc(), *rest, f"-arch={arch}", "-ptx", *kept,
                                                          str(path), "-o", str(ptx)],
                            f"compiling {display}", target, "proofs", children)
            out[arch] = ptx.read_text(errors="replace")
    return out


_AUDITS: Dict[str, threading.Thread] = {}  # file -> its running background proof
_PENDING: Dict[str, tuple] = {}  # file -> the newest edit waiting for that proof to end
_NAMES: Dict[str, Proof] = {}  # torch-names key -> the proof whose thread is writing its record
_AUDIT_LOCK = threading.Lock()


@atexit.register
def _cut_names_records_short() -> None:
    """At exit, a torch-names record still being written is abandoned (the next first build writes it)."""
    with _AUDIT_LOCK:
        writing = list(_NAMES.values())
    for proof in writing:
        proof.names_children.kill_all()


def _wait_for_names(names_key: str) -> None:
    with _AUDIT_LOCK:
        writing = _NAMES.get(names_key)
    if writing is not None:
        writing.thread.join()


def _audit_later(unit: Unit, target: Target, device: Tuple[Unit, str], frame: str,
                 before) -> None:
    """Prove an edit that used an earlier proof, in the background at the lowest priority: a mismatch makes the
    file build as written from its next load on, and says so now. One proof per file at a time: edits made
    while it runs wait, and only the newest of them is proven next."""
    with _AUDIT_LOCK:
        running = _AUDITS.get(unit.display)
        if running is not None and running.is_alive():
            _PENDING[unit.display] = (unit, target, device, frame, before)
            return
        thread = threading.Thread(target=_audit, args=(unit, target, device, frame, before),
                                  name=f"kernelkit-audit-{unit.path.name}", daemon=True)
        _AUDITS[unit.display] = thread
    thread.start()


def _audit(unit: Unit, target: Target, device: Tuple[Unit, str], frame: str, before) -> None:
    try:
        why = Proof(unit, target, nice=True).difference(*device)
    except Exception as e:  # noqa: BLE001 - an audit that cannot run proves nothing and changes nothing
        say(f"{unit.display}: the background proof of the split could not run ({e})")
        why = None
    if inputs.snapshot(unit) != before:
        why = None  # edited since: the file as written is no longer what the split was made of
    if why is not None:
        _store_frame(frame, {"refused": why})
        say(f"{unit.display}: the split's device code differs from the file's as written ({why}): the library "
            "just loaded may compute something else; load again to build the file as written")
    with _AUDIT_LOCK:
        _AUDITS.pop(unit.display, None)
        pending = _PENDING.pop(unit.display, None)
    if pending is not None:
        _audit_later(*pending)


def wait_for_audits(timeout: Optional[float] = None) -> None:
    """Wait for the background proofs this process started (tests, and a script about to report results)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _AUDIT_LOCK:
            running = [t for t in [*_AUDITS.values(), *(p.thread for p in _NAMES.values())] if t.is_alive()]
        if not running:
            return
        running[0].join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if deadline is not None and time.monotonic() >= deadline:
            return

