"""Instant kernels on a GPU: results for each argument kind, templates, streams, CUDA graphs, large shared
memory, hot reload, an instant kernel wrapped as a torch op (opcheck, torch.compile, graphs), and a card whose
device code NVRTC compiles (Spec.nvrtc_sources): its reference, a kernel edit without a rebuild, graphs."""
import shutil
import textwrap
import time
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.errors import KernelkitError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SRC = textwrap.dedent("""\
    #include <cuda_fp16.h>
    #include <cuda_bf16.h>
    extern "C" __global__ void scale(const float* __restrict__ x, float* out, float a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a * x[i];
    }
    extern "C" __global__ void mixed(const __half* h, __half hv, const __nv_bfloat16* b, __nv_bfloat16 bv,
                                     const int* ip, int iv, long long lv, unsigned char uc, bool flag, double dv,
                                     float* out, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = __half2float(h[i]) * __half2float(hv) + __bfloat162float(b[i]) * __bfloat162float(bv)
                          + ip[i] * iv + (float)(lv - 1099511627776LL) + uc + (flag ? 1.0f : 0.0f) + (float)dv;
    }
    template <typename T> __global__ void axpy(T* y, const T* x, T a, long long n) {
      long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
      if (i < n) y[i] += a * x[i];
    }
    extern "C" __global__ void reverse_block(const float* x, float* out, int n) {
      extern __shared__ float tile[];
      int i = threadIdx.x;
      for (int j = i; j < n; j += blockDim.x) tile[j] = x[j];
      __syncthreads();
      for (int j = i; j < n; j += blockDim.x) out[j] = tile[n - 1 - j];
    }
    """)


@pytest.fixture(scope="module")
def mod():
    return kernelkit.load_kernels(SRC, "gpu_demo", name_expressions=["axpy<float>", "axpy<double>"])


def blocks(n, b=256):
    return (n + b - 1) // b


def test_float_kernel_matches_torch(mod):
    n = 10_007
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    mod.scale[blocks(n), 256](x, out, 1.5, n)
    torch.testing.assert_close(out, 1.5 * x, rtol=0, atol=0)


def test_every_argument_kind_is_converted_to_the_declared_type(mod):
    n = 1000
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(n, device="cuda", generator=g).half()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    ip = torch.randint(-5, 5, (n,), device="cuda", generator=g, dtype=torch.int32)
    out = torch.full((n,), float("nan"), device="cuda")
    mod.mixed[blocks(n), 256](h, 0.5, b, -2.0, ip, 3, 2 ** 40 + 7, 200, True, 0.25, out, n)
    want = h.float() * 0.5 + b.float() * -2.0 + ip.float() * 3 + 7 + 200 + 1 + 0.25
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype,expr", [(torch.float32, "axpy<float>"), (torch.float64, "axpy<double>")])
def test_template_instantiations(mod, dtype, expr):
    n = 4099
    x, y = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    want = y + 0.75 * x
    mod[expr][blocks(n), 256](y, x, 0.75, n)
    torch.testing.assert_close(y, want)


def test_wrong_arguments_are_refused_before_launch(mod):
    x = torch.randn(8, device="cuda")
    with pytest.raises(TypeError, match="argument 1 'x' expects a torch.float32 tensor, got torch.float64"):
        mod.scale[1, 32](x.double(), x, 1.0, 8)
    with pytest.raises(ValueError, match="not contiguous"):
        mod.scale[1, 32](torch.randn(8, 2, device="cuda")[:, 0], x, 1.0, 8)
    with pytest.raises(TypeError, match="takes 4 argument"):
        mod.scale[1, 32](x, x, 1.0)


def test_runs_on_the_current_stream(mod):
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    mod.scale[blocks(n), 256](x, out, 3.0, n)  # loaded and prepared: the launch below only enqueues
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # about half a second of the side stream: work put on it waits
        mod.scale[blocks(n), 256](x, out, 3.0, n)
        done = torch.cuda.Event()
        done.record(side)
    assert not done.query()  # queued behind the sleep on the side stream, not run on the default stream
    side.synchronize()
    torch.testing.assert_close(out, 3.0 * x, rtol=0, atol=0)


def test_cuda_graph_capture_and_replay(mod):
    n = 5000
    x = torch.randn(n, device="cuda")
    out = torch.zeros_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mod.scale[blocks(n), 256](x, out, 2.0, n)  # warm-up on a side stream, as torch's docs ask
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.scale[blocks(n), 256](x, out, 2.0, n)
    for _ in range(3):
        x.copy_(torch.randn(n, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 2.0 * x, rtol=0, atol=0)


def test_large_dynamic_shared_memory(mod):
    n = 40_000  # 160 KB of floats: above the 48 KB default, within the H100's 227 KB
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    mod.reverse_block[1, 1024, n * 4](x, out, n)
    torch.testing.assert_close(out, x.flip(0), rtol=0, atol=0)
    with pytest.raises(ValueError, match="shared_mem=.*more than this GPU allows"):
        mod.reverse_block[1, 1024, 1 << 20](x, out, n)


def test_hot_reload_updates_the_module_in_place():
    src = 'extern "C" __global__ void k(float* o) { o[threadIdx.x] = 1.0f; }'
    m = kernelkit.load_kernels(src, "reload_demo")
    launch = m.k[1, 32]
    out = torch.zeros(32, device="cuda")
    launch(out)
    assert out.eq(1).all()
    kernelkit.load_kernels(src.replace("1.0f", "2.0f"), "reload_demo")
    launch(out)  # the same launch object runs the new build
    assert out.eq(2).all()


def test_a_wrapped_torch_op_passes_opcheck_compile_and_graphs():
    src = 'extern "C" __global__ void sq(const float* x, float* o, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = x[i] * x[i]; }'
    m = kernelkit.load_kernels(src, "square")

    @torch.library.custom_op("kk_instant_test::square", mutates_args=())
    def square(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        m.sq[blocks(x.numel()), 256](x, out, x.numel())
        return out

    @square.register_fake
    def _(x):
        return torch.empty_like(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x

    square.register_autograd(backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))
    x = torch.randn(300, device="cuda", requires_grad=True)
    torch.library.opcheck(square, (x,))
    torch.testing.assert_close(torch.compile(square, fullgraph=True)(x), x * x)
    y = torch.randn(300, device="cuda")
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        square(y)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        z = square(y)
    y.copy_(torch.randn(300, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(z, y * y)
    kernelkit.load_kernels(src.replace("x[i] * x[i]", "x[i] * x[i] * x[i]"), "square")  # reload: the op follows
    torch.testing.assert_close(square(y), y ** 3)


def test_a_build_for_another_arch_is_refused_with_advice():
    major, minor = torch.cuda.get_device_capability()
    other = "8.0" if (major, minor) != (8, 0) else "9.0"
    m = kernelkit.load_kernels('extern "C" __global__ void k(int* o) { *o = 1; }', "other_arch", arch=other)
    with pytest.raises(KernelkitError, match="but the current GPU is"):
        m.k[1, 1](torch.zeros(1, dtype=torch.int32, device="cuda"))


def test_the_documented_op_recipe_passes_kernelkit_check():
    """docs/instant.md's recipe, as written there."""
    mod = kernelkit.load_kernels(r'''
    extern "C" __global__ void scale(const float* __restrict__ x, float* out, float a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a * x[i];
    }''', name="scaling")

    @torch.library.custom_op("kk_instant_doc::scale", mutates_args=())
    def scale(x: torch.Tensor, a: float) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        mod.scale[(x.numel() + 255) // 256, 256](x, out, a, x.numel())
        return out

    @scale.register_fake
    def _(x, a):
        return torch.empty_like(x)

    scale.register_autograd(lambda ctx, g: (ctx.a * g, None),
                            setup_context=lambda ctx, inputs, output: setattr(ctx, "a", inputs[1]))

    result = kernelkit.check(scale, lambda x, a: a * x, inputs=lambda shape, dtype, device, generator=None:
                             (torch.randn(shape, dtype=dtype, device=device, generator=generator), 2.0),
                             dtypes=[torch.float32], device="cuda")
    assert result.ok, result


# ------------------------------------------------------------------ a card whose kernels NVRTC compiles
NVRTC_CARD = "kk_scale_nvrtc"


@pytest.fixture
def nvrtc_card(tmp_path, monkeypatch):
    """A copy of the fixture card to edit, built for the current GPU."""
    for var in ("KERNELKIT_ARCH", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    d = tmp_path / "cards"
    shutil.copytree(Path(__file__).parent / "fixtures" / "cards_nvrtc", d)
    return d


def test_a_card_with_nvrtc_kernels_matches_its_reference(nvrtc_card):
    lib = kernelkit.load(NVRTC_CARD, kernels_dir=nvrtc_card)
    assert lib.nvrtc.problem == "" and {e[0] for e in lib.nvrtc.entries} == {"scale<float>", "scale<double>"}
    spec = lib.spec
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for shape in spec.shapes:
            x, a = spec.make_inputs(shape, dtype, "cuda", g)
            torch.testing.assert_close(lib.kk_scale_nvrtc(x, a), spec.reference(x, a), rtol=0, atol=0)
    result = kernelkit.check(NVRTC_CARD, kernels_dir=nvrtc_card, device="cuda")
    assert result.ok, result


def test_a_card_kernel_edit_reloads_without_rebuilding_the_binding(nvrtc_card):
    lib = kernelkit.load(NVRTC_CARD, kernels_dir=nvrtc_card)
    x = torch.randn(4097, device="cuda")
    torch.testing.assert_close(lib.kk_scale_nvrtc(x, 2.0), 2.0 * x, rtol=0, atol=0)
    kernelkit.refresh()  # cards other tests of this worker left edited are rebuilt now, not in the count below
    path, so, stats = nvrtc_card / f"{NVRTC_CARD}.cu", lib.path, dict(kernelkit.STATS)
    original = path.read_text()
    path.write_text(original.replace("out[i] = a * x[i];", "out[i] = a * x[i] + T(1);"))
    t0 = time.perf_counter()
    changed = kernelkit.refresh()
    y = lib.kk_scale_nvrtc(x, 2.0)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    assert NVRTC_CARD in changed and kernelkit.library(NVRTC_CARD) is lib and lib.path == so
    assert (kernelkit.STATS["compiles"], kernelkit.STATS["links"]) == (stats["compiles"], stats["links"])
    torch.testing.assert_close(y, 2.0 * x + 1, rtol=0, atol=0)
    print(f"card kernel edit -> usable op (NVRTC, binding not rebuilt): {seconds * 1e3:.1f} ms")
    path.write_text(original)  # undone: the first build's loaded kernels are handed back
    assert NVRTC_CARD in kernelkit.refresh()
    torch.testing.assert_close(lib.kk_scale_nvrtc(x, 2.0), 2.0 * x, rtol=0, atol=0)


def test_a_card_with_nvrtc_kernels_in_a_cuda_graph(nvrtc_card):
    lib = kernelkit.load(NVRTC_CARD, kernels_dir=nvrtc_card)
    x = torch.randn(5000, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lib.kk_scale_nvrtc(x, 3.0)  # warm-up on a side stream, as torch's docs ask
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = lib.kk_scale_nvrtc(x, 3.0)
    for _ in range(2):
        x.copy_(torch.randn(5000, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 3.0 * x, rtol=0, atol=0)


# A card whose C++ binding launches an NVRTC kernel with more dynamic shared memory than the 48 KB default;
# the same kernel as reverse_block above, so the reference is a flip.
SMEM_CARD = {
    "kk_smem_nvrtc.cu": """\
        extern "C" __global__ void reverse_block(const float* x, float* out, int n) {
          extern __shared__ float tile[];
          for (int j = threadIdx.x; j < n; j += blockDim.x) tile[j] = x[j];
          __syncthreads();
          for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = tile[n - 1 - j];
        }
        """,
    "kk_smem_nvrtc.h": """\
        #pragma once
        #ifdef KERNELKIT_BINDING
        #include <kernelkit/kernels.h>
        #include <kernelkit/torch_glue.h>

        inline at::Tensor kk_smem_nvrtc(const at::Tensor& x) {
          TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 1,
                      "kk_smem_nvrtc: x must be a 1-d CUDA float32 tensor");
          const at::Tensor xc = x.contiguous();
          at::Tensor out = at::empty_like(xc);
          const int n = static_cast<int>(xc.numel());
          c10::cuda::CUDAGuard guard(xc.device());
          kk::kernel("reverse_block").launch(1, 1024, size_t(n) * sizeof(float), at::cuda::getCurrentCUDAStream(),
                                             xc.const_data_ptr<float>(), out.mutable_data_ptr<float>(), n);
          return out;
        }

        KERNELKIT_LIBRARY(m) {
          m.def("kk_smem_nvrtc(Tensor x) -> Tensor");
          m.impl("kk_smem_nvrtc", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(kk_smem_nvrtc)));
        }
        #endif
        """,
    "kk_smem_nvrtc.py": """\
        import torch
        import kernelkit

        SPEC = kernelkit.Spec(name="kk_smem_nvrtc", reference=lambda x: x.flip(0),
                              make_inputs=lambda shape, dtype=torch.float32, device="cpu", generator=None:
                                  (kernelkit.randn(shape, dtype, device, generator),),
                              dtypes=(torch.float32,), shapes=((40_000,),), nvrtc_sources=["kk_smem_nvrtc.cu"])
        """,
}


@pytest.fixture(scope="module")
def smem_card(tmp_path_factory):
    d = tmp_path_factory.mktemp("smem_cards")
    for name, text in SMEM_CARD.items():
        (d / name).write_text(textwrap.dedent(text))
    return kernelkit.load("kk_smem_nvrtc", kernels_dir=d)


def test_a_card_launches_an_nvrtc_kernel_with_more_than_48_kb_of_shared_memory(smem_card):
    x = torch.randn(40_000, device="cuda")  # 160 KB of dynamic shared memory
    torch.testing.assert_close(smem_card.kk_smem_nvrtc(x), x.flip(0), rtol=0, atol=0)
    too_big = torch.randn(1 << 18, device="cuda")  # 1 MB: more than any GPU gives one block
    with pytest.raises(RuntimeError, match=r"reverse_block.*shared_mem=1048576 bytes is more than this GPU allows"):
        smem_card.kk_smem_nvrtc(too_big)
    torch.testing.assert_close(smem_card.kk_smem_nvrtc(x), x.flip(0), rtol=0, atol=0)  # the failure broke nothing


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_card_and_instant_kernels_run_on_a_gpu_that_is_not_the_current_one(smem_card, mod):
    torch.cuda.set_device(0)
    x = torch.randn(40_000, device="cuda:1")
    torch.testing.assert_close(smem_card.kk_smem_nvrtc(x), x.flip(0), rtol=0, atol=0)
    out = torch.empty_like(x)
    mod.scale[blocks(x.numel()), 256](x, out, 2.0, x.numel())
    torch.testing.assert_close(out, 2.0 * x, rtol=0, atol=0)
    assert torch.cuda.current_device() == 0
