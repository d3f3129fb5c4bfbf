"""`kernelkit new`: the cards it writes build, pass kernelkit.check and run kernelkit.bench as written (one
build per kind, shared by the module through the session's cache), and a unary op with a backward stays small."""
import shlex
import subprocess
import sys

import pytest
import torch

import kernelkit
from kernelkit.frontends import cli, scaffold
from kernelkit.jit import running

# the test's cards: one per kind (names no other test uses, so the process-wide registry never mixes them up)
KINDS = {"scaf_square": ("unary", True), "scaf_axpy": ("binary", False), "scaf_twice": ("custom", False)}


@pytest.fixture(scope="module")
def cards_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cards")
    for name, (kind, backward) in KINDS.items():
        scaffold.new_card(name, d, kind, backward)
    return d


def _nonblank_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def test_unary_with_backward_is_at_most_54_lines():
    files = scaffold.card_files("silu", "unary", backward=True)
    card = {f: t for f, t in files.items() if not f.startswith("test_")}
    assert sorted(card) == ["silu.cu", "silu.h", "silu.py", "silu_cpu.cpp", "silu_math.h"]
    # the math apart (its CUDA and CPU files: 5 lines each, comments and includes included) costs 11 lines, and
    # <cmath> (std::exp is the first thing people write) one
    assert sum(_nonblank_lines(t) for t in card.values()) <= 54


@pytest.mark.parametrize("kind", scaffold.KINDS)
def test_spec_uses_cardkit_and_has_a_wrong_placeholder(tmp_path, kind):
    """The spec file imports (no build needed) and carries an empty WRONG, with a comment saying what goes there;
    its helpers come from kernelkit.cardkit, not the package's top level."""
    from kernelkit.jit.cards import find

    scaffold.new_card("scaf_wrong", tmp_path, kind)
    text = (tmp_path / "scaf_wrong.py").read_text()
    assert "WRONG = {}  # EDIT: " in text and "cardkit.wrong_twins(reference)" in text
    assert "kernelkit.elementwise_inputs" not in text and "kernelkit.register_elementwise_fakes" not in text
    module = find("scaf_wrong", tmp_path).module()
    assert module.WRONG == {} and module.SPEC.name == "scaf_wrong"


def test_edit_marks_and_names():
    files = scaffold.card_files("gelu_fast", "unary", backward=True)
    assert "struct GeluFastOp {" in files["gelu_fast_math.h"] and "struct GeluFastOp;" in files["gelu_fast.h"]
    assert "gelu_fast_backward" in files["gelu_fast.h"]
    # the math has its own header; the binding's header, which a math edit must not touch, has no EDIT line
    assert all("EDIT" in files[f] for f in ("gelu_fast_math.h", "gelu_fast.py"))
    assert not any("EDIT" in files[f] for f in ("gelu_fast.h", "gelu_fast.cu", "gelu_fast_cpu.cpp"))
    assert "$" not in "".join(files.values())  # every template field filled


@pytest.mark.parametrize("name, expected", [("1x", "C identifier"), ("relu-2", "C identifier"), ("", "C identifier"),
                                            ("class", "reserved"), ("lambda", "reserved"), ("test_relu", "reserved")])
def test_bad_names_are_refused(name, expected):
    with pytest.raises(kernelkit.KernelkitError, match=expected):
        scaffold.card_files(name)


def test_bad_kind_and_backward_refused():
    with pytest.raises(kernelkit.KernelkitError, match="--kind"):
        scaffold.card_files("x2", "ternary")
    with pytest.raises(kernelkit.KernelkitError, match="--backward"):
        scaffold.card_files("x2", "binary", backward=True)


def test_never_overwrites(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("# the user's own file\n")
    assert cli.main(["new", "mine", "--dir", str(tmp_path)]) == 1
    assert "mine.py already exists" in capsys.readouterr().err
    assert (tmp_path / "mine.py").read_text() == "# the user's own file\n"
    assert not (tmp_path / "mine.cu").exists()  # nothing written when any file is in the way


def test_command_writes_the_card_without_importing_torch(tmp_path):
    code = ("import sys; from kernelkit.frontends import cli; "
            f"rc = cli.main(['new', 'relu', '--dir', {str(tmp_path)!r}, '--backward']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relu.cu", "relu.h", "relu.py", "relu_cpu.cpp", "relu_math.h",
                                                          "test_relu.py"]
    assert "kernelkit check relu --kernels-dir" in r.stdout


def test_the_hinted_test_command_works_beside_a_clone_named_kernelkit(tmp_path):
    """From the directory that holds a clone named kernelkit (git's default name), `python -m pytest <dir>/test_x.py`
    would import the clone as a namespace package: the hint runs pytest in the card's directory instead, and the
    generated test names the cause where the trap is walked into anyway. Collection only: no build."""
    (tmp_path / "kernelkit" / "loader").mkdir(parents=True)  # a clone: no __init__.py at its top
    (tmp_path / "kernelkit" / "README.md").write_text("# kernelkit\n")
    new = subprocess.run([sys.executable, "-m", "kernelkit", "new", "relu", "--dir", "mykernels"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert new.returncode == 0, new.stderr
    hint = new.stdout.splitlines()[-1].strip()
    assert hint == f"cd {tmp_path / 'mykernels'} && python -m pytest test_relu.py", new.stdout
    hinted = subprocess.run(hint.replace("python", shlex.quote(sys.executable), 1) + " --collect-only -q", shell=True,
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert hinted.returncode == 0 and "test_matches_reference" in hinted.stdout, hinted.stdout + hinted.stderr
    trapped = subprocess.run([sys.executable, "-m", "pytest", "mykernels/test_relu.py", "--collect-only", "-q"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert trapped.returncode != 0
    assert f"'kernelkit' here is the folder {tmp_path / 'kernelkit'} (a clone of kernelkit?)" in trapped.stdout, \
        trapped.stdout


@pytest.mark.cuda_build  # the cards have device code: it is compiled even for a CPU-only run
@pytest.mark.parametrize("name", list(KINDS))
def test_card_builds_and_passes_check_on_cpu(cards_dir, name):
    result = kernelkit.check(name, kernels_dir=cards_dir, device="cpu")
    assert result.ok, result.summary()
    assert len(result.cases) > 0


@pytest.mark.cuda_build
def test_unary_backward_through_kernelkit_ops(cards_dir):
    kernelkit.load("scaf_square", kernels_dir=cards_dir)
    x = torch.randn(37, dtype=torch.float64, requires_grad=True)
    y = kernelkit.ops.scaf_square(x)  # resolved by name: the card lives outside the search path, loaded above
    torch.testing.assert_close(y, x * x)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 2 * x)
    assert torch.autograd.gradcheck(kernelkit.ops.scaf_square, (x,))
    with pytest.raises(RuntimeError, match="scaf_square: x must be a float32"):
        kernelkit.ops.scaf_square(torch.ones(3, dtype=torch.int32))


@pytest.mark.cuda_build
def test_a_math_edit_rebuilds_device_code_and_the_cpu_loop_only(tmp_path, capsys):
    """The EDIT line of a unary card is in its _math.h, whose functors are device code where nvcc compiles them
    (KK_MATH_FN): an edit compiles the .cu's device code alone (its host side and the torch-facing binding stay
    cached) and the CPU file with the host compiler, and the CPU op computes the new math."""

    scaffold.new_card("scaf_cube", tmp_path, "unary")
    math = tmp_path / "scaf_cube_math.h"
    kernelkit.load("scaf_cube", kernels_dir=tmp_path)
    x = torch.randn(1000, dtype=torch.float64)
    torch.testing.assert_close(kernelkit.ops.scaf_cube(x), x * x)
    # std::exp: the scaffold's math header includes <cmath>, for the device code as for the CPU loop
    math.write_text(math.read_text().replace("return x * x; }  // EDIT", "return std::exp(x) * x; }  // EDIT"))
    before = dict(running.STATS)
    kernelkit.load("scaf_cube", kernels_dir=tmp_path)
    counts = {k: running.STATS[k] - before[k] for k in ("compiles", "device_rebuilds")}
    assert counts == {"compiles": 2, "device_rebuilds": 1}, capsys.readouterr().err  # nvcc --fatbin, g++
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        wide = xs.double() if dtype == torch.float64 else xs.float()
        torch.testing.assert_close(kernelkit.ops.scaf_cube(xs), (wide.exp() * wide).to(dtype))
    strided = torch.randn(40, 30, dtype=torch.float64).t()  # a strided view: copied to contiguous, then the loop
    torch.testing.assert_close(kernelkit.ops.scaf_cube(strided), strided.exp() * strided)


@pytest.mark.cuda_build
def test_check_command_and_bench_on_cpu(cards_dir):
    assert cli.main(["check", "scaf_axpy", "--kernels-dir", str(cards_dir), "--device", "cpu"]) == 0
    result = kernelkit.bench("scaf_axpy", kernels_dir=cards_dir, device="cpu", sizes=[(1 << 12,)], budget_ms=20,
                             warmup_ms=5, compile=False)
    assert "scaf_axpy" in result.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KINDS))
def test_card_passes_check_and_bench_on_cuda(cards_dir, name):
    result = kernelkit.check(name, kernels_dir=cards_dir, device="cuda")
    assert result.ok, result.summary()
    timing = kernelkit.bench(name, kernels_dir=cards_dir, device="cuda", sizes=[(1 << 20,), (1 << 24,)])
    assert name in timing.summary()


@pytest.mark.gpu
def test_generated_tests_pass_on_cuda(cards_dir):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cards_dir)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
