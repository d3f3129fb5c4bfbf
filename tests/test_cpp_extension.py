"""The torch.utils.cpp_extension drop-in: torch-style sources and calls go through kernelkit unchanged.

Builds are shared per module (a torch/extension.h unit costs ~30 s on a 2-core machine): the extension
fixtures are built once, and the differential twins once through torch's own loader.
"""
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension as torch_ext

import kernelkit
from kernelkit import BuildError, KernelkitError
from kernelkit.jit import plan

FIXTURES = Path(__file__).parent / "fixtures" / "torch_ext"


def _public(module):
    return sorted(n for n in dir(module) if not n.startswith("_"))


@pytest.fixture(scope="module")
def ext_dir(tmp_path_factory):
    """A private copy of the two-file extension (tests edit it)."""
    d = tmp_path_factory.mktemp("torch_ext")
    for f in ("bind.cpp", "scale.cpp", "scale.h"):
        shutil.copy(FIXTURES / f, d / f)
    return d


@pytest.fixture(scope="module")
def ext(ext_dir):
    # torch's positional order: name, sources, extra_cflags
    return kernelkit.load("kk_ext", [str(ext_dir / "bind.cpp"), str(ext_dir / "scale.cpp")], ["-DKK_UNUSED=1"])


@pytest.fixture(scope="module")
def torch_twin(ext_dir, tmp_path_factory):
    """The same sources through torch's own loader (its build dir private to this run)."""
    build = tmp_path_factory.mktemp("torch_build")
    return torch_ext.load("kk_ext", [str(ext_dir / "bind.cpp"), str(ext_dir / "scale.cpp")], ["-DKK_UNUSED=1"],
                          build_directory=str(build))


def test_two_file_extension_loads_like_torch(ext, ext_dir):
    assert ext.__name__ == "kk_ext" and ext.extension_name() == "kk_ext"  # TORCH_EXTENSION_NAME per build
    assert Path(ext.__file__).is_file()
    assert ext.__doc__ == "kernelkit drop-in test extension"
    assert "x times the factor" in ext.scaled.__doc__
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(ext.scaled(x), 2.0 * x, rtol=0, atol=0)
    assert ext.add_ints(40, 2) == 42


def test_same_names_results_and_refusals_as_torch(ext, torch_twin):
    assert _public(ext) == _public(torch_twin)
    x = torch.randn(17)
    torch.testing.assert_close(ext.scaled(x), torch_twin.scaled(x), rtol=0, atol=0)
    for module in (ext, torch_twin):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            module.scaled("not a tensor")
        with pytest.raises(RuntimeError, match="must be a floating-point tensor"):
            module.scaled(torch.ones(3, dtype=torch.int64))


def test_edit_recompiles_the_edited_unit_only_and_reloads_in_process(ext, ext_dir):
    header = ext_dir / "scale.h"
    original = header.read_text()
    sources = [str(ext_dir / "bind.cpp"), str(ext_dir / "scale.cpp")]
    before = dict(kernelkit.STATS)
    try:
        header.write_text(original.replace("2.0", "3.0"))  # a header edit: torch's loader misses these
        edited = kernelkit.load("kk_ext", sources, ["-DKK_UNUSED=1"])
        assert kernelkit.STATS["compiles"] - before["compiles"] == 1  # scale.cpp; bind.cpp's object reused
        assert edited is not ext and edited.__name__ == "kk_ext"  # no kk_ext_v1
        assert importlib.import_module("kk_ext") is edited  # the newest build answers to its name
        x = torch.randn(4)
        torch.testing.assert_close(edited.scaled(x), 3.0 * x)
        torch.testing.assert_close(ext.scaled(x), 2.0 * x)  # the old module keeps its own code
    finally:
        header.write_text(original)
    again = kernelkit.load("kk_ext", sources, ["-DKK_UNUSED=1"])
    assert again is ext and kernelkit.STATS["compiles"] - before["compiles"] == 1  # undone edit: no compile
    assert sys.modules["kk_ext"] is ext


def test_warm_new_process_runs_no_compiler(ext, ext_dir):
    code = textwrap.dedent(f"""
        import os, subprocess, torch
        def refuse(*a, **k):
            raise AssertionError("a process was spawned: " + repr(a[:1]))
        subprocess.Popen = refuse
        os.posix_spawn = os.posix_spawnp = refuse
        import kernelkit
        m = kernelkit.load("kk_ext", [{str(ext_dir / "bind.cpp")!r}, {str(ext_dir / "scale.cpp")!r}], ["-DKK_UNUSED=1"])
        assert m.add_ints(1, 2) == 3 and kernelkit.STATS["compiles"] == 0 and kernelkit.STATS["links"] == 0
        print("warm ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warm ok" in out.stdout


def test_build_directory_receives_the_library(ext, ext_dir, tmp_path):
    sources = [str(ext_dir / "bind.cpp"), str(ext_dir / "scale.cpp")]
    again = kernelkit.load("kk_ext", sources, ["-DKK_UNUSED=1"], build_directory=str(tmp_path / "bd"))
    assert again is ext
    assert (tmp_path / "bd" / "kk_ext.so").read_bytes() == Path(ext.__file__).read_bytes()


INLINE_CPP_A = "torch::Tensor twice(torch::Tensor x) { TORCH_CHECK(x.dim() > 0, \"twice: x must not be 0-d\"); return 2 * x; }"
INLINE_CPP_B = "int64_t count(torch::Tensor x) { return x.numel(); }"
INLINE_FUNCS = {"twice": "2 * x", "count": "number of elements"}


def _torch_positional(function, **values):
    """Positional arguments in the installed torch's order (torch 2.8 put sycl_sources before functions), up to
    the last one given: the call a user of this torch writes."""
    order = list(inspect.signature(getattr(torch_ext, function)).parameters)[1:]
    last = max(order.index(k) for k in values)
    return tuple(values.get(k) for k in order[:last + 1])


@pytest.fixture(scope="module")
def inline_pair(tmp_path_factory):
    # every argument positional, in the installed torch's order: name, cpp_sources (a list), cuda_sources,
    # [sycl_sources,] functions (a dict)
    args = _torch_positional("load_inline", cpp_sources=[INLINE_CPP_A, INLINE_CPP_B], functions=INLINE_FUNCS)
    ours = kernelkit.load_inline("kk_inline", *args)
    theirs = torch_ext.load_inline("kk_inline", *args, build_directory=str(tmp_path_factory.mktemp("torch_inline")))
    return ours, theirs


def test_load_inline_torch_order_matches_torch(inline_pair):
    ours, theirs = inline_pair
    assert _public(ours) == _public(theirs)
    assert ours.twice.__doc__ == theirs.twice.__doc__ and "2 * x" in ours.twice.__doc__
    x = torch.randn(3, 4)
    torch.testing.assert_close(ours.twice(x), theirs.twice(x), rtol=0, atol=0)
    assert ours.count(x) == theirs.count(x) == 12
    for module in (ours, theirs):  # with_pytorch_error_handling: a c10::Error arrives as RuntimeError
        with pytest.raises(RuntimeError, match="must not be 0-d"):
            module.twice(torch.tensor(1.0))


def _torchs_text(text: str, name: str, file: str) -> str:
    """``text`` less its first line, which must name the file torch's load_inline writes (messages cite it)."""
    first, _, rest = text.partition("\n")
    cited = first.removeprefix('#line 1 "').removesuffix('"')
    assert first == f'#line 1 "{cited}"' and Path(cited).is_absolute(), first
    assert Path(cited).parts[-2:] == (name, file) and Path(cited).parent.parent.name.startswith("py"), first
    return rest


@pytest.mark.parametrize("functions, expected", [
    ("twice", {"twice": "twice"}),
    (["twice", "count"], {"twice": "twice", "count": "count"}),
    ({"twice": "doubles"}, {"twice": "doubles"}),
])
def test_functions_forms_generate_torchs_bindings(functions, expected):
    target = plan.plan_torch_inline("kk_forms", [INLINE_CPP_A, INLINE_CPP_B], None, functions)
    main = _torchs_text(target.units[0].path.read_text(), "kk_forms", "main.cpp")
    assert main.startswith("#include <torch/extension.h>\n")
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in main
    for name, doc in expected.items():
        assert f'm.def("{name}", torch::wrap_pybind_function({name}), "{doc}");' in main
    plain = plan.plan_torch_inline("kk_forms", INLINE_CPP_A, None, functions, with_pytorch_error_handling=False,
                                   no_implicit_headers=True).units[0].path.read_text()
    assert "#include <torch/extension.h>" not in plain and 'm.def("twice", twice, ' in plain
    assert "-DTORCH_EXTENSION_NAME=kk_forms" in target.units[0].flags
    assert "mod_gil_not_used" not in main
    free = plan.plan_torch_inline("kk_forms", INLINE_CPP_A, None, functions, gil_not_used=True)
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m, pybind11::mod_gil_not_used())" in free.units[0].path.read_text()


def test_gil_not_used_builds_a_module_that_declares_it(tmp_path):
    """torch 2.15's keyword, accepted on every torch: the bindings declare the GIL unused (pybind11 >= 2.13,
    which every supported torch bundles), and the module works as before."""
    header = Path(torch.utils.cpp_extension.include_paths()[0]) / "pybind11" / "pybind11.h"
    assert "mod_gil_not_used" in header.read_text(), f"{header}: pybind11 without mod_gil_not_used"
    module = kernelkit.load_inline("kk_gil_free", cpp_sources=INLINE_CPP_A, functions=["twice"], gil_not_used=True)
    x = torch.randn(5)
    torch.testing.assert_close(module.twice(x), 2 * x, rtol=0, atol=0)


@pytest.mark.cuda_build  # planning CUDA sources checks that nvcc's CUDA major version is torch's
def test_torch_inline_cuda_sources_get_torchs_headers():
    target = plan.plan_torch_inline("kk_cu_plan", "torch::Tensor f(torch::Tensor x);", "__global__ void k() {}",
                                    "f", arch="9.0")
    cu = next(u for u in target.units if u.kind == "cu")
    head = _torchs_text(cu.path.read_text(), "kk_cu_plan", "cuda.cu").splitlines()[:3]
    assert head == ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    assert "arch=compute_90,code=sm_90" in cu.flags and "-DTORCH_API_INCLUDE_EXTENSION_H" in cu.flags
    assert target.with_cuda and "-lcudart" in target.ldflags and "-ltorch_python" in target.ldflags


def test_device_code_passed_as_cpp_is_refused_at_once():
    before = kernelkit.STATS["compiles"]
    with pytest.raises(ValueError, match="cuda_sources"):
        kernelkit.load_inline("kk_swapped", "__global__ void k(float* x) { x[0] = 1; }", "int f();")
    with pytest.raises(ValueError, match="cuda="):
        kernelkit.load_inline("kk_swapped", cpp="void f() { k<<<1, 1>>>(); }")
    # in a comment, __global__ is no reason to refuse
    plan.refuse_device_code("// a __global__ kernel lives in the .cu\nint f();", "cpp_sources")
    assert kernelkit.STATS["compiles"] == before


@pytest.mark.parametrize("call, wrong, right", [
    (lambda: kernelkit.load_inline("x", "int f();", cuda_source="x"), "cuda_source", "cuda_sources"),
    (lambda: kernelkit.load("x", ["a.cpp"], extra_cflag=["-O2"]), "extra_cflag", "extra_cflags"),
    (lambda: kernelkit.load("x", ["a.cpp"], build_dir="b"), "build_dir", "build_directory"),
])
def test_unknown_keyword_names_the_one_it_resembles(call, wrong, right):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{wrong}'; did you mean '{right}'"):
        call()


def test_bad_arguments_say_what_was_expected(tmp_path):
    with pytest.raises(ValueError, match="sources: expected at least one"):
        kernelkit.load("x", [])
    with pytest.raises(FileNotFoundError, match="sources: .*nope.cpp does not exist"):
        kernelkit.load("x", [str(tmp_path / "nope.cpp")])
    (tmp_path / "a.cpp").write_text("int f() { return 1; }\n")
    with pytest.raises(ValueError, match="name: expected a Python identifier"):
        kernelkit.load("my-ext", [str(tmp_path / "a.cpp")])
    with pytest.raises(ValueError, match="mutually exclusive"):
        kernelkit.load("x", [str(tmp_path / "a.cpp")], is_standalone=True)
    with pytest.raises(ValueError, match="build_directory= applies to torch-style builds"):
        kernelkit.load("sigmoid", build_directory=str(tmp_path))
    with pytest.raises(TypeError, match="not both"):
        kernelkit.load_inline("x", "int f();", cpp="int g();")
    with pytest.raises(ValueError, match="functions: 'not an id' is not a C\\+\\+ identifier"):
        plan.plan_torch_inline("x", "int f();", None, ["not an id"])


def test_compile_errors_cite_the_users_lines(tmp_path):
    with pytest.raises(BuildError) as e:
        kernelkit.load_inline("kk_err", "int ok() { return 1; }\nint f() { return undefined_name; }\n",
                              no_implicit_headers=True, is_python_module=False)
    msg = str(e.value)
    assert "kk_err/main.cpp:2" in msg and "return undefined_name;" in msg
    src = tmp_path / "broken.cpp"
    src.write_text("int a() { return 0; }\n\nint b() { return missing_fn(); }\n")
    with pytest.raises(BuildError) as e:
        kernelkit.load("kk_err_file", [str(src)], is_python_module=False)
    assert "broken.cpp:3" in str(e.value) and "missing_fn" in str(e.value)


def test_undefined_symbol_is_named_and_not_cached(tmp_path):
    src = tmp_path / "undef.cpp"
    src.write_text('int declared_only(int);\nextern "C" int uses_it() { return declared_only(1); }\n')
    for _ in range(2):  # the broken library is not kept: the second call reports the same, not a stale load
        with pytest.raises(KernelkitError, match=r"undefined symbol declared_only\(int\)"):
            kernelkit.load("kk_undef", [str(src)], is_python_module=False)


def test_a_rebuilt_module_binding_a_class_again_says_how_to_reload_it(tmp_path):
    """pybind11 binds a C++ type once per process: the edit's import fails as it does under torch's load(), and the
    message names the type and py::module_local(); with it, the edited build loads in the same process."""
    src = tmp_path / "klass.cpp"

    def write(value, local):
        src.write_text("#include <pybind11/pybind11.h>\nnamespace py = pybind11;\n"
                       f"struct Counter {{ int step() const {{ return {value}; }} }};\n"
                       "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
                       f"  py::class_<Counter>(m, \"Counter\"{', py::module_local()' if local else ''})"
                       ".def(py::init<>()).def(\"step\", &Counter::step);\n}\n")

    write(1, False)
    assert kernelkit.load("kk_klass", [str(src)]).Counter().step() == 1
    write(2, False)
    with pytest.raises(KernelkitError, match=r"Counter is already bound.*py::module_local\(\)") as e:
        kernelkit.load("kk_klass", [str(src)])
    assert "\n" not in str(e.value)
    write(3, True)
    assert kernelkit.load("kk_klass", [str(src)]).Counter().step() == 3


def test_no_pybind_module_says_how_to_bind_before_compiling(tmp_path):
    src = tmp_path / "nomod.cpp"
    src.write_text("int f() { return 1; }\n")
    before = kernelkit.STATS["compiles"]
    with pytest.raises(KernelkitError, match="no PYBIND11_MODULE"):
        kernelkit.load("kk_nomod", [str(src)])
    with pytest.raises(KernelkitError, match="no PYBIND11_MODULE"):
        kernelkit.load_inline("kk_nomod", "int f() { return 1; }")  # no functions= either
    assert kernelkit.STATS["compiles"] == before


@pytest.mark.parametrize("include", ['#define KK_IMPL "impl/value.h"\n#include KK_IMPL',
                                     '#define KK_S(x) #x\n#define KK_P(x) KK_S(x)\n#include KK_P(impl/value.h)'])
def test_a_header_named_by_a_macro_is_in_the_key_and_an_edit_of_it_rebuilds(tmp_path, include):
    import ctypes

    (tmp_path / "impl").mkdir()
    header = tmp_path / "impl" / "value.h"
    src = tmp_path / "computed.cpp"
    src.write_text(include + '\nextern "C" int kk_value() { return KK_VALUE; }\n')
    values = []
    for v in (3, 7):  # the scan cannot follow the macro: without the preprocessor's reads, 7 would load the 3
        header.write_text(f"#define KK_VALUE {v}\n")
        lib = kernelkit.load(f"kk_computed_{len(include)}", [str(src)], is_python_module=False)
        values.append(ctypes.CDLL(lib).kk_value())
    assert values == [3, 7]
    unit = plan.plan_extension("kk_computed", [src], with_cuda=False, is_python_module=False).units[0]
    assert header.resolve() in unit.deps


@pytest.mark.cuda_build
def test_a_cu_files_header_named_by_a_macro_is_found_by_nvccs_preprocessor(tmp_path):
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "scale.cuh").write_text("__device__ inline float kk_scale(float x) { return 2 * x; }\n")
    src = tmp_path / "computed.cu"
    src.write_text('#define KK_IMPL "impl/scale.cuh"\n#include KK_IMPL\n'
                   "__global__ void k(float* x) { x[threadIdx.x] = kk_scale(x[threadIdx.x]); }\n")
    unit = plan.plan_extension("kk_computed_cu", [src], arch="9.0", is_python_module=False).units[0]
    assert unit.deps == [(tmp_path / "impl" / "scale.cuh").resolve()]


TORCH_LIBRARY_SRC = """
#include <ATen/ATen.h>
#include <torch/library.h>
at::Tensor plus_k(const at::Tensor& x) { return x + KK_K; }
TORCH_LIBRARY(kk_tlib_test, m) { m.def("plus_k(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(kk_tlib_test, CPU, m) { m.impl("plus_k", &plus_k); }
"""


def test_torch_library_with_is_python_module_false(tmp_path):
    src = tmp_path / "tlib.cpp"
    src.write_text(TORCH_LIBRARY_SRC.replace("KK_K", "1"))
    path = kernelkit.load("kk_tlib", [str(src)], is_python_module=False)
    assert isinstance(path, str) and path.endswith(".so") and path in torch.ops.loaded_libraries
    x = torch.randn(6)
    torch.testing.assert_close(torch.ops.kk_tlib_test.plus_k(x), x + 1)
    assert kernelkit.load("kk_tlib", [str(src)], is_python_module=False) == path  # unchanged: same result
    src.write_text(TORCH_LIBRARY_SRC.replace("KK_K", "2"))  # torch would abort the process loading this
    before = kernelkit.STATS["compiles"]
    with pytest.raises(KernelkitError, match=r"TORCH_LIBRARY\(kk_tlib_test, \.\.\.\) is already defined"):
        kernelkit.load("kk_tlib", [str(src)], is_python_module=False)
    assert kernelkit.STATS["compiles"] == before  # refused before compiling


def test_standalone_executable(tmp_path):
    src = tmp_path / "main.cpp"
    src.write_text("#include <cstdio>\nint main() { std::puts(\"standalone ok\"); return 3; }\n")
    exe = kernelkit.load("kk_exe", [str(src)], is_python_module=False, is_standalone=True,
                         build_directory=str(tmp_path / "bd"))
    assert exe == str(tmp_path / "bd" / "kk_exe")
    out = subprocess.run([exe], capture_output=True, text=True)
    assert out.returncode == 3 and out.stdout.strip() == "standalone ok"


def test_concurrent_processes_compile_once(tmp_path):
    for name in ("one.cpp", "two.cpp"):
        (tmp_path / name).write_text(f'extern "C" int {name[:3]}() {{ return {len(name)}; }}\n')
    code = textwrap.dedent(f"""
        import kernelkit
        kernelkit.load("kk_conc", [{str(tmp_path / "one.cpp")!r}, {str(tmp_path / "two.cpp")!r}],
                       is_python_module=False)
        print("compiles", kernelkit.STATS["compiles"], kernelkit.STATS["links"])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    counts = [tuple(map(int, o[0].split("compiles")[1].split())) for o in outs]
    assert sum(c for c, _ in counts) == 2 and sum(links for _, links in counts) == 1, counts


def test_cpp_extension_module_mirrors_torchs():
    from kernelkit import cpp_extension

    assert cpp_extension.load is kernelkit.load and cpp_extension.load_inline is kernelkit.load_inline
    assert cpp_extension.include_paths() == torch_ext.include_paths()
    assert cpp_extension.CUDA_HOME == torch_ext.CUDA_HOME
    assert cpp_extension.BuildExtension is torch_ext.BuildExtension
    assert cpp_extension.CUDAExtension is torch_ext.CUDAExtension
    assert "verify_ninja_availability" in dir(cpp_extension)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        cpp_extension.nonexistent


@pytest.mark.fast_path("torch_cu_split")
@pytest.mark.cuda_build
def test_single_file_torch_style_cu_compiles_for_an_explicit_arch(capsys):
    before = kernelkit.STATS["compiles"]
    info = kernelkit.load("kk_mul", [str(FIXTURES / "mul.cu")], extra_cuda_cflags=["-O3"], arch="9.0", load=False)
    assert info.path.is_file() and info.name == "kk_mul"
    symbols = subprocess.run(["nm", "-D", str(info.path)], capture_output=True, text=True).stdout
    assert "PyInit_kk_mul" in symbols  # PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) got this build's name
    if kernelkit.STATS["compiles"] > before:  # compiled here (not a kept cache): split, so no slow-rebuild hint
        said = capsys.readouterr().err
        assert "mul.cu: split (1 kernel(s))" in said and "includes torch's headers" not in said


# ------------------------------------------------------------------- torch's signature, flags and names
def test_importable_by_name_as_before_torch_2_9(ext, ext_dir, tmp_path):
    """A helper that calls load(..., build_directory=...) and then importlib.import_module(name) (the GAN-repo
    pattern that torch >= 2.9 breaks) gets the module."""
    sys.modules.pop("kk_ext", None)
    sources = [str(ext_dir / "bind.cpp"), str(ext_dir / "scale.cpp")]
    kernelkit.load("kk_ext", sources, ["-DKK_UNUSED=1"], build_directory=str(tmp_path / "plugin"))
    assert importlib.import_module("kk_ext") is ext


@pytest.mark.parametrize("function", ["load", "load_inline"])
def test_every_parameter_of_the_installed_torch_is_understood(function):
    """Positional arguments bind in the installed torch's order, and every keyword torch takes is accepted."""
    from kernelkit.loading import arguments

    order = list(inspect.signature(getattr(torch_ext, function)).parameters)[1:]
    values = [object() for _ in order]
    bound = arguments.bind(function, values, {})
    assert [bound[k] for k in order] == values
    accepted = set(arguments.TORCH_KEYWORDS[function])
    assert set(order) <= accepted, f"torch {torch.__version__} takes {sorted(set(order) - accepted)}"
    with pytest.raises(TypeError, match="at most"):
        arguments.bind(function, values + [None], {})
    with pytest.raises(TypeError, match=f"multiple values for argument '{order[0]}'"):
        arguments.bind(function, values[:1], {order[0]: None})
    shared = arguments.SHARED_ORDER[function]  # bound without a look at torch's order: it must be torch's too
    assert tuple(order[:len(shared)]) == shared
    assert [bound[k] for k in shared] == [arguments.bind(function, values[:len(shared)], {})[k] for k in shared]


def test_flags_are_split_and_stripped_as_torch_does(tmp_path):
    """torch's own JIT tests pass flags with newlines and several flags in one string: same executable output
    as torch's build from the same arguments."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "kk_value.h").write_text("#define KK_VALUE 7\n")
    src = tmp_path / "main.cpp"
    src.write_text("#include <cstdio>\n#include \"kk_value.h\"\n"
                   "int main() { std::printf(\"%d %d\\n\", KK_VALUE, KK_FLAG); return 0; }\n")
    kw = dict(extra_cflags=["-g\n\n", "-O0 -Wall", "-DKK_FLAG=5"], extra_include_paths=[f"  {inc}\n"],
              is_python_module=False, is_standalone=True)
    (tmp_path / "theirs").mkdir()  # torch's loader needs it to exist
    ours = kernelkit.load("kk_flags", [str(src)], build_directory=str(tmp_path / "ours"), **kw)
    theirs = torch_ext.load("kk_flags", [str(src)], build_directory=str(tmp_path / "theirs"), **kw)
    outputs = [subprocess.run([exe], capture_output=True, text=True, check=True).stdout for exe in (ours, theirs)]
    assert outputs == ["7 5\n", "7 5\n"]


def test_a_slow_build_does_not_block_other_loads_in_the_process(ext, ext_dir, monkeypatch):
    """No process-wide lock across a build: while one thread builds, another thread's load of a cached
    build returns at once."""
    from kernelkit.jit import build as _build

    release, started, real = threading.Event(), threading.Event(), _build.build

    def slow_build(target):
        if target.name == "kk_slow":
            started.set()
            assert release.wait(60), "the test never released the slow build"
            raise KernelkitError("kk_slow: stopped by the test")
        return real(target)

    monkeypatch.setattr(_build, "build", slow_build)
    src = ext_dir / "slow.cpp"
    src.write_text("// never compiled\nint kk_slow_unused() { return 0; }\n")
    errors = []
    worker = threading.Thread(target=lambda: errors.append(_raises(lambda: kernelkit.load("kk_slow", [str(src)],
                                                                                            is_python_module=False))))
    worker.start()
    try:
        assert started.wait(60)
        t0 = time.perf_counter()
        info = kernelkit.load("kk_ext", [str(ext_dir / "bind.cpp"), str(ext_dir / "scale.cpp")], ["-DKK_UNUSED=1"],
                              load=False)
        assert info.cached and time.perf_counter() - t0 < 5
        assert worker.is_alive()  # the slow build was still running all along
    finally:
        release.set()
        worker.join(60)
    assert errors and "stopped by the test" in str(errors[0])


def _raises(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e
    return None


TORCH_STYLE_ONE_FILE = r"""
#include <torch/extension.h>
torch::Tensor plus_k(torch::Tensor x) { return x + KK_K; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("plus_k", &plus_k, "x + K"); }
"""


def test_a_torch_style_file_loads_the_same_through_every_keyword_style(tmp_path):
    """One behaviour per source: a file with its own PYBIND11_MODULE works as load(path) and as load_inline's
    cpp= (kernelkit's form), giving the same function as torch's form."""
    src = tmp_path / "kk_onefile.cpp"
    src.write_text(TORCH_STYLE_ONE_FILE.replace("KK_K", "3"))
    as_card = kernelkit.load(str(src))
    as_cell = kernelkit.load_inline("kk_onefile_cell", cpp=TORCH_STYLE_ONE_FILE.replace("KK_K", "3"))
    x = torch.randn(5, dtype=torch.float64)
    for lib in (as_card, as_cell):
        torch.testing.assert_close(lib.plus_k(x), x + 3, rtol=0, atol=0)
        assert "x + K" in lib.plus_k.__doc__


def test_torch_library_is_refused_before_it_aborts_the_process_as_a_python_module(tmp_path):
    """A second definition of a TORCH_LIBRARY namespace aborts the process in torch: refused whatever
    is_python_module is, and wherever the block sits (here in a local header)."""
    (tmp_path / "ops.h").write_text(TORCH_LIBRARY_SRC.replace("KK_K", "1").replace("kk_tlib_test", "kk_tlib_py"))
    src = tmp_path / "both.cpp"
    src.write_text('#include <torch/extension.h>\n#include "ops.h"\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("one", [] { return 1; }); }\n')
    mod = kernelkit.load("kk_tlib_py", [str(src)])
    assert mod.one() == 1 and torch.ops.kk_tlib_py.plus_k(torch.ones(2)).tolist() == [2.0, 2.0]
    (tmp_path / "ops.h").write_text(TORCH_LIBRARY_SRC.replace("KK_K", "2").replace("kk_tlib_test", "kk_tlib_py"))
    before = kernelkit.STATS["compiles"]
    with pytest.raises(KernelkitError, match=r"TORCH_LIBRARY\(kk_tlib_py, \.\.\.\) is already defined"):
        kernelkit.load("kk_tlib_py", [str(src)])
    assert kernelkit.STATS["compiles"] == before


def test_functions_passed_in_torch_2_7s_position_get_a_hint_on_a_newer_torch():
    if "sycl_sources" not in inspect.signature(torch_ext.load_inline).parameters:
        pytest.skip(f"torch {torch.__version__}: functions is load_inline's fourth parameter")
    before = kernelkit.STATS["compiles"]
    with pytest.raises(ValueError, match=r"\['twice'\] looks like function names: .* pass functions=\[...\] by keyword"):
        kernelkit.load_inline("kk_old_order", INLINE_CPP_A, None, ["twice"])
    assert kernelkit.STATS["compiles"] == before


# ----------------------------------------------------------------- a C++ file's first torch header, precompiled
LEADING = """// a light torch header first, so the test pays ~1 s for its precompiled header, not ~40 s
#include <c10/core/ScalarType.h>
#include <string>

std::string kk_leading_name(int i) { return c10::toString(static_cast<c10::ScalarType>(i)); }
"""


def _leading_unit(tmp_path, text, name="lead.cpp", extra_include_paths=()):
    (tmp_path / name).write_text(text)
    target = plan.plan_extension("kk_lead", [tmp_path / name], with_cuda=False, is_python_module=False,
                                 extra_include_paths=[str(p) for p in extra_include_paths])
    return target, target.units[0]


@pytest.mark.fast_path("pch")
def test_a_cpp_files_leading_torch_header_is_precompiled_and_the_object_is_the_same(tmp_path, monkeypatch):
    """An extension's .cpp (and load_inline's main.cpp) starts with a torch header, whose parse is most of its
    compile (~17 of ~18 s for <torch/extension.h> on 2 cores). gcc reads it precompiled, found as ``<h>.gch`` ahead
    of the header; the object must be the one gcc makes without it, byte for byte, and the build's check of what
    the compiler read must pass."""
    import subprocess as sp

    from kernelkit.jit import build, cache, running, toolchain
    from kernelkit.jit.fast import pch

    if not toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    target, unit = _leading_unit(tmp_path, LEADING)
    root, gch, cmd = pch.plan(unit)
    assert gch == "c10/core/ScalarType.h.gch" and cmd[-1].endswith("/c10/core/ScalarType.h")
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME=") for f in cmd)  # shared by every extension's name
    monkeypatch.setenv("KERNELKIT_PCH", "0")
    assert pch.flags(unit) == []
    build.compile_as_written(unit, target, tmp_path / "plain.o", tmp_path / "plain.d")
    monkeypatch.setenv("KERNELKIT_PCH", "1")
    made = root / gch
    made.parent.mkdir(parents=True, exist_ok=True)
    sp.run([sys.executable, "-c", pch._PCH_BUILDER, "0", str(made.with_name(f".{made.name}.tmp")), str(made),
            str(root / cache.PCH_META), *cmd], check=True)
    assert cache.pch_ready(root)
    before = dict(running.STATS)
    obj = build.compile_cached(unit, target)  # the full path: it checks the compiler's depfile against the key
    assert running.STATS["pch_used"] == before["pch_used"] + 1 and running.STATS["pch_rejected"] == before["pch_rejected"]
    assert running.STATS["compiles"] == before["compiles"] + 1
    assert obj.read_bytes() == (tmp_path / "plain.o").read_bytes()


@pytest.mark.fast_path("pch")
def test_a_cpp_file_gets_no_leading_pch_unless_its_first_line_is_a_torch_header_found_in_torch(tmp_path):
    from kernelkit.jit.fast import pch

    body = "\nint kk_f() { return c10::elementSize(c10::ScalarType::Float); }\n"
    for text in ("#define KK_BEFORE 1\n#include <c10/core/ScalarType.h>" + body,  # a macro gcc would have to judge
                 "#include <vector>\n#include <c10/core/ScalarType.h>" + body,  # not torch's
                 "#ifdef KK_X\n#endif\n#include <c10/core/ScalarType.h>" + body):
        _, unit = _leading_unit(tmp_path, text)
        assert unit.uses_torch and pch.plan(unit) is None, text
    mine = tmp_path / "inc"
    (mine / "c10" / "core").mkdir(parents=True)
    (mine / "c10" / "core" / "ScalarType.h").write_text("#include_next <c10/core/ScalarType.h>\n")
    _, unit = _leading_unit(tmp_path, "#include <c10/core/ScalarType.h>" + body, extra_include_paths=[mine])
    assert pch.plan(unit) is None  # a header of that name in the user's own include dir is theirs
    _, unit = _leading_unit(tmp_path, "/* licence */\n#include <c10/core/ScalarType.h>" + body)
    assert pch.plan(unit)[1] == "c10/core/ScalarType.h.gch"  # the control: comments before it are fine
