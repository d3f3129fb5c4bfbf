"""The parent's verdict on a strict worker's reports: outputs against its own reference, evidence, shortfalls.

Every reported call's inputs are regenerated here from the seeds this process chose, and compared with the
digests of what the op was given. The reference runs here, in the op's dtype and in float64, with TF32 and
reduced-precision reductions off; an output passes where it is within tolerance of either (as in the
default check), and is held to a precision floor whatever the tolerance (:func:`_precision`): an output far
less accurate than the honest reference in its own dtype, or one that tracks the reference of its inputs
rounded to TF32 or bf16, was computed in lower precision.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import random
import statistics
from typing import List, Optional, Sequence, Tuple

import torch

from ..compare import clone, compare, map_tensors, upcast
from ..results import Case, CheckResult
from .process import Run

#: a timed call's device-wide sync this much longer than on an idle device (the group's median) means work left running
DRAIN_MIN_US = 50.0
PRECISION_FACTOR = 256.0  # an op's RMS error may be this many times that of an honest reference in its dtype


@contextlib.contextmanager
def precise():
    """TF32 and reduced-precision reductions off while the reference runs (restored after)."""
    m = torch.backends.cuda.matmul
    saved = (m.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
             m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved[3], saved[4]


def verdict(subject, run: Run, result: CheckResult, groups: List[dict], timed: List[dict], limit: int = 5,
            rtol: Optional[float] = None, atol: Optional[float] = None) -> CheckResult:
    """Fill ``result`` with a case per reported call (outputs against this process's reference, the worker's
    evidence) and a case for each way the run fell short (not built, raised, unreported calls, not done).
    ``subject`` is a :class:`.strict.Subject`; ``groups``/``timed`` the plan's check and timing groups."""
    if run.built is False:
        return _fail(result, "build", f"the op did not build or import: {run.build_error}")
    for what in run.import_evidence:
        _fail(result, "strict", what)
    with precise():
        for head, outputs in run.calls:
            group = (groups if head["phase"] == "check" else timed)[head["group"]]
            _verify_call(subject, result, head, group, outputs, limit, rtol, atol)
    for head in run.raised:
        case = _new_case(result, head.get("phase", "?"), None, (), f"call {head.get('index')}", 0)
        case.raised = head["error"].split(":")[0]
        case.fail(f"the op raised {head['error']}")
    _unreported(result, run, timed)
    _left_running(result, run)
    if not run.done:
        tail = run.log_tail.strip()
        _fail(result, "process", run.ended + (f"; its last output:\n{tail}" if tail else ""))
    return result


def _fail(result: CheckResult, kind: str, message: str) -> CheckResult:
    _new_case(result, kind, None, (), "", 0).fail(message)
    return result


def _new_case(result: CheckResult, kind, dtype, shape, layout, trial, seed=0) -> Case:
    case = Case(kind, dtype, tuple(shape or ()), layout, trial, seed)
    result.cases.append(case)
    return case


def _verify_call(subject, result: CheckResult, head: dict, group: dict, outputs: list, limit, rtol, atol) -> None:
    shape, dtype = group.get("shape"), getattr(torch, group["dtype"]) if group.get("dtype") else None
    kind, layout = ("values", head.get("probe")) if head["phase"] == "check" else ("timed", f"call {head['index']}")
    case = _new_case(result, kind, dtype, shape or (), layout, head["index"], head.get("seed") or 0)
    for what in head.get("evidence", []):
        case.fail(what)
    if "outputs" not in head:
        return
    # the seeds are this process's, from the plan: a worker's claim about them is not taken
    if head["phase"] == "check":
        seed, nudge = group["calls"][head["index"]]["seed"], group["calls"][head["index"]].get("perturb")
    else:
        seed, nudge = group["seed"] + head["index"], None
    args = subject.inputs(shape, dtype, seed, nudge)
    if digests(args) != head.get("inputs_sha"):
        case.fail(f"the inputs the op was given differ from those seed {seed} makes: something changed how "
                  "inputs are made in the op's process (or inputs(seed) is not deterministic)")
        return
    _compare_outputs(subject, case, args, outputs, dtype, limit, rtol, atol)


def digests(args: tuple) -> List[str]:
    """sha256 of each tensor argument's bytes ("" for other arguments)."""
    return [hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            if isinstance(t, torch.Tensor) else "" for t in args]


def _flat(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _compare_outputs(subject, case: Case, args: tuple, outputs: list, dtype, limit, rtol, atol) -> None:
    same = _flat(subject.reference(*map_tensors(args, clone)))
    low = any(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 for t in same)
    exact64 = _flat(subject.reference(*map_tensors(args, upcast))) if low else [None] * len(same)
    if len(outputs) != len(same):
        case.fail(f"the op returned {len(outputs)} outputs, the reference {len(same)}")
        return
    for k, (got, exp, exp64) in enumerate(zip(outputs, same, exact64)):
        name = "output" if len(same) == 1 else f"output[{k}]"
        got = got.to(subject.device) if isinstance(got, torch.Tensor) else got
        out_dtype = exp.dtype if isinstance(exp, torch.Tensor) else dtype
        r, a = subject.tolerance(out_dtype) if out_dtype is not None else (0.0, 0.0)
        ok_before = case.ok
        compare(case, name, got, exp, exp64, rtol if rtol is not None else r, atol if atol is not None else a, limit)
        case.compared += exp.numel() if isinstance(exp, torch.Tensor) else 1
        if ok_before and case.ok and isinstance(exp, torch.Tensor) and exp.is_floating_point() and got.numel():
            _precision(subject, case, name, k, args, got, exp, exp64 if exp64 is not None else exp)


def _rms(x: torch.Tensor) -> float:
    return float(x.pow(2).mean().sqrt()) if x.numel() else 0.0


def _precision(subject, case: Case, name: str, k: int, args: tuple, got: torch.Tensor, same: torch.Tensor,
               exact: torch.Tensor) -> None:
    """Fail an output computed in lower precision than its dtype: its RMS error against the float64 reference
    is over PRECISION_FACTOR times that of the reference in the output's own dtype, or it is measurably off and
    tracks the float64 reference of its inputs rounded to TF32 or bf16 (the signature of a TF32 or bf16 kernel,
    whatever the order of its sums)."""
    exact = exact.double()
    finite = torch.isfinite(exact) & torch.isfinite(got.double()) & torch.isfinite(same.double())
    if not bool(finite.any()):
        return
    err_op = _rms((got.double() - exact)[finite])
    err_ref = max(_rms((same.double() - exact)[finite]), torch.finfo(same.dtype).eps * _rms(exact[finite]) / 8)
    dtype = str(same.dtype).replace("torch.", "")
    if err_op > PRECISION_FACTOR * err_ref:
        return case.fail(f"{name}: far less accurate than {dtype} arithmetic: RMS error {err_op:.3g} against the "
                         f"float64 reference, {err_op / err_ref:.0f}x that of the reference in {dtype} "
                         f"({err_ref:.3g}): lower precision inside (TF32, bf16)?")
    if err_op > LOW_MODEL_MIN * err_ref and same.dtype == torch.float32:
        for model, rounding in LOW_PRECISION.items():
            low = _low_reference(subject, args, rounding, k)
            if low is not None and _rms((got.double() - low)[finite]) < 0.25 * err_op:
                return case.fail(f"{name}: far less accurate than float32 arithmetic: it tracks the float64 reference "
                                 f"of its inputs rounded to {model} (RMS error {err_op:.3g}, {err_op / err_ref:.0f}x "
                                 "that of the float32 reference): computed in " + model)


def _tf32(x: torch.Tensor, nearest: bool) -> torch.Tensor:
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000 if nearest else bits) & ~0x1FFF).view(torch.float32)


#: the lower precisions a float32 op may hide, as roundings of its float32 inputs
LOW_PRECISION = {"TF32": lambda x: _tf32(x, True), "TF32 (truncated)": lambda x: _tf32(x, False),
                 "bfloat16": lambda x: x.to(torch.bfloat16).to(torch.float32),
                 "float16": lambda x: x.to(torch.float16).to(torch.float32)}
LOW_MODEL_MIN = 8.0  # an op within this factor of the float32 reference's error is not tested against the models


def _low_reference(subject, args: tuple, rounding, k: int) -> Optional[torch.Tensor]:
    """Output ``k`` of the float64 reference on ``args`` with every float32 tensor rounded (None when an input
    is floating but not float32: the model does not apply)."""
    if any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float32 for a in args):
        return None
    rounded = tuple(rounding(a).double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    return _flat(subject.reference(*rounded))[k].double()


def _left_running(result: CheckResult, run: Run) -> None:
    """Work the op leaves on another stream makes the device-wide sync after each timed call wait for it. Judged
    on a timing group's median: a host hiccup lengthens one sync (78-146 us in 2 of 64 honest calls on an H100
    shared with other tests), a side stream lengthens every one."""
    for timing in run.timings.values():
        drains, idle = timing.get("drain_us") or [], float(timing.get("idle_drain_us") or 0.0)
        if drains and statistics.median(drains) > idle + DRAIN_MIN_US:
            _fail(result, "strict", f"left device work running after it returned: a device-wide sync after its end "
                                    f"took a median {statistics.median(drains):.0f} us over {len(drains)} timed calls "
                                    f"(idle: {idle:.0f} us); work on another stream?")


def _unreported(result: CheckResult, run: Run, timed: List[dict]) -> None:
    """Every timed call the plan's key selects must have been reported with its outputs."""
    reported = {(h["group"], h["index"]) for h, _ in run.calls if h["phase"] == "time" and "outputs" in h}
    for g, timing in run.timings.items():
        if timing.get("stopped"):  # stopped on evidence: the verdict is made
            continue
        reps = int(timing["reps"])
        want = set(random.Random(timed[g]["verify_key"]).sample(range(reps), min(timed[g]["verify"], reps)))
        missing = sorted((want | {reps - 1}) - {i for gg, i in reported if gg == g})
        if missing:
            _fail(result, "strict", f"timed calls {missing[:5]} were to be verified but their outputs never came")


def median_interval(samples: Sequence[float]) -> Tuple[float, float, float]:
    """(median, lo, hi): the median with its distribution-free 95% interval (order statistics)."""
    s = sorted(samples)
    n = len(s)
    k = max(0, math.floor(n / 2 - 0.98 * math.sqrt(n))) if n >= 6 else 0
    return (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2), s[k], s[n - 1 - k]


def speedup(op_us: Sequence[float], ref_us: Sequence[float]) -> Tuple[float, float, float]:
    """(ratio, lo, hi): the reference's median time over the op's, the interval from the two medians'
    intervals (conservative: the two were timed in separate processes, not in paired rounds)."""
    m_op, lo_op, hi_op = median_interval(op_us)
    m_ref, lo_ref, hi_ref = median_interval(ref_us)
    return m_ref / m_op, lo_ref / hi_op, hi_ref / lo_op


def first_failures(result: CheckResult, n: int = 1) -> str:
    """The first ``n`` failure messages, first line of each."""
    msgs = [m for c in result.failures for m in c.messages][:n]
    return "; ".join(m.splitlines()[0] for m in msgs)
