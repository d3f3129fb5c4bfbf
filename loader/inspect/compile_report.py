"""Compile reports and code views of a build: ``kernelkit.inspect.report(target)`` and ``code(target)``.

A target is a card name, a loaded :class:`kernelkit.Library` (or the ``BuildInfo`` of ``load(..., load=False)``),
an instant-kernels module (``kernelkit.load_kernels``), or the path of a cubin / object / library. Everything
is read from the cached binary (see :mod:`.resources`), so no GPU is needed. The last two builds of each name
are remembered in the cache's report records (``records/reports/``) so a report shows the change against the
previous build.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import difflib
import hashlib
import html
import json
import os
import re
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import replace_file
from ..errors import KernelkitError
from . import occupancy as _occupancy
from . import resources, tools

DEFAULT_BLOCK_SIZE = 256
_NAME_WIDTH = 60
_LOCK = threading.Lock()
_HISTORY: Dict[str, dict] = {}  # name -> {"current": build, "previous": build}, mirrored on disk


@dataclasses.dataclass
class KernelRow:
    name: str  # demangled
    symbol: str
    arch: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int
    stack: int  # bytes per thread
    local: int
    shared: int  # static, bytes per block
    max_dynamic_shared: Optional[int]  # the most dynamic shared memory a launch may ask for (with the opt-in)
    occupancy: Optional[_occupancy.Occupancy]

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["occupancy"] = self.occupancy.fraction if self.occupancy else None
        return d


@dataclasses.dataclass
class _Target:
    name: str
    key: str
    path: Path
    arch: Optional[str]  # for a bare cubin


def _resolve(target, arch=None, kernels_dir=None) -> _Target:
    """What a target is built from: its name, build key and binary."""
    if hasattr(target, "cubin") and hasattr(target, "kernels"):  # an instant-kernels module
        return _Target(target.name, target.key, Path(target.cubin), target.arch)
    if all(hasattr(target, a) for a in ("name", "key", "path")):  # a Library or a BuildInfo
        return _Target(target.name, target.key, Path(target.path), None)
    if isinstance(target, (str, os.PathLike)):
        p = Path(target).expanduser()
        if isinstance(target, os.PathLike) or (p.suffix in (".o", ".so", ".cubin", ".fatbin") and p.is_file()):
            if not p.is_file():
                raise KernelkitError(f"target: {p} does not exist")
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            return _Target(p.stem.split(".")[0], digest, p.resolve(), arch)
        from .. import loading  # a card name: build it into the cache (compile only, no GPU needed)

        info = loading.load(str(target), kernels_dir=kernels_dir, arch=arch, load=False)
        return _Target(info.name, info.key, Path(info.path), None)
    raise KernelkitError(f"target: expected a card name, a kernelkit.Library, a load_kernels module or a binary's "
                         f"path, got {type(target).__name__}")


def _arch_hint(arch: Optional[str]) -> Optional[str]:
    if arch is None:
        return None
    text = str(arch).split(";")[0].replace("+PTX", "").strip()
    return text if text.startswith("sm_") else f"sm_{text.replace('.', '')}"


def _rows(t: _Target, block_size: Optional[int], dynamic_shared: int) -> List[KernelRow]:
    rows = []
    for k in resources.read(t.path, _arch_hint(t.arch)):
        try:
            lim = _occupancy.limits(k.arch)
        except KernelkitError:
            lim = None
        occ = None
        if lim is not None:
            occ = _occupancy.occupancy(k.arch, k.registers, block_size or DEFAULT_BLOCK_SIZE, k.shared, dynamic_shared)
        rows.append(KernelRow(k.name or k.symbol, k.symbol, k.arch, k.registers, k.spill_stores, k.spill_loads,
                              k.stack, k.local, k.shared,
                              max(0, lim.smem_per_block - k.shared) if lim else None, occ))
    return rows


def _history_file(name: str) -> Optional[Path]:
    try:
        from ..jit import cache, keys

        return cache.record_path("reports", keys.report_key(name))
    except (KernelkitError, OSError):
        return None


def _remember(t: _Target, rows: List[KernelRow]) -> Optional[dict]:
    """Record this build as ``t.name``'s current one; return the previous build of that name (or None)."""
    entry = {"key": t.key, "path": str(t.path), "rows": [r.as_dict() for r in rows]}
    with _LOCK:
        path = _history_file(t.name)
        state = _HISTORY.get(t.name)
        if state is None and path is not None:
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                state = None
        state = state if isinstance(state, dict) else {}
        current = state.get("current")
        if isinstance(current, dict) and current.get("key") == t.key:
            previous = state.get("previous")
            state["current"] = entry
        else:
            previous = current if isinstance(current, dict) else None
            state = {"current": entry, "previous": previous}
        _HISTORY[t.name] = state
        if path is not None:
            with contextlib.suppress(OSError):  # the report still works; only the next process loses the comparison
                replace_file.write(path, json.dumps(state))
    return previous if isinstance(previous, dict) else None


def _short(name: str, width: int = _NAME_WIDTH) -> str:
    """Without ``void`` and the parameter list; a long template name keeps its head and tail, where
    instantiations differ."""
    name = re.sub(r"^void ", "", name)
    if name.endswith(")") and "(" in name:
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    if len(name) <= width:
        return name
    half = (width - 1) // 2
    return name[:half] + "…" + name[-(width - 1 - half):]


def _shown(names: List[str]) -> Dict[str, str]:
    """Each name as a table shows it: cut (``_short``) where the cut one still tells it from the others, whole
    where two names would read the same."""
    cut = {n: _short(n) for n in names}
    readings = collections.Counter(cut[n] for n in set(names))
    return {n: cut[n] if readings[cut[n]] == 1 else _short(n, width=len(n)) for n in names}


def _bytes(n: Optional[int]) -> str:
    return "-" if n is None else f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB"


_FIELDS = (("registers", "regs", ""), ("spill_stores", "spill stores", " B"), ("spill_loads", "spill loads", " B"),
           ("stack", "stack", " B"), ("shared", "smem", " B"), ("occupancy", "occupancy", ""))


class CompileReport:
    """Per kernel: registers, spills, stack, shared memory, theoretical occupancy at ``block_size``; and what
    changed against the previous build of the same name (:meth:`diff`)."""

    def __init__(self, name: str, key: str, path: Path, rows: List[KernelRow], block_size: Optional[int],
                 previous: Optional[dict] = None):
        self.name, self.key, self.path, self.rows = name, key, Path(path), rows
        self.block_size = block_size or DEFAULT_BLOCK_SIZE
        self.block_size_given = block_size is not None
        self.previous = previous  # the previous build's {"key", "path", "rows"}

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, kernel: str) -> KernelRow:
        """The row of a kernel by its name, symbol, or the name without its parameter list."""
        for r in self.rows:
            if kernel in (r.name, r.symbol, r.name.split("(")[0]):
                return r
        raise KeyError(f"{self.name}: no kernel {kernel!r} (kernels: {', '.join(r.name for r in self.rows)})")

    def diff(self, previous=None) -> List[str]:
        """One line per kernel that changed against ``previous`` (a CompileReport; default: the previous
        build of this name), e.g. ``"scale (sm_90): regs 40 → 64, spill stores 0 → 24 B"``."""
        if previous is None:
            previous = self.previous
        if previous is None:
            return []
        old_rows = previous.rows if isinstance(previous, CompileReport) else previous.get("rows", [])
        old = {(r["arch"], r["symbol"]) if isinstance(r, dict) else (r.arch, r.symbol):
               r if isinstance(r, dict) else r.as_dict() for r in old_rows}
        lines = []
        shown = _shown([r.name for r in self.rows] + [r["name"] for r in old.values()])
        for r in self.rows:
            before = old.pop((r.arch, r.symbol), None)
            label = f"{shown[r.name]} ({r.arch})"
            if before is None:
                lines.append(f"{label}: new")
                continue
            now = r.as_dict()
            changes = []
            for field, shown, unit in _FIELDS:
                a, b = before.get(field), now.get(field)
                if a == b:
                    continue
                if field == "occupancy":
                    changes.append(f"occupancy {'-' if a is None else f'{a:.0%}'} → {'-' if b is None else f'{b:.0%}'}")
                else:
                    changes.append(f"{shown} {a} → {b}{unit}")
            if changes:
                lines.append(f"{label}: {', '.join(changes)}")
        lines += [f"{shown[r['name']]} ({r['arch']}): gone" for r in old.values()]
        return lines

    @property
    def changes(self) -> List[str]:
        return self.diff()

    def _table(self) -> Tuple[List[str], List[List[str]]]:
        occ = f"occupancy @{self.block_size}" + ("" if self.block_size_given else "?")
        head = ["kernel", "arch", "regs", "spill st/ld", "stack", "smem", "max dyn smem", "local", occ]
        shown = _shown([r.name for r in self.rows])
        body = [[shown[r.name], r.arch, str(r.registers),
                 f"{r.spill_stores}/{r.spill_loads} B" if r.spills else "0",
                 _bytes(r.stack), _bytes(r.shared), _bytes(r.max_dynamic_shared), _bytes(r.local),
                 str(r.occupancy) if r.occupancy else "-"] for r in self.rows]
        return head, body

    def _title(self) -> str:
        return f"{self.name} ({self.key[:12]}): {len(self.rows)} kernel(s)"

    def __str__(self) -> str:
        head, body = self._table()
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        lines = [self._title(), fmt(head), *[fmt(b) for b in body]]
        if not self.block_size_given:
            lines.append(f"?: occupancy for {self.block_size} threads per block; pass block_size= for your launch's")
        changes = self.changes
        if changes:
            lines += ["changed since the previous build:", *[f"  {c}" for c in changes]]
        return "\n".join(lines)

    def compact(self) -> str:
        """A few lines for after a build: the kernels that spill, and what changed."""
        shown = _shown([r.name for r in self.rows])
        spilling = [f"  {shown[r.name]} ({r.arch}): spills {r.spill_stores}/{r.spill_loads} B st/ld, {r.registers} regs"
                    for r in self.rows if r.spills]
        regs = sorted(r.registers for r in self.rows)
        span = "-" if not regs else str(regs[0]) if regs[0] == regs[-1] else f"{regs[0]}–{regs[-1]}"
        lines = [f"{self.name}: {len(self.rows)} kernel(s), regs {span}, "
                 + (f"{len(spilling)} spilling" if spilling else "no spills")]
        lines += spilling + [f"  {c}" for c in self.changes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head, body = self._table()
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
        changes = "".join(f"<li>{html.escape(c)}</li>" for c in self.changes)
        extra = f"<p>changed since the previous build:</p><ul>{changes}</ul>" if changes else ""
        return f"<p><b>{html.escape(self._title())}</b></p><table><tr>{th}</tr>{trs}</table>{extra}"

    def __repr__(self) -> str:
        return f"<CompileReport {self._title()}>"


def report(target, block_size: Optional[int] = None, *, arch=None, kernels_dir=None,
           dynamic_shared: int = 0) -> CompileReport:
    """The compile report of a build. ``target``: a card name (built into the cache if needed, for ``arch``),
    a loaded Library, a load_kernels module, or a binary's path. ``block_size``: the launch's threads per
    block, for the occupancy column (default 256); ``dynamic_shared``: the launch's dynamic shared bytes."""
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        raise KernelkitError(f"block_size: expected a positive number of threads, got {block_size!r}")
    t = _resolve(target, arch, kernels_dir)
    rows = _rows(t, block_size, dynamic_shared)
    previous = _remember(t, rows)
    return CompileReport(t.name, t.key, t.path, rows, block_size, previous)


_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/\s*|\s*/\* 0x[0-9a-f]{16} \*/")


def _normalized(code: str) -> List[str]:
    """SASS without addresses and encodings, so a diff shows changed instructions, not shifted offsets."""
    out = []
    for line in code.splitlines():
        line = _ADDRESS.sub("", line).rstrip()
        if line.strip():
            out.append(line)
    return out


def _dump(path: Path, kind: str) -> str:
    flag = {"sass": "--dump-sass", "ptx": "--dump-ptx"}[kind]
    text = tools.run("cuobjdump", [flag], path)
    if kind == "ptx" and ".entry" not in text and ".func" not in text:
        raise KernelkitError(f"{path.name} holds no PTX (kernelkit builds SASS only): build with arch='9.0+PTX' to "
                             "embed it, or view kind='sass'")
    return text


def code(target, kind: str = "sass", diff: bool = False, *, arch=None, kernels_dir=None) -> str:
    """The SASS (or PTX) of a build; ``diff=True``: a unified diff against the previous build of the same
    name (addresses and encodings left out), when that build's binary is still in the cache."""
    if kind not in ("sass", "ptx"):
        raise KernelkitError(f"kind: expected 'sass' or 'ptx', got {kind!r}")
    t = _resolve(target, arch, kernels_dir)
    text = _dump(t.path, kind)
    previous = _remember(t, _rows(t, None, 0))  # recorded either way: the next view can compare with it
    if not diff:
        return text
    if previous is None:
        raise KernelkitError(f"{t.name}: no previous build is known to compare with (each report or code view "
                             "records the build it shows)")
    old_path = Path(previous.get("path", ""))
    if not old_path.is_file():
        raise KernelkitError(f"{t.name}: the previous build's binary {old_path} is no longer in the cache")
    old = _normalized(_dump(old_path, kind)) if kind == "sass" else _dump(old_path, kind).splitlines()
    new = _normalized(text) if kind == "sass" else text.splitlines()
    lines = difflib.unified_diff(old, new, f"{t.name} {previous.get('key', '')[:12]}", f"{t.name} {t.key[:12]}",
                                 lineterm="", n=2)
    return "\n".join(lines) or f"{t.name}: the {kind.upper()} is the same as the previous build's"
