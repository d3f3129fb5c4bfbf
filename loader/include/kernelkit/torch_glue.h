// Torch-side helpers shared by card bindings (included only inside `#ifdef KERNELKIT_BINDING`, after
// <kernelkit/binding.h>): argument checks with messages naming the argument, broadcasting, out= checks,
// the CPU elementwise loop, dtype mapping to CUDA types and the graph-safe Philox state.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#ifdef KERNELKIT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "elementwise.h"
#include "philox.cuh"
#endif

// float32/float64/float16/bfloat16: the dtypes every elementwise card supports.
#define KK_DISPATCH_FLOATING(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

namespace kk {

inline bool is_supported_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// `op: name must be a float32/float64/float16/bfloat16 tensor, got Int`.
inline void check_floating(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  TORCH_CHECK(is_supported_floating(t.scalar_type()), op, ": ", name,
              " must be a float32, float64, float16 or bfloat16 tensor, got ", t.scalar_type());
}

// Same device and same dtype as the first tensor (no implicit promotion or transfers).
inline void check_same_device_dtype(const char* op, const at::Tensor& a, const char* an, const at::Tensor& b,
                                    const char* bn) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", an, " and ", bn,
              " must be on the same device, got ", an, " on ", a.device(), " and ", bn, " on ", b.device());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", an, " and ", bn,
              " must have the same dtype, got ", an, " ", a.scalar_type(), " and ", bn, " ", b.scalar_type());
}

inline std::vector<int64_t> broadcast_shape(const char* op, const at::Tensor& a, const char* an,
                                            const at::Tensor& b, const char* bn) {
  try {
    return at::infer_size(a.sizes(), b.sizes());
  } catch (const c10::Error&) {
    TORCH_CHECK(false, op, ": shapes of ", an, " ", a.sizes(), " and ", bn, " ", b.sizes(),
                " cannot be broadcast together");
  }
  return {};
}

// A contiguous tensor of `shape` holding t broadcast to it (no copy when t already is one).
inline at::Tensor expand_contiguous(const at::Tensor& t, at::IntArrayRef shape) {
  if (t.sizes() == shape) return t.contiguous();
  return t.expand(shape).contiguous();
}

// A new contiguous result tensor of `sizes` with the dtype and device of `like`, straight from the
// device's caching allocator as ATen's own kernels allocate (at::empty would be one more trip through
// the dispatcher on every call).
inline at::Tensor new_output(at::IntArrayRef sizes, const at::Tensor& like) {
#ifdef KERNELKIT_WITH_CUDA
  if (like.is_cuda()) return at::Tensor(at::detail::empty_cuda(sizes, like.options()));
#endif
  if (like.is_cpu()) return at::Tensor(at::detail::empty_cpu(sizes, like.options()));
  return at::empty(sizes, like.options());
}

// out= must match exactly: shape, dtype, device; it must not partially overlap an input.
inline void check_out(const char* op, const at::Tensor& out, at::IntArrayRef shape, const at::Tensor& like) {
  TORCH_CHECK(out.defined(), op, ": out is an undefined tensor");
  TORCH_CHECK(out.device() == like.device(), op, ": out must be on ", like.device(), ", got ", out.device());
  TORCH_CHECK(out.scalar_type() == like.scalar_type(), op, ": out must have dtype ", like.scalar_type(),
              ", got ", out.scalar_type());
  TORCH_CHECK(out.sizes() == shape, op, ": out must have shape ", shape, ", got ", out.sizes());
}

// Run `compute(dst)` on a contiguous destination and land the result in `out` (copying through a
// temporary when out is not contiguous, or when it overlaps an input other than exactly).
template <typename F>
void write_into(const at::Tensor& out, std::initializer_list<at::Tensor> inputs, F&& compute) {
  bool direct = out.is_contiguous();
  for (const auto& in : inputs) {
    if (!direct) break;
    const auto o = at::get_overlap_status(out, in);
    direct = o == at::MemOverlapStatus::No || o == at::MemOverlapStatus::Full;
  }
  if (direct) {
    compute(out);
  } else {
    at::Tensor tmp = at::empty(out.sizes(), out.options().memory_format(at::MemoryFormat::Contiguous));
    compute(tmp);
    out.copy_(tmp);
  }
}

// One strided run of cpu_elementwise: out and inputs advance by their own byte strides (0: a broadcast operand).
template <typename scalar_t, typename opmath, typename F, size_t... I>
void strided_run(const F& f, char** data, const int64_t* strides, int64_t n, std::index_sequence<I...>) {
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<scalar_t*>(data[0] + i * strides[0]) = static_cast<scalar_t>(
        f(static_cast<opmath>(*reinterpret_cast<const scalar_t*>(data[I + 1] + i * strides[I + 1]))...));
  }
}

// CPU elementwise loop: out[i] = f(in[i]...) in at::opmath_type (float for half/bfloat16), parallelised.
// Inputs may be strided or broadcast views of out's shape: at::TensorIterator walks them without copying.
template <typename scalar_t, typename F, typename... Ts>
void cpu_elementwise(const at::Tensor& out, F f, const Ts&... ins) {
  using opmath = at::opmath_type<scalar_t>;
  if (out.is_contiguous() && (... && (ins.is_contiguous() && ins.sizes() == out.sizes()))) {
    scalar_t* o = out.data_ptr<scalar_t>();
    auto ptrs = std::make_tuple(ins.template const_data_ptr<scalar_t>()...);
    at::parallel_for(0, out.numel(), 32768, [&](int64_t begin, int64_t end) {
      std::apply(
          [&](auto... p) {
            for (int64_t i = begin; i < end; ++i) o[i] = static_cast<scalar_t>(f(static_cast<opmath>(p[i])...));
          },
          ptrs);
    });
    return;
  }
  at::TensorIteratorConfig config;
  config.add_output(out).resize_outputs(false);
  (config.add_const_input(ins), ...);
  at::TensorIterator iter = config.build();
  iter.for_each([&](char** data, const int64_t* strides, int64_t n) {
    strided_run<scalar_t, opmath>(f, data, strides, n, std::index_sequence_for<Ts...>{});
  }, 32768);
}

#ifdef KERNELKIT_WITH_CUDA
// at scalar type -> the CUDA type device code is instantiated for.
template <typename T> struct cuda_type { using type = T; };
template <> struct cuda_type<c10::Half> { using type = __half; };
template <> struct cuda_type<c10::BFloat16> { using type = __nv_bfloat16; };

template <typename T> typename cuda_type<T>::type* cuda_ptr(const at::Tensor& t) {
  return reinterpret_cast<typename cuda_type<T>::type*>(t.data_ptr<T>());
}
template <typename T> const typename cuda_type<T>::type* cuda_cptr(const at::Tensor& t) {
  return reinterpret_cast<const typename cuda_type<T>::type*>(t.const_data_ptr<T>());
}

// The CPU loop of elementwise Op through kk::cpu_run, compiled by the card's launcher line (KK_*_LAUNCHER in
// its .cu, or KK_*_CPU_LOOP in its CPU file): the binding needs Op's name only. Same walk as cpu_elementwise: contiguous chunks in parallel, else
// at::TensorIterator's runs over strided and broadcast views.
template <template <typename> class Op, typename scalar_t, typename... Ts>
void cpu_elementwise_run(const at::Tensor& out, const Ts&... ins) {
  using T = typename cuda_type<scalar_t>::type;
  constexpr int kIn = static_cast<int>(sizeof...(Ts));
  constexpr int64_t kSize = static_cast<int64_t>(sizeof(T));
  if (out.is_contiguous() && (... && (ins.is_contiguous() && ins.sizes() == out.sizes()))) {
    char* const base[kIn + 1] = {static_cast<char*>(out.data_ptr()),
                                 const_cast<char*>(static_cast<const char*>(ins.const_data_ptr()))...};
    at::parallel_for(0, out.numel(), 32768, [&](int64_t begin, int64_t end) {
      char* data[kIn + 1];
      int64_t strides[kIn + 1];
      for (int k = 0; k <= kIn; ++k) {
        data[k] = base[k] + begin * kSize;
        strides[k] = kSize;
      }
      cpu_run<Op, T, kIn>(data, strides, end - begin);
    });
    return;
  }
  at::TensorIteratorConfig config;
  config.add_output(out).resize_outputs(false);
  (config.add_const_input(ins), ...);
  at::TensorIterator iter = config.build();
  iter.for_each([](char** data, const int64_t* strides, int64_t n) { cpu_run<Op, T, kIn>(data, strides, n); },
                32768);
}

inline void check_cuda(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got one on ", t.device(),
              " (all tensor arguments must be on the same device)");
}

// Reserve `increment` Philox draws per subsequence from `gen` (or the default CUDA generator of the
// current device), graph-safe: under capture the state holds device pointers read at replay.
inline PhiloxArgs philox_args(const std::optional<at::Generator>& gen, uint64_t increment) {
  auto* g = at::get_generator_or_default<at::CUDAGeneratorImpl>(gen, at::cuda::detail::getDefaultCUDAGenerator());
  at::PhiloxCudaState st;
  {
    std::lock_guard<std::mutex> lock(g->mutex_);
    st = g->philox_cuda_state(increment);
  }
  PhiloxArgs a;
  a.captured = st.captured_;
  if (st.captured_) {
    a.seed_ptr = st.seed_.ptr;
    a.offset_ptr = st.offset_.ptr;
    a.offset_intragraph = st.offset_intragraph_;
  } else {
    a.seed = st.seed_.val;
    a.offset = st.offset_.val;
  }
  return a;
}
#endif

}  // namespace kk

namespace kk {

// Checked operands of a binary elementwise op named `op` with arguments an/bn, broadcast to one shape:
// contiguous copies on CUDA (its kernels take flat pointers), broadcast views on the CPU.
struct BinaryOperands {
  std::vector<int64_t> shape;
  at::Tensor a, b;
};
inline BinaryOperands binary_operands(const char* op, const at::Tensor& a, const char* an, const at::Tensor& b,
                                      const char* bn) {
  check_floating(op, a, an);
  check_floating(op, b, bn);
  check_same_device_dtype(op, a, an, b, bn);
  auto shape = broadcast_shape(op, a, an, b, bn);
  if (a.device().is_cpu()) return {shape, a.expand(shape), b.expand(shape)};  // the CPU loop reads views, no copies
  return {shape, expand_contiguous(a, shape), expand_contiguous(b, shape)};
}

}  // namespace kk

namespace kk {

// ---- autograd in C++ ------------------------------------------------------------------------------
// A Python autograd kernel (torch.library.register_autograd) costs ~8 us on every call, even when no
// gradient is needed; these C++ helpers keep the inference path at dispatcher speed.
//
// autograd_kernel<Fn> is a boxed kernel for the Autograd key: when grad mode is off or no tensor argument
// requires grad it redispatches straight below autograd (no node, no Python); otherwise it runs
// Fn::apply_boxed(op, stack), where Fn is a torch::autograd::Function whose forward redispatches through
// `op` (so FakeTensor / functionalization keys below autograd still see the call).
template <typename Fn>
void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  bool needs_grad = false;
  if (at::GradMode::is_enabled()) {
    for (size_t i = stack->size() - n; i < stack->size() && !needs_grad; ++i) {
      const c10::IValue& v = (*stack)[i];
      needs_grad = v.isTensor() && v.toTensor().requires_grad();
    }
  }
  if (!needs_grad) {
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
    return;
  }
  Fn::apply_boxed(op, stack);
}

// Register autograd_kernel<Fn> for `name` (call inside KERNELKIT_LIBRARY).
template <typename Fn> void impl_autograd(torch::Library& m, const char* name) {
  m.impl(name, torch::dispatch(c10::DispatchKey::Autograd,
                               torch::CppFunction::makeFromBoxedFunction<&autograd_kernel<Fn>>()));
}

// The op `name` in the namespace of `op` (e.g. a card's backward op), typed with signature Sig.
template <typename Sig>
c10::TypedOperatorHandle<Sig> sibling_op(const std::string& qualname_of_op, const char* name) {
  const std::string ns = qualname_of_op.substr(0, qualname_of_op.find("::"));
  return c10::Dispatcher::singleton().findSchemaOrThrow((ns + "::" + name).c_str(), "").typed<Sig>();
}

using BinarySig = at::Tensor(const at::Tensor&, const at::Tensor&);
using UnarySig = at::Tensor(const at::Tensor&);

// Pop the last n arguments of a boxed call (in order).
inline std::vector<c10::IValue> pop_args(torch::jit::Stack* stack, size_t n) {
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - n), std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - n, stack->end());
  return args;
}

}  // namespace kk

// Launch a card's CUDA launcher under a device guard for `device` and check its cudaError_t. The
// launcher expression should take at::cuda::getCurrentCUDAStream() (evaluated under the guard).
#ifdef KERNELKIT_WITH_CUDA
#define KK_CUDA_LAUNCH(device, expr)                    \
  do {                                                  \
    const c10::cuda::CUDAGuard kk_device_guard_(device); \
    KERNELKIT_CUDA_CHECK(expr);                         \
  } while (0)
#else
#define KK_CUDA_LAUNCH(device, expr) TORCH_CHECK(false, "kernelkit: this card was built without CUDA")
#endif

namespace kk {

// The binary elementwise op on checked, broadcast operands: `launch(a, b, out, n, stream)` (typed device
// pointers) on CUDA, `cpu(out, a, b)` with scalar_t's tag otherwise.
template <typename Launch, typename Cpu>
at::Tensor binary_elementwise_with(const char* op, const at::Tensor& a, const char* an, const at::Tensor& b,
                                   const char* bn, Launch&& launch, Cpu&& cpu) {
  auto ops = binary_operands(op, a, an, b, bn);
  at::Tensor out = new_output(ops.shape, ops.a);
  KK_DISPATCH_FLOATING(out.scalar_type(), "kk::binary_elementwise", [&] {
    if (out.is_cuda()) {
      KK_CUDA_LAUNCH(out.device(), launch(cuda_cptr<scalar_t>(ops.a), cuda_cptr<scalar_t>(ops.b),
                                          cuda_ptr<scalar_t>(out), out.numel(), at::cuda::getCurrentCUDAStream()));
    } else {
      cpu(out, ops.a, ops.b, scalar_t{});
    }
  });
  return out;
}

// out = Op(a, b) elementwise with torch's broadcasting, for every binary elementwise card: checked and
// broadcast operands, then `launch(a, b, out, n, stream)` (typed device pointers) on CUDA, or the CPU
// loop with Op<opmath type> otherwise (so Op must be defined here, not only declared). `op`, `an`, `bn`
// name the op and its arguments in errors.
template <template <typename> class Op, typename Launch>
at::Tensor binary_elementwise(const char* op, const at::Tensor& a, const char* an, const at::Tensor& b,
                              const char* bn, Launch&& launch) {
  return binary_elementwise_with(op, a, an, b, bn, std::forward<Launch>(launch), [](auto& out, auto& x, auto& y, auto tag) {
    using scalar_t = decltype(tag);
    cpu_elementwise<scalar_t>(out, Op<at::opmath_type<scalar_t>>{}, x, y);
  });
}

}  // namespace kk

namespace kk {

// out = Op(a, b) as binary_elementwise above, through binary_launch<Op> and cpu_run<Op> (KK_BINARY_LAUNCHER(Op)
// in the card's .cu compiles both, or KK_BINARY_CUDA_LAUNCHER and KK_BINARY_CPU_LOOP apart: the binding needs
// Op's declaration only).
template <template <typename> class Op>
at::Tensor binary_elementwise(const char* op, const at::Tensor& a, const char* an, const at::Tensor& b,
                              const char* bn) {
#ifdef KERNELKIT_WITH_CUDA
  return binary_elementwise_with(
      op, a, an, b, bn, [](auto... args) { return binary_launch<Op>(args...); },
      [](auto& out, auto& x, auto& y, auto tag) { cpu_elementwise_run<Op, decltype(tag)>(out, x, y); });
#else
  return binary_elementwise<Op>(op, a, an, b, bn, [](auto...) { return 0; });
#endif
}

// out = Op(x) elementwise for every unary elementwise card: x checked (float32/64/16, bfloat16) and made
// contiguous, then unary_launch<Op> on CUDA, or cpu_run<Op> on the CPU (KK_UNARY_LAUNCHER(Op) in the card's
// .cu compiles both, or KK_UNARY_CUDA_LAUNCHER and KK_UNARY_CPU_LOOP apart: the binding needs Op's declaration
// only). `op` and `xn` name the op and its argument in
// errors.
template <template <typename> class Op>
at::Tensor unary_elementwise(const char* op, const at::Tensor& x, const char* xn) {
  check_floating(op, x, xn);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = new_output(xc.sizes(), xc);
  KK_DISPATCH_FLOATING(out.scalar_type(), "kk::unary_elementwise", [&] {
    if (out.is_cuda()) {
      KK_CUDA_LAUNCH(out.device(), unary_launch<Op>(cuda_cptr<scalar_t>(xc), cuda_ptr<scalar_t>(out), out.numel(),
                                                    at::cuda::getCurrentCUDAStream()));
    } else {
#ifdef KERNELKIT_WITH_CUDA
      cpu_elementwise_run<Op, scalar_t>(out, xc);
#else
      cpu_elementwise<scalar_t>(out, Op<at::opmath_type<scalar_t>>{}, xc);
#endif
    }
  });
  return out;
}

// ---- autograd for the common shapes --------------------------------------------------------------

// Autograd kernel of an op without a backward: a call where a tensor argument requires grad (with grad mode
// on) is refused at once, naming the arguments, instead of returning an output whose gradient is silently
// missing. Register with kk::impl_autograd<kk::NoGrad>(m, "op").
struct NoGrad {
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const auto& args = op.schema().arguments();
    std::string names;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = (*stack)[stack->size() - args.size() + i];
      if (v.isTensor() && v.toTensor().requires_grad()) names += (names.empty() ? "" : ", ") + args[i].name();
    }
    const std::string& name = op.schema().name();
    TORCH_CHECK(false, name.substr(name.find("::") + 2), ": not differentiable, but ", names,
                " requires grad: pass .detach() of it, or call it under torch.no_grad()");
  }
};

// What a unary op's backward needs: its input x, or its output f(x) (cheaper for sigmoid, tanh, exp).
enum class Saved { Input, Output };

// Autograd of a unary op `f(Tensor x) -> Tensor` whose gradient is its sibling op
// `f_backward(Tensor grad, Tensor saved) -> Tensor` (same namespace), `saved` being x or f(x) per S.
// Register with kk::impl_autograd<kk::UnaryAutograd<kk::Saved::Output>>(m, "f"). Double backward goes
// through f_backward's own autograd kernel (see LinearBackwardAutograd).
template <Saved S> struct UnaryAutograd : torch::autograd::Function<UnaryAutograd<S>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const c10::OperatorHandle* op) {
    ctx->saved_data["op"] = op->schema().name();
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = op->typed<UnarySig>().call(x);
    }
    ctx->save_for_backward({S == Saved::Output ? out : x});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::string backward_op = ctx->saved_data["op"].toStringRef() + "_backward";
    const auto bw = c10::Dispatcher::singleton().findSchemaOrThrow(backward_op.c_str(), "").typed<BinarySig>();
    return {bw.call(grads[0], ctx->get_saved_variables()[0]), at::Tensor()};
  }
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto args = pop_args(stack, 1);
    torch::jit::push(stack, UnaryAutograd<S>::apply(args[0].toTensor(), &op));
  }
};

// Autograd of a backward op `f_backward(Tensor grad, Tensor saved) -> Tensor` that is linear in grad
// (grad times a function of saved), so f has a double backward: d/dgrad = f_backward(gg, saved) (the op
// itself), d/dsaved = DSaved{}(grad, saved, gg) written with ATen ops; each summed to its input's shape.
template <typename DSaved> struct LinearBackwardAutograd : torch::autograd::Function<LinearBackwardAutograd<DSaved>> {
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
      const std::string name = ctx->saved_data["op"].toStringRef();
      const auto self = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<BinarySig>();
      d_g = at::sum_to(self.call(gg, s), g.sym_sizes());
    }
    if (ctx->needs_input_grad(1)) d_s = at::sum_to(DSaved{}(g, s, gg), s.sym_sizes());
    return {d_g, d_s, at::Tensor()};
  }
  static void apply_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto args = pop_args(stack, 2);
    torch::jit::push(stack, LinearBackwardAutograd<DSaved>::apply(args[0].toTensor(), args[1].toTensor(), &op));
  }
};

}  // namespace kk

// Register `fn` as the CPU and (in a build with CUDA) the CUDA kernel of op `name`, inside KERNELKIT_LIBRARY:
// one function serves both when it branches on the device, as unary_elementwise/binary_elementwise do.
#ifdef KERNELKIT_WITH_CUDA
#define KK_IMPL_CPU_CUDA(m, name, fn)                                         \
  do {                                                                        \
    (m).impl(name, torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(fn)));     \
    (m).impl(name, torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(fn)));    \
  } while (0)
#else
#define KK_IMPL_CPU_CUDA(m, name, fn) (m).impl(name, torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(fn)))
#endif
