// Torch-free declarations of the generic elementwise launchers, for card headers and binding TUs.
//
// <kernelkit/elementwise.cuh> defines them; a card's .cu instantiates them for its functor over the four
// floating dtypes with one line each, KK_UNARY_LAUNCHER(kk::ReluOp) or KK_BINARY_LAUNCHER(kk::MulOp), and
// its binding calls them through kk::unary_elementwise / kk::binary_elementwise (<kernelkit/torch_glue.h>).
// Op is a functor template over the accumulation type A with `A operator()(A...) const`, default-constructed;
// the binding needs only its declaration (`template <typename A> struct ReluOp;`).
#pragma once

#include <cstdint>

#include "dtype.cuh"

namespace kk {

// out[i] = Op<acc_t<T>>{}(x[i]) for i < n, on `stream`. `out` may alias x exactly.
template <template <typename> class Op, typename T>
cudaError_t unary_launch(const T* x, T* out, int64_t n, cudaStream_t stream);

// out[i] = Op<acc_t<T>>{}(a[i], b[i]) for i < n, on `stream`. `out` may alias a or b exactly.
template <template <typename> class Op, typename T>
cudaError_t binary_launch(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream);

// The CPU loop over one run of n elements: data[0] is out, data[1..NIn] the inputs, each advancing by its
// own byte stride in `strides` (0: a broadcast operand); Op<acc_t<T>> computes each element. The launcher
// macros compile it in the card's .cu (KK_*_LAUNCHER) or its CPU file (KK_*_CPU_LOOP), so the binding needs
// Op's name only, and a math edit never rebuilds the torch-facing binding.
template <template <typename> class Op, typename T, int NIn>
void cpu_run(char* const* data, const int64_t* strides, int64_t n);

}  // namespace kk
