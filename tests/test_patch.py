"""Accelerating code nobody edits: torch.utils.cpp_extension's load/load_inline routed through kernelkit
(``patch_torch``, ``python -m kernelkit.patch``, ``KERNELKIT_PATCH_TORCH``), proven on three repository-shaped
packages (tests/fixtures/packages), and the warm-load record of a torch-style plan.

Each package's torch-including translation units cost ~30-70 s each to compile on a 2-core machine: the packages
are built once by torch's loader and once by kernelkit (the session's cache), and every other way of running them
reuses those builds (the first kernelkit run compiles, the others must not).
"""
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension as torch_ext

import kernelkit
from kernelkit import cpp_extension, patch, settings
from kernelkit.jit import cache, plan, sources
from kernelkit.jit.fast import recall

PACKAGES = Path(__file__).parent / "fixtures" / "packages"
NAMES = ("ganops", "rasterish", "muladd_ext")
ACTIVE = "kernelkit: torch.utils.cpp_extension.load/load_inline are routed through kernelkit"


@pytest.fixture
def patched():
    """patch_torch() for one test; torch's functions are back afterwards whatever the test did."""
    yield cpp_extension.patch_torch
    cpp_extension.unpatch()


# ------------------------------------------------------------------------------------------ the patch itself
def test_patch_routes_torchs_functions_and_unpatch_restores_them(patched, capsys):
    original_load, original_inline = torch_ext.load, torch_ext.load_inline
    assert patched() is True and cpp_extension.is_patched()
    assert torch_ext.load is not original_load and torch_ext.load.__kernelkit_routed__
    assert inspect.signature(torch_ext.load) == inspect.signature(original_load)  # torch's, for introspection
    assert inspect.signature(torch_ext.load_inline) == inspect.signature(original_inline)
    assert patched() is False  # already on: nothing changes, no second message
    assert capsys.readouterr().err.count(ACTIVE) <= 1
    assert cpp_extension.unpatch() is True
    assert torch_ext.load is original_load and torch_ext.load_inline is original_inline
    assert cpp_extension.unpatch() is False and not cpp_extension.is_patched()


def test_a_call_torch_refuses_gets_torchs_type_error(patched):
    patched()
    with pytest.raises(TypeError, match="sources"):
        torch_ext.load("kk_no_sources")  # not kernelkit's card loading: torch requires sources
    with pytest.raises(TypeError, match="unexpected keyword argument 'arch'"):
        torch_ext.load("kk_x", ["x.cpp"], arch="9.0")  # kernelkit's own keywords are not torch's


def test_sycl_calls_go_to_torchs_own_function(monkeypatch):
    calls = []

    def torch_load(name, sources, extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None,  # noqa: ARG001
                   **kwargs):  # noqa: ARG001 - torch's signature is what the patch binds against
        calls.append(extra_sycl_cflags)
        return "torch's"

    monkeypatch.setattr(torch_ext, "load", torch_load)
    try:
        cpp_extension.patch_torch()
        assert torch_ext.load("kk_sycl", ["x.sycl"], extra_sycl_cflags=["-O2"]) == "torch's"
    finally:
        cpp_extension.unpatch()
    assert calls == [["-O2"]]


def test_modules_that_bound_torchs_function_before_the_patch_are_named(patched, monkeypatch, caplog):
    early = types.ModuleType("kk_early_binder")
    early.load = torch_ext.load  # `from torch.utils.cpp_extension import load`, run before the patch
    monkeypatch.setitem(sys.modules, "kk_early_binder", early)
    with caplog.at_level("WARNING", logger="kernelkit"):
        patched()
    assert "kk_early_binder.load" in caplog.text and "python -m kernelkit.patch" in caplog.text
    assert early.load is not torch_ext.load  # left as it was: documented, not rebound behind its back


def _python(code: str):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=600)


def test_patch_waits_for_torch_and_reaches_children_without_importing_kernelkit(tmp_path):
    """The environment python -m kernelkit.patch gives its children patches torch.utils.cpp_extension when the
    program imports it, before its own `from ... import load` runs, and imports no torch before that."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import sys
        assert "torch" not in sys.modules and "kernelkit" in sys.modules  # the site hook: light, torch-free
        from torch.utils.cpp_extension import load
        print("routed", getattr(load, "__kernelkit_routed__", False))
    """))
    env = patch.child_environment()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "routed True" in out.stdout and out.stderr.count(ACTIVE) == 1
    plain = subprocess.run([sys.executable, "-c", "from torch.utils.cpp_extension import load; "
                            "print('routed', getattr(load, '__kernelkit_routed__', False))"],
                           capture_output=True, text=True, timeout=600)
    assert "routed False" in plain.stdout  # nothing was installed anywhere


@pytest.mark.parametrize("args, message", [([], "usage"), (["nonexistent_script.py"], "no such file"),
                                           (["-m"], "-m needs a module name"), (["--bogus"], "unknown option")])
def test_patch_runner_refuses_bad_command_lines(args, message, capsys):
    assert patch.main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value, wanted", [("1", True), ("yes", True), ("0", False), ("", False), ("off", False)])
def test_environment_variable_values(value, wanted, monkeypatch):
    monkeypatch.setenv(settings.PATCH_TORCH.name, value)
    assert patch.wanted() is wanted


# -------------------------------------------------------------------- three repository-shaped packages
def _swap_imports(root: Path) -> None:
    """The one-line change a user makes: torch.utils.cpp_extension -> kernelkit.cpp_extension."""
    for f in root.rglob("*.py"):
        text = f.read_text()
        swapped = (text.replace("import torch.utils.cpp_extension\n", "import torch.utils.cpp_extension\nimport kernelkit.cpp_extension\n")
                   .replace("torch.utils.cpp_extension.load(", "kernelkit.cpp_extension.load(")
                   .replace("from torch.utils.cpp_extension import load", "from kernelkit.cpp_extension import load"))
        f.write_text(swapped)


def _drive(root: Path, mode: str, out: Path, ext_dir: Path, *, runner=(), env=None):
    env = dict(env or os.environ, TORCH_EXTENSIONS_DIR=str(ext_dir), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, *runner, str(root / "drive.py"), str(out), mode], capture_output=True,
                          text=True, env=env, timeout=3000)
    assert proc.returncode == 0, f"{mode} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return torch.load(out, weights_only=False), proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every package run by torch's loader, then by kernelkit four ways (the first builds, the rest reuse)."""
    tmp = tmp_path_factory.mktemp("packages")
    root, swapped = tmp / "packages", tmp / "swapped"
    shutil.copytree(PACKAGES, root, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PACKAGES, swapped, ignore=shutil.ignore_patterns("__pycache__"))
    _swap_imports(swapped)
    kk_ext = tmp / "kk_extensions"
    out = {"torch": _drive(root, "torch", tmp / "torch.pt", tmp / "torch_extensions")}
    out["python -m kernelkit.patch"] = _drive(root, "plain", tmp / "m.pt", kk_ext, runner=("-m", "kernelkit.patch"))
    out["patch_torch()"] = _drive(root, "call", tmp / "call.pt", kk_ext)
    out["KERNELKIT_PATCH_TORCH=1"] = _drive(root, "plain", tmp / "env.pt", kk_ext, env=patch.child_environment())
    out["import swap"] = _drive(swapped, "plain", tmp / "swap.pt", tmp / "kk_extensions_swap")
    return out


KERNELKIT_WAYS = ["python -m kernelkit.patch", "patch_torch()", "KERNELKIT_PATCH_TORCH=1", "import swap"]


def _assert_same(ours, theirs, where):
    if isinstance(theirs, torch.Tensor):
        assert torch.equal(ours, theirs), f"{where}: differs from torch's build"
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for k in theirs:
            _assert_same(ours[k], theirs[k], f"{where}.{k}")
    else:
        assert ours == theirs, f"{where}: {ours!r} != torch's {theirs!r}"


@pytest.mark.parametrize("way", KERNELKIT_WAYS)
@pytest.mark.parametrize("package", NAMES)
def test_package_runs_unchanged_with_torchs_results(runs, way, package):
    ours, theirs = runs[way][0]["results"][package], runs["torch"][0]["results"][package]
    _assert_same(ours, theirs, f"{package} through {way}")


def test_torch_alone_breaks_the_import_by_name_helpers_and_kernelkit_does_not(runs):
    facts = runs["torch"][0]["facts"]
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 9):
        assert facts["plain_torch_import"].startswith("ModuleNotFoundError")  # pybind11 3: not in sys.modules
    for way in KERNELKIT_WAYS:
        assert runs[way][0]["results"]["ganops"]["in_sys_modules"], way


def test_the_patch_says_once_that_it_is_active_and_builds_once(runs):
    for way in KERNELKIT_WAYS:
        stderr, facts = runs[way][1], runs[way][0]["facts"]
        assert stderr.count(ACTIVE) == (0 if way == "import swap" else 1), way
        assert facts["routed"] is (way != "import swap"), way
    for way in KERNELKIT_WAYS[1:]:  # the first run built everything; the others (a new build dir too) reuse it
        assert runs[way][0]["facts"]["kernelkit_compiles"] == 0, way


@pytest.mark.gpu
def test_packages_ran_their_cuda_kernels(runs):
    for way in ["torch", *KERNELKIT_WAYS]:
        results = runs[way][0]["results"]
        assert results["rasterish"]["with_cuda"] and results["ganops"]["module_name"] == "bias_act_plugin_cuda", way


# ------------------------------------------------------------------------- the warm-load record of a plan
@pytest.fixture
def fresh_files_recorded(monkeypatch):
    """Files written by the test a moment ago are 'racy' (a second edit in the same timestamp tick could keep
    their identity): the tests' edits all change sizes, so they are recorded here anyway."""
    monkeypatch.setattr(recall, "RACY_SECONDS", -3600.0)
    monkeypatch.setattr(recall, "FINE_RACY_SECONDS", -3600.0)


def test_a_change_is_racy_within_one_timestamp_tick_of_the_plan():
    """Whole-second timestamps (FAT, old filesystems) keep a change racy for RACY_SECONDS; nanosecond ones, whose
    tick is the kernel's coarse clock, for FINE_RACY_SECONDS."""
    now = 1_800_000_000.0
    whole = [1, 2, 100, int(now - 1) * 10**9, int(now - 1) * 10**9]
    fine = [1, 2, 100, int((now - 1) * 1e9) + 3_999_000, int((now - 1) * 1e9) + 3_999_000]
    assert recall._racy(whole, now) and not recall._racy(fine, now)
    just_now = [1, 2, 100, int((now - 0.01) * 1e9) + 1, int((now - 0.01) * 1e9) + 1]
    assert recall._racy(just_now, now)
    old = [1, 2, 100, int(now - 3) * 10**9, int(now - 3) * 10**9]
    assert not recall._racy(old, now)


def _tree(tmp_path):
    src, inc = tmp_path / "src", tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    src.mkdir()
    (inc / "h.h").write_text("#define KK_H 1\n")
    (inc / "sub" / "n.h").write_text("#define KK_N 2\n")
    (tmp_path / "later").mkdir()
    (tmp_path / "later" / "m.h").write_text("#define KK_M 3\n")
    (src / "a.cpp").write_text('#include "h.h"\n#include "sub/n.h"\n#include <m.h>\n'
                               'extern "C" int kk_recall_a() { return KK_H + KK_N + KK_M; }\n')
    return src, inc


def _plan(tmp_path, **kw):
    src, inc = tmp_path / "src", tmp_path / "inc"
    return plan.plan_extension("kk_recall", [src / "a.cpp"], is_python_module=False, use_record=True,
                               extra_include_paths=[str(inc), str(tmp_path / "missing"), str(tmp_path / "later")],
                               **kw)


@pytest.mark.usefixtures("fresh_files_recorded")
def test_a_record_stands_for_the_plan_until_anything_it_read_changes(tmp_path):
    src, inc = _tree(tmp_path)
    first = _plan(tmp_path)
    assert not isinstance(first, recall.Recalled)
    again = _plan(tmp_path)
    assert isinstance(again, recall.Recalled) and again.key == first.key
    assert [u.key for u in again.units] == [u.key for u in first.units]
    (inc / "h.h").write_text("#define KK_H 10\n")  # a header edit
    edited = _plan(tmp_path)
    assert not isinstance(edited, recall.Recalled) and edited.key != first.key
    assert _plan(tmp_path).key == edited.key
    for shadow in (src / "h.h", src / "sub" / "n.h", tmp_path / "missing" / "m.h"):
        shadow.parent.mkdir(exist_ok=True)  # a header created where the search now finds it first
        shadow.write_text("#define KK_SHADOW 1\n")
        shadowed = _plan(tmp_path)
        assert not isinstance(shadowed, recall.Recalled) and shadow in shadowed.units[0].deps, shadow
        assert isinstance(_plan(tmp_path), recall.Recalled)
    other_flags = _plan(tmp_path, extra_cflags=["-DKK_OTHER=1"])
    assert not isinstance(other_flags, recall.Recalled) and other_flags.key != shadowed.key


def test_no_record_for_files_changed_just_now(tmp_path):
    _tree(tmp_path)
    _plan(tmp_path)
    assert not isinstance(_plan(tmp_path), recall.Recalled)  # written this second: planned in full again


@pytest.mark.usefixtures("fresh_files_recorded")
def test_a_record_never_lets_a_tampered_or_truncated_library_load(tmp_path, monkeypatch):
    _tree(tmp_path)
    kw = dict(is_python_module=False, extra_include_paths=[str(tmp_path / "inc"), str(tmp_path / "later")])
    kernelkit.load("kk_recall_lib", [str(tmp_path / "src" / "a.cpp")], load=False, **kw)  # builds, records
    kernelkit.load("kk_recall_lib", [str(tmp_path / "src" / "a.cpp")], load=False, **kw)  # verifies, stamps
    recalled = plan.plan_extension("kk_recall_lib", [tmp_path / "src" / "a.cpp"], use_record=True,
                                   extra_include_paths=kw["extra_include_paths"], is_python_module=False)
    assert isinstance(recalled, recall.Recalled) and recalled.library is not None
    real = cache.verified_library
    monkeypatch.setattr(cache, "verified_library", lambda *_, **__: pytest.fail("hashed although unchanged"))
    so = recall.verified_library(recalled)
    assert so is not None and so == Path(recalled.library[0])
    monkeypatch.setattr(cache, "verified_library", real)
    data = so.read_bytes()
    with open(so, "r+b") as f:  # tampered in place: same size, one byte changed
        f.seek(len(data) // 2)
        f.write(bytes([data[len(data) // 2] ^ 0xFF]))
    assert recall.verified_library(recalled) is None and not so.exists()  # hashed, refused, removed
    kernelkit.load("kk_recall_lib", [str(tmp_path / "src" / "a.cpp")], load=False, **kw)  # rebuilt
    so.write_bytes(data[: len(data) // 2])  # truncated
    assert recall.verified_library(recalled) is None


@pytest.mark.usefixtures("fresh_files_recorded")
def test_warm_load_in_a_new_process_neither_scans_nor_hashes(tmp_path):
    _tree(tmp_path)
    args = [str(tmp_path / "src" / "a.cpp")]
    kw = dict(is_python_module=False, extra_include_paths=[str(tmp_path / "inc"), str(tmp_path / "later")])
    for _ in range(2):  # the first records the plan, the second the library's identity once its hash matched
        kernelkit.load("kk_recall_new", args, load=False, **kw)
    code = f"""
        import kernelkit
        from kernelkit.jit import cache, sources
        def refuse(*a, **k):
            raise AssertionError("the warm path scanned or hashed")
        sources.scan_includes = sources.digest_tree = cache.verified_library = refuse
        path = kernelkit.load("kk_recall_new", {args!r}, **{kw!r})
        print("warm ok", path.endswith(".so"))
    """
    out = _python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warm ok True" in out.stdout
    assert sources.scan_includes is not None


@pytest.mark.usefixtures("fresh_files_recorded")
def test_a_warm_load_inline_in_a_new_process_neither_scans_nor_hashes():
    """load_inline's generated sources are recorded as load's files are: a new process loading the same strings
    scans and hashes nothing, and another string is planned in full."""
    text = 'extern "C" int kk_recall_inline() { return 41; }\n'
    kw = dict(no_implicit_headers=True, is_python_module=False)
    built = kernelkit.load_inline("kk_recall_inline", [text], **kw)  # builds and records the plan
    code = f"""
        import kernelkit
        from kernelkit.jit import cache, sources
        from kernelkit.jit.fast import recall
        recall.RACY_SECONDS = recall.FINE_RACY_SECONDS = -3600.0  # the test's files are seconds old
        def refuse(*a, **k):
            raise AssertionError("the warm path scanned or hashed")
        sources.scan_includes = sources.digest_tree = refuse
        if REFUSE_HASHING:
            cache.verified_library = refuse
        print("warm", kernelkit.load_inline("kk_recall_inline", [{text!r}], **{kw!r}))
    """
    for refuse_hashing in (False, True):  # the first new process keeps the library's identity once its hash matched
        out = _python(code.replace("REFUSE_HASHING", str(refuse_hashing)))
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"warm {built}" in out.stdout
    recalled = plan.plan_torch_inline("kk_recall_inline", [text], None, None, use_record=True, **kw)
    other = plan.plan_torch_inline("kk_recall_inline", [text.replace("41", "42")], None, None, use_record=True, **kw)
    assert isinstance(recalled, recall.Recalled) and not isinstance(other, recall.Recalled)
    assert other.key != recalled.key


@pytest.mark.usefixtures("fresh_files_recorded")
def test_a_full_plans_load_of_a_cached_library_keeps_its_verified_identity(tmp_path):
    """A plan not recorded when it was built (its sources had just changed) is planned in full by the next load,
    which hashes the library: that hash serves the record too, so the load after it hashes nothing."""
    _tree(tmp_path)
    args = [str(tmp_path / "src" / "a.cpp")]
    kw = dict(is_python_module=False, extra_include_paths=[str(tmp_path / "inc"), str(tmp_path / "later")])
    kernelkit.load("kk_recall_stamp", args, load=False, **kw)  # builds and records
    for record in cache.subdir("plans").glob("*.json"):
        if json.loads(record.read_text())["target"]["name"] == "kk_recall_stamp":
            record.unlink()  # as if the build had been racy: not recorded
    code = f"""
        import kernelkit
        from kernelkit.jit import cache
        from kernelkit.jit.fast import recall
        recall.RACY_SECONDS = recall.FINE_RACY_SECONDS = -3600.0  # the test's files are seconds old
        hashed = []
        real = cache.verified_library
        cache.verified_library = lambda *a, **k: hashed.append(a) or real(*a, **k)
        path = kernelkit.load("kk_recall_stamp", {args!r}, **{kw!r})
        print("hashed", len(hashed))
    """
    out = _python(code)
    assert out.returncode == 0 and "hashed 1" in out.stdout, out.stderr[-3000:]  # the full plan's load hashed it
    recalled = plan.plan_extension("kk_recall_stamp", [tmp_path / "src" / "a.cpp"], use_record=True,
                                   extra_include_paths=kw["extra_include_paths"], is_python_module=False)
    assert isinstance(recalled, recall.Recalled) and recalled.library is not None  # and its identity was kept
    out = _python(code.replace('"hashed", len(hashed)', '"hashed", len(hashed), path.endswith(".so")'))
    assert out.returncode == 0 and "hashed 0 True" in out.stdout, out.stderr[-3000:]


def test_build_directory_copy_is_made_once_and_replaced_when_it_differs(tmp_path):
    """The GAN helper passes build_directory on every load: a warm load must not copy the library again."""
    _tree(tmp_path)
    args = [str(tmp_path / "src" / "a.cpp")]
    kw = dict(is_python_module=False, extra_include_paths=[str(tmp_path / "inc"), str(tmp_path / "later")],
              build_directory=str(tmp_path / "bd"))
    built = kernelkit.load("kk_recall_copy", args, **kw)
    copy = tmp_path / "bd" / "kk_recall_copy.so"
    first = os.stat(copy)
    assert copy.read_bytes() == Path(built).read_bytes()
    kernelkit.load("kk_recall_copy", args, **kw)
    assert os.stat(copy).st_ino == first.st_ino  # left as it was
    copy.write_bytes(b"not the library")
    kernelkit.load("kk_recall_copy", args, **kw)
    assert copy.read_bytes() == Path(built).read_bytes()  # replaced


def test_torchs_positional_order_is_known_without_importing_its_module():
    """torch.utils.cpp_extension imports setuptools (tens of ms): a warm load with positional arguments reads the
    installed torch's order from a record made the first time, and it is the module's own."""
    expected = {f: list(inspect.signature(getattr(torch_ext, f)).parameters)[1:] for f in ("load", "load_inline")}
    code = """
        import json, sys
        from kernelkit.loading import arguments
        print(json.dumps({f: list(arguments.torch_order(f)) for f in ("load", "load_inline")}))
        print("imported", "torch.utils.cpp_extension" in sys.modules)
    """
    for _ in range(2):  # the first run may make the record; the second must not import the module
        out = _python(code)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = out.stdout.strip().splitlines()
        assert json.loads(lines[0]) == expected
    assert lines[1] == "imported False"


def test_namespace_probe_asks_torchs_own_question_and_leaves_nothing_behind():
    """A warm load of a TORCH_LIBRARY extension checks its namespaces without listing every schema (~20 ms)."""
    from kernelkit.loading.opening import _namespace_defined

    assert _namespace_defined("aten")
    assert not _namespace_defined("kk_probe_free") and not _namespace_defined("kk_probe_free")  # nothing kept
    defined = torch.library.Library("kk_probe_def", "DEF")  # defined from Python counts as much as from C++
    assert _namespace_defined("kk_probe_def")
    del defined
