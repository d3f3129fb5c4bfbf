"""The automatic split of torch-style .cu files (kernelkit.jit.fast.split) on the corpus in fixtures/torch_cu and on
the constructs a split must keep: the decision per file; the device TU is the file line for line but for what it
leaves out (so pragmas, using-directives, macros anywhere and include guards mean what they meant); the host TU
changes only in its ``#line`` numbers when device code gains or loses lines; launches are lowered as nvcc lowers
them; and, for a handful of files, a real g++ + nvcc build of both TUs bound and linked against torch."""
from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernelkit.jit import syntax, units
from kernelkit.jit.fast import torch_headers
from kernelkit.jit.fast.split import (
    InstantiationError,
    Split,
    Unsplittable,
    device_text,
    host_flags,
    instantiate,
    local_headers,
    split_source,
)
from kernelkit.jit.fast.split import tree as ts

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "torch_cu"))
from cases import CASES  # noqa: E402
from cases import path as corpus_path

SPLIT = sorted(n for n, c in CASES.items() if c.decision == "split")


def split_file(name: str):
    p = corpus_path(name)
    return split_source(p.read_text(), str(p), local_headers([]), torch_headers.heavy)


def split_text(tmp_path, text: str, name: str = "x.cu"):
    p = tmp_path / name
    p.write_text(text)
    return split_source(text, str(p), local_headers([tmp_path]), torch_headers.heavy)


def test_corpus_is_large_enough():
    assert len(CASES) >= 15
    assert {p.name for p in corpus_path("x").parent.glob("*.cu")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_decision(name):
    result = split_file(name)
    case = CASES[name]
    if case.decision == "split":
        assert isinstance(result, Split), result
        assert result.kernels
    else:
        assert isinstance(result, Unsplittable), f"{name} was split"
        assert case.decision in result.reason
        assert result.line > 0
        assert case.decision != "the parser could not read" or result.line == case.error_line


def _parses(tu: str) -> None:
    """The grammar reads the TU whole (qualifier macros such as ``#define HD __host__ __device__`` seen through)."""
    for n in syntax.walk(ts.mask(tu).tree.root_node):
        assert n.type != "ERROR" and not n.is_missing, f"TU does not parse at {tu.split(chr(10))[n.start_point[0]]!r}"


def _line_map(tu: str):
    """(path, line) for each line of a generated TU, following its #line marks; None before the first."""
    where, out = None, []
    for ln in tu.split("\n"):
        m = re.match(r'#line (\d+) "(.*)"$', ln)
        if m:
            where = (m.group(2), int(m.group(1)) - 1)
            out.append(None)
            continue
        if where is not None:
            where = (where[0], where[1] + 1)
        out.append(where)
    return out


def _original(where) -> str:
    return Path(where[0]).read_text().split("\n")[where[1] - 1]


@pytest.mark.parametrize("name", SPLIT)
def test_the_device_tu_is_the_file_line_for_line(name):
    """Every line the device TU keeps is the file's own, on its own line; what it leaves out is blank."""
    result = split_file(name)
    _parses(result.device)
    kept = 0
    for ln, where in zip(result.device.split("\n"), _line_map(result.device)):
        if where is None or where[0].startswith("<kernelkit") or not ln.strip() or "KK_ONCE_" in ln:
            continue  # the prelude; a #pragma once made a guard
        original = _original(where)
        if ln == "#endif" and original.strip() != "#endif":  # the end of a #pragma once header's guard
            continue
        if "kk_anon_" in ln:  # an unnamed namespace, named in both TUs
            assert re.sub(r"namespace \{", "", original.strip()) in ln
            continue
        assert ln == original, f"{name}: device line {where}: {ln!r} is not {original!r}"
        kept += 1
    assert kept > 5


@pytest.mark.parametrize("name", SPLIT)
def test_the_host_tu_keeps_the_files_host_lines(name):
    """A host TU line is the file's own, or one of the rewrites: a kernel's definition cut to its declaration, a
    launch as nvcc lowers it, a device variable's extern declaration, an unnamed namespace named."""
    result = split_file(name)
    _parses(result.host.text)
    for ln, where in zip(result.host.text.split("\n"), _line_map(result.host.text)):
        if where is None or not ln.strip():
            continue
        original = _original(where)
        declaration = _specifiers_out(original).startswith(_specifiers_out(ln).rstrip(";"))
        rewritten = ("__cudaPushCallConfiguration" in ln or "? (void)0 : " in ln or declaration or ln.startswith("extern ")
                     or "kk_anon_" in ln or ln.startswith(("#ifndef KK_ONCE_", "#define KK_ONCE_", "#endif")))
        assert ln == original or rewritten, f"{name}: host line {where}: {ln!r} is not {original!r}"


def _specifiers_out(text: str) -> str:
    """A kernel's declaration line as the host TU writes it, less blanks: no ``static``, no launch bounds."""
    return re.sub(r"\bstatic\b|__launch_bounds__\([^)]*\)|\s+", "", text)


def _edited(name: str, old: str, new: str):
    p = corpus_path(name)
    text = p.read_text()
    assert text.count(old) == 1
    return split_source(text.replace(old, new), str(p), local_headers([]), torch_headers.heavy)


def _numbers_left_out(tu) -> str:
    return tu.without_line_numbers()


@pytest.mark.parametrize("name,old,new", [
    ("relu_extension.cu", "out[i] = v > 0.f ? v : v * slope;", "out[i] = v >= 0.f ? v : slope * v;"),
    ("relu_extension.cu", "out[i] = v > 0.f ? v : v * slope;", "float w = v * slope;\n\n    out[i] = v > 0.f ? v : w;"),
    ("sigmoid_dispatch.cu", "dx[i] = static_cast<scalar_t>(static_cast<float>(grad[i]) * s * (1.f - s));",
     "float t = s * (1.f - s);\n    dx[i] = static_cast<scalar_t>(static_cast<float>(grad[i]) * t);"),
    ("const_poly.cu", "for (int k = c_degree - 1; k >= 0; --k) acc = acc * v + c_coeffs[k];",
     "for (int k = c_degree - 1; k >= 0; k--) {\n        acc = fmaf(acc, v, c_coeffs[k]);\n    }"),
    ("block_sum.cu", "__global__ void finish_sum", "__device__ float kk_test_twice(float v) { return 2.f * v; }\n\n"
     "__global__ void finish_sum"),
])
def test_a_device_code_edit_changes_the_host_tu_in_its_line_numbers_only(name, old, new):
    before, after = split_file(name), _edited(name, old, new)
    assert _numbers_left_out(before.host) == _numbers_left_out(after.host)
    assert before.device != after.device
    if new.count("\n") != old.count("\n"):
        assert before.host.line_numbers() != after.host.line_numbers()


def test_a_host_edit_keeps_the_device_text():
    before = split_file("block_sum.cu")
    after = _edited("block_sum.cu", '"vector_sum: expected a float CUDA tensor"', '"vector_sum: float32 on the GPU"')
    assert before.device == after.device
    assert before.host.text != after.host.text


def test_launches_push_the_configuration_before_the_arguments_are_evaluated():
    host = split_file("hd_macro.cu").host.text
    assert "<<<" not in host
    assert re.search(r"\(__cudaPushCallConfiguration\(\(n \+ 255\) / 256, 256\)\) \? \(void\)0 : "
                     r"soft_clip_square_kernel\(xc\.data_ptr", host)


def test_kernels_become_declarations_of_their_stubs():
    result = split_file("sigmoid_dispatch.cu")
    assert re.search(r"__global__ void sigmoid_fwd_kernel\([^)]*\) ;", result.host.text)
    assert result.templated and set(result.templates) == {"sigmoid_fwd_kernel", "sigmoid_bwd_kernel"}


def test_anonymous_namespaces_get_a_hidden_named_namespace_in_both_tus():
    result = split_file("anon_rownorm.cu")
    for tu in (result.host.text, result.device):
        assert 'namespace [[gnu::visibility("hidden")]] kk_anon_' in tu
        assert "namespace {" not in tu
    assert any(e.startswith("kk_anon_") for e in result.entities)


def test_the_device_tu_stands_in_for_torchs_umbrella_and_keeps_light_torch_headers():
    lltm = split_file("lltm_accessor.cu").device
    assert "torch/extension.h" not in lltm
    assert "#include <ATen/core/TensorAccessor.h>" in lltm and "namespace torch { using namespace at; }" in lltm
    poly = split_file("const_poly.cu").device  # ATen.h and CUDAContext.h go, CUDAGuard.h stays
    assert "<ATen/ATen.h>" not in poly and "<ATen/cuda/CUDAContext.h>" not in poly
    assert "#include <c10/cuda/CUDAGuard.h>" in poly


def test_which_torch_headers_are_heavy_is_found_once_per_torch(tmp_path, monkeypatch):
    """Finding whether a torch header reaches its heavy API parses up to a few hundred headers; a new process reads
    the answer from its record instead (and a record without the answer is added to)."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch_headers, "heavy", functools.lru_cache(maxsize=None)(torch_headers.heavy.__wrapped__))
    monkeypatch.setattr(torch_headers, "_known", functools.lru_cache(maxsize=None)(torch_headers._known.__wrapped__))
    assert torch_headers.heavy("<c10/cuda/CUDAException.h>") is False
    assert torch_headers.heavy("<ATen/cuda/CUDAContext.h>") is True  # reaches ATen/Context.h
    torch_headers.heavy.cache_clear()
    torch_headers._known.cache_clear()  # a new process

    def parse(*args):
        raise AssertionError("parsed torch's headers again")

    monkeypatch.setattr(torch_headers, "_reaches", parse)
    assert torch_headers.heavy("<c10/cuda/CUDAException.h>") is False
    assert torch_headers.heavy("<ATen/cuda/CUDAContext.h>") is True
    with pytest.raises(AssertionError, match="parsed torch's headers again"):
        torch_headers.heavy("<c10/util/Half.h>")


_SCALAR_TYPE_KERNEL = (
    "#include <torch/extension.h>\n"
    "__device__ float ld(const void* p, at::ScalarType t) {\n"
    "  return t == at::ScalarType::Double ? float(static_cast<const double*>(p)[0]) : static_cast<const float*>(p)[0];\n"
    "}\n__global__ void k(const void* p, at::ScalarType t, float* o) { o[0] = ld(p, t); }\n"
    "torch::Tensor f(torch::Tensor x) {\n  auto o = torch::empty({1}, x.options().dtype(torch::kFloat));\n"
    "  k<<<1, 1>>>(x.data_ptr(), x.scalar_type(), o.data_ptr<float>());\n  return o;\n}\n")


@pytest.mark.cuda_build
def test_device_code_switching_on_a_scalar_type_gets_c10s_header_and_compiles(tmp_path):
    """``at::ScalarType`` in device code is c10's light enum header, not torch's umbrella (built as written)."""
    from kernelkit.jit import plan, toolchain

    result = split_text(tmp_path, _SCALAR_TYPE_KERNEL)
    assert isinstance(result, Split), result
    assert "#include <c10/core/ScalarType.h>" in result.device and "torch/extension.h" not in result.device
    dev_cu = tmp_path / "x.dev.cu"
    dev_cu.write_text(device_text(result, []))
    flags = plan._torch_style_flags("x", "cu", True, [], ["9.0"], False)
    proc = subprocess.run([toolchain.nvcc(), *flags, "-c", str(dev_cu), "-o", str(tmp_path / "x.dev.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_local_header_is_written_in_with_its_guard_and_marks_naming_it():
    result = split_file("local_header.cu")
    header = corpus_path("axpby_kernels.cuh")
    assert f'#line 1 "{header}"' in result.device
    assert '#include "axpby_kernels.cuh"' not in result.device and '#include "axpby_kernels.cuh"' not in \
        result.host.text
    assert str(header) in result.headers


# ------------------------------------------------------------------------------ what the split must keep
HEAD = "#include <torch/extension.h>\n"
LAUNCH = "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }\n"


def test_pragmas_and_using_directives_stay_where_they_are(tmp_path):
    src = (HEAD + "#pragma pack(push, 1)\nstruct P { char c; float v; };\n#pragma pack(pop)\n"
           "namespace a { __device__ float g(float v) { return 2 * v; } }\nusing namespace a;\n"
           "__device__ float g(double v) { return 3 * v; }\n"
           "__global__ void k(float* x, P p) { x[0] = g(p.v); }\n"
           "torch::Tensor f(torch::Tensor x) { P p{1, 2.f}; k<<<1, 1>>>(x.data_ptr<float>(), p); return x; }\n")
    result = split_text(tmp_path, src)
    lines = result.device.split("\n")
    for wanted in ("#pragma pack(push, 1)", "#pragma pack(pop)", "using namespace a;", "struct P { char c; float v; };"):
        assert wanted in lines, wanted
    assert "#pragma pack(push, 1)" in result.host.text and "using namespace a;" in result.host.text


def test_a_define_inside_a_kernel_body_stays_in_the_host_tu(tmp_path):
    src = (HEAD + "#define TILE 128\n__global__ void k(float* x) {\n#undef TILE\n#define TILE 256\n  x[0] = TILE;\n}\n"
           "int tile() { return TILE; }\n" + LAUNCH)
    host = split_text(tmp_path, src).host.text
    assert "#undef TILE\n#define TILE 256\n" in host and "x[0] = TILE;" not in host


def test_device_variables_host_code_names_are_declared_extern_with_their_own_type(tmp_path):
    src = (HEAD + "__constant__ float coef[4];\nstatic __device__ int counter[2][3];\n__device__ float unused;\n"
           "__global__ void k(float* x) { x[0] = coef[0] + counter[0][0] + unused; }\n"
           "int n() { return std::extent<decltype(coef)>::value + sizeof(counter); }\n" + LAUNCH)
    result = split_text(tmp_path, src)
    assert "extern float coef[4];" in result.host.text and "extern int counter[2][3];" in result.host.text
    assert "unused" not in result.host.text
    assert {"coef", "counter"} <= result.entities


def test_the_device_tu_keeps_of_a_host_variable_what_device_code_needs(tmp_path):
    """A host variable is defined and initialised by the host object alone: the device TU drops it, keeps the
    type its definition also defines, declares it ``extern`` where device code names it (here in ``sizeof``), and
    keeps a copy only where a second one changes nothing (a constant of a built-in type) or the join will fail
    (an array sized by its initialiser, which ``extern`` cannot declare; specifiers beyond const and volatile)."""
    src = (HEAD + "struct P { int a; float b; } g_p = {1, 2.0f}, g_q;\nnamespace { int calls = 0; }\n"
           "int limit = 4;\nconst float kScale = 2.0f;\nfloat tbl[] = {1, 2};\nalignas(16) int wide = 1;\n"
           "__global__ void k(float* x, P p) { x[0] = p.b + sizeof(limit) + kScale + sizeof(tbl) + sizeof(wide); }\n"
           "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>(), g_p); ++calls; return x; }\n")
    result = split_text(tmp_path, src)
    device = [line.strip() for line in result.device.split("\n")]
    assert "struct P { int a; float b; } ;" in device and "extern int limit;" in device, result.device
    assert "const float kScale = 2.0f;" in device and "float tbl[] = {1, 2};" in device, result.device
    assert "alignas(16) int wide = 1;" in device  # where "extern" would go among its specifiers is not plain
    assert "calls" not in result.device and "g_p" not in result.device, result.device
    for kept in ("struct P { int a; float b; } g_p = {1, 2.0f}, g_q;", "int limit = 4;", "int calls = 0;"):
        assert kept in result.host.text, kept


def test_functions_returning_references_are_functions(tmp_path):
    """``std::vector<int>& registry()`` is a host function (the grammar gives a reference declarator's inner
    declarator no field name): what calls it leaves the device TU with it, and ``__device__ float& at(int);`` is a
    device function's prototype, not a variable."""
    src = (HEAD + "#include <vector>\nstd::vector<int>& registry() { static std::vector<int> v; return v; }\n"
           "struct Registrar { Registrar() { registry().push_back(1); } };\n__device__ float& at(float* x, int i);\n"
           "__device__ float& at(float* x, int i) { return x[i]; }\n__global__ void k(float* x) { at(x, 0) = 1; }\n"
           + LAUNCH)
    result = split_text(tmp_path, src)
    assert "registry" not in result.device and "Registrar" not in result.device, result.device
    assert "__device__ float& at(float* x, int i);" in result.device
    assert "at(float* x" not in result.host.text


def test_a_device_array_of_unstated_size_named_by_host_code_is_refused(tmp_path):
    src = (HEAD + "__constant__ float coef[] = {1, 2};\n__global__ void k(float* x) { x[0] = coef[0]; }\n"
           "int n() { return sizeof(coef); }\n" + LAUNCH)
    result = split_text(tmp_path, src)
    assert isinstance(result, Unsplittable) and "unstated size" in result.reason


def test_static_extern_c_and_bounded_kernels_become_plain_declarations(tmp_path):
    src = (HEAD + 'extern "C" __global__ void c(float* x) { x[0] = 1; }\n'
           "static __global__ void __launch_bounds__(256) k(float* x) { x[0] = 2; }\n"
           "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); c<<<1, 1>>>(x.data_ptr<float>());"
           " return x; }\n")
    host = split_text(tmp_path, src).host.text
    assert re.search(r'extern "C" __global__ void c\(float\* x\) ;', host)
    assert re.search(r"^ +__global__ +k\(float\* x\) ;|^\s+__global__ void\s+k\(float\* x\) ;", host, re.M), host


def test_a_local_header_is_included_as_often_as_the_file_includes_it(tmp_path):
    """Its guard decides, in each TU's preprocessor, as in the file's: nothing is judged here."""
    (tmp_path / "k.cuh").write_text("#ifndef K_CUH\n#define K_CUH\n__device__ float one() { return 1.f; }\n#endif\n")
    (tmp_path / "x.cuh").write_text("X(1);\nX(2);\n")
    src = (HEAD + '#define K_CUH\n#include "k.cuh"\n#define X(n) x[n] += n\n__global__ void k(float* x) {\n'
           '#include "x.cuh"\n#include "x.cuh"\n}\n' + LAUNCH)
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    assert result.device.count("#ifndef K_CUH") == 1 and result.device.count("X(1)") == 2


def test_a_pragma_once_header_gets_a_guard_named_for_its_path(tmp_path):
    (tmp_path / "o.cuh").write_text("#pragma once\n__device__ float one() { return 1.f; }\n")
    src = HEAD + '#include "o.cuh"\n#include "o.cuh"\n__global__ void k(float* x) { x[0] = one(); }\n' + LAUNCH
    result = split_text(tmp_path, src)
    assert result.device.count("#ifndef KK_ONCE_") == 2 and "#pragma once" not in result.device


REFUSALS = [
    ("__global__ void k(float* x) {}\nint f() {\n#if __CUDA_ARCH__ >= 800\nreturn 1;\n#endif\nreturn 0; }\n",
     "__CUDA_ARCH__ in host code", 4),
    ("#define LAUNCH(x) k<<<1, 1>>>(x)\n__global__ void k(float* x) {}\n", None, 0),  # lowered in the body
    ("__global__ void k(float* x) {}\nvoid f(float* x) {\n#define GO(p) k<<<1, 1>>>(p)\n  GO(x);\n#undef GO\n}\n",
     None, 0),  # defined in a function body
    ("#define LAUNCH(K, x) K##_kernel<<<1, 1>>>(x)\n__global__ void k_kernel(float* x) {}\n",
     "a kernel launch inside the macro LAUNCH, whose body the parser could not read", 2),
    ("#define LAUNCH(x) k<<<1>>>(x)\n__global__ void k(float* x) {}\n", "a launch configuration without 2 to 4", 2),
    ("__global__ void c(float* x) {}\n__global__ void p(float* x) { c<<<1, 1>>>(x); }\n", "dynamic parallelism", 3),
    ("__managed__ int counter;\n__global__ void k(int* x) { x[0] = counter; }\nint f() { return counter; }\n",
     "__managed__ variable counter used in host code", 4),
    ("__device__ float twice(float v) { return 2 * v; }\n__global__ void k(float* x) { x[0] = twice(x[0]); }\n"
     "auto p = &twice;\n", "__device__ function twice", 4),
    ("__global__ void k(float* x) {}\nvoid (*table[])(float*) = {k};\nvoid f(float* x, int i) { table[i]<<<1, 1>>>(x); }\n",
     None, 0),  # a launch through a kernel pointer: lowered as nvcc lowers it
    ("__global__ void k(int* x) { x[0] = __COUNTER__; }\n", "__COUNTER__", 2),
    ("#if __has_include(\"k.cuh\")\n#endif\n__global__ void k(int* x) {}\n", "__has_include", 2),  # from its dir
    ("#if __has_include_next(<cub/cub.cuh>)\n#endif\n__global__ void k(int* x) {}\n", "__has_include_next", 2),
    ("#define HAVE_K __has_include(\"k.cuh\")\n__global__ void k(int* x) {}\n", "__has_include", 2),
    ("#define N __COUNTER__\n__global__ void k(int* x) { x[0] = N; }\n", "__COUNTER__", 2),
    ("#if defined(__has_include) && __has_include(<cub/cub.cuh>)\n#endif\n__global__ void k(int* x) {}\n",
     None, 0),  # a <...> name is searched for alike wherever the TU is written
    ("__global__ void k(float* x) {}\nint f() { return __CUDACC_VER_MAJOR__; }\n", "__CUDACC_VER_MAJOR__ in host code", 3),
    ("__global__ void k(float* x) {}\nvoid f(float* x) { thrust::fill(x, x + 1, 0.f); }\n", "thrust", 3),
    ("#line 7 \"elsewhere.cu\"\n__global__ void k(float* x) {}\n", "a #line directive", 2),
    ("#if 0\n__global__ void k0(float* x) { x[0] = \n}\n__global__ void k(float* x) {}\n",
     "the parser could not read this code", 2),  # an #if 0 never closed
    ("#define MINE 1\n__global__ void k(float* x) {\n#if MINE && __CUDA_ARCH__ >= 800\nx[0] = 1;\n#endif\n}\n",
     None, 0),
    ("__global__ void k(float* x) {\n#ifdef C10_USE_GLOG\nx[0] = 1;\n#endif\n}\n", None, 0),  # the proof's job
    ("__global__ void k(float* x) {}\n__global__ void k(int* x) {}\n", None, 0),  # overloads: each a stub
    ("struct Registry { Registry(); };\nstatic Registry reg;\n__global__ void k(int* x) { x[0] = sizeof(reg); }\n",
     "device code names the host variable reg, whose initialisation constructs a Registry", 3),
    ("int next_id();\nnamespace { const int id = next_id(); }\n__global__ void k(int* x) { x[0] = sizeof(id); }\n",
     "device code names the host variable id, whose initialisation calls next_id", 3),
    ("static int mode = 1;\n__host__ __device__ int pick() { return sizeof(mode); }\n__global__ void k(int* x) "
     "{ x[0] = pick(); }\n", "device code names the static host variable mode", 2),
    ("static int offset = 1;\n__global__ void k(int* x) { int offset = 2; x[0] = offset; }\n", None, 0),  # a local
    ("static const int kN = 4 * sizeof(float);\nconst float kScale = std::max(1.f, 2.f);\n"
     "__global__ void k(float* x) { x[0] = kN * kScale; }\n", None, 0),  # a second copy changes nothing
]


@pytest.mark.parametrize("source,reason,line", REFUSALS)
def test_refusals(tmp_path, source, reason, line):
    result = split_text(tmp_path, HEAD + source)
    if reason is None:
        assert isinstance(result, Split), result
        return
    assert isinstance(result, Unsplittable), result
    assert reason in result.reason and result.line == line, result


def test_a_header_name_probe_stays_in_both_tus_as_written(tmp_path):
    """``__has_include(<...>)`` (also inside a macro's body) is answered by the include search, which both TUs
    share with the file as written: the split keeps the condition and its branches for the compilers to decide."""
    src = (HEAD + "#if __has_include(<cuda/std/bit>)\n#define HAVE_BIT 1\n#else\n#define HAVE_BIT 0\n#endif\n"
           "#define HAVE_NOPE __has_include( <kk/no/such.h> )\n"
           "__global__ void k(float* x) {\n#if __has_include(<cuda/std/limits>) && HAVE_BIT\n  x[0] = 1;\n#endif\n}\n"
           + LAUNCH)
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    assert "#if __has_include(<cuda/std/bit>)" in result.device and "#if __has_include(<cuda/std/bit>)" in \
        result.host.whole
    assert "#if __has_include(<cuda/std/limits>) && HAVE_BIT" in result.device


@pytest.mark.parametrize("text,found", [
    ("#if __has_include(<a/b.h>)\n#endif\n", [b"<a/b.h>"]),
    ("#if __has_include ( <a.h> ) && X\n#endif\n", [b"<a.h>"]),
    ('#if __has_include("a.h")\n#endif\n', []),
    ("#if __has_include(<a.h>\n#endif\n", []),  # unclosed: left for the parser (and a refusal)
    ("#if __has_include(<a /* b.h>)\n#endif\n", []),
])
def test_header_name_probes_read_one_header_name(text, found):
    from kernelkit.jit.fast.split import tree as ts

    src = text.encode()
    assert [src[s:e] for _, s, e in ts.header_name_probes(ts.parse(text).root_node, src)] == found


def test_code_under_if_0_need_not_parse_and_stays_as_written(tmp_path):
    """Old code kept under ``#if 0`` is never compiled: both TUs keep the group as it is, and what its ``#else``
    holds is split like any other code."""
    src = (HEAD + "#if 0\n// old, does not parse\n__global__ void k0(float* x) { x[0] = \n}\n#if X\n#endif\n"
           "/* #endif */\nvoid g(float* p) { k0<<<1, 1>>>(p); }\n#else  // the live one\n"
           "__global__ void k(float* x) { x[0] = 2; }\n#endif\n" + LAUNCH)
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    for tu in (result.device, result.host.whole):
        assert "__global__ void k0(float* x) { x[0] = \n}" in tu and "#else" in tu
    assert "x[0] = 2;" in result.device and "x[0] = 2;" not in result.host.whole


@pytest.mark.parametrize("text,groups", [
    (b"#if 0\nx(\n#endif\n", [b"x(\n"]),
    (b"  #  if 0 // old\nx(\n#  else\ny;\n#endif\n", [b"x(\n"]),
    (b"#if 0\n#ifdef A\n#else\n#endif\n/*\n#endif\n*/x(\n#elif B\n#endif\n",
     [b"#ifdef A\n#else\n#endif\n/*\n#endif\n*/x(\n"]),
    (b"#if 0 && A\nx(\n#endif\n#if 00\n#endif\n", []),  # only the plain 0 is read
    (b"#if 0\nx(\n", []),  # unclosed: the parser's error stands
])
def test_never_compiled_groups_are_found_as_the_preprocessor_finds_them(text, groups):
    from kernelkit.jit.fast.split import tree as ts

    assert [text[s:e] for s, e in ts.never_compiled(text)] == groups


def test_explicit_specialisations_of_a_type_device_code_uses_stay(tmp_path):
    """A specialisation left behind changes the arithmetic silently (half math in place of float)."""
    src = ("#include <torch/types.h>\ntemplate <typename T> struct Acc { using type = T; };\n"
           "template <> struct Acc<at::Half> { using type = float; };\n"
           "template <typename T> struct Acc<T*> { using type = T; };\n"
           "template <typename T> __global__ void k(T* x) { typename Acc<T>::type v = x[0]; x[0] = v + v; }\n"
           "void f(at::Tensor t) { k<at::Half><<<1, 1>>>(t.data_ptr<at::Half>()); }\n")
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    assert "template <> struct Acc<at::Half> { using type = float; };" in result.device
    assert "#include <c10/util/Half.h>" in result.device


def test_an_explicit_specialisation_of_a_kernel_is_declared_in_the_host_tu_and_defined_in_the_device_tu(tmp_path):
    """``template <> __global__ void k<double>(...) {...}`` is a kernel of its own: the host TU's declaration makes
    its launches call the specialisation's stub (not the primary template's), which the device object defines."""
    src = (HEAD + "template <typename T, int B = 256> __global__ void k(T* x) { x[0] = B; }\n"
           "template <>\n__global__ void k<double, 256>(double* x) {\n  x[0] = -1;\n}\n"
           "void f(at::Tensor t) { k<double><<<1, 1>>>(t.data_ptr<double>()); k<float><<<1, 1>>>(nullptr); }\n")
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    host = result.host.text
    assert "__global__ void k<double, 256>(double* x) ;" in " ".join(host.split()), host
    assert "x[0] = -1;" not in host and "  x[0] = -1;" in result.device.split("\n")
    assert result.kernels == ("k",) and "k" in result.templates


def test_a_kernel_defined_by_its_qualified_name_is_left_to_its_namespaces_declaration(tmp_path):
    """``__global__ void ops::k(...) {...}`` after ``namespace ops { __global__ void k(...); }``: the host TU's
    declaration is the namespace's own (a qualified redeclaration outside it would not compile)."""
    src = (HEAD + "namespace ops { template <typename T> __global__ void k(T* x); __global__ void m(float* x); }\n"
           "template <typename T>\n__global__ void ops::k(T* x) { x[0] = 1; }\n"
           "__global__ void ops::m(float* x) { x[0] = 2; }\n"
           "void f(float* x) { ops::k<float><<<1, 1>>>(x); ops::m<<<1, 1>>>(x); }\n")
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    assert "void ops::k(T* x)" not in result.host.text and "void ops::m(float* x)" not in result.host.text
    assert "__global__ void ops::m(float* x) { x[0] = 2; }" in result.device
    assert result.kernels == ("ops::k", "ops::m") and "ops::k" in result.templates
    undeclared = src.replace("template <typename T> __global__ void k(T* x); ", "")
    assert "no declaration" in split_text(tmp_path, undeclared).reason


def test_a_launch_in_a_macro_is_lowered_in_the_macros_body(tmp_path):
    src = (HEAD + "__global__ void k(float* x, int n) { x[0] = n; }\n"
           "#define LAUNCH(p, n) \\\n  k<<<dim3(1, 1), 32, 0, at::cuda::getCurrentCUDAStream()>>>(p, n)\n"
           "void f(float* x) {\n  LAUNCH(x, 3);\n}\n")
    host = split_text(tmp_path, src).host.text
    assert ("  (__cudaPushCallConfiguration(dim3(1, 1), 32, 0, at::cuda::getCurrentCUDAStream())) ? (void)0 : "
            "k(p, n)\n") in host, host
    inside = HEAD + "__global__ void k(float* x) {\n#define GO(p) k<<<1, 1>>>(p)\n  x[0] = 1;\n}\nvoid f(float* x) { GO(x); }\n"
    host = split_text(tmp_path, inside).host.text  # defined in a kernel's body, which the host TU keeps
    assert "#define GO(p) (__cudaPushCallConfiguration(1, 1)) ? (void)0 : k(p)\n" in host, host


def test_namespaces_only_nvcc_declares_are_declared_empty_for_g_plus_plus(tmp_path):
    """g++ does not see ``nvcuda`` or ``cooperative_groups`` (CUDA's headers declare them under nvcc alone): an empty
    namespace on the same line, at file scope, lets the host TU compile and changes no lookup."""
    src = (HEAD + "#include <mma.h>\n#include <cooperative_groups.h>\nusing namespace nvcuda::wmma;\n"
           "namespace cg = cooperative_groups;\nusing namespace cg;\nnamespace mine { using namespace nvcuda; }\n"
           "__global__ void k(float* x) { cg::this_thread_block().sync(); x[0] = 1; }\n" + LAUNCH)
    host = split_text(tmp_path, src).host.text.split("\n")
    assert "namespace nvcuda { namespace wmma { }} using namespace nvcuda::wmma;" in host, host
    assert "namespace cooperative_groups { } namespace cg = cooperative_groups;" in host
    assert "using namespace cg;" in host  # an alias: declaring it a namespace would not compile
    assert "namespace mine { using namespace nvcuda; }" in host  # inside a namespace: a new one would be found first


def test_the_host_tu_leaves_out_cub_unless_host_code_uses_its_macros(tmp_path):
    src = (HEAD + "#include <cooperative_groups/reduce.h>\n#ifndef USE_ROCM\n#include <cub/cub.cuh>\n#endif\n"
           "__global__ void k(float* x) { using R = cub::BlockReduce<float, 32>; x[0] = sizeof(R); }\n" + LAUNCH)
    result = split_text(tmp_path, src)
    assert result.host.left_out == ("<cooperative_groups/reduce.h>", "<cub/cub.cuh>")
    assert "#include <cub/cub.cuh>" not in result.host.text and "#include <cub/cub.cuh>" in result.device
    assert "cooperative_groups/reduce.h" not in result.host.text and "cooperative_groups/reduce.h" in result.device
    assert "#ifndef USE_ROCM\n\n#endif" in result.host.text, result.host.text
    versioned = src.replace(LAUNCH, "int version() { return CUB_VERSION; }\n" + LAUNCH)
    assert "#include <cub/cub.cuh>" in split_text(tmp_path, versioned).host.text


def test_an_explicit_instantiation_of_a_kernel_goes_with_device_code(tmp_path):
    """The device object then holds the instantiated kernel and its stub, which the host's launches bind to; the
    host TU, where the kernel is a stub declaration, has nothing to instantiate."""
    inst = "template __global__ void k<float, 3>(float*);"
    src = ("#include <torch/types.h>\ntemplate <typename T, int K> __global__ void k(T* x) { x[0] *= K; }\n"
           f"{inst}\nvoid f(at::Tensor t) {{ k<float, 3><<<1, 1>>>(t.data_ptr<float>()); }}\n")
    result = split_text(tmp_path, src)
    assert isinstance(result, Split), result
    assert inst in device_text(result, [])
    assert inst not in result.host.whole and "k<float, 3>" in result.host.whole  # the launch stays


def test_host_code_of_torchs_heavy_api_leaves_the_device_tu(tmp_path):
    src = (HEAD + "namespace py = pybind11;\nusing torch::Tensor;\nstatic const int kThreads = 256;\n"
           "struct Fn : torch::autograd::Function<Fn> { static Tensor forward(int); };\n"
           "__global__ void k(float* x) { x[0] = kThreads; }\n" + LAUNCH +
           "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }\n")
    device = split_text(tmp_path, src).device
    for gone in ("pybind11", "using torch::Tensor", "autograd", "PYBIND11_MODULE", "torch::Tensor f("):
        assert gone not in device, gone
    assert "static const int kThreads = 256;" in device


def test_device_names_leave_out_what_device_code_declares(tmp_path):
    src = (HEAD + "template <int N> __device__ float pw(float v) { float r = 1; for (int i = 0; i < N; ++i) r *= v;"
           " return r; }\n__global__ void k(float* x, int n) { auto w = pw<3>(x[0]); x[n] = expf(w); }\n" + LAUNCH)
    names = split_text(tmp_path, src).names
    assert {"pw", "expf"} <= names and not {"r", "i", "N", "w", "x", "n", "v"} & names


# ----------------------------------------------------------------------------------------------- host flags
def test_host_flags_translate_nvcc_flags():
    flags = ["-DX=1", "-I/inc", "-isystem", "/sys", "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr",
             "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC,-Wall", "-std=c++17", "-O3",
             "--use_fast_math", "-lineinfo", "-arch=sm_90", "--compiler-options=-g", "-U", "NDEBUG"]
    out = host_flags(flags, cuda_home="/usr/local/cuda")
    tail = out[out.index("-Wno-psabi") + 1:]
    assert tail == ["-DX=1", "-I/inc", "-isystem", "/sys", "-D__CUDA_NO_HALF_OPERATORS__", "-fPIC", "-Wall",
                    "-std=c++17", "-O3", "-g", "-U", "NDEBUG"]
    assert any(f.startswith("-I") and f.endswith("include") for f in out[:3])


@pytest.mark.parametrize("bad", [["-rdc=true"], ["--default-stream", "per-thread"], ["-ccbin", "clang++"],
                                 ["-Xcompiler"]])
def test_host_flags_refuse_what_they_cannot_translate(bad):
    assert host_flags(["-O2", *bad], cuda_home="/usr/local/cuda") is None


# ----------------------------------------------------------------------------------------------- binding
TEMPLATES = {"ns::k": ("/x.cu", 3), "plain": ("/x.cu", 9)}


def test_wanted_reads_the_specialisations_from_demangled_symbols():
    undefined = [("_Z1", "void ns::k<float, 4>(float const*, int)", "U"),
                 ("_Z2", "void ns::k<c10::Half, 1>(c10::Half const*, int)", "U"),
                 ("_Z3", "plain(float*)", "U"), ("cudaMalloc", "cudaMalloc", "U")]
    specs = instantiate.wanted(undefined, TEMPLATES)
    assert [s.demangled for s in specs] == ["void ns::k<float, 4>(float const*, int)",
                                            "void ns::k<c10::Half, 1>(c10::Half const*, int)"]
    assert instantiate.headers_for(specs) == ["c10/util/Half.h"]
    text = instantiate.instantiations(specs)
    assert "static auto* const kk_instance_0 = &::ns::k<float, 4>;" in text


@pytest.mark.parametrize("sym", ["void ns::k<(anonymous namespace)::Op>(int)",
                                 "void ns::k<run(at::Tensor)::{lambda(float)#1}>(int)"])
def test_unspellable_specialisations_raise(sym):
    with pytest.raises(InstantiationError):
        instantiate.wanted([("_Z", sym, "U")], TEMPLATES)


def test_torch_types_beyond_the_light_headers_raise():
    with pytest.raises(InstantiationError):
        instantiate.headers_for([instantiate.Symbol("_Z", "void k<at::Tensor>(int)")])
    accessor = "void k<float>(at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, int>)"
    assert instantiate.headers_for([instantiate.Symbol("_Z", accessor)]) == []  # the kernel spells its parameters


def test_local_aliases_bind_what_the_host_asks_for_to_the_device_objects_local_symbols():
    undefined = [("_Z2k2Pf", "k2(float*)", "U"), ("_Z2k1Pf", "k1(float*)", "U"), ("coef", "coef", "U"),
                 ("_Z5otherv", "other()", "U")]
    defined = [("_ZL2k2Pf", "k2(float*)", "t"), ("_Z2k1Pf", "k1(float*)", "T"), ("_ZL4coef", "coef", "b"),
               ("_ZL5otherv", "other()", "t")]
    assert instantiate.local_aliases(undefined, defined, {"k1", "k2", "coef"}) == {"_Z2k2Pf": "_ZL2k2Pf",
                                                                                    "coef": "_ZL4coef"}


# ----------------------------------------------------------------------------------------------- real builds
BUILT = ["const_poly.cu", "anon_rownorm.cu", "kernel_attribute.cu"]  # sigmoid_dispatch: tests/test_torch_cu.py loads it


@pytest.mark.cuda_build
@pytest.mark.parametrize("name", BUILT)
def test_split_builds_bind_and_link_against_torch(name, tmp_path):
    """Both TUs compiled with torch's flags, bound as the loader binds them (the host object's references to
    kernel stubs and device variables resolved, aliases made local), and linked against torch: nothing the
    split generates is left undefined or exported."""
    from kernelkit.jit import plan, toolchain
    from kernelkit.jit.fast import torch_cu
    from kernelkit.jit.fast.torch_cu import _bind, _Part

    stem = Path(name).stem
    result = split_file(name)
    nvcc_flags = plan._torch_style_flags(stem, "cu", True, [], ["9.0"], False)
    host_cpp, host_o = tmp_path / f"{stem}.host.cpp", tmp_path / f"{stem}.host.o"
    host_cpp.write_text(result.host.whole)
    subprocess.run([toolchain.cxx(), *host_flags(nvcc_flags), "-c", str(host_cpp), "-o", str(host_o)],
                   check=True, capture_output=True, text=True)
    dev_cu, dev_o = tmp_path / f"{stem}.dev.cu", tmp_path / f"{stem}.dev.o"
    dev_cu.write_text(device_text(result, instantiate.symbols(host_o, undefined=True)))
    proc = subprocess.run([toolchain.nvcc(), *nvcc_flags, "-Xcompiler", f"-iquote,{corpus_path(name).parent}", "-c",
                           str(dev_cu), "-o", str(dev_o)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    joined, so = tmp_path / f"{stem}.o", tmp_path / f"{stem}.so"
    target = units.Target(stem, [], [], "k", True, None, {}, {})
    _bind(result, _Part(dev_o, ""), _Part(host_o, ""), None, joined, target)
    subprocess.run([toolchain.cxx(), str(joined), "-o", str(so), *units.link_flags(True, CASES[name].pybind, [])],
                   check=True, capture_output=True, text=True)
    undefined = subprocess.run(["nm", "-u", "-C", str(so)], capture_output=True, text=True, check=True).stdout
    for entity in result.entities:
        assert entity not in undefined, entity
    assert "kk_" not in subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    if result.templated:
        assert "kk_instance_" in dev_cu.read_text()
    assert torch_cu.applies  # the loader's own path builds these the same way (tests/test_torch_cu.py)


_PREAMBLE_BODY = """
__global__ void k(float* x) { x[0] = 1.0f; }
torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }
"""


@pytest.mark.parametrize("head, expected", [
    ("// a comment\n#include <torch/extension.h>\n/* another */\n#include <vector>\n",
     ["<torch/extension.h>", "<vector>"]),
    ("#include <cuda_runtime.h>\n#include <ATen/ATen.h>\n", ["<cuda_runtime.h>", "<ATen/ATen.h>"]),
    ("#define NDEBUG\n#include <torch/extension.h>\n", None),  # a macro before them changes what they mean
    ("#include <torch/extension.h>\n#define X 1\n#include <vector>\n", ["<torch/extension.h>"]),
    ("#ifdef USE_IT\n#include <vector>\n#endif\n#include <torch/extension.h>\n", None),
    ('#include "local.h"\n#include <torch/extension.h>\n', None),  # its code comes first
    ("#include <vector>\n#include <cstdio>\n", None),  # no torch: nothing worth precompiling
])
def test_the_host_preamble_is_the_files_leading_torch_includes_and_nothing_else(tmp_path, head, expected):
    """``#include <preamble>`` + the rest is the host TU's token stream: the preamble holds the TU's prefix and
    the file's leading ``<...>`` includes, the rest resumes at the user's line."""
    (tmp_path / "local.h").write_text("#pragma once\nstatic const int kLocal = 1;\n")
    result = split_text(tmp_path, head + _PREAMBLE_BODY, "p.cu")
    assert isinstance(result, Split), result
    tu = result.host
    if expected is None:
        assert tu.preamble == "" and tu.include_line() == tu.prefix
        return
    includes = [ln.split(" ", 1)[1] for ln in tu.preamble.splitlines() if ln.startswith("#include")]
    assert includes == re.findall(r"#include (\S+)", tu.prefix) + expected
    lines = (head + _PREAMBLE_BODY).splitlines()
    last = max(i for i, ln in enumerate(head.splitlines(), 1) if ln.split(" ")[-1] in expected)
    resume = next(i for i, ln in enumerate(lines, 1) if i > last and ln.strip() and not ln.startswith("/*"))
    assert tu.rest_text().startswith(f'#line {resume} "{tmp_path / "p.cu"}"\n')  # blank lines are left out
    assert tu.text == tu.include_line() + tu.rest_text()


# ----------------------------------------------------------------------------------------------- the proof
PTX = """//
// Generated by NVIDIA NVVM Compiler
.version 9.0
.target sm_90
.address_size 64
.global .align 1 .b8 _ZN34_INTERNAL_{h}_4_s_cu_c8b9fd524cuda3std3__45__cpo5beginE[1];
.const .align 4 .b8 _ZN34_INTERNAL_{h}_4_s_cu_c8b9fd527c_tableE[8] = {{0, 0, 128, 63, 0, 0, 0, 64}};

.func  (.param .b32 func_retval0) _ZN34_INTERNAL_{h}_4_s_cu_c8b9fd523twoEf(
\t.param .b32 _ZN34_INTERNAL_{h}_4_s_cu_c8b9fd523twoEf_param_0
)
{{
\tld.param.f32 \t%f1, [_ZN34_INTERNAL_{h}_4_s_cu_c8b9fd523twoEf_param_0];
\tmul.f32 \t%f2, %f1, 0f{c};
\tst.param.f32 \t[func_retval0], %f2;
\tret;
}}
.visible .entry _Z1kPf(
\t.param .u64 _Z1kPf_param_0
)
{{
\t.loc 1 7 3
\tld.const.f32 \t%f1, [_ZN34_INTERNAL_{h}_4_s_cu_c8b9fd527c_tableE];
\t@%p1 bra \t$L__BB{n}_2;
\tcall.uni (retval0), _ZN34_INTERNAL_{h}_4_s_cu_c8b9fd523twoEf, (param0);
$L__BB{n}_2:
\tret;
}}
"""


def test_the_proof_sets_aside_what_differs_by_construction_and_nothing_else():
    from kernelkit.jit.fast import split_proof

    a = PTX.format(h="a6ae2dd4", c="40000000", n=0)
    assert split_proof.difference(a, PTX.format(h="0badf00d", c="40000000", n=3)) is None  # names, labels
    assert {"k(float*)", "two(float)", "c_table"} == set(split_proof.normalized(a)[0])
    why = split_proof.difference(a, PTX.format(h="0badf00d", c="40400000", n=0))
    assert why is not None and "two(float)" in why, why
    assert "begin" not in " ".join(split_proof.normalized(a)[0])  # a header's unused object is not compared
    missing = split_proof.difference(a, PTX.format(h="a6ae2dd4", c="40000000", n=0).replace(".visible .entry", ".entry"))
    assert missing is None  # visibility alone is no device code


def test_each_host_line_is_marked_but_inside_a_continued_directive(tmp_path):
    """The second preprocessing marks every host line; a mark between a macro's continued lines would become part
    of the macro (``#line`` read as a stringizing ``#``)."""
    src = HEAD + '#define NAMED(x) \\\n  #x\n__global__ void k(float* x) {}\nconst char* f() { return NAMED(f); }\n' + LAUNCH
    marked = split_text(tmp_path, src).host.each_line_marked(1000)
    lines = marked.split("\n")
    i = lines.index("#define NAMED(x) \\")
    assert lines[i + 1] == "  #x" and lines[i - 1].startswith("#line ") and lines[i + 2].startswith("#line ")
