// conv1d_gn_mish device code: split conv1d partial sums (phase 1), then GroupNorm + Mish + epilogue (phase 2).
// The direct path is phase 2 alone, computing its slab of the convolution from x and W (few taps).
#include <algorithm>

#include <kernelkit/launch.cuh>
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
      int row = r;                             // (ci, k) row of the tile: ci * K + k
      int64_t src = ci0 * K + r;
      if (s.w_channels_last) {                 // the row holds K runs of the chunk's nci channels
        const int k = r / nci, ci = r - k * nci;
        row = ci * K + k;
        src = k * Cin + ci0 + ci;
      }
      w_s[row * kWRow + c] = co0 + c < Cout ? w[(co0 + c) * Cin * K + src] : 0.f;
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
constexpr int kGnMaxRegs = 8;  // slabs up to kGnMaxRegs * kGnThreads values stay in registers

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

// mish(v) = v * tanh(softplus(v)), with tanh(log1p(t)) = (t^2 + 2t) / (t^2 + 2t + 2) for t = e^v: one
// exponential and one division instead of three transcendentals. Above 20, tanh(softplus(v)) is 1 in
// float (and t^2 would leave __fdividef's range); v = -inf gives NaN, as torch's mish does.
__device__ __forceinline__ float mish(float v) {
  if (v > 20.f) return v;
  const float t = expf(v), n = t * (t + 2.f);
  return v * __fdividef(n, n + 2.f);
}

// Where the convolution's values come from (bias excluded): the splits of phase 1 summed, or, for a
// convolution with few taps (Cin * K), computed right here from x and W (one kernel, no workspace).
struct SplitSum {
  const float* ws;
  int splits;
  int64_t split_stride, sb, sc, sl;  // ws[s][b][c][l] at s * split_stride + b * sb + c * sc + l * sl
  __device__ __forceinline__ float operator()(int64_t b, int64_t c, int64_t l) const {
    const float* p = ws + b * sb + c * sc + l * sl;
    float y = 0.f;
    for (int s = 0; s < splits; ++s) y += __ldg(p + s * split_stride);
    return y;
  }
};

struct DirectConv {
  const float* x;  // (B, Cin, L)
  const float* w;  // (Cout, Cin, K), or stored (Cout, K, Cin): w_sci, w_sk
  int64_t cin, L, w_sci, w_sk;
  int K;
  __device__ __forceinline__ float operator()(int64_t b, int64_t c, int64_t l) const {
    const int pad = K / 2;
    const float* xb = x + b * cin * L + l - pad;
    const float* wc = w + c * cin * K;
    const int64_t lo = pad - l, hi = L - l + pad;  // taps that land inside [0, L)
    const int k0 = lo > 0 ? static_cast<int>(lo) : 0, k1 = hi < K ? static_cast<int>(hi) : K;
    float y = 0.f;
    for (int64_t ci = 0; ci < cin; ++ci)
      for (int k = k0; k < k1; ++k) y = fmaf(__ldg(wc + ci * w_sci + k * w_sk), __ldg(xb + ci * L + k), y);
    return y;
  }
};

// Everything one output element needs besides the group's statistics; loaded before the reductions so
// that their latency overlaps the convolution's values instead of following the statistics.
struct GnElem {
  float y, gamma, beta, scale, shift, residual;
};

// y (the convolution plus bias) at (b, c, l).
template <typename Src>
__device__ __forceinline__ float gn_y(const GnMishParams& a, const Src& src, int64_t b, int64_t c, int64_t l) {
  return src(b, c, l) + (a.bias != nullptr ? __ldg(a.bias + c) : 0.f);
}

__device__ __forceinline__ GnElem gn_operands(const GnMishParams& a, int64_t b, int64_t base, int64_t c, int64_t e) {
  const GnMishEpilogue& p = a.epi;
  GnElem v;
  v.y = 0.f;
  v.gamma = __ldg(a.gamma + c);
  v.beta = __ldg(a.beta + c);
  v.scale = p.scale != nullptr ? __ldg(p.scale + b * p.scale_sb + c * p.scale_sc) : 1.f;
  v.shift = p.shift != nullptr ? __ldg(p.shift + b * p.shift_sb + c * p.shift_sc) : 0.f;
  v.residual = p.residual != nullptr ? __ldg(p.residual + base + e) : 0.f;
  return v;
}

// The epilogue in the reference's order: FiLM scale, then shift, then residual.
__device__ __forceinline__ float gn_out(const GnElem& v, float mean, float rstd) {
  return mish((v.y - mean) * rstd * v.gamma + v.beta) * v.scale + v.shift + v.residual;
}

// A block per (batch, group): the slab of cg * L contiguous values at `base` in out (and in ws). A slab of
// up to R * kGnThreads values stays in registers, R values per thread (R as small as the slab allows: fewer
// registers, more blocks resident per SM); R = 0: larger slabs, staged in `out`.
template <int R, typename Src>
__global__ void __launch_bounds__(kGnThreads) gn_mish_kernel(const GnMishParams a, Src src) {
  __shared__ float sh[32];
  const int64_t b = blockIdx.x / a.groups, g = blockIdx.x % a.groups;
  const int64_t cg = a.C / a.groups, n = cg * a.L, c0 = g * cg;
  const int64_t base = (b * a.C + c0) * a.L;
  const float inv_n = 1.f / static_cast<float>(n);
  const int tid = threadIdx.x, bd = blockDim.x;
  if constexpr (R > 0) {  // values stay in registers: one read of everything
    const int n32 = static_cast<int>(n), L32 = static_cast<int>(a.L);
    GnElem v[R];  // slots past the slab's end stay unset and unread
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int e = tid + j * bd;
      if (e < n32) {
        const int c_local = e / L32;
        v[j] = gn_operands(a, b, base, c0 + c_local, e);
        v[j].y = gn_y(a, src, b, c0 + c_local, e - c_local * L32);
        sum += v[j].y;
      }
    }
    const float mean = block_sum(sum, sh) * inv_n;
    float sq = 0.f;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (tid + j * bd < n32) {
        const float d = v[j].y - mean;
        sq += d * d;
      }
    }
    const float rstd = rsqrtf(block_sum(sq, sh) * inv_n + a.eps);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int e = tid + j * bd;
      if (e < n32) a.out[base + e] = gn_out(v[j], mean, rstd);
    }
    return;
  }
  // Large slab: stage y in `out` (each element is read back by the thread that wrote it).
  float sum = 0.f;
  for (int64_t e = tid; e < n; e += bd) {
    const int64_t c_local = e / a.L;
    const float y = gn_y(a, src, b, c0 + c_local, e - c_local * a.L);
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
  for (int64_t e = tid; e < n; e += bd) {
    GnElem v = gn_operands(a, b, base, c0 + e / a.L, e);
    v.y = a.out[base + e];
    a.out[base + e] = gn_out(v, mean, rstd);
  }
}

template <typename Src>
cudaError_t launch_gn_mish(const Src& src, const GnMishParams& p, cudaStream_t stream) {
  if (p.B <= 0 || p.C <= 0 || p.L <= 0) return cudaSuccess;
  const int64_t n = p.C / p.groups * p.L;
  const unsigned grid = static_cast<unsigned>(p.B * p.groups);
  if (n <= 1 * kGnThreads) gn_mish_kernel<1><<<grid, kGnThreads, 0, stream>>>(p, src);
  else if (n <= 2 * kGnThreads) gn_mish_kernel<2><<<grid, kGnThreads, 0, stream>>>(p, src);
  else if (n <= 4 * kGnThreads) gn_mish_kernel<4><<<grid, kGnThreads, 0, stream>>>(p, src);
  else if (n <= kGnMaxRegs * kGnThreads) gn_mish_kernel<kGnMaxRegs><<<grid, kGnThreads, 0, stream>>>(p, src);
  else gn_mish_kernel<0><<<grid, kGnThreads, 0, stream>>>(p, src);
  return cudaGetLastError();
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

cudaError_t gn_mish_cuda(const float* ws, int splits, const int64_t* ws_strides, const GnMishParams& p,
                         cudaStream_t stream) {
  return launch_gn_mish(SplitSum{ws, splits, p.B * p.C * p.L, ws_strides[0], ws_strides[1], ws_strides[2]}, p, stream);
}

cudaError_t conv_gn_mish_direct_cuda(const float* x, const float* w, const Conv1dShape& s, const GnMishParams& p,
                                     cudaStream_t stream) {
  const int64_t w_sci = s.w_channels_last ? 1 : s.K, w_sk = s.w_channels_last ? s.Cin : 1;
  return launch_gn_mish(DirectConv{x, w, s.Cin, p.L, w_sci, w_sk, static_cast<int>(s.K)}, p, stream);
}

}  // namespace kk
