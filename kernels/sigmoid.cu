// sigmoid device code: stable forward and fused backward (see common/elementwise.cuh).
#include <kernelkit/elementwise.cuh>
#include "sigmoid.h"

namespace kk {

template <typename T> cudaError_t sigmoid_cuda(const T* x, T* out, int64_t n, cudaStream_t stream) {
  return launch_elementwise<T, 1>(out, InPtrs<T, 1>{{x}}, n, SigmoidOp<acc_t<T>>{}, stream);
}

template <typename T>
cudaError_t sigmoid_backward_cuda(const T* grad, const T* s, T* grad_x, int64_t n, cudaStream_t stream) {
  return launch_elementwise<T, 2>(grad_x, InPtrs<T, 2>{{grad, s}}, n, SigmoidBackwardOp<acc_t<T>>{}, stream);
}

#define KK_SIGMOID_INST(T)                                                         \
  template cudaError_t sigmoid_cuda<T>(const T*, T*, int64_t, cudaStream_t);       \
  template cudaError_t sigmoid_backward_cuda<T>(const T*, const T*, T*, int64_t, cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_SIGMOID_INST)

}  // namespace kk
