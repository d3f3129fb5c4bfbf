"""conv1d_gn_mish card: Conv1d + GroupNorm + Mish fused, with a FiLM/residual epilogue (spec, fake kernel, the
public function :func:`conv1d_gn_mish`, which ``SPEC.op`` points at, and the known-wrong twins the checker must
reject).

The op's constants (the ``impl`` codes, the cost model of ``impl="auto"``, the weight layout threshold) are
defined once, in ``conv1d_gn_mish.h``; :func:`config` reads them from the loaded build.
"""
from __future__ import annotations

from typing import Dict, Optional, Union

import torch
import torch.nn.functional as F

import kernelkit
from kernelkit import cardkit
from kernelkit.reference.conv1d_gn_mish import UNET_CONV_SHAPES, epilogue
from kernelkit.reference.conv1d_gn_mish import conv1d_gn_mish as reference

CARD = "conv1d_gn_mish"
K, GROUPS = 5, 8

# the op's config callable (one per build and call path) -> its parsed config
_CONFIGS: Dict[object, dict] = {}


def config() -> dict:
    """The constants of the newest build, as its C++ reports them: ``{"impl": {name: code}, "cost": {field:
    value} (kk::ConvCostModel: the cost model of impl="auto"), "channels_last_min_weights": weights from which
    cuDNN's channels-last algorithm pays (so a filter this large is best stored by channels_last_weight),
    "direct_max_taps": ...}``. Builds/loads the card on first use."""
    fn = cardkit.current_op(CARD, "conv1d_gn_mish_config")
    cfg = _CONFIGS.get(fn)
    if cfg is None:
        cfg = _CONFIGS[fn] = _parse_config(fn())
    return cfg


def _parse_config(text: str) -> dict:
    cfg: dict = {}
    for item in filter(None, text.split(";")):
        key, value = item.split("=", 1)
        number = float(value) if any(c in value for c in ".eEn") else int(value)
        *groups, name = key.split(".")
        d = cfg
        for g in groups:
            d = d.setdefault(g, {})
        d[name] = number
    return cfg


def impl_code(impl: Union[str, int]) -> int:
    """The op's integer code for ``impl`` (a name of ``config()["impl"]`` or a code, which the op checks)."""
    if isinstance(impl, int) and not isinstance(impl, bool):
        return impl
    codes = config()["impl"]
    if impl not in codes:
        raise ValueError(f"conv1d_gn_mish: impl must be one of {', '.join(map(repr, codes))} or its code "
                         f"{min(codes.values())}..{max(codes.values())}, got {impl!r}")
    return codes[impl]


# Under torch.compile Dynamo calls this at trace time and uses the result as a constant (like
# kernelkit.ops._namespace_for_trace), rather than tracing an op call that returns a string.
_impl_code_for_trace = impl_code
_impl_code_for_trace._dynamo_marked_constant = True


def conv1d_gn_mish(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], gamma: torch.Tensor,
                   beta: torch.Tensor, groups: int = 8, eps: float = 1e-5, scale: Optional[torch.Tensor] = None,
                   shift: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None, *,
                   impl: Union[str, int] = "auto") -> torch.Tensor:
    """``mish(group_norm(conv1d(x, weight, bias, padding=K//2), groups, gamma, beta, eps))`` fused, then
    ``* scale[..., None] + shift[..., None]`` (FiLM, (B, Cout)) and ``+ residual`` (B, Cout, L) if given.

    x (B, Cin, L); weight (Cout, Cin, K), K odd, in either layout (see :func:`channels_last_weight`); Cout
    divisible by ``groups``. CUDA: float32; CPU: composed from ATen ops. ``impl``: "fused" (two kernels:
    split convolution, then GroupNorm+Mish+epilogue), "cudnn" (cuDNN convolution, honouring
    ``torch.backends.cudnn.allow_tf32``, then the fused epilogue), "direct" (one kernel computing the
    convolution per output: for few taps Cin * K), "auto" (direct for few taps while a (batch, group) slab's
    work stays small, else cuDNN or fused by the cost model ``config()["cost"]``).

    Not differentiable: with grad mode on, an input that requires grad is refused.
    """
    op = cardkit.current_op(CARD, CARD)
    code = _impl_code_for_trace(impl) if torch.compiler.is_compiling() else impl_code(impl)
    return op(x, weight, bias, gamma, beta, groups, eps, scale, shift, residual, code)


def channels_last_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (Cout, Cin, K) with the same values, stored (Cout, K, Cin): the layout in which
    :func:`conv1d_gn_mish` hands it to cuDNN as a channels-last filter. cuDNN's fastest float32
    convolutions on Hopper read that layout and transpose a (Cout, Cin, K) filter on every call (below
    ``config()["channels_last_min_weights"]`` weights its channels-last algorithm is the slower one).
    Every path of the op reads either layout in place."""
    if weight.dim() != 3:
        raise ValueError(f"channels_last_weight: weight must be 3-D (Cout, Cin, K), got shape {tuple(weight.shape)}")
    return weight.transpose(1, 2).contiguous().transpose(1, 2)


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    """``shape`` is (B, Cin, Cout, L): x (B, Cin, L), weight (Cout, Cin, 5) scaled like nn.Conv1d's init,
    bias, gamma ~ 1 + N(0, 0.1^2), beta ~ N(0, 0.1^2); returns (x, weight, bias, gamma, beta, 8)."""
    b, cin, cout, length = shape
    bound = 1.0 / max(1, cin * K) ** 0.5

    def randn(*s, scale=1.0, shift=0.0):
        return cardkit.randn(s, dtype, device, generator, scale=scale, shift=shift)

    x = randn(b, cin, length)
    w = randn(cout, cin, K, scale=bound)
    bias = randn(cout, scale=bound)
    gamma = randn(cout, scale=0.1, shift=1.0)
    beta = randn(cout, scale=0.1)
    return x, w, bias, gamma, beta, GROUPS


def bytes_moved(args, out) -> int:
    x, w, bias, gamma, beta = args[:5]
    return sum(t.numel() * t.element_size() for t in (x, w, bias, gamma, beta, out))


SPEC = kernelkit.Spec(
    name=CARD,
    reference=reference,
    make_inputs=make_inputs,
    op=conv1d_gn_mish,
    dtypes=(torch.float32,),
    # Diffusion Policy's U-Net (Cin, Cout, L) at batch 1 and 64, plus odd shapes
    shapes=tuple((b, cin, cout, length) for b in (1, 64) for cin, cout, length in UNET_CONV_SHAPES)
    + ((3, 5, 8, 1), (2, 3, 16, 7), (5, 33, 40, 37), (1, 70, 24, 130), (0, 4, 8, 5), (2, 4, 8, 0)),
    bench_sizes=tuple((b, cin, cout, length) for b in (1, 64) for cin, cout, length in UNET_CONV_SHAPES),
    bytes_moved=bytes_moved,
    tolerances={torch.float32: (1e-4, 1e-4)},
    noncontiguous=True,
    doc="mish(group_norm(conv1d(x, W, b, padding=K//2), groups, gamma, beta)) fused; optional FiLM/residual epilogue",
)


def _fake(x, weight, bias, gamma, beta, groups=8, eps=1e-5, scale=None, shift=None, residual=None, impl=None):
    del eps, impl  # values the kernel reads, not shapes
    op = CARD
    for t, name in ((weight, "weight"), (bias, "bias"), (gamma, "gamma"), (beta, "beta"), (scale, "scale"),
                    (shift, "shift"), (residual, "residual")):
        if t is not None:
            cardkit.check_pair(op, x, "x", t, name)
    if x.dim() != 3 or weight.dim() != 3 or weight.shape[1] != x.shape[1]:
        raise RuntimeError(f"{op}: x must be (B, Cin, L) and weight (Cout, Cin, K), got {list(x.shape)} and "
                           f"{list(weight.shape)}")
    b, _, length = x.shape
    cout, k = weight.shape[0], weight.shape[2]
    if k % 2 == 0 or groups <= 0 or cout % groups:
        raise RuntimeError(f"{op}: K must be odd and Cout divisible by groups, got K={k}, Cout={cout}, groups={groups}")
    return x.new_empty((b, cout, length))


def setup(lib):
    torch.library.register_fake(lib.qualname(CARD))(_fake)


# ---- known-wrong versions: kernelkit.check must reject every one (tests/test_wrong_twins.py) ----------------


def _flipped_taps(x, weight, bias, gamma, beta, groups=8, eps=1e-5, scale=None, shift=None, residual=None):
    """A direct convolution that walks the filter taps backwards (convolution instead of cross-correlation)."""
    return reference(x, weight.flip(-1), bias, gamma, beta, groups, eps, scale, shift, residual)


def _unbiased_variance(x, weight, bias, gamma, beta, groups=8, eps=1e-5, scale=None, shift=None, residual=None):
    """GroupNorm with the unbiased variance (divides by n - 1, as torch.var does by default)."""
    y = F.conv1d(x, weight, bias, padding=weight.shape[-1] // 2)
    b, c, length = y.shape
    g = y.reshape(b, groups, c // groups * length)
    centred = g - g.mean(-1, keepdim=True)
    g = centred / torch.sqrt(centred.square().sum(-1, keepdim=True) / max(g.shape[-1] - 1, 1) + eps)
    y = g.reshape(b, c, length) * gamma[:, None] + beta[:, None]
    return epilogue(F.mish(y), scale, shift, residual)


WRONG = {**cardkit.wrong_twins(reference, "skip_last", "assumes_contiguous"), "flipped_taps": _flipped_taps,
         "unbiased_variance": _unbiased_variance}
