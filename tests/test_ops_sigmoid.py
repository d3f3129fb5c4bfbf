"""kernelkit.ops.sigmoid: stable forward, fused backward from the output (CPU on CI, CUDA under `gpu`).

What every card gets (values over the spec's shapes, dtypes and strided views, gradients, opcheck, torch.compile,
CUDA graphs) is the shared battery of tests/test_cards.py; here only what is specific to the op.
"""
import pytest
import torch
from ops_helpers import DEVICES, FLOAT_DTYPES, assert_close, lib, misaligned

from kernelkit import ops
from kernelkit.reference.sigmoid import sigmoid as ref
from kernelkit.reference.sigmoid import sigmoid_backward as ref_backward

CARD = "sigmoid"


def spec():
    return lib(CARD).spec


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_misaligned_input(device, dtype):
    """A data pointer off the vector width (the scalar path; the shared battery's buffers are aligned)."""
    (x,) = spec().make_inputs((4097,), dtype=dtype, device=device, generator=torch.Generator().manual_seed(2))
    assert_close(ops.sigmoid(misaligned(x)), ref(x), spec())


@pytest.mark.parametrize("device", DEVICES)
def test_float32_error_bound(device):
    """Relative error below 8 * 2^-24 (a few ulp) wherever the result is a normal float: the GPU's
    hardware reciprocal and expf are 2 ulp each."""
    x = torch.cat([torch.linspace(-87.0, 87.0, 1 << 18), torch.randn(1 << 16) * 4]).to(device)
    exact = torch.sigmoid(x.double())
    rel = ((ops.sigmoid(x).double() - exact).abs() / exact).max().item()
    assert rel < 8 * 2.0 ** -24, rel


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_extremes_exact(device, dtype):
    x = torch.tensor([-1e5, -1e4, -200.0, -30.0, -0.0, 0.0, 30.0, 200.0, 1e4, 1e5], device=device)
    if dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.cat([x, torch.tensor([-float("inf"), float("inf")], device=device)])
    x = x.to(dtype)  # (float16 turns ±1e4 and ±1e5 into ±inf: covered by the inf case)
    y = ops.sigmoid(x)
    assert torch.isfinite(y).all()
    assert (y[x >= 200] == 1).all() and (y[x <= -1e4] == 0).all() and (y[x.abs() == 30] - (x[x.abs() == 30] > 0).to(dtype)).abs().max().double() < 1e-12
    assert (y[x == 0] == 0.5).all()
    assert ops.sigmoid(torch.tensor([float("nan")], device=device).to(dtype)).isnan().all()
    # the gradient at the extremes is exactly 0, never NaN
    xg = torch.tensor([-1e5, 1e5], dtype=torch.float64, device=device, requires_grad=True)
    ops.sigmoid(xg).sum().backward()
    assert torch.equal(xg.grad, torch.zeros_like(xg))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x = torch.randn(6, 7, dtype=torch.float64, device=device, requires_grad=True) * 3
    x = x.detach().requires_grad_()
    assert torch.autograd.gradcheck(ops.sigmoid, (x,))
    assert torch.autograd.gradgradcheck(ops.sigmoid, (x,))
    g = torch.randn(6, 7, dtype=torch.float64, device=device, requires_grad=True)
    s = torch.rand(6, 7, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(ops.sigmoid_backward, (g, s))
    (gx,) = torch.autograd.grad(ops.sigmoid(x), x, g.detach())
    (gt,) = torch.autograd.grad(torch.sigmoid(x), x, g.detach())
    assert_close(gx, gt)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_uses_fused_kernel_on_saved_output(device):
    x = torch.randn(100, device=device, requires_grad=True)
    y = ops.sigmoid(x)
    seen = []
    bw = lib(CARD).ops.sigmoid_backward.default

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Spy():
        y.sum().backward()
    assert bw in seen
    assert not any(f in seen for f in (lib(CARD).ops.sigmoid.default, torch.ops.aten.mul.Tensor, torch.ops.aten.sub.Tensor,
                                       torch.ops.aten.rsub.Scalar))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    with pytest.raises(RuntimeError, match="x must be a float32, float64, float16 or bfloat16 tensor, got Int"):
        ops.sigmoid(torch.ones(3, dtype=torch.int32, device=device))
    x = torch.randn(3, device=device)
    with pytest.raises(RuntimeError, match="grad and out must have the same dtype"):
        ops.sigmoid_backward(x, x.double())
    assert ops.sigmoid(torch.randn(0, 4, device=device)).shape == (0, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_op(device):
    """sigmoid_backward (the shared battery's opcheck reaches only the forward op)."""
    x = torch.randn(5, 7, dtype=torch.float64, device=device)
    g = torch.randn(5, 7, dtype=torch.float64, device=device, requires_grad=True)
    torch.library.opcheck(lib(CARD).ops.sigmoid_backward.default, (g, torch.sigmoid(x).detach()))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(x):
        return (ops.sigmoid(x) * 2).sum()

    x = torch.randn(64, device=device, requires_grad=True)
    f(x).backward()
    s = torch.sigmoid(x.detach())
    assert_close(x.grad, 2 * s * (1 - s))


@pytest.mark.gpu
def test_cuda_graph_capture_replay():
    x = torch.randn(4097, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.sigmoid(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.sigmoid(x)
        gx = ops.sigmoid_backward(x, y)
    for _ in range(3):
        x.copy_(torch.randn_like(x) * 5)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(y, torch.sigmoid(x))
        assert_close(gx, ref_backward(x, torch.sigmoid(x)))


@pytest.mark.gpu
@pytest.mark.slow
def test_more_than_2_31_elements(big_gpu_memory):
    n = (1 << 31) + 7
    big_gpu_memory(3 * 2 * n)
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    y = ops.sigmoid(x)
    step = 1 << 28
    for i in range(0, n, step):
        assert_close(y[i:i + step], torch.sigmoid(x[i:i + step]))
