"""Row softmax as an instant (NVRTC) kernel with four knobs to tune: threads per row, vector width, unroll, and
whether the row is kept in shared memory between its two passes."""
import torch

import kernelkit

SRC = r"""
// One block of BLOCK threads per row. Each thread loads VEC consecutive floats at a time and keeps UNROLL
// loads in flight; a running (max, sum) per thread is merged across the block, then the row is read again to
// write exp(x - max) / sum: from L2, or with STAGE from the shared memory the first pass copied it to (when the
// launch gives the row's bytes of it; each thread reads back only what it wrote).
#define NEG_INF __int_as_float(0xff800000)  // -infinity (NVRTC has no <cmath>)
template <int V> struct alignas(4 * V) Vec { float v[V]; };

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == NEG_INF) return;  // both empty: keep (-inf, 0) rather than 0 * exp(nan)
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

__device__ __forceinline__ void add(float& m, float& s, float x) {
  if (x > m) { s = s * expf(m - x) + 1.f; m = x; } else { s += expf(x - m); }
}

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols,
                                        int staged_cols) {
  extern __shared__ __align__(32) float row[];  // Vec<8> stores need 32-byte alignment
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = y + (long long)blockIdx.x * cols;
  const bool staged = STAGE && cols <= staged_cols;
  const bool vector = cols % VEC == 0 && (unsigned long long)xr % (4 * VEC) == 0 &&
                      (unsigned long long)yr % (4 * VEC) == 0;
  const int step = vector ? VEC : 1;  // a row that is not VEC-aligned goes one float at a time
  float m = NEG_INF, s = 0.f;
  for (int base = threadIdx.x * step; base < cols; base += BLOCK * step * UNROLL) {
    Vec<VEC> chunk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * BLOCK * step;
      if (vector) {
        if (i < cols) chunk[u] = *reinterpret_cast<const Vec<VEC>*>(xr + i);
        if (staged && i < cols) *reinterpret_cast<Vec<VEC>*>(row + i) = chunk[u];
      } else {
        chunk[u].v[0] = i < cols ? xr[i] : NEG_INF;
        if (staged && i < cols) row[i] = chunk[u].v[0];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * BLOCK * step;
      if (i >= cols) break;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (k < step) add(m, s, chunk[u].v[k]);
    }
  }
  for (int o = 16; o > 0; o >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __shared__ float ms[BLOCK / 32], ss[BLOCK / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { ms[warp] = m; ss[warp] = s; }
  __syncthreads();
  m = lane < BLOCK / 32 ? ms[lane] : NEG_INF;
  s = lane < BLOCK / 32 ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const float inv = 1.f / s;
  const float* src = staged ? row : xr;
  for (int i = threadIdx.x * step; i < cols; i += BLOCK * step) {
    if (vector) {
      Vec<VEC> c = *reinterpret_cast<const Vec<VEC>*>(src + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) c.v[k] = expf(c.v[k] - m) * inv;
      *reinterpret_cast<Vec<VEC>*>(yr + i) = c;
    } else {
      yr[i] = expf(src[i] - m) * inv;
    }
  }
}
"""

#: 64 configurations
SPACE = {"BLOCK": [128, 256, 512, 1024], "VEC": [1, 2, 4, 8], "UNROLL": [1, 4], "STAGE": [0, 1]}
#: shared memory a block may take without opting in to more
STAGE_LIMIT_BYTES = 48 * 1024


def make(config, arch=None):
    """The op of one configuration: its NVRTC build (values as -D defines) and a launch of one block per row."""
    tag = "_".join(str(v) for v in config.values())
    mod = kernelkit.load_kernels(SRC, name=f"softmax_rows_{tag}", arch=arch,
                                 options=[f"-D{k}={v}" for k, v in config.items()])
    block = config["BLOCK"]

    def softmax(x):
        if x.dim() != 2 or x.dtype != torch.float32 or not x.is_cuda:
            raise ValueError(f"softmax: x: expected a 2-D float32 CUDA tensor, got {tuple(x.shape)} {x.dtype} "
                             f"on {x.device}")
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        staged = cols if config["STAGE"] and 0 < cols * 4 <= STAGE_LIMIT_BYTES else 0
        mod.softmax_rows[rows, block, staged * 4](x, y, cols, staged)
        return y
    return softmax


def reference(x):
    return torch.softmax(x.double(), dim=-1).to(x.dtype)


def inputs(shape, dtype=None, device=None, generator=None):
    return (torch.randn(shape, dtype=dtype or torch.float32, device=device, generator=generator) * 4,)

