"""Ahead-of-time vs just-in-time: build times, and the first-call latency of an op in a fresh process.

    python benchmarks/aot_latency.py [--ops sigmoid] [--arch 9.0] [--device cpu|cuda] [--wheel] [--json out.json]

Measures, each in a new interpreter with its own empty or warm cache:
  * AOT build: ``python -m kernelkit.aot --out DIR`` (torch's BuildExtension) of ``--ops``, cold objects
  * wheel build (``--wheel``): ``KERNELKIT_AOT=1 pip wheel --no-build-isolation`` of every built-in card
  * first call in a fresh process: import, ``kernelkit.load``, first op call (synchronized), for
    - AOT: a matching prebuilt (KERNELKIT_PREBUILT_PATH), empty JIT cache
    - cached JIT: the cache filled by the cold run
    - cold JIT: an empty cache (compiles the card: device TU, binding TU, link)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import torch, kernelkit
t1 = time.perf_counter()
op, arch, device = sys.argv[1:4]
lib = kernelkit.load(op, arch=arch)
t2 = time.perf_counter()
args = lib.spec.make_inputs((1 << 16,), device=device)
t3 = time.perf_counter()
getattr(lib, op)(*args)
if device == "cuda":
    torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_call_s": t4 - t3, "path": str(lib.path)}))
"""


def run(cmd, env, what):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{what} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", default=["sigmoid"], help="cards to build and time (default: sigmoid)")
    p.add_argument("--arch", default=os.environ.get("KERNELKIT_ARCH", "9.0"))
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--wheel", action="store_true", help="also time the opt-in wheel build of every card")
    p.add_argument("--workdir", help="where to build (default: a temporary directory)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kk-aot-bench-")).resolve()
    prebuilt = work / "prebuilt"
    base = {k: v for k, v in os.environ.items() if k not in ("KERNELKIT_PREBUILT_PATH", "KERNELKIT_CACHE_DIR")}
    base["KERNELKIT_VERBOSE"] = "0"
    results = {"arch": args.arch, "device": args.device, "cpus": os.cpu_count(), "ops": {}}

    aot_cmd = [sys.executable, "-c", "import sys; from kernelkit import aot; sys.exit(aot.main(sys.argv[1:]))",
               "--out", str(prebuilt), "--arch", args.arch, "--build-temp", str(work / "aot-temp"), *args.ops]
    _, results["aot_build_s"] = run(aot_cmd, {**base, "KERNELKIT_CACHE_DIR": str(work / "aot-cache")}, "AOT build")
    print(f"AOT build of {' '.join(args.ops)} ({args.arch}): {results['aot_build_s']:.1f} s", flush=True)
    if args.wheel:
        wenv = {**base, "KERNELKIT_AOT": "1", "KERNELKIT_ARCH": args.arch, "KERNELKIT_AOT_BUILD_DIR": str(work / "wheel-build"),
                "KERNELKIT_CACHE_DIR": str(work / "wheel-cache")}
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(work / "wheels"), str(REPO)]
        _, results["wheel_build_s"] = run(cmd, wenv, "wheel build")
        whl = next((work / "wheels").glob("kernelkit-*.whl"))
        results["wheel_mb"] = round(whl.stat().st_size / 2**20, 2)
        print(f"wheel of every card ({args.arch}): {results['wheel_build_s']:.1f} s, {results['wheel_mb']} MB", flush=True)

    for op in args.ops:
        cache = work / f"jit-cache-{op}"
        modes = [("cold JIT", {"KERNELKIT_CACHE_DIR": str(cache)}),
                 ("cached JIT", {"KERNELKIT_CACHE_DIR": str(cache)}),
                 ("AOT", {"KERNELKIT_CACHE_DIR": str(work / f"aot-run-cache-{op}"), "KERNELKIT_PREBUILT_PATH": str(prebuilt)})]
        rows = {}
        for mode, extra in modes:
            proc, wall = run([sys.executable, "-c", PROBE, op, args.arch, args.device], {**base, **extra}, f"{mode} {op}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["process_s"] = wall
            row["prebuilt"] = row.pop("path").startswith(str(prebuilt))
            rows[mode] = row
        results["ops"][op] = rows

    print(f"\nfirst call in a fresh process ({args.device}, {os.cpu_count()} cpus)")
    print(f"{'op':<16} {'mode':<11} {'import':>8} {'load':>9} {'1st call':>9} {'process':>9}  prebuilt")
    for op, rows in results["ops"].items():
        for mode, r in rows.items():
            print(f"{op:<16} {mode:<11} {r['import_s']:>7.2f}s {r['load_s']:>8.3f}s {r['first_call_s'] * 1e3:>7.1f}ms "
                  f"{r['process_s']:>8.2f}s  {'yes' if r['prebuilt'] else 'no'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
