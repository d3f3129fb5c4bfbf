// sample_normal device code: fused X = mu[:, None] + sigma[:, None] * z with z drawn by Philox in-kernel.
//
// Chunk (i, c) = elements 4c..4c+3 of row i uses Philox subsequence i * chunks + c (chunks = ceil(n/4)).
// When n % 4 == 0 and `out` is aligned for 4-element stores (always, for at::empty) the output is one
// flat array of chunks and chunk k is subsequence k: the flat kernel below. Otherwise the 2-D kernel
// (scalar stores for the ragged row ends). Both give the same samples for the same (seed, offset, d, n).
#include <algorithm>

#include "common/launch.cuh"
#include "common/philox.cuh"
#include "common/vec.cuh"
#include "sample_normal.h"

namespace kk {

// Philox costs 20 dependent multiplies per chunk, so each thread keeps several independent chunks in
// flight (ILP). The grid depends on what binds, measured at d = 100000, n = 1024 (README):
//  - where DRAM outruns the SMs (an H200 writes ~19 bytes per SM cycle) the arithmetic binds: a
//    persistent grid-stride loop over 4 waves avoids block turnover (114 us; one block per tile 121-126 us);
//  - elsewhere (an H100: ~13 bytes per SM cycle) the stores bind: one block per tile keeps the write front
//    compact (133 us; two persistent waves 147 us; a plain store of the same bytes 128 us).
constexpr int kSnBlock = 256, kSnUnroll = 4, kSnMinBlocks = 4, kSnWaves = 4;
constexpr int64_t kSnTile = int64_t{kSnBlock} * kSnUnroll;

// Row of flat chunk k: k / chunks by multiply-high and shift (Granlund-Montgomery, as PyTorch's
// IntDivider) for k < 2^31, plain 64-bit division beyond.
struct RowOf32 {
  uint32_t magic, shift;
  explicit RowOf32(uint32_t chunks) : shift(0) {
    while ((uint64_t{1} << shift) < chunks) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - chunks)) / chunks + 1);
  }
  __device__ __forceinline__ uint32_t operator()(uint32_t k) const { return (__umulhi(k, magic) + k) >> shift; }
};
struct RowOf64 {
  uint64_t chunks;
  __device__ __forceinline__ uint64_t operator()(uint64_t k) const { return k / chunks; }
};

template <typename T, typename I, typename RowOf>
__global__ void __launch_bounds__(kSnBlock, kSnMinBlocks)
sample_normal_flat(const T* __restrict__ mu, const T* __restrict__ sigma, Vec<T, 4>* __restrict__ out, I total,
                   RowOf row_of, PhiloxArgs rng) {
  using A = acc_t<T>;
  uint64_t seed, offset;
  unpack(rng, seed, offset);
  constexpr I kTile = I(kSnBlock) * kSnUnroll;
  for (I base = I(blockIdx.x) * kTile + threadIdx.x; base < total; base += I(gridDim.x) * kTile) {
    Vec<T, 4> v[kSnUnroll];
#pragma unroll
    for (int u = 0; u < kSnUnroll; ++u) {  // computed unconditionally (clamped row) so the chains interleave
      const I k = base + I(u) * kSnBlock;
      const I i = row_of(k < total ? k : I(0));
      Philox gen(seed, static_cast<uint64_t>(k), offset);
      A x[4];
      normal4_affine(gen, to_acc(mu[i]), to_acc(sigma[i]), x);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[u].v[j] = from_acc<T>(x[j]);
    }
#pragma unroll
    for (int u = 0; u < kSnUnroll; ++u) {
      const I k = base + I(u) * kSnBlock;
      if (k < total) out[k] = v[u];
    }
  }
}

// Any n and alignment: threadIdx.y/blockIdx.y walk rows, threadIdx.x/blockIdx.x walk a row's chunks.
template <typename T>
__global__ void sample_normal_rows(const T* mu, const T* sigma, T* out, int64_t d, int64_t n, int64_t chunks,
                                   PhiloxArgs rng) {
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
      A x[4];
      normal4_affine(gen, m, s, x);
      const int64_t j = 4 * c;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (j + k < n) row[j + k] = from_acc<T>(x[k]);
    }
  }
}

template <typename T, typename I, typename RowOf>
void launch_flat(const T* mu, const T* sigma, T* out, I total, RowOf row_of, PhiloxArgs rng, cudaStream_t stream) {
  unsigned grid = tile_grid(static_cast<int64_t>(total), kSnTile);
  if (dram_outruns_sms()) grid = std::min<unsigned>(grid, sm_count() * kSnMinBlocks * kSnWaves);
  sample_normal_flat<T, I, RowOf><<<grid, kSnBlock, 0, stream>>>(
      mu, sigma, reinterpret_cast<Vec<T, 4>*>(out), total, row_of, rng);
}

template <typename T>
cudaError_t sample_normal_cuda(const T* mu, const T* sigma, T* out, int64_t d, int64_t n, PhiloxArgs rng,
                               cudaStream_t stream) {
  if (d <= 0 || n <= 0) return cudaSuccess;
  const int64_t chunks = (n + 3) / 4;
  if (n % 4 == 0 && is_aligned(out, 4 * sizeof(T))) {
    const int64_t total = d * chunks;
    if (total < (int64_t{1} << 31))
      launch_flat(mu, sigma, out, static_cast<uint32_t>(total), RowOf32(static_cast<uint32_t>(chunks)), rng, stream);
    else
      launch_flat(mu, sigma, out, static_cast<uint64_t>(total), RowOf64{static_cast<uint64_t>(chunks)}, rng, stream);
    return cudaGetLastError();
  }
  static std::atomic<int> occupancy[kMaxDevices] = {};
  // Block: 256 threads, x as wide as a row's chunks (at least a warp), the rest stacked over rows.
  int bx = 32;
  while (bx < kBlockSize && bx < chunks) bx *= 2;
  const dim3 block(bx, kBlockSize / bx);
  // Grid: one full wave of resident blocks, split between chunks (x) and rows (y).
  const int64_t cap = static_cast<int64_t>(sm_count()) *
                      resident_blocks_per_sm(reinterpret_cast<const void*>(&sample_normal_rows<T>), kBlockSize, occupancy);
  const int64_t gx = std::min<int64_t>((chunks + bx - 1) / bx, cap);
  const int64_t gy = std::min<int64_t>({(d + block.y - 1) / block.y, std::max<int64_t>(cap / gx, 1), 65535});
  sample_normal_rows<T><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block, 0, stream>>>(
      mu, sigma, out, d, n, chunks, rng);
  return cudaGetLastError();
}

#define KK_SAMPLE_NORMAL_INST(T)                                                                        \
  template cudaError_t sample_normal_cuda<T>(const T*, const T*, T*, int64_t, int64_t, PhiloxArgs, \
                                             cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_SAMPLE_NORMAL_INST)

}  // namespace kk
