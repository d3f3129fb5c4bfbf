"""torch.utils.cpp_extension.load_inline vs kernelkit for the same small CUDA kernel, side by side:

  cold   first build in a fresh process with an empty cache
  warm   a new process loading what is already built
  edit   in a live process, change the kernel body and load again until the op is usable

Each library is used as its documentation shows: torch's cell carries the kernel and its torch wrapper
in one .cu (bound with ``functions=``); kernelkit's keeps the kernel torch-free and the wrapper in ``cpp``.
Every measurement runs in its own fresh interpreter. Usage:
    python benchmarks/loader_bench.py [--repeat 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

KERNEL = """
__global__ void axpb_kernel(const float* x, float* y, long long n, float a, float b) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (; i < n; i += (long long)gridDim.x * blockDim.x) y[i] = a * x[i] + b;   // BODY
}
"""

TORCH_CUDA = KERNEL + """
torch::Tensor axpb(torch::Tensor x, double a, double b) {
  auto y = torch::empty_like(x);
  long long n = x.numel();
  axpb_kernel<<<(unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), n, (float)a, (float)b);
  return y;
}
"""
TORCH_CPP = "torch::Tensor axpb(torch::Tensor x, double a, double b);"

KK_CUDA = "#include <cuda_runtime.h>\n" + KERNEL + """
cudaError_t axpb_launch(const float* x, float* y, long long n, float a, float b, cudaStream_t s) {
  axpb_kernel<<<(unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, 0, s>>>(x, y, n, a, b);
  return cudaGetLastError();
}
"""
KK_CPP = """
cudaError_t axpb_launch(const float* x, float* y, long long n, float a, float b, cudaStream_t s);
at::Tensor axpb(const at::Tensor& x, double a, double b) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "axpb: x must be a float32 CUDA tensor");
  c10::cuda::CUDAGuard g(x.device());
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  KERNELKIT_CUDA_CHECK(axpb_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), (float)a, (float)b,
                                   at::cuda::getCurrentCUDAStream()));
  return y;
}
KERNELKIT_LIBRARY(m) {
  m.def("axpb(Tensor x, float a, float b) -> Tensor");
  m.impl("axpb", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(axpb)));
}
"""

# A child process: load (variant 0), optionally edit (variant 1), print timings as JSON.
CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
import torch
gpu = torch.cuda.is_available()
if gpu:
    torch.cuda.init()
tool, edit, tag = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
src = json.loads(sys.stdin.read())

def body(v):
    return src["cuda"].replace("a * x[i] + b;   // BODY", f"a * x[i] + b + {v}.0f;   // BODY")

if len(sys.argv) > 4 and sys.argv[4] == "new":  # a different kernel: new device code and a new binding
    src = {k: v.replace("axpb", "axpb2") for k, v in src.items()}
    tag = tag + "_new"


def load(v):
    if tool == "torch":
        return load_inline("axpb_" + tag, cpp_sources=src["cpp"], cuda_sources=body(v), functions=["axpb"])
    return kernelkit.load_inline("axpb_" + tag, cuda=body(v), cpp=src["cpp"])

def usable(mod, v):
    if gpu:
        x = torch.randn(1 << 20, device="cuda")
        y = getattr(mod, "axpb2" if tag.endswith("_new") else "axpb")(x, 2.0, 1.0)
        torch.cuda.synchronize()
        assert torch.allclose(y, 2 * x + 1 + v), "wrong result"

out = {}
t0 = time.perf_counter()
if tool == "torch":
    from torch.utils.cpp_extension import load_inline
else:
    import kernelkit
out["import"] = time.perf_counter() - t0
t0 = time.perf_counter()
mod = load(0)
out["load_only"] = time.perf_counter() - t0
usable(mod, 0)
out["load"] = time.perf_counter() - t0  # loaded and its first call done: a usable op
if edit:
    t0 = time.perf_counter()
    mod = load(1)
    usable(mod, 1)
    out["edit"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def child(tool: str, edit: bool, env: dict, tag: str, new: bool = False) -> dict:
    src = {"cuda": TORCH_CUDA, "cpp": TORCH_CPP} if tool == "torch" else {"cuda": KK_CUDA, "cpp": KK_CPP}
    args = [tool, "1" if edit else "0", tag] + (["new"] if new else [])
    p = subprocess.run([sys.executable, "-c", CHILD, *args], input=json.dumps(src),
                       capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{tool} child failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(tool: str, repeat: int) -> dict:
    cold, warm, warm_load, imports, edit, new_kernel = [], [], [], [], [], []
    for r in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(d, "torch"),
                       KERNELKIT_CACHE_DIR=os.path.join(d, "kk"), KERNELKIT_VERBOSE="0")
            if not gpu_visible():  # torch needs an arch list without a GPU; both build for the same one
                env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
            tag = f"r{r}"
            cold.append(child(tool, False, env, tag)["load"])
            w = child(tool, False, env, tag)
            warm.append(w["load"])
            warm_load.append(w["load_only"])
            imports.append(w["import"])
            edit.append(child(tool, True, env, tag)["edit"])
            if tool == "kernelkit":  # once the precompiled binding header exists: a brand-new kernel
                pch = glob.glob(os.path.join(d, "kk", "v1", "pch", "*", "kernelkit", "binding.h.gch"))
                t_wait = time.time()
                while not pch and time.time() - t_wait < 120:
                    time.sleep(0.5)
                    pch = glob.glob(os.path.join(d, "kk", "v1", "pch", "*", "kernelkit", "binding.h.gch"))
                new_kernel.append(child(tool, False, env, tag, new=True)["load"] if pch else float("nan"))
        print(f"  {tool:<9} run {r + 1}: cold {cold[-1]:7.2f} s  import {imports[-1] * 1e3:6.1f} ms  "
              f"warm load {warm_load[-1] * 1e3:7.1f} ms "
              f"(+ first call {warm[-1] * 1e3:7.1f} ms)  edit {edit[-1]:6.2f} s", flush=True)
    med = statistics.median
    return {"cold_s": med(cold), "warm_s": med(warm), "warm_load_s": med(warm_load), "import_s": med(imports),
            "edit_s": med(edit), "new_kernel_s": med(new_kernel) if new_kernel else None,
            "cold_all": cold, "warm_all": warm, "warm_load_all": warm_load, "edit_all": edit}


def gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()} ({os.cpu_count()} cores, {gpu}), torch {torch.__version__}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    res = {"machine": machine(), "torch": measure("torch", args.repeat), "kernelkit": measure("kernelkit", args.repeat)}
    t, k = res["torch"], res["kernelkit"]
    print(textwrap.dedent(f"""
        | step | torch load_inline | kernelkit | ratio |
        |---|---|---|---|
        | cold build | {t['cold_s']:.1f} s | {k['cold_s']:.1f} s | {t['cold_s'] / k['cold_s']:.1f}x |
        | import (torch.utils.cpp_extension / kernelkit) | {t['import_s'] * 1e3:.0f} ms | {k['import_s'] * 1e3:.0f} ms | {t['import_s'] / k['import_s']:.1f}x |
        | warm load, new process (after the import) | {t['warm_load_s'] * 1e3:.0f} ms | {k['warm_load_s'] * 1e3:.1f} ms | {t['warm_load_s'] / k['warm_load_s']:.0f}x |
        | warm load + first call | {t['warm_s'] * 1e3:.0f} ms | {k['warm_s'] * 1e3:.1f} ms | {t['warm_s'] / k['warm_s']:.1f}x |
        | kernel-body edit -> usable op | {t['edit_s']:.1f} s | {k['edit_s']:.2f} s | {t['edit_s'] / k['edit_s']:.0f}x |
        | cold build of another kernel (toolchain cache warm; torch: its cold build) | {t['cold_s']:.1f} s | {k['new_kernel_s']:.1f} s | {t['cold_s'] / k['new_kernel_s']:.1f}x |
    """))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
