"""The %%kernelkit cell magic in a real IPython shell: compile, bind, edit-reload, error lines."""
import pytest
import torch

IPython = pytest.importorskip("IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import kernelkit  # noqa: E402
from kernelkit.frontends.magic import _parser, _tokens, split_cell  # noqa: E402
from kernelkit.jit import running

CELL = """\
at::Tensor cube(const at::Tensor& x) {
  return x * x * x;
}
KERNELKIT_LIBRARY(m) {
  m.def("cube(Tensor x) -> Tensor");
  m.impl("cube", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(cube)));
}
"""


@pytest.fixture(scope="module")
def shell():
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "kernelkit")
    return sh


def test_split_cell_keeps_cell_line_numbers():
    cell = "__global__ void k() {}\n// --- binding ---\nint f();\nint g();\n"
    cuda, cpp = split_cell(cell, cpp_only=False)
    # as the notebook shows it: line 1 is "%%kernelkit", line 2 the kernel, 3 the separator, 4 "int f();"
    assert cuda.splitlines()[1] == "__global__ void k() {}"
    assert cpp.splitlines()[3] == "int f();"
    assert split_cell("int x;", cpp_only=True)[1].splitlines()[1] == "int x;"


def test_magic_compiles_binds_and_reloads(shell):
    shell.run_cell_magic("kernelkit", "cubes --cpp", CELL)
    x = torch.tensor([1.0, -2.0, 3.0])
    torch.testing.assert_close(shell.user_ns["cube"](x), x ** 3)
    assert isinstance(shell.user_ns["cubes"], kernelkit.Library)
    shell.run_cell_magic("kernelkit", "cubes --cpp", CELL.replace("x * x * x", "x * x * x + 1"))
    torch.testing.assert_close(shell.user_ns["cube"](x), x ** 3 + 1)  # rebound to the new build


def test_promote_cell_to_card(shell, tmp_path):
    shell.run_cell_magic("kernelkit", "cubes --cpp", CELL)
    header = kernelkit.magic.promote("cubes", tmp_path / "cards")
    assert header.read_text().count("KERNELKIT_LIBRARY") == 1
    lib = kernelkit.load("cubes", kernels_dir=tmp_path / "cards")
    x = torch.tensor([2.0, -1.0])
    torch.testing.assert_close(lib.cube(x), x ** 3)
    assert kernelkit.magic.last_cell("cubes") == CELL


def test_magic_error_names_cell_line(shell):
    bad = CELL.replace("return x * x * x;", "return x * x * y;")
    result = shell.run_cell("%%kernelkit cubes --cpp\n" + bad)  # a failed cell, as in a notebook
    err = result.error_in_exec
    assert isinstance(err, kernelkit.BuildError)
    # the bad line is line 3 of the cell as shown (line 1 is the %%kernelkit line)
    assert "cell %%kernelkit cubes:3:" in str(err) and "return x * x * y;" in str(err)  # the cell, not a file
    assert "cubes.cpp" not in str(err)
    assert err._render_traceback_() == [str(err)]  # IPython shows the mapped errors, no traceback


def test_magic_usage_errors(shell, capfd):
    with pytest.raises(ValueError, match="binding"):
        shell.run_cell_magic("kernelkit", "nobinding", "__global__ void k() {}\n")
    with pytest.raises(ValueError, match="usage") as e:
        shell.run_cell_magic("kernelkit", "", CELL)
    assert str(e.value).count("usage") == 1 and "the following arguments are required: name" in str(e.value)
    assert "usage" not in capfd.readouterr().err  # said once, in the error: argparse printed nothing


@pytest.mark.cuda_build
def test_a_cpp_cell_gets_no_compile_report_and_no_warning_about_its_tools(shell, capfd):
    """A C++-only cell has no device code: nothing to report, so no word about a missing cuobjdump."""
    capfd.readouterr()
    result = shell.run_cell("%%kernelkit cube_report_free\n" + CELL)
    assert result.error_in_exec is None
    out = capfd.readouterr()
    assert "compile report" not in out.err and "cuobjdump" not in out.err + out.out


KERNELS = """\
extern "C" __global__ void twice(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * x[i];
}
"""


@pytest.mark.cuda_build
def test_kernels_cell_compiles_with_nvrtc_and_binds_the_module(shell):
    shell.run_cell_magic("kernelkit", "fast --kernels --arch 9.0", KERNELS)
    mod = shell.user_ns["fast"]
    assert isinstance(mod, kernelkit.KernelModule) and mod.kernels == ("twice",)
    shell.run_cell_magic("kernelkit", "fast --kernels --arch 9.0", KERNELS.replace("2.0f", "3.0f"))
    assert shell.user_ns["fast"] is mod and not mod.cached  # the edited cell updates the same module
    result = shell.run_cell("%%kernelkit fast --kernels --arch 9.0\n" + KERNELS.replace("x[i];", "y[i];"))
    err = result.error_in_exec
    assert isinstance(err, kernelkit.BuildError) and "cell %%kernelkit fast:4:" in str(err)  # the cell's line 4


def test_flag_values_may_start_with_a_dash_and_repeat():
    tokens = _tokens("n --kernels --flags -DX=1 -O3 --arch 9.0 --flags=--weird --cuda-flags -lineinfo")
    assert tokens == ["n", "--kernels", "--flags=-DX=1", "--flags=-O3", "--arch", "9.0", "--flags=--weird",
                      "--cuda-flags=-lineinfo"]
    args = _parser().parse_args(tokens)
    assert args.flags == ["-DX=1", "-O3", "--weird"] and args.cuda_flags == ["-lineinfo"] and args.arch == "9.0"


@pytest.mark.cuda_build
def test_kernels_cell_takes_every_flag(shell):
    cell = 'extern "C" __global__ void flagged(float* x) { x[0] = SCALE + OFFSET; }\n'
    shell.run_cell_magic("kernelkit", "flagged --kernels --arch 9.0 --flags -DSCALE=2.0f --flags -DOFFSET=1.0f", cell)
    assert shell.user_ns["flagged"].kernels == ("flagged",)  # both defines reached NVRTC: SCALE and OFFSET
    shell.run_cell_magic("kernelkit", "flagged --kernels --flags -DSCALE=2.0f -DOFFSET=3.0f --arch 9.0", cell)
    with pytest.raises(ValueError, match="usage"):
        shell.run_cell_magic("kernelkit", "flagged --kernels --flags", cell)


def test_cell_names_never_shadow_the_notebooks_own(shell):
    shell.run_cell("import torch")
    shell.user_ns["mine"] = 41
    with pytest.raises(ValueError, match="'torch' is the module torch in this notebook"):
        shell.run_cell_magic("kernelkit", "torch --kernels --arch 9.0", KERNELS)
    with pytest.raises(ValueError, match="'mine' already names an object of type int that kernelkit did not make"):
        shell.run_cell_magic("kernelkit", "mine --kernels --arch 9.0", KERNELS)
    for bad in ("../x", "class", "2fast"):
        with pytest.raises(ValueError, match="NAME must be a Python identifier"):
            shell.run_cell_magic("kernelkit", f"{bad} --kernels --arch 9.0", KERNELS)
    assert shell.user_ns["torch"] is torch and shell.user_ns["mine"] == 41


def test_cpp_cell_without_flag_goes_to_the_cpp_compiler_and_names_do_not_clobber(shell):
    shell.run_cell_magic("kernelkit", "cube", CELL)  # no --cpp: nothing in it only nvcc compiles
    x = torch.tensor([2.0, -3.0])
    torch.testing.assert_close(shell.user_ns["cube"](x), x ** 3)  # the op keeps its name
    assert isinstance(shell.user_ns["cube_lib"], kernelkit.Library)  # and the library is still reachable


TUNED = """\
extern "C" __global__ void scale(const float* x, float* y, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n - TAIL_BUG) y[i] = 2.0f * x[i];
}
"""


def _tuning(launch):
    return dict(space={"BLOCK": [64, 256], "TAIL_BUG": [0, 1]}, launch=launch, reference=lambda x: 2 * x,
                inputs=lambda shape, dtype=None, device=None, generator=None: (
                    torch.randn(shape, dtype=dtype, device=device, generator=generator),))


def test_a_tuned_kernels_cell_binds_an_op_over_its_configurations(shell, monkeypatch):
    """--tune: each configuration is the cell compiled with its -D defines (here a stand-in for NVRTC that
    records them) and launched by the notebook's launch(kernels, config, *args); the op runs a checked winner."""
    from kernelkit.frontends import magic

    compiled = []

    def fake_load_kernels(source, name, arch=None, options=()):
        compiled.append((name, tuple(options)))
        return {"source": source, "tail_bug": int(dict(o[2:].split("=") for o in options)["TAIL_BUG"])}

    def launch(kernels, config, x):
        if not x.is_contiguous():  # as kernelkit's launcher: a pointer sees the storage in order
            raise ValueError("scale(): argument 1 'x' is not contiguous")
        y = 2 * x
        if kernels["tail_bug"]:
            y[-1] = 0  # the config whose bounds check drops the last element: wrong, so never chosen
        return y

    monkeypatch.setattr(magic, "load_kernels", fake_load_kernels)
    shell.user_ns["scale_tuning"] = _tuning(launch)
    shell.run_cell_magic("kernelkit", "scaled --kernels --arch 9.0 --flags -DEXTRA=1 --tune scale_tuning", TUNED)
    op = shell.user_ns["scaled"]
    x = torch.randn(1001)
    torch.testing.assert_close(op(x), 2 * x)
    assert op.config(x)["TAIL_BUG"] == 0
    assert {o for _, o in compiled} >= {("-DEXTRA=1", "-DBLOCK=64", "-DTAIL_BUG=1"), ("-DEXTRA=1", "-DBLOCK=256", "-DTAIL_BUG=0")}
    assert len({n for n, _ in compiled}) == 4 and all(n.startswith("scaled_") for n, _ in compiled)

    # pointer kernels are checked on contiguous inputs unless the dict asks for strided ones too
    shell.user_ns["strided_tuning"] = dict(_tuning(launch), noncontiguous=True)
    shell.run_cell_magic("kernelkit", "strided --kernels --arch 9.0 --tune strided_tuning", TUNED)
    with pytest.raises(ValueError, match="no configuration passed its check(.|\n)*strided(.|\n)*not contiguous"):
        shell.user_ns["strided"](x)


def test_tune_usage_errors(shell):
    with pytest.raises(ValueError, match="--tune tunes a --kernels cell"):
        shell.run_cell_magic("kernelkit", "t1 --tune x", TUNED)
    with pytest.raises(ValueError, match="--tune nowhere: expected the notebook's dict .* got nothing"):
        shell.run_cell_magic("kernelkit", "t1 --kernels --tune nowhere", TUNED)
    shell.user_ns["half_tuning"] = {"space": {"BLOCK": [64]}, "launch": print}
    with pytest.raises(ValueError, match="got a dict without reference, inputs"):
        shell.run_cell_magic("kernelkit", "t1 --kernels --tune half_tuning", TUNED)
    assert "t1" not in shell.user_ns


@pytest.mark.gpu
def test_a_tuned_kernels_cell_runs_the_winner_on_the_gpu(shell):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    def launch(kernels, config, x):
        y = torch.full_like(x, float("nan"))  # poisoned: an element the kernel skips stays NaN
        kernels.scale[(x.numel() + config["BLOCK"] - 1) // config["BLOCK"], config["BLOCK"]](x, y, x.numel())
        return y

    shell.user_ns["gpu_tuning"] = _tuning(launch)
    shell.run_cell_magic("kernelkit", "gpu_scaled --kernels --tune gpu_tuning", TUNED)
    op = shell.user_ns["gpu_scaled"]
    x = torch.randn(3001, device="cuda")
    torch.testing.assert_close(op(x), 2 * x)
    assert op.config(x)["TAIL_BUG"] == 0
    result = next(iter(op.results.values()))
    assert sorted(c.status for c in result.candidates if c.config["TAIL_BUG"]) == ["wrong", "wrong"]


def test_magic_help_documents_every_option(shell):
    doc = shell.find_cell_magic("kernelkit").__doc__
    for option in ("--functions", "--arch", "--flags", "--cuda-flags", "--cpp", "--kernels", "--tune"):
        assert option in doc, option


TORCH_CELL = """#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
__global__ void tscale_kernel(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
at::Tensor tscale(const at::Tensor& x) {
  auto xc = x.contiguous(); auto y = at::empty_like(xc);
  tscale_kernel<<<(xc.numel() + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
  return y;
}
// --- binding ---
at::Tensor tscale(const at::Tensor& x);
KERNELKIT_LIBRARY(m) {
  m.def("tscale(Tensor x) -> Tensor");
  m.impl("tscale", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(tscale)));
}
"""


@pytest.mark.gpu
def test_a_cell_whose_device_part_includes_torch_reruns_its_kernel_edit_as_device_code_only(shell):

    x = torch.randn(100_003, device="cuda")
    shell.run_cell_magic("kernelkit", "tscale_cell", TORCH_CELL)
    assert torch.equal(shell.user_ns["tscale"](x), 2.0 * x)
    before = running.STATS["compiles"]
    shell.run_cell_magic("kernelkit", "tscale_cell", TORCH_CELL.replace("2.0f * x[i]", "3.0f * x[i]"))
    assert running.STATS["compiles"] - before == 1  # the split's device TU: its host TU and the binding are cached
    assert torch.equal(shell.user_ns["tscale"](x), 3.0 * x)
