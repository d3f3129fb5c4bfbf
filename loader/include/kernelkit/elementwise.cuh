// Generic elementwise kernel: out[i] = f(in0[i], in1[i], ...) over n contiguous elements.
//
// The functor takes and returns the accumulation type (float for half/bfloat16/float, double for
// double). Each block owns one tile of `unroll` x blockDim accesses: all of a thread's loads are issued
// before its first store, and the grid covers the tensor once (PyTorch's launch shape). The access shape
// (launch_elementwise) depends on what binds (common/launch.cuh, dram_outruns_sms), the number of inputs
// and the operand size, because each rule measured fastest side by side with the others and
// torch.compile: see docs/performance.md ("Elementwise: copy floor and access shapes").
// Unaligned pointers take single-element accesses. `out` may alias an input exactly (each element is read
// before it is written by the same thread); partial overlap is not allowed.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>

#include "dtype.cuh"
#include "elementwise.h"
#include "elementwise_cpu.h"
#include "launch.cuh"
#include "vec.cuh"

namespace kk {

// Operand sizes (bytes) where the best shape changes (docs/performance.md, "Access shape"):
constexpr int64_t kEwMidOperand = int64_t{1} << 20;     // from 1 MiB: two inputs 16 B x 4 (H100), three 16 B x 1
constexpr int64_t kEwStreamOperand = int64_t{32} << 20;  // from 32 MiB: DRAM streaming shapes
constexpr int64_t kEwLargeOperand = int64_t{1} << 30;   // from 1 GiB: the 8-byte shape takes 512 threads

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

// A functor whose per-element form depends on device memory (ddpm_step's coefficients, indexed by a
// timestep that lives on the device so a loop can be graph-captured) provides `__device__ G prepare()
// const`, called once per tile after the tile's loads are issued (so its dependent reads overlap them
// rather than precede them); the kernel applies the G it returns. Other functors are used as given.
template <typename F, typename = void> struct HasPrepare : std::false_type {};
template <typename F>
struct HasPrepare<F, std::void_t<decltype(std::declval<const F&>().prepare())>> : std::true_type {};

template <typename F> __device__ __forceinline__ auto prepared(const F& f) {
  if constexpr (HasPrepare<F>::value) return f.prepare();
  else return f;
}

// Index arithmetic of the kernel. Below kEwSmallIndexLimit elements indices are 32-bit and each block
// does one tile (the load addresses come a few dependent instructions sooner, which small tensors feel);
// when the tiles also divide the tensor (`kEwExact`) there are no bounds checks and no scalar tail, like
// inductor's unmasked kernels (launch_elementwise_w says where not). Both measured faster at small sizes:
// docs/performance.md ("Other elementwise probes").
// Above the limit (`kEwInt64`), 64-bit indices and the block loop striding by the grid (any int64 size,
// past the 2^31 - 1 block limit too).
enum EwIndex : int { kEwExact, kEwInt32, kEwInt64 };
constexpr int64_t kEwSmallIndexLimit = (int64_t{1} << 31) - (int64_t{1} << 16);  // margin > B*U*W + B

// W elements per access, U accesses per thread per tile, B threads per block. Accesses [0, n / W) go
// through tiles; the last n % W elements (only when W > 1) are done one by one by block 0.
template <typename T, int W, int U, int B, int NIn, int Ix, typename F>
__global__ void __launch_bounds__(B) elementwise_kernel(T* out, InPtrs<T, NIn> in, int64_t n64, F functor) {
  using A = acc_t<T>;
  constexpr bool kBig = Ix == kEwInt64, kExact = Ix == kEwExact;
  using I = std::conditional_t<kBig, int64_t, int32_t>;
  using VecT = Vec<T, W>;
  const I n = static_cast<I>(n64);
  const I nacc = n / W;
  constexpr I kTile = I{B} * U;
  I tile = blockIdx.x;
  do {  // every block of the grid (tile_grid) starts on a tile; only a kEwInt64 launch may loop
    const I base = tile * kTile + static_cast<I>(threadIdx.x);
    VecT x[U][NIn];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + u * B;
      if (kExact || i < nacc) {
#pragma unroll
        for (int k = 0; k < NIn; ++k) x[u][k] = reinterpret_cast<const VecT*>(in.p[k])[i];
      }
    }
    const auto f = prepared(functor);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I i = base + u * B;
      if (kExact || i < nacc) {
        VecT y;
#pragma unroll
        for (int j = 0; j < W; ++j) {
          A a[NIn];
#pragma unroll
          for (int k = 0; k < NIn; ++k) a[k] = to_acc(x[u][k].v[j]);
          y.v[j] = from_acc<T>(apply_acc<NIn>(f, a));
        }
        reinterpret_cast<VecT*>(out)[i] = y;
      }
    }
    tile += gridDim.x;
  } while (kBig && tile * kTile < nacc);
  if constexpr (W > 1 && !kExact) {
    const I i = nacc * W + static_cast<I>(threadIdx.x);
    if (blockIdx.x == 0 && i < n) {
      A a[NIn];
#pragma unroll
      for (int k = 0; k < NIn; ++k) a[k] = to_acc(in.p[k][i]);
      out[i] = from_acc<T>(apply_acc<NIn>(prepared(functor), a));
    }
  }
}

template <typename T, int W, int U, int B, int NIn, typename F>
cudaError_t launch_elementwise_w(T* out, InPtrs<T, NIn> in, int64_t n, F f, cudaStream_t stream) {
  static_assert(W <= B, "the scalar tail is done by one block");
  constexpr int64_t kTileElems = int64_t{B} * U * W;
  static_assert(kTileElems + B < (int64_t{1} << 16), "kEwSmallIndexLimit's margin");
  const unsigned grid = tile_grid(n / W, int64_t{B} * U);
  if (n >= kEwSmallIndexLimit) {
    elementwise_kernel<T, W, U, B, NIn, kEwInt64, F><<<grid, B, 0, stream>>>(out, in, n, f);
    return cudaGetLastError();
  }
  // Not for single-element accesses (unaligned operands), nor for functors with prepare(): without bounds
  // checks the compiler issues the tile's loads after ddpm_step's timestep read returns (SASS), which is
  // slower (docs/performance.md, "ddpm_step").
  if constexpr (W > 1 && !HasPrepare<F>::value) {
    if (n % kTileElems == 0) {
      elementwise_kernel<T, W, U, B, NIn, kEwExact, F><<<grid, B, 0, stream>>>(out, in, n, f);
      return cudaGetLastError();
    }
  }
  elementwise_kernel<T, W, U, B, NIn, kEwInt32, F><<<grid, B, 0, stream>>>(out, in, n, f);
  return cudaGetLastError();
}

// Access shapes, bytes per access x accesses per thread x threads per block ("wide": DRAM outruns the SMs):
//  - one input: 16 x 2 x 128 streaming (from 32 MiB) on a wide device, else 16 x 1 x 256;
//  - two inputs: below 1 MiB 16 x 2 x 128; from 1 to 32 MiB 16 x 4 x 256 (wide: 16 x 2 x 128); streaming
//    8 x 1 x 256, 512 threads from 1 GiB (wide: 16 x 2 x 128);
//  - three inputs: below 1 MiB 8 x 1 x 256; streaming on a device that is not wide as two inputs;
//    otherwise 16 x 1 x 256.
// Launch on `stream`; returns cudaGetLastError() (cudaSuccess for n == 0, nothing launched).
template <typename T, int NIn, typename F>
cudaError_t launch_elementwise(T* out, InPtrs<T, NIn> in, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t operand = n * static_cast<int64_t>(sizeof(T));
  const bool wide = dram_outruns_sms();
  const bool streaming = operand >= kEwStreamOperand;
  const bool mid = operand >= kEwMidOperand && !streaming;
  // 8-byte accesses: several inputs streaming on the H100; three inputs below 1 MiB on both GPUs
  const bool eight = NIn > 1 && (streaming ? !wide : NIn > 2 && !mid);
  bool aligned = is_aligned(out, eight ? 8 : kVecBytes);
  for (int k = 0; k < NIn; ++k) aligned = aligned && is_aligned(in.p[k], eight ? 8 : kVecBytes);
  const bool big_block = NIn > 1 && operand >= kEwLargeOperand;  // one access per thread: 512 threads
  if (!aligned) {
    if constexpr (NIn > 1) {  // (not instantiated where it cannot run: every kernel costs compile time)
      if (big_block) return launch_elementwise_w<T, 1, 1, 512, NIn>(out, in, n, f, stream);
    }
    return launch_elementwise_w<T, 1, 1, 256, NIn>(out, in, n, f, stream);
  }
  constexpr int W = vec_width<T>();
  if constexpr (NIn == 1) {
    if (wide && streaming) return launch_elementwise_w<T, W, 2, 128, NIn>(out, in, n, f, stream);
    return launch_elementwise_w<T, W, 1, 256, NIn>(out, in, n, f, stream);
  } else {
    if (!eight) {
      if constexpr (NIn == 2) {
        return mid && !wide ? launch_elementwise_w<T, W, 4, 256, NIn>(out, in, n, f, stream)
                            : launch_elementwise_w<T, W, 2, 128, NIn>(out, in, n, f, stream);
      } else {
        return launch_elementwise_w<T, W, 1, 256, NIn>(out, in, n, f, stream);
      }
    }
    constexpr int W8 = vec_width<T, 8>();
    return big_block ? launch_elementwise_w<T, W8, 1, 512, NIn>(out, in, n, f, stream)
                     : launch_elementwise_w<T, W8, 1, 256, NIn>(out, in, n, f, stream);
  }
}

template <template <typename> class Op, typename T>
cudaError_t unary_launch(const T* x, T* out, int64_t n, cudaStream_t stream) {
  return launch_elementwise<T, 1>(out, InPtrs<T, 1>{{x}}, n, Op<acc_t<T>>{}, stream);
}

template <template <typename> class Op, typename T>
cudaError_t binary_launch(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  return launch_elementwise<T, 2>(out, InPtrs<T, 2>{{a, b}}, n, Op<acc_t<T>>{}, stream);
}

}  // namespace kk

// One line in a card's .cu: the launchers of <kernelkit/elementwise.h> for functor template OP and its CPU
// loop, compiled for float, double, __half and __nv_bfloat16 (at file scope; OP fully qualified, e.g. kk::ReluOp).
// A card whose math is apart (KK_MATH_FN functors in <name>_math.h) uses KK_*_CUDA_LAUNCHER here and
// KK_*_CPU_LOOP (<kernelkit/elementwise_cpu.h>) in its CPU file, so that nvcc compiles no host use of the math.
// A line may end with ';' (an empty declaration): then a C++ parser reads the file whole.
#define KK_UNARY_CUDA_LAUNCHER_T_(OP, T) \
  template cudaError_t kk::unary_launch<OP, T>(const T*, T*, int64_t, cudaStream_t);
#define KK_BINARY_CUDA_LAUNCHER_T_(OP, T) \
  template cudaError_t kk::binary_launch<OP, T>(const T*, const T*, T*, int64_t, cudaStream_t);
#define KK_UNARY_CUDA_LAUNCHER(OP) KK_INSTANTIATE_FLOATING_OP(KK_UNARY_CUDA_LAUNCHER_T_, OP)
#define KK_BINARY_CUDA_LAUNCHER(OP) KK_INSTANTIATE_FLOATING_OP(KK_BINARY_CUDA_LAUNCHER_T_, OP)
#define KK_UNARY_LAUNCHER(OP) KK_UNARY_CUDA_LAUNCHER(OP) KK_UNARY_CPU_LOOP(OP)
#define KK_BINARY_LAUNCHER(OP) KK_BINARY_CUDA_LAUNCHER(OP) KK_BINARY_CPU_LOOP(OP)
