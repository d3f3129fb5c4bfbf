"""Per-kernel resources read from a compiled binary (a cubin, an object or library with an embedded fatbin).

Sources, all from the binary itself (no GPU, no recompile):
- ``cuobjdump --dump-resource-usage``: registers, stack frame, static shared, local and constant memory.
- spills: ptxas marks every spill store and refill load it emits in the kernel's ``.nv.info`` section
  (``EIATTR_ANNOTATIONS`` "SpillRefill", by instruction offset; ``cuobjdump -elf`` lists them). The SASS at
  those offsets (``STL``/``LDL`` and their widths) gives the bytes, the numbers ``-Xptxas -v`` prints. A
  local array also uses STL/LDL, so counting those alone would call it a spill; the annotations do not.
  Spills live in the stack frame, so the ELF is read only when a kernel has one, and the (slow, about a
  second) disassembly only when a kernel has annotated spills.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ..errors import KernelkitError
from . import tools

#: the driver's per-block shared memory reservation that cubins for sm_90 and later count in a kernel's
#: static shared size once it uses any shared memory (observed with CUDA 13's cuobjdump: 4000 B -> 5024 B)
RESERVED_IN_CUBIN = 1024

_ARCH = re.compile(r"^\s*arch = (sm_\w+)|\bsm=(\d+)\b")
_FUNCTION = re.compile(r"^\s*Function (\S+?):\s*$")
_USAGE = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")
_INFO_SECTION = re.compile(r"^\.nv\.info\.(\S+)\s*$")
_SPILL = re.compile(r"SpillRefill\s*:\s*Offset\s*:\s*(0x[0-9a-fA-F]+)")
_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
_SASS_TARGET = re.compile(r"^\s*code for (sm_\w+)")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_WIDTH = {"64": 8, "128": 16, "U8": 1, "S8": 1, "U16": 2, "S16": 2}


@dataclasses.dataclass
class KernelResources:
    symbol: str  # as in the binary (mangled for C++ linkage)
    arch: str  # "sm_90"
    registers: int
    stack: int  # bytes of stack frame per thread (local arrays and spills)
    shared: int  # static shared memory per block, bytes, as the source declares it
    local: int
    constant: int
    spill_stores: int = 0  # bytes
    spill_loads: int = 0
    name: str = ""  # demangled


def _arch_of(line: str) -> Optional[str]:
    m = _ARCH.search(line)
    if m is None:
        return None
    return m.group(1) or f"sm_{m.group(2)}"


def parse_usage(text: str, arch: Optional[str] = None) -> List[KernelResources]:
    """``cuobjdump --dump-resource-usage`` output; ``arch`` for a bare cubin, whose dump names none."""
    found, current, symbol = [], arch, None
    for line in text.splitlines():
        current = _arch_of(line) or current
        m = _FUNCTION.match(line)
        if m:
            symbol = m.group(1)
            continue
        if symbol is not None and "REG:" in line:
            usage = {k: int(v) for k, v in _USAGE.findall(line)}
            shared = usage.get("SHARED", 0)
            if shared and current and _sm(current) >= 90:
                shared = max(0, shared - RESERVED_IN_CUBIN)
            found.append(KernelResources(symbol, current or "sm_?", usage.get("REG", 0), usage.get("STACK", 0),
                                         shared, usage.get("LOCAL", 0), usage.get("CONSTANT[0]", 0)))
            symbol = None
    return found


def _sm(arch: str) -> int:
    digits = re.sub(r"\D", "", arch)
    return int(digits) if digits else 0


def parse_spill_offsets(text: str, arch: Optional[str] = None) -> Dict[Tuple[str, str], Set[int]]:
    """(arch, symbol) -> the offsets of its annotated spill/refill instructions, from ``cuobjdump -elf``."""
    found: Dict[Tuple[str, str], Set[int]] = {}
    current, symbol = arch, None
    for line in text.splitlines():
        current = _arch_of(line) or current
        if line.startswith("."):  # a section header ends the previous section's attributes
            m = _INFO_SECTION.match(line)
            symbol = m.group(1) if m else None
            continue
        if symbol is not None and "SpillRefill" in line:
            found.setdefault((current or "sm_?", symbol), set()).update(int(o, 16) for o in _SPILL.findall(line))
    return found


def spill_bytes(sass: str, offsets: Dict[Tuple[str, str], Set[int]]) -> Dict[Tuple[str, str], Tuple[int, int]]:
    """(arch, symbol) -> (spill store bytes, refill load bytes): the widths of the annotated instructions."""
    totals: Dict[Tuple[str, str], List[int]] = {}
    arch, symbol = None, None
    for line in sass.splitlines():
        m = _SASS_TARGET.match(line)
        if m:
            arch = m.group(1)
            continue
        m = _SASS_FUNCTION.match(line)
        if m:
            symbol = m.group(1)
            continue
        marked = offsets.get((arch, symbol)) if symbol else None
        if not marked:
            continue
        for off, op in _INSTRUCTION.findall(line):
            if int(off, 16) not in marked:
                continue
            parts = op.split(".")
            width = next((_WIDTH[p] for p in reversed(parts[1:]) if p in _WIDTH), 4)
            t = totals.setdefault((arch, symbol), [0, 0])
            if parts[0] in ("STL", "ST"):
                t[0] += width
            elif parts[0] in ("LDL", "LD"):
                t[1] += width
    return {k: (v[0], v[1]) for k, v in totals.items()}


def read(path: Path, arch: Optional[str] = None) -> List[KernelResources]:
    """Every kernel's resources in ``path``, for every arch it holds (``arch``: the one of a bare cubin)."""
    path = Path(path)
    if not path.is_file():
        raise KernelkitError(f"path: {path} is not a file")
    kernels = parse_usage(tools.run("cuobjdump", ["--dump-resource-usage"], path), arch)
    if any(k.stack for k in kernels):
        elf = tools.run("cuobjdump", ["--dump-elf"], path)
        if arch is None and any(k.arch == "sm_?" for k in kernels):
            arch = _arch_of(elf)
            for k in kernels:
                k.arch = arch or k.arch
        offsets = parse_spill_offsets(elf, arch)
        if offsets:
            names = sorted({s for _, s in offsets})
            sass = tools.run("cuobjdump", ["--dump-sass", "--function", ",".join(names)], path)
            spilled = spill_bytes(sass, offsets)
            for k in kernels:
                k.spill_stores, k.spill_loads = spilled.get((k.arch, k.symbol), (0, 0))
    for k, name in zip(kernels, tools.demangle([k.symbol for k in kernels])):
        k.name = name
    return kernels


def symbols(kernels: Iterable[KernelResources]) -> List[str]:
    return sorted({k.symbol for k in kernels})
