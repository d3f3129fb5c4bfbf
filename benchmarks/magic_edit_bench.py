"""A ``%%kernelkit`` cell's kernel edit -> usable op, in one live IPython shell (as in a notebook): README's
``scale2`` cell (a torch-free device part above ``// --- binding ---``, the torch-facing binding below), run once
in an empty cache, then its kernel body edited and the cell run again until the op gives the new result on CUDA.
With ``--torch-cell`` the device part includes torch and holds the op's wrapper too (code written for
``load_inline``, pasted), which kernelkit splits into a cached host part and a torch-free device part. Usage:
    python benchmarks/magic_edit_bench.py [--edits 5] [--torch-cell] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import torch
from IPython.core.interactiveshell import InteractiveShell

cell, edits = sys.argv[1], int(sys.argv[2])
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "kernelkit")
x = torch.randn(1 << 20, device="cuda")


def run(k):
    t0 = time.perf_counter()
    shell.run_cell_magic("kernelkit", "scale2", cell.replace("2.0f * x[i]", f"(2.0f + {k}) * x[i]"))
    y = shell.user_ns["scale2"](x)
    torch.cuda.synchronize()
    assert torch.equal(y, (2.0 + k) * x), f"edit {k}: the op does not give the new result"
    return time.perf_counter() - t0


out = {"cold": run(0), "edits": [run(k) for k in range(1, edits + 1)]}
print(json.dumps(out))
"""

DEVICE = """\
__global__ void scale2_kernel(const float* x, float* y, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = 2.0f * x[i];
}
"""
SPLIT_CELL = DEVICE + """\
cudaError_t scale2_launch(const float* x, float* y, long long n, cudaStream_t s) {
  scale2_kernel<<<1024, 256, 0, s>>>(x, y, n); return cudaGetLastError();
}
// --- binding ---
cudaError_t scale2_launch(const float* x, float* y, long long n, cudaStream_t s);
at::Tensor scale2(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "scale2: x must be a float32 CUDA tensor");
  c10::cuda::CUDAGuard guard(x.device());
  auto xc = x.contiguous(); auto y = at::empty_like(xc);
  KERNELKIT_CUDA_CHECK(scale2_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(),
                                     at::cuda::getCurrentCUDAStream()));
  return y;
}
KERNELKIT_LIBRARY(m) {
  m.def("scale2(Tensor x) -> Tensor");
  m.impl("scale2", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(scale2)));
}
"""
TORCH_CELL = "#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>\n" + DEVICE + """\
at::Tensor scale2(const at::Tensor& x) {
  auto xc = x.contiguous(); auto y = at::empty_like(xc);
  scale2_kernel<<<1024, 256, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                                     xc.numel());
  return y;
}
// --- binding ---
at::Tensor scale2(const at::Tensor& x);
KERNELKIT_LIBRARY(m) {
  m.def("scale2(Tensor x) -> Tensor");
  m.impl("scale2", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(scale2)));
}
"""

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=5)
    ap.add_argument("--torch-cell", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    cell = TORCH_CELL if args.torch_cell else SPLIT_CELL
    with tempfile.TemporaryDirectory() as cache:
        p = subprocess.run([sys.executable, "-c", CHILD, cell, str(args.edits)], capture_output=True, text=True,
                           env=dict(os.environ, KERNELKIT_CACHE_DIR=cache), timeout=1800)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-3000:], file=sys.stderr)
        return 1
    r = json.loads(p.stdout.strip().splitlines()[-1])
    every = ", ".join(f"{t:.2f}" for t in r["edits"])
    shape = "one torch-including device part" if args.torch_cell else "README's cell: device part and binding"
    print(f"| {shape} | cold {r['cold']:.1f} s | kernel edit -> usable: median {statistics.median(r['edits']):.2f} s "
          f"({every}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
