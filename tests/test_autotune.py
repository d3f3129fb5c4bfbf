"""kernelkit.autotune on the CPU: the space and its constraint, wrong configurations rejected before any timing,
pruning, failures reported, the winner stored per device, dtype and shape bucket and taken without tuning.
A fake timer stands in where a test needs exact times; one test times real CPU ops."""
import subprocess
import sys
import threading
import time
import types

import pytest
import torch

import kernelkit
from kernelkit.frontends import scaffold
from kernelkit.harness import tune
from kernelkit.harness.timing import Timing


def make_inputs(shape, dtype=None, device=None, generator=None):
    return (torch.randn(shape, dtype=dtype, device=device, generator=generator),)


def reference(x):
    return x * 2


def _fake_timing(us: float) -> Timing:
    """Nine samples around ``us`` (a little spread, so that paired ratios have an interval)."""
    return Timing.from_samples([us * (1 + 0.01 * (i % 3)) for i in range(9)], "fake")


class Kernels:
    """A family of "kernels" by configuration: ``block`` decides the (fake) speed; ``tail=False`` skips the
    last odd element, as a kernel without a bounds check would: wrong, but fastest."""

    def __init__(self):
        self.built = []
        self.called = []

    def make(self, config):
        self.built.append(config)
        if config["block"] == 0:
            raise RuntimeError("too many resources requested for launch\nsecond line")

        def op(x):
            self.called.append(config)
            if config.get("launch_fails"):
                raise RuntimeError("launching scale2 failed: too many resources requested for launch")
            y = x * 2
            if not config.get("tail", True) and x.shape[0] % 2:
                y[-1] = 0
            return y
        return op

    def timer(self, cost):
        """A timer giving each configuration ``cost(config)`` microseconds, with a little spread."""
        def timed(fns, budget_ms):
            out = {}
            for name, fn in fns.items():
                self.called.clear()
                fn()
                us = self.cost_of_last_call(cost)
                out[name] = _fake_timing(us)
            return out
        return timed

    def cost_of_last_call(self, cost):
        return cost(self.called[-1])


def _tune(kernels, space, cost, **kw):
    kw.setdefault("name", "scale2")
    return tune.autotune(kernels.make, space, reference=reference, inputs=make_inputs, shape=(1000,),
                         device="cpu", timer=kernels.timer(cost), **kw)


def test_configurations_and_constraint():
    space = {"block": [64, 128, 256], "vec": [1, 4]}
    assert len(tune.configurations(space)) == 6
    kept = tune.configurations(space, lambda c: c["block"] * c["vec"] <= 256)
    assert {(c["block"], c["vec"]) for c in kept} == {(64, 1), (128, 1), (256, 1), (64, 4)}
    with pytest.raises(ValueError, match="rejects all 6"):
        tune.configurations(space, lambda c: False)
    for bad in ({}, {"block": []}, {"block": "128"}, [("block", [1])]):
        with pytest.raises(ValueError, match="space"):
            tune.configurations(bad)


@pytest.mark.parametrize("shape, bucket", [((1,), 1), ((1000,), 1024), ((1024, 3), 1024), ((1025,), 2048), ((), 1)])
def test_shape_bucket(shape, bucket):
    assert tune.shape_bucket(shape) == bucket


def test_a_wrong_configuration_is_never_chosen_however_fast():
    k = Kernels()
    space = {"block": [128, 256], "tail": [True, False]}
    result = _tune(k, space, lambda c: 1.0 if not c["tail"] else c["block"] / 100, store=False)
    assert result.best == {"block": 128, "tail": True}
    wrong = [c for c in result.candidates if c.status == "wrong"]
    assert len(wrong) == 2 and all(not c.config["tail"] and c.timing is None for c in wrong)
    assert "values" in wrong[0].reason  # the failing case, named


def test_pruning_failures_and_the_table():
    k = Kernels()
    space = {"block": [0, 64, 128, 256, 512]}
    result = _tune(k, space, lambda c: {64: 10.0, 128: 4.0, 256: 4.4, 512: 50.0}[c["block"]], store=False)
    status = {c.config["block"]: c.status for c in result.candidates}
    assert status == {0: "failed", 64: "pruned", 128: "best", 256: "ok", 512: "pruned"}
    failed = next(c for c in result.candidates if c.status == "failed")
    assert failed.reason == "build: RuntimeError: too many resources requested for launch"
    ok = next(c for c in result.candidates if c.status == "ok")
    assert ok.vs_best.median == pytest.approx(1.1, rel=0.02) and ok.vs_best.lo > 1  # the best is faster, surely
    table = result.table()
    assert "best block=128" in table and "pruned" in table and "too many resources" in table


def test_a_launch_that_fails_is_a_failure_not_a_wrong_value_and_the_phases_are_timed():
    k = Kernels()
    result = _tune(k, {"block": [64, 128], "launch_fails": [False, True]}, lambda c: c["block"] / 100, store=False)
    failed = [c for c in result.candidates if c.status == "failed"]
    assert [c.config["launch_fails"] for c in failed] == [True, True]
    assert "the op raised RuntimeError: launching scale2 failed: too many resources" in failed[0].reason
    assert result.best == {"block": 64, "launch_fails": False}
    assert set(result.phases) == {"build", "check", "time"} and all(t >= 0 for t in result.phases.values())
    assert "build " in result.table().splitlines()[0]


def test_the_plot_draws_every_timed_configuration_and_names_the_untimed(tmp_path):
    pytest.importorskip("matplotlib")
    k = Kernels()
    result = _tune(k, {"block": [0, 64, 128, 256, 512]},
                   lambda c: {64: 10.0, 128: 4.0, 256: 4.4, 512: 50.0}[c["block"]], store=False)
    fig = result.plot(tmp_path / "tune.png")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["block=128 (best)", "block=256 (ok)", "block=64 (pruned)", "block=512 (pruned)"]
    # the fake timer's medians (cost x 1.01), fastest first
    assert [p.get_width() for p in ax.patches] == pytest.approx([4.04, 4.444, 10.1, 50.5])
    assert "not timed: block=0 (failed)" in ax.get_title()
    assert (tmp_path / "tune.png").stat().st_size > 1000


def test_no_passing_configuration_is_an_error_listing_why():
    k = Kernels()
    with pytest.raises(ValueError, match="no configuration passed") as e:
        _tune(k, {"block": [0, 64], "tail": [False]}, lambda c: 1.0, store=False)
    assert "block=0, tail=False: failed: build: RuntimeError" in str(e.value)
    assert "block=64, tail=False: wrong" in str(e.value)


def test_the_winner_is_stored_per_bucket_and_taken_without_tuning():
    space = {"block": [128, 256]}
    first = Kernels()
    tuned = _tune(first, space, lambda c: c["block"] / 100, name="kk_stored", source="v1")
    assert not tuned.from_cache and tuned.best == {"block": 128}
    again = Kernels()
    taken = _tune(again, space, lambda c: 1.0, name="kk_stored", source="v1")
    assert taken.from_cache and taken.best == {"block": 128} and again.built == []  # nothing built or timed
    assert tune.stored("kk_stored", "v1", (700,), device="cpu") == {"block": 128}  # same bucket: 1024
    assert tune.stored("kk_stored", "v1", (5000,), device="cpu") is None
    assert tune.stored("kk_stored", "v2", (1000,), device="cpu") is None  # another source
    assert tune.stored("kk_stored", "v1", (1000,), dtype=torch.float64, device="cpu") is None
    listed = subprocess.run([sys.executable, "-m", "kernelkit", "cache", "tuned"], capture_output=True, text=True,
                            check=True).stdout
    assert "kk_stored" in listed and "block=128" in listed and "bucket 1024" in listed
    for kw in ({"retune": True}, {"space": {"block": [64, 512]}}):  # asked again, or the winner left the space
        k = Kernels()
        result = _tune(k, kw.pop("space", space), lambda c: 1000.0 / c["block"], name="kk_stored", source="v1", **kw)
        assert not result.from_cache and k.built


def test_across_shapes_says_how_much_of_the_gain_survives():
    """block=128 wins at 1000 elements; at 5000 block=256 wins and block=128 takes 1.5x its time."""
    k = Kernels()
    sizes = {}

    def make_sized(config):
        op = k.make(config)
        return lambda x: (sizes.__setitem__("n", x.shape[0]), op(x))[1]

    def cost(c):
        return (c["block"] / 100) if sizes["n"] < 2000 else {128: 3.0, 256: 2.0}[c["block"]]

    result = tune.across(make_sized, {"block": [128, 256]}, [(1000,), (5000,)], reference=reference,
                         inputs=make_inputs, name="kk_across", device="cpu", timer=k.timer(cost), store=False)
    assert [r.best for r in result.results] == [{"block": 128}, {"block": 256}]
    assert result.carried[0].startswith("1.000x") and result.carried[1].startswith("1.500x")
    assert "block=128 there" in result.table()


def test_real_cpu_timing_picks_the_faster_configuration():
    def make(config):
        def op(x):
            time.sleep(config["delay_ms"] / 1000)
            return x * 2
        return op

    result = kernelkit.autotune(make, {"delay_ms": [3.0, 0.0]}, reference=reference, inputs=make_inputs, shape=(64,),
                                name="kk_sleep", device="cpu", budget_ms=60, store=False)
    assert result.best == {"delay_ms": 0.0}
    slow = next(c for c in result.candidates if c.config["delay_ms"] == 3.0)
    # a sleep never returns early, while a loaded 2-core CI box stretches the fast one's tail (lo 7.9 there)
    assert slow.timing.median_us >= 3000 and slow.vs_best.lo > 2


ROWSUM = r'''
extern "C" __global__ void rowsum(const float* x, float* y, int rows, int cols) {
  // one block per row; ITEMS consecutive elements per thread step (TAIL 0: the row's tail is skipped)
  __shared__ float part[BLOCK];
  const float* r = x + (long long)blockIdx.x * cols;
  float acc = 0.f;
  for (int c = threadIdx.x * ITEMS; c < cols; c += BLOCK * ITEMS)
    for (int k = 0; k < ITEMS; ++k)
      if (TAIL ? c + k < cols : c + ITEMS <= cols) acc += r[c + k];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = BLOCK / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) y[blockIdx.x] = part[0];
}
'''


@pytest.mark.gpu
def test_gpu_tuning_an_instant_kernel_and_a_second_process_takes_the_winner(tmp_path):
    """A real NVRTC space (block size, items per thread, with and without the tail): every configuration without
    the tail is rejected on odd sizes, the winner is stored, and another process finds it without tuning."""
    def make(config):
        mod = kernelkit.load_kernels(ROWSUM, name=f"kk_rowsum_{config['BLOCK']}_{config['ITEMS']}_{config['TAIL']}",
                                     options=[f"-D{k}={v}" for k, v in config.items()])

        def op(x):
            x = x.contiguous()  # the kernel walks rows of a dense matrix
            y = torch.empty(x.shape[0], device=x.device)
            mod.rowsum[x.shape[0], config["BLOCK"]](x, y, x.shape[0], x.shape[1])
            return y
        return op

    def inputs(shape, dtype=None, device=None, generator=None):
        return (torch.randn(shape, dtype=dtype, device=device, generator=generator),)

    space = {"BLOCK": [64, 128, 256], "ITEMS": [1, 4], "TAIL": [1, 0]}
    result = kernelkit.autotune(make, space, reference=lambda x: x.sum(dim=1), inputs=inputs, shape=(2048, 4099),
                                check_shapes=[(64, 4099), (33, 1001)], name="kk_rowsum", source=ROWSUM,
                                device="cuda", rtol=1e-4, atol=1e-3)
    statuses = {tuple(c.config.values()): c.status for c in result.candidates}
    assert all(s == "wrong" for (b, items, tail), s in statuses.items() if tail == 0 and items == 4), statuses
    assert result.best["TAIL"] == 1 or result.best["ITEMS"] == 1
    code = (f"import torch; from kernelkit.harness import tune; "
            f"print(tune.stored('kk_rowsum', {ROWSUM!r}, (2048, 4099), device='cuda'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(result.best)


class Sized(Kernels):
    """Kernels whose fake speed depends on the call's size too, so that buckets have different winners."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def make(self, config):
        op = super().make(config)

        def sized(x):
            self.sizes.append(x.shape[0])
            return op(x)
        return sized

    def cost_of_last_call(self, cost):
        return cost(self.called[-1], self.sizes[-1])


def _tuned_op(kernels, cost):
    return tune.tuned(kernels.make, {"block": [64, 256], "tail": [True, False]}, name="scale2_tuned",
                      reference=reference, inputs=make_inputs, timer=kernels.timer(cost))


def test_a_tuned_op_runs_each_buckets_winner_and_a_new_one_recalls_them_without_timing():
    def cost(config, size):  # block 64 wins below 2000 elements, 256 above; tail=False is fastest, and wrong
        return (1 if (config["block"] == 64) == (size < 2000) else 2) * (1 if config["tail"] else 0.5)

    k = Sized()
    op = _tuned_op(k, cost)
    small, large = torch.randn(1000), torch.randn(3000)
    assert torch.equal(op(small), small * 2)
    assert k.called[-1] == {"block": 64, "tail": True} and len(k.built) == 5  # 4 configurations + the winner's op
    k.built.clear()
    odd = torch.randn(1023)
    assert torch.equal(op(odd), odd * 2)
    assert k.built == [] and k.called[-1] == {"block": 64, "tail": True}  # same bucket (1024): no tuning
    assert torch.equal(op(large), large * 2)
    assert k.called[-1] == {"block": 256, "tail": True}  # bucket 4096 has its own winner
    assert op.config(large) == {"block": 256, "tail": True} and op.config(small) == {"block": 64, "tail": True}
    assert all(c.status == "wrong" for r in op.results.values() for c in r.candidates if not c.config["tail"])
    again = Sized()
    fresh = _tuned_op(again, lambda config, size: pytest.fail("a stored winner is not timed again"))
    assert torch.equal(fresh(large), large * 2) and again.built == [{"block": 256, "tail": True}]
    assert all(r.from_cache for r in fresh.results.values())


def test_a_bucket_where_nothing_passes_raises_on_every_call_without_tuning_again():
    k = Kernels()
    op = tune.tuned(k.make, {"block": [64, 256], "tail": [False]}, name="scale2_wrong", reference=reference,
                    inputs=make_inputs, timer=k.timer(lambda c: 1.0))
    x = torch.randn(1001)
    with pytest.raises(ValueError, match="no configuration passed its check"):
        op(x)
    built = list(k.built)
    assert len(built) == 2
    with pytest.raises(ValueError, match="(?s)no configuration passed its check.*tuned at an earlier call"):
        op(torch.randn(1003))  # the same bucket
    assert k.built == built


def test_a_tuned_op_refuses_what_it_cannot_pick_by():
    k = Kernels()
    op = tune.tuned(k.make, {"block": [64]}, name="scale2_tuned", reference=reference, inputs=make_inputs)
    with pytest.raises(TypeError, match="scale2_tuned: expected a tensor among the positional arguments .*got int, float"):
        op(3, 1.5)
    with pytest.raises(TypeError, match="shape: taken from each call"):
        tune.tuned(k.make, {"block": [64]}, name="x", reference=reference, inputs=make_inputs, shape=(4,))
    with pytest.raises(ValueError, match="space"):
        tune.tuned(k.make, {"block": []}, name="x", reference=reference, inputs=make_inputs)
    assert k.built == []


@pytest.mark.cuda_build
def test_a_cards_space_builds_only_its_cu_and_never_picks_a_wrong_configuration(tmp_path):
    """A card from ``kernelkit new`` with two parameters in ``Spec.tune``, as -D flags of its .cu (which here also
    compiles the CPU loop, so that the parameters reach the CPU op): the binding is built once, every
    configuration's .cu once, WRONG_BIAS=1 is rejected by the check, and the winner is stored for the card's
    content (an edit of the card tunes again)."""
    files = scaffold.card_files("kk_tuned", "unary")
    math = files["kk_tuned_math.h"].replace("KK_MATH_FN", "KK_HD")
    cu, py = tmp_path / "kk_tuned.cu", tmp_path / "kk_tuned.py"
    cu.write_text("#ifndef WRONG_BIAS\n#define WRONG_BIAS 0\n#endif\n#include <kernelkit/elementwise.cuh>\n" +
                  math[math.index("namespace kk {"):].replace(
                      "return x * x;", "return x * x + (A)(WRONG_BIAS) + (A)(UNUSED - 1) * (A)(1e-7);") +
                  "KK_UNARY_LAUNCHER(kk::KkTunedOp);\n")
    (tmp_path / "kk_tuned.h").write_text(files["kk_tuned.h"])
    spec = files["kk_tuned.py"]
    py.write_text(spec.replace(spec[spec.index(",\n                      sources="):spec.index(")  # EDIT: shapes")],
                               ', tune={"WRONG_BIAS": [0, 1], "UNUSED": [1, 2]}'))
    before = kernelkit.STATS["compiles"]
    result = kernelkit.autotune("kk_tuned", kernels_dir=tmp_path, shape=(4096,), device="cpu", budget_ms=40)
    assert kernelkit.STATS["compiles"] - before == 5, (dict(kernelkit.STATS), result.table())  # binding + 4 .cu
    assert result.best["WRONG_BIAS"] == 0
    assert sorted(c.status for c in result.candidates if c.config["WRONG_BIAS"] == 1) == ["wrong", "wrong"]
    _assert_ops_run_the_winner("kk_tuned", tmp_path, result.best)  # not the last configuration built (a wrong one)
    again = kernelkit.autotune("kk_tuned", kernels_dir=tmp_path, shape=(4096,), device="cpu")
    assert again.from_cache and again.best == result.best
    _assert_ops_run_the_winner("kk_tuned", tmp_path, result.best)
    _assert_ops_run_each_buckets_winner(tmp_path, result.best, before)
    cli = subprocess.run([sys.executable, "-m", "kernelkit", "tune", "kk_tuned", "--kernels-dir", str(tmp_path),
                          "--device", "cpu", "--size", "4096"], capture_output=True, text=True)
    assert cli.returncode == 0 and "stored earlier" in cli.stdout and "WRONG_BIAS=0" in cli.stdout, cli.stderr
    py.write_text(py.read_text() + "\n# an edit\n")
    assert tune.stored("kk_tuned", tune._Card("kk_tuned", tmp_path).source, (4096,), device="cpu") is None


def _assert_ops_run_the_winner(card, kernels_dir, best):
    from kernelkit.jit import registry

    options = registry.latest(card)._options
    assert options["extra_cuda_cflags"] == [f"-D{k}={v}" for k, v in best.items()], options
    spec = tune._Card(card, kernels_dir).spec
    args = spec.make_inputs((1000,), dtype=torch.float32, device="cpu", generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(getattr(kernelkit.ops, card)(*args), spec.reference(*args))


def _favouring(config, space):
    """A fake timer under which ``config`` is the fastest of the space."""
    index = str(tune.configurations(space).index(config))
    return lambda fns, budget_ms: {n: _fake_timing(1.0 if n == index else 2.0) for n in fns}


def _probe(n: int) -> float:
    """What the card's op gives for 0 with a leading size of ``n``: (UNUSED - 1) * 1e-7, the build's signature."""
    return float(kernelkit.ops.kk_tuned(torch.zeros(n))[0])


def _assert_ops_run_each_buckets_winner(tmp_path, first, before):
    """A second bucket tuned to another winner: kernelkit.ops runs each call's bucket's build (no new build; the
    current build stays the last winner), a new process that recalls one bucket gets both, and after an edit of
    the .cu the old winners no longer apply."""
    space = {"WRONG_BIAS": [0, 1], "UNUSED": [1, 2]}
    other = {**first, "UNUSED": 3 - first["UNUSED"]}
    small = kernelkit.autotune("kk_tuned", kernels_dir=tmp_path, shape=(64,), device="cpu", timer=_favouring(other, space))
    assert small.best == other and not small.from_cache
    signature = {c["UNUSED"]: pytest.approx((c["UNUSED"] - 1) * 1e-7, rel=1e-6, abs=1e-12) for c in (first, other)}
    assert _probe(4096) == signature[first["UNUSED"]] and _probe(3000) == signature[first["UNUSED"]]
    assert _probe(64) == signature[other["UNUSED"]] and _probe(1 << 17) == signature[other["UNUSED"]]  # untuned: current
    assert kernelkit.STATS["compiles"] - before == 5
    _assert_buckets_follow_a_rebind({4096: signature[first["UNUSED"]], 64: signature[other["UNUSED"]]})
    child = subprocess.run([sys.executable, "-c", f"""
import torch, kernelkit
kernelkit.autotune("kk_tuned", kernels_dir={str(tmp_path)!r}, shape=(64,), device="cpu")
print(kernelkit.STATS["compiles"], *(float(kernelkit.ops.kk_tuned(torch.zeros(n))[0]) for n in (64, 4096)))
"""], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    compiles, at64, at4096 = child.stdout.split()
    assert int(compiles) == 0 and float(at64) == signature[other["UNUSED"]] and float(at4096) == signature[first["UNUSED"]]
    cu = tmp_path / "kk_tuned.cu"
    cu.write_text(cu.read_text().replace("(A)(1e-7)", "(A)(1e-6)"))
    kernelkit.load("kk_tuned", kernels_dir=tmp_path, extra_cuda_cflags=[f"-D{k}={v}" for k, v in other.items()])
    edited = pytest.approx((other["UNUSED"] - 1) * 1e-6, rel=1e-6, abs=1e-12)
    assert _probe(4096) == edited and _probe(64) == edited  # the edited build, never an old winner's
    cu.write_text(cu.read_text().replace("(A)(1e-6)", "(A)(1e-7)"))


def _assert_buckets_follow_a_rebind(expected):
    """Once the fast call path is loaded (registry rebinds every bound card), each bucket's calls go through
    callables made then, from the same winners, not those picked before."""
    from kernelkit.jit import registry

    seen = []

    def tagging(overload):
        slow = getattr(overload, "_op", overload)
        return lambda *a, **k: seen.append(overload) or slow(*a, **k)

    real = registry.fastcall.wrap
    registry.fastcall.wrap = tagging
    try:
        registry._use_fastcall()
        for n, value in expected.items():
            assert _probe(n) == value
        assert len(seen) == len(expected)
    finally:
        registry.fastcall.wrap = real
        registry._use_fastcall()


def test_a_bucket_pick_and_a_rebinding_never_wait_for_each_other(monkeypatch):
    """A rebinding comes with the registry's lock held (the fast call path, loaded in its builder thread, rebinds
    every card) while a call may be loading its bucket's build, which takes that lock: neither may wait for the
    other (a CI run once hung there)."""
    from kernelkit.jit import registry

    started, rebound = threading.Event(), threading.Event()

    class Card:
        source, kernels_dir, spec = "text", None, types.SimpleNamespace(name="kk_routes_probe")

        def __init__(self, *args):
            pass

        def _load(self, config, load, make_current):
            started.set()
            assert rebound.wait(10), "the rebinding waited for this load"
            with registry._LOCK:  # what opening a build takes
                return object()

    monkeypatch.setattr(tune, "_Card", Card)
    monkeypatch.setattr(tune, "stored", lambda *args, **kw: {"B": 1})
    monkeypatch.setattr(registry, "overloads", lambda lib: {})
    monkeypatch.setattr(registry, "eager", lambda ops: {"op": lambda x: "winner"})
    routes = tune._CardRoutes(Card(), {"B": [1, 2]}, None)
    call = routes({"op": lambda x: "current"})["op"]

    def rebind():
        assert started.wait(10)
        with registry._LOCK:
            routes({"op": lambda x: "current"})
        rebound.set()

    other = threading.Thread(target=rebind, daemon=True)
    other.start()
    assert call(torch.zeros(3)) == "winner"
    other.join(10)
    assert not other.is_alive() and routes.picked == {}  # picked under the earlier binding: not kept


def test_a_card_without_a_space_is_a_one_line_error_before_any_build():
    before = kernelkit.STATS["compiles"]
    with pytest.raises(ValueError, match=r"autotune elementwise_mul: space: the card's Spec names no tune="):
        kernelkit.autotune("elementwise_mul", device="cpu")
    assert kernelkit.STATS["compiles"] == before


def test_many_near_equal_configurations_are_narrowed_by_a_second_short_run_before_the_full_budget():
    k = Kernels()
    budgets = []
    cost = {64: 4.0, 128: 4.0, 256: 4.2, 512: 4.4, 1024: 4.6, 2048: 4.8}  # all within 1.5x: the first run keeps all

    def timer(fns, budget_ms):
        budgets.append((len(fns), budget_ms))
        return k.timer(lambda c: cost[c["block"]])(fns, budget_ms)

    result = tune.autotune(k.make, {"block": list(cost)}, reference=reference, inputs=make_inputs, shape=(1000,),
                           name="kk_narrow", device="cpu", budget_ms=50, store=False, timer=timer)
    assert budgets == [(6, 10.0), (6, 10.0), (2, 50.0)]
    status = {c.config["block"]: c.status for c in result.candidates}
    assert sorted(s for b, s in status.items() if b in (64, 128)) == ["best", "ok"]  # a tie is never pruned
    narrowed = [c for c in result.candidates if c.config["block"] > 128]
    assert all(c.status == "pruned" and "surely slower than the best of a second short run" in c.reason
               and c.timing is not None for c in narrowed)
