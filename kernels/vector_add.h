// vector_add: out = a + alpha * b (broadcasting like torch.add), float32/float64/float16/bfloat16.
#pragma once

#include <cstdint>

#include <kernelkit/dtype.cuh>

namespace kk {

// The math, shared by the CUDA kernel and the CPU loop; A is the accumulation type.
template <typename A> struct AddOp {
  A alpha;
  KK_HD A operator()(A a, A b) const { return a + alpha * b; }
};

// out[i] = a[i] + alpha * b[i] for i < n, on `stream`. `out` may alias a or b exactly.
template <typename T>
cudaError_t vector_add_cuda(const T* a, const T* b, T* out, double alpha, int64_t n, cudaStream_t stream);

}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

namespace kk {

inline void vector_add_compute(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha) {
  KK_DISPATCH_FLOATING(a.scalar_type(), "vector_add", [&] {
    using A = at::opmath_type<scalar_t>;
    if (out.is_cuda()) {
      KK_CUDA_LAUNCH(out.device(), vector_add_cuda(cuda_cptr<scalar_t>(a), cuda_cptr<scalar_t>(b),
                                                   cuda_ptr<scalar_t>(out), alpha, out.numel(),
                                                   at::cuda::getCurrentCUDAStream()));
    } else {
      cpu_elementwise<scalar_t>(out, AddOp<A>{static_cast<A>(alpha)}, a, b);
    }
  });
}

inline double vector_add_alpha(const at::Scalar& alpha) {
  TORCH_CHECK(!alpha.isComplex(), "vector_add: alpha must be a real number, got ", alpha);
  return alpha.toDouble();
}

inline at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  auto ops = binary_operands("vector_add", a, "a", b, "b");
  at::Tensor out = new_output(ops.shape, ops.a);
  vector_add_compute(out, ops.a, ops.b, vector_add_alpha(alpha));
  return out;
}

inline void vector_add_out(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha, const at::Tensor& out) {
  auto ops = binary_operands("vector_add", a, "a", b, "b");
  check_out("vector_add", out, ops.shape, ops.a);
  const double al = vector_add_alpha(alpha);
  write_into(out, {ops.a, ops.b}, [&](const at::Tensor& dst) { vector_add_compute(dst, ops.a, ops.b, al); });
}

// grad_a = g, grad_b = alpha * g, each summed over the dims its input was broadcast along.
struct AddAutograd : torch::autograd::Function<AddAutograd> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const at::Scalar& alpha, const c10::OperatorHandle* op) {
    ctx->saved_data["a_sizes"] = a.sym_sizes();
    ctx->saved_data["b_sizes"] = b.sym_sizes();
    ctx->saved_data["alpha"] = alpha;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op->typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Scalar&)>().call(a, b, alpha);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = at::sum_to(g, ctx->saved_data["a_sizes"].toSymIntVector());
    if (ctx->needs_input_grad(1)) {
      const at::Scalar alpha = ctx->saved_data["alpha"].toScalar();
      gb = at::sum_to(alpha.equal(1) ? g : g * alpha, ctx->saved_data["b_sizes"].toSymIntVector());
    }
    return {ga, gb, at::Tensor(), at::Tensor()};
  }
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto args = pop_args(stack, 3);
    torch::jit::push(stack, apply(args[0].toTensor(), args[1].toTensor(), args[2].toScalar(), &op));
  }
};

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("vector_add(Tensor a, Tensor b, Scalar alpha=1) -> Tensor");
  m.def("vector_add_out(Tensor a, Tensor b, Scalar alpha, Tensor(a!) out) -> ()");
  KK_IMPL_CPU_CUDA(m, "vector_add", kk::vector_add);
  KK_IMPL_CPU_CUDA(m, "vector_add_out", kk::vector_add_out);
  kk::impl_autograd<kk::AddAutograd>(m, "vector_add");
}
#endif  // KERNELKIT_BINDING
