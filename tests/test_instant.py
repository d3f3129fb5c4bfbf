"""Instant kernels without a GPU: signatures read from source, NVRTC compiles for arch 9.0 into the cache
(cold, hit, edit, header edit, errors mapped to lines), and the launcher's argument packing."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="instant kernels need cuda-bindings (torch's CUDA 13 wheels bring it)")

import kernelkit  # noqa: E402
from kernelkit.errors import BuildError, KernelkitError  # noqa: E402
from kernelkit.instant import launcher  # noqa: E402
from kernelkit.instant.signature import bind, check_expressions, declared, parse_param, signature  # noqa: E402
from kernelkit.jit import cache as kk_cache  # noqa: E402
from kernelkit.jit import nvrtc  # noqa: E402
from kernelkit.jit.outline import scan  # noqa: E402

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
    ("float& r", "float&", "?", None),
    ("void (*fp)(int)", "void (*)(int)", "?", None),
])
def test_parameters_are_read_with_their_types(raw, ctype, code, dtype):
    p = parse_param(raw, 0, {})
    assert (p.ctype, p.code, p.dtype) == (ctype, code, dtype)


def _kernels(src):
    return {k.name: k for k in scan(src).kernels}


def test_declarations_templates_and_linkage():
    src = SRC + textwrap.dedent("""\
        // __global__ void in_a_comment(int x)
        extern "C" {
        __global__ void in_block(int n) {}
        }
        __global__ void cpp_linkage(void);
        __global__ void cpp_linkage(void) {}
        namespace ns { namespace { __global__ void inner(const float* x, size_t n) {} } }
        """)
    d = _kernels(src)
    assert set(d) == {"scale", "axpy", "in_block", "cpp_linkage", "ns::inner"}  # anonymous namespaces qualify nothing
    assert d["scale"].extern_c and d["in_block"].extern_c and not d["cpp_linkage"].extern_c
    assert d["axpy"].template == (("typename", "T"), ("int", "UNROLL"))
    assert str(signature(d["axpy"], "axpy<double, 4>")) == "axpy<double, 4>(double* y, double* x, double a, long long n)"
    assert [p.code for p in signature(d["scale"]).params] == ["p", "p", "f", "i"]
    assert str(signature(d["ns::inner"])) == "ns::inner(float* x, size_t n)" and signature(d["cpp_linkage"]).params == ()


def test_bad_declarations_are_named():
    with pytest.raises(ValueError, match="declared with different parameters"):
        declared(scan("__global__ void k(int a) {}\n__global__ void k(float a) {}").kernels, "k")
    assert declared(scan("__global__ void k(int);\n__global__ void k(int a) {}").kernels, "k").params[0].name == "a"
    with pytest.raises(ValueError, match="names no __global__ function.*kernels: other, scale"):
        check_expressions(scan(SRC.replace("axpy", "other")).kernels, ["axpy<float>"])


def test_the_scan_sees_every_branch_and_no_macro_body():
    """Which branch is compiled is NVRTC's to say (bind keeps what the cubin holds); a broken kernel inside
    #if 0, a macro's body and CUDA attributes the grammar does not know break nothing."""
    src = textwrap.dedent("""\
        #define KERNEL(name) extern "C" __global__ void name(float* x, int n)
        #if 0
        __global__ void gone(int n) { this is not C++ ( }
        #endif
        KERNEL(foo) { x[0] = n; }
        __global__ void __cluster_dims__(2, 1, 1) clustered(float* x) {}
        __global__ __maxnreg__(32) void capped(double* y) {}
        """)
    d = _kernels(src)
    assert set(d) == {"gone", "clustered", "capped"}  # not "name" nor "n": a macro's body is not code
    assert str(signature(d["clustered"])) == "clustered(float* x)" and str(signature(d["capped"])) == "capped(double* y)"
    sigs, symbols = bind(scan(src).kernels, [("foo", ""), ("_Z9clusteredPf", "clustered(float*)")], {})
    assert set(sigs) == {"foo", "clustered"} and symbols["clustered"] == "_Z9clusteredPf"  # exactly the cubin's
    assert not sigs["foo"].declared and sigs["clustered"].declared


def test_scanning_is_linear():
    body = "__global__ void k%d(const float* __restrict__ x, float* out, float a, int n) { out[0] = a * x[0]; }\n"
    src = 'extern "C" {\n' + "".join(body % i for i in range(400)) + "}\n"
    t0 = time.perf_counter()
    kernels = scan(src).kernels
    seconds = time.perf_counter() - t0
    assert len(kernels) == 400 and all(k.extern_c for k in kernels)
    assert seconds < 0.5, f"scanning 400 kernels took {seconds:.2f} s"  # the regex scan took 2.4 s


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
        print(mod.cached, time.perf_counter() - t0, "tree_sitter" in __import__("sys").modules)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    cached, seconds, parser_loaded = out.stdout.split()
    assert cached == "True"
    assert parser_loaded == "False"  # the source's scan is read from the cache: a warm start loads no parser
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


# ------------------------------------------------------------------------------- what NVRTC reads
KVAL_KERNEL = 'extern "C" __global__ void kval(int* out) { *out = KVAL; }\n'
NEW_PROCESS = textwrap.dedent("""\
    import json, sys, kernelkit
    mod = kernelkit.load_kernels(sys.argv[1], "kval", arch="9.0", options=json.loads(sys.argv[2]))
    print(json.dumps([mod.key, mod.cached]))
    """)


def _in_a_new_process(path, options):
    out = subprocess.run([sys.executable, "-c", NEW_PROCESS, str(path), json.dumps(options)], capture_output=True,
                         text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.cuda_build
@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("how", ["macro", "macro -D", "--pre-include=", "-include two tokens"])
def test_headers_nvrtc_reads_are_keyed(tmp_path, monkeypatch, how):
    """A header reached through a macro or forced in by the options: every edit gives a new key, in this
    process and in a new one; an unchanged header is a cache hit (0 stale results)."""
    monkeypatch.chdir(tmp_path)  # where NVRTC looked for such headers itself before they were hashed
    header, path = tmp_path / "kval.cuh", tmp_path / "kval_kernels.cu"
    text, options = {
        "macro": ('#define KVAL_HEADER "kval.cuh"\n#include KVAL_HEADER\n' + KVAL_KERNEL, []),
        "macro -D": ("#include KVAL_HEADER\n" + KVAL_KERNEL, ['-DKVAL_HEADER="kval.cuh"']),
        "--pre-include=": (KVAL_KERNEL, ["--pre-include=kval.cuh"]),
        "-include two tokens": (KVAL_KERNEL, ["-include", "kval.cuh"]),
    }[how]
    path.write_text(text)
    keys = {}
    for value in (3, 4):
        header.write_text(f"#define KVAL {value}\n")
        mod = kernelkit.load_kernels(path, "kval", arch="9.0", options=options)
        assert mod.key not in keys.values() and not mod.cached, f"KVAL {value} was served from an older build"
        keys[value] = mod.key
    header.write_text("#define KVAL 3\n")
    assert _in_a_new_process(path, options) == [keys[3], True]  # the same bytes: the same key, a hit
    header.write_text("#define KVAL 5\n")
    key, cached = _in_a_new_process(path, options)
    assert key not in keys.values() and not cached


@pytest.mark.cuda_build
@pytest.mark.usefixtures("cache")
def test_includes_kernelkit_cannot_resolve_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kval.cuh").write_text("#define KVAL 3\n")
    src = "#define STR(x) #x\n#include STR(kval.cuh)\n" + KVAL_KERNEL
    with pytest.raises(KernelkitError, match=r"kval\.cu:2: #include STR\(kval\.cuh\): kernelkit cannot tell which "
                                             r"header this names"):
        kernelkit.load_kernels(src, "kval", arch="9.0")
    with pytest.raises(KernelkitError, match="forced include 'nowhere.cuh' is in none of"):
        kernelkit.load_kernels(KVAL_KERNEL, "kval", arch="9.0", options=["--pre-include=nowhere.cuh"])
    with pytest.raises(KernelkitError, match="precompiled header"):
        kernelkit.load_kernels(KVAL_KERNEL, "kval", arch="9.0", options=["--use-pch=x.pch"])


@pytest.mark.cuda_build
@pytest.mark.usefixtures("cache")
def test_the_exposed_kernels_are_those_nvrtc_compiled():
    src = textwrap.dedent("""\
        #define KERNEL(name) extern "C" __global__ void name(float* x, int n)
        #if 0
        extern "C" __global__ void gone(int n) { this is not C++ ( }
        #endif
        #ifdef USE_DOUBLE
        extern "C" __global__ void scaled(double* x, double a) { *x *= a; }
        #else
        extern "C" __global__ void scaled(float* x, float a) { *x *= a; }
        #endif
        #ifdef WIDE
        __global__ void wide(double* x) {}
        #else
        __global__ void narrow(float* x) {}
        #endif
        KERNEL(foo) { x[0] = n; }
        namespace ns { __global__ void inner(float* x, long long n) {} }
        static __global__ void internal(unsigned v) {}
        """)
    with pytest.raises(KernelkitError, match="kernel scaled is declared with different parameters"):
        kernelkit.load_kernels(src, "exact", arch="9.0")  # which of the two did NVRTC compile? not guessed
    src = src.replace("double* x, double a", "float* x, float a")
    mod = kernelkit.load_kernels(src, "exact", arch="9.0")
    assert set(mod.kernels) == {"scaled", "narrow", "foo", "ns::inner", "internal"}
    assert str(mod["ns::inner"].signature) == "ns::inner(float* x, long long n)"
    assert str(mod.internal.signature) == "internal(unsigned v)"
    with pytest.raises(KernelkitError, match="kernel 'foo' is in the compiled program, but its source shows no "
                                             "declaration of it"):
        mod.foo[1, 1](torch.ones(1), 1)
    assert set(kernelkit.load_kernels(src, "exact", arch="9.0", options=["-DWIDE"]).kernels) == \
        {"scaled", "wide", "foo", "ns::inner", "internal"}
    with pytest.raises(KernelkitError, match="no __global__ function in the compiled program"):
        kernelkit.load_kernels("#if 0\n__global__ void k(int n) {}\n#endif\n", "exact", arch="9.0")


@pytest.mark.cuda_build
def test_names_are_checked_before_any_file_is_written(cache):
    for bad in ("../../../escaped", "a/b", ".hidden", "x\0y", 7):
        with pytest.raises(KernelkitError, match="name: expected a module name"):
            kernelkit.load_kernels(SRC, bad, arch="9.0")
    assert not list(cache.parent.glob("escaped*")) and not list(cache.glob("escaped*"))
    assert load(cache, name="card:file.cu").name == "card:file.cu"  # a card's kernel file is named so


@pytest.mark.cuda_build
def test_a_compile_leaves_no_temporary_directory(cache):
    tmp = kk_cache.cache_dir() / "tmp"
    before = set(tmp.iterdir()) if tmp.is_dir() else set()
    mod = load(cache, SRC.replace("a * x[i]", "a * x[i] * 1.5f"), name="tmpclean")
    assert not mod.cached and set(tmp.iterdir()) == before


@pytest.mark.usefixtures("cache")
def test_nvrtc_facts_are_checked_against_the_installed_nvrtc():
    nvrtc._facts.cache_clear()
    real = nvrtc._facts()
    record = next(kk_cache.cache_dir().glob("records/nvrtc/*.json"))
    facts = json.loads(record.read_text())
    assert any("libnvrtc" in f for f in facts["files"]), facts  # what an upgrade replaces
    try:
        record.write_text(json.dumps({**facts, "version": [1, 0]}))
        nvrtc._facts.cache_clear()
        assert nvrtc._facts()["version"] == [1, 0]  # unchanged files: the record is used, NVRTC is not loaded
        lib = next(f for f in facts["files"] if "libnvrtc" in f)
        record.write_text(json.dumps({**facts, "version": [1, 0], "files": {**facts["files"], lib: "1:2"}}))
        nvrtc._facts.cache_clear()
        assert nvrtc._facts()["version"] == real["version"]  # "upgraded": found again, and recorded
        assert json.loads(record.read_text())["files"][lib] == facts["files"][lib]
    finally:
        nvrtc._facts.cache_clear()


def test_kernelkit_arch_lists_choose_one_arch(monkeypatch):
    monkeypatch.setenv("KERNELKIT_ARCH", "8.0;9.0+PTX")  # README's example, as for nvcc builds
    monkeypatch.setattr(nvrtc, "_gpu_arch", lambda: None)
    assert nvrtc.arch_for(None) == "90"  # no GPU: the last listed
    monkeypatch.setattr(nvrtc, "_gpu_arch", lambda: "80")
    assert nvrtc.arch_for(None) == "80"  # the current GPU's, when listed
    monkeypatch.setattr(nvrtc, "_gpu_arch", lambda: "86")
    assert nvrtc.arch_for(None) == "90"
    assert nvrtc.arch_for("9.0+PTX") == "90" and nvrtc.arch_for("sm_90a") == "90a"
    monkeypatch.setenv("KERNELKIT_ARCH", "9.0;banana")
    with pytest.raises(KernelkitError, match="KERNELKIT_ARCH: expected CUDA archs"):
        nvrtc.arch_for(None)


@pytest.mark.cuda_build
def test_load_kernels_under_a_kernelkit_arch_list(cache, monkeypatch):
    monkeypatch.setenv("KERNELKIT_ARCH", "8.0;9.0+PTX")
    mod = kernelkit.load_kernels(SRC, "archlist", include_paths=[cache])  # README's setting broke this
    here = "sm_{}{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
    assert mod.arch == (here if here in ("sm_80", "sm_90") else "sm_90")


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


@pytest.mark.fast_path("records")
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
