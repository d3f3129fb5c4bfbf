// ddpm_step device code: the fused DDPM step with the timestep and its coefficients read on the device.
#include "common/elementwise.cuh"
#include "common/launch.cuh"
#include "common/philox.cuh"
#include "ddpm_step.h"

namespace kk {

// Noise drawn in the kernel: each thread handles 4-element chunks, one Philox normal4 per chunk,
// grid-stride.
template <typename T>
__global__ void ddpm_step_philox_kernel(const T* __restrict__ eps, const T* __restrict__ x, DdpmStepOp<acc_t<T>> op,
                                        PhiloxArgs rng, T* out, int64_t n) {
  using A = acc_t<T>;
  const auto m = op.prepare();
  uint64_t seed = 0, offset = 0;
  unpack(rng, seed, offset);
  const int64_t chunks = (n + 3) / 4;
  for (int64_t c = global_thread_id(); c < chunks; c += grid_stride()) {
    const int64_t i0 = 4 * c;
    A z[4] = {A(0), A(0), A(0), A(0)};
    if (m.add_noise) {
      Philox gen(seed, static_cast<uint64_t>(c), offset);
      normal4(gen, z);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = i0 + k;
      if (i < n) out[i] = from_acc<T>(m(to_acc(eps[i]), to_acc(x[i]), z[k]));
    }
  }
}

template <typename T>
cudaError_t ddpm_step_cuda(const T* eps, const int64_t* timestep, const T* x, const float* coeffs, int64_t num_t,
                           const T* noise, PhiloxArgs rng, double clip, T* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const DdpmStepOp<acc_t<T>> op{timestep, coeffs, num_t, clip};
  if (noise != nullptr)  // noise given: a streaming 3-input elementwise op (the card's benchmark)
    return launch_elementwise<T, 3>(out, InPtrs<T, 3>{{eps, x, noise}}, n, op, stream);
  ddpm_step_philox_kernel<T><<<grid_for((n + 3) / 4), kBlockSize, 0, stream>>>(eps, x, op, rng, out, n);
  return cudaGetLastError();
}

#define KK_DDPM_STEP_INST(T)                                                                                  \
  template cudaError_t ddpm_step_cuda<T>(const T*, const int64_t*, const T*, const float*, int64_t, const T*, \
                                         PhiloxArgs, double, T*, int64_t, cudaStream_t);
KK_INSTANTIATE_FLOATING(KK_DDPM_STEP_INST)

}  // namespace kk
