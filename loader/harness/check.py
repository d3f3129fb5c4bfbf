"""kernelkit.check: is an op right? Compare it against its reference over many seeded random inputs.

Every trial draws fresh inputs (seeded, reproducible) over a shape set that includes 1, odd sizes,
non-multiples of block/vector widths and empty tensors; odd trials pass non-contiguous views. Every
buffer the op sees sits between NaN guard bands, outputs given through ``out=`` are NaN-poisoned, and
the allocator is poisoned before the call, so skipped elements and stray writes show up. Values are
compared with dtype-aware tolerances against the reference in the same dtype and in float64 (an element
passes when it is close to either); ops with a backward get ``torch.autograd.gradcheck`` in float64, and
random ops are tested statistically instead (``stats.py``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import KernelkitError
from . import report
from .spec import Spec, load_card
from .stats import test_samples

GUARD = 1024  # elements of NaN guard band on each side of every buffer the op sees
CHUNK = 1 << 24  # elements compared at a time (keeps > 2**31-element checks within memory)
GRADCHECK_MAX_NUMEL = 256


class CheckError(KernelkitError, AssertionError):
    """``CheckResult.raise_for_status()``: the op disagrees with its reference; ``.result`` has details."""

    def __init__(self, result: "CheckResult"):
        self.result = result
        super().__init__(result.message())


@dataclasses.dataclass
class Mismatch:
    index: Tuple[int, ...]
    got: Any
    expected: Any
    expected64: Any = None

    def format(self) -> str:
        s = f"index {self.index}: got {_val(self.got)}, expected {_val(self.expected)}"
        return s + (f" (float64 reference {_val(self.expected64)})" if self.expected64 is not None else "")


@dataclasses.dataclass
class Case:
    """One call of the op (or one gradcheck / statistics run) and what was found."""

    kind: str  # values | stats | seeding | gradcheck | backward
    dtype: Optional[torch.dtype]
    shape: Tuple[int, ...]
    layout: str
    trial: int
    seed: int
    ok: bool = True
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    max_abs64: Optional[float] = None
    max_rel64: Optional[float] = None
    min_p: Optional[float] = None
    messages: List[str] = dataclasses.field(default_factory=list)
    mismatches: List[Mismatch] = dataclasses.field(default_factory=list)

    def fail(self, message: str) -> None:
        self.ok = False
        self.messages.append(message)

    def title(self) -> str:
        return (f"{self.kind} {_dtype_name(self.dtype)} shape {report.fmt_shape(self.shape)} {self.layout}"
                f" trial {self.trial} (seed {self.seed})")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dtype"] = _dtype_name(self.dtype)
        d["mismatches"] = [dict(m.__dict__, index=list(m.index)) for m in self.mismatches]
        return d


@dataclasses.dataclass
class CheckResult:
    name: str
    device: str
    cases: List[Case]
    elapsed_s: float = 0.0
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    @property
    def failures(self) -> List[Case]:
        return [c for c in self.cases if not c.ok]

    def raise_for_status(self) -> "CheckResult":
        if not self.ok:
            raise CheckError(self)
        return self

    def summary(self) -> str:
        n, bad = len(self.cases), len(self.failures)
        verdict = "ok" if not bad else f"FAIL ({bad} of {n} cases)"
        return f"check {self.name} on {self.device}: {verdict}, {n} cases in {self.elapsed_s:.2f}s"

    HEADERS = ("check", "dtype", "cases", "shapes", "max abs", "max rel", "f64 abs", "f64 rel", "min p", "status")

    def rows(self) -> List[list]:
        groups: Dict[tuple, List[Case]] = {}
        for c in self.cases:
            groups.setdefault((c.kind, _dtype_name(c.dtype)), []).append(c)
        rows = []
        for (kind, dtype), cs in groups.items():
            def worst(attr, fn=max):
                vals = [getattr(c, attr) for c in cs if getattr(c, attr) is not None]
                return report.fmt_num(fn(vals)) if vals else "-"
            bad = sum(not c.ok for c in cs)
            status = "ok" if not bad else f"FAIL {bad}/{len(cs)}"
            rows.append([kind, dtype, len(cs), len({c.shape for c in cs}), worst("max_abs"), worst("max_rel"),
                         worst("max_abs64"), worst("max_rel64"), worst("min_p", min), status])
        return rows

    def details(self, max_cases: int = 3) -> str:
        """The failures, readable: which case (kind, dtype, shape, layout, seed), what was wrong, where.
        One failing case per distinct (kind, shape) first, so a pattern (e.g. always the last index) shows."""
        firsts = list({(c.kind, c.shape): c for c in reversed(self.failures)}.values())[::-1]
        shown = (firsts + [c for c in self.failures if c not in firsts])[:max_cases]
        lines = []
        for c in shown:
            lines.append(f"- {c.title()}:")
            lines += [f"    {m}" for m in c.messages]
        if len(self.failures) > len(shown):
            lines.append(f"... and {len(self.failures) - len(shown)} more failing cases")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def message(self) -> str:
        return self.summary() + "\n" + self.details()

    def __repr__(self) -> str:
        text = report.text_table(self.HEADERS, self.rows())
        return self.summary() + "\n" + text + ("\n" + self.details() if not self.ok or self.notes else "")

    def _repr_html_(self) -> str:
        details = self.details() if not self.ok or self.notes else ""
        return report.html_table(self.HEADERS, self.rows(), title=self.summary(), details=details)

    def to_dict(self) -> dict:
        return {"name": self.name, "device": self.device, "ok": self.ok, "elapsed_s": self.elapsed_s,
                "notes": self.notes, "rows": [dict(zip(self.HEADERS, r)) for r in self.rows()],
                "failures": [c.to_dict() for c in self.failures[:20]], "message": self.message()}


# --------------------------------------------------------------------------------------------- helpers

def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "-"


def _val(v) -> str:
    return f"{v:.8g}" if isinstance(v, float) else str(v)


def _case_seed(seed: int, *parts) -> int:
    """A reproducible seed per case that does not depend on Python's salted hash()."""
    return int(hashlib.sha256(repr((seed,) + parts).encode()).hexdigest()[:12], 16)


def _map_tensors(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_map_tensors(v, fn) for v in x)
    return x


def _flat_outputs(x) -> List[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


# Guard-band fill: a signalling NaN with a payload. Reading it yields NaN; arithmetic on it yields a
# *quiet* NaN (different bits), so a stray write of a computed NaN is still seen as a write.
_SNAN = {torch.float64: (torch.int64, 0x7FF4A5A5A5A5A5A5), torch.float32: (torch.int32, 0x7FA5A5A5),
         torch.float16: (torch.int16, 0x7D5A), torch.bfloat16: (torch.int16, 0x7FA5)}


def _fill_sentinel(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in _SNAN:
        int_dtype, bits = _SNAN[t.dtype]
        t.view(int_dtype).fill_(bits)
    else:
        t.fill_(float("nan") if t.dtype.is_floating_point or t.dtype.is_complex else
                True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
    return t


def _bits(t: torch.Tensor) -> torch.Tensor:
    """(numel, itemsize) bytes, so NaNs compare equal to themselves."""
    flat = torch.empty(t.numel(), dtype=t.dtype, device=t.device).copy_(t.detach().reshape(-1))
    return flat.view(torch.uint8).view(flat.numel(), -1) if flat.numel() else flat.view(torch.uint8).view(0, 1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Guarded:
    """A tensor embedded in a larger flat buffer whose remaining memory (a band before, a band after and,
    for strided views, the gaps between elements) holds a sentinel (a signalling NaN for floats). A read outside the
    view produces NaN in the output; a write outside it changes the sentinel, which ``stray_writes``
    reports."""

    def __init__(self, like: torch.Tensor, strided: bool, fill: Optional[torch.Tensor] = None):
        self.shape = tuple(like.shape)
        self.strided = strided and like.dim() > 0
        self.inner = like.numel() * (2 if self.strided else 1)
        self.base = _fill_sentinel(torch.empty(2 * GUARD + self.inner, dtype=like.dtype, device=like.device))
        self.view = self._embed(self.base)
        if fill is not None:
            self.view.copy_(fill)

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        mid = flat[GUARD:GUARD + self.inner]
        if self.strided:
            return mid.view(*self.shape[:-1], 2 * self.shape[-1])[..., ::2]
        return mid.view(self.shape)

    def stray_writes(self, what: str) -> Optional[str]:
        outside = torch.ones(self.base.numel(), dtype=torch.bool, device=self.base.device)
        self._embed(outside).fill_(False)
        sentinel = _fill_sentinel(torch.empty(1, dtype=self.base.dtype, device=self.base.device))
        changed = ((_bits(self.base) != _bits(sentinel)).any(1) & outside).nonzero().flatten()
        if changed.numel() == 0:
            return None
        p = int(changed[0])
        if p < GUARD:
            where = f"{GUARD - p} element(s) before its first element"
        elif p >= GUARD + self.inner:
            where = f"element +{p - GUARD - self.inner} past its end"
        else:
            where = f"in a gap of the strided view (storage offset {p - GUARD} from the view's start)"
        return (f"{what}: wrote outside the tensor's elements: {changed.numel()} element(s) of the surrounding "
                f"memory changed, first {where}")


def _poison_allocator(like: Sequence[Any], device: torch.device) -> None:
    """Fill and free a block of each expected output's size: the allocator then tends to hand the op a
    NaN-filled block, so an element the op never writes reads NaN, not a stale correct value."""
    for t in like:
        if isinstance(t, torch.Tensor) and t.numel():
            torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, device=device).fill_(255)


def _index(flat: int, shape: Sequence[int]) -> Tuple[int, ...]:
    idx = []
    for s in reversed(list(shape)):
        idx.append(flat % s)
        flat //= s
    return tuple(reversed(idx))


def _max(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return b if a is None else a if b is None else max(a, b)


def compare(case: Case, name: str, got: Any, exp: Any, exp64: Any, rtol: float, atol: float,
            limit: int = 5) -> None:
    """Compare one output with the reference in the same dtype and (when given) in float64; an element
    passes when it is close to either. Records max errors and the first ``limit`` mismatches in ``case``."""
    if not isinstance(exp, torch.Tensor):
        if got != exp:
            case.fail(f"{name}: got {got!r}, expected {exp!r}")
        return
    if not _check_meta(case, name, got, exp):
        return
    g, e = got.detach().reshape(-1), exp.detach().reshape(-1)
    e64 = exp64.detach().reshape(-1) if isinstance(exp64, torch.Tensor) else None
    exact = not (got.is_floating_point() or got.is_complex())
    n_bad = n_nonfinite = 0
    found: List[Mismatch] = []
    for start in range(0, g.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        if exact:
            bad = g[sl] != e[sl]
        else:
            gc, ec = g[sl].double(), e[sl].double()
            close = torch.isclose(gc, ec, rtol=rtol, atol=atol, equal_nan=True)
            case.max_abs, case.max_rel = _errors(case.max_abs, case.max_rel, gc, ec, atol)
            if e64 is not None:
                e6 = e64[sl].double()
                close |= torch.isclose(gc, e6, rtol=rtol, atol=atol, equal_nan=True)
                case.max_abs64, case.max_rel64 = _errors(case.max_abs64, case.max_rel64, gc, e6, atol)
            bad = ~close
            n_nonfinite += int((~torch.isfinite(gc) & torch.isfinite(ec)).sum())
        n_bad += int(bad.sum())
        for i in bad.nonzero().flatten()[: max(0, limit - len(found))].tolist():
            k = start + i
            found.append(Mismatch(_index(k, exp.shape), g[k].item(), e[k].item(),
                                  e64[k].item() if e64 is not None else None))
    if n_bad:
        case.mismatches += found
        tol = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
        extra = f"; {n_nonfinite} NaN/inf where the reference is finite" if n_nonfinite else ""
        where = f"at {found[0].format()}" if len(found) == 1 else \
            "first at:" + "".join(f"\n      {m.format()}" for m in found)
        case.fail(f"{name}: {n_bad} of {g.numel()} elements differ ({tol}){extra}; {where}")


def _errors(max_abs, max_rel, g: torch.Tensor, e: torch.Tensor, atol: float):
    finite = torch.isfinite(g) & torch.isfinite(e)
    if not bool(finite.any()):
        return max_abs, max_rel
    err = (g - e).abs()[finite]
    ref = e.abs()[finite]
    big = ref > max(atol, 1e-30)
    rel = float((err[big] / ref[big]).max()) if bool(big.any()) else None
    return _max(max_abs, float(err.max())), _max(max_rel, rel)


# ------------------------------------------------------------------------------------------------ cases

@dataclasses.dataclass
class _Plan:
    op: Callable
    reference: Callable
    spec: Spec
    device: torch.device
    rtol: Optional[float]
    atol: Optional[float]
    limit: int

    def tol(self, dtype) -> Tuple[float, float]:
        rtol, atol = self.spec.tolerance(dtype)
        return (self.rtol if self.rtol is not None else rtol, self.atol if self.atol is not None else atol)

    def inputs(self, shape, dtype, seed: int) -> tuple:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return tuple(self.spec.make_inputs(shape, dtype=dtype, device=self.device, generator=gen))


def _run_values(plan: _Plan, case: Case, args: tuple, use_out: bool) -> None:
    spec, device = plan.spec, plan.device
    try:
        expected = plan.reference(*_map_tensors(args, _clone))
        low = case.dtype is not None and case.dtype.is_floating_point and case.dtype != torch.float64
        expected64 = plan.reference(*_map_tensors(args, _upcast)) if low and case.kind == "values" else None
    except Exception as e:  # noqa: BLE001 - inputs the reference rejects: the op must reject them too
        return _expect_error(plan, case, args, e)
    strided = case.layout.startswith("strided")
    guards = {i: _Guarded(a, strided, fill=a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    call_args = tuple(guards[i].view if i in guards else a for i, a in enumerate(args))
    kwargs, outs = {}, []
    if use_out:
        outs = [_Guarded(t, strided) for t in _flat_outputs(expected)]
        views = [o.view for o in outs]
        kwargs[spec.out_arg] = views[0] if not isinstance(expected, (tuple, list)) else tuple(views)
    _poison_allocator(_flat_outputs(expected), device)
    if spec.random:
        torch.manual_seed(case.seed)
    try:
        got = plan.op(*call_args, **kwargs)
        _sync(device)
    except Exception as e:  # noqa: BLE001 - report, do not crash the whole check
        return case.fail(f"the op raised {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    for i, g in guards.items():
        msg = g.stray_writes(f"input {i}")
        if msg:
            case.fail(msg)
        if i not in spec.mutates:
            changed = (_bits(g.view) != _bits(args[i])).any(1).nonzero().flatten()
            if changed.numel():
                case.fail(f"input {i}: the op modified its input in place ({changed.numel()} elements, first at "
                          f"index {_index(int(changed[0]), args[i].shape)}); declare Spec.mutates if intended")
    for k, o in enumerate(outs):
        msg = o.stray_writes(f"{spec.out_arg}= buffer {k}")
        if msg:
            case.fail(msg)
    rtol, atol = plan.tol(case.dtype)
    results = [o.view for o in outs] if use_out else _flat_outputs(got)
    exps, exps64 = _flat_outputs(expected), _flat_outputs(expected64) if expected64 is not None else None
    if len(results) != len(exps):
        return case.fail(f"the op returned {len(results)} outputs, the reference {len(exps)}")
    for k, (r, e) in enumerate(zip(results, exps)):
        name = f"{spec.out_arg}=" if use_out else "output" if len(exps) == 1 else f"output[{k}]"
        if spec.random:
            if _check_meta(case, name, r, e):
                test_samples(case, r, args, spec, e)
        else:
            compare(case, name, r, e, exps64[k] if exps64 else None, rtol, atol, plan.limit)
    returned = _flat_outputs(got)[0] if use_out and got is not None and not spec.random else None
    if isinstance(returned, torch.Tensor) and returned.numel() and returned.data_ptr() == results[0].data_ptr():
        returned = None  # the out= tensor itself, compared above
    if returned is not None:
        compare(case, "returned value", returned, exps[0], None, rtol, atol, 1)


def _expect_error(plan: _Plan, case: Case, args: tuple, ref_error: Exception) -> None:
    try:
        plan.op(*args)
        _sync(plan.device)
    except Exception:  # noqa: BLE001 - rejected like the reference: right
        case.messages.append(f"op and reference both raised (reference: {type(ref_error).__name__})")
        return
    case.fail(f"the reference raised {type(ref_error).__name__} ({str(ref_error).strip()[:200]}) but the op "
              f"returned a value: either the op must reject these inputs too, or the reference (or the spec's "
              f"shapes) must handle them")


def _check_meta(case: Case, name: str, got: Any, exp: torch.Tensor) -> bool:
    """A tensor of the reference output's shape, dtype and device?"""
    if not isinstance(got, torch.Tensor):
        case.fail(f"{name}: the op returned {type(got).__name__}, expected a tensor")
        return False
    for attr in ("shape", "dtype", "device"):
        if getattr(got, attr) != getattr(exp, attr):
            hint = " (wrong dtype handling: outputs must keep the reference's dtype)" if attr == "dtype" else ""
            case.fail(f"{name}: {attr} {getattr(got, attr)}, expected {getattr(exp, attr)}{hint}")
            return False
    return True


def _run_seeding(plan: _Plan, case: Case, args: tuple) -> None:
    """Random ops: the same torch.manual_seed gives the same samples, successive calls new ones."""
    try:
        torch.manual_seed(case.seed)
        a = _flat_outputs(plan.op(*args))[0]
        torch.manual_seed(case.seed)
        b = _flat_outputs(plan.op(*args))[0]
        c = _flat_outputs(plan.op(*args))[0]
        _sync(plan.device)
    except Exception as e:  # noqa: BLE001
        return case.fail(f"the op raised {type(e).__name__}: {e}")
    if not torch.equal(_bits(a), _bits(b)):
        case.fail("not reproducible: the same torch.manual_seed gave different samples")
    if a.numel() > 1 and torch.equal(_bits(a), _bits(c)):
        case.fail("two successive calls returned identical samples: the generator's offset is not advanced")


def _run_gradcheck(plan: _Plan, case: Case, args: tuple, grad_inputs: Sequence[int]) -> None:
    subsets = [tuple(grad_inputs)] + ([(i,) for i in grad_inputs] if len(grad_inputs) > 1 else [])
    for subset in subsets:
        inputs = tuple(a.detach().requires_grad_(i in subset) if i in grad_inputs else a
                       for i, a in enumerate(_map_tensors(args, _clone)))
        try:
            torch.autograd.gradcheck(plan.op, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True)
        except Exception as e:  # noqa: BLE001 - GradcheckError, or the backward raising
            text = "\n      ".join(str(e).strip().splitlines()[:12])
            return case.fail(f"gradcheck (float64, grads w.r.t. inputs {list(subset)}) failed: "
                             f"{type(e).__name__}: {text}")


def _run_backward(plan: _Plan, case: Case, args: tuple, grad_inputs: Sequence[int]) -> None:
    """Gradients in the tested dtype against the reference's (same dtype and float64)."""
    def grads(fn, xs):
        xs = tuple(a.detach().clone().requires_grad_(i in grad_inputs) if i in grad_inputs else a
                   for i, a in enumerate(xs))
        out = fn(*xs)
        gen = torch.Generator(device=plan.device).manual_seed(case.seed)
        gout = torch.randn(out.shape, generator=gen, device=out.device, dtype=torch.float32).to(out.dtype)
        want = [xs[i] for i in grad_inputs]
        return torch.autograd.grad(out, want, gout, allow_unused=True)

    try:
        exp = grads(plan.reference, args)
        exp64 = grads(plan.reference, _map_tensors(args, _upcast)) if case.dtype != torch.float64 else None
    except Exception as e:  # noqa: BLE001
        return case.fail(f"the reference's backward raised {type(e).__name__}: {e}")
    try:
        got = grads(plan.op, args)
        _sync(plan.device)
    except Exception as e:  # noqa: BLE001
        return case.fail(f"the op's backward raised {type(e).__name__}: {e}")
    rtol, atol = plan.tol(case.dtype)
    for k, i in enumerate(grad_inputs):
        if got[k] is None:
            case.fail(f"grad of input {i}: the op's backward returned None")
            continue
        compare(case, f"grad of input {i}", got[k], exp[k], exp64[k] if exp64 else None, rtol, atol, plan.limit)


# ----------------------------------------------------------------------------------------------- check

InputsArg = Union[None, tuple, list, Callable[..., tuple]]


def _resolve(op, reference, spec: Optional[Spec], inputs: InputsArg) -> Tuple[Callable, Callable, Spec, bool]:
    """(op, reference, spec, fixed): a card name or Spec stands for its op; explicit inputs override the
    spec's generator. ``fixed`` says the inputs are given values (not a generator)."""
    if isinstance(op, str):
        card_spec, op = load_card(op)
        spec = spec or card_spec
    elif isinstance(op, Spec):
        spec, op = op, op.resolve_op()
    reference = reference if reference is not None else spec.reference if spec is not None else None
    if reference is None:
        raise TypeError("check: give a reference (or a spec/card name that has one)")
    fixed = inputs is not None and not callable(inputs)
    make = inputs if callable(inputs) else spec.make_inputs if spec is not None and inputs is None else None
    if fixed:
        given = tuple(inputs)

        def make(shape, dtype=None, device=None, generator=None):  # noqa: ARG001 - fixed values
            return _map_tensors(given, lambda t: t.detach().to(device=device, dtype=dtype if t.is_floating_point()
                                                                and dtype is not None else t.dtype).clone())
    if make is None:
        raise TypeError("check: give inputs= (a tuple of args, or make_inputs(shape, dtype=, device=, generator=)) "
                        "or a spec")
    name = spec.name if spec is not None else getattr(op, "__name__", "op")
    spec = dataclasses.replace(spec, make_inputs=make) if spec is not None else \
        Spec(name=name, reference=reference, make_inputs=make)
    return op, reference, spec, fixed


def _default_device(spec: Spec) -> str:
    if torch.cuda.is_available() and "cuda" in spec.devices:
        return "cuda"
    if "cpu" in spec.devices:
        return "cpu"
    raise KernelkitError(f"{spec.name}: implemented for {list(spec.devices)} only, and no CUDA GPU is available")


def check(op, reference: Optional[Callable] = None, inputs: InputsArg = None, *, spec: Optional[Spec] = None,
          shapes: Optional[Sequence[Tuple[int, ...]]] = None, dtypes: Optional[Sequence[torch.dtype]] = None,
          device=None, trials: int = 5, seed: int = 0, rtol: Optional[float] = None, atol: Optional[float] = None,
          gradcheck: Optional[bool] = None, random: Optional[bool] = None, large: bool = False,
          raise_on_fail: bool = False, max_mismatches: int = 5) -> CheckResult:
    """Check ``op`` against ``reference``.

    ``op`` is a callable, a card name or a :class:`Spec`. Inputs come from ``inputs`` (a tuple of args, a
    list of such tuples is not supported: use a callable), else ``spec.make_inputs``; ``shapes``,
    ``dtypes`` and tolerances default to the spec's. Trials alternate contiguous and strided
    (non-contiguous) inputs, and, where the spec names an ``out_arg``, returned vs ``out=`` outputs.
    ``large=True`` adds the spec's > 2**31-element shapes (one trial, contiguous). ``gradcheck`` defaults
    to "the spec has grad_inputs"; ``random`` to ``spec.random`` (statistical checks instead of equality).
    """
    t0 = time.perf_counter()
    op, reference, spec, fixed = _resolve(op, reference, spec, inputs)
    if random is not None:
        spec = dataclasses.replace(spec, random=random)
    device = torch.device(device if device is not None else _default_device(spec))
    plan = _Plan(op, reference, spec, device, rtol, atol, max_mismatches)
    if fixed:
        first = next((t for t in _flat_outputs(tuple(inputs)) if isinstance(t, torch.Tensor)), None)
        shapes = [tuple(first.shape) if first is not None else ()]
        dtypes = dtypes or [first.dtype if first is not None and first.is_floating_point() else None]
        trials = min(trials, 2)
    shapes = [tuple(s) for s in (shapes if shapes is not None else spec.shapes)]
    dtypes = list(dtypes if dtypes is not None else spec.dtypes_for(device))
    result = CheckResult(spec.name, str(device), [])
    layouts = ["contiguous", "strided"] if spec.noncontiguous else ["contiguous"]

    def new_case(kind, dtype, shape, layout, trial) -> Case:
        case = Case(kind, dtype, shape, layout, trial, _case_seed(seed, kind, str(dtype), shape, layout, trial))
        result.cases.append(case)
        return case

    for dtype in dtypes:
        for shape in shapes:
            for trial in range(trials):
                layout = layouts[trial % len(layouts)]
                use_out = spec.out_arg is not None and (trial // 2) % 2 == 1
                case = new_case("stats" if spec.random else "values", dtype, shape,
                                layout + (" out=" if use_out else ""), trial)
                _run_values(plan, case, plan.inputs(shape, dtype, case.seed), use_out)
                if _cuda_broken(case, device):
                    result.notes.append("stopped after a CUDA error: the context is unusable")
                    return _finish(result, t0, raise_on_fail)
        nonempty = [s for s in shapes if math.prod(s) > 0]
        if spec.random and nonempty:
            shape = next((s for s in nonempty if math.prod(s) > 1), nonempty[0])
            case = new_case("seeding", dtype, shape, "contiguous", 0)
            _run_seeding(plan, case, plan.inputs(shape, dtype, case.seed))
        elif spec.grad_inputs and gradcheck is not False and dtype != torch.float64 and dtype.is_floating_point:
            for shape in nonempty[:3]:
                case = new_case("backward", dtype, shape, "contiguous", 0)
                _run_backward(plan, case, plan.inputs(shape, dtype, case.seed), spec.grad_inputs)
    if large:
        _large(plan, result, new_case, dtypes, shapes)
    _gradchecks(plan, result, new_case, shapes, dtypes, gradcheck)
    return _finish(result, t0, raise_on_fail)


def _gradchecks(plan: _Plan, result: CheckResult, new_case, shapes, dtypes, gradcheck: Optional[bool]) -> None:
    spec = plan.spec
    grad_inputs = list(spec.grad_inputs)
    if gradcheck and not grad_inputs:  # asked for without a spec: every floating tensor arg
        args = plan.inputs(shapes[0], torch.float64, 0)
        grad_inputs = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not grad_inputs or gradcheck is False or spec.random:
        return
    if torch.float64 not in spec.dtypes_for(plan.device):
        result.notes.append(f"gradcheck skipped: {spec.name} does not take float64 on {plan.device}")
        return
    small = sorted((s for s in shapes if 0 < math.prod(s) <= GRADCHECK_MAX_NUMEL), key=math.prod)[:2]
    small = small or [min((s for s in shapes if math.prod(s) > 0), key=math.prod, default=(3,))]
    for shape in small:
        for layout in dict.fromkeys(["contiguous", "strided" if spec.noncontiguous else "contiguous"]):
            case = new_case("gradcheck", torch.float64, shape, layout, 0)
            args = plan.inputs(shape, torch.float64, case.seed)
            if layout == "strided":
                args = tuple(_Guarded(a, True, fill=a).view if isinstance(a, torch.Tensor) else a for a in args)
            _run_gradcheck(plan, case, args, grad_inputs)


def _large(plan: _Plan, result: CheckResult, new_case, dtypes, checked_shapes) -> None:
    shapes = list(plan.spec.large_shapes)
    if not shapes and checked_shapes and all(len(s) == 1 for s in checked_shapes):  # a 1-D (elementwise) op
        shapes = [((1 << 31) + 1,)]
    if not shapes:
        result.notes.append("large=True: the spec lists no large_shapes")
        return
    dtype = min(dtypes, key=lambda d: torch.empty((), dtype=d).element_size())
    for shape in shapes:
        case = new_case("values", dtype, tuple(shape), "contiguous large", 0)
        _run_values(plan, case, plan.inputs(tuple(shape), dtype, case.seed), False)


def _cuda_broken(case: Case, device: torch.device) -> bool:
    if device.type != "cuda" or case.ok:
        return False
    try:
        torch.cuda.synchronize(device)
        return False
    except Exception:  # noqa: BLE001 - a sticky error (illegal address, ...)
        return True


def _finish(result: CheckResult, t0: float, raise_on_fail: bool) -> CheckResult:
    result.elapsed_s = time.perf_counter() - t0
    if raise_on_fail:
        result.raise_for_status()
    return result
