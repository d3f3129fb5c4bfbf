"""The op contract: what a torch custom op promises besides its values.

Checked once per ``kernelkit.check`` on one small case, when the op reaches a torch custom op (one
registered outside aten/prim: a card's op, or ``torch.library.custom_op``):

- ``torch.library.opcheck`` on every custom op one call reaches: schema, autograd registration, fake
  kernel, dispatch (through aot_autograd with dynamic shapes), with inputs that require grad when the spec
  has ``grad_inputs``;
- one ``torch.compile(fullgraph=True)`` call compared with eager;
- on CUDA, a CUDA-graph capture (after warm-up on a side stream), replayed on new inputs, against eager;
- on CUDA, current-stream use: run under ``torch.cuda.stream(side)``, the result is ready when work queued
  after it on that stream runs, and the op does not wait for the default stream;
- an op without a backward (no ``Spec.grad_inputs``) refuses gradients rather than returning outputs
  whose gradients would silently be None.

Each broken promise is a failed case of kind "contract" whose message starts with the contract's name.
Random ops are compared under the same ``torch.manual_seed``.
"""
from __future__ import annotations

import contextlib
import types
import warnings
from typing import Any, Callable, Dict, Tuple

import torch

from .compare import clone, compare, flat_outputs, map_tensors
from .guard import poison_allocator

#: namespaces of torch's own ops: anything else reached by a call is a custom op
TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "rngprims", "higher_order", "profiler", "inductor"})

#: torch.library.opcheck's tests, by the contract each one checks
OPCHECK_CONTRACTS = {"test_schema": "schema", "test_autograd_registration": "autograd registration",
                     "test_faketensor": "fake kernel", "test_aot_dispatch_dynamic": "dispatch"}

STREAM_SPINS_MS = (50.0, 1000.0)  # default-stream spin; the longer one tells a slow op from a waiting one

Calls = Dict[Any, Tuple[tuple, dict]]  # custom OpOverload -> the args, kwargs of its first call


def custom_ops_called(op: Callable, args: tuple) -> Calls:
    """The custom ops (outside torch's namespaces) one call ``op(*args)`` reaches, each with the arguments
    of its first call, recorded below autograd by a dispatch mode (so a public wrapper's op is found)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found: Calls = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace not in TORCH_NAMESPACES and func not in found:
                found[func] = (args, kwargs)
            return func(*args, **kwargs)

    with Record():
        op(*args)
    return found


def check(plan, new_case: Callable, shape: tuple, dtype: torch.dtype, seed: int) -> None:
    """Every contract that applies to ``plan.op``, on inputs of ``shape`` and ``dtype``; one case each."""
    args = plan.inputs(shape, dtype, seed)
    grad_args = _requiring_grad(args, plan.spec.grad_inputs)
    try:
        calls = custom_ops_called(plan.op, grad_args if plan.spec.grad_inputs else args)
    except Exception:  # noqa: BLE001 - the op raising is reported by the value cases
        return
    if not calls:
        return  # not a torch custom op: no schema, fake kernel or registration to hold it to
    contract = lambda name: new_case("contract", dtype, shape, name, 0, seed)  # noqa: E731
    _opcheck(plan, contract, calls)
    if not plan.spec.grad_inputs:
        _no_backward(plan, contract("no backward"), args)
    _compile(plan, contract("torch.compile fullgraph"), args, seed)
    if plan.device.type == "cuda":
        with torch.cuda.device(plan.device):
            _cuda_graph(plan, contract("CUDA graph"), args, plan.inputs(shape, dtype, seed + 1), seed)
            _current_stream(plan, contract("current stream"), plan.inputs(shape, dtype, seed + 2), seed)


def _requiring_grad(args: tuple, grad_inputs) -> tuple:
    return tuple(clone(a).requires_grad_() if i in grad_inputs and isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(args))


def _first_line(e: BaseException, lines: int = 1) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: " + " ".join(t.strip() for t in text[:lines])


def _opcheck(plan, contract: Callable, calls: Calls) -> None:
    # A random op draws new numbers in each run that opcheck's dispatch test compares: left out for them.
    tests = [t for t in OPCHECK_CONTRACTS if not (plan.spec.random and t == "test_aot_dispatch_dynamic")]
    cases = {t: contract(OPCHECK_CONTRACTS[t]) for t in tests}
    for overload, (args, kwargs) in calls.items():
        args, kwargs = (map_tensors(x, lambda t: clone(t).requires_grad_(t.requires_grad)) for x in (args, kwargs))
        try:
            outcome = torch.library.opcheck(overload, args, kwargs, test_utils=tests, raise_exception=False)
        except Exception as e:  # noqa: BLE001 - opcheck itself refusing the op (e.g. not a custom op)
            cases["test_schema"].fail(f"schema: torch.library.opcheck({overload}) raised {_first_line(e, 3)}")
            continue
        for test, result in outcome.items():
            if isinstance(result, BaseException):
                hint = " (no fake kernel is registered: add one with torch.library.register_fake)" \
                    if type(result).__name__ == "UnsupportedOperatorException" else ""
                cases[test].fail(f"{OPCHECK_CONTRACTS[test]}: torch.library.opcheck({overload}) {test} failed: "
                                 f"{_first_line(result, 3)}{hint}")


def _no_backward(plan, case, args: tuple) -> None:
    """Without ``grad_inputs``, an op given inputs that require grad must raise, return outputs that do not
    require grad, or have a working backward: outputs whose backward is torch's "not implemented" fallback
    give None gradients (or a warning) silently."""
    floating = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not floating:
        return
    inputs = _requiring_grad(args, floating)
    try:
        outs = [o for o in flat_outputs(plan.op(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad]
    except Exception:  # noqa: BLE001 - refusing inputs that require grad is what it should do
        return
    if not outs:
        return
    wanted = [inputs[i] for i in floating]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            grads = torch.autograd.grad(sum(o.float().sum() for o in outs), wanted, allow_unused=True)
            broken = next((str(w.message) for w in caught if "autograd" in str(w.message).lower()), None)
            broken = broken or (None if all(g is not None for g in grads) else "some gradients came back None")
        except Exception as e:  # noqa: BLE001 - the backward itself refusing, after the forward accepted
            broken = _first_line(e, 2)
    if broken:
        first_sentence = broken.strip().splitlines()[0].split(". ")[0]
        case.fail(f"no backward: gradients are not refused: with inputs that require grad the op returned outputs "
                  f"that require grad, but it has no working backward ({first_sentence}); raise for such inputs "
                  f"in the forward, or register a backward and declare Spec.grad_inputs")
    else:
        case.messages.append("the op has a backward, but Spec.grad_inputs is empty: declare it to have it checked")


def _seeded(fn: Callable, args: tuple, seed: int, random: bool) -> Any:
    if random:
        torch.manual_seed(seed)
    out = fn(*args)
    if args and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()
    return out


def _same(plan, case, what: str, got: Any, expected: Any) -> None:
    """``got`` against eager's ``expected``, output by output, within the card's tolerance."""
    got, expected = flat_outputs(got), flat_outputs(expected)
    if len(got) != len(expected):
        return case.fail(f"{what}: {len(got)} outputs, eager gave {len(expected)}")
    before = len(case.messages)
    for k, (g, e) in enumerate(zip(got, expected)):
        rtol, atol = plan.tol(e.dtype if isinstance(e, torch.Tensor) else None)
        compare(case, f"output {k}", g, e, None, rtol, atol, 3)
    case.messages[before:] = [f"{what}: {m}" for m in case.messages[before:]]


def _compile(plan, case, args: tuple, seed: int) -> None:
    # backend="eager": Dynamo's trace runs the fake kernels and finds every graph break; Inductor would add
    # seconds of code generation per case and test Inductor rather than the op.
    compiled = torch.compile(_fresh_caller(plan.op), fullgraph=True, backend="eager")
    try:
        compiled(*args)  # compiles (for a random op, before its seeded run)
        got = _seeded(compiled, args, seed, plan.spec.random)
    except Exception as e:  # noqa: BLE001 - a graph break, or a fake kernel raising
        return case.fail(f"torch.compile fullgraph: {_first_line(e, 4)}")
    expected = _seeded(plan.op, args, seed, plan.spec.random)
    _same(plan, case, "torch.compile fullgraph: differs from eager", got, expected)


def _fresh_caller(op: Callable) -> Callable:
    """``lambda *args: op(*args)`` with a code object of its own, so Dynamo's per-code cache (and its
    recompile limit, past which fullgraph=True fails) starts empty for every check."""
    def call(*args):
        return op(*args)

    return types.FunctionType(call.__code__.replace(), call.__globals__, "call", None, call.__closure__)


def _cuda_graph(plan, case, args: tuple, fresh: tuple, seed: int) -> None:
    """Capture one call (after warm-up on a side stream, as torch's docs say), copy ``fresh`` inputs into
    the captured ones, replay: the result must equal eager's on ``fresh`` (a random op under one seed)."""
    device = plan.device
    static = map_tensors(args, clone)
    generator = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    saved = generator.clone_state()
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                plan.op(*static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = plan.op(*static)
    except Exception as e:  # noqa: BLE001 - a sync, a host read or a launch on another stream breaks capture
        with contextlib.suppress(Exception):  # a capture error is not sticky; anything worse shows later
            torch.cuda.synchronize(device)
        # a capture that failed midway leaves the default generator "capturing": every later random op of the
        # process would fail, so it gets back its state from before
        generator.graphsafe_set_state(saved)
        return case.fail(f"CUDA graph: capture failed: {_first_line(e, 3)}")
    for s, f in zip(static, fresh):
        if isinstance(s, torch.Tensor):
            s.copy_(f)
    if plan.spec.random:
        torch.manual_seed(seed)
    graph.replay()
    torch.cuda.synchronize(device)
    got = map_tensors(out, clone)
    expected = _seeded(plan.op, fresh, seed, plan.spec.random)
    _same(plan, case, "CUDA graph: a replay on new inputs differs from eager", got, expected)


def _current_stream(plan, case, args: tuple, seed: int) -> None:
    """Run the op under ``torch.cuda.stream(side)`` while the default stream is held busy by a GPU spin,
    and copy its result on ``side`` right after it. An op that launches on the current stream is done
    before the copy, long before the spin ends; one that launches on the default stream is queued behind
    the spin, so the copy sees poisoned memory; one that waits for the default stream (a device-wide or
    default-stream sync) returns only after the spin."""
    from .timing import spin_cycles_per_us

    device = plan.device
    expected = map_tensors(_seeded(plan.op, args, seed, plan.spec.random), clone)
    default = torch.cuda.default_stream(device)
    side = torch.cuda.Stream(device)
    for spin_ms in STREAM_SPINS_MS:
        torch.cuda.synchronize(device)
        for stream in (side, default):  # neither stream's pool may hand out a block holding eager's result
            with torch.cuda.stream(stream):
                poison_allocator(flat_outputs(expected), device)
        with torch.cuda.stream(default):
            torch.cuda._sleep(int(spin_ms * 1e3 * spin_cycles_per_us(device)))
        try:
            with torch.cuda.stream(side):
                if plan.spec.random:
                    torch.manual_seed(seed)
                snapshot = map_tensors(plan.op(*args), clone)
                done = side.record_event()
            done.synchronize()
            spinning = not default.query()
        except Exception as e:  # noqa: BLE001
            torch.cuda.synchronize(device)
            return case.fail(f"current stream: the op raised under torch.cuda.stream(side): {_first_line(e)}")
        torch.cuda.synchronize(device)
        if spinning:
            break
    else:
        return case.fail(f"current stream: the op, run on a side stream, returned only after a {spin_ms:.0f} ms "
                         "spin on the default stream ended: it waits for the default stream (a device-wide or "
                         "default-stream synchronisation in its launcher?)")
    _same(plan, case, "current stream: under torch.cuda.stream(side) the result was not ready when the next "
                      "work on that stream ran (the op launched on another stream, e.g. the default one)",
          snapshot, expected)
