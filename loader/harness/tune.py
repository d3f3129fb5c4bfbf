"""kernelkit.autotune: the fastest *correct* configuration of a kernel, chosen once per device and shape bucket.

A configuration is one value per named parameter of a space (block size, tile, items per thread, ...).
``make(config)`` turns it into a callable op: an NVRTC compile with the values as defines or template
arguments and a launch, a card's device TU built with ``-D`` flags, or plain Python. Every configuration is
built (in threads: NVRTC and nvcc release the GIL), checked against the reference with :func:`check` (odd
sizes included), and only the ones that pass are timed, side by side in rounds (``time_together``): a
configuration that is fast because it is wrong is listed with its failure and never chosen. A short first
run prunes the ones whose fastest round is slower than the best median by more than ``prune_margin``; where
more than a few are left, a second short run prunes those surely slower than its best (a paired ratio whose 95%
interval lies above 1); the rest are timed with the full budget, and the winner's margin over each is a paired
ratio with its interval.

The winner is stored in the cache under a key of the op's name, its source's content, the device (name and
compute capability), the dtype and the shape bucket (default: the power of two at or above the leading size),
so the next process on that device takes it with no building, checking or timing.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..jit import cache, keys, registry
from .bandwidth import device_name
from .check import CaseMemo, check
from .spec import Spec
from .timing import Outcome, Ratio, Timing, paired_ratio, time_together

Config = Dict[str, Any]
#: rounds per configuration at most: a round costs ~50 us of host time, so a budget of device time alone would
#: let a 5 us kernel's 16 configurations take 20 s; 1000 paired rounds put a ratio's interval well under 1%
_MAX_ROUNDS = 1000
#: configurations timed with the whole budget at most before a second short run narrows them (tens of near-equal
#: ones would each take the whole budget)
_FINALISTS = 4
#: a timer: ``timer(fns, budget_ms)`` -> name -> Timing or the exception a call raised
Timer = Callable[[Dict[str, Callable[[], Any]], float], Dict[str, Outcome]]


@dataclasses.dataclass
class Candidate:
    config: Config
    status: str  # "best", "ok", "pruned", "wrong", "failed"
    reason: str = ""  # why it is wrong, failed or pruned
    timing: Optional[Timing] = None
    vs_best: Optional[Ratio] = None  # its time / the best's, round by round

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.items())


@dataclasses.dataclass
class TuneResult:
    name: str
    device: str
    dtype: str
    bucket: Any
    best: Config
    candidates: List[Candidate]
    from_cache: bool = False
    elapsed_s: float = 0.0
    #: seconds per phase of a tuning: "build", "check", "time"
    phases: Dict[str, float] = dataclasses.field(default_factory=dict)

    def table(self) -> str:
        """One row per configuration: status, median time with its p20-p80 spread, how much slower than the best."""
        rows = [f"autotune {self.name} on {self.device}, {self.dtype}, bucket {self.bucket}: best "
                f"{_label(self.best)}" + (" (stored earlier: nothing built or timed)" if self.from_cache else
                                           f" ({self.elapsed_s:.1f} s{_phases(self.phases)})")]
        for c in self.candidates:
            t = f"{c.timing.median_us:9.2f} us [{c.timing.p20_us:.2f}, {c.timing.p80_us:.2f}]" if c.timing else " " * 30
            vs = f"  {c.vs_best.median:.3f}x [{c.vs_best.lo:.3f}, {c.vs_best.hi:.3f}]" if c.vs_best else ""
            rows.append(f"  {c.status:7s} {c.label:40s} {t}{vs}" + (f"  {c.reason}" if c.reason else ""))
        return "\n".join(rows)

    def plot(self, path=None):
        """Every configuration's median time as a bar with its p20-p80 spread (matplotlib Figure; also written as
        PNG to ``path`` when given), fastest first, coloured by status; wrong and failed ones, never timed, are
        named under the bars."""
        from matplotlib.figure import Figure

        timed = sorted((c for c in self.candidates if c.timing is not None), key=lambda c: c.timing.median_us)
        untimed = [c for c in self.candidates if c.timing is None and c.status in ("wrong", "failed")]
        fig = Figure(figsize=(7, 1.2 + 0.22 * max(1, len(timed))))
        ax = fig.add_subplot()
        colours = {"best": "tab:green", "ok": "tab:blue", "pruned": "tab:gray"}
        ys = range(len(timed))
        medians = [c.timing.median_us for c in timed]
        spread = [[m - c.timing.p20_us for m, c in zip(medians, timed)], [c.timing.p80_us - m for m, c in zip(medians, timed)]]
        ax.barh(list(ys), medians, xerr=spread, color=[colours.get(c.status, "tab:blue") for c in timed], capsize=2)
        ax.set_yticks(list(ys), [f"{c.label} ({c.status})" for c in timed], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("median time per call (us), p20-p80")
        title = f"autotune {self.name} on {self.device}, {self.dtype}, bucket {self.bucket}"
        if untimed:
            title += "\nnot timed: " + "; ".join(f"{c.label} ({c.status})" for c in untimed[:4]) + (
                f"; {len(untimed) - 4} more" if len(untimed) > 4 else "")
        ax.set_title(title, fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
        return fig


def _phases(phases: Dict[str, float]) -> str:
    return ": " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()) if phases else ""


def _label(config: Config) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def configurations(space: Mapping[str, Sequence[Any]], constraint: Optional[Callable[[Config], bool]] = None
                   ) -> List[Config]:
    """Every combination of the space's values (in the order given) that ``constraint`` accepts."""
    if not isinstance(space, Mapping) or not space:
        raise ValueError(f"autotune: space: expected a non-empty dict of parameter -> values, got {space!r}")
    for name, values in space.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"autotune: space[{name!r}]: expected a non-empty list of values, got {values!r}")
    names = list(space)
    configs = [dict(zip(names, combo)) for combo in itertools.product(*(space[n] for n in names))]
    kept = [c for c in configs if constraint is None or constraint(c)]
    if not kept:
        raise ValueError(f"autotune: the constraint rejects all {len(configs)} configurations of the space")
    return kept


def shape_bucket(shape: Sequence[int]) -> int:
    """The default bucket: the power of two at or above the leading size (1 for a scalar or empty shape)."""
    lead = int(shape[0]) if len(shape) else 1
    return 1 << max(0, math.ceil(math.log2(lead))) if lead > 1 else 1


def autotune(make: Union[Callable[[Config], Callable[..., Any]], str, Spec],
             space: Optional[Mapping[str, Sequence[Any]]] = None, *,
             reference: Optional[Callable[..., Any]] = None, inputs: Optional[Callable[..., tuple]] = None,
             shape: Optional[Sequence[int]] = None, name: Optional[str] = None, source: str = "",
             kernels_dir=None, constraint: Optional[Callable[[Config], bool]] = None,
             check_shapes: Optional[Sequence[Sequence[int]]] = None, dtype: Optional[torch.dtype] = None,
             device=None, bucket: Optional[Callable[[Sequence[int]], Any]] = None, trials: int = 2,
             rtol: Optional[float] = None, atol: Optional[float] = None, noncontiguous: Optional[bool] = None,
             budget_ms: Optional[float] = None,
             prune_margin: float = 0.5, workers: Optional[int] = None, retune: bool = False, store: bool = True,
             timer: Optional[Timer] = None) -> TuneResult:
    """The fastest configuration of ``space`` whose op (``make(config)``) gives the reference's results.

    ``make`` may be a card (its name, found in ``kernels_dir``, or its Spec): each configuration then builds
    the card with ``-D<name>=<value>`` for its .cu files only (in threads: nvcc processes on every core; the
    binding is built once), and the space (default ``Spec.tune``), reference, inputs, shape (default the
    largest of ``bench_sizes``), dtype (``bench_dtype``) and source key come from the card; after the call
    ``kernelkit.ops.<card>`` runs, per call, the build stored for the call's bucket (:class:`_CardRoutes`).

    ``inputs(shape, dtype=, device=, generator=)`` makes an argument tuple (as for :func:`check`); the op is
    checked on ``check_shapes`` (default: ``shape`` and two odd sizes below it), with strided inputs too unless
    ``noncontiguous=False`` (an op over raw pointers that refuses them), and timed on ``shape``.
    ``source``: what the op is built from (its text, a card's content key): a stored winner is used only for
    the same ``name``, ``source``, device, dtype and bucket, and only while it is still in the space;
    ``retune=True`` tunes again. A space in which no configuration passes is a ValueError listing why each
    failed. ``timer`` replaces the harness's (tests)."""
    t0 = time.perf_counter()
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    prebuild = None
    if isinstance(make, (str, Spec)):
        card = _Card(make, kernels_dir)
        make, prebuild, name, source = card.make, card.prebuild, card.spec.name, card.source
        space, reference, inputs, shape, dtype = card.defaults(space, reference, inputs, shape, dtype)
    _required(make, reference, inputs, shape, name)
    dtype = dtype or torch.float32
    configs = configurations(space, constraint)
    key, bucket_of = _record_key(name, source, device, dtype, shape, bucket)
    label = device_name(device)
    stored = None if retune else cache.tune_record(key)
    if stored is not None and stored.get("best") in configs:
        result = TuneResult(name, label, str(dtype), bucket_of, stored["best"],
                            [Candidate(stored["best"], "best", "stored earlier")], from_cache=True)
    else:
        phases: Dict[str, float] = {}
        check_kw = dict(trials=trials, rtol=rtol, atol=atol, noncontiguous=noncontiguous)
        candidates = _checked(make, configs, reference, inputs, check_shapes or _odd_shapes(shape), dtype, device,
                              check_kw, workers, prebuild, phases)
        args = tuple(inputs(tuple(shape), dtype=dtype, device=device,
                            generator=torch.Generator(device=device).manual_seed(0)))
        best = _timed_winner(name, candidates, args, timer, budget_ms, device, prune_margin, phases)
        if store:
            _store_winner(key, name, label, dtype, bucket_of, best)
        result = TuneResult(name, label, str(dtype), bucket_of, best.config, [c for c, _ in candidates],
                            elapsed_s=time.perf_counter() - t0, phases=phases)
    if prebuild is not None:  # a card: the winner's build becomes its current one, so kernelkit.ops.<card> runs it
        make(result.best)
        registry.route(name, _CardRoutes(card, space, bucket))
    return result


def _store_winner(key: str, name: str, device: str, dtype: torch.dtype, bucket: Any, best: Candidate) -> None:
    cache.store_tune_record(key, {"name": name, "device": device, "dtype": str(dtype), "bucket": repr(bucket),
                                  "best": best.config, "median_us": best.timing.median_us, "created": time.time()})


def _timed_winner(name: str, candidates, args: tuple, timer: Optional[Timer], budget_ms: Optional[float],
                  device: torch.device, prune_margin: float, phases: Dict[str, float]) -> Candidate:
    fns = {i: op for i, (c, op) in enumerate(candidates) if op is not None}
    if not fns:
        raise ValueError(f"autotune {name}: no configuration passed its check:\n" +
                         "\n".join(f"  {c.label}: {c.status}: {c.reason}" for c, _ in candidates))
    t0 = time.perf_counter()
    timer = timer or (lambda f, ms: time_together(f, device, budget_ms=ms, warmup_ms=min(25.0, ms / 4),
                                                  max_reps=_MAX_ROUNDS))
    _time(candidates, fns, args, timer, budget_ms or (200.0 if device.type == "cuda" else 100.0), prune_margin)
    phases["time"] = time.perf_counter() - t0
    return _winner(name, [c for c, _ in candidates])


def _record_key(name: str, source: str, device: torch.device, dtype, shape: Sequence[int],
                bucket: Optional[Callable[[Sequence[int]], Any]]) -> Tuple[str, Any]:
    """The cache key of a winner (name, source, device identity, dtype, bucket) and the bucket of ``shape``."""
    bucket_of = (bucket or shape_bucket)(tuple(shape))
    return keys.tune_key(name, source, _device_identity(device), str(dtype), repr(bucket_of)), bucket_of


def _winner(name: str, candidates: List[Candidate]) -> Candidate:
    """The timed configuration with the lowest median; each other one's paired ratio to it."""
    timed = [c for c in candidates if c.status == "ok" and c.timing is not None]
    if not timed:
        raise ValueError(f"autotune {name}: every configuration that passed its check failed to time:\n" +
                         "\n".join(f"  {c.label}: {c.status}: {c.reason}" for c in candidates))
    best = min(timed, key=lambda c: c.timing.median_us)
    best.status = "best"
    for c in timed:
        if c is not best and c.timing.samples_us and best.timing.samples_us:
            c.vs_best = paired_ratio(best.timing.samples_us, c.timing.samples_us)
    return best


class _Card:
    """A card as a space of builds: a configuration's values become -D flags of its .cu files."""

    def __init__(self, card: Union[str, Spec], kernels_dir):
        from ..jit import cards, sources

        found = cards.find(card if isinstance(card, str) else card.name, kernels_dir)
        self.spec, self.kernels_dir = found.spec, kernels_dir
        files = [*found.sources(), *filter(None, [found.header(), found.spec_path])]
        self.source = sources.sha256_bytes(*(f.read_bytes() for f in sorted(files)))

    def defaults(self, space, reference, inputs, shape, dtype) -> tuple:
        """What autotune was not given, from the spec: its tune space, reference, inputs, largest bench size, dtype."""
        spec = self.spec
        if not (space or spec.tune):
            raise ValueError(f"autotune {spec.name}: space: the card's Spec names no tune={{...}} parameters "
                             "(e.g. tune={'BLOCK': [128, 256, 512]}) and none was given")
        return (space or spec.tune, reference or spec.reference, inputs or spec.make_inputs,
                shape or max(spec.bench_sizes, key=math.prod), dtype or spec.bench_dtype)

    def _load(self, config: Config, load: bool, make_current: bool = True):
        from ..loading import cards

        args = dict(kernels_dir=self.kernels_dir, extra_cuda_cflags=[f"-D{k}={v}" for k, v in config.items()],
                    load=load)
        return cards.load(self.spec.name, args, make_current)

    def prebuild(self, config: Config) -> None:
        self._load(config, load=False)

    def make(self, config: Config) -> Callable[..., Any]:
        """The build's own op (each build registers under its own namespace; ``kernelkit.ops`` follows the
        newest load, so autotune loads the winner's build last)."""
        return getattr(self._load(config, load=True), self.spec.name)


_UNSEEN = object()


class _CardRoutes:
    """``kernelkit.ops.<card>`` after ``kernelkit.autotune("<card>")``: in eager mode a call runs the winner stored
    for its first tensor's device, dtype and shape bucket (that configuration's build, loaded from the cache on
    the bucket's first call, without becoming the card's current build), and the current build where the bucket
    has none or the card was edited since; under torch.compile the current build runs."""

    def __init__(self, card: _Card, space: Mapping[str, Sequence[Any]], bucket):
        self.card, self.space, self.bucket = card, space, bucket or shape_bucket
        self.source = card.source
        self.picked: Dict[tuple, Optional[Dict[str, object]]] = {}  # (device, dtype, bucket) -> eager callables
        self.seen: Dict[tuple, Optional[Dict[str, object]]] = {}  # (shape, dtype, device): the same, one lookup
        self.binding = 0  # counts (re)bindings: a pick made under an earlier one is not kept
        # held for bookkeeping only, never while loading: a rebinding comes with the registry's lock held, and
        # a load takes that lock
        self.lock = threading.Lock()

    def __call__(self, fast: Dict[str, object]) -> Dict[str, object]:
        """A (re)binding of the card: after an edit the old winners do not apply; after the fast call path
        loaded, the buckets' callables are made again with it."""
        source = _Card(self.card.spec.name, self.card.kernels_dir).source
        with self.lock:
            self.source, self.picked, self.seen, self.binding = source, {}, {}, self.binding + 1
        return {name: self._routed(name, fn) for name, fn in fast.items()}

    def _routed(self, op: str, default):
        def call(*args, **kwargs):
            for x in args:
                if isinstance(x, torch.Tensor):
                    fns = self.seen.get((x.shape, x.dtype, x.device), _UNSEEN)
                    if fns is _UNSEEN:
                        fns = self._pick(x)
                    if fns:
                        return fns.get(op, default)(*args, **kwargs)
                    break
            return default(*args, **kwargs)

        call.__name__ = call.__qualname__ = op
        return call

    def _pick(self, x: torch.Tensor) -> Optional[Dict[str, object]]:
        key = (x.device, x.dtype, self.bucket(tuple(x.shape)))
        with self.lock:
            binding, source, fns = self.binding, self.source, self.picked.get(key, _UNSEEN)
        if fns is _UNSEEN:
            best = stored(self.card.spec.name, source, tuple(x.shape), x.dtype, x.device, self.bucket)
            fns = None
            if best is not None and best in configurations(self.space):
                lib = self.card._load(best, load=True, make_current=False)  # serves this bucket's calls only
                fns = registry.eager(registry.overloads(lib))
        with self.lock:
            if binding == self.binding:  # else a rebinding came meanwhile: the next call picks again
                self.picked[key] = fns
                if len(self.seen) >= 4096:  # shapes without end (a growing sequence length): start over
                    self.seen = {}
                self.seen[(x.shape, x.dtype, x.device)] = fns
        return fns


def _device_identity(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"cuda|{p.name}|sm_{p.major}{p.minor}"
    return f"cpu|{device_name(device)}"


def _odd_shapes(shape: Sequence[int]) -> List[Tuple[int, ...]]:
    """The timed shape and two odd leading sizes below it: a tail that a configuration skips shows there."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        return [shape]
    odd = {max(1, shape[0] - 1) | 1, max(1, shape[0] // 3) | 1}
    return [shape, *sorted((o, *shape[1:]) for o in odd if o != shape[0])]


def _required(make, reference, inputs, shape, name) -> None:
    for what, value, expected in (("make", make, callable), ("reference", reference, callable),
                                  ("inputs", inputs, callable)):
        if not expected(value):
            raise TypeError(f"autotune: {what}: expected a callable, got {value!r}")
    if shape is None or not isinstance(name, str) or not name:
        raise TypeError("autotune: give shape= (the size to time) and name= (what the winner is stored under)")


def _built(fn, config) -> Tuple[Any, Optional[str]]:
    try:
        return fn(dict(config)), None
    except Exception as e:  # noqa: BLE001 - a configuration that does not build is reported, not raised
        return None, f"build: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _checked(make, configs, reference, inputs, shapes, dtype, device, check_kw: Dict[str, Any], workers,
             prebuild=None, phases: Optional[Dict[str, float]] = None) -> List[Tuple[Candidate, Optional[Callable[..., Any]]]]:
    """(candidate, op or None): every configuration built in threads (``prebuild`` there and ``make`` here,
    where loading must be serial), then checked in turn (one device); the seconds of each go to ``phases``."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers or min(len(configs), os.cpu_count() or 1)) as pool:
        built = list(pool.map(lambda c: _built(prebuild or make, c), configs))
    if prebuild is not None:
        built = [(None, error) if error else _built(make, c) for c, (_, error) in zip(configs, built)]
    t1 = time.perf_counter()
    out, memo = [], CaseMemo()  # every configuration sees the same inputs: draw them and the reference once
    for config, (op, error) in zip(configs, built):
        candidate = Candidate(dict(config), "failed" if error else "ok", error or "")
        if op is not None:
            try:
                result = check(op, reference, inputs=inputs, shapes=[tuple(s) for s in shapes], dtypes=[dtype],
                               device=device, contract=False, gradcheck=False, reuse=memo, **check_kw)
                if not result.ok:
                    bad = result.failures[0] if result.failures else None
                    reason = bad.messages[0] if bad and bad.messages else result.status
                    # a launch that fails (too many resources, ...) is the configuration's failure, not a wrong value
                    candidate.status, op = "failed" if bad and bad.raised else "wrong", None
                    candidate.reason = f"{bad.title()}: {reason}" if bad and bad.messages else reason
            except Exception as e:  # noqa: BLE001 - a launch error, too many resources, ...
                candidate.status, candidate.reason, op = "failed", f"{type(e).__name__}: {e}".splitlines()[0], None
        out.append((candidate, op))
    if phases is not None:
        phases["build"], phases["check"] = t1 - t0, time.perf_counter() - t1
    return out


def _time(candidates, fns: Dict[int, Callable[..., Any]], args: tuple, timer: Timer, budget: float,
          prune_margin: float) -> None:
    """A short run of every checked configuration prunes those that cannot win; where more than _FINALISTS are
    left, a second short run prunes those surely slower than its best; the rest share the budget."""
    calls = {str(i): (lambda op=op: op(*args)) for i, op in fns.items()}
    if len(calls) > 2:
        bar = 1 + prune_margin
        calls = _pruned(candidates, calls, timer(calls, budget / 5), lambda best, t: (
            f"its fastest round {t.min_us:.2f} us > best median x {bar:g}" if t.min_us > best.median_us * bar else None))
    if len(calls) > _FINALISTS:
        calls = _pruned(candidates, calls, timer(calls, budget / 5), _surely_slower)
    final = timer(calls, budget)
    _note_failures(candidates, final)
    for n, t in final.items():
        if isinstance(t, Timing):
            candidates[int(n)][0].timing = t


def _pruned(candidates, calls: Dict[str, Callable[[], Any]], run: Dict[str, Outcome],
            why: Callable[[Timing, Timing], Optional[str]]) -> Dict[str, Callable[[], Any]]:
    """The calls left after a short ``run``: a configuration is pruned where ``why(best, its timing)`` gives a
    reason (best: the run's lowest median), and dropped where it failed."""
    _note_failures(candidates, run)
    timed = {n: t for n, t in run.items() if isinstance(t, Timing)}
    if timed:
        best = min(timed.values(), key=lambda t: t.median_us)
        for n, t in timed.items():
            reason = why(best, t)
            if reason:
                candidates[int(n)][0].status, candidates[int(n)][0].reason = "pruned", reason
                candidates[int(n)][0].timing = t
    return {n: f for n, f in calls.items() if candidates[int(n)][0].status == "ok"}


def _surely_slower(best: Timing, t: Timing) -> Optional[str]:
    """A reason where ``t`` is slower than ``best`` round by round, the whole 95% interval of the ratio above 1."""
    if t is best or len(t.samples_us) != len(best.samples_us) or not t.samples_us or min(best.samples_us) <= 0:
        return None
    ratio = paired_ratio(best.samples_us, t.samples_us)
    return f"surely slower than the best of a second short run: {ratio} of its time" if ratio.lo > 1 else None


def _note_failures(candidates, outcomes: Dict[str, Outcome]) -> None:
    for n, t in outcomes.items():
        if not isinstance(t, Timing):
            candidates[int(n)][0].status, candidates[int(n)][0].reason = "failed", f"timing: {type(t).__name__}: {t}"


def stored(name: str, source: str, shape: Sequence[int], dtype: torch.dtype = torch.float32, device=None,
           bucket: Optional[Callable[[Sequence[int]], Any]] = None) -> Optional[Config]:
    """The winner stored for this op, device, dtype and the bucket of ``shape`` (None: never tuned there)."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    record = cache.tune_record(_record_key(name, source, device, dtype, shape, bucket)[0])
    return record.get("best") if record else None



class Tuned:
    """An op that runs, on each call, the winner for the call's device, dtype and shape bucket (of the first
    tensor argument's shape), as ``triton.autotune``'s kernels do: a bucket met for the first time is tuned
    with :func:`autotune` at the call's shape, or takes the winner stored by an earlier process (nothing built
    but it, nothing timed); later calls in that bucket cost a dictionary lookup. Made by :func:`tuned`."""

    def __init__(self, make: Callable[[Config], Callable[..., Any]], space: Mapping[str, Sequence[Any]],
                 name: str, bucket: Optional[Callable[[Sequence[int]], Any]], tune_kw: Dict[str, Any]):
        self.name, self._make, self._space, self._bucket = name, make, space, bucket or shape_bucket
        self._tune_kw = tune_kw
        self._ops: Dict[tuple, Callable[..., Any]] = {}
        self._failed: Dict[tuple, str] = {}  # bucket -> why no configuration passed there
        #: (device, dtype, bucket) -> the TuneResult that chose its winner
        self.results: Dict[tuple, TuneResult] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._key(args)
        op = self._ops.get(key)
        if op is None:
            op = self._tuned(key, args[self._first_tensor(args)])
        return op(*args, **kwargs)

    def config(self, *args: Any) -> Config:
        """The configuration a call with these arguments runs (tuned or recalled now if need be)."""
        key = self._key(args)
        if key not in self.results:
            self._tuned(key, args[self._first_tensor(args)])
        return dict(self.results[key].best)

    def _first_tensor(self, args: tuple) -> int:
        index = next((i for i, a in enumerate(args) if isinstance(a, torch.Tensor)), None)
        if index is None:
            raise TypeError(f"{self.name}: expected a tensor among the positional arguments (its shape, dtype and "
                            f"device pick the configuration), got {', '.join(type(a).__name__ for a in args) or 'none'}")
        return index

    def _key(self, args: tuple) -> tuple:
        x = args[self._first_tensor(args)]
        return x.device, x.dtype, repr(self._bucket(tuple(x.shape)))

    def _tuned(self, key: tuple, x: torch.Tensor) -> Callable[..., Any]:
        with self._lock:  # one tuning per bucket, however many threads call at once
            if key in self._failed:  # the same space and seeds fail the same way: say so without tuning again
                raise ValueError(f"{self._failed[key]}\n(tuned at an earlier call in this bucket; make the op again "
                                 "to tune again)")
            if key not in self._ops:
                try:
                    result = autotune(self._make, self._space, name=self.name, shape=tuple(x.shape), dtype=x.dtype,
                                      device=x.device, bucket=self._bucket, **self._tune_kw)
                except ValueError as e:
                    self._failed[key] = str(e)
                    raise
                self.results[key], self._ops[key] = result, self._make(dict(result.best))
            return self._ops[key]


def tuned(make: Callable[[Config], Callable[..., Any]], space: Mapping[str, Sequence[Any]], *, name: str,
          reference: Callable[..., Any], inputs: Callable[..., tuple], source: str = "",
          bucket: Optional[Callable[[Sequence[int]], Any]] = None, **tune_kw: Any) -> Tuned:
    """``make``'s configurations as one op that picks, per call, the winner for the call's shape bucket
    (:class:`Tuned`). The arguments are :func:`autotune`'s; the shape, dtype and device come from each call."""
    for given in ("shape", "dtype", "device"):
        if given in tune_kw:
            raise TypeError(f"tuned {name}: {given}: taken from each call's first tensor argument, not given")
    _required(make, reference, inputs, (), name)
    configurations(space, tune_kw.get("constraint"))  # a bad space fails here, not at the first call
    return Tuned(make, space, name, bucket, dict(tune_kw, reference=reference, inputs=inputs, source=source))


@dataclasses.dataclass
class Across:
    """One tuning per shape, and how the first shape's winner fares at the others."""
    results: List[TuneResult]
    #: per shape: the first winner's time / that shape's winner's ("1.000x" where it wins again), or why not
    carried: List[str]

    def table(self) -> str:
        first = _label(self.results[0].best)
        rows = [f"{'shape bucket':>12}  {'winner':40s}  {first} there"]
        rows += [f"{str(r.bucket):>12}  {_label(r.best):40s}  {c}" for r, c in zip(self.results, self.carried)]
        return "\n".join(rows)


def across(make, space: Optional[Mapping[str, Sequence[Any]]], shapes: Sequence[Sequence[int]], **kw) -> Across:
    """:func:`autotune` at each of ``shapes`` (each stored for its bucket; tuned afresh: ``retune``), and how much
    of the first shape's gain survives at the others: its configuration's time there against that shape's winner
    (the paired ratio where both were timed to the end; the short run's medians where it was pruned)."""
    if not shapes:
        raise ValueError("autotune.across: shapes: expected at least one shape")
    results = [autotune(make, space, shape=tuple(s), retune=True, **kw) for s in shapes]
    first = results[0].best
    carried = []
    for r in results:
        best = next(c for c in r.candidates if c.status == "best")
        mine = next((c for c in r.candidates if c.config == first), None)
        if mine is None or mine.status in ("wrong", "failed"):
            carried.append(f"not usable: {mine.status}: {mine.reason}" if mine else "not in the space")
        elif mine is best:
            carried.append("1.000x (the winner here too)")
        elif mine.vs_best is not None:
            carried.append(f"{mine.vs_best} of the winner's time")
        else:
            carried.append(f"{mine.timing.median_us / best.timing.median_us:.3f}x of the winner's time (pruned)")
    return Across(results, carried)
