"""`kernelkit run` (the main job) and the `check` / `bench` subcommands, end to end.

Without a GPU, `run` must build the CUDA cards (compile-only), check and time their CPU implementations,
say so in the report, and fail (exit 1) on a failing check or a failing build.
"""
import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from kernelkit.errors import KernelkitError
from kernelkit.frontends.cli import main
from kernelkit.harness import runner

FIXTURES = Path(__file__).parent / "fixtures"


def read_report(out: Path):
    assert (out / "summary.md").is_file() and (out / "results.json").is_file()
    return (out / "summary.md").read_text(), json.loads((out / "results.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU mode; see test_gpu_run")
def test_run_without_gpu_is_compile_only_for_cuda(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "kernelkit", "run", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)
    summary, results = read_report(out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA GPU" in proc.stdout and "compile-only" in proc.stdout
    assert "no CUDA GPU" in summary
    cards = {c["name"]: c for c in results["cards"]}
    assert cards, "no cards found"
    for name, card in cards.items():
        assert card["ok"], card["errors"]
        assert ("compile-only" in card["mode"]) == card["has_cuda"]
        if "cpu" in card["mode"]:  # its CPU implementation really ran: checked and host-timed
            assert card["check"]["ok"] and card["bench"]["timer"] == "host"
            assert f"| {name} | cpu + cuda compile-only |" in summary
    assert (out / "bench.csv").is_file() and list((out / "plots").glob("*_time.png"))
    assert results["environment"]["gpu"] is None


def test_run_fails_on_a_broken_compiled_card(tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["run", "--quick", "--kernels-dir", str(FIXTURES / "cards"), "--out", str(out)])
    assert code == 1
    summary, results = read_report(out)
    (card,) = results["cards"]
    assert card["name"] == "kk_add_skip_last" and not card["ok"] and card["check"]["ok"] is False
    assert "index (6,)" in summary and "FAIL" in summary
    assert "FAILED: kk_add_skip_last" in capsys.readouterr().out


def test_run_fails_on_a_build_error(tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["run", "--kernels-dir", str(FIXTURES / "cards_broken_build"), "--out", str(out)])
    assert code == 1
    summary, results = read_report(out)
    (card,) = results["cards"]
    assert card["build"] == "FAIL" and card["check"] is None
    assert "undeclared_value" in summary and "kk_syntax_error.cpp:6" in summary


def test_cli_check_and_bench(tmp_path, capsys):
    cards = ["--kernels-dir", str(FIXTURES / "cards")]
    assert main(["check", "kk_add_skip_last", *cards]) == 1
    text = capsys.readouterr().out
    assert "index (1022,)" in text and "fake kernel: " in text  # the fixture op has no fake kernel
    assert main(["check", "kk_add_skip_last", *cards, "--no-contract", "--trials", "1"]) == 1
    assert "contract" not in capsys.readouterr().out
    files = [tmp_path / "b.json", tmp_path / "b.csv"]
    assert main(["bench", "kk_add_skip_last", *cards, "--sizes", "1024", "2**12", "--budget-ms", "5",
                 "--plot", str(tmp_path / "plots"), "--json", str(files[0]), "--csv", str(files[1])]) == 0
    text = capsys.readouterr().out
    assert "bench kk_add_skip_last" in text and "4096" in text and "vs copy" not in text
    assert all(f.is_file() for f in files) and (tmp_path / "plots" / "kk_add_skip_last_time.png").is_file()
    assert main(["bench", "kk_add_skip_last", *cards, "--sizes", "1024", "--budget-ms", "5", "--copy-floor"]) == 0
    assert "kernelkit vs copy (95% CI)" in capsys.readouterr().out


class FakeBuilds:
    """Stands in for the compiler: each build takes ``seconds``, the card ``broken`` fails, and the most
    builds that ran at once is recorded."""

    def __init__(self, names, broken, seconds=0.3):
        self.cards = {n: types.SimpleNamespace(name=n, spec=None, has_cuda=False) for n in names}
        self.broken, self.seconds = broken, seconds
        self.running = self.most = 0
        self.lock = threading.Lock()
        self.loaded = []

    def install(self, monkeypatch):
        monkeypatch.setattr(runner, "all_cards", lambda kernels_dir=None: self.cards)
        monkeypatch.setattr(runner, "find", lambda name, kernels_dir=None: self.cards[name])
        monkeypatch.setattr(runner, "_build_card", self.build)
        monkeypatch.setattr(runner.loading, "load", self.load)

    def build(self, name, opts):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        if name == self.broken:
            raise KernelkitError(f"{name}.cu:3: error: expected a ';'")
        return runner.Built(cached=False, seconds=self.seconds)

    def load(self, name, **kwargs):
        assert kwargs["load"] is False  # no spec: built only
        self.loaded.append(name)
        return types.SimpleNamespace(cached=True, build_seconds=0.0)


def test_run_builds_cards_concurrently_and_reports_a_broken_one(tmp_path, monkeypatch, capsys):
    fake = FakeBuilds(["c_ok", "a_ok", "b_broken", "d_ok"], broken="b_broken")
    fake.install(monkeypatch)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 16)
    t0 = time.perf_counter()
    code, results = runner.run(out_dir=tmp_path / "report", opts=runner.Options(bench=False))
    assert time.perf_counter() - t0 < 4 * fake.seconds  # one after another would take 4 x 0.3 s at least
    assert fake.most == 4
    assert code == 1
    assert [r.name for r in results] == ["a_ok", "b_broken", "c_ok", "d_ok"]  # card order, not finish order
    by_name = {r.name: r for r in results}
    assert by_name["b_broken"].build == "FAIL" and not by_name["b_broken"].ok
    assert by_name["b_broken"].errors == ["build: b_broken.cu:3: error: expected a ';'"]
    for name in ("a_ok", "c_ok", "d_ok"):
        assert by_name[name].ok and by_name[name].build == "built 0.3 s", by_name[name]
    assert sorted(fake.loaded) == ["a_ok", "c_ok", "d_ok"]  # as builds land; the broken card is not built again
    out = capsys.readouterr().out
    assert "FAILED: b_broken" in out and "expected a ';'" in out


def test_run_builds_at_most_one_card_per_cpu(tmp_path, monkeypatch):
    fake = FakeBuilds(["a", "b", "c", "d", "e"], broken=None, seconds=0.1)
    fake.install(monkeypatch)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    code, results = runner.run(out_dir=tmp_path / "report", opts=runner.Options(bench=False))
    assert code == 0 and all(r.ok for r in results)
    assert fake.most == 2


def test_a_card_that_cannot_be_planned_fails_alone(monkeypatch):
    class Card:
        def __init__(self, name):
            self.name = name

        @property
        def spec(self):  # the card's spec file is imported here, before any build thread starts
            if self.name == "bad":
                raise SyntaxError("invalid syntax (bad.py, line 3)")

    monkeypatch.setattr(runner, "find", lambda name, kernels_dir=None: Card(name))
    monkeypatch.setattr(runner, "_build_card", lambda name, opts: runner.Built(cached=True))
    built = runner.build_all(["good", "bad"], runner.Options(), say=lambda m: None)
    assert built["good"].cell == "cached"
    assert built["bad"].cell == "FAIL" and built["bad"].error == "SyntaxError: invalid syntax (bad.py, line 3)"


@pytest.mark.gpu
def test_gpu_run(tmp_path):
    out = tmp_path / "report"
    code = main(["run", "--quick", "--out", str(out)])
    summary, results = read_report(out)
    assert code == 0, summary
    assert results["environment"]["gpu"] and "compile-only" not in summary
    for card in results["cards"]:
        if card["mode"] == "cuda":
            assert card["bench"]["timer"] == "cuda-events"
            assert "torch.compile" in card["bench"]["contenders"]
    assert any(card["mode"] == "cuda" for card in results["cards"])


def test_run_sweeps_a_spread_of_sizes_keeping_both_ends():
    sizes = [(1 << k,) for k in range(10, 30)]
    picked = runner.sweep(sizes, 5)
    assert picked[0] == sizes[0] and picked[-1] == sizes[-1] and len(picked) == 5
    assert picked == sorted(picked) and len(set(picked)) == 5
    assert runner.sweep(sizes[:4], 5) == sizes[:4]


def test_the_cpu_summary_names_the_baseline_and_flags_each_unreliable_ratio():
    """The summary's speedup is against torch's own op where the card names one, at 1 thread and at torch's
    default; a ratio timed on a busy machine says so instead of giving an interval."""
    from kernelkit import Spec, bench
    from kernelkit.cardkit import elementwise_inputs

    spec = Spec(name="negcard", reference=lambda x: 0 - x, make_inputs=elementwise_inputs(1), op=torch.neg,
                bench_sizes=((256,),), torch_op=torch.neg)
    res = bench(spec, compile=False, budget_ms=2, warmup_ms=1, host_overhead=False, threads=[1, 2])
    for row in res.rows:
        row["unreliable"] = "machine busy: others used 1.9 of 2 CPUs" if row.get("threads") == 2 else None
    row = runner.summary_row(runner.CardRun("negcard", bench=res))
    cells = dict(zip(runner.HEADERS, row))
    assert cells["torch op"].startswith("torch.neg ") and cells["reference (eager)"] != "-"
    speedup = cells["speedup (95% CI)"]
    assert speedup.startswith("vs torch.neg: 1 thread ") and "x (" in speedup.split(";")[0], speedup
    assert "; 2 threads unreliable (machine busy: others used 1.9 of 2 CPUs)" in speedup, speedup
