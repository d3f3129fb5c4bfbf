"""`kernelkit run` (the main job) and the `check` / `bench` subcommands, end to end.

Without a GPU, `run` must build the CUDA cards (compile-only), check and time their CPU implementations,
say so in the report, and fail (exit 1) on a failing check or a failing build.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelkit.cli import main

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
    assert "index (1022,)" in capsys.readouterr().out
    files = [tmp_path / "b.json", tmp_path / "b.csv"]
    assert main(["bench", "kk_add_skip_last", *cards, "--sizes", "1024", "2**12", "--budget-ms", "5",
                 "--plot", str(tmp_path / "plots"), "--json", str(files[0]), "--csv", str(files[1])]) == 0
    text = capsys.readouterr().out
    assert "bench kk_add_skip_last" in text and "4096" in text and "vs copy" not in text
    assert all(f.is_file() for f in files) and (tmp_path / "plots" / "kk_add_skip_last_time.png").is_file()
    assert main(["bench", "kk_add_skip_last", *cards, "--sizes", "1024", "--budget-ms", "5", "--copy-floor"]) == 0
    assert "kernelkit vs copy (95% CI)" in capsys.readouterr().out


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
