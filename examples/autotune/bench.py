"""Autotuned raw CUDA against Triton's autotuner, torch.compile, eager PyTorch and the copy floor (needs a GPU).

    PYTHONPATH=examples python -m autotune.bench [--ops softmax transpose] [--runs 3] [--json autotune.json]

For each op: kernelkit.autotune over its space in a fresh cache (every NVRTC compile included in the wall
time), then ``--runs - 1`` more tunings of the same space (compiles cached) to see whether the winner holds;
then the tuned kernel, Triton's autotuned kernel, torch.compile, eager PyTorch and a device copy of the same
bytes (the floor) timed side by side in one run, each op checked against the float64 reference first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

SHAPES = {"softmax": (8192, 4096), "transpose": (8192, 8192)}
#: Triton's tl.exp is an approximation: its softmax is ~2.5e-4 from the float64 reference where expf's is ~1e-6
TRITON_RTOL = 1e-3


def _margin(result) -> str:
    """The winner's lead over the runner-up (the runner-up's paired time ratio), or why there is none."""
    others = [c for c in result.candidates if c.vs_best is not None]
    if not others:
        return "no runner-up timed to the end"
    return str(min(others, key=lambda c: c.vs_best.median).vs_best)


def tune(name: str, runs: int, budget_ms: float) -> dict:
    import kernelkit
    from autotune import softmax, transpose

    op = {"softmax": softmax, "transpose": transpose}[name]
    shape = SHAPES[name]
    rows = []
    for run in range(runs):
        t0 = time.perf_counter()
        result = kernelkit.autotune(op.make, op.SPACE, constraint=getattr(op, "constraint", None),
                                    reference=op.reference, inputs=op.inputs, shape=shape, name=name,
                                    check_shapes=[shape, (37, shape[1] + 3), (9, 5)],  # odd columns as well
                                    source=op.SRC, device="cuda", rtol=1e-4, atol=1e-6, retune=True,
                                    budget_ms=budget_ms)
        wall = time.perf_counter() - t0
        counts = {s: sum(c.status == s for c in result.candidates) for s in ("ok", "pruned", "wrong", "failed")}
        rows.append({"run": run + 1, "wall_s": wall, "phases_s": result.phases, "best": result.best,
                     "margin": _margin(result), "configurations": len(result.candidates), "statuses": counts})
        print(f"{name} tuning run {run + 1}: {wall:.2f} s {result.phases}, {len(result.candidates)} configurations "
              f"{counts}, "
              f"best {result.best}, lead over the runner-up {rows[-1]['margin']}", flush=True)
        if run == 0:
            print(result.table(), flush=True)
    return {"shape": shape, "runs": rows, "best": rows[-1]["best"]}


def side_by_side(name: str, best: dict, budget_ms: float) -> dict:
    import kernelkit
    from autotune import softmax, transpose, triton_kernels
    from kernelkit.harness.bandwidth import copy_contender, tensor_bytes
    from kernelkit.harness.timing import Timing, paired_ratio, time_together

    op = {"softmax": softmax, "transpose": transpose}[name]
    shape = SHAPES[name]
    eager = {"softmax": lambda x: torch.softmax(x, dim=-1), "transpose": lambda x: x.t().contiguous()}[name]
    contenders = {"kernelkit (tuned)": op.make(best), "triton (autotuned)": getattr(triton_kernels, name),
                  "torch.compile": torch.compile(eager), "eager": eager}
    first_call, wrong = {}, {}
    for label, fn in contenders.items():  # Triton tunes and torch.compile compiles here
        t0 = time.perf_counter()
        rtol = TRITON_RTOL if label.startswith("triton") else 1e-4
        result = kernelkit.check(fn, op.reference, inputs=op.inputs, shapes=[shape, (shape[0] - 3, shape[1] - 5)],
                                 dtypes=[torch.float32], device="cuda", trials=2, rtol=rtol, atol=1e-6,
                                 contract=False)
        first_call[label] = time.perf_counter() - t0
        if not result.ok:
            print(f"{name}: {label} does not match the reference (not timed):\n{result}", flush=True)
            wrong[label] = result.status
    (x,) = op.inputs(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    calls = {label: (lambda fn=fn: fn(x)) for label, fn in contenders.items() if label not in wrong}
    moved = tensor_bytes(x, contenders["eager"](x))  # the input read once, the output written once
    calls["copy of the same bytes (floor)"] = copy_contender(moved, x.device)
    times = time_together(calls, "cuda", budget_ms=budget_ms)
    ours = times["kernelkit (tuned)"]
    rows = {label: {"error": f"wrong: {status}"} for label, status in wrong.items()}
    for label, t in times.items():
        if not isinstance(t, Timing):
            rows[label] = {"error": f"{type(t).__name__}: {t}"}
            continue
        ratio = paired_ratio(ours.samples_us, t.samples_us)
        rows[label] = {"median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us,
                       "vs_kernelkit": [ratio.median, ratio.lo, ratio.hi], "first_call_s": first_call.get(label),
                       "GB_per_s": moved / (t.median_us * 1e-6) / 1e9}
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    p.add_argument("--runs", type=int, default=3, help="tunings of each space (the first in a fresh cache)")
    p.add_argument("--tune-budget-ms", type=float, default=100.0, help="tuning's timing budget per configuration")
    p.add_argument("--budget-ms", type=float, default=300.0, help="side by side: timing budget per contender")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["KERNELKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kk-autotune-")  # the first tuning compiles all
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "ops": {}}
    for name in args.ops:
        tuned = tune(name, args.runs, args.tune_budget_ms)
        tuned["side_by_side"] = side_by_side(name, tuned["best"], args.budget_ms)
        out["ops"][name] = tuned
        if args.json:  # after each op: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
    print(f"\n{out['gpu']}, torch {out['torch']}")
    print("| op, shape | contender | median us [p20, p80] | GB/s | kernelkit's speedup over it [95% CI] |")
    print("|---|---|---|---|---|")
    for name, r in out["ops"].items():
        for label, row in r["side_by_side"].items():
            if "error" in row:
                print(f"| {name} {r['shape']} | {label} | {row['error']} | | |")
                continue
            m, lo, hi = row["vs_kernelkit"]
            print(f"| {name} {r['shape']} | {label} | {row['median_us']:.1f} [{row['p20_us']:.1f}, {row['p80_us']:.1f}]"
                  f" | {row['GB_per_s']:.0f} | {m:.3f}x [{lo:.3f}, {hi:.3f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
