"""conv1d_gn_mish card: every (Cin, Cout, L) of the U-Net at batch 1 and 64 plus odd shapes against the
reference (CUDA under `gpu`), the FiLM/residual epilogue, errors and fakes (CPU), the constants its C++
reports, its refusal of gradients, compile-only build."""
import pytest
import torch
from ops_helpers import DEVICES, lib

import kernelkit
from kernelkit.kernels import conv1d_gn_mish as kd  # the card module: its public conv1d_gn_mish
from kernelkit.reference.conv1d_gn_mish import UNET_CONV_SHAPES
from kernelkit.reference.conv1d_gn_mish import conv1d_gn_mish as ref

CARD = "conv1d_gn_mish"
IMPLS = ("fused", "cudnn", "direct")
#: odd shapes: (B, Cin, Cout, L, K, groups) - Cin/Cout not multiples of 32, several length tiles, K 1/3/7,
#: one group (slab over the register cache), L = 1
ODD = ((3, 5, 8, 1, 5, 8), (2, 3, 24, 7, 3, 8), (5, 33, 40, 37, 5, 8), (1, 70, 24, 130, 7, 4), (2, 64, 64, 100, 5, 1),
       (1, 1, 8, 9, 1, 2), (9, 40, 16, 20, 5, 8), (1, 600, 96, 3, 5, 8))


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the reference's cuDNN conv in full float32
    yield
    torch.backends.cudnn.allow_tf32 = old


def _inputs(b, cin, cout, length, k=5, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    bound = 1 / (cin * k) ** 0.5
    x = torch.randn(b, cin, length, generator=g)
    w = torch.randn(cout, cin, k, generator=g) * bound
    bias = torch.randn(cout, generator=g) * bound
    gamma = 1 + 0.1 * torch.randn(cout, generator=g)
    beta = 0.1 * torch.randn(cout, generator=g)
    return tuple(t.to(device) for t in (x, w, bias, gamma, beta))


def _film(b, cout, length, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(b, 2, cout, generator=g).to(device)  # the U-Net's (B, 2, C) FiLM: strided views
    return embed[:, 0], embed[:, 1], torch.randn(b, cout, length, generator=g).to(device)


def _close(got, exp):
    torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", (1, 64))
@pytest.mark.parametrize("shape", UNET_CONV_SHAPES + ((256, 256, 16),), ids=lambda s: "x".join(map(str, s)))
def test_unet_shapes(shape, batch, impl):
    args = _inputs(batch, *shape, device="cuda")
    _close(kd.conv1d_gn_mish(*args, impl=impl), ref(*args))
    scale, shift, res = _film(batch, shape[1], shape[2], "cuda")
    _close(kd.conv1d_gn_mish(*args, 8, 1e-5, scale, shift, impl=impl), ref(*args, 8, 1e-5, scale, shift))
    _close(kd.conv1d_gn_mish(*args, residual=res, impl=impl), ref(*args, residual=res))
    # the weight stored (Cout, K, Cin), as the example's use_kernelkit keeps it (cuDNN: a channels-last filter)
    x, w, rest = args[0], args[1], args[2:]
    got = kd.conv1d_gn_mish(x, kd.channels_last_weight(w), *rest, 8, 1e-5, scale, shift, res, impl=impl)
    _close(got, ref(*args, 8, 1e-5, scale, shift, res))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS + ("auto",))
@pytest.mark.parametrize("case", ODD, ids=lambda c: "x".join(map(str, c)))
def test_odd_shapes(case, impl, device):
    b, cin, cout, length, k, groups = case
    x, w, bias, gamma, beta = _inputs(b, cin, cout, length, k, device)
    scale, shift, res = _film(b, cout, length, device)
    _close(kd.conv1d_gn_mish(x, w, bias, gamma, beta, groups, impl=impl), ref(x, w, bias, gamma, beta, groups))
    _close(kd.conv1d_gn_mish(x, w, None, gamma, beta, groups, 1e-3, scale, shift, res, impl=impl),
           ref(x, w, None, gamma, beta, groups, 1e-3, scale, shift, res))
    # non-contiguous x and weight, and the weight stored (Cout, K, Cin) (read in place)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    wt = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    _close(kd.conv1d_gn_mish(xt, wt, bias, gamma, beta, groups, impl=impl), ref(x, w, bias, gamma, beta, groups))
    wcl = kd.channels_last_weight(w)
    assert torch.equal(wcl, w) and (k == 1 or cin == 1 or not wcl.is_contiguous())
    _close(kd.conv1d_gn_mish(xt, wcl, None, gamma, beta, groups, 1e-3, scale, shift, res, impl=impl),
           ref(x, w, None, gamma, beta, groups, 1e-3, scale, shift, res))


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    args = _inputs(0, 4, 8, 5, device=device)  # an empty batch is fine
    assert kd.conv1d_gn_mish(*args).shape == (0, 8, 5)
    args = _inputs(2, 4, 8, 0, device=device)  # length 0 is an error, as for torch's conv1d
    with pytest.raises(RuntimeError, match="length L >= 1"):
        kd.conv1d_gn_mish(*args)
    with pytest.raises(RuntimeError):
        ref(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ("fused", "direct"))
@pytest.mark.parametrize("offset", (30.0, -30.0, 15.0, -3.0))
def test_large_values_and_deterministic(impl, offset):
    cin = 1024 if impl == "fused" else 4
    x, w, bias, gamma, beta = _inputs(1, cin, 1024, 4, device="cuda")
    beta = beta + offset  # Mish into its linear range, its vanishing tail, near its closed form's cut at 20
    a = kd.conv1d_gn_mish(x, w, bias, gamma, beta, impl=impl)
    _close(a, ref(x, w, bias, gamma, beta))
    assert torch.equal(a, kd.conv1d_gn_mish(x, w, bias, gamma, beta, impl=impl))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,channels_last,impl", (
    ((1, 512, 1024, 4), True, "cudnn"),    # a channels-last weight needs no transpose: cuDNN even at batch 1
    ((1, 256, 256, 8), True, "fused"),     # small filters: cuDNN's channels-last algorithm is slow
    ((64, 256, 256, 8), True, "cudnn"),    # ... until the split kernel has enough work
    ((16, 512, 512, 8), True, "cudnn"),    # mid-size filter, batch 16: 26 vs 57 us
    ((1, 1024, 256, 8), True, "fused"),
    ((8, 512, 512, 8), False, "fused"),    # contiguous weight: cuDNN pays a filter transpose per call
    ((32, 1024, 1024, 4), False, "cudnn"),  # ... which large batches repay (78 vs 159 us)
    ((16, 512, 512, 8), False, "cudnn"),
))
def test_auto_picks_by_cost(shape, channels_last, impl):
    """impl=auto's choice between the split kernel and cuDNN (the cost model in conv_pick_impl), bit for bit
    the chosen path's result (the two sum in different orders)."""
    x, w, *rest = _inputs(*shape, device="cuda")
    wt = kd.channels_last_weight(w) if channels_last else w
    got = kd.conv1d_gn_mish(x, wt, *rest)
    assert torch.equal(got, kd.conv1d_gn_mish(x, wt, *rest, impl=impl))
    other = "fused" if impl == "cudnn" else "cudnn"
    assert not torch.equal(got, kd.conv1d_gn_mish(x, wt, *rest, impl=other))  # the check can tell them apart
    _close(got, ref(x, w, *rest))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ((1, 2, 256, 16), (64, 2, 256, 16), (3, 12, 40, 9)))
def test_auto_computes_few_taps_directly(shape):
    """impl=auto takes the one-kernel path for a convolution with few taps (the U-Net's first layer):
    bit for bit the "direct" result (the split and cuDNN paths sum in other orders)."""
    args = _inputs(*shape, device="cuda")
    got = kd.conv1d_gn_mish(*args)
    assert torch.equal(got, kd.conv1d_gn_mish(*args, impl="direct"))
    _close(got, ref(*args))


def test_errors_cpu():
    x, w, bias, gamma, beta = _inputs(2, 6, 16, 9)
    cases = [
        ((x[0], w, bias, gamma, beta), {}, "x must be 3-D"),
        ((x, w[:, :5], bias, gamma, beta), {}, r"weight must have shape \(Cout, Cin=6, K\)"),
        ((x, w[..., :4], bias, gamma, beta), {}, "must be odd"),
        ((x, w, bias, gamma, beta, 3), {}, "must be divisible by groups"),
        ((x, w, bias[:3], gamma, beta), {}, r"bias must have shape \(Cout,\)"),
        ((x, w, bias, gamma[:2], beta), {}, r"gamma must have shape \(Cout,\)"),
        ((x, w.double(), bias, gamma, beta), {}, "must have the same dtype"),
        ((x.int(), w, bias, gamma, beta), {}, "must be a float32, float64, float16 or bfloat16"),
        ((x, w, bias, gamma, beta, 8, 1e-5, torch.ones(2, 15)), {}, r"scale must have shape \(B, Cout\)"),
        ((x, w, bias, gamma, beta, 8, 1e-5, None, None, torch.ones(2, 16, 8)), {}, "residual must have shape"),
        ((x, w, bias, gamma, beta), {"impl": 7}, r"impl must be one of 0 \(auto: .*3 \(direct: .*got 7"),
        ((x, w, bias, gamma, beta), {"impl": -1}, "impl must be one of"),
    ]
    for args, kw, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            kd.conv1d_gn_mish(*args, **kw)
    with pytest.raises(ValueError, match=r"impl must be one of 'auto', 'fused', 'cudnn', 'direct' or its code 0..3"):
        kd.conv1d_gn_mish(x, w, bias, gamma, beta, impl="fast")
    with pytest.raises(ValueError, match=r"weight must be 3-D \(Cout, Cin, K\)"):
        kd.channels_last_weight(w[0])


def test_config_reports_the_cpp_constants():
    """The impl codes, the cost model and the layout threshold come from the build (one home: the header),
    and every code the op accepts runs (CPU: all paths compose ATen, so they agree exactly)."""
    cfg = kd.config()
    assert cfg["impl"] == {"auto": 0, "fused": 1, "cudnn": 2, "direct": 3}
    assert cfg["channels_last_min_weights"] == cfg["cost"]["cudnn_cl_small_filter"] == 1 << 19
    assert set(cfg["cost"]) == {"split_fixed_us", "split_macs_per_ps", "split_macs_per_ps_cl", "cudnn_fixed_us",
                                "cudnn_us_per_mweight", "cudnn_cl_fixed_us", "cudnn_cl_us_per_mweight",
                                "cudnn_cl_small_us", "cudnn_cl_small_filter", "cudnn_cl_always_weights"}
    assert all(v > 0 for v in cfg["cost"].values())
    args = _inputs(2, 6, 16, 9)
    expected = ref(*args)
    for name, code in cfg["impl"].items():
        _close(kd.conv1d_gn_mish(*args, impl=name), expected)
        _close(kd.conv1d_gn_mish(*args, impl=code), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arg", (0, 1, 3, 7, 9))
def test_refuses_gradients(device, arg):
    """No backward: with grad mode on, any input that requires grad is refused, naming it; without grad
    mode (no_grad, inference_mode) or with detached inputs the op runs."""
    x, w, bias, gamma, beta = _inputs(2, 6, 16, 9, device=device)
    scale, shift, res = _film(2, 16, 9, device)
    args = [x, w, bias, gamma, beta, 8, 1e-5, scale.contiguous(), shift.contiguous(), res]
    name = ("x", "weight", "bias", "gamma", "beta", "groups", "eps", "scale", "shift", "residual")[arg]
    args[arg] = args[arg].clone().requires_grad_()
    with pytest.raises(RuntimeError, match=f"conv1d_gn_mish: not differentiable, but {name} requires grad"):
        kd.conv1d_gn_mish(*args)
    expected = ref(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args])
    with torch.no_grad():
        _close(kd.conv1d_gn_mish(*args), expected)
    with torch.inference_mode():
        _close(kd.conv1d_gn_mish(*args), expected)


@pytest.mark.gpu
def test_errors_cuda():
    x, w, bias, gamma, beta = _inputs(2, 6, 16, 9, device="cuda")
    with pytest.raises(RuntimeError, match="float32 only"):
        kd.conv1d_gn_mish(x.double(), w.double(), bias.double(), gamma.double(), beta.double())
    with pytest.raises(RuntimeError, match="must be on the same device"):
        kd.conv1d_gn_mish(x, w.cpu(), bias, gamma, beta)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    op = lib(CARD).conv1d_gn_mish.default
    x, w, bias, gamma, beta = _inputs(2, 6, 16, 9, device=device)
    scale, shift, res = _film(2, 16, 9, device)
    torch.library.opcheck(op, (x, w, bias, gamma, beta, 8, 1e-5, scale, shift, res, 1))
    if device == "cuda":
        fn = torch.compile(lambda *a: kd.conv1d_gn_mish(*a) + 1, fullgraph=True)
        _close(fn(x, w, bias, gamma, beta), ref(x, w, bias, gamma, beta) + 1)


@pytest.mark.gpu
def test_spec_check():
    """kernelkit.check over the card's shapes (U-Net shapes at batch 1/64 and odd ones)."""
    result = kernelkit.check(lib(CARD).spec, device="cuda", trials=2)
    assert result.ok, result.details()


def test_compiles_for_sm90():
    info = kernelkit.load(CARD, arch="9.0", load=False)
    assert info.path.exists()
