// sample_normal device code: fused X = mu[:, None] + sigma[:, None] * z with z drawn by Philox in-kernel.
//
// Chunk (i, c) = elements 4c..4c+3 of row i uses Philox subsequence i * chunks + c (chunks = ceil(n/4)).
// One kernel walks the chunks flat: chunk k is subsequence k. When n % 4 == 0 and `out` is aligned for
// 4-element stores (always, for at::empty) chunk k is the k-th 4-element vector of the output; otherwise
// a warp stores its chunks' elements (the ragged row ends left out) as one contiguous range.
#include <algorithm>

#include <kernelkit/launch.cuh>
#include <kernelkit/philox.cuh>
#include <kernelkit/vec.cuh>
#include "sample_normal.h"

namespace kk {

// Philox costs 20 dependent multiplies per chunk, so each thread keeps several independent chunks in
// flight (ILP). The grid depends on what binds, each choice the fastest measured (docs/performance.md,
// "sample_normal / Launch shape"):
//  - where DRAM outruns the SMs (an H200 writes ~19 bytes per SM cycle) the arithmetic binds: a
//    persistent grid-stride loop over 4 waves avoids block turnover;
//  - elsewhere (an H100: ~13 bytes per SM cycle) the stores bind: one block per tile keeps the write front
//    compact.
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

// Stores chunk values x[0 .. cnt) (cnt = 0 past the end) to out[p ..] where rows are ragged (n % 4 != 0) or
// `out` is not aligned for 4-element stores. A warp's chunks are consecutive, so its elements fill one
// contiguous range of at most 128: staged in shared memory, then stored with consecutive lanes writing
// consecutive elements, the fastest of the store variants measured (each thread's own scalar stores split
// their sectors across four store instructions): docs/performance.md ("Ragged rows and unaligned outputs").
template <typename T, typename A>
__device__ __forceinline__ void store_warp_range(T* __restrict__ out, int64_t p, int cnt, const A (&x)[4],
                                                 T (&stage)[128]) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned valid = __ballot_sync(0xffffffffu, cnt > 0);  // a prefix of the warp's lanes
  if (valid == 0) return;
  const int64_t p0 = __shfl_sync(0xffffffffu, p, 0);
  const int o = static_cast<int>(p - p0);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (j < cnt) stage[o + j] = from_acc<T>(x[j]);
  const int end = __shfl_sync(0xffffffffu, o + cnt, 31 - __clz(static_cast<int>(valid)));
  __syncwarp();
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int q = static_cast<int>(lane) + 32 * m;
    if (q < end) out[p0 + q] = stage[q];
  }
  __syncwarp();  // the stage is rewritten by the warp's next chunks
}

// Chunk k is row i = k / chunks, column chunk c = k - i * chunks. Whole: n % 4 == 0 and `out` aligned,
// so chunk k is the k-th 4-element vector of `out`. Tiles are walked by block (a warp-uniform loop, as
// store_warp_range needs its whole warp).
template <typename T, typename I, typename RowOf, bool Whole>
__global__ void __launch_bounds__(kSnBlock, kSnMinBlocks)
sample_normal_flat(const T* __restrict__ mu, const T* __restrict__ sigma, T* __restrict__ out, I total,
                   int64_t chunks, int64_t n, RowOf row_of, PhiloxArgs rng) {
  using A = acc_t<T>;
  __shared__ T stage[Whole ? 1 : kSnBlock / 32][128];
  uint64_t seed, offset;
  unpack(rng, seed, offset);
  constexpr I kTile = I(kSnBlock) * kSnUnroll;
  for (I t0 = I(blockIdx.x) * kTile; t0 < total; t0 += I(gridDim.x) * kTile) {
    A x[kSnUnroll][4];
    I row[kSnUnroll];
#pragma unroll
    for (int u = 0; u < kSnUnroll; ++u) {  // computed unconditionally (clamped row) so the chains interleave
      const I k = t0 + I(u) * kSnBlock + threadIdx.x;
      row[u] = row_of(k < total ? k : I(0));
      Philox gen(seed, static_cast<uint64_t>(k), offset);
      normal4_affine(gen, to_acc(mu[row[u]]), to_acc(sigma[row[u]]), x[u]);
    }
#pragma unroll
    for (int u = 0; u < kSnUnroll; ++u) {
      const I k = t0 + I(u) * kSnBlock + threadIdx.x;
      if constexpr (Whole) {
        if (k < total) {
          Vec<T, 4> v;
#pragma unroll
          for (int j = 0; j < 4; ++j) v.v[j] = from_acc<T>(x[u][j]);
          reinterpret_cast<Vec<T, 4>*>(out)[k] = v;
        }
      } else {
        const int64_t c = static_cast<int64_t>(k) - static_cast<int64_t>(row[u]) * chunks;
        const int cnt = k < total ? static_cast<int>(n - 4 * c < 4 ? n - 4 * c : 4) : 0;
        store_warp_range(out, static_cast<int64_t>(row[u]) * n + 4 * c, cnt, x[u], stage[threadIdx.x / 32]);
      }
    }
  }
}

template <typename T, typename I, typename RowOf>
void launch_flat(const T* mu, const T* sigma, T* out, I total, int64_t chunks, int64_t n, RowOf row_of,
                 PhiloxArgs rng, cudaStream_t stream) {
  unsigned grid = tile_grid(static_cast<int64_t>(total), kSnTile);
  if (dram_outruns_sms()) grid = std::min<unsigned>(grid, sm_count() * kSnMinBlocks * kSnWaves);
  if (n % 4 == 0 && is_aligned(out, 4 * sizeof(T)))
    sample_normal_flat<T, I, RowOf, true><<<grid, kSnBlock, 0, stream>>>(mu, sigma, out, total, chunks, n, row_of, rng);
  else
    sample_normal_flat<T, I, RowOf, false><<<grid, kSnBlock, 0, stream>>>(mu, sigma, out, total, chunks, n, row_of, rng);
}

template <typename T>
cudaError_t sample_normal_cuda(const T* mu, const T* sigma, T* out, int64_t d, int64_t n, PhiloxArgs rng,
                               cudaStream_t stream) {
  if (d <= 0 || n <= 0) return cudaSuccess;
  const int64_t chunks = (n + 3) / 4, total = d * chunks;
  if (total < (int64_t{1} << 31))
    launch_flat(mu, sigma, out, static_cast<uint32_t>(total), chunks, n, RowOf32(static_cast<uint32_t>(chunks)), rng,
                stream);
  else
    launch_flat(mu, sigma, out, static_cast<uint64_t>(total), chunks, n, RowOf64{static_cast<uint64_t>(chunks)}, rng,
                stream);
  return cudaGetLastError();
}

#define KK_SAMPLE_NORMAL_INST(T)                                                                        \
  template cudaError_t sample_normal_cuda<T>(const T*, const T*, T*, int64_t, int64_t, PhiloxArgs, \
                                             cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_SAMPLE_NORMAL_INST);

}  // namespace kk
