// sigmoid: numerically stable logistic function and its backward from the saved output; the torch-facing
// ops (the math, for CUDA and the CPU, is in sigmoid.cu, so an edit of it never recompiles this binding).
#pragma once

#include <kernelkit/elementwise.h>

namespace kk {
template <typename A> struct SigmoidOp;          // s = sigmoid(x)
template <typename A> struct SigmoidBackwardOp;  // g * s * (1 - s)
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
