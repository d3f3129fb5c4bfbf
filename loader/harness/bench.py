"""kernelkit.bench: how fast is an op, side by side with eager PyTorch, torch.compile and the floor?

GPU timing follows triton.testing.do_bench: CUDA events around each call, a 256 MB write between calls to
flush L2, warm-up, and a repeat count chosen to fill a time budget; median and p20/p80 are reported.
The contenders are timed side by side: one call of each per round, in a random order (reversed in the
round after), so a slow spell, or a device state that lasts a few milliseconds (small kernels' times jump
by ~0.5 us between such states), lands on all of them alike rather than on whichever was timed then,
and no contender keeps a place in the round. A contender whose host side outlasts the flush
(torch.compile on a slow host CPU) gets a GPU spin queued ahead of each timed call, so its device time
is not inflated by its launch time; host time is reported apart. After every timed call the timer asks
whether the device had already reached the call's start event (it then waited for the launch inside the
timed span: a host stall); such a round is left out, and the late contender's spin lengthened.
Optional CUDA-graph mode replays a captured call (no launch overhead). Host overhead (wall time per call
on a tiny input, no sync) is measured separately against torch.add's. The floor is bytes moved / the
device's bandwidth, measured once with a large device-to-device copy and cached. On a CPU the same
sweep runs with a host timer (time.perf_counter), so CI exercises the whole path.

Because each round times every contender once, the first contender (the op under test) is compared with
each other one round by round: the median of the per-round time ratios, with a distribution-free 95%
confidence interval (:func:`paired_ratio`). A state of the device that lasts milliseconds moves both
calls of a round alike, so the paired ratio resolves differences far below one contender's own spread;
an interval that contains 1 is a tie.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..jit.cache import cache_dir
from . import report
from .spec import Spec, load_card

L2_FLUSH_BYTES = 256 << 20
_FLUSH: Dict[torch.device, torch.Tensor] = {}


@dataclasses.dataclass
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    mean_us: float
    min_us: float
    reps: int
    timer: str
    samples_us: List[float] = dataclasses.field(default_factory=list, repr=False)  # one per round, in order
    dropped: int = 0  # rounds left out: the host was late with a launch, so device time was not alone

    @classmethod
    def from_samples(cls, samples_us: Sequence[float], timer: str, dropped: int = 0) -> "Timing":
        qs = statistics.quantiles(samples_us, n=10, method="inclusive") if len(samples_us) > 1 else [samples_us[0]] * 9
        return cls(statistics.median(samples_us), qs[1], qs[7], statistics.fmean(samples_us), min(samples_us),
                   len(samples_us), timer, list(samples_us), dropped)

    def summary(self) -> dict:
        """The statistics without the samples (what a report row keeps)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "samples_us"}


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``median`` of per-round ratios of two contenders' times with its 95% confidence interval
    [``lo``, ``hi``] over ``rounds`` rounds."""
    median: float
    lo: float
    hi: float
    rounds: int

    @property
    def verdict(self) -> str:
        """"faster" / "slower" when the interval excludes 1, else "tie" (ratio = other's time / ours)."""
        return "faster" if self.lo > 1.0 else "slower" if self.hi < 1.0 else "tie"

    def __str__(self) -> str:
        return f"{self.median:.3f}x [{self.lo:.3f}, {self.hi:.3f}]"


def paired_ratio(ours_us: Sequence[float], other_us: Sequence[float]) -> Ratio:
    """How many times faster ``ours`` is than ``other``, round by round: the median of other[r] / ours[r]
    with a distribution-free 95% confidence interval for that median (the order statistics k and n - 1 - k
    of the sorted ratios, k from the binomial(n, 1/2) normal approximation; the whole range below 6
    rounds). Both sequences are per-round samples of the same rounds (:func:`time_together`)."""
    if len(ours_us) != len(other_us) or not ours_us:
        raise ValueError(f"paired_ratio: expected two equally long, non-empty per-round sample lists, got "
                         f"{len(ours_us)} and {len(other_us)}")
    if min(ours_us) <= 0:
        raise ValueError("paired_ratio: ours_us must be positive times")
    r = sorted(o / u for u, o in zip(ours_us, other_us))
    n = len(r)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n))) if n >= 6 else 0
    return Ratio(statistics.median(r), r[k], r[n - 1 - k], n)


# ---------------------------------------------------------------------------------------------- timers

def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device not in _FLUSH:
        _FLUSH[device] = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    return _FLUSH[device]


def _graphed(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """Capture one call of ``fn`` in a CUDA graph (after warm-up on a side stream); return its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


_SPIN_CYCLES_PER_US: Dict[torch.device, float] = {}
_FLUSH_US: Dict[torch.device, float] = {}


def _event_us(fn: Callable[[], Any]) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3


def _spin_cycles_per_us(device: torch.device) -> float:
    """Clock cycles per microsecond of torch.cuda._sleep's spin, measured once per device."""
    if device not in _SPIN_CYCLES_PER_US:
        torch.cuda._sleep(1000)
        _SPIN_CYCLES_PER_US[device] = 1e6 / _event_us(lambda: torch.cuda._sleep(1_000_000))
    return _SPIN_CYCLES_PER_US[device]


_MAX_SPIN_US = 20_000.0  # a call whose host side takes longer than this is host-bound: timed as it comes


def _spin_us(host_us: float, lead_us: float) -> float:
    """GPU spin (us) to enqueue ahead of a timed call whose host side (flush, spin and event launches, the
    call itself) takes ``host_us``, so the device is still busy when the host has queued the call: with
    ``lead_us`` of device work ahead (the flush) the call is then not charged for its host time, which
    ``host_us`` reports apart. 0 if none is needed."""
    need_us = min(1.5 * host_us + 10.0 - lead_us, _MAX_SPIN_US)
    return need_us if need_us > 0 and hasattr(torch.cuda, "_sleep") else 0.0


def _repeats(est_s: float, budget_ms: float, min_reps: int, max_reps: int) -> int:
    return int(min(max_reps, max(min_reps, budget_ms * 1e-3 / max(est_s, 1e-9))))


Fns = Dict[str, Callable[[], Any]]
Outcome = Union[Timing, Exception]


def _first_calls(fns: Fns, sync: Callable[[], None]) -> Tuple[Fns, Dict[str, Outcome]]:
    """Call each function once; the ones that raise are reported, not timed."""
    ok: Fns = {}
    failed: Dict[str, Outcome] = {}
    for name, fn in fns.items():
        try:
            fn()
            sync()
            ok[name] = fn
        except Exception as e:  # noqa: BLE001 - one failing function must not lose the others
            failed[name] = e
    return ok, failed


def _round_robin(fns: Fns, reps: int, one_call: Callable[[str, Callable[[], Any], int], None],
                 failed: Dict[str, Outcome], seed: int = 0) -> None:
    """``reps`` rounds of one call of each function: a fresh (seeded) random order every other round and
    its reverse in the round after, so no function keeps a place in the round (on an H100, the same call
    placed second or fourth of nine measured 5-8% apart at 2^14-2^16 floats) and each place is balanced
    over a pair of rounds. A function that raises is dropped (its error reported) and the others go on."""
    rng = random.Random(seed)
    order = list(fns)
    for r in range(reps):
        if r % 2 == 0:
            rng.shuffle(order)
        for name in (order if r % 2 == 0 else order[::-1]):
            if name in failed:
                continue
            try:
                one_call(name, fns[name], r)
            except Exception as e:  # noqa: BLE001
                failed[name] = e


def time_cuda_together(fns: Fns, device=None, *, budget_ms: float = 100.0, warmup_ms: float = 25.0,
                       flush: bool = True, graph: bool = False, min_reps: int = 10,
                       max_reps: int = 10000) -> Dict[str, Outcome]:
    """Device time of each function with CUDA events, one event pair per call, L2 flushed before each
    call, the functions called in turn (one call of each per round): a slow spell of the device, or a
    state that lasts a few milliseconds, lands on all of them alike. A function whose host side takes
    longer than the flush gets a GPU spin queued ahead of its timed calls, so what is timed is device
    time, not the host's launch time; a round in which a launch still came late is left out (counted in
    ``Timing.dropped``) unless that would leave fewer than a quarter of them. ``budget_ms`` is per
    function.
    Returns a Timing per function, or the exception it raised."""
    device = torch.device(device if device is not None else "cuda")
    with torch.cuda.device(device):
        sync = torch.cuda.synchronize
        fns, failed = _first_calls(fns, sync)
        if graph:
            for name in list(fns):
                try:
                    fns[name] = _graphed(fns[name], device)
                except Exception as e:  # noqa: BLE001 - not capturable: reported like any failure
                    failed[name] = e
                    del fns[name]
        buf = _flush_buffer(device) if flush else None
        if buf is not None and device not in _FLUSH_US:
            buf.zero_()
            _FLUSH_US[device] = min(_event_us(buf.zero_) for _ in range(3))
        lead_us = _FLUSH_US[device] if buf is not None else 0.0
        est: Dict[str, float] = {}
        spin_us: Dict[str, float] = {}
        events: Dict[str, list] = {}
        late: set = set()  # rounds in which some call's launch came after the device work ahead of it

        def one_call(name: str, fn: Callable[[], Any], r: int) -> None:
            t0 = time.perf_counter()
            if buf is not None:
                buf.zero_()  # device busy flushing while the host queues the timed call: no launch gap timed
            if spin_us[name]:
                torch.cuda._sleep(int(spin_us[name] * _spin_cycles_per_us(device)))
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            # Late: the device reached the start event before the call was queued, so it waited for the
            # host inside the timed span (a slow host, a stall). Not late while the device is behind.
            late_launch = s.query()
            host_us = (time.perf_counter() - t0) * 1e6
            e.record()
            if r >= 0:
                events[name].append((s, e))
            if late_launch or r < 0:  # the device was idle: host_us is the host's own time
                spin_us[name] = max(spin_us[name], _spin_us(host_us, lead_us))
                if r >= 0:
                    late.add(r)  # this round is left out

        for name, fn in fns.items():
            try:
                def five(fn=fn):
                    for _ in range(5):
                        if buf is not None:
                            buf.zero_()
                        fn()

                est[name] = _event_us(five) / 5 * 1e-6  # includes the flush, like do_bench's estimate
                for _ in range(max(1, int(warmup_ms * 1e-3 / max(est[name], 1e-9)))):
                    fn()
                spin_us[name], events[name] = 0.0, []
                for _ in range(3):  # dry runs from an idle device: the host time of a whole timed call
                    sync()
                    one_call(name, fn, -1)
                sync()
            except Exception as e:  # noqa: BLE001
                failed[name] = e
        fns = {n: fn for n, fn in fns.items() if n not in failed}
        if fns:
            _round_robin(fns, _repeats(statistics.fmean(est.values()), budget_ms, min_reps, max_reps), one_call, failed)
        sync()
    timer = "cuda-graph" if graph else "cuda-events"
    live = {n: ev for n, ev in events.items() if n not in failed}
    rounds = min((len(ev) for ev in live.values()), default=0)
    keep = [r for r in range(rounds) if r not in late]
    if len(keep) < max(3, rounds // 4):  # a host always late: report what there is rather than nothing
        keep = list(range(rounds))
    out: Dict[str, Outcome] = {n: Timing.from_samples([ev[r][0].elapsed_time(ev[r][1]) * 1e3 for r in keep], timer,
                                                      rounds - len(keep))
                               for n, ev in live.items()}
    out.update(failed)
    return out


def time_host_together(fns: Fns, *, budget_ms: float = 50.0, warmup_ms: float = 10.0, min_reps: int = 5,
                       max_reps: int = 10000) -> Dict[str, Outcome]:
    """Wall time of each function with time.perf_counter, the functions called in turn; calls shorter
    than ~20 us are timed in batches. ``budget_ms`` is per function."""
    fns, failed = _first_calls(fns, lambda: None)
    batch: Dict[str, int] = {}
    est_batch_s: List[float] = []
    for name, fn in fns.items():
        try:
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
            est_s = (time.perf_counter() - t0) / 3
            deadline = time.perf_counter() + warmup_ms * 1e-3
            while time.perf_counter() < deadline:
                fn()
        except Exception as e:  # noqa: BLE001
            failed[name] = e
            continue
        batch[name] = max(1, int(20e-6 / max(est_s, 1e-9)))
        est_batch_s.append(est_s * batch[name])
    fns = {n: fn for n, fn in fns.items() if n in batch}
    samples: Dict[str, List[float]] = {name: [] for name in fns}

    def one_call(name: str, fn: Callable[[], Any], r: int) -> None:  # noqa: ARG001 - rounds all kept
        n = batch[name]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples[name].append((time.perf_counter() - t0) / n * 1e6)

    if fns:
        _round_robin(fns, _repeats(statistics.fmean(est_batch_s), budget_ms, min_reps, max_reps), one_call, failed)
    out: Dict[str, Outcome] = {n: Timing.from_samples(v, "host") for n, v in samples.items() if n not in failed}
    out.update(failed)
    return out


def _single(outcomes: Dict[str, Outcome]) -> Timing:
    (res,) = outcomes.values()
    if isinstance(res, Exception):
        raise res
    return res


def time_cuda(fn: Callable[[], Any], device=None, **kw) -> Timing:
    """Device time of ``fn()`` with CUDA events, one event pair per call, L2 flushed before each call
    (options: :func:`time_cuda_together`)."""
    return _single(time_cuda_together({"fn": fn}, device, **kw))


def time_host(fn: Callable[[], Any], **kw) -> Timing:
    """Wall time of ``fn()`` with time.perf_counter (options: :func:`time_host_together`)."""
    return _single(time_host_together({"fn": fn}, **kw))


def time_together(fns: Fns, device=None, **kw) -> Dict[str, Outcome]:
    """CUDA events on a CUDA device, the host timer elsewhere (``graph``/``flush`` apply to CUDA only);
    the functions are timed in turn, one call of each per round."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        return time_cuda_together(fns, device, **kw)
    kw.pop("graph", None)
    kw.pop("flush", None)
    return time_host_together(fns, **kw)


def time_fn(fn: Callable[[], Any], device=None, **kw) -> Timing:
    """One function's :func:`time_together`."""
    return _single(time_together({"fn": fn}, device, **kw))


def host_overhead_us(fn: Callable[[], Any], device=None, calls: int = 100, repeats: int = 5) -> float:
    """Wall time per call with no synchronisation inside the loop: what the host spends launching."""
    device = torch.device(device if device is not None else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        sync(device)
    return statistics.median(samples)


# ------------------------------------------------------------------------------------------ bandwidth

def _cache_dir() -> Path:
    return Path(cache_dir())


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"cuda|{p.name}|cc{p.major}.{p.minor}|{p.total_memory}|{getattr(p, 'uuid', '')}"
    return f"cpu|{device_name(device)}|{platform.node()}"


def device_bandwidth(device=None, *, refresh: bool = False) -> float:
    """Bytes/s (read + write) of a large device-to-device copy; measured once per device, cached in
    ``<cache dir>/bandwidth.json``."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    path = _cache_dir() / "bandwidth.json"
    key = _device_key(device)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not refresh and key in known:
        return float(known[key]["bytes_per_s"])
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = int(min(1 << 30, free // 8))
    else:
        nbytes = 1 << 27
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, flush=False, budget_ms=300, min_reps=10)
    bw = 2 * nbytes / (t.median_us * 1e-6)
    known[key] = {"bytes_per_s": bw, "nbytes": nbytes, "median_us": t.median_us, "torch": torch.__version__,
                  "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, path)  # atomic: concurrent measurers never leave a torn file
    return bw


def tensor_bytes(*xs: Any) -> int:
    """Bytes of every tensor in ``xs`` (nested tuples/lists too): the default bytes-moved estimate."""
    total = 0
    for x in xs:
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, (tuple, list)):
            total += tensor_bytes(*x)
    return total


# --------------------------------------------------------------------------------------------- results

COPY = "copy"  # the measured floor contender (bench(copy_floor=True))


@dataclasses.dataclass
class BenchResult:
    name: str
    device: str
    device_name: str
    dtype: str
    timer: str
    bandwidth_bytes_per_s: Optional[float]
    contenders: List[str]
    rows: List[dict] = dataclasses.field(default_factory=list)  # one per (size, contender), floor included
    host_us: Dict[str, float] = dataclasses.field(default_factory=dict)
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def sizes(self) -> List[Tuple[int, ...]]:
        return list(dict.fromkeys(tuple(r["size"]) for r in self.rows))

    def get(self, contender: str, size=None) -> Optional[dict]:
        size = tuple(size) if size is not None else self.sizes[-1]
        return next((r for r in self.rows if r["contender"] == contender and tuple(r["size"]) == size), None)

    def median_us(self, contender: str, size=None) -> Optional[float]:
        row = self.get(contender, size)
        return row["median_us"] if row else None

    def speedup(self, contender: str, baseline: str = "eager", size=None) -> Optional[float]:
        """Ratio of the two medians (see :meth:`paired` for the round-by-round ratio of the first contender)."""
        a, b = self.median_us(contender, size), self.median_us(baseline, size)
        return b / a if a and b else None

    def paired(self, other: str, size=None) -> Optional[Ratio]:
        """How many times faster the first contender is than ``other`` at ``size`` (default: the largest),
        round by round, with its 95% confidence interval; None if either was not timed."""
        row = self.get(other, size)
        if not row or row.get("ratio") is None:
            return None
        return Ratio(row["ratio"], row["ratio_lo"], row["ratio_hi"], row["reps"])

    def headers(self) -> List[str]:
        h = ["size"] + self.contenders + (["floor", f"% bw ({self.contenders[0]})"] if self.bandwidth_bytes_per_s else [])
        return h + [f"{self.contenders[0]} vs {c} (95% CI)" for c in self.contenders[1:]]

    def table_rows(self) -> List[list]:
        out = []
        for size in self.sizes:
            row: List[Any] = [report.fmt_shape(size)]
            for c in self.contenders:
                r = self.get(c, size)
                if r is None or r.get("error"):
                    row.append("error" if r else "-")
                else:
                    row.append(f"{report.fmt_us(r['median_us'])} ({report.fmt_spread(r['p20_us'], r['p80_us'], r['median_us'])})")
            if self.bandwidth_bytes_per_s:
                first = self.get(self.contenders[0], size)
                row += [report.fmt_us(self.median_us("floor", size)),
                        f"{first['pct_bw']:.0f}%" if first and first.get("pct_bw") is not None else "-"]
            for c in self.contenders[1:]:
                r = self.paired(c, size)
                row.append(f"{r.median:.2f}x ({r.lo:.2f}-{r.hi:.2f})" if r else "-")
            out.append(row)
        return out

    def summary(self) -> str:
        bw = f", bandwidth {self.bandwidth_bytes_per_s / 1e9:.0f} GB/s" if self.bandwidth_bytes_per_s else ""
        host = ", host us/call: " + ", ".join(f"{k} {v:.1f}" for k, v in self.host_us.items()) if self.host_us else ""
        return f"bench {self.name} on {self.device_name} [{self.dtype}, {self.timer}{bw}]{host}"

    def __repr__(self) -> str:
        text = self.summary() + "\n" + report.text_table(self.headers(), self.table_rows())
        return text + "".join(f"\nnote: {n}" for n in self.notes)

    def _repr_html_(self) -> str:
        return report.html_table(self.headers(), self.table_rows(), title=self.summary(), details="\n".join(self.notes))

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items()}

    def to_json(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    # ratio/ratio_lo/ratio_hi: this contender's time over the first contender's, round by round (paired_ratio)
    CSV_FIELDS = ("name", "device", "dtype", "size", "numel", "contender", "median_us", "p20_us", "p80_us",
                  "mean_us", "min_us", "reps", "dropped", "timer", "bytes", "gbps", "pct_bw", "ratio", "ratio_lo",
                  "ratio_hi", "error")

    def to_csv(self, path) -> Path:
        return write_csv([self], path)

    def plot(self, out_dir, stem: Optional[str] = None) -> List[Path]:
        """time vs size (all contenders + floor), speedup vs size (vs eager), % of bandwidth vs size."""
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
        series: Dict[str, List[dict]] = {}
        for r in self.rows:
            if r.get("median_us"):
                series.setdefault(r["contender"], []).append({**r, "x": xof(tuple(r["size"]))})
        for points in series.values():
            points.sort(key=lambda p: p["x"])
        title = report.sweep_title(self.name, self.device, self.device_name, self.dtype)
        return report.plot_sweep(series, xlabel, title, out_dir, stem or self.name)


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

Target = Union[None, str, Spec, Callable, Dict[str, Callable], Sequence[Callable]]


def _contenders(target: Target, spec: Optional[Spec]) -> Tuple[Dict[str, Callable], Optional[Spec]]:
    if isinstance(target, str):
        card_spec, target = load_card(target)
        spec = spec or card_spec
    elif isinstance(target, Spec):
        spec, target = target, None
    if target is None:
        if spec is None:
            raise TypeError("bench: give an op (or contenders) or a spec/card name")
        return {"kernelkit": spec.resolve_op()}, spec
    if isinstance(target, dict):
        return dict(target), spec
    if callable(target):
        return {"kernelkit" if spec is not None else getattr(target, "__name__", "op"): target}, spec
    return {getattr(f, "__name__", f"op{i}"): f for i, f in enumerate(target)}, spec


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


def _make_inputs(spec: Spec, inputs) -> Callable[..., tuple]:
    if inputs is None:
        return spec.make_inputs
    if callable(inputs):
        return inputs
    given = tuple(inputs)
    return lambda shape, dtype=None, device=None, generator=None: given  # noqa: ARG005


def bench(target: Target = None, inputs=None, *, spec: Optional[Spec] = None, reference: Optional[Callable] = None,
          sizes: Optional[Sequence[Tuple[int, ...]]] = None, dtype: Optional[torch.dtype] = None, device=None,
          compile: Optional[bool] = None, graph: bool = False, flush_l2: bool = True,
          budget_ms: Optional[float] = None, warmup_ms: Optional[float] = None, host_overhead: bool = True,
          floor: bool = True, copy_floor: bool = False, max_numel: Optional[int] = None, seed: int = 0,
          progress: Optional[Callable[[str], None]] = None) -> BenchResult:
    """Time ``target`` over a size sweep, side by side with the eager reference, ``torch.compile(reference)``
    and the bandwidth floor.

    ``target``: a card name or :class:`Spec` (its op is "kernelkit"), a callable, a dict name -> callable
    or a list of callables. Inputs come from ``inputs`` (a tuple of args, or a
    ``make_inputs(shape, dtype=, device=, generator=)``), else ``spec.make_inputs``, for each of ``sizes``
    (default ``spec.bench_sizes``). ``compile`` defaults to True on CUDA, False on a CPU (Inductor's C++
    build per size is slow there). ``graph=True`` times CUDA-graph replays. ``max_numel`` skips larger
    sizes (noted). Bytes moved come from ``spec.bytes_moved(args, out)``, else all tensor args + outputs.
    ``copy_floor=True`` adds a measured floor, the contender "copy": a device copy moving the same bytes
    (half read, half written), timed in the same rounds. At sizes where launch and memory latency rule,
    bytes/bandwidth says nothing; a copy shows what any kernel moving those bytes takes.
    """
    contenders, spec = _contenders(target, spec)
    reference = reference if reference is not None else spec.reference if spec is not None else None
    device = torch.device(device if device is not None else
                          "cuda" if torch.cuda.is_available() and (spec is None or "cuda" in spec.devices) else "cpu")
    on_gpu = device.type == "cuda"
    dtype = dtype or (spec.bench_dtype if spec is not None else torch.float32)
    if reference is not None and "eager" not in contenders:
        contenders["eager"] = reference
    if compile is None:
        compile = on_gpu
    if compile and reference is not None and "torch.compile" not in contenders:
        contenders["torch.compile"] = torch.compile(reference, dynamic=False)
    if spec is None and inputs is None:
        raise TypeError("bench: give inputs= (a tuple of args or a make_inputs callable) or a spec")
    make = _make_inputs(spec, inputs)
    if inputs is not None and not callable(inputs):
        first = next((a for a in inputs if isinstance(a, torch.Tensor)), None)
        sizes = [tuple(first.shape) if first is not None else ()]
    sizes = [tuple(s) for s in (sizes if sizes is not None else spec.bench_sizes if spec is not None else [])]
    if not sizes:
        raise TypeError("bench: no sizes (give sizes=, inputs=, or a spec with bench_sizes)")
    name = spec.name if spec is not None else next(iter(contenders))
    timer = ("cuda-graph" if graph else "cuda-events") if on_gpu else "host"
    bw = device_bandwidth(device) if floor else None
    result = BenchResult(name, str(device), device_name(device), str(dtype).replace("torch.", ""), timer, bw,
                         list(contenders) + ([COPY] if copy_floor else []))
    if graph and not on_gpu:
        result.notes.append("graph mode needs CUDA: host timer used")
    if not on_gpu:
        result.notes.append("host timer (time.perf_counter): CPU wall time, no cache flush; % bw is against a "
                            "DRAM copy, so cache-resident sizes can exceed 100%")
    timing_kw = dict(budget_ms=budget_ms or (100.0 if on_gpu else 50.0), warmup_ms=warmup_ms or (25.0 if on_gpu else 10.0))
    if on_gpu:
        timing_kw.update(flush=flush_l2, graph=graph)
    bytes_moved = spec.bytes_moved if spec is not None and spec.bytes_moved is not None else \
        (lambda args, out: tensor_bytes(args, out))
    with _many_recompiles():
        for size in sizes:
            if max_numel is not None and math.prod(size) > max_numel:
                result.notes.append(f"size {report.fmt_shape(size)} skipped (over {max_numel} elements)")
                continue
            args = tuple(make(size, dtype=dtype, device=device, generator=torch.Generator(device=device).manual_seed(seed)))
            _bench_size(result, contenders, args, size, bytes_moved, bw, timing_kw, progress, copy_floor)
    if host_overhead:
        _host_overheads(result, contenders, make, spec, dtype, device, seed)
    return result


def _copy_contender(nbytes: int, device: torch.device) -> Callable:
    """A device copy that moves ``nbytes`` in all: half read, half written (torch copies contiguous bytes
    with cudaMemcpyAsync on a GPU, memcpy on a CPU)."""
    src = torch.ones(max(1, nbytes // 2), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _bench_size(result: BenchResult, contenders: Dict[str, Callable], args: tuple, size, bytes_moved, bw,
                timing_kw: dict, progress, copy_floor: bool = False) -> None:
    """Time every contender on one size's inputs, side by side (one call of each in turn); add the floor."""
    moved = None
    rows = {cname: {"size": list(size), "numel": math.prod(size), "contender": cname}
            for cname in list(contenders) + ([COPY] if copy_floor else [])}
    ready = {}
    for cname, fn in contenders.items():
        if moved is None:  # the bytes moved, from the first output there is; time_together makes the
            try:           # other first calls (compiles, loads) and reports their errors
                out = fn(*args)
                moved = int(bytes_moved(args, out))
                del out
            except Exception as e:  # noqa: BLE001 - one contender failing must not lose the others
                rows[cname]["error"] = e
                continue
        ready[cname] = lambda fn=fn: fn(*args)
    if copy_floor:
        if moved is None:
            rows[COPY]["error"] = RuntimeError("no contender ran, so the bytes to copy are unknown")
        else:
            ready[COPY] = _copy_contender(moved, torch.device(result.device))
    samples: Dict[str, List[float]] = {}
    for cname, outcome in time_together(ready, result.device, **timing_kw).items():
        if isinstance(outcome, Exception):
            rows[cname]["error"] = outcome
        else:
            rows[cname].update(outcome.summary())
            samples[cname] = outcome.samples_us
    first = next(iter(contenders))
    for cname, other in samples.items():  # the op under test against each other contender, round by round
        if cname != first and first in samples and len(other) == len(samples[first]):
            ratio = paired_ratio(samples[first], other)
            rows[cname].update(ratio=ratio.median, ratio_lo=ratio.lo, ratio_hi=ratio.hi)
    for cname, row in rows.items():
        if "error" in row:
            e = row["error"]
            row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            result.notes.append(f"{cname} at {report.fmt_shape(size)}: {row['error']}")
        if progress:
            progress(f"{result.name} {report.fmt_shape(size)} {cname}: {report.fmt_us(row.get('median_us'))}")
    rows = list(rows.values())
    if moved is not None:
        for row in rows:
            row["bytes"] = moved
            if row.get("median_us"):
                row["gbps"] = moved / row["median_us"] / 1e3
                row["pct_bw"] = 100.0 * moved / (row["median_us"] * 1e-6) / bw if bw else None
        if bw:
            rows.append({"size": list(size), "numel": math.prod(size), "contender": "floor", "bytes": moved,
                         "median_us": moved / bw * 1e6, "timer": "bytes/bandwidth", "pct_bw": 100.0})
    result.rows += rows


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
