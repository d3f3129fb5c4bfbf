"""Timers: how long one call of each of several functions takes, the functions timed side by side.

GPU timing follows triton.testing.do_bench: CUDA events around each call, a 256 MB write between calls to
flush L2, warm-up, and a repeat count chosen to fill a time budget; median and p20/p80 are reported.
The functions are timed in rounds, one call of each per round in a random order (reversed in the round
after), so a slow spell, or a device state that lasts a few milliseconds (small kernels' times jump by
~0.5 us between such states), lands on all of them alike and no function keeps a place in the round.
A function whose host side outlasts the flush (torch.compile on a slow host CPU) gets a GPU spin queued
ahead of each timed call, so its device time is not inflated by its launch time. After every timed call
the timer asks whether the device had already reached the call's start event (it then waited for the
launch inside the timed span: a host stall); such a round is left out, and the late function's spin
lengthened. Optional CUDA-graph mode replays a captured call (no launch overhead). On a CPU the same
rounds run with a host timer (time.perf_counter).

Because each round times every function once, two of them can be compared round by round: the median of
the per-round time ratios, with a distribution-free 95% confidence interval (:func:`paired_ratio`). A
state of the device that lasts milliseconds moves both calls of a round alike, so the paired ratio
resolves differences far below one function's own spread; an interval that contains 1 is a tie.
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

L2_FLUSH_BYTES = 256 << 20
MAX_SPIN_US = 20_000.0  # a call whose host side takes longer than this is host-bound: timed as it comes
HOST_BATCH_S = 20e-6  # host-timed calls shorter than this are timed in batches
MAX_RATIO_SPREAD = 1.5  # a paired ratio whose 95% interval spans more than this factor says nothing

_FLUSH: Dict[torch.device, torch.Tensor] = {}
_FLUSH_US: Dict[torch.device, float] = {}
_SPIN_CYCLES_PER_US: Dict[torch.device, float] = {}


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
    """``median`` of per-round ratios of two functions' times with its 95% confidence interval
    [``lo``, ``hi``] over ``rounds`` rounds; ``caveat``: why the ratio means nothing ("" if it stands)."""
    median: float
    lo: float
    hi: float
    rounds: int
    caveat: str = ""

    @property
    def verdict(self) -> str:
        """"faster" / "slower" when the interval excludes 1, else "tie" (ratio = other's time / ours);
        "unreliable" when it has a caveat."""
        if self.caveat:
            return "unreliable"
        return "faster" if self.lo > 1.0 else "slower" if self.hi < 1.0 else "tie"

    def judged(self, busy: Optional[str] = None) -> "Ratio":
        """This ratio with its caveat: ``busy`` (the machine's, :meth:`.machine.Load.busy`), else an interval
        wider than ``MAX_RATIO_SPREAD`` (a ratio that a rerun could find anywhere in it)."""
        wide = self.lo <= 0 or self.hi / self.lo > MAX_RATIO_SPREAD
        spread = f"spread: its 95% interval is {self.lo:.2f}-{self.hi:.2f}x" if wide else ""
        return dataclasses.replace(self, caveat=busy or spread)

    def __str__(self) -> str:
        text = f"{self.median:.3f}x [{self.lo:.3f}, {self.hi:.3f}]"
        return f"{text}, unreliable: {self.caveat}" if self.caveat else text


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


# ------------------------------------------------------------------------------------------ the rounds

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


def _repeats(est_s: float, budget_ms: float, min_reps: int, max_reps: int) -> int:
    return int(min(max_reps, max(min_reps, budget_ms * 1e-3 / max(est_s, 1e-9))))


def _single(outcomes: Dict[str, Outcome]) -> Timing:
    (res,) = outcomes.values()
    if isinstance(res, Exception):
        raise res
    return res


# ---------------------------------------------------------------------------------------- CUDA helpers

def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device not in _FLUSH:
        _FLUSH[device] = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    return _FLUSH[device]


def _event_us(fn: Callable[[], Any]) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3


def spin_cycles_per_us(device: torch.device) -> float:
    """Clock cycles per microsecond of torch.cuda._sleep's spin, measured once per device."""
    if device not in _SPIN_CYCLES_PER_US:
        torch.cuda._sleep(1000)
        _SPIN_CYCLES_PER_US[device] = 1e6 / _event_us(lambda: torch.cuda._sleep(1_000_000))
    return _SPIN_CYCLES_PER_US[device]


def _spin_us(host_us: float, lead_us: float) -> float:
    """GPU spin (us) to enqueue ahead of a timed call whose host side (flush, spin and event launches, the
    call itself) takes ``host_us``, so the device is still busy when the host has queued the call: with
    ``lead_us`` of device work ahead (the flush) the call is then not charged for its host time, which
    ``host_us`` reports apart. 0 if none is needed."""
    need_us = min(1.5 * host_us + 10.0 - lead_us, MAX_SPIN_US)
    return need_us if need_us > 0 and hasattr(torch.cuda, "_sleep") else 0.0


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


class _EventTimer:
    """The state of one :func:`time_cuda_together`: per function its cost estimate, the spin queued ahead
    of its calls and its (start, end) events per round; and the rounds in which some launch came late."""

    def __init__(self, device: torch.device, flush: bool):
        self.device = device
        self.flush = _flush_buffer(device) if flush else None
        self.lead_us = self._flush_us() if flush else 0.0  # device work queued ahead of each timed call
        self.est_s: Dict[str, float] = {}
        self.spin_us: Dict[str, float] = {}
        self.events: Dict[str, list] = {}
        self.late: set = set()

    def _flush_us(self) -> float:
        if self.device not in _FLUSH_US:
            self.flush.zero_()
            _FLUSH_US[self.device] = min(_event_us(self.flush.zero_) for _ in range(3))
        return _FLUSH_US[self.device]

    def prepare(self, name: str, fn: Callable[[], Any], warmup_ms: float) -> None:
        """Estimate the cost of a flushed call (as do_bench does), warm up, then learn the host time of a
        whole timed call from three dry runs on an idle device."""
        def five_flushed():
            for _ in range(5):
                if self.flush is not None:
                    self.flush.zero_()
                fn()

        self.est_s[name] = _event_us(five_flushed) / 5 * 1e-6
        for _ in range(max(1, int(warmup_ms * 1e-3 / max(self.est_s[name], 1e-9)))):
            fn()
        self.spin_us[name], self.events[name] = 0.0, []
        for _ in range(3):
            torch.cuda.synchronize()
            self.timed_call(name, fn, -1)
        torch.cuda.synchronize()

    def timed_call(self, name: str, fn: Callable[[], Any], r: int) -> None:
        """One call between CUDA events, in round ``r`` (< 0: a dry run, not kept), behind the flush and
        this function's spin."""
        t0 = time.perf_counter()
        if self.flush is not None:
            self.flush.zero_()  # device busy flushing while the host queues the timed call: no launch gap timed
        if self.spin_us[name]:
            torch.cuda._sleep(int(self.spin_us[name] * spin_cycles_per_us(self.device)))
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        # Late: the device reached the start event before the call was queued, so it waited for the host
        # inside the timed span (a slow host, a stall). Not late while the device is behind.
        late = s.query()
        host_us = (time.perf_counter() - t0) * 1e6
        e.record()
        if r >= 0:
            self.events[name].append((s, e))
        if late or r < 0:  # the device was idle: host_us is the host's own time
            self.spin_us[name] = max(self.spin_us[name], _spin_us(host_us, self.lead_us))
            if r >= 0:
                self.late.add(r)  # this round is left out

    def timings(self, names: Sequence[str], timer: str) -> Dict[str, Timing]:
        """A Timing per function of ``names`` over the rounds in which no launch came late (all rounds when
        that would leave fewer than a quarter of them: a host always late)."""
        rounds = min((len(self.events[n]) for n in names), default=0)
        keep = [r for r in range(rounds) if r not in self.late]
        if len(keep) < max(3, rounds // 4):
            keep = list(range(rounds))
        return {n: Timing.from_samples([self.events[n][r][0].elapsed_time(self.events[n][r][1]) * 1e3
                                        for r in keep], timer, rounds - len(keep))
                for n in names}


# -------------------------------------------------------------------------------------------- timers

def time_cuda_together(fns: Fns, device=None, *, budget_ms: float = 100.0, warmup_ms: float = 25.0,
                       flush: bool = True, graph: bool = False, min_reps: int = 10,
                       max_reps: int = 10000) -> Dict[str, Outcome]:
    """Device time of each function with CUDA events, one event pair per call, L2 flushed before each
    call, the functions called in turn (one call of each per round): a slow spell of the device, or a
    state that lasts a few milliseconds, lands on all of them alike. A function whose host side takes
    longer than the flush gets a GPU spin queued ahead of its timed calls, so what is timed is device
    time, not the host's launch time; a round in which a launch still came late is left out (counted in
    ``Timing.dropped``) unless that would leave fewer than a quarter of them. ``budget_ms`` is per
    function. Returns a Timing per function, or the exception it raised."""
    device = torch.device(device if device is not None else "cuda")
    with torch.cuda.device(device):
        fns, failed = _first_calls(fns, torch.cuda.synchronize)
        if graph:
            fns = _capture_each(fns, device, failed)
        timer = _EventTimer(device, flush)
        for name, fn in fns.items():
            try:
                timer.prepare(name, fn, warmup_ms)
            except Exception as e:  # noqa: BLE001
                failed[name] = e
        fns = {n: fn for n, fn in fns.items() if n not in failed}
        if fns:
            reps = _repeats(statistics.fmean(timer.est_s[n] for n in fns), budget_ms, min_reps, max_reps)
            _round_robin(fns, reps, timer.timed_call, failed)
        torch.cuda.synchronize()
    out: Dict[str, Outcome] = dict(timer.timings([n for n in fns if n not in failed],
                                                 "cuda-graph" if graph else "cuda-events"))
    out.update(failed)
    return out


def _capture_each(fns: Fns, device: torch.device, failed: Dict[str, Outcome]) -> Fns:
    """Each function replaced by the replay of its captured CUDA graph; one that cannot be captured is
    reported like any failure."""
    replays: Fns = {}
    for name, fn in fns.items():
        try:
            replays[name] = _graphed(fn, device)
        except Exception as e:  # noqa: BLE001
            failed[name] = e
    return replays


def time_host_together(fns: Fns, *, budget_ms: float = 50.0, warmup_ms: float = 10.0, min_reps: int = 5,
                       max_reps: int = 10000) -> Dict[str, Outcome]:
    """Wall time of each function with time.perf_counter, the functions called in turn; calls shorter
    than ~20 us are timed in batches. ``budget_ms`` is per function."""
    fns, failed = _first_calls(fns, lambda: None)
    batch: Dict[str, int] = {}  # calls per sample
    est_batch_s: List[float] = []
    for name, fn in fns.items():
        try:
            est_s = _host_estimate_s(fn, warmup_ms)
        except Exception as e:  # noqa: BLE001
            failed[name] = e
            continue
        batch[name] = max(1, int(HOST_BATCH_S / max(est_s, 1e-9)))
        est_batch_s.append(est_s * batch[name])
    fns = {n: fn for n, fn in fns.items() if n in batch}
    samples: Dict[str, List[float]] = {name: [] for name in fns}

    def one_sample(name: str, fn: Callable[[], Any], r: int) -> None:  # noqa: ARG001 - rounds all kept
        t0 = time.perf_counter()
        for _ in range(batch[name]):
            fn()
        samples[name].append((time.perf_counter() - t0) / batch[name] * 1e6)

    if fns:
        _round_robin(fns, _repeats(statistics.fmean(est_batch_s), budget_ms, min_reps, max_reps), one_sample, failed)
    out: Dict[str, Outcome] = {n: Timing.from_samples(v, "host") for n, v in samples.items() if n not in failed}
    out.update(failed)
    return out


def _host_estimate_s(fn: Callable[[], Any], warmup_ms: float) -> float:
    """Seconds per call from three calls, then ``warmup_ms`` of warm-up."""
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    est_s = (time.perf_counter() - t0) / 3
    deadline = time.perf_counter() + warmup_ms * 1e-3
    while time.perf_counter() < deadline:
        fn()
    return est_s


def time_together(fns: Fns, device=None, **kw) -> Dict[str, Outcome]:
    """CUDA events on a CUDA device, the host timer elsewhere (``graph``/``flush`` apply to CUDA only);
    the functions are timed in turn, one call of each per round."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        return time_cuda_together(fns, device, **kw)
    kw.pop("graph", None)
    kw.pop("flush", None)
    return time_host_together(fns, **kw)


def time_cuda(fn: Callable[[], Any], device=None, **kw) -> Timing:
    """Device time of ``fn()`` with CUDA events, one event pair per call, L2 flushed before each call
    (options: :func:`time_cuda_together`)."""
    return _single(time_cuda_together({"fn": fn}, device, **kw))


def time_host(fn: Callable[[], Any], **kw) -> Timing:
    """Wall time of ``fn()`` with time.perf_counter (options: :func:`time_host_together`)."""
    return _single(time_host_together({"fn": fn}, **kw))


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
