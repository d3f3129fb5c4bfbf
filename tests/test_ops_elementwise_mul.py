"""kernelkit.ops.elementwise_mul: c = a * b with autograd (CPU on CI, CUDA under the `gpu` marker).

What every card gets (values over the spec's shapes, dtypes and strided views, gradients, opcheck, torch.compile,
CUDA graphs) is the shared battery of tests/test_cards.py; here only what is specific to the op.
"""
import pytest
import torch
from ops_helpers import DEVICES, assert_close, lib

from kernelkit import ops
from kernelkit.reference.elementwise_mul import elementwise_mul as ref
from kernelkit.reference.elementwise_mul import elementwise_mul_backward as ref_backward

CARD = "elementwise_mul"


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_and_empty(device):
    a = torch.randn(17, 1, 9, device=device)
    for b in (torch.randn(5, 1, device=device), torch.randn(9, device=device), torch.randn((), device=device)):
        assert_close(ops.elementwise_mul(a, b), ref(a, b))
        assert_close(ops.elementwise_mul(b, a), ref(b, a))
    e = ops.elementwise_mul(torch.randn(0, 3, device=device), torch.randn(3, device=device))
    assert e.shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    a = torch.randn(4, 3, device=device)
    with pytest.raises(RuntimeError, match=r"shapes of a \[4, 3\] and b \[4\] cannot be broadcast"):
        ops.elementwise_mul(a, torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match="a and b must have the same dtype"):
        ops.elementwise_mul(a.half(), a)
    with pytest.raises(RuntimeError, match="a must be a float32, float64, float16 or bfloat16 tensor, got Long"):
        ops.elementwise_mul(a.long(), a)


@pytest.mark.gpu
def test_device_mix_errors():
    a = torch.randn(10, device="cuda")
    with pytest.raises(RuntimeError, match="a and b must be on the same device"):
        ops.elementwise_mul(a, a.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_and_broadcast_reduction(device):
    a = torch.randn(3, 4, 5, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(4, 1, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(ops.elementwise_mul, (a, b))
    assert torch.autograd.gradgradcheck(ops.elementwise_mul, (a, b))
    grad = torch.randn(3, 4, 5, dtype=torch.float64, device=device)
    ga, gb = torch.autograd.grad(ops.elementwise_mul(a, b), (a, b), grad)
    ra, rb = ref_backward(grad, a.detach(), b.detach())
    assert_close(ga, ra)
    assert_close(gb, rb)


@pytest.mark.parametrize("device", DEVICES)
def test_needs_input_grad(device):
    a = torch.randn(6, 7, device=device, requires_grad=True)
    b = torch.randn(6, 7, device=device)  # no grad wanted
    ops.elementwise_mul(a, b).sum().backward()
    assert_close(a.grad, b)
    assert b.grad is None
    # the backward computes only the needed product: count elementwise_mul calls in backward
    calls = []
    op = lib(CARD).ops.elementwise_mul.default

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func == op:
                calls.append(func)
            return func(*args, **(kwargs or {}))

    y = ops.elementwise_mul(a, b)
    with Count():
        y.sum().backward()
    assert len(calls) == 1
    with torch.no_grad():
        assert ops.elementwise_mul(a, b).grad_fn is None
    assert ops.elementwise_mul(a.detach(), b).grad_fn is None


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_with_backward(device):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(a, b):
        return ops.elementwise_mul(a, b).sin().sum()

    a = torch.randn(8, 16, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True)
    f(a, b).backward()
    ad, bd = a.detach(), b.detach()
    assert_close(a.grad, (ad * bd).cos() * bd)
    assert_close(b.grad, ((ad * bd).cos() * ad).sum(0), dtype=torch.float32)
