"""kernelkit.ops.vector_add: c = a + alpha * b (CPU on CI, CUDA under the `gpu` marker).

What every card gets (values over the spec's shapes, dtypes and strided views, gradients, opcheck, torch.compile,
CUDA graphs) is the shared battery of tests/test_cards.py; here only what is specific to the op.
"""
import shutil

import pytest
import torch
from ops_helpers import DEVICES, FLOAT_DTYPES, assert_close, lib, misaligned, noncontig

import kernelkit
from kernelkit import ops
from kernelkit.reference.vector_add import vector_add as ref

CARD = "vector_add"


def spec():
    return lib(CARD).spec


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_alpha(device, dtype):
    """alpha other than 1 (the shared battery's inputs leave it at its default), returned and through out=."""
    g = torch.Generator().manual_seed(0)
    a, b = spec().make_inputs((33, 65), dtype=dtype, device=device, generator=g)
    for alpha in (0.75, -2):
        assert_close(ops.vector_add(a, b, alpha=alpha), ref(a, b, alpha), spec())
        out = torch.full(a.shape, float("nan"), dtype=dtype, device=device)  # poisoned
        assert ops.vector_add(a, b, alpha=alpha, out=out) is out
        assert_close(out, ref(a, b, alpha), spec())


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_noncontiguous_misaligned(device):
    a = torch.randn(33, 65, device=device)
    for b in (torch.randn(65, device=device), torch.randn(33, 1, device=device), torch.randn((), device=device)):
        assert_close(ops.vector_add(a, b, alpha=0.5), ref(a, b, 0.5))
        assert_close(ops.vector_add(b, a), ref(b, a))
    at, bt = a.t(), torch.randn(33, 65, device=device).t()  # transposed views
    assert_close(ops.vector_add(at, bt), ref(at, bt))
    an, bn = noncontig(torch.randn(1001, device=device)), noncontig(torch.randn(1001, device=device))
    assert_close(ops.vector_add(an, bn, alpha=3), ref(an, bn, 3))
    am, bm = misaligned(torch.randn(4099, device=device)), misaligned(torch.randn(4099, device=device))
    assert_close(ops.vector_add(am, bm), ref(am, bm))
    out = noncontig(torch.full((1001,), float("nan"), device=device))
    ops.vector_add(an, bn, out=out)
    assert_close(out, ref(an, bn))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_every_alignment_and_tail(device, dtype):
    """Each pointer offset within a 16-byte vector (16-, 8-byte and scalar accesses on the GPU) and sizes
    around the vector and tile widths: every element right, nothing written outside `out`."""
    g = torch.Generator().manual_seed(1)
    per_vec = 16 // torch.empty((), dtype=dtype).element_size()
    for n in (1, per_vec + 3, 4 * 1024 + 5, 3 * 512 * 8 + 7):
        for off in range(per_vec):
            a = torch.randn(n + off, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)[off:]
            b = torch.randn(n + off, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)[off:]
            buf = torch.full((n + per_vec + 2,), float("nan"), dtype=dtype, device=device)
            out = buf[off + 1:off + 1 + n]
            ops.vector_add(a, b, alpha=0.5, out=out)
            assert_close(out, ref(a, b, 0.5), spec())
            assert buf[:off + 1].isnan().all() and buf[off + 1 + n:].isnan().all(), (n, off)


@pytest.mark.parametrize("device", DEVICES)
def test_out_may_alias_an_input(device):
    a, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
    expected = ref(a, b, 2)
    ops.vector_add(a, b, alpha=2, out=a)  # out aliasing an input exactly is fine
    assert_close(a, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    a = torch.randn(10, device=device)
    with pytest.raises(RuntimeError, match="a and b must have the same dtype"):
        ops.vector_add(a, a.double())
    with pytest.raises(RuntimeError, match="b must be a float32, float64, float16 or bfloat16 tensor"):
        ops.vector_add(a, torch.ones(10, dtype=torch.int32, device=device))
    with pytest.raises(RuntimeError, match=r"shapes of a \[10\] and b \[11\] cannot be broadcast"):
        ops.vector_add(a, torch.randn(11, device=device))
    with pytest.raises(RuntimeError, match="out must have shape"):
        ops.vector_add(a, a, out=torch.empty(9, device=device))
    with pytest.raises(RuntimeError, match="out must have dtype"):
        ops.vector_add(a, a, out=torch.empty(10, dtype=torch.float64, device=device))
    with pytest.raises(RuntimeError, match="alpha must be a real number"):
        ops.vector_add(a, a, alpha=1j)
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        ops.vector_add(a.requires_grad_(), a, out=torch.empty(10, device=device))


@pytest.mark.gpu
def test_device_mix_errors():
    a = torch.randn(10, device="cuda")
    with pytest.raises(RuntimeError, match="a and b must be on the same device"):
        ops.vector_add(a, a.cpu())
    with pytest.raises(RuntimeError, match="a and b must be on the same device"):
        ops.vector_add(a.cpu(), a)
    with pytest.raises(RuntimeError, match="out must be on"):
        ops.vector_add(a, a, out=torch.empty(10))
    if torch.cuda.device_count() > 1:
        with pytest.raises(RuntimeError, match="same device"):
            ops.vector_add(a, a.to("cuda:1"))
        b = torch.randn(10, device="cuda:1")
        assert_close(ops.vector_add(b, b), ref(b, b))  # runs on cuda:1 under a device guard


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    op = lib(CARD).ops
    a = torch.randn(5, 7, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, device=device, requires_grad=True)
    torch.library.opcheck(op.vector_add.default, (a, b, 2.5))  # broadcast, alpha: beyond the shared battery's
    out = torch.empty(5, 7, dtype=torch.float64, device=device)
    torch.library.opcheck(op.vector_add_out.default, (a.detach(), b.detach(), -1.0, out))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    a = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: ops.vector_add(x, y, alpha=-1.5), (a, b))
    assert torch.autograd.gradgradcheck(lambda x, y: ops.vector_add(x, y, alpha=-1.5), (a, b))
    b2 = b.detach()
    ops.vector_add(a, b2).sum().backward()
    assert b2.grad is None and torch.equal(a.grad, torch.ones_like(a))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(a, b, out):
        c = ops.vector_add(a, b, alpha=2) * 3
        ops.vector_add(c, a, out=out)
        return c

    a = torch.randn(8, 16, device=device, requires_grad=True)
    b = torch.randn(16, device=device)
    out = torch.empty(8, 16, device=device)
    with torch.no_grad():
        c = f(a.detach(), b, out)
    assert_close(c, (a.detach() + 2 * b) * 3)
    assert_close(out, c + a.detach())

    @torch.compile(fullgraph=True)
    def g(a, b):
        return ops.vector_add(a, b, alpha=0.5).square().sum()

    g(a, b).backward()
    assert_close(a.grad, 2 * (a.detach() + 0.5 * b))


@pytest.mark.gpu
def test_cuda_graph_capture_replay():
    a, b = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    out = torch.full_like(a, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on a side stream
        ops.vector_add(a, b, alpha=2, out=out)
        c = ops.vector_add(a, b)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.vector_add(a, b, alpha=2, out=out)
        c = ops.vector_add(a, b)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, ref(a, b, 2))
        assert_close(c, ref(a, b))


@pytest.mark.gpu
@pytest.mark.slow
def test_more_than_2_31_elements(big_gpu_memory):
    n = (1 << 31) + 4099  # past int32 indexing, not a multiple of the vector width
    big_gpu_memory(4 * 2 * n)
    a = torch.rand(n, dtype=torch.float16, device="cuda") + 0.5
    b = torch.rand(n, dtype=torch.float16, device="cuda") + 0.5
    c = ops.vector_add(a, b, alpha=2)
    step = 1 << 28
    for i in range(0, n, step):  # every element, in chunks (torch.add on the whole would need more memory)
        assert_close(c[i:i + step], torch.add(a[i:i + step], b[i:i + step], alpha=2))
    del c
    a = a[1:]  # misaligned: the scalar path past 2^31 too
    c = ops.vector_add(a, b[1:])
    assert_close(c[-(1 << 20):], torch.add(a[-(1 << 20):], b[-(1 << 20):]))


@pytest.mark.gpu
@pytest.mark.slow
def test_either_side_of_the_32_bit_index_limit(big_gpu_memory):
    """<kernelkit/elementwise.cuh> indexes in 32 bits below kEwSmallIndexLimit = 2^31 - 2^16 elements and in
    64 bits from there: the last elements on both sides of the switch, aligned and not."""
    limit = (1 << 31) - (1 << 16)
    big_gpu_memory(2 * 3 * (limit + 8))
    a = torch.rand(limit + 8, dtype=torch.float16, device="cuda") + 0.5
    b = torch.rand(limit + 8, dtype=torch.float16, device="cuda") + 0.5
    tail = 1 << 20
    for n in (limit - 1, limit):
        for shift in (0, 1):  # 16-byte aligned, then one element off (element by element)
            x, y = a[shift:shift + n], b[shift:shift + n]
            c = ops.vector_add(x, y, alpha=2)
            assert_close(c[-tail:], torch.add(x[-tail:], y[-tail:], alpha=2))
            assert_close(c[:tail], torch.add(x[:tail], y[:tail], alpha=2))
            del c


def _hot_reload(tmp_path, edit_file, old, new):
    """Load an edited copy of the card; kernelkit.ops must call it, then the original again."""
    kdir = lib(CARD).card.dir
    for f in ("vector_add.cu", "vector_add.h", "vector_add.py"):
        shutil.copy(kdir / f, tmp_path / f)
    p = tmp_path / edit_file
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    return kernelkit.load(CARD, kernels_dir=tmp_path)


@pytest.mark.parametrize("device", DEVICES)
def test_hot_reload_calls_new_code(tmp_path, device):
    a, b = torch.randn(100, device=device), torch.randn(100, device=device)
    assert_close(ops.vector_add(a, b), a + b)
    if device == "cpu":  # the CPU loop's math lives in the header (a binding rebuild)
        new = _hot_reload(tmp_path, "vector_add.h", "return a + alpha * b;", "return a - alpha * b;")
        expected = a - b
    else:  # CUDA: edit only the device TU (the fast path: the cached binding object is reused)
        new = _hot_reload(tmp_path, "vector_add.cu", "AddOp<A>{static_cast<A>(alpha)}", "AddOp<A>{static_cast<A>(-alpha)}")
        expected = a - b
    try:
        assert kernelkit.library(CARD) is new
        assert_close(ops.vector_add(a, b), expected)
    finally:
        kernelkit.load(CARD)  # back to the built-in card
    assert_close(ops.vector_add(a, b), a + b)


BROADCAST_MEMORY = """
import resource, torch, kernelkit
a, b = torch.randn(8192, 1), torch.randn(1, 8192)
out = kernelkit.ops.vector_add(a[:16], b)  # loads the card (and its allocations) before the measurement
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = kernelkit.ops.vector_add(a, b)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
assert torch.equal(out, a + b), "wrong sum"
print(grown / out.nbytes)
"""


def test_cpu_broadcasting_reads_views_without_copying():
    """A broadcast operand is read in place: peak memory grows by the output, not by a copy of each input
    expanded to the output's shape (three times as much)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", BROADCAST_MEMORY], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1.5  # the 256 MB output; copies of a and b would add 512 MB more
