"""Instant kernels without a GPU: signatures read from source, NVRTC compiles for arch 9.0 into the cache
(cold, hit, edit, header edit, errors mapped to lines), and the launcher's argument packing."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="instant kernels need cuda-bindings (torch's CUDA 13 wheels bring it)")

import kernelkit  # noqa: E402
from kernelkit.errors import BuildError, KernelkitError  # noqa: E402
from kernelkit.instant import launcher  # noqa: E402
from kernelkit.instant.signature import declarations, kernel_signatures, parse_param

SRC = textwrap.dedent("""\
    #include "offset.h"
    extern "C" __global__ void __launch_bounds__(256) scale(const float* __restrict__ x, float* out, float a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a * x[i] + OFFSET;
    }
    template <typename T, int UNROLL = 1>
    __global__ void axpy(T* y, const T* x, T a, long long n) {
      long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
      if (i < n) y[i] += a * x[i];
    }
    """)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module (compiles are shared between its tests), and a directory for headers."""
    root = tmp_path_factory.mktemp("instant")
    old = os.environ.get("KERNELKIT_CACHE_DIR")
    os.environ["KERNELKIT_CACHE_DIR"] = str(root / "cache")
    (root / "offset.h").write_text("#define OFFSET 0.0f\n")
    yield root
    if old is None:
        os.environ.pop("KERNELKIT_CACHE_DIR", None)
    else:
        os.environ["KERNELKIT_CACHE_DIR"] = old


def load(root, src=SRC, name="demo", **kw):
    kw.setdefault("name_expressions", ["axpy<float>", "axpy<double, 4>"])
    return kernelkit.load_kernels(src, name, arch="9.0", include_paths=[root], **kw)


# ------------------------------------------------------------------------------------------ signatures
@pytest.mark.parametrize("raw,ctype,code,dtype", [
    ("const float* __restrict__ x", "float*", "p", torch.float32),
    ("float *out", "float*", "p", torch.float32),
    ("double a", "double", "d", None),
    ("float a", "float", "f", None),
    ("__half h", "__half", "h", None),
    ("const __nv_bfloat16* b", "__nv_bfloat16*", "p", torch.bfloat16),
    ("unsigned int n", "unsigned int", "I", None),
    ("int64_t n", "int64_t", "l", None),
    ("size_t n", "size_t", "L", None),
    ("bool flag", "bool", "b", None),
    ("const uint8_t* mask", "uint8_t*", "p", torch.uint8),
    ("void* anything", "void*", "p", None),
    ("float** table", "float**", "p", None),
    ("int data[]", "int*", "p", torch.int32),
    ("Params p", "Params", "?", None),
])
def test_parameters_are_read_with_their_types(raw, ctype, code, dtype):
    p = parse_param(raw, 0, {})
    assert (p.ctype, p.code, p.dtype) == (ctype, code, dtype)


def test_declarations_templates_and_linkage():
    src = SRC + textwrap.dedent("""\
        // __global__ void in_a_comment(int x)
        extern "C" {
        __global__ void in_block(int n) {}
        }
        __global__ void cpp_linkage(void);
        __global__ void cpp_linkage(void) {}
        """)
    d = declarations(src)
    assert set(d) == {"scale", "axpy", "in_block", "cpp_linkage"}
    assert d["scale"].extern_c and d["in_block"].extern_c and not d["cpp_linkage"].extern_c
    assert d["axpy"].template == (("typename", "T"), ("int", "UNROLL"))
    sigs = kernel_signatures(src, ["axpy<double, 4>"])
    assert "axpy" not in sigs  # a template is compiled only for the instantiations asked for
    assert str(sigs["axpy<double, 4>"]) == "axpy<double, 4>(double* y, double* x, double a, long long n)"
    assert [p.code for p in sigs["scale"].params] == ["p", "p", "f", "i"]


def test_bad_declarations_are_named():
    with pytest.raises(ValueError, match="declared twice"):
        declarations("__global__ void k(int a) {}\n__global__ void k(float a) {}")
    with pytest.raises(ValueError, match="names no __global__ function.*kernels: other, scale"):
        kernel_signatures(SRC.replace("axpy", "other"), ["axpy<float>"])


# ---------------------------------------------------------------------------------------- compiling
@pytest.mark.cuda_build
def test_compile_cache_hit_and_same_process_edit(cache):
    mod = load(cache)
    assert not mod.cached and mod.arch == "sm_90" and mod.cubin.is_file()
    assert set(mod.kernels) == {"scale", "axpy<float>", "axpy<double, 4>"}
    assert str(mod.scale.signature) == "scale(float* x, float* out, float a, int n)"
    again = load(cache)
    assert again is mod and again.cached  # a hit: no compile
    key = mod.key
    edited = load(cache, SRC.replace("a * x[i] + OFFSET", "a * x[i] - OFFSET"))
    assert edited is mod and mod.key != key and not mod.cached  # the same module object, now the new build


@pytest.mark.cuda_build
def test_a_new_process_loads_from_the_cache(cache):
    load(cache)
    code = textwrap.dedent(f"""\
        import time, kernelkit
        t0 = time.perf_counter()
        mod = kernelkit.load_kernels({SRC!r}, "demo", arch="9.0", include_paths=[{str(cache)!r}],
                                     name_expressions=["axpy<float>", "axpy<double, 4>"])
        print(mod.cached, time.perf_counter() - t0)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    cached, seconds = out.stdout.split()
    assert cached == "True"
    print(f"warm load in a new process: {float(seconds) * 1e3:.1f} ms")


@pytest.mark.cuda_build
def test_a_header_edit_recompiles(cache, tmp_path):
    (tmp_path / "offset.h").write_text("#define OFFSET 0.0f\n")
    first = kernelkit.load_kernels(SRC, "hdr", arch="9.0", include_paths=[tmp_path], name_expressions=["axpy<float>"])
    key = first.key
    (tmp_path / "offset.h").write_text("#define OFFSET 1.0f\n")
    second = kernelkit.load_kernels(SRC, "hdr", arch="9.0", include_paths=[tmp_path], name_expressions=["axpy<float>"])
    assert second.key != key and not second.cached


@pytest.mark.cuda_build
def test_errors_cite_the_line_and_quote_it(cache):
    with pytest.raises(BuildError) as e:
        load(cache, SRC.replace("a * x[i] + OFFSET", "a * xx[i] + OFFSET"), name="broken")
    msg = str(e.value)
    assert 'demo.cu' not in msg and 'broken.cu:4: error: identifier "xx" is undefined' in msg
    assert "out[i] = a * xx[i] + OFFSET;" in msg and e.value.log


@pytest.mark.cuda_build
def test_errors_in_a_header_cite_the_header(cache, tmp_path):
    (tmp_path / "offset.h").write_text("#define OFFSET 0.0f\n__device__ float twice(float v) { return v +* 2; }\n")
    with pytest.raises(BuildError) as e:
        kernelkit.load_kernels(SRC, "badhdr", arch="9.0", include_paths=[tmp_path], name_expressions=[])
    msg = str(e.value)
    assert f"{tmp_path.name}/offset.h:2: error" in msg and "return v +* 2;" in msg, msg


@pytest.mark.cuda_build
def test_a_file_source_is_named_by_its_path(cache, tmp_path):
    (tmp_path / "offset.h").write_text("#define OFFSET 0.0f\n")
    path = tmp_path / "mykernels.cu"
    path.write_text(SRC.replace("a * x[i]", "a * q[i]"))
    with pytest.raises(BuildError, match=r"mykernels\.cu:4: error"):
        kernelkit.load_kernels(path, arch="9.0")
    path.write_text(SRC)
    mod = kernelkit.load_kernels(path, arch="9.0", name_expressions=["axpy<float>"])
    assert mod.name == "mykernels" and "scale" in mod.kernels


@pytest.mark.cuda_build
def test_bad_arguments_say_what_was_expected(cache):
    with pytest.raises(KernelkitError, match="options: NVRTC rejected"):
        load(cache, options=["--no-such-option"])
    with pytest.raises(KernelkitError, match="set by kernelkit"):
        load(cache, options=["-arch=sm_80"])
    with pytest.raises(KernelkitError, match="arch: expected one CUDA arch"):
        kernelkit.load_kernels(SRC, "x", arch="8.0;9.0")
    with pytest.raises(KernelkitError, match="no __global__ function"):
        kernelkit.load_kernels("__device__ int f() { return 1; }", "x", arch="9.0")
    with pytest.raises(KernelkitError, match="source: expected CUDA C"):
        kernelkit.load_kernels("   ", "x", arch="9.0")


@pytest.mark.cuda_build
def test_a_corrupt_cubin_is_recompiled(cache):
    mod = load(cache, name="corrupt")
    cubin = mod.cubin
    cubin.write_bytes(b"not a cubin")
    again = load(cache, name="corrupt")
    assert not again.cached and again.cubin.read_bytes() != b"not a cubin"
    meta = json.loads(again.cubin.with_suffix(".json").read_text())
    assert meta["lowered"]["axpy<float>"].startswith("_Z")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
@pytest.mark.cuda_build
def test_launching_without_a_gpu_says_so(cache):
    mod = load(cache)
    with pytest.raises(KernelkitError, match="no CUDA device to launch on"):
        mod.scale[1, 32](torch.ones(4), torch.ones(4), 2.0, 4)


# ---------------------------------------------------------------------------------------- launcher
@pytest.fixture(scope="module")
def launch(cache):
    return launcher.module().launch


def call(launch, codes, dtypes, args, names=None):
    names = names or tuple(f"p{i}" for i in range(len(codes)))
    return launch(0, "k", codes.encode(), dtypes, names, 1, 32, 0, None, tuple(args))


@pytest.mark.cuda_build
def test_launcher_refuses_bad_arguments_by_name(launch):
    x64 = torch.ones(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"k\(\) takes 2 argument\(s\), got 1"):
        call(launch, "pi", (torch.float32, None), [x64])
    with pytest.raises(TypeError, match="argument 1 'x' expects a torch.float32 tensor, got torch.float64"):
        call(launch, "pi", (torch.float32, None), [x64, 3], names=("x", "n"))
    with pytest.raises(ValueError, match="argument 1 'x' is a CPU tensor"):
        call(launch, "pi", (torch.float32, None), [torch.ones(3), 3], names=("x", "n"))
    with pytest.raises(OverflowError, match="argument 2 'n' = 4294967296 does not fit"):
        call(launch, "pi", (None, None), [0, 2 ** 32], names=("x", "n"))
    with pytest.raises(OverflowError, match="does not fit"):
        call(launch, "I", (None,), [-1])
    with pytest.raises(TypeError, match="argument 1 'n' expects an int"):
        call(launch, "i", (None,), [2.5], names=("n",))
    with pytest.raises(TypeError, match="expects a number"):
        call(launch, "f", (None,), ["2"])
    with pytest.raises(ValueError, match="grid must be an int >= 0"):
        launch(0, "k", b"", (), (), -1, 32, 0, None, ())
    with pytest.raises(ValueError, match="block must hold ints >= 1"):
        launch(0, "k", b"", (), (), 1, (32, 0), 0, None, ())
    assert launch(0, "k", b"i", (None,), ("n",), (0, 4), 32, 0, None, (5,)) is None  # an empty grid launches nothing
    with pytest.raises(TypeError, match="block must be an int or a tuple"):
        launch(0, "k", b"", (), (), 1, [32], 0, None, ())


@pytest.mark.cuda_build
def test_launcher_record_is_verified_before_use(launch):
    so = launcher._recorded()
    assert so is not None and so.is_file()  # the fixture's build left a record: a warm start plans nothing
    record = launcher._record()
    good = record.read_text()
    try:
        record.write_text(json.dumps({"so": str(so), "sha256": "0" * 64}))  # a library that is not the one built
        assert launcher._recorded() is None
        record.write_text("{not json")
        assert launcher._recorded() is None
    finally:
        record.write_text(good)
    assert launcher._recorded() == so
