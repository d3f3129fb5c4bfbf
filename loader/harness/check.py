"""kernelkit.check: is an op right? Compare it against its reference over many seeded random inputs.

Every trial draws fresh inputs (seeded, reproducible) over a shape set that includes 1, odd sizes,
non-multiples of block/vector widths and empty tensors; odd trials pass non-contiguous views. Every
buffer the op sees sits between NaN guard bands, outputs given through ``out=`` are NaN-poisoned, and
the allocator is poisoned before the call (``guard.py``), so skipped elements and stray writes show up.
Values are compared with dtype-aware tolerances against the reference in the same dtype and in float64
(an element passes when it is close to either: ``compare.py``); ops with a backward get
``torch.autograd.gradcheck`` in float64, random ops are tested statistically instead (``stats.py``), and a
torch custom op is held to its contract: opcheck, torch.compile, CUDA graphs, the current stream
(``contract.py``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import contract as _contract
from .compare import check_meta, clone, compare, flat_outputs, map_tensors, upcast
from .guard import Guarded, bits, index, poison_allocator
from .results import Case, CheckResult
from .spec import Spec, check_inputs_arg
from .stats import test_samples
from .target import resolve

GRADCHECK_MAX_NUMEL = 256


def _case_seed(seed: int, *parts) -> int:
    """A reproducible seed per case that does not depend on Python's salted hash()."""
    return int(hashlib.sha256(repr((seed,) + parts).encode()).hexdigest()[:12], 16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    reuse: Optional["CaseMemo"] = None

    def tol(self, dtype) -> Tuple[float, float]:
        rtol, atol = self.spec.tolerance(dtype)
        return (self.rtol if self.rtol is not None else rtol, self.atol if self.atol is not None else atol)

    def inputs(self, shape, dtype, seed: int) -> tuple:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return tuple(self.spec.make_inputs(shape, dtype=dtype, device=self.device, generator=gen))


class CaseMemo:
    """Inputs and reference outputs per case, shared by checks of several ops against one reference with the
    same inputs, shapes and seed (autotune's configurations): each case's are computed once. Holds at most
    ``limit_bytes`` (default: a quarter of the device's free memory, 2 GiB on the CPU)."""

    def __init__(self, limit_bytes: Optional[int] = None):
        self.cases: dict = {}
        self.limit_bytes, self.used = limit_bytes, 0

    def get(self, case: Case):
        return self.cases.get((case.seed, case.dtype, case.shape))

    def put(self, case: Case, device: torch.device, entry: tuple) -> None:
        if self.limit_bytes is None:
            self.limit_bytes = torch.cuda.mem_get_info(device)[0] // 4 if device.type == "cuda" else 2 << 30
        size = sum(t.numel() * t.element_size() for t in flat_outputs(entry[0]) + flat_outputs(entry[1]) +
                   flat_outputs(entry[2]) if isinstance(t, torch.Tensor))
        if self.used + size <= self.limit_bytes:
            self.cases[(case.seed, case.dtype, case.shape)], self.used = entry, self.used + size


def _case_inputs(plan: _Plan, case: Case) -> tuple:
    hit = plan.reuse.get(case) if plan.reuse is not None else None
    return hit[0] if hit else plan.inputs(case.shape, case.dtype, case.seed)


def _references(plan: _Plan, case: Case, args: tuple) -> tuple:
    """(expected, expected64 or None); the op never sees ``args`` themselves (guarded copies), so a memo
    may keep them."""
    hit = plan.reuse.get(case) if plan.reuse is not None else None
    if hit:
        return hit[1:]
    expected = plan.reference(*map_tensors(args, clone))
    low = case.dtype is not None and case.dtype.is_floating_point and case.dtype != torch.float64
    expected64 = plan.reference(*map_tensors(args, upcast)) if low and case.kind == "values" else None
    if plan.reuse is not None:
        plan.reuse.put(case, plan.device, (args, expected, expected64))
    return expected, expected64


def _run_values(plan: _Plan, case: Case, args: tuple, use_out: bool) -> None:
    spec, device = plan.spec, plan.device
    try:
        expected, expected64 = _references(plan, case, args)
    except Exception as e:  # noqa: BLE001 - inputs the reference rejects: the op must reject them too
        return _expect_error(plan, case, args, e)
    strided = case.layout.startswith("strided")
    guards = {i: Guarded(a, strided, fill=a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    call_args = tuple(guards[i].view if i in guards else a for i, a in enumerate(args))
    kwargs, outs = {}, []
    if use_out:
        outs = [Guarded(t, strided) for t in flat_outputs(expected)]
        views = [o.view for o in outs]
        kwargs[spec.out_arg] = views[0] if not isinstance(expected, (tuple, list)) else tuple(views)
    poison_allocator(flat_outputs(expected), device)
    if spec.random:
        torch.manual_seed(case.seed)
    try:
        got = plan.op(*call_args, **kwargs)
        _sync(device)
    except Exception as e:  # noqa: BLE001 - report, do not crash the whole check
        return case.op_raised(e)
    _check_writes(case, spec, args, guards, outs)
    rtol, atol = plan.tol(case.dtype)
    results = [o.view for o in outs] if use_out else flat_outputs(got)
    exps, exps64 = flat_outputs(expected), flat_outputs(expected64) if expected64 is not None else None
    if len(results) != len(exps):
        return case.fail(f"the op returned {len(results)} outputs, the reference {len(exps)}")
    for k, (r, e) in enumerate(zip(results, exps)):
        name = f"{spec.out_arg}=" if use_out else "output" if len(exps) == 1 else f"output[{k}]"
        if spec.random:
            if check_meta(case, name, r, e):
                test_samples(case, r, args, spec, e)
        else:
            compare(case, name, r, e, exps64[k] if exps64 else None, rtol, atol, plan.limit)
        case.compared += e.numel() if isinstance(e, torch.Tensor) else 1
    returned = flat_outputs(got)[0] if use_out and got is not None and not spec.random else None
    if isinstance(returned, torch.Tensor) and returned.numel() and returned.data_ptr() == results[0].data_ptr():
        returned = None  # the out= tensor itself, compared above
    if returned is not None:
        compare(case, "returned value", returned, exps[0], None, rtol, atol, 1)


def _seeding_or_backward(plan: _Plan, new_case: Callable[..., Case], dtype: torch.dtype,
                         shapes: Sequence[Tuple[int, ...]], gradcheck: Optional[bool]) -> None:
    """After a dtype's trials: a random op's seeding case; else, for an op with ``grad_inputs``, its backward on up
    to three non-empty shapes (floating dtypes below float64, unless ``gradcheck=False``)."""
    spec = plan.spec
    nonempty = [s for s in shapes if math.prod(s) > 0]
    if spec.random and nonempty:
        shape = next((s for s in nonempty if math.prod(s) > 1), nonempty[0])
        case = new_case("seeding", dtype, shape, "contiguous", 0)
        _run_seeding(plan, case, plan.inputs(shape, dtype, case.seed))
    elif spec.grad_inputs and gradcheck is not False and dtype != torch.float64 and dtype.is_floating_point:
        for shape in nonempty[:3]:
            case = new_case("backward", dtype, shape, "contiguous", 0)
            _run_backward(plan, case, plan.inputs(shape, dtype, case.seed), spec.grad_inputs)


def _check_writes(case: Case, spec: Spec, args: tuple, guards: Dict[int, Guarded], outs: List[Guarded]) -> None:
    """Fail ``case`` where the op wrote outside its tensors, or into an input it does not declare it mutates."""
    for i, g in guards.items():
        msg = g.stray_writes(f"input {i}")
        if msg:
            case.fail(msg)
        if i not in spec.mutates:
            changed = (bits(g.view) != bits(args[i])).any(1).nonzero().flatten()
            if changed.numel():
                case.fail(f"input {i}: the op modified its input in place ({changed.numel()} elements, first at "
                          f"index {index(int(changed[0]), args[i].shape)}); declare Spec.mutates if intended")
    for k, o in enumerate(outs):
        msg = o.stray_writes(f"{spec.out_arg}= buffer {k}")
        if msg:
            case.fail(msg)


#: what torch raises for bad arguments (TORCH_CHECK -> RuntimeError, TORCH_CHECK_VALUE/_TYPE/_INDEX -> ValueError,
#: TypeError, IndexError): an op and its reference that both reject inputs must raise the same one of these
ARGUMENT_ERRORS = (ValueError, TypeError, IndexError, RuntimeError)
#: subclasses of those that are failures, not a rejection of the arguments (a missing kernel, a CUDA fault, ...)
NOT_ARGUMENT_ERRORS = tuple(getattr(torch, n) for n in ("OutOfMemoryError", "AcceleratorError") if hasattr(torch, n)) \
    + (NotImplementedError, RecursionError)


def argument_error_kind(e: BaseException) -> Optional[type]:
    """The argument-error family (one of :data:`ARGUMENT_ERRORS`) ``e`` belongs to, or None when it is not an
    argument error (AttributeError, NameError, ImportError, KeyError, AssertionError, ...: bugs, not rejections)."""
    if isinstance(e, NOT_ARGUMENT_ERRORS):
        return None
    return next((kind for kind in ARGUMENT_ERRORS if isinstance(e, kind)), None)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__} ({str(e).strip()[:200]})"


def _expect_error(plan: _Plan, case: Case, args: tuple, ref_error: Exception) -> None:
    """The reference rejected these inputs: the op must reject them too, with the same kind of argument error."""
    kind = argument_error_kind(ref_error)
    if kind is None:
        return case.fail(f"the reference raised {_error_text(ref_error)}: not an argument error "
                         f"({', '.join(k.__name__ for k in ARGUMENT_ERRORS)}), so a bug in the reference or in the "
                         f"spec's inputs, not a rejection of these inputs")
    try:
        plan.op(*args)
        _sync(plan.device)
    except Exception as e:  # noqa: BLE001 - compared with the reference's error below
        if argument_error_kind(e) is kind:
            case.messages.append(f"op and reference both rejected these inputs ({kind.__name__})")
            return
        return case.fail(f"the reference rejected these inputs with {_error_text(ref_error)} but the op raised "
                         f"{_error_text(e)}: both must raise the same kind of argument error")
    case.fail(f"the reference raised {_error_text(ref_error)} but the op returned a value: either the op must reject "
              f"these inputs too, or the reference (or the spec's shapes) must handle them")


def _run_seeding(plan: _Plan, case: Case, args: tuple) -> None:
    """Random ops: the same torch.manual_seed gives the same samples, successive calls new ones."""
    try:
        torch.manual_seed(case.seed)
        a = flat_outputs(plan.op(*args))[0]
        torch.manual_seed(case.seed)
        b = flat_outputs(plan.op(*args))[0]
        c = flat_outputs(plan.op(*args))[0]
        _sync(plan.device)
    except Exception as e:  # noqa: BLE001
        return case.op_raised(e)
    if not torch.equal(bits(a), bits(b)):
        case.fail("not reproducible: the same torch.manual_seed gave different samples")
    if a.numel() > 1 and torch.equal(bits(a), bits(c)):
        case.fail("two successive calls returned identical samples: the generator's offset is not advanced")


def _run_gradcheck(plan: _Plan, case: Case, args: tuple, grad_inputs: Sequence[int]) -> None:
    subsets = [tuple(grad_inputs)] + ([(i,) for i in grad_inputs] if len(grad_inputs) > 1 else [])
    for subset in subsets:
        inputs = tuple(a.detach().requires_grad_(i in subset) if i in grad_inputs else a
                       for i, a in enumerate(map_tensors(args, clone)))
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
        exp64 = grads(plan.reference, map_tensors(args, upcast)) if case.dtype != torch.float64 else None
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

InputsArg = Union[None, tuple, Callable[..., tuple]]


def _resolve(op, reference, spec: Optional[Spec], inputs: InputsArg, kernels_dir, device):
    """(op, reference, spec, device, fixed): a card name or Spec stands for its op (:func:`.target.resolve`);
    explicit inputs override the spec's generator. ``fixed`` says the inputs are given values (not a
    generator)."""
    target = resolve(op, spec=spec, kernels_dir=kernels_dir, device=device)
    op, spec = target.op, target.spec
    reference = reference if reference is not None else spec.reference if spec is not None else None
    if reference is None:
        raise TypeError("check: give a reference (or a spec/card name that has one)")
    check_inputs_arg(inputs, "check")
    fixed = isinstance(inputs, tuple)
    make = _fixed_inputs(tuple(inputs)) if fixed else inputs if callable(inputs) else \
        spec.make_inputs if spec is not None else None
    if make is None:
        raise TypeError("check: give inputs= (a tuple of args, or make_inputs(shape, dtype=, device=, generator=)) "
                        "or a spec")
    name = spec.name if spec is not None else getattr(op, "__name__", "op")
    spec = dataclasses.replace(spec, make_inputs=make) if spec is not None else \
        Spec(name=name, reference=reference, make_inputs=make)
    return op, reference, spec, target.device, fixed


def _fixed_inputs(given: tuple) -> Callable[..., tuple]:
    """make_inputs for given values: copies of them on the requested device, floats in the requested dtype."""
    def make(shape, dtype=None, device=None, generator=None):  # noqa: ARG001 - fixed values
        return map_tensors(given, lambda t: t.detach().to(device=device, dtype=dtype if t.is_floating_point()
                                                            and dtype is not None else t.dtype).clone())
    return make


def _check_arguments(trials, shapes, dtypes) -> None:
    if isinstance(trials, bool) or not isinstance(trials, numbers.Integral) or trials < 1:
        raise ValueError(f"check: trials: expected an integer >= 1, got {trials!r}")
    for name, given in (("shapes", shapes), ("dtypes", dtypes)):
        if given is not None:
            _nonempty(name, given, ())


def _sweep(spec: Spec, device, given: Optional[tuple], shapes, dtypes, trials: int):
    """(shapes, dtypes, trials) to run: those asked for, else the spec's; for ``given`` input values, their own
    shape and dtype, and at most 2 trials."""
    if given is not None:
        first = next((t for t in flat_outputs(given) if isinstance(t, torch.Tensor)), None)
        shapes = [tuple(first.shape) if first is not None else ()]
        dtypes = dtypes or [first.dtype if first is not None and first.is_floating_point() else None]
        trials = min(trials, 2)
    shapes = [tuple(s) for s in _nonempty("shapes", shapes, spec.shapes, spec.name)]
    return shapes, _nonempty("dtypes", dtypes, spec.dtypes_for(device), spec.name), trials


def _nonempty(name: str, given, default, spec_name: Optional[str] = None) -> list:
    """``given`` (``default`` when None) as a list; an empty one is refused: a check over it compares nothing."""
    values = list(given if given is not None else default)
    if not values:
        per_device = " for this device" if name == "dtypes" else ""
        source = f" (the spec {spec_name!r} lists none{per_device})" if given is None and spec_name else ""
        raise ValueError(f"check: {name}: expected at least one, got an empty list{source}")
    return values


def check(op, reference: Optional[Callable] = None, inputs: InputsArg = None, *, spec: Optional[Spec] = None,
          shapes: Optional[Sequence[Tuple[int, ...]]] = None, dtypes: Optional[Sequence[torch.dtype]] = None,
          device=None, trials: int = 5, seed: int = 0, rtol: Optional[float] = None, atol: Optional[float] = None,
          gradcheck: Optional[bool] = None, random: Optional[bool] = None, noncontiguous: Optional[bool] = None,
          large: bool = False, raise_on_fail: bool = False, max_mismatches: int = 5, contract: bool = True,
          kernels_dir=None, reuse: Optional[CaseMemo] = None, strict: bool = False) -> CheckResult:
    """Check ``op`` against ``reference``.

    ``op`` is a callable, a card name or a :class:`Spec`. Inputs come from ``inputs`` (a tuple of args or a
    ``make_inputs(shape, dtype=, device=, generator=)`` callable; anything else, a list of argument tuples
    included, is a TypeError), else ``spec.make_inputs``; ``shapes``, ``dtypes`` and tolerances default to
    the spec's. Trials alternate contiguous and strided (non-contiguous) inputs, and, where the spec names
    an ``out_arg``, returned and ``out=`` outputs (trials 1 and 2 of every 4: any two see both of each).

    Nothing vacuous passes: ``trials < 1`` and empty ``shapes``/``dtypes`` (given or the spec's) are a
    ValueError; a result that compared no output value (every shape empty, every input rejected) has
    ``status`` "nothing checked" and is not ``ok`` (``kernelkit check`` exits 1); inputs the reference
    rejects pass only when the op raises the same kind of argument error (:func:`argument_error_kind`).
    ``large=True`` adds the spec's > 2**31-element shapes (one trial, contiguous). ``gradcheck`` defaults
    to "the spec has grad_inputs"; ``random`` to ``spec.random`` (statistical checks instead of equality);
    ``noncontiguous`` to ``spec.noncontiguous`` (False: contiguous inputs only, for an op that refuses others).
    ``contract`` (default on) holds a torch custom op to its contract, once, on a small case of the first
    dtype (``contract.py``). A card name is searched in ``kernels_dir`` (KERNELKIT_PATH + the built-in cards).
    ``reuse``: a :class:`CaseMemo` shared by checks of several ops against one reference, inputs and seed.
    ``strict=True``: for an op that may cheat (``harness.strict``, docs/strict.md): the op runs in a process of its own."""
    t0 = time.perf_counter()
    _check_arguments(trials, shapes, dtypes)  # before a card is built
    if strict:
        from .strict import strict_check

        return strict_check(op, reference, inputs, spec=spec, shapes=shapes, dtypes=dtypes, device=device, trials=trials,
                            rtol=rtol, atol=atol, kernels_dir=kernels_dir, max_mismatches=max_mismatches,
                            raise_on_fail=raise_on_fail)
    op, reference, spec, device, fixed = _resolve(op, reference, spec, inputs, kernels_dir, device)
    overrides = {k: v for k, v in (("random", random), ("noncontiguous", noncontiguous)) if v is not None}
    spec = dataclasses.replace(spec, **overrides) if overrides else spec
    plan = _Plan(op, reference, spec, device, rtol, atol, max_mismatches, reuse)
    shapes, dtypes, trials = _sweep(spec, device, inputs if fixed else None, shapes, dtypes, trials)
    result = CheckResult(spec.name, str(device), [])

    def new_case(kind, dtype, shape, layout, trial, case_seed=None) -> Case:
        if case_seed is None:
            case_seed = _case_seed(seed, kind, str(dtype), shape, layout, trial)
        case = Case(kind, dtype, shape, layout, trial, case_seed)
        result.cases.append(case)
        return case

    for dtype in dtypes:
        if not _trials_of(plan, new_case, dtype, shapes, trials):
            result.notes.append("stopped after a CUDA error: the context is unusable")
            return _finish(result, t0, raise_on_fail)
        _seeding_or_backward(plan, new_case, dtype, shapes, gradcheck)
    contract_shape = _small_shape(shapes)
    if contract and dtypes and contract_shape is not None:
        _contract.check(plan, new_case, contract_shape, dtypes[0], _case_seed(seed, "contract"))
    if large:
        _large(plan, result, new_case, dtypes, shapes)
    _gradchecks(plan, result, new_case, shapes, gradcheck)
    return _finish(result, t0, raise_on_fail)


def _trials_of(plan: _Plan, new_case, dtype, shapes, trials: int) -> bool:
    """The value (or statistics) cases of one dtype; False when a CUDA error left the context unusable."""
    spec = plan.spec
    layouts = ["contiguous", "strided"] if spec.noncontiguous else ["contiguous"]
    for shape in shapes:
        for trial in range(trials):
            layout = layouts[trial % len(layouts)]
            use_out = spec.out_arg is not None and trial % 4 in (1, 2)
            case = new_case("stats" if spec.random else "values", dtype, shape, layout + (" out=" if use_out else ""),
                            trial)
            _run_values(plan, case, _case_inputs(plan, case), use_out)
            if _cuda_broken(case, plan.device):
                return False
    return True


def _small_shape(shapes) -> Optional[Tuple[int, ...]]:
    """The first shape of more than one element (else of one), None when every shape is empty."""
    nonempty = [s for s in shapes if math.prod(s) > 0]
    return next((s for s in nonempty if math.prod(s) > 1), nonempty[0] if nonempty else None)


def _gradchecks(plan: _Plan, result: CheckResult, new_case, shapes, gradcheck: Optional[bool]) -> None:
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
                args = tuple(Guarded(a, True, fill=a).view if isinstance(a, torch.Tensor) else a for a in args)
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
