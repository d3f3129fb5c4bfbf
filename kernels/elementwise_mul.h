// elementwise_mul: out = a * b (broadcasting like torch.mul), float32/float64/float16/bfloat16.
// Autograd in C++ (grad_a = g * b, grad_b = g * a, each summed over its broadcast dims, only the
// needed ones) reuses this op for the products, so double backward works too.
#pragma once

#include <kernelkit/elementwise.h>

namespace kk {
template <typename A> struct MulOp;  // a * b, in elementwise_mul.cu
}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

namespace kk {

inline at::Tensor elementwise_mul(const at::Tensor& a, const at::Tensor& b) {
  return binary_elementwise<MulOp>("elementwise_mul", a, "a", b, "b");
}

struct MulAutograd : torch::autograd::Function<MulAutograd> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const c10::OperatorHandle* op) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["op"] = op->schema().name();
    at::AutoDispatchBelowADInplaceOrView guard;
    return op->typed<BinarySig>().call(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &g = grads[0];
    const auto mul = sibling_op<BinarySig>(ctx->saved_data["op"].toStringRef(), "elementwise_mul");
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = at::sum_to(mul.call(g, b), a.sym_sizes());
    if (ctx->needs_input_grad(1)) gb = at::sum_to(mul.call(g, a), b.sym_sizes());
    return {ga, gb, at::Tensor()};
  }
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto args = pop_args(stack, 2);
    torch::jit::push(stack, apply(args[0].toTensor(), args[1].toTensor(), &op));
  }
};

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("elementwise_mul(Tensor a, Tensor b) -> Tensor");
  KK_IMPL_CPU_CUDA(m, "elementwise_mul", kk::elementwise_mul);
  kk::impl_autograd<kk::MulAutograd>(m, "elementwise_mul");
}
#endif  // KERNELKIT_BINDING
