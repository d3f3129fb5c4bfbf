"""Small cards the loader tests write into temporary directories.

The CPU card ``affine`` keeps its kernel in a torch-free .cpp (recompiled in well under a second on an
edit) and its binding in the header; every test that leaves the header alone shares one cached binding
object, which keeps this suite fast on a 2-core CI machine.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

AFFINE_CPP = """\
#include "affine.h"
void affine_cpu(const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = x[i] * SCALE + OFFSET;
}
"""

AFFINE_H = """\
#pragma once
#include "affine_consts.h"
void affine_cpu(const float* x, float* y, long n);
#ifdef KERNELKIT_BINDING
at::Tensor affine(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "affine: x must be float32, got ", x.scalar_type());
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  affine_cpu(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
  return y;
}
KERNELKIT_LIBRARY(m) {
  m.def("affine(Tensor x) -> Tensor");
  m.impl("affine", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(affine)));
}
#endif
"""

CONSTS_H = """\
#pragma once
#define SCALE 2.0f
#define OFFSET 1.0f
"""

SQUARE_CU = """\
#include <cuda_runtime.h>
#include "square.h"
__global__ void square_kernel(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (; i < n; i += (long long)gridDim.x * blockDim.x) y[i] = x[i] * x[i];
}
cudaError_t square_launch(const float* x, float* y, long long n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  long long blocks = (n + 255) / 256;
  square_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}
"""

SQUARE_H = """\
#pragma once
#include <cuda_runtime.h>
cudaError_t square_launch(const float* x, float* y, long long n, cudaStream_t stream);
#ifdef KERNELKIT_BINDING
at::Tensor square(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "square: x must be a CUDA tensor, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "square: x must be float32, got ", x.scalar_type());
  c10::cuda::CUDAGuard guard(x.device());
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  KERNELKIT_CUDA_CHECK(square_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(),
                                     at::cuda::getCurrentCUDAStream()));
  return y;
}
KERNELKIT_LIBRARY(m) {
  m.def("square(Tensor x) -> Tensor");
  m.impl("square", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(square)));
}
#endif
"""


def write_affine(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "affine.cpp").write_text(AFFINE_CPP)
    (d / "affine.h").write_text(AFFINE_H)
    (d / "affine_consts.h").write_text(CONSTS_H)
    return d


def write_square(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "square.cu").write_text(SQUARE_CU)
    (d / "square.h").write_text(SQUARE_H)
    return d


def run_python(code: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a new process: nothing loaded, nothing cached in memory)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout)
