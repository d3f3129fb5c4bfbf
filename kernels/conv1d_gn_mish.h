// conv1d_gn_mish: Diffusion Policy's Conv1dBlock fused,
//
//   y = mish(group_norm(conv1d(x, W, b, padding=K//2), groups, gamma, beta, eps))
//
// with an optional fused epilogue for the conditional residual block around it:
//   y = y * scale[:, :, None] + shift[:, :, None]      (FiLM; scale/shift (B, Cout), any strides)
//   y = y + residual                                    (residual (B, Cout, L))
//
// x (B, Cin, L), W (Cout, Cin, K) with K odd, Cout divisible by groups; float32 on CUDA.
//
// CUDA, two kernels per call (no memset, no atomics, deterministic):
//  1. conv1d_partial: a block per (32 output channels, batch tile, length tile, input-channel split). The
//     block stages a coalesced (32 co x ci-chunk x K) weight tile and the matching x window in shared
//     memory; each lane owns one output channel, the 8 warps split the chunk's input channels and are
//     summed through shared memory at the end. Input channels are also split across blocks so that even
//     batch 1 fills the GPU (the U-Net's 1024x1024x5 weights are 20 MB: batch 1 is weight-bandwidth bound);
//     each split writes its partial sums to a workspace.
//  2. gn_mish: a block per (batch, group) sums the splits + bias, computes mean and variance exactly (two
//     passes over values held in registers), normalises, applies gamma/beta, Mish and the epilogue.
// For large B*L (impl=auto) the convolution runs through cuDNN (tensor cores; honours
// torch.backends.cudnn.allow_tf32) and kernel 2 is its fused epilogue.
// CPU: composed from ATen ops (conv1d, group_norm, mish), any floating dtype.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kk {

struct Conv1dShape {
  int64_t B, Cin, Cout, L, K;
};

// Input-channel splits phase 1 uses for this shape (the workspace holds splits * B * Cout * L floats).
int conv1d_partial_splits(Conv1dShape s);

// Phase 1: ws[s][b][co][l] = sum over the input channels of split s of W[co, ci, k] * x[b, ci, l + k - K/2].
// x, W contiguous; `splits` from conv1d_partial_splits.
cudaError_t conv1d_partial_cuda(const float* x, const float* w, float* ws, Conv1dShape s, int splits,
                                cudaStream_t stream);

// Optional epilogue operands of phase 2 (null pointers: absent).
struct GnMishEpilogue {
  const float* scale = nullptr;  // scale[b * scale_sb + c * scale_sc]
  const float* shift = nullptr;
  int64_t scale_sb = 0, scale_sc = 0, shift_sb = 0, shift_sc = 0;
  const float* residual = nullptr;  // (B, C, L) contiguous
};

// Phase 2: y = bias[c] + sum_{s < splits} ws[s][b][c][l]; out = epilogue(mish(GN(y) * gamma + beta)).
// bias may be null. out may alias ws exactly when splits == 1.
cudaError_t gn_mish_cuda(const float* ws, int splits, const float* bias, const float* gamma, const float* beta,
                         GnMishEpilogue epi, float* out, int64_t B, int64_t C, int64_t L, int64_t groups, float eps,
                         cudaStream_t stream);

}  // namespace kk

#ifdef KERNELKIT_BINDING
#include "common/torch_glue.h"

namespace kk {

constexpr const char* kConvOp = "conv1d_gn_mish";
enum Conv1dImpl : int64_t { kConvAuto = 0, kConvFused = 1, kConvCudnn = 2 };
// impl=auto switches to cuDNN for the convolution from this many output columns (B * L) on.
constexpr int64_t kConvCudnnMinColumns = 256;
constexpr int64_t kConvMaxK = 255;

inline void conv_check_tensor(const at::Tensor& t, const char* name, const at::Tensor& x) {
  check_floating(kConvOp, t, name);
  check_same_device_dtype(kConvOp, x, "x", t, name);
}

inline void conv_check_film(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& x, int64_t cout) {
  if (!t.has_value()) return;
  conv_check_tensor(*t, name, x);
  TORCH_CHECK(t->dim() == 2 && t->size(0) == x.size(0) && t->size(1) == cout, kConvOp, ": ", name,
              " must have shape (B, Cout) = (", x.size(0), ", ", cout, "), got ", t->sizes());
}

inline at::Tensor conv1d_gn_mish_cpu(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                                     const at::Tensor& gamma, const at::Tensor& beta, int64_t groups, double eps,
                                     const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& shift,
                                     const std::optional<at::Tensor>& residual) {
  at::Tensor y = at::mish(at::group_norm(at::conv1d(x, w, bias, 1, w.size(2) / 2), groups, gamma, beta, eps));
  if (scale.has_value()) y = y * scale->unsqueeze(-1);
  if (shift.has_value()) y = y + shift->unsqueeze(-1);
  if (residual.has_value()) y = y + *residual;
  return y;
}

inline at::Tensor conv1d_gn_mish(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 const at::Tensor& gamma, const at::Tensor& beta, int64_t groups, double eps,
                                 const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& shift,
                                 const std::optional<at::Tensor>& residual, int64_t impl) {
  const char* op = kConvOp;
  check_floating(op, x, "x");
  TORCH_CHECK(x.dim() == 3, op, ": x must be 3-D (B, Cin, L), got shape ", x.sizes());
  conv_check_tensor(weight, "weight", x);
  TORCH_CHECK(weight.dim() == 3 && weight.size(1) == x.size(1), op, ": weight must have shape (Cout, Cin=", x.size(1),
              ", K), got ", weight.sizes());
  const int64_t B = x.size(0), Cin = x.size(1), L = x.size(2), Cout = weight.size(0), K = weight.size(2);
  TORCH_CHECK(K % 2 == 1 && K <= kConvMaxK, op, ": kernel size K = weight.size(2) must be odd and <= ", kConvMaxK,
              " (padding K // 2 keeps the length), got ", K);
  TORCH_CHECK(L >= 1, op, ": x must have length L >= 1 (as for conv1d: the padded input must be at least K long), got "
              "shape ", x.sizes());
  TORCH_CHECK(groups > 0 && Cout % groups == 0, op, ": Cout = ", Cout, " must be divisible by groups = ", groups);
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const std::vector<int64_t> per_channel{Cout};
  auto check_per_channel = [&](const at::Tensor& t, const char* name) {
    conv_check_tensor(t, name, x);
    TORCH_CHECK(t.sizes() == at::IntArrayRef(per_channel), op, ": ", name, " must have shape (Cout,) = (", Cout, ",), got ",
                t.sizes());
  };
  if (bias.has_value()) check_per_channel(*bias, "bias");
  check_per_channel(gamma, "gamma");
  check_per_channel(beta, "beta");
  conv_check_film(scale, "scale", x, Cout);
  conv_check_film(shift, "shift", x, Cout);
  if (residual.has_value()) {
    conv_check_tensor(*residual, "residual", x);
    TORCH_CHECK(residual->sizes() == at::IntArrayRef({B, Cout, L}), op, ": residual must have shape (B, Cout, L) = (", B,
                ", ", Cout, ", ", L, "), got ", residual->sizes());
  }
  TORCH_CHECK(impl >= kConvAuto && impl <= kConvCudnn, op, ": impl must be 0 (auto), 1 (fused kernel) or 2 (cuDNN conv + fused epilogue), got ", impl);
  TORCH_CHECK(!x.is_cuda() || x.scalar_type() == at::kFloat, op, ": the CUDA kernel supports float32 only, got ",
              x.scalar_type());
  if (B * Cout * L == 0) return at::empty({B, Cout, L}, x.options());
  if (!x.is_cuda()) return conv1d_gn_mish_cpu(x, weight, bias, gamma, beta, groups, eps, scale, shift, residual);
#ifdef KERNELKIT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({B, Cout, L}, x.options());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous(), g = gamma.contiguous(), bt = beta.contiguous();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  const at::Tensor rc = residual.has_value() ? residual->contiguous() : at::Tensor();
  const bool cudnn = impl == kConvCudnn || (impl == kConvAuto && B * L >= kConvCudnnMinColumns);
  auto stream = at::cuda::getCurrentCUDAStream();
  at::Tensor ws;
  int splits = 1;
  const float* bias_ptr = bc.defined() ? bc.const_data_ptr<float>() : nullptr;
  if (cudnn || Cin == 0) {
    ws = Cin == 0 ? at::zeros({B, Cout, L}, x.options()) : at::conv1d(xc, wc, bc, 1, K / 2);
    if (Cin != 0) bias_ptr = nullptr;  // cuDNN added it
  } else {
    const Conv1dShape s{B, Cin, Cout, L, K};
    splits = conv1d_partial_splits(s);
    ws = at::empty({splits, B, Cout, L}, x.options());
    KERNELKIT_CUDA_CHECK(conv1d_partial_cuda(xc.const_data_ptr<float>(), wc.const_data_ptr<float>(),
                                             ws.mutable_data_ptr<float>(), s, splits, stream));
  }
  GnMishEpilogue epi;
  if (scale.has_value()) {
    epi.scale = scale->const_data_ptr<float>();
    epi.scale_sb = scale->stride(0);
    epi.scale_sc = scale->stride(1);
  }
  if (shift.has_value()) {
    epi.shift = shift->const_data_ptr<float>();
    epi.shift_sb = shift->stride(0);
    epi.shift_sc = shift->stride(1);
  }
  if (rc.defined()) epi.residual = rc.const_data_ptr<float>();
  KERNELKIT_CUDA_CHECK(gn_mish_cuda(ws.const_data_ptr<float>(), splits, bias_ptr, g.const_data_ptr<float>(),
                                    bt.const_data_ptr<float>(), epi, out.mutable_data_ptr<float>(), B, Cout, L, groups,
                                    static_cast<float>(eps), stream));
  return out;
#else
  TORCH_CHECK(false, op, ": built without CUDA");
#endif
}

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("conv1d_gn_mish(Tensor x, Tensor weight, Tensor? bias, Tensor gamma, Tensor beta, int groups=8, "
        "float eps=1e-05, Tensor? scale=None, Tensor? shift=None, Tensor? residual=None, int impl=0) -> Tensor");
  m.impl("conv1d_gn_mish", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(kk::conv1d_gn_mish)));
#ifdef KERNELKIT_WITH_CUDA
  m.impl("conv1d_gn_mish", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(kk::conv1d_gn_mish)));
#endif
}
#endif  // KERNELKIT_BINDING
