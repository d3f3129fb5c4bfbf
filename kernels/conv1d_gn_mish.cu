// conv1d_gn_mish device code: split conv1d partial sums (phase 1), then GroupNorm + Mish + epilogue (phase 2).
#include <algorithm>

#include "common/launch.cuh"
#include "conv1d_gn_mish.h"

namespace kk {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kCoTile = 32;            // output channels per block: one per lane
constexpr int kWRow = kCoTile + 1;     // padded smem row of the weight tile (conflict-free both ways)
constexpr int kSmemFloats = 12 * 1024; // 48 KB: no opt-in needed
constexpr int kMaxCich = 32;           // input channels per staged chunk (4 per warp)
constexpr int kMaxSplits = 32;

// Tile plan for one shape: length tile LT, batch tile BT (BT * LT <= 32 accumulators per lane), input
// channels per chunk, and the cross-block split of the chunks.
struct Plan {
  int lt, bt, cich, splits, chunks_per_split;
  int64_t co_tiles, l_tiles, b_tiles;
  size_t smem_bytes;
};

int tile_floats(int cich, int K, int lt, int bt) { return cich * K * kWRow + bt * cich * (lt + K - 1); }

Plan make_plan(const Conv1dShape& s) {
  Plan p{};
  p.lt = s.L <= 4 ? 4 : s.L <= 8 ? 8 : 16;
  p.bt = s.B == 1 ? 1 : 32 / p.lt;
  const int K = static_cast<int>(s.K);
  p.cich = kMaxCich;
  while (p.cich > 1 && tile_floats(p.cich, K, p.lt, p.bt) > kSmemFloats) p.cich /= 2;
  const int red = kWarps * p.bt * p.lt * 32;
  p.smem_bytes = sizeof(float) * static_cast<size_t>(std::max(tile_floats(p.cich, K, p.lt, p.bt), red));
  p.co_tiles = (s.Cout + kCoTile - 1) / kCoTile;
  p.l_tiles = (s.L + p.lt - 1) / p.lt;
  p.b_tiles = (s.B + p.bt - 1) / p.bt;
  // Split the input channels across blocks until the grid covers ~2 waves (batch 1 is bandwidth bound on
  // the weights: every SM must stream its share).
  const int64_t tiles = p.co_tiles * p.l_tiles * p.b_tiles;
  const int64_t chunks = std::max<int64_t>(1, (s.Cin + p.cich - 1) / p.cich);
  const int64_t want = std::max<int64_t>(1, (2 * static_cast<int64_t>(sm_count()) + tiles - 1) / tiles);
  const int64_t splits = std::min<int64_t>({want, chunks, kMaxSplits});
  p.chunks_per_split = static_cast<int>((chunks + splits - 1) / splits);
  p.splits = static_cast<int>((chunks + p.chunks_per_split - 1) / p.chunks_per_split);
  return p;
}

template <int LT, int BT>
__global__ void __launch_bounds__(kThreads) conv1d_partial_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                                   float* __restrict__ ws, Conv1dShape s, int cich,
                                                                   int chunks_per_split, int64_t co_tiles, int64_t l_tiles) {
  extern __shared__ float smem[];
  const int K = static_cast<int>(s.K), pad = K / 2, xw = LT + K - 1;
  const int64_t Cin = s.Cin, Cout = s.Cout, L = s.L, B = s.B;
  float* w_s = smem;                       // [cich * K][kWRow]: (ci, k) rows, co columns
  float* x_s = smem + cich * K * kWRow;    // [BT][cich][xw]
  int64_t tile = blockIdx.x;
  const int64_t co0 = (tile % co_tiles) * kCoTile;
  tile /= co_tiles;
  const int64_t l0 = (tile % l_tiles) * LT;
  const int64_t b0 = (tile / l_tiles) * BT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float acc[BT][LT];
#pragma unroll
  for (int bb = 0; bb < BT; ++bb)
#pragma unroll
    for (int l = 0; l < LT; ++l) acc[bb][l] = 0.f;

  const int64_t nchunks = (Cin + cich - 1) / cich;
  const int64_t ch_begin = static_cast<int64_t>(blockIdx.y) * chunks_per_split;
  const int64_t ch_end = std::min<int64_t>(nchunks, ch_begin + chunks_per_split);
  for (int64_t ch = ch_begin; ch < ch_end; ++ch) {
    const int64_t ci0 = ch * cich;
    const int nci = static_cast<int>(std::min<int64_t>(cich, Cin - ci0));
    const int seg = nci * K;  // contiguous floats of one weight row in this chunk
    __syncthreads();          // the previous chunk's compute is done with the tiles
#pragma unroll 4
    for (int e = threadIdx.x; e < kCoTile * seg; e += kThreads) {
      const int c = e / seg, r = e - c * seg;  // r fastest: coalesced reads along the weight row
      w_s[r * kWRow + c] = co0 + c < Cout ? w[(co0 + c) * Cin * K + ci0 * K + r] : 0.f;
    }
    for (int e = threadIdx.x; e < BT * cich * xw; e += kThreads) {
      const int j = e % xw, rest = e / xw, ci = rest % cich, bb = rest / cich;
      const int64_t b = b0 + bb, l = l0 - pad + j;
      x_s[e] = (b < B && ci < nci && l >= 0 && l < L) ? x[(b * Cin + ci0 + ci) * L + l] : 0.f;
    }
    __syncthreads();
    for (int ci = warp; ci < nci; ci += kWarps) {
      for (int k = 0; k < K; ++k) {
        const float wv = w_s[(ci * K + k) * kWRow + lane];
#pragma unroll
        for (int bb = 0; bb < BT; ++bb) {
          const float* xr = x_s + (bb * cich + ci) * xw + k;  // same address across the warp: broadcast
#pragma unroll
          for (int l = 0; l < LT; ++l) acc[bb][l] = fmaf(wv, xr[l], acc[bb][l]);
        }
      }
    }
  }

  // Sum the 8 warps' partials (fixed order: deterministic) and write this split's slice of the workspace.
  __syncthreads();
  float* red = smem;  // [warp][BT * LT][32]
#pragma unroll
  for (int bb = 0; bb < BT; ++bb)
#pragma unroll
    for (int l = 0; l < LT; ++l) red[(warp * BT * LT + bb * LT + l) * 32 + lane] = acc[bb][l];
  __syncthreads();
  float* out = ws + static_cast<int64_t>(blockIdx.y) * B * Cout * L;
  for (int o = threadIdx.x; o < BT * LT * 32; o += kThreads) {
    const int v = o >> 5, co_l = o & 31, bb = v / LT, l = v % LT;
    const int64_t b = b0 + bb, co = co0 + co_l, ll = l0 + l;
    if (b >= B || co >= Cout || ll >= L) continue;
    float sum = 0.f;
    for (int wi = 0; wi < kWarps; ++wi) sum += red[(wi * BT * LT + v) * 32 + co_l];
    out[(b * Cout + co) * L + ll] = sum;
  }
}

template <int LT, int BT>
cudaError_t launch_partial(const float* x, const float* w, float* ws, const Conv1dShape& s, const Plan& p,
                           cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.co_tiles * p.l_tiles * p.b_tiles), static_cast<unsigned>(p.splits));
  conv1d_partial_kernel<LT, BT><<<grid, kThreads, p.smem_bytes, stream>>>(x, w, ws, s, p.cich, p.chunks_per_split,
                                                                          p.co_tiles, p.l_tiles);
  return cudaGetLastError();
}

// ---- phase 2 ---------------------------------------------------------------------------------------

constexpr int kGnThreads = 256;
constexpr int kGnRegs = 8;  // slabs up to kGnRegs * kGnThreads values stay in registers

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block, returned to every thread (fixed order: deterministic). `sh` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous call
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) r += sh[i];
  return r;
}

__device__ __forceinline__ float mish(float v) { return v * tanhf(log1pf(expf(v))); }

struct GnArgs {
  const float* ws;
  int splits;
  int64_t split_stride;
  const float* bias;
  const float* gamma;
  const float* beta;
  GnMishEpilogue epi;
  float* out;
  int64_t C, L, groups;
  float eps;
};

// Slab of one (batch, group): cg * L contiguous values at `base` in ws and out.
__device__ __forceinline__ float gn_load(const GnArgs& a, int64_t base, int64_t c0, int64_t e) {
  float y = a.bias != nullptr ? a.bias[c0 + e / a.L] : 0.f;
  for (int s = 0; s < a.splits; ++s) y += a.ws[s * a.split_stride + base + e];
  return y;
}

__device__ __forceinline__ void gn_store(const GnArgs& a, int64_t b, int64_t base, int64_t c0, int64_t e, float y,
                                         float mean, float rstd) {
  const int64_t c = c0 + e / a.L;
  float v = mish((y - mean) * rstd * a.gamma[c] + a.beta[c]);
  if (a.epi.scale != nullptr) v = v * a.epi.scale[b * a.epi.scale_sb + c * a.epi.scale_sc];
  if (a.epi.shift != nullptr) v = v + a.epi.shift[b * a.epi.shift_sb + c * a.epi.shift_sc];
  if (a.epi.residual != nullptr) v = v + a.epi.residual[base + e];
  a.out[base + e] = v;
}

__global__ void __launch_bounds__(kGnThreads) gn_mish_kernel(GnArgs a) {
  __shared__ float sh[32];
  const int64_t b = blockIdx.x / a.groups, g = blockIdx.x % a.groups;
  const int64_t cg = a.C / a.groups, n = cg * a.L, c0 = g * cg;
  const int64_t base = (b * a.C + c0) * a.L;
  const float inv_n = 1.f / static_cast<float>(n);
  const int tid = threadIdx.x, bd = blockDim.x;
  if (n <= static_cast<int64_t>(kGnRegs) * bd) {  // values stay in registers: one read of the workspace
    float v[kGnRegs];
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kGnRegs; ++j) {
      const int64_t e = tid + static_cast<int64_t>(j) * bd;
      v[j] = e < n ? gn_load(a, base, c0, e) : 0.f;
      sum += v[j];
    }
    const float mean = block_sum(sum, sh) * inv_n;
    float sq = 0.f;
#pragma unroll
    for (int j = 0; j < kGnRegs; ++j) {
      const int64_t e = tid + static_cast<int64_t>(j) * bd;
      const float d = v[j] - mean;
      sq += e < n ? d * d : 0.f;
    }
    const float rstd = rsqrtf(block_sum(sq, sh) * inv_n + a.eps);
#pragma unroll
    for (int j = 0; j < kGnRegs; ++j) {
      const int64_t e = tid + static_cast<int64_t>(j) * bd;
      if (e < n) gn_store(a, b, base, c0, e, v[j], mean, rstd);
    }
    return;
  }
  // Large slab: stage y in `out` (each element is read back by the thread that wrote it).
  float sum = 0.f;
  for (int64_t e = tid; e < n; e += bd) {
    const float y = gn_load(a, base, c0, e);
    a.out[base + e] = y;
    sum += y;
  }
  const float mean = block_sum(sum, sh) * inv_n;
  float sq = 0.f;
  for (int64_t e = tid; e < n; e += bd) {
    const float d = a.out[base + e] - mean;
    sq += d * d;
  }
  const float rstd = rsqrtf(block_sum(sq, sh) * inv_n + a.eps);
  for (int64_t e = tid; e < n; e += bd) gn_store(a, b, base, c0, e, a.out[base + e], mean, rstd);
}

}  // namespace

int conv1d_partial_splits(Conv1dShape s) { return make_plan(s).splits; }

cudaError_t conv1d_partial_cuda(const float* x, const float* w, float* ws, Conv1dShape s, int splits,
                                cudaStream_t stream) {
  if (s.B <= 0 || s.Cout <= 0 || s.L <= 0) return cudaSuccess;
  const Plan p = make_plan(s);
  if (p.splits != splits) return cudaErrorInvalidValue;  // workspace sized for another plan
  switch (p.lt * 100 + p.bt) {
    case 401: return launch_partial<4, 1>(x, w, ws, s, p, stream);
    case 408: return launch_partial<4, 8>(x, w, ws, s, p, stream);
    case 801: return launch_partial<8, 1>(x, w, ws, s, p, stream);
    case 804: return launch_partial<8, 4>(x, w, ws, s, p, stream);
    case 1601: return launch_partial<16, 1>(x, w, ws, s, p, stream);
    case 1602: return launch_partial<16, 2>(x, w, ws, s, p, stream);
    default: return cudaErrorInvalidConfiguration;
  }
}

cudaError_t gn_mish_cuda(const float* ws, int splits, const float* bias, const float* gamma, const float* beta,
                         GnMishEpilogue epi, float* out, int64_t B, int64_t C, int64_t L, int64_t groups, float eps,
                         cudaStream_t stream) {
  if (B <= 0 || C <= 0 || L <= 0) return cudaSuccess;
  const GnArgs a{ws, splits, B * C * L, bias, gamma, beta, epi, out, C, L, groups, eps};
  gn_mish_kernel<<<static_cast<unsigned>(B * groups), kGnThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kk
