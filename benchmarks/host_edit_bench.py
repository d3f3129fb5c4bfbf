"""A host-code edit of a torch-style extension (the host side of a split .cu, or a .cpp), timed in one process as a
notebook makes it, beside the floor gcc sets for it: an empty TU that includes the same precompiled header (a split's
preamble, or the torch header a .cpp starts with), compiled with the same flags.

For each case of the split corpus (tests/fixtures/split_corpus) with a ``host_edit`` step: the case's text up to
that step is built, the precompiled preamble is waited for, then ``--edits`` host edits are made one after another
(each gives the number in the step's edited host line another value, so each is a new host TU) and each is timed
until ``kernelkit.load`` returns. Every compiler run is logged through KERNELKIT_COMPILER_LAUNCHER, so a row also
says how long the host TU's compile took; the rest is planning, the split, hashing and the link.
Compile and link only: no GPU needed, nothing is run.

Usage: python benchmarks/host_edit_bench.py [--cases layernorm_welford extension_plus_cuh cem_cu_cpp_pair] [--edits 3]
       [--work DIR] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "split_corpus"
sys.path.insert(0, str(CORPUS))

from corpus import cases, texts_after  # noqa: E402

#: logs "start end argv..." of every compiler run (the benchmark's paths hold no blanks)
LAUNCHER = """#!/bin/sh
s=$(date +%s.%N); "$@"; rc=$?; e=$(date +%s.%N)
echo "$s $e $*" >> "$KK_BENCH_LOG"
exit $rc
"""
NUMBER = re.compile(r"\d+(?:\.\d+)?")  # the constant each timed edit changes (an int or a decimal)


def _runs(log: Path, since: float):
    """(start, seconds, argv) of each compiler run that started after ``since``."""
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        start, end, *argv = line.split(" ")
        if float(start) >= since:
            out.append((float(start), float(end) - float(start), argv))
    return out


def _pch_ready(cache_dir: Path, seconds: float = 400) -> bool:
    """Whether every precompiled header the build started is complete (at least one), waiting up to ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        roots = list(cache_dir.glob("v*/pch/*"))
        if roots and all((r / "pch.json").exists() for r in roots) and not list(cache_dir.glob("v*/pch/*/**/.*.gch.*")):
            return True
        time.sleep(1)
    return False


def _floor(argv, work: Path) -> Optional[float]:
    """The host TU's compile command run on an empty TU that includes only its precompiled header (None: it was
    compiled without one)."""
    pch = next((Path(a[2:]) for a in argv if a.startswith("-I") and (Path(a[2:]) / "pch.json").exists()), None)
    if pch is None:
        return None
    header = next(str(p.relative_to(pch))[:-len(".gch")] for p in pch.rglob("*.h.gch"))
    empty = work / "empty.cpp"
    empty.write_text(f"#include <{header}>\n")
    flags, rest = [], iter(argv[1:-4])  # the compiler, then its flags, then -c TU -o OBJ
    for f in rest:  # less the build's depfile, whose folder is gone
        if f == "-MF":
            next(rest, None)
        elif f != "-MD":
            flags.append(f)
    t0 = time.perf_counter()
    subprocess.run([argv[0], *flags, "-c", str(empty), "-o", str(work / "empty.o")], check=True)
    return time.perf_counter() - t0


def child(name: str, work: Path, edits: int) -> None:
    import kernelkit

    case = cases(CORPUS)[name]
    step = next(i for i, s in enumerate(case.steps) if s.kind == "host_edit")
    folder = work / "src" / name
    for rel, text in texts_after(CORPUS / name, case, step).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    sources = [str(folder / s) for s in case.sources]
    kernelkit.load(f"kkh_{name}", sources, is_python_module=case.pybind, **case.load)
    if not _pch_ready(Path(os.environ["KERNELKIT_CACHE_DIR"])):
        print(json.dumps({"case": name, "error": "the precompiled preamble was not built within 400 s"}))
        return
    log = Path(os.environ["KK_BENCH_LOG"])
    rel, _, line = case.steps[step].edits[0]
    number = NUMBER.search(line).group(0)
    for i in range(edits):
        path = folder / rel
        changed = f"{float(number) + 1:.1f}" if "." in number else str(int(number) + 1)
        new = line.replace(number, changed, 1)
        path.write_text(path.read_text().replace(line, new))
        line, number = new, changed
        t0 = time.time()
        kernelkit.load(f"kkh_{name}", sources, is_python_module=case.pybind, **case.load)
        seconds = time.time() - t0
        host = [(s, argv) for _, s, argv in _runs(log, t0) if argv[-1].endswith(".o") and argv[-3].endswith(
            "tabled.ii" if rel.endswith(".cu") else rel)]  # a split .cu's host TU, or the edited .cpp itself
        row = {"case": name, "edit": i, "seconds": round(seconds, 3),
               "host_compile": round(max((s for s, _ in host), default=0.0), 3),
               "runs": [(round(t - t0, 2), round(s, 2), Path(argv[0]).name, Path(argv[-1]).name)
                        for t, s, argv in _runs(log, t0)]}
        floor = _floor(host[-1][1], work) if host and i == edits - 1 else None
        if floor is not None:
            row["floor"] = round(floor, 3)
        print(json.dumps(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="*", default=["layernorm_welford", "extension_plus_cuh"])
    ap.add_argument("--edits", type=int, default=3)
    ap.add_argument("--work")
    ap.add_argument("--json")
    ap.add_argument("--child")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="kk-host-edit-"))
    if args.child:
        child(args.child, work, args.edits)
        return 0
    work.mkdir(parents=True, exist_ok=True)
    launcher = work / "launch.sh"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    rows = []
    for name in args.cases:
        env = dict(os.environ, KERNELKIT_CACHE_DIR=str(work / "cache"), KERNELKIT_COMPILER_LAUNCHER=str(launcher),
                   KK_BENCH_LOG=str(work / "runs.log"))
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--work", str(work), "--edits",
                               str(args.edits)], env=env, capture_output=True, text=True)
        got = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        timed = [r for r in got if "seconds" in r]
        if not timed:
            print(f"{name}: no edit timed\n{(got and got[-1]) or proc.stderr[-3000:]}")
            continue
        rows += got
        each = ", ".join(f"{r['seconds']:.2f}" for r in timed)
        floor = next((r["floor"] for r in timed if "floor" in r), float("nan"))
        print(f"{name}: host edit {statistics.median(r['seconds'] for r in timed):.2f} s (median; {each}), "
              f"its host TU's compile {statistics.median(r['host_compile'] for r in timed):.2f} s, "
              f"the precompiled preamble alone {floor:.2f} s")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
