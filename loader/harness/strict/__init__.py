"""``check(..., strict=True)`` and ``bench(..., strict=True)``: checks and timings an op cannot fool.

The op runs only in a worker process (:mod:`.worker`, an interpreter of its own): it cannot patch this
process's reference, comparison or clock. The worker reports outputs, samples and evidence through a signed
channel; this process decides (:mod:`.verdict`). Check calls include probes: the same addresses with
new values (a cache keyed by pointer replays a stale result) and a few elements perturbed (a cache keyed by
a sample of the input). Timed calls get fresh allocations and values; a random subset of them, the last
always, is verified like the check calls, so an op that behaves while checked and cheats while timed is
caught. docs/strict.md says what this guarantees and what it does not.
"""
from __future__ import annotations

import dataclasses
import math
import secrets
import sys
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

from ..results import CheckResult
from ..spec import DEFAULT_TOLERANCES, Spec
from .guards import perturb
from .origin import Origin, Problem, of_callable, of_target, seed_inputs
from .process import Limits, Run, run_worker
from .verdict import first_failures, median_interval, speedup, verdict

VERIFY_TIMED = 8  # timed calls whose outputs are verified: a random subset, the last always
PROBES = ("fresh", "same-address", "perturbed")  # check trials 0, 1, 2; later trials are fresh


@dataclasses.dataclass
class Subject:
    """What this process knows of the problem: how inputs are made (here, and in the worker through
    ``make_origin``), the reference, tolerances, the inputs the op may write, and the sweeps."""

    name: str
    device: torch.device
    make: Callable
    make_origin: Origin
    style: str  # "seed": make(seed, device); "spec": make_inputs(shape, dtype=, device=, generator=)
    reference: Callable
    reference_origin: Optional[Origin]
    tolerance: Callable[[torch.dtype], Tuple[float, float]]
    mutates: Tuple[int, ...] = ()
    check_sweep: List[tuple] = dataclasses.field(default_factory=lambda: [(None, None)])
    bench_sweep: List[tuple] = dataclasses.field(default_factory=lambda: [(None, None)])

    def inputs(self, shape, dtype, seed: int, perturb_seed: Optional[int] = None) -> tuple:
        args = seed_inputs(self.make, self.style, seed, str(self.device), shape, dtype)
        return perturb(args, perturb_seed) if perturb_seed is not None else args

    def size_of(self, shape) -> tuple:
        """A bench row's size: the sweep's shape, or for a reference file the first input's shape."""
        if shape is not None:
            return tuple(shape)
        first = next((a for a in self.inputs(None, None, 0) if isinstance(a, torch.Tensor)), None)
        return tuple(first.shape) if first is not None else ()


def problem_subject(problem: Problem, device) -> Subject:
    """A Subject for a reference file (``kernelkit eval``'s format)."""
    return Subject(problem.name, torch.device(device), problem.inputs, problem.origin("inputs"), "seed",
                   problem.reference, problem.origin("reference"),
                   lambda dtype: problem.tolerance or DEFAULT_TOLERANCES.get(dtype, (1e-5, 1e-6)), problem.mutates)


# ------------------------------------------------------------------------------------------------ plans

def _seed() -> int:
    return secrets.randbelow(1 << 60)


def check_groups(subject: Subject, trials: int) -> List[dict]:
    """Per (shape, dtype): ``trials`` calls, the first three the probes (fresh, same-address, perturbed)."""
    groups = []
    for shape, dtype in subject.check_sweep:
        calls, last = [], _seed()
        for t in range(trials):
            probe = PROBES[t] if t < len(PROBES) else "fresh"
            seed = last if probe == "perturbed" else _seed()
            calls.append({"seed": seed, "probe": probe, "perturb": _seed() if probe == "perturbed" else None})
            last = seed
        groups.append({"shape": _shape(shape), "dtype": _dtype_name(dtype), "calls": calls})
    return groups


def timing_groups(subject: Subject, budget_ms: float, verify: int, max_reps: int = 500) -> List[dict]:
    return [{"shape": _shape(shape), "dtype": _dtype_name(dtype), "seed": 1000 + _seed(), "budget_ms": budget_ms,
             "min_reps": 10, "max_reps": max_reps, "verify": verify, "verify_key": _seed()}
            for shape, dtype in subject.bench_sweep]


def _shape(shape) -> Optional[list]:
    return list(shape) if shape is not None else None


def _dtype_name(dtype) -> Optional[str]:
    return str(dtype).replace("torch.", "") if dtype is not None else None


def run_subject(subject: Subject, op: Origin, *, trials: int = 5, timing: bool = False, budget_ms: float = 100.0,
                verify: int = VERIFY_TIMED, limits: Optional[Limits] = None, max_mismatches: int = 5,
                rtol=None, atol=None) -> Tuple[CheckResult, Run]:
    """One worker on ``op``: ``trials`` check calls per (shape, dtype) and, when ``timing``, a timing group per
    bench size. Returns this process's verdict and the run (its samples)."""
    groups = check_groups(subject, trials) if trials else []
    timed = timing_groups(subject, budget_ms, verify) if timing else []
    plan = {"device": str(subject.device), "op": op.to_dict(), "make": subject.make_origin.to_dict(),
            "style": subject.style, "mutates": list(subject.mutates), "groups": groups, "timing": timed,
            "sys_path": [p for p in sys.path if isinstance(p, str)]}
    run = run_worker(plan, limits or Limits())
    result = CheckResult(subject.name, f"{subject.device}, strict", [])
    verdict(subject, run, result, groups, timed, max_mismatches, rtol, atol)
    result.elapsed_s = run.wall_s
    return result, run


# ------------------------------------------------------------------------------------- the Python API

def subject_for(op, reference, inputs, spec: Optional[Spec], device, kernels_dir, who: str,
                shapes=None, dtypes=None, sizes=None, dtype=None) -> Tuple[Subject, Origin, Optional[Spec]]:
    """(Subject, op's Origin, spec or None) for check/bench's arguments: a reference file (``reference="ref.py"``), or a card,
    a spec or a module-level function with its inputs."""
    if isinstance(reference, (str, Path)):
        return problem_subject(Problem.load(reference), _device(None, device)), of_target(op, f"{who}: op"), None
    card = op if isinstance(op, str) and Path(op).suffix not in (".py", ".cu", ".cpp") else \
        op.name if isinstance(op, Spec) and op.op is None else None
    if card is not None:
        spec = spec or _card_spec(card, kernels_dir, who)
    elif isinstance(op, Spec):
        spec = op
    op_origin = Origin("card", card, "op", _dir(kernels_dir)) if card else \
        of_target(spec.op if isinstance(op, Spec) else op, f"{who}: op")
    if isinstance(inputs, tuple):
        raise TypeError(f"{who}: inputs: strict=True draws fresh inputs for every call: give a make_inputs(shape, "
                        "dtype=, device=, generator=) callable, a spec or a card, not fixed values")
    reference = reference if reference is not None else spec.reference if spec is not None else None
    if reference is None or (inputs is None and spec is None):
        raise TypeError(f"{who}: strict=True needs a reference and inputs: give reference= and inputs= (a make_inputs "
                        "callable), a spec, a card name, or a reference file (reference='ref.py')")
    spec = dataclasses.replace(spec, reference=reference, make_inputs=inputs or spec.make_inputs) if spec else \
        Spec(name=getattr(op, "__name__", "op"), reference=reference, make_inputs=inputs)
    if spec.random:
        raise ValueError(f"{who}: strict=True compares values, and {spec.name!r} is a random op (checked by statistics): "
                         "check it without strict")
    make = Origin("card", card, "make_inputs", _dir(kernels_dir)) if card and inputs is None else \
        of_callable(spec.make_inputs, f"{who}: inputs")
    ref_origin = Origin("card", card, "reference", _dir(kernels_dir)) if card and reference is spec.reference \
        and _card_spec(card, kernels_dir, who).reference is reference else _maybe_origin(reference)
    device = _device(spec, device)
    shapes = [tuple(s) for s in (shapes if shapes is not None else spec.shapes)]
    dtypes = list(dtypes if dtypes is not None else spec.dtypes_for(device))
    if not shapes or not dtypes:
        raise ValueError(f"{who}: shapes, dtypes: expected at least one of each, got an empty list")
    bench = [(tuple(s), dtype or spec.bench_dtype) for s in (sizes if sizes is not None else spec.bench_sizes)]
    return Subject(spec.name, device, spec.make_inputs, make, "spec", reference, ref_origin, spec.tolerance,
                   tuple(spec.mutates), [(s, d) for d in dtypes for s in shapes], bench), op_origin, spec


def _dir(kernels_dir) -> Optional[str]:
    return str(kernels_dir) if kernels_dir is not None else None


def _card_spec(name: str, kernels_dir, who: str) -> Spec:
    from ...jit.cards import all_cards

    card = all_cards(kernels_dir).get(name)
    if card is None or card.spec is None:
        raise ValueError(f"{who}: op: no card named {name!r} with a spec (or give a .py/.cu/.cpp candidate file)")
    return card.spec


def _maybe_origin(fn) -> Optional[Origin]:
    """The reference's Origin when it can be reached from a worker (only a timed baseline needs that)."""
    try:
        return of_callable(fn, "reference")
    except TypeError:
        return None


def _device(spec: Optional[Spec], device) -> torch.device:
    if device is not None:
        return torch.device(device)
    from ..target import default_device

    return torch.device(default_device(spec) or "cpu")


def strict_check(op, reference=None, inputs=None, *, spec: Optional[Spec] = None, shapes=None, dtypes=None,
                 device=None, trials: int = 5, rtol=None, atol=None, kernels_dir=None, max_mismatches: int = 5,
                 raise_on_fail: bool = False, limits: Optional[Limits] = None) -> CheckResult:
    """:func:`kernelkit.check` with ``strict=True`` (see its docstring and this module's)."""
    subject, op_origin, _ = subject_for(op, reference, inputs, spec, device, kernels_dir, "check", shapes, dtypes)
    result, _ = run_subject(subject, op_origin, trials=trials, limits=limits, max_mismatches=max_mismatches,
                            rtol=rtol, atol=atol)
    if raise_on_fail:
        result.raise_for_status()
    return result


def strict_bench(target, inputs, result_type, cpu_cap, *, spec: Optional[Spec] = None, reference=None, sizes=None,
                 dtype=None, device=None, budget_ms: Optional[float] = None, max_numel=None, kernels_dir=None,
                 limits: Optional[Limits] = None):
    """:func:`kernelkit.bench` with ``strict=True``: the op and the eager reference each timed in a worker of
    its own (the same protocol), the op's timed calls verified; a rejected op's rows carry the reason.
    ``result_type``/``cpu_cap``: bench's BenchResult and CPU size cap (handed over: bench imports this module)."""
    from ..bandwidth import device_name

    subject, op_origin, spec = subject_for(target, reference, inputs, spec, device, kernels_dir, "bench", sizes=sizes,
                                           dtype=dtype)
    cap = max_numel if max_numel is not None else cpu_cap(spec) if subject.device.type == "cpu" and spec else None
    skipped = [s for s, _ in subject.bench_sweep if cap is not None and s is not None and math.prod(s) > cap]
    subject.bench_sweep = [(s, d) for s, d in subject.bench_sweep if s is None or not cap or math.prod(s) <= cap]
    budget = budget_ms or (100.0 if subject.device.type == "cuda" else 50.0)
    checked, run = run_subject(subject, op_origin, trials=0, timing=True, budget_ms=budget, limits=limits)
    ref_run = run_subject(subject, subject.reference_origin, trials=0, timing=True, budget_ms=budget,
                          verify=1, limits=limits)[1] if subject.reference_origin else None
    timer = ("cuda-events" if subject.device.type == "cuda" else "host") + ", strict"
    dtype_name = _dtype_name(subject.bench_sweep[0][1]) if subject.bench_sweep and subject.bench_sweep[0][1] else \
        _dtype_name(next((a.dtype for a in subject.inputs(None, None, 0) if isinstance(a, torch.Tensor)), None))
    result = result_type(subject.name, str(subject.device), device_name(subject.device), dtype_name, timer, None,
                         ["op", "eager"])
    for g, (shape, _) in enumerate(subject.bench_sweep):
        rows = timing_rows(_samples(run, g), _samples(ref_run, g) if ref_run else None, subject.size_of(shape))
        if not checked.ok:
            rows[0]["error"] = f"rejected by strict mode: {first_failures(checked)}"
        result.rows += rows
    result.notes += [f"size {s} skipped (over {cap} elements on a CPU)" for s in skipped]
    result.notes += [] if subject.reference_origin else ["the reference is not importable by a worker: not timed"]
    result.notes += [] if checked.ok else [f"REJECTED by strict mode: {first_failures(checked, 3)}"]
    result.strict_check = checked
    return result


def _samples(run: Optional[Run], group: int) -> Optional[List[float]]:
    t = run.timings.get(group) if run is not None else None
    return list(t["samples_us"]) if t else None


def timing_rows(op_us: Optional[List[float]], ref_us: Optional[List[float]], size: tuple) -> List[dict]:
    """BenchResult rows of the op and the eager reference at one size (the ratio on the reference's row)."""
    rows = []
    for name, samples in (("op", op_us), ("eager", ref_us)):
        row = {"size": list(size), "numel": math.prod(size), "contender": name}
        if samples:
            s = sorted(samples)
            row.update(median_us=median_interval(s)[0], p20_us=s[int(0.2 * (len(s) - 1))],
                       p80_us=s[int(0.8 * (len(s) - 1))], mean_us=sum(s) / len(s), min_us=s[0], reps=len(s),
                       timer="strict")
        else:
            row["error"] = "not timed"
        rows.append(row)
    if op_us and ref_us:
        r, lo, hi = speedup(op_us, ref_us)
        rows[1].update(ratio=r, ratio_lo=lo, ratio_hi=hi, unreliable=None)
    return rows
