"""``kernelkit eval``: one row per candidate, whatever the candidate does (crash, hang, exhaust memory, not import,
fault the GPU), written to JSON and CSV; honest candidates get a speedup with its interval."""
import csv
import json
import os
import re
import shutil

import pytest

from kernelkit.frontends import cli
from kernelkit.harness.strict.evaluation import Options, evaluate
from kernelkit.harness.strict.process import Limits

EXPLOITS = os.path.join(os.path.dirname(__file__), "fixtures", "exploits")
BROKEN = os.path.join(EXPLOITS, "broken")
RELU = os.path.join(EXPLOITS, "problem_relu.py")

#: broken candidate -> what its row's reason says
BROKEN_ROWS = {
    "crash.py": r"died of signal SIGSEGV",
    "hang.py": r"timed out after",
    "hang_at_import.py": r"timed out after",
    "memory_hog.py": r"MemoryError|more than \d+ MiB",
    "raises.py": r"raised RuntimeError: this kernel is not finished",
    "gpu_fault.py": r"raised IndexError|raised",
}


def test_eval_writes_a_row_per_candidate_and_loses_none_to_broken_ones(tmp_path, capsys):
    bad_syntax = tmp_path / "bad_syntax.py"
    bad_syntax.write_text("def forward(x)\n    return x\n")
    candidates = ([os.path.join(EXPLOITS, "honest_relu.py"), os.path.join(EXPLOITS, "input_alias.py")]
                  + [os.path.join(BROKEN, name) for name in BROKEN_ROWS]
                  + [str(bad_syntax), str(tmp_path / "missing.py"), "import torch\ndef forward(x):\n    return torch.relu(x)\n"])
    out_json, out_csv = tmp_path / "rows.json", tmp_path / "rows.csv"
    code = cli.main(["eval", *candidates, "--ref", RELU, "--device", "cpu", "--timeout", "20", "--memory-mb", "1500",
                     "--budget-ms", "10", "--json", str(out_json), "--csv", str(out_csv)])
    assert code == 0
    rows = json.loads(out_json.read_text())
    assert [r["candidate"] for r in rows][:-1] == candidates[:-1] and rows[-1]["candidate"].startswith("inline_")
    with open(out_csv) as f:
        assert len(list(csv.DictReader(f))) == len(candidates)
    by_name = {os.path.basename(r["candidate"]): r for r in rows}
    for honest in ("honest_relu.py", rows[-1]["candidate"]):
        r = by_name[honest]
        assert r["built"] and r["correct"] and not r["reason"], r
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"] and r["median_us"] > 0
    assert "shares memory with input 0" in by_name["input_alias.py"]["reason"]
    for name, why in BROKEN_ROWS.items():
        r = by_name[name]
        assert not r["correct"] and r["speedup"] is None
        assert re.search(why, r["reason"]), r
    assert not by_name["hang_at_import.py"]["built"] and by_name["hang.py"]["built"]
    assert "SyntaxError" in by_name["bad_syntax.py"]["reason"] and not by_name["bad_syntax.py"]["built"]
    assert "no such file" in by_name["missing.py"]["reason"]
    assert "candidate" in capsys.readouterr().out


def test_eval_refuses_a_bad_problem_in_one_line(tmp_path, capsys):
    assert cli.main(["eval", os.path.join(EXPLOITS, "honest_relu.py"), "--ref", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelkit eval: --ref") and "no such file" in err and len(err.splitlines()) == 1
    broken_ref = tmp_path / "ref.py"
    broken_ref.write_text("def inputs(seed, device):\n    return ()\n")
    assert cli.main(["eval", os.path.join(EXPLOITS, "honest_relu.py"), "--ref", str(broken_ref)]) == 2
    assert "reference" in capsys.readouterr().err


def test_eval_options_name_the_bad_argument():
    with pytest.raises(ValueError, match=r"^trials: "):
        Options(trials=0)
    with pytest.raises(ValueError, match=r"^verify: "):
        Options(verify=0)
    with pytest.raises(ValueError, match=r"^candidates: "):
        evaluate([], RELU)
    with pytest.raises(SystemExit):
        cli.main(["eval", "x.py", "--ref", RELU, "--timeout", "0"])


@pytest.mark.gpu
def test_eval_runs_50_candidates_with_broken_ones_and_loses_no_row(tmp_path):
    """The issue's goal: 50 candidates of one problem, 4 of them hanging, crashing or faulting the GPU."""
    broken = ["crash.py", "hang.py", "gpu_fault.py", "memory_hog.py"]
    candidates = [os.path.join(BROKEN, b) for b in broken]
    for k in range(46):
        path = tmp_path / f"honest_{k}.py"
        shutil.copy(os.path.join(EXPLOITS, "honest_relu.py"), path)
        candidates.append(str(path))
    rows = evaluate(candidates, RELU, Options(device="cuda", budget_ms=20, limits=Limits(timeout_s=60, memory_mb=8000)))
    assert [r.candidate for r in rows] == candidates
    assert all(not r.correct for r in rows[:4]) and all(r.correct and r.speedup for r in rows[4:]), \
        [(r.candidate, r.reason) for r in rows if not r.correct]
