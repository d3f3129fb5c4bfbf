"""The automatic split of torch-style .cu files (kernelkit.jit.split) on the corpus in fixtures/torch_cu: the
decision per file, the generated TUs (parse, #line marks, caching by content), and, for a handful of files, a
real g++ + nvcc build of both TUs linked against torch with no launcher left undefined."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernelkit.jit import syntax
from kernelkit.jit.split import (
    InstantiationError,
    Split,
    Unsplittable,
    device_text,
    host_flags,
    local_headers,
    split_source,
)
from kernelkit.jit.split.instantiate import headers_for, wanted

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "torch_cu"))
from cases import CASES  # noqa: E402
from cases import path as corpus_path

SPLIT = sorted(n for n, c in CASES.items() if c.decision == "split")


def split_file(name: str):
    p = corpus_path(name)
    return split_source(p.read_text(), str(p), local_headers([]))


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


QUALIFIERS = {"__host__", "__device__", "__forceinline__", "inline"}


def _parses(tu: str) -> None:
    """Parse errors are allowed only on lines using a qualifier macro (``#define HD __host__ __device__``,
    defined empty in the host TU): the grammar cannot see through those."""
    lines = tu.split("\n")
    empty = {ln.split()[1] for ln in lines if ln.startswith("#define ") and set(ln.split()[2:]) <= QUALIFIERS}
    for n in _walk(syntax.parse(tu).root_node):
        if n.type == "ERROR" or n.is_missing:
            assert any(m in lines[n.start_point[0]] for m in empty), f"host TU error at {lines[n.start_point[0]]!r}"


def _walk(node):
    yield node
    for c in node.children:
        yield from _walk(c)


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


def _original_lines(p: str):
    return Path(p).read_text().split("\n")


def _blank(s: str) -> str:
    return s.replace("__host__", " " * 8).replace("__device__", " " * 10)


@pytest.mark.parametrize("name", SPLIT)
def test_generated_tus_parse_and_cite_the_users_lines(name):
    result = split_file(name)
    _parses(result.device)
    _parses(result.host)
    checked = 0
    for which, tu in (("device", result.device), ("host", result.host)):
        for ln, where in zip(tu.split("\n"), _line_map(tu)):
            if where is None or not ln.strip() or "kk_" in ln or ln.startswith("#line") or ln.strip() == "}":
                continue  # generated: launchers, namespace closers
            original = _original_lines(where[0])[where[1] - 1]
            if original.startswith(("#ifndef", "#endif", "#pragma once")) or "<<<" in original or ">>>" in original:
                continue  # a local header's include guard (blanked where it is inlined), a rewritten launch
            if which == "host":
                assert _blank(original).rstrip() == ln.rstrip(), f"{name}: host line {where} moved"
            else:
                assert original.rstrip() == ln.rstrip() or ln.lstrip().startswith("inline ") and \
                    original.strip() in ln, f"{name}: device line {where} moved"
            checked += 1
    assert checked > 10


def test_a_kernel_line_in_the_device_tu_maps_to_its_original_line():
    result = split_file("relu_extension.cu")
    lines = result.device.split("\n")
    i = next(k for k, ln in enumerate(lines) if "out[i] = v > 0.f ? v : v * slope;" in ln)
    where = _line_map(result.device)[i]
    assert where == (str(corpus_path("relu_extension.cu")), 15)


def _edited(name: str, old: str, new: str):
    p = corpus_path(name)
    text = p.read_text()
    assert text.count(old) == 1
    return split_source(text.replace(old, new), str(p), local_headers([]))


@pytest.mark.parametrize("name,old,new", [
    ("relu_extension.cu", "out[i] = v > 0.f ? v : v * slope;", "out[i] = v >= 0.f ? v : slope * v;"),
    ("sigmoid_dispatch.cu", "dx[i] = static_cast<scalar_t>(static_cast<float>(grad[i]) * s * (1.f - s));",
     "dx[i] = static_cast<scalar_t>(static_cast<float>(grad[i]) * (s - s * s));"),
    ("const_poly.cu", "for (int k = c_degree - 1; k >= 0; --k) acc = acc * v + c_coeffs[k];",
     "for (int k = c_degree - 1; k >= 0; k--) { acc = fmaf(acc, v, c_coeffs[k]); }"),
])
def test_a_kernel_body_edit_keeps_the_host_text(name, old, new):
    before, after = split_file(name), _edited(name, old, new)
    assert before.host == after.host
    assert before.device != after.device


def test_a_host_edit_keeps_the_device_text():
    before = split_file("block_sum.cu")
    after = _edited("block_sum.cu", '"vector_sum: expected a float CUDA tensor"', '"vector_sum: float32 on the GPU"')
    assert before.device == after.device
    assert before.host != after.host


def test_launches_become_launcher_calls_with_the_configuration_filled_in():
    host = split_file("hd_macro.cu").host
    assert "<<<" not in host
    assert re.search(r"kk_launch_\w+_soft_clip_square_kernel\(\(n \+ 255\) / 256, 256, 0, 0, xc\.data_ptr", host)
    assert "__host__" not in host.split("#line")[-1]  # g++ would warn about the attribute


def test_anonymous_namespaces_get_a_hidden_named_namespace_in_both_tus():
    result = split_file("anon_rownorm.cu")
    for tu in (result.host, result.device):
        assert 'namespace [[gnu::visibility("hidden")]] kk_anon_' in tu
        assert "namespace {" not in tu


def test_device_tu_has_no_torch_umbrella_and_the_light_headers_it_needs():
    lltm = split_file("lltm_accessor.cu").device
    assert "torch/extension.h" not in lltm
    assert "#include <ATen/core/TensorAccessor.h>" in lltm
    assert "namespace torch { using namespace at; }" in lltm
    relu = split_file("relu_extension.cu").device
    assert "TensorAccessor" not in relu and "c10/util/Half.h" not in relu
    assert "#define CHECK_INPUT" in relu and "constexpr int kThreads = 256;" not in relu  # kThreads: host only


def test_local_header_is_inlined_with_marks_naming_it():
    result = split_file("local_header.cu")
    assert '#line 5 "' + str(corpus_path("axpby_kernels.cuh")) + '"' in result.device
    assert "include/axpby_common.h" in result.device  # the nested header's own #line marks
    assert '#include "axpby_kernels.cuh"' not in result.host


# ----------------------------------------------------------------------------------------------- refusals
REFUSALS = [
    ("#include <torch/extension.h>\n#ifdef USE_K\n__global__ void k(float* x) {}\n#endif\n",
     "device code inside a preprocessor conditional", 3),
    ("#include <torch/extension.h>\n__global__ void k(float* x) {}\nint f() {\n#if __CUDA_ARCH__ >= 800\n"
     "return 1;\n#endif\nreturn 0; }\n", "__CUDA_ARCH__ in host code", 4),
    ("#include <torch/extension.h>\n#define LAUNCH(x) k<<<1, 1>>>(x)\n__global__ void k(float* x) {}\n",
     "a kernel launch inside the macro LAUNCH", 2),
    ("#include <torch/extension.h>\n__global__ void k(float* x) {}\n__global__ void k(int* x) {}\n",
     "overloaded kernel name k", 3),
    ("#include <torch/extension.h>\n__global__ void c(float* x) {}\n__global__ void p(float* x) { c<<<1, 1>>>(x); }\n",
     "dynamic parallelism", 3),
    ("#include <torch/extension.h>\n__managed__ int counter;\n__global__ void k(int* x) { x[0] = counter; }\n"
     "int f() { return counter; }\n", "__managed__ variable counter used in host code", 4),
    ("#include <torch/extension.h>\n__device__ float twice(float v) { return 2 * v; }\n"
     "__global__ void k(float* x) { x[0] = twice(x[0]); }\nauto p = &twice;\n", "__device__ function twice", 4),
    ("#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = at::native::foo(); }\n",
     "device code uses torch's at::native::foo", 2),
    ("#include <torch/extension.h>\nvoid f(float* x) { other_kernel<<<1, 1>>>(x); }\n",
     "not a kernel defined in this file", 2),
    ("#include <torch/extension.h>\n__global__ void k(float* x) {\n#ifdef C10_USE_GLOG\nx[0] = 1;\n#endif\n}\n",
     "device code tests the macro C10_USE_GLOG", 3),
    ("#include <torch/extension.h>\nstruct P {\n#if AT_PARALLEL_OPENMP\nint pad;\n#endif\nfloat a; };\n"
     "__global__ void k(P p, float* x) { x[0] = p.a; }\n", "device code tests the macro AT_PARALLEL_OPENMP", 3),
    ("#include <torch/extension.h>\n#define MINE 1\n__global__ void k(float* x) {\n#if MINE && __CUDA_ARCH__ >= 800\n"
     "x[0] = 1;\n#endif\n}\n", None, 0),
    ("#include <torch/extension.h>\n__global__ void k(float* x) {}\n", None, 0),
]


@pytest.mark.parametrize("source,reason,line", REFUSALS)
def test_refusals(tmp_path, source, reason, line):
    p = tmp_path / "x.cu"
    result = split_source(source, str(p))
    if reason is None:
        assert isinstance(result, Split)
        return
    assert isinstance(result, Unsplittable), result
    assert reason in result.reason and result.line == line, result


def test_explicit_specialisations_of_a_type_device_code_uses_go_with_it(tmp_path):
    """A specialisation left behind changes the arithmetic silently (half math in place of float): found by the
    GPU differential of bf16_scale.cu, whose OpMath<at::Half> makes the accumulator float."""
    src = ("#include <torch/types.h>\ntemplate <typename T> struct Acc { using type = T; };\n"
           "template <> struct Acc<at::Half> { using type = float; };\n"
           "template <typename T> struct Acc<T*> { using type = T; };\n"
           "template <typename T> __global__ void k(T* x) { typename Acc<T>::type v = x[0]; x[0] = v + v; }\n"
           "void f(at::Tensor t) { k<at::Half><<<1, 1>>>(t.data_ptr<at::Half>()); }\n")
    result = split_source(src, str(tmp_path / "x.cu"))
    assert isinstance(result, Split), result
    assert "struct Acc<at::Half> { using type = float; };" in result.device
    assert "struct Acc<T*> { using type = T; };" in result.device
    assert "#include <c10/util/Half.h>" in result.device


def test_a_local_header_without_guard_included_twice_is_refused(tmp_path):
    (tmp_path / "k.cuh").write_text("__device__ float one() { return 1.f; }\n")
    src = '#include <torch/extension.h>\n#include "k.cuh"\n#include "k.cuh"\n__global__ void k(float* x) {}\n'
    result = split_source(src, str(tmp_path / "x.cu"), local_headers([]))
    assert result == Unsplittable('local header "k.cuh" is included twice and has no include guard', 3)


def test_a_host_used_device_variable_becomes_a_reference_to_its_shadow():
    result = split_file("const_poly.cu")
    assert re.search(r'extern int \(&c_degree\) __asm__\("kk_var_\w+_c_degree"\);', result.host)
    assert re.search(r'extern "C" \{ .* int \(&kk_var_\w+_c_degree\) = c_degree; \}', result.device)
    assert "cudaMemcpyToSymbolAsync(const T& symbol" in result.host  # nvcc's C++ overload, for g++


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


# ----------------------------------------------------------------------------------------------- instantiation
LAUNCHERS = {"kk_launch_ab_k": (True, "/x.cu", 3), "kk_launch_ab_plain": (False, "/x.cu", 9)}


def test_wanted_reads_the_specialisations_from_demangled_symbols():
    syms = ["void ns::kk_launch_ab_k<float, 4>(dim3, dim3, unsigned long, CUstream_st*, float const*, int)",
            "void ns::kk_launch_ab_k<c10::Half, 1>(dim3, dim3, unsigned long, CUstream_st*, c10::Half const*, int)",
            "kk_launch_ab_plain(dim3, dim3, unsigned long, CUstream_st*, float*)", "cudaMalloc"]
    specs = wanted(syms, LAUNCHERS)
    assert specs == [("ns::kk_launch_ab_k", "<c10::Half, 1>"), ("ns::kk_launch_ab_k", "<float, 4>")]
    assert headers_for([a for _, a in specs]) == ["c10/util/Half.h"]


@pytest.mark.parametrize("sym", [
    "void kk_launch_ab_k<(anonymous namespace)::Op>(dim3, dim3, unsigned long, CUstream_st*)",
    "void kk_launch_ab_k<run(at::Tensor)::{lambda(float)#1}>(dim3, dim3, unsigned long, CUstream_st*)"])
def test_unspellable_specialisations_raise(sym):
    with pytest.raises(InstantiationError):
        wanted([sym], LAUNCHERS)


def test_torch_types_beyond_the_light_headers_raise():
    with pytest.raises(InstantiationError):
        headers_for(["<at::Tensor>"])


# ----------------------------------------------------------------------------------------------- real builds
BUILT = ["sigmoid_dispatch.cu", "const_poly.cu", "anon_rownorm.cu", "local_header.cu", "muladd_library.cu"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(name)``: the file's host TU compiled by g++ with the host side of torch's flags (the slow part),
    once per module however many tests ask."""
    from kernelkit.jit import plan, toolchain

    out = tmp_path_factory.mktemp("split")
    objs = {}

    def get(name):
        if name not in objs:
            stem = Path(name).stem
            result = split_file(name)
            nvcc_flags = plan._torch_style_flags(stem, "cu", True, [], ["9.0"], False)
            host_cpp, host_o = out / f"{stem}.host.cpp", out / f"{stem}.host.o"
            host_cpp.write_text(result.host)
            subprocess.run([toolchain.cxx(), *host_flags(nvcc_flags), "-c", str(host_cpp), "-o", str(host_o)],
                           check=True, capture_output=True, text=True)
            objs[name] = (result, nvcc_flags, host_o, out)
        return objs[name]

    return get


@pytest.mark.cuda_build
@pytest.mark.parametrize("name", BUILT)
def test_split_builds_link_against_torch(built, name):
    from kernelkit.jit import build, toolchain

    result, nvcc_flags, host_o, out = built(name)
    stem = Path(name).stem
    dev_cu, dev_o, so = out / f"{stem}.dev.cu", out / f"{stem}.dev.o", out / f"{stem}.so"
    dev_cu.write_text(device_text(result, host_o))
    proc = subprocess.run([toolchain.nvcc(), *nvcc_flags, "-c", str(dev_cu), "-o", str(dev_o)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    subprocess.run([toolchain.cxx(), str(host_o), str(dev_o), "-o", str(so),
                    *build.link_flags(True, CASES[name].pybind, [])], check=True, capture_output=True, text=True)
    undefined = subprocess.run(["nm", "-u", str(so)], capture_output=True, text=True, check=True).stdout
    generated = ("kk_launch_", "kk_anon_", "kk_var_", "kk_instance_")
    assert not any(g in undefined for g in generated)
    exported = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    assert not any(g in exported for g in generated)  # launchers and renamed namespaces stay hidden
    if CASES[name].pybind:
        assert f"PyInit_{stem}" in exported
    if result.templated:
        assert "kk_instance_" in dev_cu.read_text()


@pytest.mark.cuda_build
def test_dispatch_instantiates_exactly_what_the_host_object_calls(built):
    result, _, host_o, _ = built("sigmoid_dispatch.cu")
    text = device_text(result, host_o)
    instances = [ln for ln in text.split("\n") if "kk_instance_" in ln]
    assert len(instances) == 6  # two kernels x float, double, c10::Half
    assert sum("c10::Half" in ln for ln in instances) == 2
    assert "#include <c10/util/Half.h>" in text


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
    the file's leading ``<...>`` includes (comments between them dropped), the rest resumes at the user's line."""
    (tmp_path / "local.h").write_text("#pragma once\nstatic const int kLocal = 1;\n")
    src = tmp_path / "p.cu"
    src.write_text(head + _PREAMBLE_BODY)
    result = split_source(src.read_text(), str(src), local_headers([tmp_path]))
    assert isinstance(result, Split), result
    if expected is None:
        assert (result.preamble, result.host_rest) == ("", "")
        return
    prefix, rest = result.host.split(f'#line 1 "{src}"\n', 1)
    includes = [ln.split(" ", 1)[1] for ln in result.preamble.splitlines() if ln.startswith("#include")]
    assert result.preamble.startswith(prefix) and includes == re.findall(r"#include (\S+)", prefix) + expected
    last = max(i for i, ln in enumerate(head.splitlines(), 1) if ln.split(" ")[-1] in expected)
    assert result.host_rest.startswith(f'#line {last + 1} "{src}"\n')
    assert result.host_rest.split("\n", 1)[1] == "\n".join(rest.split("\n")[last:])
