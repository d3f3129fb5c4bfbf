// sigmoid: numerically stable logistic function and its backward from the saved output, the math of both
// devices (KK_*_LAUNCHER compiles the CUDA launchers and the CPU loop of each functor).
//   forward:  s = 1 / (1 + e^-x) for x >= 0, e^x * (1 / (1 + e^x)) otherwise (one exp of -|x|: never
//             inf/NaN); float on the GPU within ~5 ulp of the exact value (expf 2 ulp, reciprocal 2)
//   backward: grad_x = g * s * (1 - s), one fused pass over (g, s)
#include <cmath>

#include <kernelkit/elementwise.cuh>
#include "sigmoid.h"

namespace kk {

// 1 / d for d in [1, 2]. On the GPU in float: the hardware reciprocal (__fdividef, <= 2 ulp in that
// range); an IEEE division's slow-path check made small sigmoids slower (docs/performance.md, "Other
// elementwise probes").
// Elsewhere, and in double, the division.
template <typename A> KK_HD A recip_1_to_2(A d) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(A) == sizeof(float)) return __fdividef(1.0f, d);
#endif
  return A(1) / d;
}

template <typename A> struct SigmoidOp {
  KK_HD A operator()(A x) const {
    using std::exp;
    const A e = exp(x >= A(0) ? -x : x);  // in (0, 1]
    const A r = recip_1_to_2(A(1) + e);     // one reciprocal for both signs
    return x >= A(0) ? r : e * r;
  }
};

template <typename A> struct SigmoidBackwardOp {
  KK_HD A operator()(A g, A s) const { return g * s * (A(1) - s); }
};

}  // namespace kk

KK_UNARY_LAUNCHER(kk::SigmoidOp);
KK_BINARY_LAUNCHER(kk::SigmoidBackwardOp);
