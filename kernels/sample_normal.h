// sample_normal: X[i, j] = mu[i] + sigma[i] * z[i, j], z iid N(0, 1), output (d, n) — the CEM sampler.
//
// CUDA: z is drawn inside the kernel with Philox4x32-10 (common/philox.cuh), graph-safe: the binding
// reserves draws with gen->philox_cuda_state() under the generator's mutex, so the same seed gives the
// same samples and every replay of a captured CUDA graph gives fresh ones. Each group of 4 consecutive
// elements of a row (i, 4c..4c+3) is Philox subsequence i * ceil(n/4) + c: the samples depend only on
// (seed, offset, d, n), not on the launch configuration. No limit on d or n.
// CPU: at::randn with the CPU generator (different stream of numbers from CUDA, same distribution).
#pragma once

#include <cstdint>

#include <kernelkit/dtype.cuh>
#include <kernelkit/philox.cuh>

namespace kk {

// out (d, n) row-major contiguous; mu, sigma (d,) contiguous.
template <typename T>
cudaError_t sample_normal_cuda(const T* mu, const T* sigma, T* out, int64_t d, int64_t n, PhiloxArgs rng,
                               cudaStream_t stream);

}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

namespace kk {

// Checks mu/sigma and returns d.
inline int64_t sample_normal_check(const at::Tensor& mu, const at::Tensor& sigma,
                                   const std::optional<at::Generator>& generator) {
  check_floating("sample_normal", mu, "mu");
  check_floating("sample_normal", sigma, "sigma");
  check_same_device_dtype("sample_normal", mu, "mu", sigma, "sigma");
  TORCH_CHECK(mu.dim() == 1, "sample_normal: mu must be 1-D (d,), got shape ", mu.sizes());
  TORCH_CHECK(sigma.sizes() == mu.sizes(), "sample_normal: sigma must have the shape of mu ", mu.sizes(), ", got ",
              sigma.sizes());
  if (generator.has_value() && generator->defined()) {
    TORCH_CHECK(generator->device().type() == mu.device().type(), "sample_normal: generator must be a ",
                mu.device().type(), " generator for tensors on ", mu.device(), ", got one on ", generator->device());
  }
  return mu.size(0);
}

// Fill the contiguous (d, n) tensor `out`.
inline void sample_normal_fill(const at::Tensor& out, const at::Tensor& mu, const at::Tensor& sigma,
                               const std::optional<at::Generator>& generator) {
  const int64_t d = out.size(0), n = out.size(1);
  if (out.numel() == 0) return;
  const at::Tensor m = mu.contiguous(), s = sigma.contiguous();
  if (!out.is_cuda()) {
    at::Tensor z = at::randn({d, n}, generator, out.options());
    at::addcmul_out(const_cast<at::Tensor&>(out), m.unsqueeze(1), s.unsqueeze(1), z);
    return;
  }
#ifdef KERNELKIT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(out.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "sample_normal", [&] {
    const PhiloxArgs rng = philox_args(generator, normal4_draws<at::opmath_type<scalar_t>>());
    KERNELKIT_CUDA_CHECK(sample_normal_cuda(cuda_cptr<scalar_t>(m), cuda_cptr<scalar_t>(s), cuda_ptr<scalar_t>(out), d,
                                            n, rng, at::cuda::getCurrentCUDAStream()));
  });
#else
  TORCH_CHECK(false, "sample_normal: built without CUDA");
#endif
}

inline at::Tensor sample_normal(const at::Tensor& mu, const at::Tensor& sigma, int64_t n,
                                std::optional<at::Generator> generator) {
  const int64_t d = sample_normal_check(mu, sigma, generator);
  TORCH_CHECK(n >= 0, "sample_normal: n must be >= 0, got ", n);
  at::Tensor out = new_output({d, n}, mu);
  sample_normal_fill(out, mu, sigma, generator);
  return out;
}

inline void sample_normal_out(const at::Tensor& mu, const at::Tensor& sigma, const at::Tensor& out,
                              std::optional<at::Generator> generator) {
  const int64_t d = sample_normal_check(mu, sigma, generator);
  TORCH_CHECK(out.defined() && out.dim() == 2, "sample_normal: out must be a 2-D (d, n) tensor, got shape ",
              out.defined() ? out.sizes() : at::IntArrayRef{});
  check_out("sample_normal", out, {d, out.size(1)}, mu);
  write_into(out, {mu, sigma}, [&](const at::Tensor& dst) { sample_normal_fill(dst, mu, sigma, generator); });
}

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("sample_normal(Tensor mu, Tensor sigma, int n, *, Generator? generator=None) -> Tensor",
        {at::Tag::nondeterministic_seeded});
  m.def("sample_normal_out(Tensor mu, Tensor sigma, Tensor(a!) out, *, Generator? generator=None) -> ()",
        {at::Tag::nondeterministic_seeded});
  KK_IMPL_CPU_CUDA(m, "sample_normal", kk::sample_normal);
  KK_IMPL_CPU_CUDA(m, "sample_normal_out", kk::sample_normal_out);
  kk::impl_autograd<kk::NoGrad>(m, "sample_normal");
  kk::impl_autograd<kk::NoGrad>(m, "sample_normal_out");
}
#endif  // KERNELKIT_BINDING
