// elementwise_mul device code: out = a * b over contiguous buffers (see common/elementwise.cuh).
#include <kernelkit/elementwise.cuh>
#include "elementwise_mul.h"

namespace kk {

template <typename T> cudaError_t elementwise_mul_cuda(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  return launch_elementwise<T, 2>(out, InPtrs<T, 2>{{a, b}}, n, MulOp<acc_t<T>>{}, stream);
}

#define KK_ELEMENTWISE_MUL_INST(T) \
  template cudaError_t elementwise_mul_cuda<T>(const T*, const T*, T*, int64_t, cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_ELEMENTWISE_MUL_INST)

}  // namespace kk
