"""A card's math edit -> usable op, in one live process: the layout ``kernelkit new`` writes (the functors in
``<card>_math.h``, compiled for CUDA by the ``.cu`` and for the CPU by ``<card>_cpu.cpp``) against the layout
before it (the functors in the ``.cu``, which also compiles their CPU loop), the first layout linked against torch's
libraries on every edit (``KERNELKIT_LINK_STAND_INS=0``) and with its ``.cu`` never compiled in dtype shards
(``KERNELKIT_DTYPE_SHARDS=0``; by default it is, on 4 cores or more), side by side in one run, each with its own
fresh cache.

Each edit changes the EDIT line of a unary card with a backward, loads it again and calls the op until it gives
the new math: on the CPU, and on CUDA when a GPU is visible. Usage:
    python benchmarks/card_edit_bench.py [--edits 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
from pathlib import Path
import torch
import kernelkit
from kernelkit.jit import running
from kernelkit.frontends import scaffold
from kernelkit.jit import build, cards, fastcall, plan

layout, d, edits = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, sys.argv[4])  # benchmarks/
from pch_wait import wait_for_pch_builders
files = scaffold.card_files("bench_cube", "unary", backward=True)
if layout == "cu":  # the functors in the .cu, which compiles their CUDA launchers and CPU loops
    math = files.pop("bench_cube_math.h").replace("KK_MATH_FN", "KK_HD")
    math = math[math.index("namespace kk {"):]
    files.pop("bench_cube_cpu.cpp")
    files["bench_cube.cu"] = ("#include <kernelkit/elementwise.cuh>\n" + math +
                              "KK_UNARY_LAUNCHER(kk::BenchCubeOp)\nKK_BINARY_LAUNCHER(kk::BenchCubeBackwardOp)\n")
    spec = files["bench_cube.py"]
    files["bench_cube.py"] = spec.replace(spec[spec.index(",\n                      sources="):spec.index(")  # EDIT: shapes")], "")
for name, text in files.items():
    if not name.startswith("test_"):
        (d / name).write_text(text)
math_file = d / ("bench_cube.cu" if layout == "cu" else "bench_cube_math.h")
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def settle():  # what the first build starts in the background: an edit as a user sees it minutes later
    if fastcall.background_build_pays():
        fastcall.module()
    wait_for_pch_builders(Path(os.environ["KERNELKIT_CACHE_DIR"]))


def usable(k):
    for dev in devices:
        x = torch.randn(1 << 16, device=dev)
        y = kernelkit.ops.bench_cube(x)
        assert torch.allclose(y, x * x + k, rtol=1e-5, atol=1e-5), f"wrong result on {dev}"
    if "cuda" in devices:
        torch.cuda.synchronize()


t0 = time.perf_counter()
kernelkit.load("bench_cube", kernels_dir=d)
usable(0)
units = plan.plan_card(cards.find("bench_cube", d), None, [], [], [], []).units
out = {"cold": time.perf_counter() - t0, "edits": [], "compiles": [], "cu_units": sum(u.kind == "cu" for u in units)}
settle()
text = math_file.read_text()
for k in range(1, edits + 1):
    math_file.write_text(text.replace("return x * x; }  // EDIT", f"return x * x + A({k}); }}  // EDIT"))
    before = running.STATS["compiles"]
    t0 = time.perf_counter()
    kernelkit.load("bench_cube", kernels_dir=d)
    usable(k)
    out["edits"].append(time.perf_counter() - t0)
    out["compiles"].append(running.STATS["compiles"] - before)
print(json.dumps(out))
"""


def run(layout: str, settings: dict, edits: int) -> dict:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as cards:
        env = dict(os.environ, KERNELKIT_CACHE_DIR=cache, **settings)
        here = os.path.dirname(os.path.abspath(__file__))
        p = subprocess.run([sys.executable, "-c", CHILD, layout, cards, str(edits), here], capture_output=True,
                           text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{layout} child failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        gpu = "no GPU (CPU op only)"
    return f"{gpu}; {os.cpu_count()} CPUs; {platform.python_version()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    runs = [("apart", {}, "math apart: _math.h, .cu, _cpu.cpp (kernelkit new)"),
            ("apart", {"KERNELKIT_LINK_STAND_INS": "0"}, "math apart, linked against torch itself"),
            ("apart", {"KERNELKIT_DTYPE_SHARDS": "0"}, "math apart, the .cu never in dtype shards"),
            ("cu", {}, "functors in the .cu, which compiles the CPU loops too")]
    results = {name: run(layout, settings, args.edits) for layout, settings, name in runs}
    print(f"machine: {machine()}")
    print("| layout | settings | .cu TUs | cold build -> usable | math edit -> usable: median (all) "
          "| compiles per edit |")
    print("|---|---|---|---|---|---|")
    for _, settings, name in runs:
        r = results[name]
        every = ", ".join(f"{t:.2f}" for t in r["edits"])
        print(f"| {name} | {' '.join(f'{k}={v}' for k, v in settings.items()) or 'defaults'} | {r['cu_units']} "
              f"| {r['cold']:.1f} s | {statistics.median(r['edits']):.2f} s ({every}) | {max(r['compiles'])} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), **results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
