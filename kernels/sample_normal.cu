// sample_normal device code: fused X = mu[:, None] + sigma[:, None] * z with z drawn by Philox in-kernel.
#include <algorithm>

#include "common/launch.cuh"
#include "common/philox.cuh"
#include "common/vec.cuh"
#include "sample_normal.h"

namespace kk {

// 2-D grid-stride: threadIdx.y/blockIdx.y walk rows, threadIdx.x/blockIdx.x walk 4-element chunks of a row.
template <typename T>
__global__ void sample_normal_kernel(const T* mu, const T* sigma, T* out, int64_t d, int64_t n, int64_t chunks,
                                     bool vec, PhiloxArgs rng) {
  using A = acc_t<T>;
  uint64_t seed, offset;
  unpack(rng, seed, offset);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t rstride = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; i < d; i += rstride) {
    const A m = to_acc(mu[i]), s = to_acc(sigma[i]);
    T* row = out + i * n;
    for (int64_t c = c0; c < chunks; c += cstride) {
      Philox gen(seed, static_cast<uint64_t>(i * chunks + c), offset);
      A z[4];
      normal4(gen, z);
      const int64_t j = 4 * c;
      if (vec) {
        Vec<T, 4> v;
#pragma unroll
        for (int k = 0; k < 4; ++k) v.v[k] = from_acc<T>(m + s * z[k]);
        *reinterpret_cast<Vec<T, 4>*>(row + j) = v;
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          if (j + k < n) row[j + k] = from_acc<T>(m + s * z[k]);
      }
    }
  }
}

template <typename T>
cudaError_t sample_normal_cuda(const T* mu, const T* sigma, T* out, int64_t d, int64_t n, PhiloxArgs rng,
                               cudaStream_t stream) {
  if (d <= 0 || n <= 0) return cudaSuccess;
  static std::atomic<int> occupancy[kMaxDevices] = {};
  const int64_t chunks = (n + 3) / 4;
  // Block: 256 threads, x as wide as a row's chunks (at least a warp), the rest stacked over rows.
  int bx = 32;
  while (bx < kBlockSize && bx < chunks) bx *= 2;
  const dim3 block(bx, kBlockSize / bx);
  // Grid: one full wave of resident blocks, split between chunks (x) and rows (y).
  const int64_t cap = static_cast<int64_t>(sm_count()) *
                      resident_blocks_per_sm(reinterpret_cast<const void*>(&sample_normal_kernel<T>), kBlockSize, occupancy);
  const int64_t gx = std::min<int64_t>((chunks + bx - 1) / bx, cap);
  const int64_t gy = std::min<int64_t>({(d + block.y - 1) / block.y, std::max<int64_t>(cap / gx, 1), 65535});
  const bool vec = n % 4 == 0 && is_aligned(out, 4 * sizeof(T));
  sample_normal_kernel<T><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block, 0, stream>>>(
      mu, sigma, out, d, n, chunks, vec, rng);
  return cudaGetLastError();
}

#define KK_SAMPLE_NORMAL_INST(T)                                                                        \
  template cudaError_t sample_normal_cuda<T>(const T*, const T*, T*, int64_t, int64_t, PhiloxArgs, \
                                             cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_SAMPLE_NORMAL_INST)

}  // namespace kk
