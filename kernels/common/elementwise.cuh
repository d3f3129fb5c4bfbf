// Generic elementwise kernel: out[i] = f(in0[i], in1[i], ...) over n contiguous elements.
//
// The functor takes and returns the accumulation type (float for half/bfloat16/float, double for
// double). Grid-stride loop with 64-bit indices; 16-byte vector loads/stores when every pointer is
// 16-byte aligned, then a scalar tail (or all-scalar when not aligned). `out` may alias an input exactly
// (each element is read before it is written by the same thread); partial overlap is not allowed.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kk {

template <typename T, int NIn> struct InPtrs {
  const T* p[NIn];
};

template <int NIn, typename F, typename A>
__device__ __forceinline__ A apply_acc(const F& f, const A (&x)[NIn]) {
  static_assert(NIn == 1 || NIn == 2 || NIn == 3, "elementwise: 1 to 3 inputs");
  if constexpr (NIn == 1) return f(x[0]);
  else if constexpr (NIn == 2) return f(x[0], x[1]);
  else return f(x[0], x[1], x[2]);
}

template <typename T, int NIn, typename F>
__global__ void __launch_bounds__(kBlockSize, 2048 / kBlockSize)
elementwise_kernel(T* out, InPtrs<T, NIn> in, int64_t n, int64_t nvec, F f) {
  using A = acc_t<T>;
  constexpr int V = vec_width<T>();
  using VecT = Vec<T, V>;
  const int64_t stride = grid_stride();
  const int64_t tid = global_thread_id();
  for (int64_t i = tid; i < nvec; i += stride) {
    VecT x[NIn];
#pragma unroll
    for (int k = 0; k < NIn; ++k) x[k] = reinterpret_cast<const VecT*>(in.p[k])[i];
    VecT y;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A a[NIn];
#pragma unroll
      for (int k = 0; k < NIn; ++k) a[k] = to_acc(x[k].v[j]);
      y.v[j] = from_acc<T>(apply_acc<NIn>(f, a));
    }
    reinterpret_cast<VecT*>(out)[i] = y;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) {
    A a[NIn];
#pragma unroll
    for (int k = 0; k < NIn; ++k) a[k] = to_acc(in.p[k][i]);
    out[i] = from_acc<T>(apply_acc<NIn>(f, a));
  }
}

// Launch on `stream`; returns cudaGetLastError() (cudaSuccess for n == 0, nothing launched).
template <typename T, int NIn, typename F>
cudaError_t launch_elementwise(T* out, InPtrs<T, NIn> in, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int V = vec_width<T>();
  bool aligned = is_aligned(out);
  for (int k = 0; k < NIn; ++k) aligned = aligned && is_aligned(in.p[k]);
  const int64_t nvec = aligned ? n / V : 0;
  const int64_t tail = n - nvec * V;
  const int64_t work = nvec > tail ? nvec : tail;
  elementwise_kernel<T, NIn, F><<<grid_for(work), kBlockSize, 0, stream>>>(out, in, n, nvec, f);
  return cudaGetLastError();
}

}  // namespace kk
