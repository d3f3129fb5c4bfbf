// The CPU loop of a generic elementwise op: out[i] = f(in0[i], in1[i], ...) over one run of elements, each
// operand advancing by its own byte stride. Host-compilable: a card whose math is apart compiles it with the
// host compiler (its CPU file: KK_UNARY_CPU_LOOP(kk::Op)); <kernelkit/elementwise.cuh> includes it for the
// cards whose .cu compiles both (KK_UNARY_LAUNCHER).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "dtype.cuh"

namespace kk {

template <typename F, typename A, int NIn, size_t... I>
KK_HD A apply_host(const F& f, const A (&x)[NIn], std::index_sequence<I...>) {
  return f(x[I]...);
}

template <template <typename> class Op, typename T, int NIn>
void cpu_run(char* const* data, const int64_t* strides, int64_t n) {
  using A = acc_t<T>;
  const Op<A> f{};
  bool contiguous = true;
  for (int k = 0; k <= NIn; ++k) contiguous = contiguous && strides[k] == static_cast<int64_t>(sizeof(T));
  if (contiguous) {  // the common case, as its own loop the host compiler vectorises
    T* out = reinterpret_cast<T*>(data[0]);
    const T* in[NIn];
    for (int k = 0; k < NIn; ++k) in[k] = reinterpret_cast<const T*>(data[k + 1]);
    for (int64_t i = 0; i < n; ++i) {
      A a[NIn];
      for (int k = 0; k < NIn; ++k) a[k] = to_acc(in[k][i]);
      out[i] = from_acc<T>(apply_host(f, a, std::make_index_sequence<NIn>{}));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    A a[NIn];
    for (int k = 0; k < NIn; ++k) a[k] = to_acc(*reinterpret_cast<const T*>(data[k + 1] + i * strides[k + 1]));
    *reinterpret_cast<T*>(data[0] + i * strides[0]) = from_acc<T>(apply_host(f, a, std::make_index_sequence<NIn>{}));
  }
}

}  // namespace kk

// One line at file scope: the CPU loops of functor template OP (fully qualified, e.g. kk::ReluOp) that the
// binding's unary_elementwise / binary_elementwise call, for the four floating dtypes.
#define KK_UNARY_CPU_LOOP_T_(OP, T) template void kk::cpu_run<OP, T, 1>(char* const*, const int64_t*, int64_t);
#define KK_BINARY_CPU_LOOP_T_(OP, T) template void kk::cpu_run<OP, T, 2>(char* const*, const int64_t*, int64_t);
#define KK_UNARY_CPU_LOOP(OP) KK_INSTANTIATE_FLOATING_OP(KK_UNARY_CPU_LOOP_T_, OP)
#define KK_BINARY_CPU_LOOP(OP) KK_INSTANTIATE_FLOATING_OP(KK_BINARY_CPU_LOOP_T_, OP)
