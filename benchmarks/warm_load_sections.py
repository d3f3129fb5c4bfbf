"""Where kernelkit's warm load of a package's extension spends its time, section by section, in new processes.

A warm load is cpp_extension_bench's ``warm``: a new process, torch imported, loading what is built. Each process
times the load call as a whole and by section: every loader function in SECTIONS is wrapped, in each kernelkit
module that holds it, by a timer adding up its inclusive time and its calls. Sections nest as SECTIONS indents
them; ``other`` is the load's time outside the top-level ones. Each process also reports the CPU it ended on and
whether the library's sha256 was computed (the first load after a build does; later ones keep its identity).
Usage: python benchmarks/warm_load_sections.py [--style raster15] [--loads 15] [--out sections.json]
[--profile 40]
(one cold build first, then one new process per load: 3-4 s each on a 16-core GPU host)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from cpp_extension_bench import PACKAGE_STYLES, _prepare, _run
from pch_wait import wait_for_pch_builders

# (module under kernelkit, function, depth): the warm path of kernelkit.cpp_extension.load, in the order it runs
SECTIONS = [
    ("loading.extensions", "_checked_paths", 0),
    ("jit.plan", "plan_extension", 0),
    ("jit.toolchain", "check_cuda_match", 1),
    ("jit.toolchain", "arch_list", 1),
    ("jit.plan", "_torch_style_flags", 1),
    ("jit.plan", "link_flags", 1),
    ("jit.fast.recall", "call_key", 1),
    ("jit.fast.recall", "recall", 1),
    ("loading.opening", "open_extension", 0),
    ("loading.opening", "refuse_redefined_namespaces", 1),
    ("jit.fast.recall", "verified_library", 1),
    ("jit.cache", "verified_library", 2),  # the sha256 of the library
    ("jit.library", "import_extension", 1),
    ("jit.registry", "add_extension", 1),
]

WORKER = r"""
import functools, importlib, json, os, sys, time
from kernelkit import cpp_extension as ext
sections, work, call = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
spent, calls = {}, {}

def timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
            calls[label] = calls.get(label, 0) + 1
    return wrapper

for module, name, _ in sections:
    original = getattr(importlib.import_module("kernelkit." + module), name)
    wrapper = timed(f"{module}.{name}", original)
    for m in list(sys.modules.values()):  # `from x import f` binds f in the importer too
        if getattr(m, "__name__", "").startswith("kernelkit") and getattr(m, name, None) is original:
            setattr(m, name, wrapper)
kwargs = dict(call["kwargs"])
if "extra_include_paths" in kwargs:
    kwargs["extra_include_paths"] = [os.path.join(work, p) for p in kwargs["extra_include_paths"]]
paths = [os.path.join(work, s) for s in call["sources"]]
if len(sys.argv) > 4:  # a profiled load: its top functions to stdout
    import cProfile, pstats
    with cProfile.Profile() as prof:
        ext.load(call["name"], paths, **kwargs)
    rows = [(v[2], v[3], v[1], f"{k[0]}:{k[1]}({k[2]})") for k, v in pstats.Stats(prof).stats.items()]
    for column in (0, 1):  # by own time, then by inclusive time
        print(f"{'own us':>8} {'incl us':>8} {'calls':>6}  function")  # pstats rounds to ms
        for own, incl, n, where in sorted(rows, key=lambda r: r[column], reverse=True)[:int(sys.argv[4])]:
            print(f"{own * 1e6:8.1f} {incl * 1e6:8.1f} {n:6d}  {where[-110:]}")
    sys.exit(0)
t = time.perf_counter()
ext.load(call["name"], paths, **kwargs)
total = time.perf_counter() - t
cpu = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU it last ran on
print(json.dumps({"total": total, "spent": spent, "calls": calls, "cpu": cpu}))
"""


def measure(style: str, loads: int, root: Path, cuda: bool, profile: int = 0) -> list:
    work = root / style
    work.mkdir()
    spec, call = _prepare(style, work, cuda)
    cache = root / "kk_cache"  # beside the sources, as cpp_extension_bench keeps it
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    print(f"{style}: cold build {_run('kernelkit', style, 'cold', work, env, spec, call):.1f} s", flush=True)
    wait_for_pch_builders(cache)
    rows = []
    for _ in range(loads):
        out = subprocess.run([sys.executable, "-c", WORKER, json.dumps(SECTIONS), str(work), json.dumps(call)],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"warm load failed:\n{out.stderr[-4000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if profile:  # after the timed loads, so that it cannot change what they measure
        out = subprocess.run([sys.executable, "-c", WORKER, "[]", str(work), json.dumps(call), str(profile)],
                             capture_output=True, text=True, env=env)
        print(out.stdout if out.returncode == 0 else out.stderr[-4000:])
    return rows


def report(rows: list) -> None:
    def ms(values):
        return f"{statistics.median(values) * 1e3:7.3f} {min(values) * 1e3:7.3f} {max(values) * 1e3:7.3f}"

    print(f"{'section':52} {'median':>7} {'min':>7} {'max':>7}  calls per load (ms)")
    print(f"{'load call':52} {ms([r['total'] for r in rows])}")
    for module, name, depth in SECTIONS:
        label = f"{module}.{name}"
        values = [r["spent"].get(label, 0.0) for r in rows]
        print(f"{'  ' * (depth + 1) + label:52} {ms(values)}  {sorted({r['calls'].get(label, 0) for r in rows})}")
    top = [f"{m}.{n}" for m, n, d in SECTIONS if d == 0]
    print(f"{'  other':52} {ms([r['total'] - sum(r['spent'].get(t, 0.0) for t in top) for r in rows])}")
    print("load calls in order (ms):", [round(r["total"] * 1e3, 2) for r in rows])
    print("CPU of each:", [r["cpu"] for r in rows])
    print("library hashed:", [r["calls"].get("jit.cache.verified_library", 0) > 0 for r in rows])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--style", default="raster15", choices=PACKAGE_STYLES)
    p.add_argument("--loads", type=int, default=15, help="new processes, each timing one warm load")
    p.add_argument("--out", help="write every process's sections here (JSON)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="one more load under cProfile: its N top functions by own and by inclusive time")
    args = p.parse_args()
    print(f"GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.style, args.loads, Path(tmp), torch.cuda.is_available(), args.profile)
    report(rows)
    if args.out:
        Path(args.out).write_text(json.dumps({"style": args.style, "sections": SECTIONS, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
