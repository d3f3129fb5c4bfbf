"""torch.utils.cpp_extension vs kernelkit on the same torch-style extension sources, side by side.

For each style tutorials use (tests/fixtures/torch_ext) and each repository shape (tests/fixtures/packages: ``gan``,
a GAN repo's plugin; ``raster15``, a rasterizer's 15 sources in three folders, 25 with its .cu files on a GPU;
``torch_library``, PyTorch's custom-op example), and each loader, in fresh processes:
  cold  - first build into an empty cache/build directory;
  warm  - a new process loading what is built (the time of the load call; the median of --warm-repeats
          processes, since one process's milliseconds are at the mercy of a busy machine);
  edit  - in one process (the notebook loop): load, change one constant in the kernel body, load again
          (the time of the second call, until the new function is callable). For TORCH_LIBRARY styles (muladd,
          torch_library) a namespace is defined once per process: the edited file is loaded by a new process;
  host_edit - the same for an edit of the host code (an error message of the wrapper), once kernelkit's
          background precompiled header (16-core hosts; KERNELKIT_PCH) is ready;
  cold_pch - (kernelkit; not the package styles) a new extension on a machine that has built one: the style's
          files in another folder, under another name and with the kernel edit, built into the cache the cold
          build left (its precompiled torch preamble ready), in a new process. ``cold`` is the fresh-cache figure.
The styles lltm (AT_DISPATCH + PackedTensorAccessor) and muladd (TORCH_LIBRARY in the .cu) come from
tests/fixtures/torch_cu.
Usage: python benchmarks/cpp_extension_bench.py [--styles cem sigmoid mul lltm muladd cem_ported gan raster15
       torch_library] [--phases cold warm edit host_edit cold_pch] [--warm-repeats 7] [--out results.json]
(the styles take about 30 minutes on a 16-core host, where each new process importing torch takes 3-4 s;
pass a few --styles per run; --out is rewritten after each style and tool, so a run cut short keeps its rows)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pch_wait import wait_for_pch_builders

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "torch_ext"
CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "torch_cu"
PACKAGES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "packages"

# style -> (files to copy, the file holding the kernel body, the text an edit replaces, what replaces it)
STYLES = {
    "cem": (["sample.cu", "sample.cpp"], "sample.cu", "sigma[row] * curand_normal", "sigma[row] * 1.0f * curand_normal"),
    "sigmoid": (["sigmoid_inline.py"], None, "1.0f", "2.0f"),
    "mul": (["mul.cu"], "mul.cu", "a[i] * b[i]", "b[i] * a[i]"),
    "cem_ported": (["sample_kernel.cu", "sample_ported.cpp"], "sample_kernel.cu", "sigma[row] * curand_normal",
                   "sigma[row] * 1.0f * curand_normal"),
    # tests/fixtures/torch_cu: an AT_DISPATCH + PackedTensorAccessor kernel (the LLTM tutorial's shape), and a
    # TORCH_LIBRARY .cu (pytorch/extension-cpp's muladd.cu shape)
    "lltm": (["lltm_accessor.cu"], "lltm_accessor.cu", "d_gates[n][0][c] = d_sigmoid(gates[n][0][c]);",
             "d_gates[n][0][c] = d_sigmoid(gates[n][0][c]) * scalar_t(1);"),
    "muladd": (["muladd_library.cu"], "muladd_library.cu", "a[idx] * b[idx] + c;", "b[idx] * a[idx] + c;"),
}
# style -> (file, text, replacement) of a host-code edit (an error message of the wrapper)
HOST_EDITS = {
    "cem": ("sample.cu", "if (total == 0) return out;", "if (total == 0) { return out; }"),
    "sigmoid": (None, "must be a CUDA tensor", "must be a GPU tensor"),
    "mul": ("mul.cu", "a and b must be CUDA tensors", "a and b must be GPU tensors"),
    "lltm": ("lltm_accessor.cu", "expected (batch, 3, state)", "expected (batch, 3, state) gates"),
    "muladd": ("muladd_library.cu", "TORCH_CHECK(a.sizes() == b.sizes());", "TORCH_CHECK(a.sizes() == b.sizes(), \"a, b\");"),
}
#: a TORCH_LIBRARY namespace is defined once per process: an edit is loaded by a new process
NEW_PROCESS_EDIT = {"muladd", "torch_library"}
STAGES = ["clip", "project", "cull", "raster", "interp", "texture", "mip", "antialias", "blend", "tonemap"]


def package_call(style: str, cuda: bool) -> dict:
    """The load call the package makes (name, sources relative to its folder, keywords), the folder to copy,
    and the edit: a kernel body (the .cu on a GPU; a CPU file of gan and raster15 without one), or none."""
    if style == "gan":
        flags = ["-DGANOPS_WITH_CUDA"] if cuda else []
        return {"dir": "ganops/ganops", "name": "bias_act_plugin",
                "sources": ["bias_act.cpp", "bias_act_cpu.cpp"] + (["bias_act.cu"] if cuda else []),
                "kwargs": {"extra_cflags": flags, "extra_cuda_cflags": flags + ["--use_fast_math"], "with_cuda": cuda},
                "file": "bias_act.cu" if cuda else "bias_act_cpu.cpp", "old": "v *= p.gain;", "new": "v *= p.gain * 1.0f;"}
    if style == "raster15":
        flags = ["-DRASTERISH_TORCH", "-DRASTERISH_GAIN=3"] + (["-DRASTERISH_WITH_CUDA"] if cuda else [])
        sources = (["common/common.cpp", "common/tables.cpp", "common/checks.cpp"] + [f"cpu/{s}_cpu.cpp" for s in STAGES]
                   + ([f"cuda/{s}.cu" for s in STAGES] if cuda else []) + ["torch/torch_ops.cpp", "torch/torch_bindings.cpp"])
        return {"dir": "rasterish/rasterish", "name": "rasterish_plugin", "sources": sources,
                "kwargs": {"extra_cflags": flags + ["-O2"], "extra_cuda_cflags": flags + ["-lineinfo"],
                           "extra_include_paths": ["common"], "with_cuda": cuda},
                "file": "cuda/clip.cu" if cuda else "cpu/clip_cpu.cpp", "old": "y[i] = stage_clip(x[i], p);",
                "new": "y[i] = stage_clip(x[i], p) * 1.0f;"}
    if style == "torch_library":
        return {"dir": "muladd_ext/muladd_ext", "name": "_C",
                "sources": ["csrc/muladd.cpp"] + (["csrc/cuda/muladd.cu"] if cuda else []),
                "kwargs": {"extra_cflags": ["-O2"], "extra_cuda_cflags": ["-O2"], "with_cuda": cuda},
                "file": "csrc/cuda/muladd.cu" if cuda else None, "old": "result[idx] = a[idx] * b[idx] + c;",
                "new": "result[idx] = a[idx] * b[idx] + c * 1.0f;"}
    raise KeyError(style)


PACKAGE_STYLES = ("gan", "raster15", "torch_library")

WORKER = r"""
import json, os, sys, time
from pathlib import Path
tool, style, phase, work = sys.argv[1:5]
work = Path(work)
if tool == "torch":
    from torch.utils import cpp_extension as ext
    extra = {"build_directory": str(work / "torch_build")}
    (work / "torch_build").mkdir(exist_ok=True)
else:
    from kernelkit import cpp_extension as ext
    extra = {}
sys.path.insert(0, str(work))

def load(scale="1.0f"):
    if style in ("gan", "raster15", "torch_library"):
        call = json.loads(sys.argv[6])
        kwargs = dict(call["kwargs"], **extra)
        if "extra_include_paths" in kwargs:
            kwargs["extra_include_paths"] = [str(work / p) for p in kwargs["extra_include_paths"]]
        return ext.load(call["name"], [str(work / s) for s in call["sources"]], **kwargs)
    if style == "sigmoid":
        import sigmoid_inline as s
        src = s.cuda_source(scale)
        if scale == "host":
            src = s.cuda_source().replace(json.loads(sys.argv[7])[1], json.loads(sys.argv[7])[2])
        return ext.load_inline(os.environ.get("BENCH_PREFIX", "bench_") + "sigmoid", s.CPP, src, functions=["sigmoid"], **extra)
    files = {"cem": ["sample.cu", "sample.cpp"], "mul": ["mul.cu"], "lltm": ["lltm_accessor.cu"],
             "muladd": ["muladd_library.cu"], "cem_ported": ["sample_kernel.cu", "sample_ported.cpp"]}[style]
    return ext.load(os.environ.get("BENCH_PREFIX", "bench_") + style, [str(work / f) for f in files], extra_cuda_cflags=["-O3"],
                    is_python_module=style != "muladd", **extra)

def edit(path, old, new):
    p = work / path
    p.write_text(p.read_text().replace(old, new, 1))

if phase in ("cold", "warm"):
    t = time.perf_counter(); m = load(); seconds = time.perf_counter() - t
else:  # edit or host_edit: in the same process, the notebook loop
    m = load()
    spec = json.loads(sys.argv[5]) if phase == "edit" else dict(zip(("file", "old", "new"), json.loads(sys.argv[7])))
    t = time.perf_counter()
    if spec["file"]:
        edit(spec["file"], spec["old"], spec["new"])
        m2 = load()
    else:
        m2 = load("2.0f" if phase == "edit" else "host")
    seconds = time.perf_counter() - t
    assert m2 is not m
print(json.dumps({"seconds": seconds}))
"""


def _run(tool: str, style: str, phase: str, work: Path, env: dict, edit_spec: dict, call=None) -> float:
    out = subprocess.run([sys.executable, "-c", WORKER, tool, style, phase, str(work), json.dumps(edit_spec),
                          json.dumps(call), json.dumps(HOST_EDITS.get(style))], capture_output=True, text=True,
                         env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} {style} {phase} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def _prepare(style: str, work: Path, cuda: bool):
    """Copy the style's files into ``work``; (the edit spec, the package's load call or None)."""
    if style in PACKAGE_STYLES:
        call = package_call(style, cuda)
        shutil.copytree(PACKAGES / call["dir"], work, dirs_exist_ok=True)
        return {"file": call["file"], "old": call.get("old"), "new": call.get("new")}, call
    files, kernel_file, old, new = STYLES[style]
    for f in files:
        shutil.copy((CORPUS if (CORPUS / f).is_file() else FIXTURES) / f, work / f)
    return {"file": kernel_file, "old": old, "new": new}, None


def measure(style: str, tool: str, root: Path, phases, warm_repeats: int, cuda: bool) -> dict:
    work = root / f"{style}-{tool}"
    work.mkdir()
    spec, call = _prepare(style, work, cuda)
    # kernelkit's cache beside the sources' folder, as ~/.cache is: a cache made inside it changes the folder
    # while the first build plans, which then cannot record its plan for the next process
    kk_cache = root / f"{style}-{tool}-kk_cache"
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(work / "torch_ext_root"),
               KERNELKIT_CACHE_DIR=str(kk_cache), PYTHONUNBUFFERED="1")
    result = {"cold": _run(tool, style, "cold", work, env, spec, call)}
    if "warm" in phases:
        wait_for_pch_builders(kk_cache)  # a later session's load, not one beside the first build's builders
        warm = [_run(tool, style, "warm", work, env, spec, call) for _ in range(warm_repeats)]
        result["warm"], result["warm_all"] = statistics.median(warm), warm  # in the order run: the first loads differ
    if "cold_pch" in phases and tool == "kernelkit" and call is None:
        wait_for_pch_builders(kk_cache)  # the first build's precompiled preamble, ready as on a machine that built one
        other = root / f"{style}-{tool}-new"
        other.mkdir()
        _prepare(style, other, cuda)
        if spec["file"]:
            path = other / spec["file"]
            path.write_text(path.read_text().replace(spec["old"], spec["new"], 1))
        result["cold_pch"] = _run(tool, style, "cold", other, dict(env, BENCH_PREFIX="bench_new_"), spec, call)
    for phase, edit in (("edit", spec if spec["file"] or style == "sigmoid" else None),
                        ("host_edit", dict(zip(("file", "old", "new"), HOST_EDITS[style])) if style in HOST_EDITS else None)):
        if phase not in phases or edit is None:
            continue
        if phase == "host_edit":
            wait_for_pch_builders(kk_cache)
        if style in NEW_PROCESS_EDIT:  # edit the file, then a new process loads it (the load call is timed)
            path = work / edit["file"]
            path.write_text(path.read_text().replace(edit["old"], edit["new"], 1))
            result[phase] = _run(tool, style, "cold", work, env, spec, call)
        else:
            result[phase] = _run(tool, style, phase, work, env, spec, call)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    styles = [*STYLES, *PACKAGE_STYLES]
    p.add_argument("--styles", nargs="+", default=styles, choices=styles)
    p.add_argument("--tools", nargs="+", default=["torch", "kernelkit"], choices=["torch", "kernelkit"])
    p.add_argument("--phases", nargs="+", default=["cold", "warm", "edit", "host_edit"],
                   choices=["cold", "warm", "edit", "host_edit", "cold_pch"],
                   help="cold always runs (the others need its build)")
    p.add_argument("--warm-repeats", type=int, default=7, help="new processes timed for the warm load (median)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name() if cuda else "no GPU"
    rows = {}
    with tempfile.TemporaryDirectory(prefix="kk-ext-bench-") as tmp:
        for style in args.styles:
            for tool in args.tools:
                rows.setdefault(style, {})[tool] = measure(style, tool, Path(tmp), args.phases, args.warm_repeats, cuda)
                r = rows[style][tool]
                print(style, tool, {k: round(v, 4) for k, v in r.items() if k != "warm_all"},
                      *(["warm ms in order:", [round(w * 1e3, 2) for w in r["warm_all"]]] if "warm_all" in r else []),
                      flush=True)
                if args.out:  # after each row: a run stopped at a device call's time limit keeps what it measured
                    Path(args.out).write_text(json.dumps({"gpu": gpu, "cpus": os.cpu_count(),
                                                          "torch": torch.__version__, "results": rows}, indent=1))
    print(f"\n{gpu}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print("| style | phase | torch | kernelkit | torch / kernelkit |\n|---|---|---|---|---|")
    for style, r in rows.items():
        for phase in ("cold", "cold_pch", "warm", "edit", "host_edit"):
            t, k = r.get("torch", {}).get(phase), r.get("kernelkit", {}).get(phase)
            if t is None and k is None:
                continue
            fmt = (lambda s: "" if s is None else f"{s * 1e3:.1f} ms") if phase == "warm" else (
                lambda s: "" if s is None else f"{s:.2f} s")
            ratio = f"{t / k:.1f}x" if t is not None and k is not None else ""
            print(f"| {style} | {phase} | {fmt(t)} | {fmt(k)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
