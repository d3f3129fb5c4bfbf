"""Nsight Compute on an op's kernels: ``kernelkit.profile(op, *args)`` and ``kernelkit profile CARD``.

ncu cannot attach to a running process (a notebook's kernel), so the op runs again in a fresh child process
(:mod:`.profile_child`) under ``ncu --profile-from-start off``: one warm-up call, then the profiled call between
``cudaProfilerStart`` and ``cudaProfilerStop``. The child finds the op by name (a card, a kernelkit library's
op, a torch op, an importable function) and gets the arguments through a private file (tensors with their
values). ncu's CSV (``--page raw``) is read into a :class:`ProfileResult`: per kernel launch the few numbers that
say why it takes the time it takes, and a roofline plot.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import settings
from ..errors import KernelkitError
from ..harness import report
from . import tools
from .compile_report import _short

_FLOP_OPS = {"fp64": "d", "fp32": "f", "fp16": "h"}
#: FLOPs per precision: add + mul + 2 * fma thread instructions (CUDA cores; tensor-core math is not counted)
FLOP_METRICS = [f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in _FLOP_OPS.values()
                for op in ("add", "mul", "fma")]
METRICS = [
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "dram__bytes.sum",
    *FLOP_METRICS,
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread", "launch__sm_count",
]
#: ncu's options: leave the clocks as they are (the GPU host's rule), profile only the call between
#: cudaProfilerStart and Stop, follow the interpreter into the processes it starts
NCU_OPTIONS = ["--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all", "--csv",
               "--page", "raw"]
CHILD = "kernelkit.inspect.profile_child"
#: where ncu is looked for after KERNELKIT_NCU and PATH (newest Nsight Compute first)
NCU_DIRS = ["/usr/local/cuda/bin", "/opt/nvidia/nsight-compute/*"]
#: % of peak above which a unit is called the limiter
BUSY_PCT = 60.0
#: points by which L2 may run above a busy DRAM and the kernel still be DRAM-bound (a stream through L2 to DRAM)
L2_OVER_DRAM_PCT = 5.0
#: FP32 lanes per SM where not 128 (CUDA C++ Programming Guide, "Arithmetic Instructions": 32-bit floating-point
#: add/multiply/multiply-add results per clock per multiprocessor)
FP32_LANES = {(6, 0): 64, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64}

PERMISSION_HELP = (
    "Nsight Compute may not read this GPU's performance counters (ERR_NVGPUCTRPERM): the driver lets only "
    "admin users do that by default. Either run as root, or allow every user: put the line\n"
    "    options nvidia NVreg_RestrictProfilingToAdminUsers=0\n"
    "into a file in /etc/modprobe.d/, then reload the nvidia kernel module (or reboot); in a container, start it "
    "with --cap-add SYS_ADMIN. See https://developer.nvidia.com/ERR_NVGPUCTRPERM")
_TAIL_LINES, _TAIL_CHARS = 40, 4000


class ProfileError(KernelkitError):
    """Profiling could not run or found nothing: the message says why and what to do."""

    def _render_traceback_(self):  # IPython shows the message alone: the cause is never in kernelkit's frames
        return [f"{type(self).__name__}: {self}"]


# ------------------------------------------------------------------------------------------- finding ncu
def find_ncu() -> str:
    """ncu's path: KERNELKIT_NCU, then PATH, then NCU_DIRS; looked up on every call, since KERNELKIT_NCU may
    change between profiles in one process."""
    try:
        return tools.locate("ncu", settings.NCU, tuple(NCU_DIRS))
    except KernelkitError as e:
        raise ProfileError(f"kernelkit.profile needs Nsight Compute's {e}. Install Nsight Compute (the CUDA toolkit "
                           "ships it) and put ncu on PATH, or point KERNELKIT_NCU at it: "
                           "export KERNELKIT_NCU=/path/to/ncu") from None


# ------------------------------------------------------------------------------------------- ncu's CSV
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
            "second": 1e9}
_PREFIX = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_COUNTED = ("byte", "inst", "cycle", "hz", "sector", "warp", "thread", "block")


def _number(text: Optional[str], unit: str = "") -> Optional[float]:
    """A CSV value in base units: "2,618,906,429.30" → 2618906429.3, times in ns, "1.5" Gbyte → 1.5e9; None for
    "n/a", "no data" or nothing."""
    try:
        value = float((text or "").replace(",", ""))
    except ValueError:
        return None
    unit = (unit or "").strip()
    if unit in _TIME_NS:
        return value * _TIME_NS[unit]
    low = unit.lower()
    if len(low) > 1 and low[0] in _PREFIX and low[1:].split("/")[0] in _COUNTED:
        return value * _PREFIX[low[0]]
    return value


def _integer(value: Optional[float]) -> Optional[int]:
    return None if value is None else int(round(value))


def _csv_rows(text: str) -> Optional[Tuple[List[str], List[List[str]]]]:
    """(header, rows) of the CSV in ncu's output (after the program's own lines and ==PROF== notes); None when
    there is none."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return None
    header, *rows = csv.reader(io.StringIO("\n".join(lines[start:])))
    return header, rows


@dataclasses.dataclass
class KernelProfile:
    """One profiled kernel launch. Percentages are of the unit's peak over the kernel's duration."""

    id: int
    name: str  # as ncu prints it (demangled, with the parameter list)
    duration_us: Optional[float]
    dram_pct: Optional[float]
    l2_pct: Optional[float]
    sm_pct: Optional[float]
    occupancy_pct: Optional[float]  # achieved: active warps / the SM's maximum, while the SM is active
    memory_pct: Optional[float]  # ncu's "Memory Throughput": the busiest memory unit
    registers: Optional[int]
    grid: str  # "(262144, 1, 1)"
    block: str
    blocks: Optional[int]
    block_threads: Optional[int]
    sm_count: Optional[int]
    dram_bytes: Optional[float]
    dram_read_bytes: Optional[float] = None
    dram_write_bytes: Optional[float] = None
    flops: Optional[float] = None
    flops_by_precision: Dict[str, float] = dataclasses.field(default_factory=dict)
    advice: List[str] = dataclasses.field(default_factory=list)  # ncu's rules (details page only)
    limiter: str = ""
    reason: str = ""

    def __post_init__(self):
        if not self.limiter:
            self.limiter, self.reason = _limiter(self)

    @property
    def short_name(self) -> str:
        return _short(self.name, 40)

    @property
    def intensity(self) -> Optional[float]:
        """Arithmetic intensity: FLOPs per DRAM byte."""
        return self.flops / self.dram_bytes if self.flops is not None and self.dram_bytes else None

    @property
    def gbps(self) -> Optional[float]:
        """Achieved DRAM traffic, GB/s (read + write)."""
        return self.dram_bytes / self.duration_us / 1e3 if self.dram_bytes is not None and self.duration_us else None

    @property
    def gflops(self) -> Optional[float]:
        return self.flops / self.duration_us / 1e3 if self.flops is not None and self.duration_us else None

    @property
    def verdict(self) -> str:
        return f"{self.limiter} ({self.reason})" if self.reason else self.limiter

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "short_name": self.short_name, "intensity": self.intensity,
                "gbps": self.gbps, "gflops": self.gflops}


def _limiter(k: KernelProfile) -> Tuple[str, str]:
    """(limiter, reason): the busiest of DRAM, L2 and the SMs when one runs above BUSY_PCT of its peak; else
    latency, with what the launch suggests."""
    busy = [(pct, unit, f"{label} {pct:.0f}% of peak") for unit, label, pct in
            (("memory", "DRAM", k.dram_pct), ("L2", "L2", k.l2_pct), ("compute", "SM", k.sm_pct)) if pct is not None]
    if not busy:
        return "unknown", "ncu reported no throughput"
    pct, unit, reason = max(busy, key=lambda b: b[0])
    if unit == "L2" and k.dram_pct is not None and k.dram_pct >= BUSY_PCT and pct - k.dram_pct <= L2_OVER_DRAM_PCT:
        return "memory", f"DRAM {k.dram_pct:.0f}% of peak"  # every DRAM byte crosses L2: a saturating stream shows both
    if pct >= BUSY_PCT:
        return unit, reason
    if k.blocks is not None and k.sm_count and k.blocks < k.sm_count:
        hint = f"small grid: {k.blocks} blocks for {k.sm_count} SMs"
    elif k.occupancy_pct is not None and k.occupancy_pct < 25:
        hint = f"low occupancy: {k.occupancy_pct:.0f}% achieved"
    else:
        hint = "small grid? low occupancy?"
    return "latency", f"neither memory nor compute above {BUSY_PCT:.0f}% of peak ({hint})"


def _flops(get) -> Tuple[Optional[float], Dict[str, float]]:
    """FLOPs by precision (add + mul + 2 * fma) from the metrics present; (None, {}) when none is."""
    by = {}
    for precision, p in _FLOP_OPS.items():
        add, mul, fma = (get(f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum") for op in ("add", "mul", "fma"))
        if add is not None or mul is not None or fma is not None:
            by[precision] = (add or 0.0) + (mul or 0.0) + 2 * (fma or 0.0)
    return (sum(by.values()) if by else None), by


def _from_raw(header: List[str], rows: List[List[str]]) -> Tuple[List[KernelProfile], dict]:
    units = dict(zip(header, rows[0])) if rows and not rows[0][0] else {}
    kernels, device = [], {}
    for row in rows:
        if not row or not row[0].isdigit():
            continue
        cells = dict(zip(header, row))

        def get(metric: str, cells=cells) -> Optional[float]:
            return _number(cells.get(metric), units.get(metric, ""))

        flops, by = _flops(get)
        duration = get("gpu__time_duration.sum")
        kernels.append(KernelProfile(
            id=int(row[0]), name=cells.get("Kernel Name", "?"),
            duration_us=None if duration is None else duration / 1e3,
            dram_pct=get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            l2_pct=get("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
            sm_pct=get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            occupancy_pct=get("sm__warps_active.avg.pct_of_peak_sustained_active"),
            memory_pct=get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
            registers=_integer(get("launch__registers_per_thread")), grid=cells.get("Grid Size", ""),
            block=cells.get("Block Size", ""), blocks=_integer(get("launch__grid_size")),
            block_threads=_integer(get("launch__block_size")),
            sm_count=_integer(get("launch__sm_count") or get("device__attribute_multiprocessor_count")),
            dram_bytes=get("dram__bytes.sum"), dram_read_bytes=get("dram__bytes_read.sum"),
            dram_write_bytes=get("dram__bytes_write.sum"), flops=flops, flops_by_precision=by))
        device = device or _device_from_raw(get, cells)
    return kernels, device


def _device_from_raw(get, cells: Dict[str, str]) -> dict:
    """The GPU as ncu describes it in the raw page's device attributes (clocks in kHz there)."""
    clock, memory_clock = get("device__attribute_clock_rate"), get("device__attribute_memory_clock_rate")
    return {"name": cells.get("device__attribute_display_name") or None, "cc": cells.get("CC") or None,
            "sm_count": _integer(get("device__attribute_multiprocessor_count")),
            "clock_hz": None if clock is None else clock * 1e3,
            "memory_clock_hz": None if memory_clock is None else memory_clock * 1e3,
            "memory_bus_bits": _integer(get("device__attribute_global_memory_bus_width"))}


_SOL, _LAUNCH = "GPU Speed Of Light Throughput", "Launch Statistics"


def _from_details(header: List[str], rows: List[List[str]]) -> Tuple[List[KernelProfile], dict]:
    """The details page: one row per (kernel, section, metric), and ncu's rules with their advice."""
    by_id: Dict[int, dict] = {}
    for row in rows:
        if not row or not row[0].isdigit():
            continue
        cells = dict(zip(header, row))
        k = by_id.setdefault(int(row[0]), {"cells": cells, "metrics": {}, "advice": []})
        if cells.get("Rule Name"):
            kind, rule, text = cells.get("Rule Type", ""), cells["Rule Name"], cells.get("Rule Description", "")
            k["advice"].append(f"{kind} {rule}: {text}")
        elif cells.get("Metric Name"):
            k["metrics"][(cells.get("Section Name"), cells["Metric Name"])] = _number(cells.get("Metric Value"),
                                                                                        cells.get("Metric Unit", ""))
    kernels, device = [], {}
    for kid, k in by_id.items():
        m, cells = k["metrics"], k["cells"]
        duration = m.get((_SOL, "Duration"))
        rate = m.get(("Memory Workload Analysis", "Memory Throughput"))  # DRAM bytes/s
        kernels.append(KernelProfile(
            id=kid, name=cells.get("Kernel Name", "?"), duration_us=None if duration is None else duration / 1e3,
            dram_pct=m.get((_SOL, "DRAM Throughput")), l2_pct=m.get((_SOL, "L2 Cache Throughput")),
            sm_pct=m.get((_SOL, "Compute (SM) Throughput")), occupancy_pct=m.get(("Occupancy", "Achieved Occupancy")),
            memory_pct=m.get((_SOL, "Memory Throughput")), registers=_integer(m.get((_LAUNCH, "Registers Per Thread"))),
            grid=cells.get("Grid Size", ""), block=cells.get("Block Size", ""),
            blocks=_integer(m.get((_LAUNCH, "Grid Size"))), block_threads=_integer(m.get((_LAUNCH, "Block Size"))),
            sm_count=_integer(m.get((_LAUNCH, "# SMs"))),
            dram_bytes=rate * duration * 1e-9 if rate is not None and duration is not None else None,
            advice=k["advice"]))
        device = device or {"name": None, "cc": cells.get("CC") or None,
                            "sm_count": _integer(m.get((_LAUNCH, "# SMs"))), "clock_hz": m.get((_SOL, "SM Frequency")),
                            "memory_clock_hz": None, "memory_bus_bits": None}
    return kernels, device


def parse(text: str, op: str = "ncu report") -> "ProfileResult":
    """A :class:`ProfileResult` from ncu's CSV output: ``--csv --page raw`` with :data:`METRICS` (what
    :func:`profile` runs), or ``--csv --page details`` (no FLOPs there; DRAM bytes are its DRAM throughput ×
    the duration, and ncu's rules become each kernel's ``advice``)."""
    found = _csv_rows(text)
    if found is None:
        raise ProfileError("no ncu CSV in this text (no header line starting with \"ID\"): ncu ... --csv")
    header, rows = found
    kernels, device = (_from_details if "Metric Name" in header else _from_raw)(header, rows)
    return ProfileResult(op, kernels, device, raw=text)


# ------------------------------------------------------------------------------------------- the result
def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}%"


def _si(x: Optional[float], unit: str) -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _dims(text: str) -> str:
    """"(262144, 1, 1)" → "262144", "(16, 8, 1)" → "16x8"."""
    parts = [p.strip() for p in text.strip("() ").split(",") if p.strip()]
    while len(parts) > 1 and parts[-1] == "1":
        parts.pop()
    return "x".join(parts) or "-"


def fp32_peak_flops(device: dict) -> Optional[float]:
    """FP32 FLOP/s of the device: SMs × clock × FP32 lanes per SM (:data:`FP32_LANES`) × 2 (an FMA is two)."""
    try:
        major, minor = (int(x) for x in str(device["cc"]).split("."))
        return device["sm_count"] * device["clock_hz"] * FP32_LANES.get((major, minor), 128) * 2
    except (KeyError, TypeError, ValueError):
        return None


def dram_peak_bandwidth(device: dict) -> Optional[float]:
    """Bytes/s the DRAM's interface can move: memory clock × 2 (double data rate) × bus width."""
    clock, bits = device.get("memory_clock_hz"), device.get("memory_bus_bits")
    return clock * 2 * bits / 8 if clock and bits else None


class ProfileResult:
    """What :func:`profile` returns: one :class:`KernelProfile` per kernel launch of the profiled call.

    ``str()`` is a table (``_repr_html_`` in a notebook), ``to_dict()`` plain data, ``plot()`` a roofline.
    ``raw`` is ncu's whole output (the CSV with every metric); ``bandwidth`` the device's measured copy
    bandwidth (bytes/s, None where it was not measured); ``seconds`` the wall time of the profiling run."""

    def __init__(self, op: str, kernels: List[KernelProfile], device: dict, raw: str = "",
                 bandwidth: Optional[float] = None, seconds: Optional[float] = None, command: Sequence[str] = ()):
        self.op, self.kernels, self.device, self.raw = op, kernels, device, raw
        self.bandwidth, self.seconds, self.command = bandwidth, seconds, list(command)

    def __iter__(self):
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    def __getitem__(self, which) -> KernelProfile:
        """A launch by position, or the first whose (short) name is or starts with ``which``."""
        if isinstance(which, int):
            return self.kernels[which]
        for k in self.kernels:
            if which in (k.name, k.short_name) or k.short_name.startswith(which) or k.name.startswith(which):
                return k
        raise KeyError(f"{self.op}: no kernel {which!r} (kernels: {', '.join(k.short_name for k in self.kernels)})")

    @property
    def duration_us(self) -> float:
        return sum(k.duration_us or 0.0 for k in self.kernels)

    @property
    def peak_flops(self) -> Optional[float]:
        return fp32_peak_flops(self.device)

    @property
    def peak_bandwidth(self) -> Optional[float]:
        return dram_peak_bandwidth(self.device)

    HEADERS = ("kernel", "time", "DRAM %", "L2 %", "SM %", "occupancy", "regs", "grid x block", "DRAM bytes",
               "FLOP/B", "GB/s", "GFLOP/s", "limiter")

    def table_rows(self) -> List[List[str]]:
        return [[k.short_name, report.fmt_us(k.duration_us), _pct(k.dram_pct), _pct(k.l2_pct), _pct(k.sm_pct),
                 _pct(k.occupancy_pct), "-" if k.registers is None else str(k.registers),
                 f"{_dims(k.grid)} x {_dims(k.block)}", _si(k.dram_bytes, "B"), report.fmt_num(k.intensity),
                 "-" if k.gbps is None else f"{k.gbps:.0f}", report.fmt_num(k.gflops), k.verdict]
                for k in self.kernels]

    def summary(self) -> str:
        name, cc = self.device.get("name"), self.device.get("cc")
        where = f" on {name or 'GPU'}" + (f" (sm_{cc.replace('.', '')})" if cc else "") if name or cc else ""
        took = f"; profiled in {self.seconds:.1f} s" if self.seconds is not None else ""
        return (f"{self.op}{where}: {len(self.kernels)} kernel launch(es), {report.fmt_us(self.duration_us)} of GPU "
                f"time{took}")

    def notes(self) -> List[str]:
        return [f"{k.short_name}: {a[:300]}" for k in self.kernels for a in k.advice]

    def __str__(self) -> str:
        lines = [self.summary(), report.text_table(self.HEADERS, self.table_rows())]
        return "\n".join(lines + [f"ncu: {n}" for n in self.notes()])

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return report.html_table(self.HEADERS, self.table_rows(), title=self.summary(), details="\n".join(self.notes()))

    def to_dict(self) -> dict:
        return {"op": self.op, "seconds": self.seconds, "command": self.command,
                "device": {**self.device, "fp32_peak_flops": self.peak_flops,
                           "dram_peak_bytes_per_s": self.peak_bandwidth, "measured_bytes_per_s": self.bandwidth},
                "kernels": [k.to_dict() for k in self.kernels]}

    def plot(self, path=None):
        """A roofline (matplotlib Figure; also written as PNG to ``path`` when given): x = FLOP per DRAM byte, y =
        GFLOP/s, one point per kernel launch that did floating-point work; the memory roof from the measured copy
        bandwidth (and the DRAM interface's peak, dashed), the FP32 roof from the device's SMs × clock × lanes."""
        from matplotlib.figure import Figure

        points = [k for k in self.kernels if k.intensity and k.gflops]
        peak = self.peak_flops
        slopes = [(bw, label, style) for bw, label, style in
                  ((self.bandwidth, "measured copy bandwidth", "-"), (self.peak_bandwidth, "DRAM peak", "--")) if bw]
        xs = [k.intensity for k in points] + [peak / bw for bw, _, _ in slopes if peak]
        lo, hi = (min(xs) / 10, max(xs) * 10) if xs else (1e-2, 1e3)
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
        for bw, label, style in slopes:
            ridge = peak / bw if peak else hi
            ax.plot([lo, min(ridge, hi)], [bw * lo / 1e9, bw * min(ridge, hi) / 1e9], "k" + style, linewidth=1,
                    label=f"{label}: {bw / 1e9:.0f} GB/s")
        if peak:
            ax.plot([min(peak / bw for bw, _, _ in slopes) if slopes else lo, hi], [peak / 1e9] * 2, "k", linewidth=1.5,
                    label=f"FP32 peak: {peak / 1e12:.1f} TFLOP/s")
        for k in points:
            ax.plot([k.intensity], [k.gflops], "o", label=f"{k.short_name} ({report.fmt_us(k.duration_us)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        if peak:
            ax.set_ylim(top=peak / 1e9 * 2)  # the compute roof below the frame, not on it
        ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
        ax.set_ylabel("GFLOP/s")
        skipped = len(self.kernels) - len(points)
        ax.set_title(f"{self.op}: roofline" + (f" ({skipped} launch(es) without FLOPs not drawn)" if skipped else ""),
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
        return fig


# ------------------------------------------------------------------------------------------- profiling
def profile(op, *args, kernels_dir=None, timeout: float = 600.0, **kwargs) -> ProfileResult:
    """Run ``op(*args, **kwargs)`` under Nsight Compute in a fresh process and return what its kernels did.

    ``op``: a card name (its inputs made by the spec's ``make_inputs`` unless ``args`` are given: ``size=``, an
    int or a shape, default the spec's largest bench size; ``dtype=``, default its bench dtype), a kernelkit
    library's op (``kernelkit.ops.NAME``, ``lib.NAME``, ``torch.ops.<ns>.NAME``), a torch op
    (``torch.ops.aten.add.Tensor``) or a function defined at the top level of an importable module. Tensors are
    sent with their values and land on the same device in the child; other arguments are pickled. Every other
    keyword goes to the op. One ncu run takes seconds (its replay passes included); ``timeout`` bounds it."""
    started = time.perf_counter()
    ncu = find_ncu()
    device = _gpu_index(args, kwargs)
    call, preload, label = _plan(op, args, kwargs, kernels_dir)
    with tempfile.TemporaryDirectory(prefix="kernelkit-profile-") as tmp:  # private: mode 0700
        spec = {"call": call, "preload": preload, "device": device, "result": str(Path(tmp) / "result.json"),
                "inputs": _save_inputs(args, kwargs, Path(tmp) / "inputs.pt"), "sys_path": sys.path}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        command = [ncu, *NCU_OPTIONS, "--metrics", ",".join(METRICS), sys.executable, "-m", CHILD, str(spec_path)]
        code, out, err = _run(command, timeout)
        child = _read_json(Path(spec["result"]))
    result = _result(label, code, out, err, child, args, kwargs)
    result.command = command
    result.device = _with_device_properties(result.device, device)
    result.bandwidth = _measured_bandwidth(device)
    result.seconds = time.perf_counter() - started
    return result


def _gpu_index(args: tuple, kwargs: dict) -> int:
    """The GPU the op runs on: the first CUDA tensor argument's, else the current device."""
    import torch

    if not torch.cuda.is_available():
        raise ProfileError("kernelkit.profile needs a CUDA GPU: ncu reads the counters of the GPU the op runs on, "
                           "and torch sees none here")
    for t in _tensors((args, kwargs)):
        if t.is_cuda:
            return t.device.index
    return torch.cuda.current_device()


def _tensors(value) -> List[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


_NOT_BY_NAME = ("kernelkit.profile runs the op again in a fresh process under Nsight Compute, which must find it by "
                "name: pass a card name ('vector_add'), a kernelkit op (kernelkit.ops.vector_add, lib.NAME), a torch "
                "op (torch.ops.aten.add.Tensor) or a function defined at the top level of an importable module")


def _plan(op, args: tuple, kwargs: dict, kernels_dir) -> Tuple[dict, List[dict], str]:
    """(what the child calls, the libraries it loads first, a label) for ``op``."""
    import torch

    if isinstance(op, str):
        return _card_call(op, args, kwargs, kernels_dir)
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _op_call(op)
    if not callable(op):
        raise ProfileError(f"{_NOT_BY_NAME}; got {type(op).__name__}")
    return _extension_call(op) or _function_call(op)


def _card_call(name: str, args: tuple, kwargs: dict, kernels_dir) -> Tuple[dict, List[dict], str]:
    import torch

    from .. import loading

    size, dtype = kwargs.pop("size", None), kwargs.pop("dtype", None)
    if args and (size is not None or dtype is not None):
        raise ProfileError("size=/dtype= choose the inputs kernelkit makes for a card: give them or the op's "
                           "arguments, not both")
    if isinstance(size, int):
        size = (size,)
    if size is not None and not (isinstance(size, (tuple, list)) and all(isinstance(s, int) for s in size)):
        raise ProfileError(f"size: expected a number of elements or a shape, got {size!r}")
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).replace("torch.", "")
    if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
        raise ProfileError(f"dtype: expected a torch dtype or its name ('float32'), got {dtype!r}")
    # built here, not in the child: under ncu every compiler process it started would be followed
    loading.load(name, kernels_dir=kernels_dir, load=False)
    call = {"kind": "card", "card": name, "kernels_dir": None if kernels_dir is None else str(kernels_dir),
            "size": None if size is None else list(size), "dtype": dtype}
    return call, [], name


def _op_call(op) -> Tuple[dict, List[dict], str]:
    import torch

    if isinstance(op, torch._ops.OpOverload):
        qualified, overload = op._schema.name, op._overloadname
    else:
        qualified, overload = op._qualified_op_name, None
    ns, name = qualified.split("::", 1)
    label = qualified + (f".{overload}" if overload else "")
    return {"kind": "op", "ns": ns, "name": name, "overload": overload}, _libraries_defining(ns), label


def _libraries_defining(ns: str) -> List[dict]:
    """What the child loads so that namespace ``ns`` exists there: the kernelkit build that registered it, else
    (for a namespace torch does not define itself) every library this process loaded with torch.ops.load_library."""
    import torch

    from ..jit import registry

    for lib in list(registry.BY_KEY.values()):
        if lib.ns == ns:
            return [_library_preload(lib)]
    if ns in ("aten", "prims"):
        return []
    return [{"kind": "torch_library", "path": p} for p in sorted(torch.ops.loaded_libraries)]


def _library_preload(lib) -> dict:
    """How the child loads the build ``lib``: a card again with the same options (its NVRTC kernels and setup
    come with it; the child checks the build key), a build from strings by its path."""
    if lib.card is None:
        return {"kind": "library", "name": lib.name, "key": lib.key, "path": str(lib.path)}
    options = getattr(lib, "_options", None) or {"name": lib.card.name, "kernels_dir": lib.card.dir}
    return {"kind": "card", "key": lib.key, "options": {k: _jsonable(v) for k, v in options.items()}}


def _jsonable(value):
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _extension_call(op) -> Optional[Tuple[dict, List[dict], str]]:
    """A pybind11 function of an extension kernelkit loaded (``load_inline(..., functions=...)``): imported
    again in the child from the same file; None for anything else."""
    from ..jit import registry

    module_name, name = getattr(op, "__module__", None), getattr(op, "__name__", None)
    if not isinstance(module_name, str) or not isinstance(name, str) or module_name in sys.modules:
        return None
    modules = [(lib._pymodule, lib.path) for lib in list(registry.BY_KEY.values()) if lib._pymodule is not None]
    modules += [(m, so) for m, so in registry.extensions() if isinstance(m, types.ModuleType)]
    for module, path in modules:
        if getattr(module, name, None) is op:
            call = {"kind": "extension", "import_name": module.__spec__.name, "path": str(path), "attr": name}
            return call, [], f"{module.__name__}.{name}"
    return None


def _function_call(op) -> Tuple[dict, List[dict], str]:
    module_name, qualname = getattr(op, "__module__", None), getattr(op, "__qualname__", None) or ""
    if "<lambda>" in qualname:
        raise ProfileError(f"{_NOT_BY_NAME}, not a lambda")
    if "<locals>" in qualname:
        raise ProfileError(f"{_NOT_BY_NAME}, not a function defined inside another function ({qualname})")
    if module_name == "__main__":
        raise ProfileError(f"{_NOT_BY_NAME}: {qualname} is defined in __main__ (a notebook or a script), which the "
                           "child process cannot import: move it into a module")
    path = _path_in_module(op, sys.modules.get(module_name), qualname)
    if path is None:
        raise ProfileError(f"{_NOT_BY_NAME}: {type(op).__name__} {qualname or op!r} is not reachable by name in "
                           f"module {module_name!r}")
    preload = _ops_card(path) if module_name == "kernelkit.ops" else []
    return {"kind": "function", "module": module_name, "path": path}, preload, f"{module_name}.{path}"


def _path_in_module(op, module, qualname: str) -> Optional[str]:
    """The attribute path that finds ``op`` in ``module`` (its qualified name, or its bare name: builtins such as
    torch.add have a qualified name inside a class the module does not export)."""
    if module is None:
        return None
    for path in dict.fromkeys([qualname, getattr(op, "__name__", "")]):
        found = module
        for part in path.split(".") if path else ["<none>"]:
            found = getattr(found, part, None)
        if found is op:
            return path
    return None


def _ops_card(name: str) -> List[dict]:
    """kernelkit.ops.NAME runs its card's current build: the one loaded here, which the child loads first."""
    from .. import ops
    from ..jit import registry

    card = ops._card_for(name)
    lib = registry.latest(card) if card is not None else None
    return [_library_preload(lib)] if lib is not None else []


def _save_inputs(args: tuple, kwargs: dict, path: Path) -> Optional[str]:
    """The arguments, written for the child (tensors with their values and devices); None when there are none."""
    import torch

    if not args and not kwargs:
        return None
    try:
        torch.save({"args": list(args), "kwargs": kwargs}, path)
    except Exception as e:  # noqa: BLE001 - pickling fails in many ways
        raise ProfileError(f"the op's arguments cannot be sent to the profiling process ({type(e).__name__}: {e}): "
                           "pass tensors, numbers, strings and other picklable values") from None
    return str(path)


def _run(command: List[str], timeout: float) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of ncu; it and its children are killed at the timeout or an interrupt."""
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)
    except OSError as e:
        raise ProfileError(f"could not start {command[0]}: {e}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as e:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise ProfileError(f"ncu ran over {timeout:g} s and was stopped: pass a larger timeout= (every kernel "
                               "launch is replayed once per group of counters)") from None
        raise
    return proc.returncode, out, err


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()][-_TAIL_LINES:]
    return "\n".join(lines)[-_TAIL_CHARS:]


def _result(label: str, code: int, out: str, err: str, child: Optional[dict], args: tuple,
            kwargs: dict) -> ProfileResult:
    """The ProfileResult of an ncu run, or the one error that says what went wrong."""
    output = out + "\n" + err
    if "ERR_NVGPUCTRPERM" in output:
        raise ProfileError(PERMISSION_HELP)
    if child is not None and child.get("error"):
        raise ProfileError(f"{label} failed in the profiling process: {child['error']}\n"
                           f"last lines of its output:\n{_tail(output)}")
    label = (child or {}).get("label") or label
    has_csv = _csv_rows(out) is not None
    if not has_csv and child is None:  # ncu, or the interpreter under it, stopped before the op ran
        raise ProfileError(f"profiling {label} failed: ncu exited with code {code}; last lines of its output:\n"
                           f"{_tail(output)}")
    result = parse(out, label) if has_csv else ProfileResult(label, [], {}, raw=out)
    if not result.kernels:
        where = sorted({str(t.device) for t in _tensors((args, kwargs))})
        raise ProfileError(f"ncu profiled no kernel of {label}: nothing ran on the GPU during the profiled call. "
                           "Does the op run on the CPU?" + (f" Its tensor arguments are on {', '.join(where)}: "
                                                           "pass CUDA tensors." if where else ""))
    return result


def _with_device_properties(device: dict, index: int) -> dict:
    """The GPU's description from ncu, its gaps filled from torch's device properties (clocks in kHz there)."""
    import torch

    if not torch.cuda.is_available():  # only where ncu is a stand-in (tests)
        return device
    p = torch.cuda.get_device_properties(index)
    known = {"name": p.name, "cc": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
             "clock_hz": getattr(p, "clock_rate", 0) * 1e3 or None,
             "memory_clock_hz": getattr(p, "memory_clock_rate", 0) * 1e3 or None,
             "memory_bus_bits": getattr(p, "memory_bus_width", None)}
    return {k: device.get(k) if device.get(k) is not None else v for k, v in known.items()}


def _measured_bandwidth(index: int) -> Optional[float]:
    """The device's copy bandwidth (measured once, then cached): the memory roof."""
    import torch

    if not torch.cuda.is_available():
        return None
    from ..harness.bandwidth import device_bandwidth

    return device_bandwidth(torch.device("cuda", index))
