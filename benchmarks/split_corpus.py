"""The split's differential corpus on a GPU: every case's steps built by kernelkit and by torch's own loader,
outputs compared bit for bit, each build timed.

Cases are folders of tests/fixtures/split_corpus (or --root, e.g. the held-out tests/fixtures/split_probes),
each with its sources and a scripted list of the edits people make (corpus.py). kernelkit builds a case's steps
in one process, one after the other, as a notebook would (a TORCH_LIBRARY case, whose namespace a process can
define once, in one process per step), with the files edited in place; torch builds each chosen step in a new
process into one build directory per case, so ninja rebuilds only what changed (torch's incremental rebuild,
its fastest edit). A step that must not compile must fail in both, kernelkit citing the file and line.

Usage: python benchmarks/split_corpus.py [--root DIR] [--cases NAME ...] [--torch-steps all|original|none]
       [--torch-kinds KIND ...] [--jobs N] [--sequential] [--torch-apart N] [--out results.json] [--fast-off]
       [--build-only]
On a GPU host within a device call's 10 minutes: --torch-apart 16 (torch's steps side by side) and few --cases.
Timing (the edit-kind benchmark): --jobs 1 --sequential (torch's builds after kernelkit's, so neither slows the
other), with --torch-kinds naming the edit kinds torch also builds (torch rebuilds a one-file extension whole
whatever the edit).
Exit status 1 when any output differs or a build disagrees; the JSON holds every step's times and paths.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "split_corpus"
sys.path.insert(0, str(CORPUS))

from corpus import cases, texts_after  # noqa: E402


def _write(folder: Path, texts) -> None:
    for rel, text in texts.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def _path_taken(said: str) -> str:
    if "split (" in said:
        return "split+proof" if "proven" in said else "split"
    if "device code only" in said:
        return "device only"
    if "full nvcc build" in said:
        return "as written"
    return "cached" if "building" not in said else "other"


def child_kernelkit(root: Path, name: str, work: Path, out: Path, steps, build_only: bool) -> None:
    """Build ``steps`` of case ``name`` in this process, saving each step's outputs (unless ``build_only``: a
    machine without a GPU) and a line of JSON per step."""
    import torch

    import kernelkit
    from kernelkit.errors import BuildError

    case = cases(root)[name]
    folder = work / name
    for index in steps:
        _write(folder, texts_after(root / name, case, index))
        said = io.StringIO()
        real, sys.stderr = sys.stderr, said
        t0 = time.perf_counter()
        try:
            module = kernelkit.load(f"kkc_{name}", [str(folder / s) for s in case.sources],
                                    is_python_module=case.pybind, **case.load)
            error = ""
        except BuildError as e:
            module, error = None, str(e)
        finally:
            seconds = time.perf_counter() - t0
            sys.stderr = real
        row = {"step": index, "seconds": seconds, "path": _path_taken(said.getvalue()), "error": error[-3000:],
               "said": said.getvalue()[-1500:]}
        if not error and not build_only:
            try:
                outputs = case.run(module if case.pybind else None, "cuda")
                torch.cuda.synchronize()
                torch.save([o.cpu() if isinstance(o, torch.Tensor) else o for o in outputs], out / f"kk_{index}.pt")
            except Exception as e:  # noqa: BLE001 - compared with torch's run below
                row["run_error"] = f"{type(e).__name__}: {e}"[-3000:]
        print(json.dumps(row), flush=True)


def _run_kernelkit(root: Path, name: str, work: Path, out: Path, n_steps: int, env, build_only: bool) -> list:
    case = cases(root)[name]
    groups = [[i] for i in range(-1, n_steps)] if case.namespace else [list(range(-1, n_steps))]
    rows = []
    for steps in groups:
        cmd = [sys.executable, __file__, "--child", name, "--root", str(root), "--work", str(work), "--into", str(out),
               "--steps=" + ",".join(map(str, steps))] + (["--build-only"] if build_only else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        rows += [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0:
            rows.append({"step": steps[-1], "crash": proc.stderr[-3000:]})
    return rows


def _run_torch_apart(root: Path, name: str, out: Path, steps, build: Path, slots) -> dict:
    """Each step built by torch in a build directory of its own, side by side: a whole build per step (what
    torch's incremental rebuild of a one-file extension is anyway), so a case's torch side ends in one build's
    time on a host with cores to spare. For correctness runs; its seconds are not an edit's."""
    # torch_build.py writes a step's sources beside its build directory (in its parent's src/): a parent per step,
    # or the steps' texts overwrite one another while the others compile
    with concurrent.futures.ThreadPoolExecutor(max(1, len(steps))) as pool:
        parts = pool.map(lambda i: _run_torch(root, name, out, [i], build / f"step{i}" / "build", slots), steps)
        return {k: v for part in parts for k, v in part.items()}


def _run_torch(root: Path, name: str, out: Path, steps, build: Path, slots) -> dict:
    """``slots``: a semaphore bounding the torch builds of every case at once (--torch-apart N)."""
    rows = {}
    for index in steps:
        meta = out / f"torch_{index}.json"
        cmd = [sys.executable, str(CORPUS / "torch_build.py"), name, str(index), "--root", str(root),
               "--out", str(out / f"torch_{index}.pt"), "--meta", str(meta), "--build", str(build)]
        with slots:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        rows[index] = json.loads(meta.read_text()) if meta.exists() else \
            {"built": False, "error": f"no result (exit {proc.returncode}): {proc.stderr[-1500:]}"}
        if proc.returncode < 0 or "died" in rows[index].get("run_error", ""):  # say how, for the next look
            rows[index]["run_error"] = f"{rows[index].get('run_error', '')} (exit {proc.returncode}): " \
                                       f"{(proc.stdout + proc.stderr)[-1500:]}"
    return rows


def _equal(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a, b) or torch.equal(a.nan_to_num(), b.nan_to_num())
    return a == b


def run_case(root: Path, name: str, work: Path, torch_steps: str, env, build_only: bool, kinds=(),
             sequential: bool = False, apart: bool = False, slots=None) -> dict:
    """``slots``: the semaphore every case's torch builds share (main's: N at once with --torch-apart N)."""
    import torch

    case = cases(root)[name]
    out = work / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    n = len(case.steps)
    chosen = {"all": list(range(-1, n)), "original": [-1], "none": []}[torch_steps]
    if kinds:
        chosen = [i for i in chosen if (case.steps[i].kind if i >= 0 else "original") in kinds]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        if sequential:
            mine = _run_kernelkit(root, name, work / "kk_src", out, n, env, build_only)
        theirs = pool.submit(_run_torch_apart if apart else _run_torch, root, name, out, chosen,
                             work / "torch_build" / name, slots or threading.BoundedSemaphore(1))
        if not sequential:
            mine = _run_kernelkit(root, name, work / "kk_src", out, n, env, build_only)
        torch_rows = theirs.result()
    problems, steps = [], []
    for row in mine:
        index = row["step"]
        kind = "original" if index < 0 else case.steps[index].kind
        expect = "ok" if index < 0 else case.steps[index].expect
        entry = {"step": index, "kind": kind, **{k: row.get(k) for k in ("seconds", "path")}}
        if "crash" in row:
            problems.append(f"step {index}: kernelkit's process crashed: {row['crash'][-400:]}")
            steps.append(entry)
            continue
        if expect == "error":
            step = case.steps[index]
            if not row["error"]:
                problems.append(f"step {index} ({kind}): kernelkit built a step that must not compile")
            elif f"{Path(step.error_file).name}:{step.error_line}" not in row["error"]:
                problems.append(f"step {index} ({kind}): kernelkit's error does not cite "
                                f"{step.error_file}:{step.error_line}: {row['error'][:300]}")
        elif row["error"]:
            problems.append(f"step {index} ({kind}): kernelkit failed: {row['error'][:600]}")
        if index in torch_rows:
            t = torch_rows[index]
            entry["torch_seconds"] = t.get("seconds")
            if expect == "error" and t.get("built"):
                problems.append(f"step {index}: torch built a step the corpus says does not compile")
            if expect == "ok" and not t.get("built"):
                problems.append(f"step {index}: torch's build failed: {t.get('error', '')[:300]}")
            failed_runs = [bool(row.get("run_error")), bool(t.get("run_error"))]
            if expect == "ok" and t.get("built") and not row["error"] and not build_only and any(failed_runs):
                if not all(failed_runs):
                    problems.append(f"step {index} ({kind}): running it failed in one build only: kernelkit "
                                    f"{row.get('run_error', '')[:300]!r}, torch {t.get('run_error', '')[:300]!r}")
            elif expect == "ok" and t.get("built") and not row["error"] and not build_only:
                a, b = torch.load(out / f"kk_{index}.pt"), torch.load(out / f"torch_{index}.pt")
                same = len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
                entry["equal"] = same
                if not same:
                    problems.append(f"step {index} ({kind}): outputs differ from torch's build")
        steps.append(entry)
    return {"case": name, "construct": case.construct, "steps": steps, "problems": problems}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=str(CORPUS))
    ap.add_argument("--cases", nargs="*")
    ap.add_argument("--torch-steps", choices=("all", "original", "none"), default="all")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--out", default="")
    ap.add_argument("--fast-off", action="store_true", help="KERNELKIT_FAST=0: every fast path off")
    ap.add_argument("--build-only", action="store_true", help="compile and link only (no GPU): no outputs compared")
    ap.add_argument("--torch-kinds", nargs="*", default=(), help="only these step kinds are built by torch too")
    ap.add_argument("--sequential", action="store_true", help="torch's builds of a case after kernelkit's")
    ap.add_argument("--torch-apart", type=int, default=0, metavar="N",
                    help="torch builds every step of a case in a directory of its own, N at once over all cases "
                         "(a correctness run that ends within a device call; not for timing)")
    ap.add_argument("--work", default="")
    ap.add_argument("--child", default="")
    ap.add_argument("--into", default="")
    ap.add_argument("--steps", default="")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    if args.child:
        child_kernelkit(root, args.child, Path(args.work), Path(args.into), [int(s) for s in args.steps.split(",")],
                        args.build_only)
        return 0
    names = args.cases or sorted(cases(root))
    work = Path(args.work or tempfile.mkdtemp(prefix="kk-split-corpus-"))
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(work / "kk_cache"))
    if args.fast_off:
        env["KERNELKIT_FAST"] = "0"
    slots = threading.BoundedSemaphore(args.torch_apart or os.cpu_count() or 1)
    t0 = time.time()
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_case, root, n, work, args.torch_steps, env, args.build_only, args.torch_kinds,
                               args.sequential, bool(args.torch_apart), slots) for n in names]
        for future in concurrent.futures.as_completed(futures):  # reported and written as each case ends
            r = future.result()
            results.append(r)
            times = " ".join(f"{s['kind']}={s['seconds']:.2f}s/{s['path']}" for s in r["steps"] if s.get("seconds"))
            print(f"{'FAIL' if r['problems'] else 'ok  '} {r['case']}: {times}", flush=True)
            for p in r["problems"]:
                print(f"     {p}", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps({"root": str(root), "fast_off": args.fast_off,
                                                      "seconds": time.time() - t0, "results": results}, indent=1))
    bad = [r for r in results if r["problems"]]
    print(f"{len(results) - len(bad)}/{len(results)} cases agree with torch's builds ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
