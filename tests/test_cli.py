"""The `kernelkit` command line for a newcomer: --help, --version and list answer without importing torch,
and a user's mistake (unknown card, broken spec, a GPU that is not there) is one line, not a traceback."""
import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.errors import SpecError
from kernelkit.frontends.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
BUILTIN = Path(__file__).resolve().parent.parent / "kernels"


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "kernelkit", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def imported(importtime_log: str):
    """Module names from `python -X importtime` output."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_log.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["list"], ["list", "--json"], ["check", "--help"]])
def test_quick_commands_do_not_import_torch(args):
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = imported(proc.stderr)
    assert "kernelkit.frontends.cli" in mods and "torch" not in mods


@pytest.mark.parametrize("args, said", [
    (["check", "sigmoid", "--dtype", "fp8"], "unknown dtype 'fp8'"), (["bench", "sigmoid", "--sizes", "lots"], "bad size"),
    (["bench", "sigmoidd"], "no card named 'sigmoidd'"), (["run", "--sizes", "x"], "bad size 'x'"),
    (["run", "nosuch"], "no card named 'nosuch'")])
def test_argument_errors_answer_before_torch_is_imported(args, said):
    proc = run_cli(*args)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
    assert "torch" not in imported(proc.stderr)


def test_api_argument_errors_answer_before_torch_is_imported():
    code = """if True:
        import sys, kernelkit
        calls = [lambda: kernelkit.load_inline("x", bogus=1), lambda: kernelkit.load("x", *[[]] * 20),
                 lambda: kernelkit.load_inline("x", cpp="int f();", cpp_sources="int g();"),
                 lambda: kernelkit.load_inline("x", cpp="int f();", extra_cflags="-O3"),
                 lambda: kernelkit.load_inline("not a name", cuda="__global__ void k() {}"),
                 lambda: kernelkit.load_inline("x", cpp=3), lambda: kernelkit.load_inline("x", sycl_sources="k()")]
        for call in calls:
            try:
                call()
            except (TypeError, ValueError) as e:
                print(type(e).__name__, str(e).split(";")[0])
        assert "torch" not in sys.modules, "torch imported"
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "TypeError load_inline() got an unexpected keyword argument 'bogus'",
        "TypeError load() takes at most 14 positional arguments (name, then torch's), got 21",
        "TypeError load_inline(): pass either torch's cpp_sources/cuda_sources or kernelkit's cpp=/cuda=, not both",
        "TypeError extra_cflags: expected a list of strings, got the string '-O3' (wrap it in a list)",
        "ValueError name: expected an identifier (it names the library), got 'not a name'",
        "TypeError cpp: expected source code as a str, got int",
        "ValueError sycl_sources: kernelkit builds C++ and CUDA sources, not SYCL"], proc.stdout


def test_version_is_the_installed_one():
    proc = run_cli("--version")
    assert proc.stdout.strip() == f"kernelkit {kernelkit.__version__}"
    assert kernelkit.__version__ == importlib.metadata.version("kernelkit")


def test_package_is_lazy_and_keeps_its_names():
    code = """if True:
        import sys, kernelkit
        kernelkit.KernelkitError, kernelkit.BuildError, kernelkit.__version__
        assert "torch" not in sys.modules, "a torch-free name imported torch"
        assert "cpp_extension" in dir(kernelkit) and "load" in dir(kernelkit)
        import kernelkit.harness.check  # a module and the public function of the same name do not collide
        assert kernelkit.check.__module__ == "kernelkit.harness.check" and callable(kernelkit.check)
        for name in kernelkit.__all__:
            getattr(kernelkit, name)
        assert kernelkit.cards.__name__ == "all_cards" and kernelkit.library.__module__ == "kernelkit.loading"
        assert kernelkit.cpp_extension.load is kernelkit.load
        assert kernelkit.magic.promote.__module__ == "kernelkit.frontends.magic"
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def write_card(d: Path, name: str, spec: str = None, ext: str = ".cpp") -> None:
    (d / f"{name}{ext}").write_text(f'#include "{name}.h"\n')
    (d / f"{name}.h").write_text("#pragma once\n")
    if spec is not None:
        (d / f"{name}.py").write_text(spec)


def listed(capsys, *args):
    assert main(["list", "--json", *args]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no note: every spec was read or imported without an error
    return json.loads(out)


def test_list_agrees_with_cards_and_reads_specs_without_running_them(tmp_path, capsys):
    write_card(tmp_path, "affine", "import kernelkit\nSPEC = kernelkit.Spec(name='affine', reference=None, "
               "make_inputs=None,\n    sources=['affine.cpp', 'affine_loop.cpp'])\n")
    (tmp_path / "affine_loop.cpp").write_text("// the second translation unit of affine: no card\n")
    write_card(tmp_path, "computed", "import kernelkit\nPARTS = ['computed.cu', 'extra.cpp']\n"
               "SPEC = kernelkit.Spec(name='computed', reference=None, make_inputs=None, sources=PARTS)\n", ext=".cu")
    (tmp_path / "extra.cpp").write_text("// named by computed's spec through a variable\n")
    write_card(tmp_path, "plain", ext=".cu")
    write_card(tmp_path, "bad", "raise RuntimeError('never run by list')\n"
               "SPEC = kernelkit.Spec(name='bad', reference=None, make_inputs=None)\n")
    out = listed(capsys, "--kernels-dir", str(tmp_path))
    assert out["searched"] == [str(tmp_path.resolve())]
    rows = {r["name"]: r for r in out["cards"]}
    expected = kernelkit.cards(tmp_path)
    assert sorted(rows) == sorted(expected) == ["affine", "bad", "computed", "plain"]
    for name in ("affine", "computed", "plain"):
        card = expected[name]
        assert rows[name]["sources"] == [str(p.relative_to(card.dir)) for p in card.sources()], name
        assert rows[name]["cuda"] == card.has_cuda, name
    assert rows["bad"]["sources"] == ["bad.cpp"] and not rows["bad"]["cuda"]  # its spec never ran
    assert rows["plain"]["spec"] is None and rows["affine"]["spec"] == str(tmp_path.resolve() / "affine.py")


def test_list_imports_a_spec_it_cannot_read_and_notes_its_error(tmp_path, capsys):
    write_card(tmp_path, "made", "import kernelkit\nSPEC = kernelkit.Spec(**dict(name='made', reference=None, "
               "make_inputs=None, sources=['made.cpp', 'more.cu']))\n")
    write_card(tmp_path, "broken", "import kernelkit\n\nraise RuntimeError('broken spec')\n")
    assert main(["list", "--json", "--kernels-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    rows = {r["name"]: r for r in json.loads(out)["cards"]}
    assert rows["made"]["sources"] == ["made.cpp", "more.cu"] and rows["made"]["cuda"]
    assert rows["broken"]["sources"] == ["broken.cpp"]
    assert err.strip() == (f"note: {tmp_path.resolve() / 'broken.py'}:3: the card's spec failed to import: "
                           "RuntimeError: broken spec")


def test_list_of_the_builtin_cards(capsys):
    out = listed(capsys)
    assert [r["name"] for r in out["cards"]] == sorted(kernelkit.cards())
    assert all(r["spec"] and r["cuda"] and r["sources"] == [r["name"] + ".cu"] for r in out["cards"])


def test_list_says_where_it_looked(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("KERNELKIT_PATH", str(missing))
    assert main(["list"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("searched: ") and f"{missing} (missing)" in first and str(BUILTIN.resolve()) in first


@pytest.mark.parametrize("command", [["check"], ["bench"], ["build"], ["run", "--quick", "--out", "REPORT"]])
def test_unknown_card_names_the_searched_directories(command, tmp_path, capsys):
    write_card(tmp_path, "square")
    argv = [str(tmp_path / "r") if a == "REPORT" else a for a in command]
    assert main([*argv, "sqaure", "--kernels-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "no card named 'sqaure'" in err[0] and str(tmp_path.resolve()) in err[0] and "square" in err[0]
    assert not (tmp_path / "r").exists()


BROKEN_SPECS = {
    "raises": ("import kernelkit\n\nSCALE = 1 / 0\n", "bad.py:3: ", "ZeroDivisionError: division by zero"),
    "syntax": ("import kernelkit\nSPEC = kernelkit.Spec(name='bad',\n", "bad.py:2: ", "SyntaxError: "),
    "helper": ("import kernelkit\nimport bad_helper\n", "bad.py:2: ", "KeyError: 'dtype' (raised at "),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_SPECS))
@pytest.mark.parametrize("command", ["check", "build"])
def test_broken_spec_is_one_line_naming_the_file(kind, command, tmp_path, capsys, monkeypatch):
    spec, where, what = BROKEN_SPECS[kind]
    write_card(tmp_path, "bad", spec)
    (tmp_path / "bad_helper.py").write_text("CONFIG = {}\nDTYPE = CONFIG['dtype']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main([command, "bad", "--kernels-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(tmp_path.resolve() / where.split(":")[0]) in err[0] and where in err[0] and what in err[0]
    if kind == "helper":
        assert "bad_helper.py:2)" in err[0]


def test_a_bug_outside_the_spec_keeps_its_traceback(tmp_path, monkeypatch):
    write_card(tmp_path, "fine", "SPEC = None\n")

    def broken_loader(card):
        raise RuntimeError("a bug in kernelkit")

    monkeypatch.setattr(kernelkit.Card, "module", broken_loader)
    with pytest.raises(RuntimeError, match="a bug in kernelkit"):
        main(["check", "fine", "--kernels-dir", str(tmp_path)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("command", ["check", "bench"])
def test_device_cuda_without_a_gpu_is_one_line(command, capsys):
    assert main([command, "kk_add_skip_last", "--kernels-dir", str(FIXTURES / "cards"), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kernelkit {command}: --device cuda: no CUDA GPU is visible: run with --device cpu, or leave "
                   "--device out to run each card on the CPU where it has a CPU implementation"]


def test_device_must_be_cpu_or_cuda(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "kk_add_skip_last", "--device", "gpu"])
    assert e.value.code == 2 and "expected cpu, cuda or cuda:N" in capsys.readouterr().err


# ---- cards outside the repository ----------------------------------------------------------------------
def write_reference_card(d: Path, factor: float) -> Path:
    """A card ``scaled`` whose spec imports the reference beside it (``reference/scaled.py``, README layout)."""
    d.mkdir(parents=True, exist_ok=True)
    write_card(d, "scaled", "from reference.scaled import FACTOR, scaled as reference\n")
    (d / "reference").mkdir()
    (d / "reference" / "scaled.py").write_text(f"FACTOR = {factor}\n\ndef scaled(x):\n    return x * FACTOR\n")
    return d


def test_spec_imports_the_reference_beside_it_each_directory_its_own(tmp_path):
    a = kernelkit.cards(write_reference_card(tmp_path / "a", 2.0))["scaled"]
    b = kernelkit.cards(write_reference_card(tmp_path / "b", 3.0))["scaled"]
    assert (a.module().FACTOR, b.module().FACTOR) == (2.0, 3.0)
    assert "reference" not in sys.modules  # importable only while the spec ran
    assert importlib.import_module("kernelkit.reference.sigmoid").__name__ == "kernelkit.reference.sigmoid"


def test_spec_run_again_imports_the_edited_reference_beside_it(tmp_path):
    card = kernelkit.cards(write_reference_card(tmp_path, 2.0))["scaled"]
    assert card.module().FACTOR == 2.0
    (tmp_path / "reference" / "scaled.py").write_text("FACTOR = 5.0\n\ndef scaled(x):\n    return x * FACTOR\n")
    spec = tmp_path / "scaled.py"
    spec.write_text(spec.read_text() + "# edited\n")
    assert card.module().FACTOR == 5.0


@pytest.mark.parametrize("kind", sorted(BROKEN_SPECS))
def test_broken_spec_raises_one_error_naming_file_and_line(kind, tmp_path):
    spec, where, what = BROKEN_SPECS[kind]
    write_card(tmp_path, "bad", spec)
    (tmp_path / "bad_helper.py").write_text("CONFIG = {}\nDTYPE = CONFIG['dtype']\n")  # beside the card: importable
    with pytest.raises(SpecError) as e:
        kernelkit.cards(tmp_path)["bad"].spec
    assert str(e.value).startswith(str(tmp_path.resolve() / where.split(":")[0]) + where[len("bad.py"):])
    assert what in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, kernelkit.KernelkitError) and e.value.__cause__ is not None


TWICE_CPP = """\
#include "twice.h"
void twice_cpu(const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = x[i] * 2.0f;
}
"""
TWICE_H = """\
#pragma once
void twice_cpu(const float* x, float* y, long n);
#ifdef KERNELKIT_BINDING
at::Tensor twice(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "twice: x must be float32, got ", x.scalar_type());
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  twice_cpu(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel());
  return y;
}
KERNELKIT_LIBRARY(m) {
  m.def("twice(Tensor x) -> Tensor");
  m.impl("twice", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(twice)));
}
#endif
"""
TWICE_PY = """\
import torch

import kernelkit
from reference.twice import twice as reference


def make_inputs(shape, dtype=torch.float32, device="cpu", generator=None):
    return (torch.randn(shape, dtype=dtype, device=device, generator=generator),)


SPEC = kernelkit.Spec(name="twice", reference=reference, make_inputs=make_inputs, dtypes=(torch.float32,),
                      devices=("cpu",), shapes=((1,), (7,), (0,), (33, 65)), bench_sizes=((1 << 10,),))


def _refuse_grad(ctx, inputs, output):
    raise RuntimeError("twice: not differentiable")


def setup(lib):
    torch.library.register_fake(lib.qualname("twice"), lambda x: torch.empty_like(x))
    torch.library.register_autograd(lib.qualname("twice"), lambda ctx, grad: None, setup_context=_refuse_grad)
"""


@pytest.fixture(scope="module")
def user_cards(tmp_path_factory):
    """A directory outside the repository with one CPU card whose reference sits beside it; built once here
    (the session's shared cache keeps the build for every test of this module)."""
    d = tmp_path_factory.mktemp("user_cards")
    (d / "twice.cpp").write_text(TWICE_CPP)
    (d / "twice.h").write_text(TWICE_H)
    (d / "twice.py").write_text(TWICE_PY)
    (d / "reference").mkdir()
    (d / "reference" / "twice.py").write_text("def twice(x):\n    return x * 2\n")
    assert main(["build", "twice", "--kernels-dir", str(d)]) == 0
    return d


@pytest.mark.parametrize("command", [["check"], ["bench", "--sizes", "1024", "--budget-ms", "5", "--no-compile"]])
def test_check_and_bench_find_a_card_outside_the_repository(user_cards, command, capsys):
    assert main([command[0], "twice", "--kernels-dir", str(user_cards), *command[1:]]) == 0
    out = capsys.readouterr().out
    assert "twice" in out


def test_run_with_kernels_dir_runs_just_those_cards(user_cards, tmp_path, capsys):
    report_dir = tmp_path / "report"
    assert main(["run", "--kernels-dir", str(user_cards), "--quick", "--no-bench", "--out", str(report_dir)]) == 0
    out = capsys.readouterr().out
    assert "all 1 cards ok" in out
    results = json.loads((report_dir / "results.json").read_text())
    assert [r["name"] for r in results["cards"]] == ["twice"]


@pytest.mark.parametrize("argv, message", [
    (["build", "sigmoid", "--arch", "nine"], "argument --arch: expected entries like '9.0'"),
    (["inspect", "sigmoid", "--arch", "9.x"], "argument --arch: expected entries like '9.0'"),
    (["run", "--quick", "--arch", "sm90"], "argument --arch: expected entries like '9.0'"),
])
def test_a_bad_arch_is_a_usage_error_not_a_traceback(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_bad_size_is_a_usage_error_before_any_build(capsys):
    assert main(["bench", "sigmoid", "--sizes", "foo"]) == 2
    assert "kernelkit bench: --sizes: bad size 'foo'" in capsys.readouterr().err


def test_a_build_error_on_the_terminal_names_a_file_with_the_full_log():
    from kernelkit.diagnostics import Diagnostic
    from kernelkit.errors import BuildError
    from kernelkit.frontends.cli import _for_the_terminal

    error = BuildError("compiling k.cu", [Diagnostic("k.cu", 3, 1, "error", "expected ';'")], "the whole log\n")
    shown = _for_the_terminal(error)
    assert "k.cu:3:1: error: expected ';'" in shown and ".log attribute" not in shown
    path = Path(shown.rsplit("(full compiler output: ", 1)[1].rstrip(")"))
    assert path.read_text() == "the whole log\n"
    path.unlink()


@pytest.mark.cuda_build
def test_build_command_failure_names_the_log_file_not_an_attribute(tmp_path, capsys):
    """`kernelkit build` reports each card's failure itself: with the terminal's wording too."""
    (tmp_path / "kk_broken_build.cu").write_text("__global__ void k() { int x = ; }\n")
    (tmp_path / "kk_broken_build.h").write_text("#pragma once\n")
    assert main(["build", "kk_broken_build", "--kernels-dir", str(tmp_path), "--arch", "9.0"]) == 1
    err = capsys.readouterr().err
    assert "kk_broken_build.cu:1" in err and ".log attribute" not in err and "(full compiler output: /" in err
    Path(err.rsplit("(full compiler output: ", 1)[1].split(")")[0]).unlink()
