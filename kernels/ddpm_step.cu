// ddpm_step device code: the fused DDPM step with the timestep and its coefficients read on the device.
#include <kernelkit/elementwise.cuh>
#include <kernelkit/launch.cuh>
#include <kernelkit/philox.cuh>
#include "ddpm_step.h"

namespace kk {

// Noise drawn in the kernel: one thread per 4-element chunk c (Philox subsequence c, one normal4),
// one block per 256 chunks (the block loop strides by the grid past the grid limit). Chunks whose
// operands are aligned move as one access per operand (`Aligned`); the last, partial chunk goes
// element by element. A chunk's reads and its draw do not depend on the timestep, so they are issued
// before the timestep's coefficient row is read (two dependent reads).
template <typename T, bool Aligned>
__global__ void ddpm_step_philox_kernel(const T* __restrict__ eps, const T* __restrict__ x, DdpmStepOp<acc_t<T>> op,
                                        PhiloxArgs rng, T* out, int64_t n) {
  using A = acc_t<T>;
  using V4 = Vec<T, 4>;
  uint64_t seed = 0, offset = 0;
  unpack(rng, seed, offset);
  const int64_t chunks = (n + 3) / 4;
  for (int64_t c = global_thread_id(); c < chunks; c += grid_stride()) {
    const int64_t i0 = 4 * c;
    const bool whole = Aligned && i0 + 4 <= n;
    A e[4], v[4];
    if (whole) {
      const V4 ev = reinterpret_cast<const V4*>(eps)[c], xv = reinterpret_cast<const V4*>(x)[c];
#pragma unroll
      for (int k = 0; k < 4; ++k) e[k] = to_acc(ev.v[k]), v[k] = to_acc(xv.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        e[k] = i0 + k < n ? to_acc(eps[i0 + k]) : A(0);
        v[k] = i0 + k < n ? to_acc(x[i0 + k]) : A(0);
      }
    }
    A z[4];
    Philox gen(seed, static_cast<uint64_t>(c), offset);
    normal4(gen, z);  // also at t = 0, where the step ignores it: no branch on the timestep before the reads
    const auto m = op.prepare();
    if (whole) {
      V4 y;
#pragma unroll
      for (int k = 0; k < 4; ++k) y.v[k] = from_acc<T>(m(e[k], v[k], z[k]));
      reinterpret_cast<V4*>(out)[c] = y;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i0 + k < n) out[i0 + k] = from_acc<T>(m(e[k], v[k], z[k]));
    }
  }
}

template <typename T>
cudaError_t ddpm_step_cuda(const T* eps, const int64_t* timestep, const T* x, const float* coeffs, int64_t num_t,
                           const T* noise, PhiloxArgs rng, double clip, T* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const DdpmStepOp<acc_t<T>> op{timestep, coeffs, num_t, clip};
  if (noise != nullptr)  // noise given: a streaming 3-input elementwise op (the card's benchmark)
    return launch_elementwise<T, 3>(out, InPtrs<T, 3>{{eps, x, noise}}, n, op, stream);
  constexpr int kChunkBytes = 4 * static_cast<int>(sizeof(T));
  const unsigned grid = tile_grid((n + 3) / 4, kBlockSize);
  if (is_aligned(eps, kChunkBytes) && is_aligned(x, kChunkBytes) && is_aligned(out, kChunkBytes))
    ddpm_step_philox_kernel<T, true><<<grid, kBlockSize, 0, stream>>>(eps, x, op, rng, out, n);
  else
    ddpm_step_philox_kernel<T, false><<<grid, kBlockSize, 0, stream>>>(eps, x, op, rng, out, n);
  return cudaGetLastError();
}

#define KK_DDPM_STEP_INST(T)                                                                                  \
  template cudaError_t ddpm_step_cuda<T>(const T*, const int64_t*, const T*, const float*, int64_t, const T*, \
                                         PhiloxArgs, double, T*, int64_t, cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_DDPM_STEP_INST);

}  // namespace kk
