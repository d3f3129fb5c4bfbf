// sigmoid: numerically stable logistic function and its backward from the saved output.
//   forward:  s = 1 / (1 + e^-x) for x >= 0, e^x * (1 / (1 + e^x)) otherwise (one exp of -|x|: never
//             inf/NaN); float on the GPU within ~5 ulp of the exact value (expf 2 ulp, reciprocal 2)
//   backward: grad_x = g * s * (1 - s), one fused pass over (g, s)
#pragma once

#include <cmath>
#include <cstdint>

#include <kernelkit/dtype.cuh>

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

// out[i] = sigmoid(x[i]) for i < n, on `stream`. `out` may alias x exactly.
template <typename T> cudaError_t sigmoid_cuda(const T* x, T* out, int64_t n, cudaStream_t stream);
// grad_x[i] = grad[i] * s[i] * (1 - s[i]) for i < n, on `stream`.
template <typename T>
cudaError_t sigmoid_backward_cuda(const T* grad, const T* s, T* grad_x, int64_t n, cudaStream_t stream);

}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

namespace kk {

inline at::Tensor sigmoid(const at::Tensor& x) {
  check_floating("sigmoid", x, "x");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = new_output(xc.sizes(), xc);
  KK_DISPATCH_FLOATING(out.scalar_type(), "sigmoid", [&] {
    if (out.is_cuda()) {
      KK_CUDA_LAUNCH(out.device(), sigmoid_cuda(cuda_cptr<scalar_t>(xc), cuda_ptr<scalar_t>(out), out.numel(),
                                                at::cuda::getCurrentCUDAStream()));
    } else {
      cpu_elementwise<scalar_t>(out, SigmoidOp<at::opmath_type<scalar_t>>{}, xc);
    }
  });
  return out;
}

inline at::Tensor sigmoid_backward(const at::Tensor& grad, const at::Tensor& out) {
  return binary_elementwise<SigmoidBackwardOp>("sigmoid_backward", grad, "grad", out, "out",
                                               [](auto... args) { return sigmoid_backward_cuda(args...); });
}

// d sigmoid: grad_x = sigmoid_backward(g, s), from the saved output s.
struct SigmoidAutograd : torch::autograd::Function<SigmoidAutograd> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const c10::OperatorHandle* op) {
    ctx->saved_data["op"] = op->schema().name();
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = op->typed<UnarySig>().call(x);
    }
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor s = ctx->get_saved_variables()[0];
    const auto bw = sibling_op<BinarySig>(ctx->saved_data["op"].toStringRef(), "sigmoid_backward");
    return {bw.call(grads[0], s), at::Tensor()};
  }
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto args = pop_args(stack, 1);
    torch::jit::push(stack, apply(args[0].toTensor(), &op));
  }
};

// d sigmoid_backward(g, s) (double backward of sigmoid): d/dg = s (1 - s), d/ds = g (1 - 2 s).
struct SigmoidBackwardAutograd : torch::autograd::Function<SigmoidBackwardAutograd> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& g, const at::Tensor& s,
                            const c10::OperatorHandle* op) {
    ctx->save_for_backward({g, s});
    ctx->saved_data["op"] = op->schema().name();
    at::AutoDispatchBelowADInplaceOrView guard;
    return op->typed<BinarySig>().call(g, s);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &s = saved[1], &gg = grads[0];
    at::Tensor d_g, d_s;
    if (ctx->needs_input_grad(0)) {
      const auto bw = sibling_op<BinarySig>(ctx->saved_data["op"].toStringRef(), "sigmoid_backward");
      d_g = at::sum_to(bw.call(gg, s), g.sym_sizes());
    }
    if (ctx->needs_input_grad(1)) d_s = at::sum_to(gg * g * (1 - 2 * s), s.sym_sizes());
    return {d_g, d_s, at::Tensor()};
  }
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto args = pop_args(stack, 2);
    torch::jit::push(stack, apply(args[0].toTensor(), args[1].toTensor(), &op));
  }
};

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("sigmoid(Tensor x) -> Tensor");
  m.def("sigmoid_backward(Tensor grad, Tensor out) -> Tensor");
  m.impl("sigmoid", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(kk::sigmoid)));
  m.impl("sigmoid_backward", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(kk::sigmoid_backward)));
  kk::impl_autograd<kk::SigmoidAutograd>(m, "sigmoid");
  kk::impl_autograd<kk::SigmoidBackwardAutograd>(m, "sigmoid_backward");
#ifdef KERNELKIT_WITH_CUDA
  m.impl("sigmoid", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(kk::sigmoid)));
  m.impl("sigmoid_backward", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(kk::sigmoid_backward)));
#endif
}
#endif  // KERNELKIT_BINDING
