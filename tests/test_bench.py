"""kernelkit.bench: the CPU host-timer path in CI (timings that must reflect real work, adaptive repeats,
the cached bandwidth floor, output files), the CUDA paths on a GPU."""
import argparse
import csv
import json
import re
import sys
import time

import pytest
import torch

from kernelkit import Spec, bench
from kernelkit.cardkit import elementwise_inputs
from kernelkit.frontends.harness_commands import parse_size
from kernelkit.harness.bandwidth import device_bandwidth
from kernelkit.harness.timing import paired_ratio, time_fn, time_together

SIZES = [(1 << 10,), (1 << 14,)]


def sleeper(ms):
    def op(a, b):
        time.sleep(ms / 1000)
        return a + b

    return op


def test_cpu_sweep_rows_and_files(tmp_path):
    res = bench(torch.mul, elementwise_inputs(2), reference=torch.mul, sizes=SIZES, compile=False, budget_ms=5)
    assert res.timer == "host" and res.contenders == ["mul", "eager"]
    for size in SIZES:
        for name in ("mul", "eager"):
            r = res.get(name, size)
            assert r["reps"] >= 5 and 0 < r["p20_us"] <= r["median_us"] <= r["p80_us"]
        floor = res.get("floor", size)
        assert floor["bytes"] == 3 * size[0] * 4  # default estimate: both inputs + the output
        assert floor["median_us"] == pytest.approx(floor["bytes"] / res.bandwidth_bytes_per_s * 1e6)
    assert set(res.host_us) == {"torch.add", "mul", "eager"}
    text = repr(res)
    assert "16384" in text and "floor" in text and "mul vs reference (eager) (95% CI)" in text
    assert "<table>" in res._repr_html_()
    data = json.loads(res.to_json(tmp_path / "r.json").read_text())
    assert len(data["rows"]) == len(SIZES) * (2 * len(res.threads) + 1)  # two contenders per thread count, a floor
    rows = list(csv.DictReader(open(res.to_csv(tmp_path / "r.csv"))))
    assert {r["contender"] for r in rows} == {"mul", "eager", "floor"}
    pngs = res.plot(tmp_path / "plots")
    assert [p.name for p in pngs] == ["mul_time.png", "mul_speedup.png", "mul_bandwidth.png"]
    assert all(p.stat().st_size > 1000 for p in pngs)


def test_times_reflect_the_work():
    res = bench({"slow": sleeper(2), "fast": torch.add}, elementwise_inputs(2), sizes=[(64,)], budget_ms=40,
                host_overhead=False, floor=False)
    slow, fast = res.median_us("slow"), res.median_us("fast")
    assert 2000 <= slow < 20000
    assert fast < 500
    # timed side by side, one call of each per round: same repeats, bounded by the budget (2 x 40 ms)
    assert res.get("slow")["reps"] == res.get("fast")["reps"] <= 60
    # the first contender against the other, round by round: "slow" is slower, and its interval says so
    r = res.paired("fast")
    assert r.lo <= r.median <= r.hi < 0.5 and r.verdict in ("slower", "unreliable"), r  # unreliable: a busy machine
    assert res.paired("slow") is None  # the first contender has no ratio to itself


def test_paired_ratio_resolves_what_separate_medians_cannot():
    """A device state that moves both calls of a round alike (+-30% here) hides a 2% difference between
    the two medians' spreads; the round-by-round ratio sees it, and its interval excludes 1."""
    import random

    rng = random.Random(0)
    state = [rng.choice([1.0, 1.3, 0.7]) * (1 + 0.002 * rng.random()) for _ in range(200)]
    ours = [10.0 * s for s in state]
    other = [10.2 * s * (1 + 0.002 * rng.random()) for s in state]
    r = paired_ratio(ours, other)
    assert r.verdict == "faster" and 1.015 < r.lo <= r.median <= r.hi < 1.025, r
    assert str(r).startswith("1.02")
    from kernelkit.harness.timing import Timing

    a, b = Timing.from_samples(ours, "t"), Timing.from_samples(other, "t")
    assert a.p20_us < b.median_us < a.p80_us  # apart, each one's spread swallows the difference
    # a symmetric +-1% round-to-round difference with no bias is a tie
    noisy = [u * (1 + rng.uniform(-0.01, 0.01)) for u in ours]
    r = paired_ratio(ours, noisy)
    assert r.verdict == "tie" and r.lo < 1 < r.hi, r


def test_paired_ratio_interval_and_bad_input():
    r = paired_ratio([1.0] * 100, [float(i) for i in range(1, 101)])  # ratios 1..100
    assert r.median == 50.5 and r.rounds == 100
    assert (r.lo, r.hi) == (41.0, 60.0)  # order statistics 40 and 59 (0-based): n/2 -+ 0.98 sqrt(n)
    assert paired_ratio([2.0] * 3, [1.0, 2.0, 3.0]) == type(r)(1.0, 0.5, 1.5, 3)  # < 6 rounds: the range
    with pytest.raises(ValueError, match="equally long"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="ours_us"):
        paired_ratio([0.0], [1.0])


def test_contenders_are_timed_in_turn():
    """One call of each per round (order reversed every other round), so a slow spell lands on all."""
    calls = []

    def rec(name):
        def fn():
            calls.append(name)
            time.sleep(1e-4)  # > 20 us: one call per sample, no batching
        return fn

    out = time_together({"a": rec("a"), "b": rec("b"), "c": rec("c")}, "cpu", budget_ms=10, warmup_ms=0)
    assert {k: type(v).__name__ for k, v in out.items()} == dict.fromkeys("abc", "Timing")
    reps = out["a"].reps
    assert out["b"].reps == out["c"].reps == reps >= 5
    timed = calls[-3 * reps:]
    rounds = [timed[3 * i:3 * i + 3] for i in range(reps)]
    assert all(sorted(r) == list("abc") for r in rounds)  # one call of each per round
    assert all(rounds[i + 1] == rounds[i][::-1] for i in range(0, reps - 1, 2))  # a round, then its reverse
    # no contender keeps its place: each one leads some round (a seeded shuffle every other round)
    assert {r[0] for r in rounds} == set("abc"), rounds


def test_a_contender_failing_midway_is_dropped_not_fatal():
    n = [0]

    def flaky():
        n[0] += 1
        if n[0] > 20:
            raise RuntimeError("device went away")

    out = time_together({"flaky": flaky, "ok": lambda: None}, "cpu", budget_ms=5, warmup_ms=0)
    assert isinstance(out["flaky"], RuntimeError) and "went away" in str(out["flaky"])
    assert out["ok"].reps >= 5


def test_adaptive_repeat_count():
    t = time_fn(lambda: time.sleep(0.001), "cpu", budget_ms=30)
    assert 5 <= t.reps <= 40
    many = time_fn(lambda: None, "cpu", budget_ms=5)
    assert many.reps > 100


def test_contender_errors_are_reported_not_raised():
    def broken(_a, _b):
        raise RuntimeError("kernel launch failed")

    res = bench({"broken": broken, "ok": torch.add}, elementwise_inputs(2), sizes=[(256,)], host_overhead=False, floor=False)
    assert "kernel launch failed" in res.get("broken")["error"]
    assert res.median_us("ok") > 0
    assert any("broken" in n for n in res.notes)


def test_spec_drives_contenders_sizes_and_bytes(tmp_path):
    spec = Spec(name="mulcard", reference=torch.mul, make_inputs=elementwise_inputs(2), op=torch.mul,
                bench_sizes=((100,), (1000,)), bytes_moved=lambda _args, _out: 12345)
    res = bench(spec, compile=True, budget_ms=5, host_overhead=False)
    assert res.contenders == ["kernelkit", "eager", "torch.compile"]
    assert res.sizes == [(100,), (1000,)]
    assert all(r.get("bytes") == 12345 for r in res.rows)
    assert res.median_us("torch.compile", (1000,)) > 0, res.notes
    assert res.speedup("kernelkit", "eager") is not None
    r = res.paired("torch.compile", (1000,))
    assert r is not None and r.lo <= r.median <= r.hi and r.rounds == res.get("kernelkit", (1000,))["reps"]
    row = next(csv.DictReader(open(res.to_csv(tmp_path / "r.csv"))))
    assert {"ratio", "ratio_lo", "ratio_hi"} <= set(row)


def test_copy_floor_is_timed_with_the_contenders_on_the_same_bytes(tmp_path):
    moved = {}

    def bytes_moved(args, _out):  # a fixed traffic per size, so the copy's work is known
        return moved.setdefault(args[0].numel(), 64 * args[0].numel())

    spec = Spec(name="mulcard", reference=torch.mul, make_inputs=elementwise_inputs(2), op=torch.mul,
                bench_sizes=((1 << 10,), (1 << 20,)), bytes_moved=bytes_moved)
    res = bench(spec, compile=False, budget_ms=20, host_overhead=False, copy_floor=True)
    assert res.contenders == ["kernelkit", "eager", "copy"]
    small, big = (res.get("copy", s) for s in res.sizes)
    assert small["bytes"] == 64 << 10 and big["bytes"] == 64 << 20
    assert small["reps"] == res.get("kernelkit", (1 << 10,))["reps"]  # timed in the same rounds
    assert big["median_us"] > 20 * small["median_us"]  # 32 MiB copied vs 32 KiB
    assert res.paired("copy", (1 << 20,)) is not None
    assert "kernelkit vs copy (95% CI)" in repr(res)
    rows = list(csv.DictReader(open(res.to_csv(tmp_path / "r.csv"))))
    assert {r["contender"] for r in rows} == {"kernelkit", "eager", "copy", "floor"}


def test_copy_floor_without_a_working_contender_is_an_error_row():
    def broken(_a, _b):
        raise RuntimeError("kernel launch failed")

    res = bench({"broken": broken}, elementwise_inputs(2), sizes=[(256,)], host_overhead=False, floor=False,
                copy_floor=True)
    assert "bytes to copy are unknown" in res.get("copy")["error"]


def test_bandwidth_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path))
    bw = device_bandwidth("cpu")
    assert 1e8 < bw < 1e13
    files = list(tmp_path.glob("v1/records/bandwidth/*.json"))
    assert len(files) == 1 and "cpu|" in files[0].read_text()
    monkeypatch.setattr(sys.modules["kernelkit.harness.bandwidth"], "time_fn", lambda *_a, **_k: pytest.fail("measured again"))
    assert device_bandwidth("cpu") == bw


def test_summary_shows_the_table():
    """README's ``print(kernelkit.bench(...).summary())``: the times per size and contender, not a title alone."""
    res = bench(torch.mul, elementwise_inputs(2), reference=torch.mul, sizes=SIZES, compile=False, budget_ms=2,
                warmup_ms=1, host_overhead=False)
    text = res.summary()
    assert text.splitlines()[0] == res.title() and "16384" in text and "mul vs reference (eager) (95% CI)" in text
    assert repr(res) == text


def test_a_cpu_sweep_of_the_spec_stops_at_the_cap_unless_lifted():
    import math

    from kernelkit.harness.bench import CPU_MAX_NUMEL

    spec = Spec(name="bigsweep", reference=torch.neg, make_inputs=elementwise_inputs(1), op=torch.neg,
                bench_sizes=((1 << 10,), (CPU_MAX_NUMEL,), (CPU_MAX_NUMEL * 2,)))
    kw = dict(compile=False, budget_ms=1, warmup_ms=1, host_overhead=False, floor=False)
    res = bench(spec, **kw)
    assert {r["numel"] for r in res.rows} == {1 << 10, CPU_MAX_NUMEL}
    assert any("skipped" in n and "--all-sizes" in n for n in res.notes)
    lifted = bench(spec, max_numel=math.inf, **kw)
    assert {r["numel"] for r in lifted.rows} == {1 << 10, CPU_MAX_NUMEL, CPU_MAX_NUMEL * 2}
    only_big = Spec(name="onlybig", reference=torch.neg, make_inputs=elementwise_inputs(1), op=torch.neg,
                    bench_sizes=((CPU_MAX_NUMEL * 2,), (CPU_MAX_NUMEL * 4,)))
    assert {r["numel"] for r in bench(only_big, **kw).rows} == {CPU_MAX_NUMEL * 2}  # the smallest always runs


def test_a_card_outside_the_repository_is_timed_by_name():
    cards = __import__("pathlib").Path(__file__).parent / "fixtures" / "cards"
    res = bench("kk_add_skip_last", kernels_dir=cards, sizes=[(256,)], compile=False, budget_ms=2, warmup_ms=1,
                host_overhead=False, floor=False)
    assert res.contenders == ["kernelkit", "eager"] and res.median_us("kernelkit") > 0, res


def test_a_sweep_with_nothing_to_time_is_refused():
    with pytest.raises(ValueError, match="bench: sizes: expected at least one size, got an empty list$"):
        bench(torch.add, elementwise_inputs(2), sizes=[])
    spec = Spec(name="nosizes", reference=torch.add, make_inputs=elementwise_inputs(2), op=torch.add, bench_sizes=())
    with pytest.raises(ValueError, match="bench: sizes: .*the spec 'nosizes' lists no bench_sizes"):
        bench(spec, compile=False)
    with pytest.raises(ValueError, match=r"bench: max_numel=100 skips every size \(4096, 65536\): nothing would be "
                                         "timed"):
        bench(torch.add, elementwise_inputs(2), sizes=[(4096,), (1 << 16,)], max_numel=100)
    with pytest.raises(TypeError, match="bench: inputs: expected a tuple .* got list; several argument tuples"):
        bench(torch.add, [(torch.randn(3), torch.randn(3))])


def test_bench_command_refuses_an_empty_sweep(capsys):
    from kernelkit.frontends import cli

    assert cli.main(["bench", "vector_add", "--sizes", ",", "--device", "cpu"]) == 2
    assert "--sizes: expected at least one size" in capsys.readouterr().err


def test_a_cpu_bench_times_each_size_at_one_thread_and_at_the_default_with_the_load(tmp_path):
    before = torch.get_num_threads()
    res = bench(torch.mul, elementwise_inputs(2), reference=torch.mul, sizes=[(1 << 12,)], compile=False, budget_ms=2,
                warmup_ms=1, host_overhead=False, threads=[1, 2])
    assert res.threads == [1, 2] and [(w["size"], w["threads"]) for w in res.loads] == [([4096], 1), ([4096], 2)]
    for t in (1, 2):
        row = res.get("eager", threads=t)
        assert row["threads"] == t and row["reps"] >= 5 and "others_cpus" in row and res.paired("eager", threads=t)
    assert res.get("eager") is res.get("eager", threads=2)  # torch's default unless asked
    assert all(w["cpus"] >= 1 and w["loadavg_before"] is not None for w in res.loads)
    assert "threads 1, 2" in res.title() and [r[1] for r in res.table_rows()] == [1, 2]
    rows = list(csv.DictReader(open(res.to_csv(tmp_path / "r.csv"))))
    assert {r["threads"] for r in rows} == {"1", "2", ""} and {"unreliable", "others_cpus"} <= set(rows[0])
    assert torch.get_num_threads() == before  # restored
    series, _, title = res.plot_args()
    assert title.endswith(", 2 threads") and {p["threads"] for p in series["mul"]} == {2}


def test_the_baseline_is_torchs_own_op_named_in_the_table():
    """A card whose reference is a formula is timed against torch's own op too, and that is its baseline; one whose
    reference is torch's op is timed once, by the op's name; without one the baseline is the reference, so named."""
    formula = Spec(name="negcard", reference=lambda x: 0 - x, make_inputs=elementwise_inputs(1), op=torch.neg,
                   bench_sizes=((256,),), torch_op=torch.neg)
    res = bench(formula, compile=False, budget_ms=2, warmup_ms=1, host_overhead=False, floor=False)
    assert res.contenders == ["kernelkit", "torch.neg", "eager"] and res.baseline == "torch.neg"
    assert "kernelkit vs torch.neg (95% CI)" in res.summary() and "reference (eager)" in res.summary()
    same = Spec(name="addcard", reference=torch.add, make_inputs=elementwise_inputs(2), op=torch.add,
                bench_sizes=((256,),), torch_op=torch.add, torch_op_name="torch.add")
    res = bench(same, compile=False, budget_ms=2, warmup_ms=1, host_overhead=False, floor=False)
    assert res.contenders == ["kernelkit", "torch.add"] and res.baseline == "torch.add"
    none = Spec(name="plain", reference=lambda x: 0 - x, make_inputs=elementwise_inputs(1), op=torch.neg,
                bench_sizes=((256,),))
    assert bench(none, compile=False, budget_ms=2, warmup_ms=1, host_overhead=False, floor=False).baseline == "eager"


def test_a_loaded_machine_marks_cpu_ratios_unreliable_instead_of_giving_an_interval():
    """Busy processes on the CPUs this process may use (two per CPU, so that together they keep more than half a CPU
    busy whatever else runs): the timing's threads find no idle CPU, and the table, the title, the notes and the
    plot say so; no interval is printed. Asserts the flag only, never a speed."""
    import subprocess

    from kernelkit.harness import machine, report

    cpus = machine.cpu_ids()
    if machine.busy_cpu_seconds(cpus) is None:
        pytest.skip("no /proc/stat: the load is known from the load average only")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * len(cpus))]
    try:
        time.sleep(0.2)  # the spinners are running
        res = bench({"ours": torch.add, "other": torch.add}, elementwise_inputs(2), sizes=[(4096,)],
                    threads=[len(cpus)], budget_ms=30, host_overhead=False, floor=False)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    [window] = res.loads
    assert window["busy"].startswith("machine busy: others used") and window["others_cpus"] > 0.5, window
    r = res.paired("other")
    assert r.verdict == "unreliable" and r.caveat == window["busy"]
    cell = res.table_rows()[0][-1]
    assert cell.startswith("unreliable (machine busy") and not re.search(r"\(\d+\.\d+-\d+\.\d+\)", cell), cell
    assert "busy in 1 of 1 timings" in res.title() and any("rerun on an idle machine" in n for n in res.notes)
    figs = report.sweep_figures(*res.plot_args())
    try:
        assert any("unreliable" in t.get_text() for t in figs["speedup"].axes[0].texts)
    finally:
        for fig in figs.values():
            report._pyplot().close(fig)


def test_a_single_thread_timing_beside_one_busy_process_per_cpu_is_flagged():
    """One busy process per CPU and a timing at 1 thread: the other processes cannot use more CPUs than there are,
    so "others used" stays below the threshold, but the timing's thread gets its CPU only in turns; the time it
    spent waiting for one (the kernel's run queue) marks the ratio unreliable. Asserts the flag only."""
    import subprocess

    from kernelkit.harness import machine

    if machine.runqueue_wait_seconds() is None:
        pytest.skip("no /proc/self/task/*/schedstat: a run queue's wait cannot be read")
    cpus = machine.cpu_ids()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in cpus]
    try:
        time.sleep(0.2)  # the spinners are running
        res = bench({"ours": torch.add, "other": torch.add}, elementwise_inputs(2), sizes=[(4096,)],
                    threads=[1], budget_ms=200, host_overhead=False, floor=False)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    [window] = res.loads
    assert window["waited_cpus"] > machine.WAIT_SLACK_CPUS and window["busy"].startswith("machine busy"), window
    assert res.paired("other").verdict == "unreliable" and res.table_rows()[0][-1].startswith("unreliable (machine busy")
    assert "its threads waiting for a CPU up to" in res.title()


def test_when_a_cpu_timing_is_void():
    from kernelkit.harness.machine import Load
    from kernelkit.harness.timing import Ratio

    assert Load(cpus=2, threads=1, others_cpus=1.0).busy() is None  # one thread, one idle CPU: it stands
    assert "others used 1.0 of 2 CPUs" in Load(cpus=2, threads=2, others_cpus=1.0).busy()
    assert Load(cpus=2, threads=2, others_cpus=0.3).busy() is None  # jiffy rounding is not load
    assert Load(cpus=2, threads=1, loadavg_before=1.2, loadavg_after=2.1).busy() is None  # no /proc/stat
    assert "load average 3.0" in Load(cpus=2, threads=1, loadavg_before=3.0, loadavg_after=2.1).busy()
    # its thread waited for a CPU a third of the time, though the others used less than 1.5 CPUs
    assert "1 thread waited for a CPU 33% of the time" in Load(cpus=2, threads=1, others_cpus=1.3, waited_cpus=0.33).busy()
    assert "2 threads waited for a CPU 10% of the time" in Load(cpus=2, threads=2, others_cpus=0.2, waited_cpus=0.2).busy()
    assert Load(cpus=2, threads=2, others_cpus=0.2, waited_cpus=0.01).busy() is None  # an idle machine's wakeups
    assert Ratio(2.0, 1.9, 2.1, 50).judged().verdict == "faster"
    assert Ratio(2.0, 1.9, 2.1, 50).judged("machine busy: x").caveat == "machine busy: x"
    wide = Ratio(1.0, 0.5, 3.0, 50).judged()
    assert wide.verdict == "unreliable" and wide.caveat == "spread: its 95% interval is 0.50-3.00x"
    assert "unreliable: spread" in str(wide)


def test_parse_sizes():
    assert parse_size("4096") == (4096,)
    assert parse_size("1e6") == (1000000,)
    assert parse_size("2**20") == (1 << 20,) == parse_size("2^20")
    assert parse_size("100x1024") == (100, 1024)
    with pytest.raises(argparse.ArgumentTypeError, match="bad size 'abc'"):
        parse_size("abc")


# ------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_events_compile_floor_and_host_overhead(tmp_path):
    res = bench(torch.add, elementwise_inputs(2), reference=torch.add, sizes=[(1 << 20,), (1 << 26,)], device="cuda")
    assert res.timer == "cuda-events"
    assert res.contenders == ["add", "eager", "torch.compile"]
    big = res.get("add", (1 << 26,))
    assert 20 < big["pct_bw"] < 110, big  # a large add runs near, not above, the measured bandwidth
    assert res.median_us("floor", (1 << 26,)) <= big["median_us"] * 1.1
    assert 0 < res.host_us["torch.add"] < 100 and "add" in res.host_us
    assert len(res.plot(tmp_path)) == 3


@pytest.mark.gpu
def test_gpu_copy_floor_matches_a_streaming_add():
    # a large add moves 3 tensors once; a copy of the same bytes takes about as long on any GPU
    res = bench(torch.add, elementwise_inputs(2), sizes=[(1 << 12,), (1 << 26,)], device="cuda", compile=False,
                host_overhead=False, copy_floor=True)
    assert res.get("copy", (1 << 26,))["bytes"] == 3 * 4 << 26
    r = res.paired("copy", (1 << 26,))
    assert 0.8 < r.median < 1.25, r
    assert res.median_us("copy", (1 << 12,)) < res.median_us("copy", (1 << 26,)) / 20


@pytest.mark.gpu
def test_gpu_graph_mode_removes_launch_overhead():
    args = [torch.randn(16, device="cuda") for _ in range(2)]
    many = lambda a, b: [torch.add(a, b) for _ in range(20)][-1]  # noqa: E731 - 20 tiny launches
    plain = bench(many, tuple(args), device="cuda", host_overhead=False, floor=False)
    graph = bench(many, tuple(args), device="cuda", graph=True, host_overhead=False, floor=False)
    assert graph.timer == "cuda-graph"
    assert graph.median_us("<lambda>") < plain.median_us("<lambda>")


@pytest.mark.gpu
def test_gpu_l2_flush_makes_cache_resident_inputs_cold():
    x = torch.randn(1 << 22, device="cuda")  # 16 MB read + 16 MB written: fits in an H100's 50 MB L2
    y = torch.empty_like(x)
    warm = time_fn(lambda: y.copy_(x), "cuda", flush=False)
    cold = time_fn(lambda: y.copy_(x), "cuda", flush=True)
    # a pure copy is all memory traffic; minima are the least disturbed by other work on the GPU
    assert cold.min_us > warm.min_us, (cold, warm)


@pytest.mark.gpu
def test_gpu_bench_agrees_with_triton_do_bench():
    pytest.importorskip("triton")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "crosscheck_triton.py"
    spec = importlib.util.spec_from_file_location("crosscheck_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.crosscheck(sizes=[1 << 24])
    assert all(r["agree"] for r in rows), rows


@pytest.mark.gpu
def test_gpu_host_time_is_not_charged_as_device_time():
    """A call whose host code outlasts the L2 flush (torch.compile on a slow host CPU) is timed by what
    the device does: a GPU spin queued ahead of it keeps the launch gap out of the events."""
    a, b = (torch.randn(1024, device="cuda") for _ in range(2))

    def slow_host():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 500e-6:  # 0.5 ms of host work: longer than any GPU's flush
            pass
        return torch.add(a, b)

    out = time_together({"slow host": slow_host, "plain": lambda: torch.add(a, b)}, "cuda", budget_ms=30)
    assert out["slow host"].median_us < out["plain"].median_us + 20, out


@pytest.mark.gpu
def test_gpu_host_stalls_are_not_charged_as_device_time():
    """A host that stalls now and then (every third call here: the GC, another process) launches late
    behind its spin: those rounds are left out, the spin lengthened, and the timing stays the device's."""
    a, b = (torch.randn(1024, device="cuda") for _ in range(2))
    calls = [0]

    def stalls():
        calls[0] += 1
        if calls[0] % 3 == 0:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 1e-3:
                pass
        return torch.add(a, b)

    out = time_together({"stalls": stalls, "plain": lambda: torch.add(a, b)}, "cuda", budget_ms=30)
    stalled, plain = out["stalls"], out["plain"]
    assert stalled.reps == plain.reps >= 10 and stalled.dropped == plain.dropped
    # a third of the calls would carry ~1 ms of host time: the p80 shows whether any got through
    assert stalled.p80_us < plain.p80_us + 20 and stalled.median_us < plain.median_us + 10, out
