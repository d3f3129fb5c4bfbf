"""conv1d_gn_mish card: Conv1d + GroupNorm + Mish fused, with a FiLM/residual epilogue (spec, fake kernel).
Public function: kernelkit.diffusion.conv1d_gn_mish."""
import torch

import kernelkit
from kernelkit import diffusion
from kernelkit import ops as _ops
from kernelkit.reference.conv1d_gn_mish import conv1d_gn_mish as reference
from kernelkit.reference.unet1d import UNET_CONV_SHAPES

K, GROUPS = 5, 8


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    """``shape`` is (B, Cin, Cout, L): x (B, Cin, L), weight (Cout, Cin, 5) scaled like nn.Conv1d's init,
    bias, gamma ~ 1 + N(0, 0.1^2), beta ~ N(0, 0.1^2); returns (x, weight, bias, gamma, beta, 8)."""
    b, cin, cout, length = shape
    gdev = generator.device if generator is not None else device

    def randn(*s, scale=1.0):
        return (torch.randn(s, device=gdev, generator=generator) * scale).to(device=device, dtype=dtype)

    bound = 1.0 / max(1, cin * K) ** 0.5
    x = randn(b, cin, length)
    w = randn(cout, cin, K, scale=bound)
    bias = randn(cout, scale=bound)
    gamma = 1 + randn(cout, scale=0.1)
    beta = randn(cout, scale=0.1)
    return x, w, bias, gamma, beta, GROUPS


def bytes_moved(args, out) -> int:
    x, w, bias, gamma, beta = args[:5]
    return sum(t.numel() * t.element_size() for t in (x, w, bias, gamma, beta, out))


SPEC = kernelkit.Spec(
    name="conv1d_gn_mish",
    reference=reference,
    make_inputs=make_inputs,
    op=diffusion.conv1d_gn_mish,
    dtypes=(torch.float32,),
    # the U-Net's (Cin, Cout, L) at batch 1 and 64, plus odd shapes
    shapes=tuple((b, cin, cout, length) for b in (1, 64) for cin, cout, length in UNET_CONV_SHAPES)
    + ((3, 5, 8, 1), (2, 3, 16, 7), (5, 33, 40, 37), (1, 70, 24, 130), (0, 4, 8, 5), (2, 4, 8, 0)),
    bench_sizes=tuple((b, cin, cout, length) for b in (1, 64) for cin, cout, length in UNET_CONV_SHAPES),
    bytes_moved=bytes_moved,
    tolerances={torch.float32: (1e-4, 1e-4)},
    noncontiguous=True,
    doc="mish(group_norm(conv1d(x, W, b, padding=K//2), groups, gamma, beta)) fused; optional FiLM/residual epilogue",
)


def _fake(x, weight, bias, gamma, beta, groups=8, eps=1e-5, scale=None, shift=None, residual=None, impl=0):
    op = "conv1d_gn_mish"
    for t, name in ((weight, "weight"), (bias, "bias"), (gamma, "gamma"), (beta, "beta"), (scale, "scale"),
                    (shift, "shift"), (residual, "residual")):
        if t is not None:
            _ops._check_pair(op, x, "x", t, name)
    if x.dim() != 3 or weight.dim() != 3 or weight.shape[1] != x.shape[1]:
        raise RuntimeError(f"{op}: x must be (B, Cin, L) and weight (Cout, Cin, K), got {list(x.shape)} and "
                           f"{list(weight.shape)}")
    b, _, length = x.shape
    cout, k = weight.shape[0], weight.shape[2]
    if k % 2 == 0 or groups <= 0 or cout % groups:
        raise RuntimeError(f"{op}: K must be odd and Cout divisible by groups, got K={k}, Cout={cout}, groups={groups}")
    return x.new_empty((b, cout, length))


def setup(lib):
    torch.library.register_fake(lib.qualname("conv1d_gn_mish"))(_fake)
    _ops._bind(lib, ("conv1d_gn_mish",))
