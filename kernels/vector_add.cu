// vector_add device code: out = a + alpha * b over contiguous buffers (see <kernelkit/elementwise.cuh>).
#include <kernelkit/elementwise.cuh>
#include "vector_add.h"

namespace kk {

template <typename T>
cudaError_t vector_add_cuda(const T* a, const T* b, T* out, double alpha, int64_t n, cudaStream_t stream) {
  using A = acc_t<T>;
  return launch_elementwise<T, 2>(out, InPtrs<T, 2>{{a, b}}, n, AddOp<A>{static_cast<A>(alpha)}, stream);
}

#define KK_VECTOR_ADD_INST(T) \
  template cudaError_t vector_add_cuda<T>(const T*, const T*, T*, double, int64_t, cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_VECTOR_ADD_INST);

}  // namespace kk
