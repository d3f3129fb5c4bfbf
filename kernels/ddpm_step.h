// ddpm_step: one DDPMScheduler.step (epsilon prediction, clip_sample, fixed_small variance) fused in one
// elementwise kernel, any shape.
//
//   x0     = clamp((x_t - sqrt(1 - ab_t) * eps) / sqrt(ab_t), -clip, clip)
//   x_prev = coef_x0[t] * x0 + coef_xt[t] * x_t + [t > 0] * std[t] * z
//
// Everything that depends only on t is a row of a small float32 table `coeffs` (T, 5) built once in Python
// (reference/ddpm_step.py: DDPMScheduler.coefficients()). The timestep is a 1-element int64 tensor read
// by the kernel from device memory, so a whole denoise loop can be captured in one CUDA graph. A timestep
// outside [0, T) gives NaN (a device kernel cannot raise). z is either a tensor argument or drawn in the
// kernel with graph-safe Philox: elements 4c..4c+3 use subsequence c (the numbers depend on the seed and
// offset only, not on the launch configuration), like kernels/sample_normal.
#pragma once

#include <cmath>
#include <cstdint>

#include <kernelkit/dtype.cuh>
#include <kernelkit/philox.cuh>

namespace kk {

// Columns of the coefficient table (same order as reference/ddpm_step.py).
enum DdpmCol : int { kDdpmSqrtOneMinusAlphaBar = 0, kDdpmSqrtAlphaBar, kDdpmCoefX0, kDdpmCoefXt, kDdpmStd, kDdpmCols };

// The per-element math, shared by the CUDA kernel and the CPU loop; A is the accumulation type. Same
// operation order as diffusers (so float32 results agree to rounding).
template <typename A> struct DdpmStepMath {
  A sqrt_one_minus_ab, sqrt_ab, coef_x0, coef_xt, std_dev, clip;
  bool add_noise;

  KK_HD static DdpmStepMath from_row(const float* row, bool valid, int64_t t, double clip) {
    const A nan = static_cast<A>(NAN);
    DdpmStepMath m;
    m.sqrt_one_minus_ab = valid ? static_cast<A>(row[kDdpmSqrtOneMinusAlphaBar]) : nan;
    m.sqrt_ab = valid ? static_cast<A>(row[kDdpmSqrtAlphaBar]) : nan;
    m.coef_x0 = valid ? static_cast<A>(row[kDdpmCoefX0]) : nan;
    m.coef_xt = valid ? static_cast<A>(row[kDdpmCoefXt]) : nan;
    m.std_dev = valid ? static_cast<A>(row[kDdpmStd]) : nan;
    m.clip = static_cast<A>(clip);
    m.add_noise = valid && t > 0;
    return m;
  }
  KK_HD A operator()(A eps, A x, A z) const {
    A x0 = (x - sqrt_one_minus_ab * eps) / sqrt_ab;
    x0 = x0 < -clip ? -clip : (x0 > clip ? clip : x0);  // NaN stays NaN, like torch.clamp
    A prev = coef_x0 * x0 + coef_xt * x;
    if (add_noise) prev = prev + std_dev * z;
    return prev;
  }
};

// The step as an elementwise functor of (eps, x, z) for common/elementwise.cuh: prepare() reads the
// timestep and its coefficient row on the device, once per tile, after the tile's loads are issued. Both
// reads take the read-only path (ld.global.nc): the two dependent reads are on every tile's critical
// path, where that path measured faster (docs/performance.md, "ddpm_step").
template <typename A> struct DdpmStepOp {
  const int64_t* timestep;
  const float* coeffs;
  int64_t num_t;
  double clip;
#ifdef __CUDACC__
  __device__ DdpmStepMath<A> prepare() const {
    const int64_t t = __ldg(timestep);
    const bool valid = t >= 0 && t < num_t;
    const float* row = coeffs + (valid ? t : 0) * kDdpmCols;
    float r[kDdpmCols];
#pragma unroll
    for (int k = 0; k < kDdpmCols; ++k) r[k] = __ldg(row + k);
    return DdpmStepMath<A>::from_row(r, valid, t, clip);
  }
#endif
};

// out[i] = step(eps[i], x[i], z[i]) for i < n; z = noise[i] when noise != nullptr, else Philox normals
// from `rng` (4 draws per subsequence for float/half/bfloat16, 8 for double). timestep: 1 device int64;
// coeffs: (num_t, kDdpmCols) float32 row-major. out may alias x or eps exactly.
template <typename T>
cudaError_t ddpm_step_cuda(const T* eps, const int64_t* timestep, const T* x, const float* coeffs, int64_t num_t,
                           const T* noise, PhiloxArgs rng, double clip, T* out, int64_t n, cudaStream_t stream);

}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

namespace kk {

constexpr const char* kDdpmOp = "ddpm_step";

// Checks shared by both ops; returns contiguous eps / sample.
inline std::pair<at::Tensor, at::Tensor> ddpm_check(const at::Tensor& model_output, const at::Tensor& timestep,
                                                    const at::Tensor& sample, const at::Tensor& coeffs) {
  const char* op = kDdpmOp;
  check_floating(op, sample, "sample");
  check_floating(op, model_output, "model_output");
  check_same_device_dtype(op, sample, "sample", model_output, "model_output");
  TORCH_CHECK(model_output.sizes() == sample.sizes(), op, ": model_output must have the shape of sample ",
              sample.sizes(), ", got ", model_output.sizes());
  TORCH_CHECK(timestep.defined() && timestep.scalar_type() == at::kLong, op,
              ": timestep must be an int64 tensor, got ", timestep.defined() ? toString(timestep.scalar_type()) : "undefined");
  TORCH_CHECK(timestep.numel() == 1, op, ": timestep must hold exactly one element (the current train timestep), got shape ",
              timestep.sizes());
  TORCH_CHECK(timestep.device() == sample.device(), op, ": timestep must be on the device of sample (", sample.device(),
              "), got ", timestep.device(), " (it is read from device memory so the loop can be captured in a CUDA graph)");
  TORCH_CHECK(coeffs.defined() && coeffs.scalar_type() == at::kFloat && coeffs.dim() == 2 && coeffs.size(1) == kDdpmCols,
              op, ": coeffs must be a float32 (T, ", static_cast<int>(kDdpmCols),
              ") table from DDPMScheduler.coefficients(), got ", coeffs.defined() ? toString(coeffs.scalar_type()) : "undefined",
              " of shape ", coeffs.defined() ? coeffs.sizes() : at::IntArrayRef{});
  TORCH_CHECK(coeffs.device() == sample.device(), op, ": coeffs must be on the device of sample (", sample.device(),
              "), got ", coeffs.device());
  return {model_output.contiguous(), sample.contiguous()};
}

template <typename scalar_t>
void ddpm_step_cpu(const at::Tensor& out, const at::Tensor& eps, const at::Tensor& timestep, const at::Tensor& x,
                   const at::Tensor& coeffs, const at::Tensor& z, double clip) {
  using A = at::opmath_type<scalar_t>;
  const int64_t t = timestep.reshape({}).item<int64_t>();
  const bool valid = t >= 0 && t < coeffs.size(0);
  const at::Tensor c = coeffs.contiguous();
  const auto m = DdpmStepMath<A>::from_row(c.const_data_ptr<float>() + (valid ? t : 0) * kDdpmCols, valid, t, clip);
  cpu_elementwise<scalar_t>(out, m, eps, x, z);
}

inline at::Tensor ddpm_step_impl(const at::Tensor& model_output, const at::Tensor& timestep, const at::Tensor& sample,
                                 const at::Tensor& coeffs, const std::optional<at::Tensor>& noise, double clip,
                                 const std::optional<at::Generator>& generator) {
  TORCH_CHECK(clip >= 0, kDdpmOp, ": clip_sample_range must be >= 0 (x0 is clamped to [-r, r]; inf turns clipping off), got ",
              clip);  // NaN fails too
  const auto checked = ddpm_check(model_output, timestep, sample, coeffs);  // (no structured binding: lambdas use them)
  const at::Tensor& eps = checked.first;
  const at::Tensor& x = checked.second;
  at::Tensor z;
  if (noise.has_value()) {
    check_floating(kDdpmOp, *noise, "noise");
    check_same_device_dtype(kDdpmOp, sample, "sample", *noise, "noise");
    TORCH_CHECK(noise->sizes() == sample.sizes(), kDdpmOp, ": noise must have the shape of sample ", sample.sizes(),
                ", got ", noise->sizes());
    z = noise->contiguous();
  }
  at::Tensor out = new_output(x.sizes(), x);
  if (out.numel() == 0) return out;
  if (!out.is_cuda()) {
    if (!z.defined()) z = at::randn(x.sizes(), generator, x.options());
    KK_DISPATCH_FLOATING(x.scalar_type(), "ddpm_step", [&] { ddpm_step_cpu<scalar_t>(out, eps, timestep, x, coeffs, z, clip); });
    return out;
  }
#ifdef KERNELKIT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(out.device());
  const at::Tensor c = coeffs.contiguous();
  KK_DISPATCH_FLOATING(x.scalar_type(), "ddpm_step", [&] {
    PhiloxArgs rng;
    if (!z.defined()) rng = philox_args(generator, normal4_draws<at::opmath_type<scalar_t>>());
    KERNELKIT_CUDA_CHECK(ddpm_step_cuda(cuda_cptr<scalar_t>(eps), timestep.const_data_ptr<int64_t>(), cuda_cptr<scalar_t>(x),
                                        c.const_data_ptr<float>(), c.size(0),
                                        z.defined() ? cuda_cptr<scalar_t>(z) : nullptr, rng, clip, cuda_ptr<scalar_t>(out),
                                        out.numel(), at::cuda::getCurrentCUDAStream()));
  });
#else
  TORCH_CHECK(false, "ddpm_step: built without CUDA");
#endif
  return out;
}

inline at::Tensor ddpm_step(const at::Tensor& model_output, const at::Tensor& timestep, const at::Tensor& sample,
                            const at::Tensor& coeffs, const at::Tensor& noise, double clip_sample_range) {
  return ddpm_step_impl(model_output, timestep, sample, coeffs, noise, clip_sample_range, std::nullopt);
}

inline at::Tensor ddpm_step_philox(const at::Tensor& model_output, const at::Tensor& timestep, const at::Tensor& sample,
                                   const at::Tensor& coeffs, double clip_sample_range,
                                   std::optional<at::Generator> generator) {
  if (generator.has_value() && generator->defined()) {
    TORCH_CHECK(generator->device().type() == sample.device().type(), kDdpmOp, ": generator must be a ",
                sample.device().type(), " generator for tensors on ", sample.device(), ", got one on ", generator->device());
  }
  return ddpm_step_impl(model_output, timestep, sample, coeffs, std::nullopt, clip_sample_range, generator);
}

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("ddpm_step(Tensor model_output, Tensor timestep, Tensor sample, Tensor coeffs, Tensor noise, "
        "float clip_sample_range=1.0) -> Tensor");
  m.def("ddpm_step_philox(Tensor model_output, Tensor timestep, Tensor sample, Tensor coeffs, "
        "float clip_sample_range=1.0, *, Generator? generator=None) -> Tensor",
        {at::Tag::nondeterministic_seeded});
  KK_IMPL_CPU_CUDA(m, "ddpm_step", kk::ddpm_step);
  KK_IMPL_CPU_CUDA(m, "ddpm_step_philox", kk::ddpm_step_philox);
  kk::impl_autograd<kk::NoGrad>(m, "ddpm_step");
  kk::impl_autograd<kk::NoGrad>(m, "ddpm_step_philox");
}
#endif  // KERNELKIT_BINDING
