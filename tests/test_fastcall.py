"""kernelkit.fastcall: the eager call path of kernelkit.ops must behave exactly like torch.ops."""
import sys
import threading
import time

import numpy as np
import pytest
import torch

import kernelkit
from kernelkit.jit import fastcall

PROBE_CPP = r"""
#include <chrono>
#include <thread>

// Returns what arrived, so a test can compare the fast path with torch.ops argument by argument.
std::tuple<at::Tensor, at::Tensor> probe(const at::Tensor& x, const std::optional<at::Tensor>& y, int64_t n,
                                         double f, bool flag, const at::Scalar& s,
                                         std::optional<at::Generator> generator) {
  TORCH_CHECK(n >= 0, "probe: n must be >= 0, got ", n);
  const bool gen = generator.has_value() && generator->defined();
  at::Tensor summary = at::tensor({double(n), f, flag ? 1.0 : 0.0, s.toDouble(), y.has_value() ? 1.0 : 0.0,
                                   s.isIntegral(false) ? 1.0 : 0.0, s.isBoolean() ? 1.0 : 0.0, gen ? 1.0 : 0.0},
                                  at::kDouble);
  at::Tensor out = y.has_value() ? x + *y : x.clone();
  if (gen) out = out + at::rand(x.sizes(), generator, x.options());
  return {out * n, summary};
}

void bump(const at::Tensor& x) { x.add_(1); }

at::Tensor nap(const at::Tensor& x, int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return x.clone();
}

at::Tensor pick(const at::Tensor& x, at::IntArrayRef dims) { return x.sum(dims); }

KERNELKIT_LIBRARY(m) {
  m.def("probe(Tensor x, Tensor? y, int n, float f=0.5, bool flag=False, Scalar s=2, *, "
        "Generator? generator=None) -> (Tensor, Tensor)");
  m.def("bump(Tensor(a!) x) -> ()");
  m.def("nap(Tensor x, int ms) -> Tensor");
  m.def("pick(Tensor x, int[] dims) -> Tensor");
  m.impl("probe", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(probe)));
  m.impl("bump", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(bump)));
  m.impl("nap", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(nap)));
  m.impl("pick", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(pick)));
}
"""


@pytest.fixture(scope="module")
def probe_lib():
    if fastcall.module() is None:
        pytest.fail(f"the fast call module did not build: {fastcall.error()}")
    return kernelkit.load_inline("fastcall_probe", cpp=PROBE_CPP)


def both(lib, op):
    ov = getattr(lib.ops, op).default
    fast = fastcall.wrap(ov)
    assert type(fast).__name__ == "FastOp", fast
    return fast, ov._op


def outcome(fn, *args, **kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the comparison is the test
        return type(e), str(e)


def assert_same(fast_result, slow_result):
    (kind_f, val_f), (kind_s, val_s) = fast_result, slow_result
    assert kind_f == kind_s, (fast_result, slow_result)
    if kind_f != "ok":
        assert val_f == val_s
        return
    assert type(val_f) is type(val_s)
    for a, b in zip(val_f, val_s):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=0)


X, Y = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)

# case -> (args, kwargs, whether the fast path converts it itself rather than handing it to torch.ops)
CALLS = {
    "positional": ((X, Y, 3, 0.25, True, 1.5), {}, True),
    "defaults": ((X, None, 2), {}, True),
    "keywords": ((X,), {"y": Y, "n": 4, "s": 7, "flag": True}, True),
    "int as float": ((X, Y, 1, 3), {}, True),
    "bool scalar": ((X, Y, 1), {"s": True}, True),
    "parameter": ((torch.nn.Parameter(X), Y, 1), {}, True),
    "kernel's own error": ((X, Y, -1), {}, True),
    "numpy int (torch decides)": ((X, Y, np.int64(2)), {}, False),
    "bool as int (torch decides)": ((X, Y, True), {}, False),
    "str as int": ((X, Y, "2"), {}, False),
    "list as tensor": (([1.0, 2.0], Y, 1), {}, False),
    "huge int": ((X, Y, 2**70), {}, False),
    "missing argument": ((X,), {}, False),
    "unknown keyword": ((X, Y, 1), {"z": 1}, False),
    "keyword-only given positionally": ((X, Y, 1, 0.5, False, 2, None), {}, False),
    "argument twice": ((X, Y, 1), {"n": 2}, False),
}


@pytest.mark.parametrize("case", list(CALLS))
def test_same_results_and_errors_as_torch_ops(probe_lib, case):
    fast, slow = both(probe_lib, "probe")
    args, kwargs, converted = CALLS[case]
    assert_same(outcome(fast, *args, **kwargs), outcome(slow, *args, **kwargs))
    handed_over = []

    def spy(*a, **k):
        handed_over.append(case)
        return slow(*a, **k)

    schema = probe_lib.ops.probe.default._schema
    spied = fastcall.module().make(schema.name, schema.overload_name, spy)
    assert_same(outcome(spied, *args, **kwargs), outcome(slow, *args, **kwargs))
    assert bool(handed_over) != converted, "handed to torch.ops" if handed_over else "converted by the fast path"


def test_kernel_error_is_torch_runtime_error(probe_lib):
    fast, _ = both(probe_lib, "probe")
    with pytest.raises(RuntimeError, match="probe: n must be >= 0, got -1"):
        fast(X, Y, -1)


def test_generator_is_passed(probe_lib):
    fast, slow = both(probe_lib, "probe")
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, sa = fast(X, None, 1, generator=g1)
    b, sb = slow(X, None, 1, generator=g2)
    assert sa[-1] == 1
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, X)
    assert torch.equal(g1.get_state(), g2.get_state())


def test_in_place_op_without_returns(probe_lib):
    fast, _ = both(probe_lib, "bump")
    x = torch.zeros(4)
    assert fast(x) is None
    assert torch.equal(x, torch.ones(4))


def test_references_are_not_leaked(probe_lib):
    fast, _ = both(probe_lib, "probe")
    x, y = torch.randn(4), torch.randn(4)
    before = sys.getrefcount(x), sys.getrefcount(y)
    for _ in range(1000):
        fast(x, y, 1)
        outcome(fast, x, y, -1)  # the error path too
    assert (sys.getrefcount(x), sys.getrefcount(y)) == before


def test_gil_released_while_the_kernel_runs(probe_lib):
    fast, _ = both(probe_lib, "nap")
    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        time.sleep(0.02)
        start = ticks[0]
        fast(torch.zeros(1), 300)
        during = ticks[0] - start
    finally:
        stop.set()
        t.join()
    assert during > 20, f"another Python thread ran only {during} times during a 300 ms op"


def test_unsupported_schema_keeps_the_torch_ops_callable(probe_lib):
    ov = probe_lib.ops.pick.default
    assert fastcall.wrap(ov) is ov._op


def test_tensor_subclass_sees_torch_function(probe_lib):
    fast, _ = both(probe_lib, "probe")
    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    fast(X.as_subclass(Logged), None, 1)
    assert probe_lib.ops.probe.default in seen


def test_torch_function_mode_sees_call(probe_lib):
    from torch.overrides import TorchFunctionMode

    fast, _ = both(probe_lib, "probe")
    seen = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Mode():
        fast(X, None, 1)
    assert probe_lib.ops.probe.default in seen


@pytest.mark.cuda_build  # the built-in cards have device code (their CPU ops still need it to build)
def test_dispatch_modes_and_autograd_apply():
    """Past the argument conversion it is the dispatcher's path: FakeTensorMode, make_fx and autograd
    (kernelkit.ops.elementwise_mul's is registered from Python) see the call."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    a = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    kernelkit.ops.elementwise_mul(a, b)  # binds the card
    assert fastcall.module() is not None  # loaded, and kernelkit.ops rebound to it
    assert type(kernelkit.ops._FAST["elementwise_mul"]["elementwise_mul"]).__name__ == "FastOp"
    assert torch.autograd.gradcheck(kernelkit.ops.elementwise_mul, (a, b))
    with FakeTensorMode() as mode:
        fa = mode.from_tensor(torch.randn(2, 3))
        r = kernelkit.ops.sigmoid(fa)
    assert type(r).__name__ == "FakeTensor" and r.shape == (2, 3)
    gm = make_fx(lambda x: kernelkit.ops.sigmoid(x) * 2)(torch.randn(5))
    assert "sigmoid" in gm.code


@pytest.mark.cuda_build
def test_ops_start_on_torch_ops_and_switch_when_the_module_is_loaded(monkeypatch):
    """Binding never waits for the module: kernelkit.ops uses the torch.ops callable while the module is
    built or loaded in the background, and is rebound to the fast path once it is (on_ready)."""
    from kernelkit import ops

    assert fastcall.module() is not None
    x = torch.randn(6, dtype=torch.float64)
    ops.sigmoid(x)
    lib = kernelkit.library("sigmoid")
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "tried": False, "error": None, "thread": None})
    with fastcall._LOCK:  # the background load waits here
        kernelkit.jit.registry.bind(lib)
        assert ops._FAST["sigmoid"]["sigmoid"] is lib.ops.sigmoid.default._op
        torch.testing.assert_close(ops.sigmoid(x), torch.sigmoid(x))
        assert fastcall._STATE["thread"] is not None
    fastcall._STATE["thread"].join(60)
    assert fastcall._STATE["module"] is not None, fastcall.error()
    assert type(ops._FAST["sigmoid"]["sigmoid"]).__name__ == "FastOp"
    torch.testing.assert_close(ops.sigmoid(x), torch.sigmoid(x))


def test_disabled_by_environment(probe_lib, monkeypatch):
    monkeypatch.setenv("KERNELKIT_FASTCALL", "0")
    ov = probe_lib.ops.probe.default
    assert fastcall.wrap(ov) is ov._op


def test_build_failure_falls_back_to_torch_ops(probe_lib, monkeypatch, tmp_path, caplog):
    bad = tmp_path / "fastcall.cpp"
    bad.write_text("#include <Python.h>\nthis is not C++;\n")
    monkeypatch.setattr(fastcall, "SOURCE", bad)
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "tried": False, "error": None, "thread": None})
    ov = probe_lib.ops.probe.default
    with caplog.at_level("WARNING", logger="kernelkit"):
        assert fastcall.module() is None
    assert fastcall.wrap(ov) is ov._op
    assert "BuildError" in fastcall.error()
    assert "fast op call path is unavailable" in caplog.text


# ------------------------------------------------------------------ when the background build starts

@pytest.fixture
def background(monkeypatch):
    """A fresh fast call state with module() replaced by a spy: ``run(cpus, ready_made)`` starts
    start()'s thread, waits for it and returns how often module() was called."""
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "tried": False, "error": None, "thread": None})
    monkeypatch.setenv("KERNELKIT_VERBOSE", "1")
    calls = []
    monkeypatch.setattr(fastcall, "module", lambda: calls.append(1))

    def run(cpus, ready_made):
        monkeypatch.setattr(fastcall.os, "cpu_count", lambda: cpus)
        monkeypatch.setattr(fastcall, "ready_made", lambda t: ready_made)
        fastcall.start()
        fastcall.start()  # a second op asking starts nothing more
        fastcall._STATE["thread"].join(30)
        return len(calls)

    return run


ANNOUNCEMENT = "building kernelkit's fast call module in the background"


def test_no_background_build_on_a_small_machine(background, monkeypatch, capsys):
    monkeypatch.delenv("KERNELKIT_FASTCALL", raising=False)
    assert background(cpus=2, ready_made=False) == 0
    assert ANNOUNCEMENT not in capsys.readouterr().err


def test_background_build_asked_for_on_a_small_machine(background, monkeypatch, capsys):
    monkeypatch.setenv("KERNELKIT_FASTCALL", "1")
    assert background(cpus=2, ready_made=False) == 1
    assert capsys.readouterr().err.count(ANNOUNCEMENT) == 1


def test_background_build_on_a_big_machine(background, monkeypatch, capsys):
    monkeypatch.delenv("KERNELKIT_FASTCALL", raising=False)
    assert background(cpus=fastcall.MIN_BUILD_CPUS, ready_made=False) == 1
    assert capsys.readouterr().err.count(ANNOUNCEMENT) == 1


def test_a_cached_module_is_loaded_on_a_small_machine_without_announcement(background, monkeypatch, capsys):
    monkeypatch.delenv("KERNELKIT_FASTCALL", raising=False)
    assert background(cpus=1, ready_made=True) == 1
    assert ANNOUNCEMENT not in capsys.readouterr().err


def test_disabled_starts_no_thread(monkeypatch):
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "tried": False, "error": None, "thread": None})
    monkeypatch.setenv("KERNELKIT_FASTCALL", "0")
    fastcall.start()
    assert fastcall._STATE["thread"] is None and fastcall.module() is None
