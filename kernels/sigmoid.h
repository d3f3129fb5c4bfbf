// sigmoid: numerically stable logistic function and its backward from the saved output.
//   forward:  s = 1 / (1 + e^-x) for x >= 0, e^x * (1 / (1 + e^x)) otherwise (one exp of -|x|: never
//             inf/NaN); float on the GPU within ~5 ulp of the exact value (expf 2 ulp, reciprocal 2)
//   backward: grad_x = g * s * (1 - s), one fused pass over (g, s)
#pragma once

#include <cmath>

#include <kernelkit/elementwise.h>

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

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

namespace kk {

inline at::Tensor sigmoid(const at::Tensor& x) { return unary_elementwise<SigmoidOp>("sigmoid", x, "x"); }

inline at::Tensor sigmoid_backward(const at::Tensor& grad, const at::Tensor& out) {
  return binary_elementwise<SigmoidBackwardOp>("sigmoid_backward", grad, "grad", out, "out");
}

// Double backward: d sigmoid_backward(g, s) / ds = g (1 - 2 s).
struct SigmoidBackwardDs {
  at::Tensor operator()(const at::Tensor& g, const at::Tensor& s, const at::Tensor& gg) const {
    return gg * g * (1 - 2 * s);
  }
};

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("sigmoid(Tensor x) -> Tensor");
  m.def("sigmoid_backward(Tensor grad, Tensor out) -> Tensor");
  KK_IMPL_CPU_CUDA(m, "sigmoid", kk::sigmoid);
  KK_IMPL_CPU_CUDA(m, "sigmoid_backward", kk::sigmoid_backward);
  kk::impl_autograd<kk::UnaryAutograd<kk::Saved::Output>>(m, "sigmoid");
  kk::impl_autograd<kk::LinearBackwardAutograd<kk::SigmoidBackwardDs>>(m, "sigmoid_backward");
}
#endif  // KERNELKIT_BINDING
