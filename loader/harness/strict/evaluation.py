"""``kernelkit eval``: many candidate kernels for one problem, each judged in strict mode, one row each.

Each candidate (a file, or inline Python source) is built, checked and timed by a strict worker of its own
(:mod:`kernelkit.harness.strict`), under a wall-clock and a memory limit; a candidate that crashes, hangs, faults the GPU or
outgrows its memory has its process group killed and costs only its own row. The reference is timed once,
the same way, in a worker that never imports a candidate; each correct candidate's speedup over it comes with
a 95% interval. Rows go to JSON and CSV. The problem and candidate formats are :mod:`.origin`'s.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from . import VERIFY_TIMED, Subject, problem_subject, run_subject
from .origin import Problem, of_target
from .process import Limits
from .verdict import first_failures, median_interval, speedup

FIELDS = ("candidate", "built", "correct", "speedup", "speedup_lo", "speedup_hi", "median_us", "reference_us",
          "reason", "seconds")


@dataclasses.dataclass
class Row:
    """One candidate's outcome: built, correct (strict check and verified timed calls), its speedup over the
    reference with a 95% interval (correct candidates only), and the reason when it is not correct."""

    candidate: str
    built: bool = False
    correct: bool = False
    speedup: Optional[float] = None
    speedup_lo: Optional[float] = None
    speedup_hi: Optional[float] = None
    median_us: Optional[float] = None
    reference_us: Optional[float] = None
    reason: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Options:
    """How each candidate is run: ``trials`` check calls, ``budget_ms`` of timed calls, ``verify`` timed calls
    verified, the device (default: CUDA when there is a GPU), and each worker's ``limits``."""

    device: Optional[str] = None
    trials: int = 5
    budget_ms: Optional[float] = None
    verify: int = VERIFY_TIMED
    limits: Limits = dataclasses.field(default_factory=Limits)

    def __post_init__(self):
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"trials: expected an integer >= 1, got {self.trials!r}")
        if isinstance(self.verify, bool) or not isinstance(self.verify, int) or self.verify < 1:
            raise ValueError(f"verify: expected an integer >= 1, got {self.verify!r}")


def evaluate(candidates: Sequence, ref, options: Optional[Options] = None,
             progress: Optional[Callable[[Row], None]] = None) -> List[Row]:
    """A :class:`Row` per candidate (a .py/.cu/.cpp file, or inline Python source defining ``forward``) against
    the reference file ``ref``; ``progress(row)`` after each."""
    options = options or Options()
    if not candidates:
        raise ValueError("candidates: expected at least one candidate file")
    import torch

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    subject = problem_subject(Problem.load(ref), device)
    budget = options.budget_ms or (100.0 if subject.device.type == "cuda" else 50.0)
    baseline = _baseline(subject, budget, options.limits)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kk-eval-") as inline_dir:
        for k, c in enumerate(candidates):
            row = _one(subject, *_candidate_file(c, k, Path(inline_dir)), baseline, budget, options)
            rows.append(row)
            if progress:
                progress(row)
    return rows


def _baseline(subject: Subject, budget: float, limits: Limits) -> List[float]:
    """The reference's timed samples, from a worker that never sees a candidate; a reference that fails its own
    strict run is a ValueError (every row would be meaningless)."""
    result, run = run_subject(subject, subject.reference_origin, trials=2, timing=True, budget_ms=budget, verify=1,
                              limits=limits)
    if not result.ok or 0 not in run.timings:
        raise ValueError(f"ref: the reference fails its own strict run: {first_failures(result, 2) or run.ended}")
    return list(run.timings[0]["samples_us"])


def _candidate_file(candidate, k: int, inline_dir: Path):
    """(row name, file) of a candidate: a path as given, or inline source written to a file of its own."""
    text = str(candidate)
    if "\n" in text or "def forward" in text:
        path = inline_dir / f"inline_{k}.py"
        path.write_text(text)
        return path.stem, path
    return text, Path(text)


def _one(subject: Subject, name: str, path: Path, baseline: List[float], budget: float, options: Options) -> Row:
    row, t0 = Row(candidate=name), time.monotonic()
    try:
        origin = of_target(path, "candidate")
    except (FileNotFoundError, TypeError) as e:
        row.reason = str(e)
        return row
    result, run = run_subject(subject, origin, trials=options.trials, timing=True, budget_ms=budget,
                              verify=options.verify, limits=options.limits)
    row.built, row.correct, row.seconds = bool(run.built), result.ok, time.monotonic() - t0
    samples = run.timings.get(0, {}).get("samples_us")
    row.reference_us = median_interval(baseline)[0]
    if samples:
        row.median_us = median_interval(samples)[0]
    if row.correct and samples:
        row.speedup, row.speedup_lo, row.speedup_hi = speedup(samples, baseline)
    elif not run.built:
        row.reason = f"build failed: {run.build_error}" if run.built is False else run.ended
    else:
        row.reason = first_failures(result) or result.status
    return row


def write_json(rows: Sequence[Row], path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.to_dict() for r in rows], indent=1))
    return path


def write_csv(rows: Sequence[Row], path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(r.to_dict() for r in rows)
    return path


def table(rows: Sequence[Row]) -> str:
    """One line per candidate: verdict, speedup with interval, reason."""
    from .. import report

    body = [[r.candidate, "yes" if r.built else "no", "yes" if r.correct else "NO",
             f"{r.speedup:.2f}x ({r.speedup_lo:.2f}-{r.speedup_hi:.2f})" if r.speedup else "-",
             report.fmt_us(r.median_us), r.reason.splitlines()[0][:100] if r.reason else ""] for r in rows]
    return report.text_table(["candidate", "built", "correct", "speedup (95% CI)", "median", "reason"], body)
