"""<kernelkit/elementwise.cuh> picks its access shape by GPU and operand size (1 MiB and 32 MiB boundaries):
every shape, with 1, 2 and 3 inputs, on sizes just either side of each boundary with ragged tails, and on
sizes that every tile divides (the unmasked kernel), against the references (CPU on CI for the same sizes,
CUDA under `gpu`)."""
import pytest
import torch
from ops_helpers import assert_close, lib

from kernelkit import ops
from kernelkit.kernels import ddpm_step as kd  # the card module: its public ddpm_step
from kernelkit.reference.ddpm_step import DDPMScheduler
from kernelkit.reference.ddpm_step import ddpm_step as ref_ddpm
from kernelkit.reference.elementwise_mul import elementwise_mul as ref_mul
from kernelkit.reference.sigmoid import sigmoid as ref_sigmoid
from kernelkit.reference.sigmoid import sigmoid_backward as ref_sigmoid_backward
from kernelkit.reference.vector_add import vector_add as ref_add

MIB = 1 << 20


def sizes(dtype):
    """Element counts just below and above each operand-size boundary, none a multiple of a tile."""
    per_mib = MIB // torch.empty((), dtype=dtype).element_size()
    return [per_mib - 3, per_mib + 5, 32 * per_mib - 3, 32 * per_mib + 5]


def exact_sizes(dtype):
    """Element counts that every tile (at most 4096 elements of 4 bytes, 8192 of 2) divides, small and at
    each boundary, and one (512 elements of 4 bytes) that only the 8-byte tile divides."""
    per_mib = MIB // torch.empty((), dtype=dtype).element_size()
    return [512 * 4 // torch.empty((), dtype=dtype).element_size(), 1 << 14, 1 << 16, per_mib, 32 * per_mib]


def poisoned(n, dtype, device):
    """A NaN-filled buffer with guard elements around an n-element output view."""
    buf = torch.full((n + 16,), float("nan"), dtype=dtype, device=device)
    return buf, buf[8:8 + n]


def guards_intact(buf, n):
    return bool(buf[:8].isnan().all() and buf[8 + n:].isnan().all())


# (device, sizes): the CPU loop has no tiles, so whole tiles are a CUDA case only
CASES = [("cpu", "ragged"), pytest.param("cuda", "ragged", marks=pytest.mark.gpu),
         pytest.param("cuda", "whole tiles", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device, which", CASES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16), ids=str)
def test_every_shape_and_tail(device, dtype, which):
    g = torch.Generator().manual_seed(3)
    coeffs = DDPMScheduler().coefficients(device)
    t = torch.tensor(37, device=device)
    for n in (sizes if which == "ragged" else exact_sizes)(dtype):
        a, b, c = (torch.randn(n, generator=g).to(device, dtype) for _ in range(3))
        buf, out = poisoned(n, dtype, device)
        ops.vector_add(a, b, alpha=0.5, out=out)
        assert_close(out, ref_add(a, b, 0.5), lib("vector_add").spec)
        assert guards_intact(buf, n), n
        assert_close(ops.elementwise_mul(a, b), ref_mul(a, b), lib("elementwise_mul").spec)
        s = ops.sigmoid(a)
        assert_close(s, ref_sigmoid(a), lib("sigmoid").spec)
        assert_close(ops.sigmoid_backward(b, s), ref_sigmoid_backward(b, s), lib("sigmoid").spec)
        assert_close(kd.ddpm_step(a, t, b, coeffs, c), ref_ddpm(a, t, b, coeffs, c), lib("ddpm_step").spec)
