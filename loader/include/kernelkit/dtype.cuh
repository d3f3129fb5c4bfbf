// Scalar types for kernelkit cards: accumulation types and half/bfloat16 conversions.
//
// Torch-free and host-compilable (the binding TU includes card headers that include this with g++).
// Arithmetic on __half/__nv_bfloat16 is always done in float ("acc" type); double stays double.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#if defined(__CUDACC__)
#define KK_HD __host__ __device__ __forceinline__
#define KK_DEVICE __device__ __forceinline__
// A card's math (<name>_math.h): device code where nvcc compiles it, so a body edit rebuilds device code only;
// plain inline C++ in the card's CPU file, which the host compiler compiles.
#define KK_MATH_FN __device__ __forceinline__
#else
#define KK_HD inline
#define KK_MATH_FN inline
#endif

namespace kk {

// Accumulation ("opmath") type: float for float/half/bfloat16, double for double.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

// Host and device: CPU loops (kk::cpu_run) are compiled by nvcc in a card's .cu or by the host compiler.
KK_HD float to_acc(float x) { return x; }
KK_HD double to_acc(double x) { return x; }
KK_HD float to_acc(__half x) { return __half2float(x); }
KK_HD float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round an accumulator back to the storage type (round to nearest even, like torch).
template <typename T> KK_HD T from_acc(acc_t<T> x) { return static_cast<T>(x); }
template <> KK_HD __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> KK_HD __nv_bfloat16 from_acc<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

}  // namespace kk

// KERNELKIT_DTYPE_SHARD=k (set by kernelkit, which compiles a card's .cu as four TUs on machines with cores to
// spare: kernelkit.jit.shards): the instantiation macros below expand the k-th of the four dtypes only.
#if !defined(KERNELKIT_DTYPE_SHARD)
#define KK_DTYPE_SHARD_0_(...) __VA_ARGS__
#define KK_DTYPE_SHARD_1_(...) __VA_ARGS__
#define KK_DTYPE_SHARD_2_(...) __VA_ARGS__
#define KK_DTYPE_SHARD_3_(...) __VA_ARGS__
#elif KERNELKIT_DTYPE_SHARD == 0
#define KK_DTYPE_SHARD_0_(...) __VA_ARGS__
#define KK_DTYPE_SHARD_1_(...)
#define KK_DTYPE_SHARD_2_(...)
#define KK_DTYPE_SHARD_3_(...)
#elif KERNELKIT_DTYPE_SHARD == 1
#define KK_DTYPE_SHARD_0_(...)
#define KK_DTYPE_SHARD_1_(...) __VA_ARGS__
#define KK_DTYPE_SHARD_2_(...)
#define KK_DTYPE_SHARD_3_(...)
#elif KERNELKIT_DTYPE_SHARD == 2
#define KK_DTYPE_SHARD_0_(...)
#define KK_DTYPE_SHARD_1_(...)
#define KK_DTYPE_SHARD_2_(...) __VA_ARGS__
#define KK_DTYPE_SHARD_3_(...)
#elif KERNELKIT_DTYPE_SHARD == 3
#define KK_DTYPE_SHARD_0_(...)
#define KK_DTYPE_SHARD_1_(...)
#define KK_DTYPE_SHARD_2_(...)
#define KK_DTYPE_SHARD_3_(...) __VA_ARGS__
#else
#error "KERNELKIT_DTYPE_SHARD: expected 0, 1, 2 or 3"
#endif

// Explicit instantiation of a card launcher `template <typename T> cudaError_t NAME(...)` for the four
// floating dtypes. Usage: KK_INSTANTIATE_FLOATING(KK_MY_INST); with #define KK_MY_INST(T) template ...;
#define KK_INSTANTIATE_FLOATING(INST) \
  KK_DTYPE_SHARD_0_(INST(float))      \
  KK_DTYPE_SHARD_1_(INST(double))     \
  KK_DTYPE_SHARD_2_(INST(__half))     \
  KK_DTYPE_SHARD_3_(INST(__nv_bfloat16))

// Expands INST(OP, T) for the four floating dtypes.
#define KK_INSTANTIATE_FLOATING_OP(INST, OP)                                                              \
  KK_DTYPE_SHARD_0_(INST(OP, float)) KK_DTYPE_SHARD_1_(INST(OP, double)) KK_DTYPE_SHARD_2_(INST(OP, __half)) \
  KK_DTYPE_SHARD_3_(INST(OP, __nv_bfloat16))
