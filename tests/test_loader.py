"""Loader core: content-addressed builds, hot reload, caching across processes, corruption, locking,
errors and cache safety. CPU only (a CUDA card is compiled and linked but not run)."""
import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
import torch
from loader_cards import run_python, write_affine, write_square

import kernelkit
from kernelkit.jit import cache
from kernelkit.jit.cache import files as cache_files

sys.path.insert(0, str(Path(__file__).parent))

X = torch.tensor([0.0, 1.0, -2.5, 3.0])


def affine_ref(x, scale=2.0, offset=1.0):
    return x * scale + offset


@pytest.fixture
def card_dir(tmp_path):
    return write_affine(tmp_path / "cards")


def fresh_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def test_load_runs_and_unchanged_load_is_instant(card_dir):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    torch.testing.assert_close(lib.affine(X), affine_ref(X))
    assert lib.ns.startswith("kk_affine_") and lib.key[:12] in lib.ns
    before = dict(kernelkit.STATS)
    t0 = time.perf_counter()
    again = kernelkit.load("affine", kernels_dir=card_dir)
    assert again is lib
    assert kernelkit.STATS == before  # no compiler or linker spawned
    assert time.perf_counter() - t0 < 0.5


def test_hot_reload_after_source_edit(card_dir):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    src = card_dir / "affine.cpp"
    src.write_text(src.read_text().replace("x[i] * SCALE + OFFSET", "x[i] * SCALE - OFFSET"))
    new = kernelkit.load("affine", kernels_dir=card_dir)
    assert new is not lib and new.ns != lib.ns and new.key != lib.key
    torch.testing.assert_close(new.affine(X), X * 2 - 1)
    torch.testing.assert_close(lib.affine(X), affine_ref(X))  # the old build keeps working
    assert kernelkit.library("affine") is new


def test_hot_reload_after_header_edit(card_dir):
    kernelkit.load("affine", kernels_dir=card_dir)
    consts = card_dir / "affine_consts.h"  # included by the header, not named by the card
    consts.write_text(consts.read_text().replace("#define SCALE 2.0f", "#define SCALE 3.0f"))
    new = kernelkit.load("affine", kernels_dir=card_dir)
    torch.testing.assert_close(new.affine(X), affine_ref(X, scale=3.0))


def test_multi_source_card_builds_and_its_second_file_is_no_card(card_dir):
    # the loop moves to a second translation unit that the card's spec names
    (card_dir / "affine_loop.cpp").write_text(
        "#include \"affine_consts.h\"\n"
        "void affine_loop(const float* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = x[i] * SCALE + OFFSET; }\n")
    (card_dir / "affine.cpp").write_text(
        '#include "affine.h"\nvoid affine_loop(const float* x, float* y, long n);\n'
        "void affine_cpu(const float* x, float* y, long n) { affine_loop(x, y, n); }\n")
    (card_dir / "affine.py").write_text(
        "import kernelkit\n"
        "SPEC = kernelkit.Spec(name='affine', reference=lambda x: x * 2 + 1, make_inputs=None,\n"
        "                      sources=['affine.cpp', 'affine_loop.cpp'])\n")
    write_square(card_dir)  # a plain one-file card beside it stays a card
    (card_dir / "broken.cpp").write_text("// its spec fails to import: listed, and fails when it is loaded\n")
    (card_dir / "broken.py").write_text("raise RuntimeError('broken spec')\n")
    assert sorted(kernelkit.cards(card_dir)) == ["affine", "broken", "square"]
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    torch.testing.assert_close(lib.affine(X), affine_ref(X))
    loop = card_dir / "affine_loop.cpp"  # an edit of the second file reloads the card
    loop.write_text(loop.read_text().replace("+ OFFSET", "- OFFSET"))
    torch.testing.assert_close(kernelkit.load("affine", kernels_dir=card_dir).affine(X), X * 2 - 1)


def test_unwritable_cache_fails_a_build_clearly_and_poisons_nothing(card_dir, monkeypatch):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    src = card_dir / "affine.cpp"
    # an edit no other test makes, so the build is not already in the session's cache
    src.write_text(src.read_text().replace("x[i] * SCALE + OFFSET", "x[i] * SCALE + OFFSET + 0.25f"))

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache_files.tempfile, "mkdtemp", denied)  # as in a read-only cache directory
    with pytest.raises(kernelkit.CacheUnwritable, match=r"tmp: Permission denied.*KERNELKIT_CACHE_DIR"):
        kernelkit.load("affine", kernels_dir=card_dir)
    torch.testing.assert_close(lib.affine(X), affine_ref(X))  # the loaded build still runs
    monkeypatch.undo()
    torch.testing.assert_close(kernelkit.load("affine", kernels_dir=card_dir).affine(X), X * 2 + 1.25)


def test_refresh_reloads_edited_cards(card_dir):
    kernelkit.load("affine", kernels_dir=card_dir)
    kernelkit.refresh()  # rebuilds now what other tests of this worker left edited or set otherwise
    src = card_dir / "affine.cpp"
    src.write_text(src.read_text().replace("+ OFFSET", "+ 2 * OFFSET"))
    assert "affine" in kernelkit.refresh()
    torch.testing.assert_close(kernelkit.library("affine").affine(X), affine_ref(X, offset=2.0))
    assert kernelkit.refresh() == []


def test_refresh_skips_a_card_whose_files_are_gone_and_reloads_the_rest(card_dir, caplog):
    kernelkit.load("affine", kernels_dir=card_dir)
    (card_dir / "plain.cpp").write_text('extern "C" int plain() { return 1; }\n')  # no header: no binding to build
    kernelkit.load("plain", kernels_dir=card_dir)
    kernelkit.refresh()  # rebuilds now what other tests of this worker left edited or set otherwise
    (card_dir / "plain.cpp").unlink()
    src = card_dir / "affine.cpp"
    src.write_text(src.read_text().replace("+ OFFSET", "+ 3 * OFFSET"))
    assert kernelkit.refresh() == ["affine"]
    torch.testing.assert_close(kernelkit.library("affine").affine(X), affine_ref(X, offset=3.0))
    notes = [r.getMessage() for r in caplog.records if "plain" in r.getMessage()]
    assert len(notes) == 1 and "skipping plain" in notes[0] and str(card_dir / "plain.cu") in notes[0]
    assert kernelkit.refresh() == [] and len([r for r in caplog.records if "plain" in r.getMessage()]) == 1


def test_fresh_process_cache_hit_spawns_no_compiler(card_dir):
    kernelkit.load("affine", kernels_dir=card_dir)
    out = run_python(f"""
        import subprocess, time, torch, kernelkit
        def refuse(*a, **k):
            raise AssertionError("a compiler was spawned: " + repr(a[:1]))
        subprocess.Popen = refuse
        t0 = time.perf_counter()
        lib = kernelkit.load("affine", kernels_dir={str(card_dir)!r})
        dt = time.perf_counter() - t0
        assert lib.cached, "expected a cache hit"
        assert kernelkit.STATS["compiles"] == 0 and kernelkit.STATS["links"] == 0, kernelkit.STATS
        print(lib.affine(torch.tensor([1.0, 2.0])).tolist(), dt)
    """, env=fresh_env())
    assert out.returncode == 0, out.stderr
    values, dt = out.stdout.split("]")
    assert values == "[3.0, 5.0"
    assert float(dt) < 1.0


def _entry(name, lib):
    return cache.library_dir(name, lib.key)


def test_corrupt_cached_library_is_rebuilt(card_dir):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    so = _entry("affine", lib) / lib.path.name
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    # a new inode: writing in place would also corrupt the copy this process has mapped
    tmp = so.with_suffix(".tmp")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, so)
    out = run_python(f"""
        import torch, kernelkit
        lib = kernelkit.load("affine", kernels_dir={str(card_dir)!r})
        assert not lib.cached and kernelkit.STATS["links"] == 1, kernelkit.STATS
        print(lib.affine(torch.tensor([1.0])).item())
    """, env=fresh_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3.0"
    assert "corrupt" in out.stderr


def test_corrupt_cached_object_is_rebuilt(card_dir):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    manifest = json.loads((_entry("affine", lib) / "manifest.json").read_text())
    device_unit = next(u for u in manifest["units"] if u["file"].endswith("affine.cpp"))
    obj = cache.object_path(device_unit["key"])
    obj.write_bytes(b"garbage")
    assert cache.cached_object(device_unit["key"]) is None  # detected by its checksum, and dropped
    assert not obj.exists()


def test_syntax_error_names_file_and_line_and_does_not_poison(card_dir):
    src = card_dir / "affine.cpp"
    good = src.read_text()
    src.write_text(good.replace("y[i] = x[i] * SCALE + OFFSET;", "y[i] = x[i] * SCALE + OFFSTE;"))
    entries_before = {e["entry"] for e in cache.entries()}
    with pytest.raises(kernelkit.BuildError) as info:
        kernelkit.load("affine", kernels_dir=card_dir)
    msg = str(info.value)
    assert "affine.cpp:3:" in msg and "OFFSTE" in msg and "error" in msg
    assert "y[i] = x[i] * SCALE + OFFSTE;" in msg  # the offending line, quoted
    assert "not declared" in info.value.log and info.value.command
    assert {e["entry"] for e in cache.entries()} == entries_before  # nothing half-built left behind
    with pytest.raises(kernelkit.BuildError):  # an identical failing call is tried again, not cached
        kernelkit.load("affine", kernels_dir=card_dir)
    src.write_text(good)
    torch.testing.assert_close(kernelkit.load("affine", kernels_dir=card_dir).affine(X), affine_ref(X))


def test_load_inline_error_maps_to_string_lines():
    cpp_ok = "at::Tensor plus_one(const at::Tensor& x) { return x + 1; }\n" \
             "KERNELKIT_LIBRARY(m) { m.def(\"plus_one(Tensor x) -> Tensor\");\n" \
             "  m.impl(\"plus_one\", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(plus_one))); }\n"
    lib = kernelkit.load_inline("plus_one", cpp=cpp_ok)
    torch.testing.assert_close(lib.plus_one(X), X + 1)
    bad = "// line 1\nat::Tensor plus_one(const at::Tensor& x) { return x + ; }\n"
    with pytest.raises(kernelkit.BuildError) as info:
        kernelkit.load_inline("plus_one", cpp=bad)
    assert "plus_one.cpp:2:" in str(info.value)
    assert "return x + ;" in str(info.value)


@pytest.mark.cuda_build
def test_load_inline_cuda_error_maps_to_cell_line():
    cuda = "#include <cuda_runtime.h>\n__global__ void k(float* y) {\n  y[0] = nope;\n}\n"
    with pytest.raises(kernelkit.BuildError) as info:
        kernelkit.load_inline("cellerr", cuda=cuda, arch="9.0")
    msg = str(info.value)
    assert "cellerr.cu:3" in msg and '"nope" is undefined' in msg and "y[0] = nope;" in msg


def test_load_inline_functions_pybind():
    lib = kernelkit.load_inline("pyfuncs", cpp="int add_ints(int a, int b) { return a + b; }",
                                functions=["add_ints"])
    assert lib.add_ints(2, 40) == 42


@pytest.mark.parametrize("bad, exc, words", [
    (dict(name="not a name", cpp="int x;"), ValueError, "name"),
    (dict(name="ok"), TypeError, "source"),  # torch's load_inline: cpp_sources is a required argument
    (dict(name="ok", cpp=b"int x;"), TypeError, "cpp"),
    (dict(name="ok", cpp="int x;", extra_cflags="-O0"), TypeError, "extra_cflags"),
    (dict(name="ok", cpp="int f();", functions=["not-ident"]), ValueError, "functions"),
])
def test_load_inline_bad_arguments(bad, exc, words):
    with pytest.raises(exc, match=words):
        kernelkit.load_inline(**bad)


def test_unknown_card_error(tmp_path):
    with pytest.raises(kernelkit.KernelkitError, match="no card named 'missing'"):
        kernelkit.load("missing", kernels_dir=tmp_path)


def _load_in_fresh_process_is_refused(card_dir, expected: str) -> None:
    out = run_python(f"""
        import kernelkit
        try:
            kernelkit.load("affine", kernels_dir={str(card_dir)!r})
        except kernelkit.CacheSecurityError as e:
            print("refused:", e)
    """, env=fresh_env())
    assert "refused:" in out.stdout and expected in out.stdout, out.stdout + out.stderr


def test_world_writable_entry_is_refused(card_dir):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    so = _entry("affine", lib) / lib.path.name
    os.chmod(so, 0o777)
    try:
        _load_in_fresh_process_is_refused(card_dir, "writable by group or others")
    finally:
        os.chmod(so, 0o700)


@pytest.mark.skipif(os.getuid() != 0, reason="changing a file's owner needs root")
def test_foreign_owned_entry_is_refused(card_dir):
    lib = kernelkit.load("affine", kernels_dir=card_dir)
    so = _entry("affine", lib) / lib.path.name
    os.chown(so, 12345, 12345)
    try:
        _load_in_fresh_process_is_refused(card_dir, "owned by uid 12345")
    finally:
        os.chown(so, 0, 0)


def test_cache_dir_is_private():
    mode = stat.S_IMODE(os.stat(cache.cache_dir()).st_mode)
    assert mode & 0o077 == 0


LOAD_AND_REPORT = """
    import json, sys, torch, kernelkit
    lib = kernelkit.load("affine", kernels_dir=sys.argv[1] if len(sys.argv) > 1 else {dir!r})
    print(json.dumps({{"cached": lib.cached, "compiles": kernelkit.STATS["compiles"],
                      "value": lib.affine(torch.tensor([1.0])).item()}}))
"""


def test_concurrent_processes_compile_once(card_dir):
    src = card_dir / "affine.cpp"  # a body no other test has built, so the first load must compile
    src.write_text(src.read_text().replace("+ OFFSET", "+ 4 * OFFSET"))
    import subprocess

    code = LOAD_AND_REPORT.format(dir=str(card_dir))
    import textwrap

    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=fresh_env()) for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["value"] == 6.0 for r in results)
    assert sum(not r["cached"] for r in results) == 1, results  # exactly one process built it
    assert sum(r["compiles"] > 0 for r in results) == 1, results  # the others compiled nothing


def test_sigkill_mid_build_does_not_block(card_dir, tmp_path):
    src = card_dir / "affine.cpp"
    src.write_text(src.read_text().replace("+ OFFSET", "+ 5 * OFFSET"))
    marker = tmp_path / "compiling"
    slow = tmp_path / "slow-launcher.sh"
    slow.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 60\nexec \"$@\"\n")
    slow.chmod(0o755)
    import subprocess
    import textwrap

    code = LOAD_AND_REPORT.format(dir=str(card_dir))
    victim = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=fresh_env(KERNELKIT_COMPILER_LAUNCHER=str(slow)))
    deadline = time.time() + 120
    while not marker.exists():
        assert victim.poll() is None, victim.communicate()
        assert time.time() < deadline, "the build never started"
        time.sleep(0.1)
    victim.send_signal(signal.SIGKILL)  # mid-build, holding the lock
    victim.wait()
    t0 = time.time()
    out = run_python(code, env=fresh_env(KERNELKIT_LOCK_TIMEOUT="60"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["value"] == 7.0
    assert time.time() - t0 < 60
    for e in cache.entries():  # no half entry: every library dir is complete
        assert (Path(e["path"]) / "manifest.json").is_file()


@pytest.mark.cuda_build
def test_cuda_card_compiles_and_links_with_explicit_arch(tmp_path):
    d = write_square(tmp_path / "cuda_cards")
    info = kernelkit.load("square", kernels_dir=d, arch="8.0;9.0", load=False)
    assert info.path.is_file() and info.path.suffix == ".so"
    manifest = json.loads((info.path.parent / "manifest.json").read_text())
    assert any(u["file"].endswith("square.cu") for u in manifest["units"])
    again = kernelkit.load("square", kernels_dir=d, arch="sm_80 sm_90", load=False)
    assert again.key == info.key and again.cached  # same arch list, spelled differently


@pytest.mark.gpu
def test_cuda_card_runs_on_gpu(tmp_path):
    d = write_square(tmp_path / "cuda_cards")
    lib = kernelkit.load("square", kernels_dir=d)
    x = torch.randn(1_000_003, device="cuda")
    torch.testing.assert_close(lib.square(x), x * x)
    with pytest.raises(RuntimeError, match="CPU"):  # no CPU kernel registered: the dispatcher says so
        lib.square(x.cpu())
    src = d / "square.cu"
    src.write_text(src.read_text().replace("y[i] = x[i] * x[i];", "y[i] = x[i] * x[i] * x[i];"))
    t0 = time.perf_counter()
    new = kernelkit.load("square", kernels_dir=d)
    print(f"edit -> reload {time.perf_counter() - t0:.2f} s")
    torch.testing.assert_close(new.square(x), x * x * x)


SIZES_CHECK_H = """\
#pragma once
#ifdef KERNELKIT_BINDING
at::Tensor rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "rows: x must be 2-D, got shape ", x.sizes(), " (", x.dim(), " dims)");
  return x.sum(1);
}
KERNELKIT_LIBRARY(m) {
  m.def("rows(Tensor x) -> Tensor");
  m.impl("rows", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(rows)));
}
#endif
"""


def test_compiler_with_static_libstdcxx_still_raises_cleanly(tmp_path):
    """A compiler whose libstdc++ is a static archive (a GPU host's relocated gcc is one) must not embed a
    second libstdc++ in the library: formatting numbers in an error message would then crash."""
    from kernelkit.jit import toolchain

    d = tmp_path / "cards"
    d.mkdir()
    (d / "rows.cpp").write_text('#include "rows.h"\n')
    (d / "rows.h").write_text(SIZES_CHECK_H)
    wrapper = tmp_path / "g++-static-libstdcxx"
    wrapper.write_text(f'#!/bin/sh\nexec {toolchain.cxx()} -static-libstdc++ "$@"\n')
    wrapper.chmod(0o755)
    out = run_python(f"""
        import torch, kernelkit
        lib = kernelkit.load("rows", kernels_dir={str(d)!r})
        assert lib.rows(torch.ones(2, 3)).tolist() == [3.0, 3.0]
        try:
            lib.rows(torch.ones(2, 3, 4))
        except RuntimeError as e:
            print("raised:", str(e).splitlines()[0])
    """, env=fresh_env(CXX=str(wrapper)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "raised: rows: x must be 2-D, got shape [2, 3, 4] (3 dims)" in out.stdout


@pytest.mark.fast_path("pch")
def test_precompiled_binding_header_is_built_once_then_used(tmp_path):
    """The first cold build starts a PCH of <kernelkit/binding.h> in the background; once it exists, a
    new card's binding TU uses it (and gcc accepts it), and the op is still right."""
    from kernelkit.jit import build

    if not build.toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    env = fresh_env(KERNELKIT_PCH="1", KERNELKIT_CACHE_DIR=str(tmp_path / "cache"))
    first = write_affine(tmp_path / "a")
    out = run_python(f"""
        import torch, kernelkit
        lib = kernelkit.load("affine", kernels_dir={str(first)!r})
        print(kernelkit.STATS["pch_builds"], kernelkit.STATS["pch_used"])
    """, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["1", "0"]  # started in the background, not waited for
    gch = list((tmp_path / "cache" / "v1" / "pch").glob("*/kernelkit/binding.h.gch"))
    deadline = time.time() + 300
    while not gch and time.time() < deadline:
        time.sleep(1)
        gch = list((tmp_path / "cache" / "v1" / "pch").glob("*/kernelkit/binding.h.gch"))
    assert gch, "the background PCH build never finished"
    second = tmp_path / "b"
    second.mkdir()
    (second / "rows.cpp").write_text('#include "rows.h"\n')
    (second / "rows.h").write_text(SIZES_CHECK_H)
    out = run_python(f"""
        import torch, kernelkit
        lib = kernelkit.load("rows", kernels_dir={str(second)!r})
        assert lib.rows(torch.ones(2, 3)).tolist() == [3.0, 3.0]
        print(kernelkit.STATS["pch_used"], kernelkit.STATS["pch_rejected"])
    """, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["1", "0"]
