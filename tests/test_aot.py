"""Ahead-of-time builds (kernelkit.aot): the source key, prebuilt libraries built with torch's
BuildExtension, their use by ``kernelkit.load`` (and the JIT fallback when stale), read-only sharing, the
opt-in wheel build and the C++ (libtorch, CMake) consumer.

CI cost (2 cores): one AOT build of two cards (sigmoid: CUDA compile + link for one arch; affine: a CPU
card) and kernelkit.ops' fast call module, shared by every test here, ~2 min; the slow tests add a CMake build (~1 min) and a wheel build that
reuses the AOT objects. The full wheel of every built-in card is left to benchmarks/aot_latency.py.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit import aot
from kernelkit.jit import prebuilt
from kernelkit.jit.cards import builtin_dir, find

sys.path.insert(0, str(Path(__file__).parent))
from loader_cards import run_python, write_affine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ARCH = "{}.{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else "9.0"
X = torch.tensor([0.0, 1.0, -2.5, 3.0])


def copy_cards(dst: Path) -> Path:
    """sigmoid (a CUDA card with CPU ops) and affine (a CPU card) in a directory of their own."""
    src = builtin_dir()
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("sigmoid.cu", "sigmoid.h", "sigmoid.py"):
        shutil.copy(src / f, dst / f)
    return write_affine(dst)


def plan(name, cards_dir, arch=ARCH, **kw):
    from kernelkit.jit.plan import plan_card

    return plan_card(find(name, cards_dir), arch, kw.get("cflags", []), [], [], [])


def env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), e.get("PYTHONPATH", "")])
    # children ask for the arch the prebuilts were built for (a host may set TORCH_CUDA_ARCH_LIST=9.0a)
    e["KERNELKIT_ARCH"] = ARCH
    e.update({k: str(v) for k, v in extra.items()})
    return e


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One AOT build (BuildExtension) of sigmoid, affine and kernelkit's fast call module, from a copy of
    the cards."""
    root = tmp_path_factory.mktemp("aot")
    cards = copy_cards(root / "cards")
    out = root / "prebuilt"
    t0 = time.perf_counter()
    proc = run_python(f"""
        import sys
        from kernelkit import aot
        sys.exit(aot.main(["--out", {str(out)!r}, "--arch", {ARCH!r}, "--kernels-dir", {str(cards)!r},
                           "--build-temp", {str(root / "build" / "temp")!r}, "sigmoid", "affine",
                           "fastcall"]))
    """, env=env(), timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"root": root, "cards": cards, "out": out, "seconds": time.perf_counter() - t0, "output": proc}


# ------------------------------------------------------------------------------ no compiler needed
def test_source_key_ignores_compiler_identity_paths_and_arch(tmp_path, monkeypatch):
    a = plan("affine", copy_cards(tmp_path / "a"))
    key_a = prebuilt.source_key(a)  # (it reads the files: take it before they are edited below)
    b = plan("affine", copy_cards(tmp_path / "b"))  # another checkout: other paths, same content
    assert prebuilt.source_key(b) == key_a
    s = plan("sigmoid", tmp_path / "a", arch="8.0;9.0")
    assert prebuilt.source_key(s) == prebuilt.source_key(plan("sigmoid", tmp_path / "a", arch="9.0"))
    assert prebuilt.target_archs(s) == ["sm_80", "sm_90"]
    # the local key changes with the compiler's identity; the source key does not
    from kernelkit.jit import toolchain

    real = toolchain.fingerprint()
    monkeypatch.setattr(toolchain, "fingerprint", lambda: real.replace("cxx=", "cxx=/other/g++:"))
    moved = plan("affine", tmp_path / "a")
    assert moved.key != a.key and prebuilt.source_key(moved) == key_a
    monkeypatch.undo()
    # ...but it does change with flags and with the sources
    assert prebuilt.source_key(plan("affine", tmp_path / "a", cflags=["-DFOO"])) != key_a
    (tmp_path / "a" / "affine_consts.h").write_text("#define SCALE 3.0f\n#define OFFSET 1.0f\n")
    assert prebuilt.source_key(plan("affine", tmp_path / "a")) != key_a


def test_a_stale_prebuilt_names_what_differs():
    here = prebuilt.portable_fingerprint()
    other = [line if not line.startswith("torch=") else "torch=2.99.0" for line in here]
    torch_line = next(line for line in here if line.startswith("torch="))
    assert prebuilt._what_differs({"fingerprint": other}) == f"torch 2.99.0 there, {torch_line[6:]} here"
    assert prebuilt._what_differs({"fingerprint": here}) == "other sources or flags"


def test_arch_coverage():
    assert prebuilt.covers(["sm_80", "sm_90"], ["sm_90"])
    assert prebuilt.covers(["sm_80"], ["sm_86"])  # same major, lower minor: binary compatible
    assert not prebuilt.covers(["sm_80"], ["sm_90"])
    assert prebuilt.covers(["sm_80", "compute_80"], ["sm_90"])  # PTX, JIT-compiled by the driver
    assert not prebuilt.covers(["sm_90"], ["sm_90", "compute_90"])  # PTX asked for, none shipped
    assert not prebuilt.covers(["sm_90"], ["sm_90a"]) and not prebuilt.covers(["sm_90a"], ["sm_90"])
    assert prebuilt.covers([], [])


@pytest.mark.parametrize("flags, archs", [
    (["-gencode", "arch=compute_90,code=sm_90"], ["sm_90"]),
    (["-gencode=arch=compute_80,code=[sm_80,compute_80]"], ["compute_80", "sm_80"]),
    (["--generate-code", "arch=compute_90a,code=sm_90a"], ["sm_90a"]),
    (["-arch=sm_80"], ["compute_80", "sm_80"]),  # nvcc: SASS and PTX of 80
    (["-arch", "compute_90"], ["compute_90"]),
    (["--gpu-architecture=compute_90", "-code=sm_90,compute_90"], ["compute_90", "sm_90"]),
])
def test_every_spelling_of_the_gpu_code_reaches_the_manifest(flags, archs):
    _, got, rest = prebuilt.split_flags(["-O3", *flags, "-DX"])
    assert sorted(got) == archs and rest == ["-O3", "-DX"]


@pytest.mark.parametrize("flags", [["-arch=native"], ["-arch", "all-major"], ["-gencode", "arch=compute_90,code=lto_90"],
                                   ["-arch=sm_90", "-code=lto_90"]])
def test_gpu_code_resolved_by_nvcc_stays_in_the_source_key(flags):
    # nvcc decides these on the machine (or they are not SASS/PTX): no archs claimed, the flags keep keys apart
    _, got, rest = prebuilt.split_flags(flags)
    assert got == [] and all(token in " ".join(rest) for token in flags)


@pytest.mark.cuda_build
def test_one_wheel_for_the_gpus_users_have(tmp_path):
    """README's recipe: SASS for each listed arch and PTX of the last, so a newer GPU JIT-compiles it; the
    manifest says what the prebuilt covers."""
    cards = copy_cards(tmp_path / "cards")
    target = plan("sigmoid", cards, arch="7.5;8.0;8.6;8.9;9.0+PTX")
    nvcc = aot.extension(target).extra_compile_args["nvcc"]
    gencodes = [nvcc[i + 1] for i, f in enumerate(nvcc) if f == "-gencode"]
    expected = [f"arch=compute_{a},code=sm_{a}" for a in ("75", "80", "86", "89", "90")]
    assert sorted(gencodes) == sorted(expected + ["arch=compute_90,code=compute_90"])
    archs = prebuilt.target_archs(target)
    assert prebuilt.covers(archs, ["sm_75"]) and prebuilt.covers(archs, ["sm_120"])  # PTX: JIT by the driver


def test_setup_py_without_aot_imports_no_torch():
    proc = run_python(f"""
        import runpy, sys
        sys.argv = ["setup.py", "--name"]
        runpy.run_path({str(REPO / "setup.py")!r}, run_name="__main__")
        assert "torch" not in sys.modules, "plain setup.py imported torch"
    """)
    assert proc.returncode == 0 and "kernelkit" in proc.stdout, proc.stderr


# ------------------------------------------------------------------------------ with the AOT build
def test_aot_output_is_a_line_per_card_with_the_compiler_log_in_a_file(built):
    proc, log = built["output"], built["root"] / "build" / "temp" / "aot.log"
    shown = proc.stdout + proc.stderr
    assert "[1/" in log.read_text() and "-DTORCH_EXTENSION_NAME" in log.read_text()  # ninja's lines
    assert "[1/" not in shown and "-DTORCH_EXTENSION_NAME" not in shown, shown
    assert "AOT: sigmoid built in" in proc.stderr and "AOT: affine built in" in proc.stderr, proc.stderr
    assert f"the compilers' output is in {log}" in proc.stderr
    assert len(proc.stdout.splitlines()) == 3, proc.stdout  # the three entries written


def test_aot_build_writes_entries_with_manifests(built):
    for name, archs in (("sigmoid", ["sm_" + ARCH.replace(".", "")]), ("affine", [])):
        [entry] = built["out"].glob(f"{name}-*")
        m = prebuilt.read_manifest(entry)
        assert m["name"] == name and m["archs"] == archs and entry.name == f"{name}-{m['source_key'][:16]}"
        assert m["source_key"] == prebuilt.source_key(plan(name, built["cards"]))
        assert m["sha256"] == aot.sha256_file(entry / m["so"]) and m["so"] == f"kk_{name}.so"
    print(f"AOT build of sigmoid + affine: {built['seconds']:.1f} s")


def test_prebuilt_fastcall_is_loaded_without_a_compiler(built, tmp_path):
    proc = run_python("""
        import torch
        from kernelkit.jit import fastcall, running
        m = fastcall.module()
        assert m is not None, fastcall.error()
        print("FILE", m.__file__, "COMPILES", running.STATS["compiles"])
    """, env=env(KERNELKIT_PREBUILT_PATH=built["out"], KERNELKIT_CACHE_DIR=tmp_path / "empty-cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"FILE {built['out']}{os.sep}fastcall-" in proc.stdout and "COMPILES 0" in proc.stdout, proc.stdout


AOT_RUN = """
    import sys, torch, kernelkit
    torch.manual_seed(0)
    out = {}
    sig = kernelkit.load("sigmoid", kernels_dir=CARDS, arch=ARCH)
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = (torch.randn(4097, dtype=torch.float32) * 4).to(dt).requires_grad_(dt != torch.float16)
        y = sig.sigmoid(x)
        out[f"sigmoid_{dt}"] = y.detach()
        if x.requires_grad:
            y.backward(torch.ones_like(y))
            out[f"sigmoid_grad_{dt}"] = x.grad
    aff = kernelkit.load("affine", kernels_dir=CARDS)
    out["affine"] = aff.affine(torch.linspace(-3, 3, 101))
    out["paths"] = [str(sig.path), str(aff.path)]
    torch.save(out, OUT)
"""


def run_ops(cards, out_file, **extra_env):
    code = f"CARDS, ARCH, OUT = {str(cards)!r}, {ARCH!r}, {str(out_file)!r}\n" + AOT_RUN.replace("\n    ", "\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(**extra_env),
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out_file), proc.stderr


def test_load_uses_matching_prebuilt_and_gives_the_jit_results(built, tmp_path):
    aot_out, log = run_ops(built["cards"], tmp_path / "aot.pt", KERNELKIT_PREBUILT_PATH=built["out"],
                           KERNELKIT_CACHE_DIR=tmp_path / "empty-cache")
    assert "sigmoid: using prebuilt" in log and "affine: using prebuilt" in log, log
    assert all(p.startswith(str(built["out"])) for p in aot_out.pop("paths"))
    assert "building" not in log, log  # nothing compiled
    jit_out, log = run_ops(built["cards"], tmp_path / "jit.pt")  # the test session's JIT cache
    assert "using prebuilt" not in log
    assert not any(p.startswith(str(built["out"])) for p in jit_out.pop("paths"))
    assert aot_out.keys() == jit_out.keys()
    for k in aot_out:
        assert torch.equal(aot_out[k], jit_out[k]), k  # bitwise: the same program, built two ways


def test_stale_prebuilt_is_detected_and_rebuilt_by_jit(built, tmp_path, monkeypatch, capfd):
    cards = tmp_path / "cards"
    shutil.copytree(built["cards"], cards)  # the prebuilt matches this copy until it is edited
    monkeypatch.setenv("KERNELKIT_PREBUILT_PATH", str(built["out"]))
    src = cards / "affine.cpp"
    # an edit no other test makes, so no build of it sits in this run's cache before this load
    src.write_text(src.read_text().replace("x[i] * SCALE + OFFSET", "x[i] * SCALE - OFFSET /* stale prebuilt */"))
    lib = kernelkit.load("affine", kernels_dir=cards)
    err = capfd.readouterr().err
    assert "affine: prebuilt does not match this build, using JIT" in err and "(other sources or flags)" in err, err
    assert not str(lib.path).startswith(str(built["out"]))
    torch.testing.assert_close(lib.affine(X), X * 2 - 1)  # the edit is live: the prebuilt was not used


def test_prebuilt_for_other_arch_is_not_used(built, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("KERNELKIT_PREBUILT_PATH", str(built["out"]))
    target = plan("sigmoid", built["cards"], arch="8.0")
    assert prebuilt.find_prebuilt(target) is None
    assert "needs sm_80" in capfd.readouterr().err
    assert prebuilt.find_prebuilt(plan("sigmoid", built["cards"])) is not None


READONLY_PROBE = """
import os, sys
ROOT = os.path.realpath(sys.argv[1])
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
EVENTS = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.utime", "os.chmod", "os.chown", "os.link",
          "os.symlink", "os.truncate", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.replace"}
bad = []

def under_root(p):
    try:
        return os.path.realpath(os.fsdecode(p)).startswith(ROOT)
    except TypeError:
        return False

def hook(event, args):
    if event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & WRITES and under_root(args[0]):
        bad.append((event, args[0]))
    elif event in EVENTS and any(under_root(a) for a in args if isinstance(a, (str, bytes, os.PathLike))):
        bad.append((event, args))

sys.addaudithook(hook)
import torch, kernelkit
lib = kernelkit.load("sigmoid", kernels_dir=sys.argv[2], arch=sys.argv[3])
assert str(lib.path).startswith(ROOT), lib.path
lib.sigmoid(torch.randn(10))
kernelkit.load("affine", kernels_dir=sys.argv[2]).affine(torch.randn(10))
print("WRITES:", bad)
sys.exit(1 if bad else 0)
"""


def test_prebuilt_dir_is_only_read(built, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in built["out"].rglob("*")}
    proc = subprocess.run([sys.executable, "-c", READONLY_PROBE, str(built["out"]), str(built["cards"]), ARCH],
                          capture_output=True, text=True, timeout=600,
                          env=env(KERNELKIT_PREBUILT_PATH=built["out"], KERNELKIT_CACHE_DIR=tmp_path / "c"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in built["out"].rglob("*")} == before


DEPLOYED_PROBE = """
import errno, os, sys
READ_ONLY = [os.path.realpath(p) for p in sys.argv[1:3]]  # the cache and the prebuilt folder
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
EVENTS = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.utime", "os.chmod", "os.link", "os.symlink",
          "os.truncate", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.replace"}

def read_only(p):
    try:
        return any(os.path.realpath(os.fsdecode(p)).startswith(r) for r in READ_ONLY)
    except TypeError:
        return False

def hook(event, args):  # a read-only file system, even for root
    if (event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & WRITES and read_only(args[0])) \\
            or (event in EVENTS and any(read_only(a) for a in args if isinstance(a, (str, bytes, os.PathLike)))):
        raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(args[0]))
    # torch 2.15's import asks ldconfig where libdl is (cuda.pathfinder): any other process is kernelkit's
    if event == "subprocess.Popen" and os.path.basename(os.fsdecode(args[0])) != "ldconfig":
        print("SPAWNED", args[1], file=sys.stderr)

sys.addaudithook(hook)
import torch, kernelkit
from kernelkit.jit import running
x = torch.randn(1000, device=sys.argv[7] if len(sys.argv) > 7 else "cpu")  # argv[7]: the device
expected = {"sigmoid": torch.sigmoid(x), "affine": 2 * x + 1}
for name in sys.argv[5].split(","):  # each from the folder named by argv[6]
    lib = kernelkit.load(name, kernels_dir=sys.argv[3], **({"arch": sys.argv[4]} if name == "sigmoid" else {}))
    torch.testing.assert_close(getattr(lib, name)(x), expected[name])
    assert str(lib.path).startswith(READ_ONLY[int(sys.argv[6])]), lib.path
print("COMPILES", running.STATS["compiles"])
"""


def _without_compilers(tmp_path: Path) -> dict:
    """An environment with no C++ compiler and no CUDA toolkit to be found (a deployment image)."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.exists(os.path.join(d, c)) for c in ("nvcc", "c++", "g++", "gcc", "cc"))]
    (tmp_path / "no-cuda").mkdir()
    e = env(PATH=os.pathsep.join(path + [os.path.dirname(sys.executable)]), CXX=tmp_path / "no-such-c++",
            CUDA_HOME=tmp_path / "no-cuda")
    for var in ("KERNELKIT_NVCC", "CUDA_PATH", "CPATH"):
        e.pop(var, None)
    return e


def test_prebuilt_loads_with_no_compiler_from_a_read_only_cache(built, tmp_path):
    """A deployment: no compiler, no CUDA toolkit, an empty cache on a read-only file system. The prebuilt
    libraries load and run; nothing is written, no process is spawned."""
    cache = tmp_path / "read-only-cache"
    cache.mkdir()
    e = _without_compilers(tmp_path)
    e.update(KERNELKIT_PREBUILT_PATH=str(built["out"]), KERNELKIT_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", DEPLOYED_PROBE, str(cache), str(built["out"]),
                           str(built["cards"]), ARCH, "sigmoid,affine", "1"],
                          capture_output=True, text=True, timeout=600, env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPILES 0" in proc.stdout and "SPAWNED" not in proc.stderr, proc.stdout + proc.stderr
    assert list(cache.iterdir()) == []


def test_a_warm_cache_on_a_read_only_file_system_loads(built, tmp_path):
    """A cache filled by JIT, then mounted read-only (a container image): loads read it, spawn nothing and
    write nothing. (Its keys name the compilers that built it, so it serves machines that have them.)"""
    cache = tmp_path / "cache"
    proc = run_python(f"""
        import kernelkit
        kernelkit.load("affine", kernels_dir={str(built["cards"])!r})
    """, env=env(KERNELKIT_CACHE_DIR=cache))
    assert proc.returncode == 0, proc.stderr
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*")}
    proc = subprocess.run([sys.executable, "-c", DEPLOYED_PROBE, str(cache), str(tmp_path / "no-prebuilt"),
                           str(built["cards"]), ARCH, "affine", "0"], capture_output=True, text=True, timeout=600,
                          env=env(KERNELKIT_CACHE_DIR=cache))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPILES 0" in proc.stdout and "SPAWNED" not in proc.stderr, proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == before


def test_a_build_without_a_compiler_says_which_is_missing(built, tmp_path):
    """Where a build is really needed (an edited card, no prebuilt for it), the error names the compiler."""
    cards = tmp_path / "cards"
    shutil.copytree(built["cards"], cards)
    src = cards / "affine.cpp"
    src.write_text(src.read_text().replace("x[i] * SCALE + OFFSET", "x[i] * SCALE + OFFSET /* edited */"))
    e = _without_compilers(tmp_path)
    e.update(KERNELKIT_PREBUILT_PATH=str(built["out"]), KERNELKIT_CACHE_DIR=str(tmp_path / "cache"))
    proc = run_python(f"""
        import kernelkit
        kernelkit.load("affine", kernels_dir={str(cards)!r})
    """, env=e)
    assert proc.returncode != 0
    assert "C++ compiler" in proc.stderr and "no-such-c++" in proc.stderr and "not found" in proc.stderr, proc.stderr


def test_corrupt_or_unsafe_prebuilt_is_never_loaded(built, tmp_path, monkeypatch, caplog):
    bad = tmp_path / "bad"
    shutil.copytree(built["out"], bad)
    monkeypatch.setenv("KERNELKIT_PREBUILT_PATH", str(bad))
    target = plan("affine", built["cards"])
    [entry] = bad.glob("affine-*")
    so = entry / "kk_affine.so"
    assert prebuilt.find_prebuilt(target) == so.resolve()
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    assert prebuilt.find_prebuilt(target) is None and "sha256" in caplog.text  # corrupt: JIT instead
    shutil.copy(built["out"] / entry.name / "kk_affine.so", so)
    os.chmod(so, 0o777)  # unsafe: skipped with one warning naming it and the fix, and JIT takes over
    monkeypatch.setattr(prebuilt, "_WARNED", set())
    caplog.clear()
    assert prebuilt.find_prebuilt(target) is None and prebuilt.find_prebuilt(target) is None
    [warning] = [r.getMessage() for r in caplog.records]
    assert str(entry) in warning and "writable by group or others" in warning and "chmod go-w" in warning
    os.chmod(so, 0o755)
    so.unlink()
    so.symlink_to(built["out"] / entry.name / "kk_affine.so")
    monkeypatch.setattr(prebuilt, "_WARNED", set())
    caplog.clear()
    assert prebuilt.find_prebuilt(target) is None
    assert "symbolic link" in caplog.text and "building with JIT" in caplog.text


def _wheel(built, tmp_path: Path, ops: str) -> Path:
    """KERNELKIT_AOT=1 pip wheel of ``ops``, reusing the fixture's objects (only linking is new)."""
    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        capture_output=True, text=True, timeout=1200,
        env=env(KERNELKIT_AOT=1, KERNELKIT_AOT_OPS=ops, KERNELKIT_AOT_KERNELS_DIR=built["cards"],
                KERNELKIT_AOT_BUILD_DIR=built["root"] / "build"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [whl] = wheels.glob("kernelkit-*.whl")
    return whl


@pytest.mark.slow
def test_opt_in_wheel_contains_prebuilt_libraries(built, tmp_path):
    """KERNELKIT_AOT=1 pip wheel (affine only)."""
    t0 = time.perf_counter()
    whl = _wheel(built, tmp_path, "affine")
    import zipfile

    names = zipfile.ZipFile(whl).namelist()
    assert {"kernelkit/include/kernelkit/binding.h", "kernelkit/include/kernelkit/elementwise.cuh", "kernelkit/csrc/fastcall.cpp"} <= set(names)
    libs = [n for n in names if n.startswith("kernelkit/prebuilt/affine-") and n.endswith("kk_affine.so")]
    assert len(libs) == 1 and libs[0].replace("kk_affine.so", "manifest.json") in names, names
    manifest = json.loads(zipfile.ZipFile(whl).read(libs[0].replace("kk_affine.so", "manifest.json")))
    assert manifest["source_key"] == prebuilt.source_key(plan("affine", built["cards"]))
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(whl).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist: torch")]
    assert requires == [f"Requires-Dist: torch=={torch.__version__.split('+')[0]}"], requires
    print(f"wheel (affine, objects reused): {time.perf_counter() - t0:.1f} s")
    _installed_wheel_runs_without_compilers(whl, built, tmp_path)


def _installed_wheel_runs_without_compilers(whl: Path, built, tmp_path: Path, op: str = "affine",
                                            device: str = "cpu") -> None:
    """The wheel installed on its own (no source tree, no editable install in the way), in a process with no
    C++ compiler, no CUDA toolkit and an empty read-only cache: the card runs from the wheel's prebuilt
    library, with no compiler process and nothing written."""
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target",
                           str(site), str(whl)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cache = tmp_path / "deployed-cache"
    cache.mkdir()
    e = _without_compilers(tmp_path)
    e.update(PYTHONPATH=os.pathsep.join([str(site), e["PYTHONPATH"]]), KERNELKIT_CACHE_DIR=str(cache))
    e.pop("KERNELKIT_PREBUILT_PATH", None)
    where = subprocess.run([sys.executable, "-c", "import kernelkit; print(kernelkit.__file__)"], capture_output=True,
                           text=True, env=e, timeout=300)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    proc = subprocess.run([sys.executable, "-c", DEPLOYED_PROBE, str(cache), str(site / "kernelkit" / "prebuilt"),
                           str(built["cards"]), ARCH, op, "1", device], capture_output=True, text=True, timeout=600,
                          env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPILES 0" in proc.stdout and "SPAWNED" not in proc.stderr, proc.stdout + proc.stderr
    assert list(cache.iterdir()) == []


def run_ctest(built, tmp_path, select, expect: str) -> None:
    """Configure and build examples/cpp against the fixture's prebuilt sigmoid, then run ctest."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    build = tmp_path / "cpp"
    prefix = torch.utils.cmake_prefix_path
    for cmd in (["cmake", "-S", str(REPO / "examples" / "cpp"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
                 f"-DKERNELKIT_PREBUILT_DIR={built['out']}", "-DCMAKE_BUILD_TYPE=Release", "-DKERNELKIT_CARDS=sigmoid"],
                ["cmake", "--build", str(build)],
                ["ctest", "--test-dir", str(build), *select, "--output-on-failure"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expect in proc.stdout, proc.stdout


def test_cpp_consumer_without_prebuilt_libraries_stops_at_configure(tmp_path):
    """ctest finding no test exits 0: configuring with nothing to test is the error instead."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    for extra in ([], [f"-DKERNELKIT_PREBUILT_DIR={tmp_path / 'missing'}"]):
        proc = subprocess.run(["cmake", "-S", str(REPO / "examples" / "cpp"), "-B", str(tmp_path / "b"), *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and "KERNELKIT_PREBUILT_DIR: expected a kernelkit prebuilt directory" in \
            proc.stderr and "python -m kernelkit.aot --out" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.slow
def test_cpp_consumer_builds_and_passes_ctest(built, tmp_path):
    run_ctest(built, tmp_path, ["-LE", "gpu"], "cpu_sigmoid")


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_the_wheels_cuda_card_runs_on_the_gpu_with_no_compiler(built, tmp_path):
    """The deployment the wheel is for: installed on its own, no C++ compiler, no CUDA toolkit, an empty
    read-only cache; its sigmoid, built for this GPU's arch, runs on the GPU with no compile."""
    _installed_wheel_runs_without_compilers(_wheel(built, tmp_path, "sigmoid"), built, tmp_path, "sigmoid", "cuda")


@pytest.mark.gpu
def test_prebuilt_cuda_op_matches_torch_and_jit(built, tmp_path):
    code = f"""
        import torch, kernelkit
        lib = kernelkit.load("sigmoid", kernels_dir={str(built['cards'])!r})
        assert str(lib.path).startswith({str(built['out'])!r}), lib.path
        x = torch.randn(1 << 20, device="cuda") * 4
        torch.testing.assert_close(lib.sigmoid(x), torch.sigmoid(x))
        torch.save(lib.sigmoid(torch.linspace(-9, 9, 4097, device="cuda")).cpu(), {str(tmp_path / 'aot.pt')!r})
    """
    proc = run_python(code, env=env(KERNELKIT_PREBUILT_PATH=built["out"], KERNELKIT_CACHE_DIR=tmp_path / "c"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jit = kernelkit.load("sigmoid", kernels_dir=built["cards"])
    assert not str(jit.path).startswith(str(built["out"]))
    assert torch.equal(jit.sigmoid(torch.linspace(-9, 9, 4097, device="cuda")).cpu(), torch.load(tmp_path / "aot.pt"))


@pytest.mark.gpu
@pytest.mark.slow
def test_cpp_consumer_cuda_ops(built, tmp_path):
    run_ctest(built, tmp_path, ["-L", "gpu"], "cuda_sigmoid")
