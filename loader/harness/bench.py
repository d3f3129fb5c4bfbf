"""kernelkit.bench: how fast is an op, side by side with eager PyTorch, torch.compile and the floor?

Each size of a sweep times the contenders (the op, the eager reference, ``torch.compile(reference)``,
optionally a copy of the same bytes) side by side with :mod:`.timing`'s timers: CUDA events with L2
flushes on a GPU, the host timer on a CPU, so CI exercises the whole path. The first contender is compared
with each other one round by round (:func:`.timing.paired_ratio`). The floor is bytes moved / the device's
measured bandwidth (:mod:`.bandwidth`). Host overhead (wall time per call on a tiny input, no sync) is
measured separately against torch.add's. Results print as a table, and write JSON, CSV and PNG plots.

The baseline is torch's own op where the spec names one (``Spec.torch_op``), else ``torch.compile`` of the
reference where that is timed, else the reference formula run eagerly ("eager"). On a CPU every size is timed
at 1 thread and at torch's default, the machine's load measured over each (:mod:`.machine`): a ratio from a
window whose threads lacked idle CPUs, or whose interval is wide, is reported as unreliable, not as a verdict.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import machine, report
from .bandwidth import copy_contender, device_bandwidth, device_name, tensor_bytes
from .spec import Spec, check_inputs_arg
from .target import default_device, resolve
from .timing import Ratio, host_overhead_us, paired_ratio, time_together

# --------------------------------------------------------------------------------------------- results

COPY = "copy"  # the measured floor contender (bench(copy_floor=True))
EAGER = "eager"  # the reference run eagerly: the card's formula, which may be written for clarity, not speed
LABELS = {EAGER: "reference (eager)"}


def label(contender: str) -> str:
    """A contender's name in tables: "eager" says what it runs."""
    return LABELS.get(contender, contender)


@dataclasses.dataclass
class BenchResult:
    name: str
    device: str
    device_name: str
    dtype: str
    timer: str
    bandwidth_bytes_per_s: Optional[float]
    contenders: List[str]
    rows: List[dict] = dataclasses.field(default_factory=list)  # one per (size, threads, contender), floor included
    host_us: Dict[str, float] = dataclasses.field(default_factory=dict)
    notes: List[str] = dataclasses.field(default_factory=list)
    #: CPU: the thread counts every size was timed at, torch's default last (rows carry "threads"); GPU: none
    threads: List[int] = dataclasses.field(default_factory=list)
    #: CPU: the machine's load over each (size, threads) window (:class:`.machine.Load`, plus "size", "busy")
    loads: List[dict] = dataclasses.field(default_factory=list)
    #: the contender that is torch's own op (``Spec.torch_op``), if any
    torch_op: Optional[str] = None

    @property
    def sizes(self) -> List[Tuple[int, ...]]:
        return list(dict.fromkeys(tuple(r["size"]) for r in self.rows))

    @property
    def baseline(self) -> str:
        """What the first contender is measured against: torch's own op, else torch.compile, else eager."""
        timed = {r["contender"] for r in self.rows if r.get("median_us")}
        return next((c for c in (self.torch_op, "torch.compile") if c in timed), EAGER)

    def get(self, contender: str, size=None, threads: Optional[int] = None) -> Optional[dict]:
        """The row of ``contender`` at ``size`` (default: the largest) and ``threads`` (default: torch's)."""
        size = tuple(size) if size is not None else self.sizes[-1]
        threads = threads or (self.threads[-1] if self.threads else None)
        return next((r for r in self.rows if r["contender"] == contender and tuple(r["size"]) == size
                     and r.get("threads") in (threads, None)), None)

    def median_us(self, contender: str, size=None, threads: Optional[int] = None) -> Optional[float]:
        row = self.get(contender, size, threads)
        return row["median_us"] if row else None

    def speedup(self, contender: str, baseline: str = "eager", size=None) -> Optional[float]:
        """Ratio of the two medians (see :meth:`paired` for the round-by-round ratio of the first contender)."""
        a, b = self.median_us(contender, size), self.median_us(baseline, size)
        return b / a if a and b else None

    def paired(self, other: str, size=None, threads: Optional[int] = None) -> Optional[Ratio]:
        """How many times faster the first contender is than ``other`` at ``size`` (default: the largest) and
        ``threads`` (default: torch's), round by round, with its 95% confidence interval and its caveat (a busy
        machine, a wide interval); None if either was not timed."""
        row = self.get(other, size, threads)
        if not row or row.get("ratio") is None:
            return None
        return Ratio(row["ratio"], row["ratio_lo"], row["ratio_hi"], row["reps"], row.get("unreliable") or "")

    def headers(self) -> List[str]:
        h = ["size"] + (["threads"] if self.threads else []) + [label(c) for c in self.contenders]
        h += ["floor", f"% bw ({self.contenders[0]})"] if self.bandwidth_bytes_per_s else []
        return h + [f"{self.contenders[0]} vs {label(c)} (95% CI)" for c in self.contenders[1:]]

    def table_rows(self) -> List[list]:
        return [self._table_row(size, threads) for size in self.sizes for threads in self.threads or [None]]

    def _table_row(self, size, threads: Optional[int]) -> list:
        row: List[Any] = [report.fmt_shape(size)] + ([threads] if threads else [])
        for c in self.contenders:
            r = self.get(c, size, threads)
            if r is None or r.get("error"):
                row.append("error" if r else "-")
            else:
                row.append(f"{report.fmt_us(r['median_us'])} ({report.fmt_spread(r['p20_us'], r['p80_us'], r['median_us'])})")
        if self.bandwidth_bytes_per_s:
            first = self.get(self.contenders[0], size, threads)
            row += [report.fmt_us(self.median_us("floor", size)),
                    f"{first['pct_bw']:.0f}%" if first and first.get("pct_bw") is not None else "-"]
        return row + [fmt_ratio(self.paired(c, size, threads)) for c in self.contenders[1:]]

    def title(self) -> str:
        """One line: the op, the device, the dtype, the timer, the bandwidth, the host cost per call and, on a
        CPU, the threads and the machine's load."""
        bw = f", bandwidth {self.bandwidth_bytes_per_s / 1e9:.0f} GB/s" if self.bandwidth_bytes_per_s else ""
        host = ", host us/call: " + ", ".join(f"{k} {v:.1f}" for k, v in self.host_us.items()) if self.host_us else ""
        return f"bench {self.name} on {self.device_name} [{self.dtype}, {self.timer}{bw}]{host}{self._load_text()}"

    def _load_text(self) -> str:
        """"; threads 1, 2; 2 CPUs, others used up to 1.2, its threads waiting for a CPU up to 0.05 on average,
        load 2.9 -> 3.1; busy in 3 of 10 timings"."""
        if not self.loads:
            return ""
        others = [w["others_cpus"] for w in self.loads if w["others_cpus"] is not None]
        waited = [w["waited_cpus"] for w in self.loads if w.get("waited_cpus") is not None]
        before, after = (f"{v:.1f}" if v is not None else "?"
                         for v in (self.loads[0]["loadavg_before"], self.loads[-1]["loadavg_after"]))
        busy = sum(1 for w in self.loads if w["busy"])
        return (f"; threads {', '.join(map(str, self.threads))}; {self.loads[0]['cpus']} CPUs"
                + (f", others used up to {max(others):.1f}" if others else "")
                + (f", its threads waiting for a CPU up to {max(waited):.2f} on average" if waited else "")
                + f", load {before} -> {after}"
                + (f"; busy in {busy} of {len(self.loads)} timings" if busy else ""))

    def summary(self) -> str:
        """The title, the table of times per size and contender, and the notes."""
        text = self.title() + "\n" + report.text_table(self.headers(), self.table_rows())
        return text + "".join(f"\nnote: {n}" for n in self.notes)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return report.html_table(self.headers(), self.table_rows(), title=self.title(), details="\n".join(self.notes))

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items()}

    def to_json(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    # ratio/ratio_lo/ratio_hi: this contender's time over the first contender's, round by round (paired_ratio)
    CSV_FIELDS = ("name", "device", "dtype", "size", "numel", "threads", "contender", "median_us", "p20_us", "p80_us",
                  "mean_us", "min_us", "reps", "dropped", "timer", "bytes", "gbps", "pct_bw", "ratio", "ratio_lo",
                  "ratio_hi", "unreliable", "others_cpus", "waited_cpus", "error")

    def to_csv(self, path) -> Path:
        return write_csv([self], path)

    def plot(self, out_dir, stem: Optional[str] = None) -> List[Path]:
        """time vs size (all contenders + floor), speedup vs size (vs eager), % of bandwidth vs size."""
        return report.plot_sweep(*self.plot_args(), out_dir, stem or self.name)

    def plot_args(self) -> Tuple[Dict[str, List[dict]], str, str]:
        """(series, x label, title) for :func:`report.plot_sweep`: plain data, so another process can draw."""
        sizes = self.sizes
        varying = [d for d in range(len(sizes[0])) if len({s[d] for s in sizes if len(s) == len(sizes[0])}) > 1] \
            if sizes and sizes[0] else []
        if len(varying) == 1 and all(len(s) == len(sizes[0]) for s in sizes):
            d = varying[0]
            xof = lambda s: s[d]  # noqa: E731
            others = ", ".join(f"dim {k} = {v}" for k, v in enumerate(sizes[0]) if k != d)
            xlabel = f"size of dim {d}" + (f" ({others})" if others else "")
        elif all(r.get("bytes") for r in self.rows if r.get("median_us")):  # many dims vary: the work done
            moved = {tuple(r["size"]): r["bytes"] for r in self.rows if r.get("bytes")}
            xof, xlabel = (lambda s: moved[s]), "bytes moved"  # noqa: E731
        else:
            xof, xlabel = math.prod, "elements"
        threads = self.threads[-1] if self.threads else None  # torch's default: the tables have 1 thread too
        series: Dict[str, List[dict]] = {}
        for r in self.rows:
            if r.get("median_us") and r.get("threads") in (threads, None):
                series.setdefault(label(r["contender"]), []).append({**r, "x": xof(tuple(r["size"]))})
        for points in series.values():
            points.sort(key=lambda p: p["x"])
        title = report.sweep_title(self.name, self.device, self.device_name, self.dtype)
        return series, xlabel, title + (f", {threads} thread{'s' * (threads > 1)}" if threads else "")


def fmt_ratio(r: Optional[Ratio]) -> str:
    """"0.64x (0.61-0.66)", or the reason it is unreliable instead of an interval."""
    if r is None:
        return "-"
    return f"unreliable ({r.caveat}): {r.median:.2f}x" if r.caveat else f"{r.median:.2f}x ({r.lo:.2f}-{r.hi:.2f})"


def write_csv(results: Sequence[BenchResult], path) -> Path:
    """One CSV row per (op, size, contender) of every result."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=BenchResult.CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for res in results:
            for r in res.rows:
                w.writerow({**r, "name": res.name, "device": res.device, "dtype": res.dtype,
                            "size": report.fmt_shape(r["size"])})
    return path


# ----------------------------------------------------------------------------------------------- bench

BenchTarget = Union[None, str, Spec, Callable, Dict[str, Callable], Sequence[Callable]]


def _contenders(target: BenchTarget, spec: Optional[Spec], kernels_dir,
                device) -> Tuple[Dict[str, Callable], Optional[Spec], torch.device]:
    """(contenders by name, spec, device): a card name, Spec or callable through :func:`.target.resolve`
    (a card's op is "kernelkit"); a dict or list of callables as given."""
    if target is None:
        if spec is None:
            raise TypeError("bench: give an op (or contenders) or a spec/card name")
        target = spec
    if isinstance(target, (str, Spec)) or callable(target):
        t = resolve(target, spec=spec, kernels_dir=kernels_dir, device=device)
        name = "kernelkit" if t.spec is not None else getattr(t.op, "__name__", "op")
        return {name: t.op}, t.spec, t.device
    fns = dict(target) if isinstance(target, dict) else \
        {getattr(f, "__name__", f"op{i}"): f for i, f in enumerate(target)}
    return fns, spec, torch.device(device if device is not None else default_device(spec) or "cpu")


@contextlib.contextmanager
def _many_recompiles():
    """A size sweep specialises torch.compile once per size: lift the recompile limit meanwhile, else
    dynamo silently falls back to eager after 8 sizes."""
    try:
        import torch._dynamo.config as cfg
    except ImportError:  # pragma: no cover
        yield
        return
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    with cfg.patch(**{name: max(64, getattr(cfg, name))}):
        yield


CPU_MAX_NUMEL = 1 << 22  # CPU sweeps stop here: the GPU-sized sweeps would take minutes on a laptop


def _add_references(contenders: Dict[str, Callable], reference: Optional[Callable], compile: bool,
                    torch_op: Optional[Tuple[str, Callable]]) -> Optional[str]:
    """torch's own op, the eager reference and torch.compile(reference) join the contenders, unless already
    named (a reference that is torch's op joins once, by the op's name). Returns the torch op's name."""
    if torch_op is not None:
        contenders.setdefault(*torch_op)
    if reference is not None and EAGER not in contenders and (torch_op is None or reference is not torch_op[1]):
        contenders[EAGER] = reference
    if compile and reference is not None and "torch.compile" not in contenders:
        contenders["torch.compile"] = torch.compile(reference, dynamic=False)
    return torch_op[0] if torch_op is not None else None


def _cpu_cap(spec: Optional[Spec]) -> Optional[int]:
    """A spec's sweep is sized for a GPU and would take minutes on a CPU: stop at CPU_MAX_NUMEL elements
    (its smallest size always runs)."""
    if spec is None or not spec.bench_sizes:
        return None
    return max(CPU_MAX_NUMEL, min(math.prod(s) for s in spec.bench_sizes))


def _inputs_and_sizes(spec: Optional[Spec], inputs, sizes, max_numel: Optional[int]):
    """(make_inputs, sizes to time): ``inputs`` (given values time at their own size), else the spec's."""
    if spec is None and inputs is None:
        raise TypeError("bench: give inputs= (a tuple of args or a make_inputs callable) or a spec")
    check_inputs_arg(inputs, "bench")
    if isinstance(inputs, tuple):
        first = next((a for a in inputs if isinstance(a, torch.Tensor)), None)
        sizes = [tuple(first.shape) if first is not None else ()]
        return (lambda *_shape_dtype_device_generator, **_: inputs), _sweep(sizes, spec, max_numel)
    return inputs if inputs is not None else spec.make_inputs, _sweep(sizes, spec, max_numel)


def _sweep(sizes, spec: Optional[Spec], max_numel: Optional[int]) -> List[Tuple[int, ...]]:
    """The sizes to time (``sizes``, else the spec's bench_sizes); a sweep with nothing to time is a
    ValueError, not an empty table."""
    if sizes is None and spec is None:
        raise TypeError("bench: no sizes (give sizes=, inputs=, or a spec with bench_sizes)")
    sizes = [tuple(s) for s in (sizes if sizes is not None else spec.bench_sizes)]
    if not sizes:
        source = "" if spec is None else f" (the spec {spec.name!r} lists no bench_sizes)"
        raise ValueError(f"bench: sizes: expected at least one size, got an empty list{source}")
    if max_numel is not None and all(math.prod(s) > max_numel for s in sizes):
        raise ValueError(f"bench: max_numel={max_numel} skips every size ({', '.join(map(report.fmt_shape, sizes))}): "
                         "nothing would be timed")
    return sizes


def bench(target: BenchTarget = None, inputs=None, *, spec: Optional[Spec] = None, reference: Optional[Callable] = None,
          sizes: Optional[Sequence[Tuple[int, ...]]] = None, dtype: Optional[torch.dtype] = None, device=None,
          compile: Optional[bool] = None, graph: bool = False, flush_l2: bool = True,
          budget_ms: Optional[float] = None, warmup_ms: Optional[float] = None, host_overhead: bool = True,
          floor: bool = True, copy_floor: bool = False, max_numel: Optional[int] = None, seed: int = 0,
          progress: Optional[Callable[[str], None]] = None, kernels_dir=None,
          threads: Optional[Sequence[int]] = None, strict: bool = False) -> BenchResult:
    """Time ``target`` over a size sweep, side by side with torch's own op (``spec.torch_op``), the eager
    reference, ``torch.compile(reference)`` and the bandwidth floor.

    ``target``: a card name or :class:`Spec` (its op is "kernelkit"), a callable, a dict name -> callable
    or a list of callables. Inputs come from ``inputs`` (a tuple of args, or a
    ``make_inputs(shape, dtype=, device=, generator=)``), else ``spec.make_inputs``, for each of ``sizes``
    (default ``spec.bench_sizes``). ``compile`` defaults to True on CUDA, False on a CPU (Inductor's C++
    build per size is slow there). ``graph=True`` times CUDA-graph replays. ``max_numel`` skips larger
    sizes (noted); on a CPU the spec's sweep stops at ``CPU_MAX_NUMEL`` elements unless ``max_numel`` is given
    (``math.inf``: every size). Bytes moved come from ``spec.bytes_moved(args, out)``, else all tensor args + outputs.
    ``copy_floor=True`` adds a measured floor, the contender "copy": a device copy moving the same bytes
    (half read, half written), timed in the same rounds. At sizes where launch and memory latency rule,
    bytes/bandwidth says nothing; a copy shows what any kernel moving those bytes takes. A card name is
    searched in ``kernels_dir`` (default: KERNELKIT_PATH + the built-in cards). Nothing to time (``sizes=[]``,
    no bench_sizes, ``max_numel`` below every size) is a ValueError; ``inputs`` of another form a TypeError.
    On a CPU each size is timed at ``threads`` torch threads (default 1 and torch's), the machine's load measured:
    a ratio from a busy machine or with a wide interval is marked unreliable (``Ratio.caveat``, the row's).
    ``strict=True``: for an op that may cheat, each timed in a process of its own (``harness.strict``, docs/strict.md).
    """
    if strict:
        from .strict import strict_bench
        return strict_bench(target, inputs, BenchResult, _cpu_cap, spec=spec, reference=reference, sizes=sizes,
                            dtype=dtype, device=device, budget_ms=budget_ms, max_numel=max_numel, kernels_dir=kernels_dir)
    contenders, spec, device = _contenders(target, spec, kernels_dir, device)
    reference = reference if reference is not None else spec.reference if spec is not None else None
    on_gpu = device.type == "cuda"
    dtype = dtype or (spec.bench_dtype if spec is not None else torch.float32)
    torch_op = _add_references(contenders, reference, on_gpu if compile is None else compile,
                               spec.torch_baseline() if spec is not None else None)
    if max_numel is None and not on_gpu and sizes is None and inputs is None:
        max_numel = _cpu_cap(spec)
    make, sizes = _inputs_and_sizes(spec, inputs, sizes, max_numel)
    name = spec.name if spec is not None else next(iter(contenders))
    timer = ("cuda-graph" if graph else "cuda-events") if on_gpu else "host"
    bw = device_bandwidth(device) if floor else None
    result = BenchResult(name, str(device), device_name(device), str(dtype).replace("torch.", ""), timer, bw,
                         list(contenders) + ([COPY] if copy_floor else []), torch_op=torch_op,
                         threads=[] if on_gpu else sorted(set(threads)) if threads else machine.thread_settings())
    result.notes += [] if on_gpu else _host_timer_notes(graph)
    timing_kw = _timing_options(on_gpu, budget_ms, warmup_ms, flush_l2, graph)
    bytes_moved = spec.bytes_moved if spec is not None and spec.bytes_moved is not None else tensor_bytes
    with _many_recompiles():
        for size in sizes:
            if max_numel is not None and math.prod(size) > max_numel:
                result.notes.append(f"size {report.fmt_shape(size)} skipped (over {max_numel} elements; "
                                    "max_numel=math.inf, or kernelkit bench --all-sizes, times every size)")
                continue
            args = tuple(make(size, dtype=dtype, device=device, generator=torch.Generator(device=device).manual_seed(seed)))
            _bench_size(result, contenders, args, size, bytes_moved, bw, timing_kw, progress, copy_floor)
    if host_overhead:
        _host_overheads(result, contenders, make, spec, dtype, device, seed)
    _note_busy(result)
    return result


def _host_timer_notes(graph: bool) -> List[str]:
    return ["graph mode needs CUDA: host timer used"] * graph + [
        "host timer (time.perf_counter): CPU wall time, no cache flush; % bw is against a DRAM copy, so "
        "cache-resident sizes can exceed 100%"]


def _timing_options(on_gpu: bool, budget_ms: Optional[float], warmup_ms: Optional[float], flush_l2: bool,
                    graph: bool) -> dict:
    """The timer's budget and warm-up (defaults per device); on a GPU, the L2 flush and graph mode too."""
    timing_kw = dict(budget_ms=budget_ms or (100.0 if on_gpu else 50.0), warmup_ms=warmup_ms or (25.0 if on_gpu else 10.0))
    if on_gpu:
        timing_kw.update(flush=flush_l2, graph=graph)
    return timing_kw


def _note_busy(result: BenchResult) -> None:
    busy = [w for w in result.loads if w["busy"]]
    if busy:
        worst = max(busy, key=lambda w: (w["others_cpus"] or 0) + (w.get("waited_cpus") or 0))
        result.notes.append(f"the machine was busy in {len(busy)} of {len(result.loads)} timings (worst: "
                            f"{worst['busy']}): their ratios are marked unreliable; rerun on an idle machine")


def _bench_size(result: BenchResult, contenders: Dict[str, Callable], args: tuple, size, bytes_moved, bw,
                timing_kw: dict, progress, copy_floor: bool = False) -> None:
    """Time every contender on one size's inputs, side by side (one call of each in turn), at each of the
    result's thread counts on a CPU; add the floor."""
    errors: Dict[str, str] = {}
    ready, moved = _ready(contenders, args, bytes_moved, errors)
    if copy_floor:
        if moved is None:
            errors[COPY] = _one_line(RuntimeError("no contender ran, so the bytes to copy are unknown"))
        else:
            ready[COPY] = copy_contender(moved, torch.device(result.device))
    for threads in result.threads or [None]:
        rows = {c: {"size": list(size), "numel": math.prod(size), "contender": c, **({"threads": threads} if threads else {})}
                for c in result.contenders}
        for cname, error in errors.items():
            rows[cname]["error"] = error
        _time_window(result, ready, rows, size, threads, timing_kw)
        for cname, row in rows.items():
            note = f"{cname} at {report.fmt_shape(size)}: {row.get('error')}"
            if "error" in row and cname not in errors and note not in result.notes:
                result.notes.append(note)
            if progress:
                where = f" ({threads} thread{'s' * (threads > 1)})" if threads else ""
                progress(f"{result.name} {report.fmt_shape(size)}{where} {cname}: {report.fmt_us(row.get('median_us'))}")
            if moved is not None:
                row["bytes"] = moved
                if row.get("median_us"):
                    row["gbps"] = moved / row["median_us"] / 1e3
                    row["pct_bw"] = 100.0 * moved / (row["median_us"] * 1e-6) / bw if bw else None
        result.rows += rows.values()
    result.notes += [f"{cname} at {report.fmt_shape(size)}: {error}" for cname, error in errors.items()]
    if moved is not None and bw:
        result.rows.append({"size": list(size), "numel": math.prod(size), "contender": "floor", "bytes": moved,
                            "median_us": moved / bw * 1e6, "timer": "bytes/bandwidth", "pct_bw": 100.0})


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _ready(contenders: Dict[str, Callable], args: tuple, bytes_moved, errors: Dict[str, str]):
    """(the contenders bound to ``args``, the bytes moved from the first output there is): the first calls of
    the others (compiles, loads) are time_together's, which reports their errors."""
    ready: Dict[str, Callable] = {}
    moved = None
    for cname, fn in contenders.items():
        if moved is None:
            try:
                out = fn(*args)
                moved = int(bytes_moved(args, out))
                del out
            except Exception as e:  # noqa: BLE001 - one contender failing must not lose the others
                errors[cname] = _one_line(e)
                continue
        ready[cname] = lambda fn=fn: fn(*args)
    return ready, moved


def _time_window(result: BenchResult, ready: Dict[str, Callable], rows: Dict[str, dict], size,
                 threads: Optional[int], timing_kw: dict) -> None:
    """Time ``ready`` together (at ``threads`` torch threads, the machine's load measured, on a CPU) into
    ``rows``; the first contender against each other one, round by round, with the ratio's caveat."""
    if threads is None:
        outcomes, load = time_together(ready, result.device, **timing_kw), None
    else:
        with machine.torch_threads(threads), machine.measured(threads) as load:
            outcomes = time_together(ready, result.device, **timing_kw)
        result.loads.append({"size": list(size), **load.to_dict(), "busy": load.busy()})
    samples: Dict[str, List[float]] = {}
    for cname, outcome in outcomes.items():
        if isinstance(outcome, Exception):
            rows[cname]["error"] = _one_line(outcome)
        else:
            rows[cname].update(outcome.summary(), **({"others_cpus": load.others_cpus,
                                                      "waited_cpus": load.waited_cpus} if load else {}))
            samples[cname] = outcome.samples_us
    first = result.contenders[0]
    for cname, other in samples.items():
        if cname != first and first in samples and len(other) == len(samples[first]):
            ratio = paired_ratio(samples[first], other).judged(load.busy() if load else None)
            rows[cname].update(ratio=ratio.median, ratio_lo=ratio.lo, ratio_hi=ratio.hi, unreliable=ratio.caveat or None)


def _host_overheads(result: BenchResult, contenders, make, spec, dtype, device, seed, rounds: int = 3) -> None:
    """Per-call host time on the smallest input (no sync), against torch.add on a 1-element tensor.

    The contenders and torch.add are measured in interleaved rounds and each keeps its best round, so a
    slow spell of the host (frequency, another process) does not land on one side of the ratio only."""
    shapes = [tuple(s) for s in (spec.shapes if spec is not None else result.sizes) if math.prod(s) > 0]
    tiny = min(shapes, key=math.prod) if shapes else result.sizes[0]
    args = tuple(make(tiny, dtype=dtype, device=device, generator=torch.Generator(device=device).manual_seed(seed)))
    one = torch.ones(1, device=device)
    fns = {"torch.add": lambda: torch.add(one, one)}
    fns.update({cname: (lambda fn=fn: fn(*args)) for cname, fn in contenders.items()})
    for _ in range(rounds):
        for cname, fn in fns.items():
            try:
                us = host_overhead_us(fn, device)
            except Exception:  # noqa: BLE001 - reported in the sweep already
                continue
            result.host_us[cname] = min(result.host_us.get(cname, math.inf), us)
