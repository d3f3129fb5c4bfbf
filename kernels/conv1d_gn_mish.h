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
// CUDA (no memset, no atomics, deterministic), one of three paths:
//  direct (one kernel, for convolutions with few taps Cin * K, like the U-Net's first layer): a block per
//     (batch, group) computes its slab of the convolution straight from x and W, then GroupNorm + Mish +
//     epilogue as in kernel 2 below.
//  fused (two kernels):
//  1. conv1d_partial: a block per (32 output channels, batch tile, length tile, input-channel split). The
//     block stages a coalesced (32 co x ci-chunk x K) weight tile and the matching x window in shared
//     memory; each lane owns one output channel, the 8 warps split the chunk's input channels and are
//     summed through shared memory at the end. Input channels are also split across blocks so that even
//     batch 1 fills the GPU (the U-Net's 1024x1024x5 weights are 20 MB: batch 1 is weight-bandwidth bound);
//     each split writes its partial sums to a workspace.
//  2. gn_mish: a block per (batch, group) sums the splits + bias, computes mean and variance exactly (two
//     passes over values held in registers), normalises, applies gamma/beta, Mish and the epilogue.
//  cudnn: the convolution (without bias) through cuDNN (tensor cores; honours
//     torch.backends.cudnn.allow_tf32), and kernel 2 is its fused epilogue, bias included.
// impl=auto: direct for Cin * K <= 64 taps (while a block's share of the work stays small), else whichever of
// cuDNN and fused a cost model fitted to both predicts faster (see conv_pick_impl).
// CPU: composed from ATen ops (conv1d, group_norm, mish), any floating dtype.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace kk {

struct Conv1dShape {
  int64_t B, Cin, Cout, L, K;
  bool w_channels_last = false;  // W stored (Cout, K, Cin) (channels innermost) instead of (Cout, Cin, K)
};

// Input-channel splits phase 1 uses for this shape (the workspace holds splits * B * Cout * L floats).
int conv1d_partial_splits(Conv1dShape s);

// Phase 1: ws[s][b][co][l] = sum over the input channels of split s of W[co, ci, k] * x[b, ci, l + k - K/2].
// x contiguous, W contiguous in its layout (s.w_channels_last); `splits` from conv1d_partial_splits.
cudaError_t conv1d_partial_cuda(const float* x, const float* w, float* ws, Conv1dShape s, int splits,
                                cudaStream_t stream);

// Optional epilogue operands of phase 2 (null pointers: absent).
struct GnMishEpilogue {
  const float* scale = nullptr;  // scale[b * scale_sb + c * scale_sc]
  const float* shift = nullptr;
  int64_t scale_sb = 0, scale_sc = 0, shift_sb = 0, shift_sc = 0;
  const float* residual = nullptr;  // (B, C, L) contiguous
};

// Phase 2's operands besides the convolution's values: out (B, C, L) = epilogue(mish(GN(y) * gamma + beta))
// with y = conv + bias[c]; bias may be null.
struct GnMishParams {
  const float* bias;
  const float* gamma;
  const float* beta;
  GnMishEpilogue epi;
  float* out;
  int64_t B, C, L, groups;
  float eps;
};

// Phase 2 over phase 1's (or cuDNN's) values: conv = sum_{s < splits} ws[s][b][c][l], splits B * C * L
// apart, (b, c, l) at the strides ws_strides[0..2]; out must not alias ws.
cudaError_t gn_mish_cuda(const float* ws, int splits, const int64_t* ws_strides, const GnMishParams& p,
                         cudaStream_t stream);

// Both phases in one kernel, the convolution computed per element (x contiguous, W contiguous in its layout
// s.w_channels_last; for few taps Cin * K).
cudaError_t conv_gn_mish_direct_cuda(const float* x, const float* w, const Conv1dShape& s, const GnMishParams& p,
                                     cudaStream_t stream);

}  // namespace kk

#ifdef KERNELKIT_BINDING
#include <kernelkit/torch_glue.h>

#include <sstream>
#include <string>

namespace kk {

constexpr const char* kConvOp = "conv1d_gn_mish";

// The values of the op's `impl` argument; conv1d_gn_mish_config() reports them to Python by name.
enum Conv1dImpl : int64_t { kConvAuto = 0, kConvFused = 1, kConvCudnn = 2, kConvDirect = 3 };
struct Conv1dImplName {
  Conv1dImpl code;
  const char* name;
  const char* what;
};
constexpr Conv1dImplName kConvImpls[] = {
    {kConvAuto, "auto", "the direct kernel for few taps, else the faster of fused and cudnn by the cost model"},
    {kConvFused, "fused", "split conv kernel + GroupNorm kernel"},
    {kConvCudnn, "cudnn", "cuDNN conv + fused epilogue"},
    {kConvDirect, "direct", "one kernel computing the conv per output"},
};

// impl=auto computes the convolution in the GroupNorm kernel up to this many taps (Cin * K) while one
// block's share (a group's Cout / groups * L outputs times the taps) stays within kConvDirectMaxBlockMacs.
constexpr int64_t kConvDirectMaxTaps = 64;
constexpr int64_t kConvDirectMaxBlockMacs = int64_t{1} << 20;

// Beyond that, auto takes the faster of the split kernel and cuDNN by this cost model, fitted to both
// (float32, the U-Net's ten shapes at batch 1 to 128, both weight layouts; fit, accuracy and the GPU in
// docs/performance.md, "Cost model"; examples/diffusion_policy/refit_cost_model.py re-fits it). With
// W = Cout * Cin * K weights and MACs = W * B * L:
//   split kernel:                 split_fixed_us + MACs / split_macs_per_ps (..._cl for a channels-last W)
//   cuDNN, contiguous W:          cudnn_fixed_us + cudnn_us_per_mweight * W / 1e6 (it transposes W per call)
//   cuDNN, channels-last W:       cudnn_cl_fixed_us + cudnn_cl_us_per_mweight * W / 1e6, but
//                                 cudnn_cl_small_us below cudnn_cl_small_filter weights, and the winner at
//                                 any batch from cudnn_cl_always_weights (the split kernel, short of output
//                                 columns, is then bound by reading W in short runs).
struct ConvCostModel {
  double split_fixed_us;           // us, split kernel at zero work
  double split_macs_per_ps;        // MACs per picosecond, split kernel, contiguous W
  double split_macs_per_ps_cl;     // MACs per picosecond, split kernel, channels-last W
  double cudnn_fixed_us;           // us, cuDNN with a contiguous W at zero weights
  double cudnn_us_per_mweight;     // us per million weights, cuDNN with a contiguous W
  double cudnn_cl_fixed_us;        // us, cuDNN with a channels-last W at zero weights
  double cudnn_cl_us_per_mweight;  // us per million weights, cuDNN with a channels-last W
  double cudnn_cl_small_us;        // us, cuDNN with a channels-last W below cudnn_cl_small_filter weights
  int64_t cudnn_cl_small_filter;   // weights: below this cuDNN's channels-last algorithm is slow, so
                                   // weights this small are best stored contiguous (the layout threshold)
  int64_t cudnn_cl_always_weights; // weights: from this many on, cuDNN with a channels-last W always wins
};
constexpr ConvCostModel kConvCost{14.0, 4.8, 4.4, 21.0, 11.0, 20.0, 2.5, 33.0, int64_t{1} << 19, int64_t{1} << 21};

// Predicted time (us) of each path for a convolution of `weights` weights and `macs` multiply-adds.
inline double conv_split_us(const ConvCostModel& c, double macs, bool w_channels_last) {
  return c.split_fixed_us + macs / ((w_channels_last ? c.split_macs_per_ps_cl : c.split_macs_per_ps) * 1e6);
}
inline double conv_cudnn_us(const ConvCostModel& c, int64_t weights, bool w_channels_last) {
  const double mw = static_cast<double>(weights) * 1e-6;
  if (!w_channels_last) return c.cudnn_fixed_us + c.cudnn_us_per_mweight * mw;
  if (weights < c.cudnn_cl_small_filter) return c.cudnn_cl_small_us;
  return c.cudnn_cl_fixed_us + c.cudnn_cl_us_per_mweight * mw;
}

inline Conv1dImpl conv_pick_impl(int64_t impl, int64_t B, int64_t Cin, int64_t Cout, int64_t L, int64_t K,
                                 int64_t groups, bool w_channels_last) {
  if (impl != kConvAuto) return static_cast<Conv1dImpl>(impl);
  if (Cin * K <= kConvDirectMaxTaps && Cout / groups * L * Cin * K <= kConvDirectMaxBlockMacs) return kConvDirect;
  const int64_t weights = Cout * Cin * K;
  if (w_channels_last && weights >= kConvCost.cudnn_cl_always_weights) return kConvCudnn;
  const double macs = static_cast<double>(weights) * static_cast<double>(B * L);
  return conv_cudnn_us(kConvCost, weights, w_channels_last) <= conv_split_us(kConvCost, macs, w_channels_last)
             ? kConvCudnn
             : kConvFused;
}

// The constants Python needs, as "key=value;..." (kernels/conv1d_gn_mish.py parses it): impl.<name>=<code>,
// the cost model's fields as cost.<field>, and channels_last_min_weights (the layout threshold).
inline std::string conv1d_gn_mish_config() {
  std::ostringstream s;
  s.precision(17);
  for (const auto& i : kConvImpls) s << "impl." << i.name << "=" << static_cast<int64_t>(i.code) << ";";
  const ConvCostModel& c = kConvCost;
  s << "cost.split_fixed_us=" << c.split_fixed_us << ";cost.split_macs_per_ps=" << c.split_macs_per_ps
    << ";cost.split_macs_per_ps_cl=" << c.split_macs_per_ps_cl << ";cost.cudnn_fixed_us=" << c.cudnn_fixed_us
    << ";cost.cudnn_us_per_mweight=" << c.cudnn_us_per_mweight << ";cost.cudnn_cl_fixed_us=" << c.cudnn_cl_fixed_us
    << ";cost.cudnn_cl_us_per_mweight=" << c.cudnn_cl_us_per_mweight << ";cost.cudnn_cl_small_us="
    << c.cudnn_cl_small_us << ";cost.cudnn_cl_small_filter=" << c.cudnn_cl_small_filter
    << ";cost.cudnn_cl_always_weights=" << c.cudnn_cl_always_weights
    << ";channels_last_min_weights=" << c.cudnn_cl_small_filter << ";direct_max_taps=" << kConvDirectMaxTaps;
  return s.str();
}

// "0 (auto: ...), 1 (fused: ...), ..." for the message of a bad impl.
inline std::string conv_impl_choices() {
  std::ostringstream s;
  for (const auto& i : kConvImpls) {
    s << (i.code == kConvAuto ? "" : ", ") << static_cast<int64_t>(i.code) << " (" << i.name << ": " << i.what << ")";
  }
  return s.str();
}

constexpr int64_t kConvMaxK = 255;
constexpr int64_t kConvMaxBlocks = 0x7fffffff;  // gridDim.x limit

// W (Cout, Cin, K) stored (Cout, K, Cin): the channels innermost, like a channels-last 2-D filter. When
// Cin or K is 1 both layouts are the same memory (contiguous wins).
inline bool conv_weight_channels_last(const at::Tensor& w) {
  const int64_t cin = w.size(1), k = w.size(2);
  return !w.is_contiguous() && w.stride(0) == cin * k && w.stride(1) == 1 && w.stride(2) == cin;
}

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
  TORCH_CHECK(impl >= kConvAuto && impl <= kConvDirect, op, ": impl must be one of ", conv_impl_choices(), "; got ",
              impl);
  TORCH_CHECK(!x.is_cuda() || x.scalar_type() == at::kFloat, op, ": the CUDA kernel supports float32 only, got ",
              x.scalar_type());
  if (B * Cout * L == 0) return at::empty({B, Cout, L}, x.options());
  if (!x.is_cuda()) return conv1d_gn_mish_cpu(x, weight, bias, gamma, beta, groups, eps, scale, shift, residual);
#ifdef KERNELKIT_WITH_CUDA
  TORCH_CHECK(B * groups <= kConvMaxBlocks, op, ": B * groups must be at most ", kConvMaxBlocks,
              " on CUDA (a block per batch and group), got ", B, " * ", groups);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({B, Cout, L}, x.options());
  // W stored (Cout, K, Cin) (channels_last_weight; examples/diffusion_policy stores large filters so): every
  // path reads it in place
  // and cuDNN gets it as a channels-last filter (it transposes a (Cout, Cin, K) one on every call).
  const bool w_cl = conv_weight_channels_last(weight);
  const at::Tensor xc = x.contiguous(), wc = w_cl ? weight : weight.contiguous();
  const at::Tensor g = gamma.contiguous(), bt = beta.contiguous();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  const at::Tensor rc = residual.has_value() ? residual->contiguous() : at::Tensor();
  auto stream = at::cuda::getCurrentCUDAStream();
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
  const GnMishParams p{bc.defined() ? bc.const_data_ptr<float>() : nullptr, g.const_data_ptr<float>(),
                       bt.const_data_ptr<float>(), epi, out.mutable_data_ptr<float>(), B, Cout, L, groups,
                       static_cast<float>(eps)};
  const Conv1dShape s{B, Cin, Cout, L, K, w_cl};
  switch (conv_pick_impl(impl, B, Cin, Cout, L, K, groups, w_cl)) {
    case kConvDirect:
      KERNELKIT_CUDA_CHECK(conv_gn_mish_direct_cuda(xc.const_data_ptr<float>(), wc.const_data_ptr<float>(), s, p, stream));
      break;
    case kConvCudnn: {  // bias in the epilogue: cuDNN would add it in a kernel of its own
      at::Tensor ws;  // (B, Cout, L) values at any strides
      if (Cin == 0) {
        ws = at::zeros({B, Cout, L}, x.options());
      } else if (w_cl) {  // as a 2-D convolution over (B, Cin, 1, L): channels-last in, channels-last out
        const std::vector<int64_t> stride{1, 1}, padding{0, K / 2};
        ws = at::conv2d(xc.unsqueeze(2).contiguous(at::MemoryFormat::ChannelsLast), wc.unsqueeze(2), std::nullopt,
                        stride, padding)
                 .squeeze(2);
      } else {
        ws = at::conv1d(xc, wc, {}, 1, K / 2);
      }
      KERNELKIT_CUDA_CHECK(gn_mish_cuda(ws.const_data_ptr<float>(), 1, ws.strides().data(), p, stream));
      break;
    }
    default: {
      const int splits = conv1d_partial_splits(s);
      const at::Tensor ws = at::empty({splits, B, Cout, L}, x.options());
      KERNELKIT_CUDA_CHECK(conv1d_partial_cuda(xc.const_data_ptr<float>(), wc.const_data_ptr<float>(),
                                               ws.mutable_data_ptr<float>(), s, splits, stream));
      KERNELKIT_CUDA_CHECK(gn_mish_cuda(ws.const_data_ptr<float>(), splits, ws.strides().data() + 1, p, stream));
    }
  }
  return out;
#else
  TORCH_CHECK(false, op, ": built without CUDA");
#endif
}

}  // namespace kk

KERNELKIT_LIBRARY(m) {
  m.def("conv1d_gn_mish(Tensor x, Tensor weight, Tensor? bias, Tensor gamma, Tensor beta, int groups=8, "
        "float eps=1e-05, Tensor? scale=None, Tensor? shift=None, Tensor? residual=None, int impl=0) -> Tensor");
  KK_IMPL_CPU_CUDA(m, "conv1d_gn_mish", kk::conv1d_gn_mish);
  kk::impl_autograd<kk::NoGrad>(m, "conv1d_gn_mish");  // no backward: inputs that require grad are refused
  m.def("conv1d_gn_mish_config() -> str", &kk::conv1d_gn_mish_config);
}
#endif  // KERNELKIT_BINDING
