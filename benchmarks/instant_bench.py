"""Instant kernels vs the other ways to get a raw CUDA kernel running from Python, side by side in one run.

    python benchmarks/instant_bench.py [--edits 5] [--no-torch-inline] [--out DIR]

Edit -> usable (compile an edited kernel, load it, launch it once, synchronise): kernelkit.load_kernels
(NVRTC, in-process), the kernelkit card path (kernelkit.load_inline with cuda=, nvcc), torch's load_inline,
torch.cuda._compile_kernel and CuPy's RawKernel (the last two when present). Then a cold first kernel and a
warm load in new processes, and the host time per launch of a tiny kernel against torch.add on one element.
Writes instant_bench.json into --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import kernelkit
from kernelkit.harness.timing import host_overhead_us

KERNEL = 'extern "C" __global__ void scale(const float* x, float* out, float a, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = a * x[i] + {c}f; }}'
N = 1 << 16


def edit(i: int) -> str:
    """A kernel no cache has seen: the constant changes with the run and the edit."""
    return KERNEL.format(c=f"{os.getpid() % 1000}.{i}")


def _usable(launch) -> float:
    x = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    launch(x, out)
    torch.cuda.synchronize()
    return out


def kernelkit_instant(i: int):
    t0 = time.perf_counter()
    mod = kernelkit.load_kernels(edit(i), "bench_instant")
    _usable(lambda x, o: mod.scale[N // 256, 256](x, o, 2.0, N))
    return time.perf_counter() - t0


def kernelkit_card(i: int):
    cuda = edit(i).replace('extern "C" ', "") + (
        "\nvoid run(const float* x, float* o, int n, cudaStream_t s) { scale<<<(n + 255) / 256, 256, 0, s>>>(x, o, 2.0f, n); }")
    cpp = ("void run(const float*, float*, int, cudaStream_t);\n"
           "at::Tensor bench_scale(const at::Tensor& x) { auto o = at::empty_like(x); "
           "run(x.data_ptr<float>(), o.data_ptr<float>(), x.numel(), at::cuda::getCurrentCUDAStream()); return o; }\n"
           "KERNELKIT_LIBRARY(m) { m.def(\"bench_scale(Tensor x) -> Tensor\"); "
           "m.impl(\"bench_scale\", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(bench_scale))); }\n")
    t0 = time.perf_counter()
    lib = kernelkit.load_inline("bench_card", cuda=cuda, cpp=cpp)
    _usable(lambda x, o: o.copy_(lib.bench_scale(x)))
    return time.perf_counter() - t0


def torch_load_inline(i: int):
    from torch.utils.cpp_extension import load_inline

    cuda = edit(i).replace('extern "C" ', "") + (
        "\ntorch::Tensor run(torch::Tensor x) { auto o = torch::empty_like(x); int n = x.numel(); "
        "scale<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), o.data_ptr<float>(), 2.0f, n); return o; }")
    t0 = time.perf_counter()
    mod = load_inline(f"bench_torch_{os.getpid()}_{i}", cpp_sources="torch::Tensor run(torch::Tensor x);",
                      cuda_sources=cuda, functions=["run"])
    _usable(lambda x, o: o.copy_(mod.run(x)))
    return time.perf_counter() - t0


def torch_compile_kernel(i: int):
    t0 = time.perf_counter()
    k = torch.cuda._compile_kernel(edit(i).replace('extern "C" ', ""), "scale")
    # (torch passes a Python float as a double, so the kernel reads garbage for `a`: only the time counts here)
    _usable(lambda x, o: k(grid=(N // 256, 1, 1), block=(256, 1, 1), args=[x, o, 2.0, N]))
    return time.perf_counter() - t0


def cupy_raw_kernel(i: int):
    import cupy

    t0 = time.perf_counter()
    k = cupy.RawKernel(edit(i), "scale")

    def launch(x, o):
        k((N // 256,), (256,), (cupy.asarray(x), cupy.asarray(o), cupy.float32(2.0), cupy.int32(N)))

    _usable(launch)
    return time.perf_counter() - t0


def new_process(code: str) -> float:
    """Seconds the snippet reports for itself in a fresh interpreter (torch's import not counted)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


PROCESS = """
import time, torch, kernelkit
x = torch.ones(1024, device="cuda"); o = torch.empty_like(x); torch.cuda.synchronize()
t0 = time.perf_counter()
m = kernelkit.load_kernels({src!r}, "bench_process")
m.scale[4, 256](x, o, 2.0, 1024); torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def launch_costs() -> dict:
    one = torch.ones(1, device="cuda")
    x, o = torch.randn(256, device="cuda"), torch.empty(256, device="cuda")
    mod = kernelkit.load_kernels(edit(999), "bench_launch")
    launch = mod.scale[1, 256]
    fns = {"torch.add (1 element)": lambda: torch.add(one, one),
           "kernelkit instant": lambda: launch(x, o, 2.0, 256)}
    k = torch.cuda._compile_kernel(edit(998).replace('extern "C" ', ""), "scale")
    fns["torch.cuda._compile_kernel"] = lambda: k(grid=(1, 1, 1), block=(256, 1, 1), args=[x, o, 2.0, 256])
    try:
        import cupy  # noqa: F401

        ck = cupy.RawKernel(edit(997), "scale")
        cx, co = cupy.asarray(x), cupy.asarray(o)
        a, n = cupy.float32(2.0), cupy.int32(256)
        fns["CuPy RawKernel"] = lambda: ck((1,), (256,), (cx, co, a, n))
    except ImportError:
        pass
    rounds = {name: [] for name in fns}
    for _ in range(5):  # interleaved rounds: drift hits every contender alike
        for name, fn in fns.items():
            rounds[name].append(host_overhead_us(fn, "cuda", calls=2000, repeats=3))
    return {name: statistics.median(v) for name, v in rounds.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edits", type=int, default=5)
    p.add_argument("--no-torch-inline", action="store_true", help="skip torch's load_inline (about a minute per edit)")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    os.environ.setdefault("KERNELKIT_VERBOSE", "0")
    torch.zeros(1, device="cuda")
    tools = {"kernelkit instant": kernelkit_instant, "kernelkit card (nvcc)": kernelkit_card,
             "torch.cuda._compile_kernel": torch_compile_kernel}
    if importlib.util.find_spec("cupy") is not None:
        tools["CuPy RawKernel"] = cupy_raw_kernel
    if not args.no_torch_inline:
        tools["torch load_inline"] = torch_load_inline
    edits = {}
    for name, fn in tools.items():
        fn(0)  # the first build of each tool (library loads, kernelkit's binding TU) is not an edit
        runs = [fn(i + 1) for i in range(args.edits if name != "torch load_inline" else 1)]
        edits[name] = statistics.median(runs)
        print(f"edit -> usable  {name:28s} {edits[name] * 1e3:10.1f} ms")
    src = edit(5000 + int(time.time()) % 1000)
    cold = new_process(PROCESS.format(src=src))
    warm = new_process(PROCESS.format(src=src))
    print(f"new process: cold first kernel {cold * 1e3:.1f} ms, warm (cached) {warm * 1e3:.1f} ms")
    launches = launch_costs()
    for name, us in launches.items():
        print(f"host time per launch  {name:28s} {us:7.2f} us")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "edit_to_usable_s": edits,
              "new_process_cold_s": cold, "new_process_warm_s": warm, "launch_host_us": launches}
    out = Path(args.out) / "instant_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
