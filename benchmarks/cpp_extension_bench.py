"""torch.utils.cpp_extension vs kernelkit on the same torch-style extension sources, side by side.

For each style tutorials use (tests/fixtures/torch_ext), and each loader, in fresh processes:
  cold  - first build into an empty cache/build directory;
  warm  - a new process loading what is built (the time of the load call);
  edit  - in one process (the notebook loop): load, change one constant in the kernel body, load again
          (the time of the second call, until the new function is callable).
Usage: python benchmarks/cpp_extension_bench.py [--styles cem sigmoid mul cem_ported] [--out results.json]
(the four styles take about 20 minutes on a 16-core host; pass a few --styles per run)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "torch_ext"

# style -> (files to copy, the file holding the kernel body, the text an edit replaces, what replaces it)
STYLES = {
    "cem": (["sample.cu", "sample.cpp"], "sample.cu", "sigma[row] * curand_normal", "sigma[row] * 1.0f * curand_normal"),
    "sigmoid": (["sigmoid_inline.py"], None, "1.0f", "2.0f"),
    "mul": (["mul.cu"], "mul.cu", "a[i] * b[i]", "b[i] * a[i]"),
    "cem_ported": (["sample_kernel.cu", "sample_ported.cpp"], "sample_kernel.cu", "sigma[row] * curand_normal",
                   "sigma[row] * 1.0f * curand_normal"),
}

WORKER = r"""
import json, sys, time
from pathlib import Path
tool, style, phase, work = sys.argv[1:5]
work = Path(work)
if tool == "torch":
    from torch.utils import cpp_extension as ext
    extra = {"build_directory": str(work / "torch_build")}
else:
    from kernelkit import cpp_extension as ext
    extra = {}
(work / "torch_build").mkdir(exist_ok=True)
sys.path.insert(0, str(work))

def load(scale="1.0f"):
    if style == "sigmoid":
        import sigmoid_inline as s
        return ext.load_inline("bench_sigmoid", s.CPP, s.cuda_source(scale), functions=["sigmoid"], **extra)
    files = {"cem": ["sample.cu", "sample.cpp"], "mul": ["mul.cu"],
             "cem_ported": ["sample_kernel.cu", "sample_ported.cpp"]}[style]
    return ext.load("bench_" + style, [str(work / f) for f in files], extra_cuda_cflags=["-O3"], **extra)

def edit(path, old, new):
    p = work / path
    p.write_text(p.read_text().replace(old, new, 1))

if phase in ("cold", "warm"):
    t = time.perf_counter(); m = load(); seconds = time.perf_counter() - t
else:
    m = load()
    spec = json.loads(sys.argv[5])
    t = time.perf_counter()
    if spec["file"]:
        edit(spec["file"], spec["old"], spec["new"])
        m2 = load()
    else:
        m2 = load("2.0f")
    seconds = time.perf_counter() - t
    assert m2 is not m
print(json.dumps({"seconds": seconds}))
"""


def _run(tool: str, style: str, phase: str, work: Path, env: dict, edit_spec: dict) -> float:
    out = subprocess.run([sys.executable, "-c", WORKER, tool, style, phase, str(work), json.dumps(edit_spec)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} {style} {phase} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def measure(style: str, tool: str, root: Path) -> dict:
    files, kernel_file, old, new = STYLES[style]
    work = root / f"{style}-{tool}"
    work.mkdir()
    for f in files:
        shutil.copy(FIXTURES / f, work / f)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(work / "torch_ext_root"),
               KERNELKIT_CACHE_DIR=str(work / "kk_cache"), PYTHONUNBUFFERED="1")
    spec = {"file": kernel_file, "old": old, "new": new}
    result = {"cold": _run(tool, style, "cold", work, env, spec), "warm": _run(tool, style, "warm", work, env, spec)}
    result["edit"] = _run(tool, style, "edit", work, env, spec)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--styles", nargs="+", default=list(STYLES), choices=list(STYLES))
    p.add_argument("--tools", nargs="+", default=["torch", "kernelkit"], choices=["torch", "kernelkit"])
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    rows = {}
    with tempfile.TemporaryDirectory(prefix="kk-ext-bench-") as tmp:
        for style in args.styles:
            for tool in args.tools:
                rows.setdefault(style, {})[tool] = measure(style, tool, Path(tmp))
                print(style, tool, {k: round(v, 3) for k, v in rows[style][tool].items()}, flush=True)
    print(f"\n{gpu}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print("| style | phase | torch | kernelkit | torch / kernelkit |\n|---|---|---|---|---|")
    for style, r in rows.items():
        for phase in ("cold", "warm", "edit"):
            if len(r) < 2:
                continue
            t, k = r["torch"][phase], r["kernelkit"][phase]
            fmt = (lambda s: f"{s * 1e3:.1f} ms") if phase == "warm" else (lambda s: f"{s:.2f} s")
            print(f"| {style} | {phase} | {fmt(t)} | {fmt(k)} | {t / k:.1f}x |")
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": gpu, "cpus": os.cpu_count(), "torch": torch.__version__,
                                              "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
