"""Pieces of the loader that need no compiler: arch lists, diagnostics parsing, include scanning,
cache gc and the cache CLI."""
import concurrent.futures
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import kernelkit
from kernelkit import replace_file
from kernelkit.diagnostics import parse_diagnostics
from kernelkit.errors import BuildError
from kernelkit.frontends import cli
from kernelkit.jit import cache, toolchain
from kernelkit.jit.cache import collect, generated
from kernelkit.jit.sources import digest_tree, scan_includes


@pytest.mark.parametrize("spec, expected", [
    ("9.0", ["9.0"]),
    ("8.0;9.0+PTX", ["8.0", "9.0+PTX"]),
    ("8.0 8.0, 9.0", ["8.0", "9.0"]),
    (["sm_90a"], ["9.0a"]),
    ("sm_80 compute_86", ["8.0", "8.6"]),
])
def test_parse_arch_list(spec, expected):
    assert toolchain.parse_arch_list(spec) == expected


@pytest.mark.parametrize("bad", ["ninety", "9", "", "sm_9x"])
def test_parse_arch_list_rejects(bad):
    with pytest.raises(ValueError, match="arch"):
        toolchain.parse_arch_list(bad)


def test_arch_precedence(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5")
    monkeypatch.setenv("KERNELKIT_ARCH", "8.6")
    assert toolchain.arch_list("9.0") == ["9.0"]
    assert toolchain.arch_list() == ["8.6"]
    monkeypatch.delenv("KERNELKIT_ARCH")
    assert toolchain.arch_list() == ["7.5"]


def test_arch_list_without_a_gpu_falls_back_to_its_argument(monkeypatch):
    for var in ("KERNELKIT_ARCH", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(toolchain.torch.cuda, "is_available", lambda: False)
    assert toolchain.arch_list() == ["9.0"]
    assert toolchain.arch_list(no_gpu=("8.0", "9.0+PTX")) == ["8.0", "9.0+PTX"]
    assert toolchain.arch_list(no_gpu=()) == []
    assert toolchain.arch_list("8.6", no_gpu=()) == ["8.6"]


def test_the_libstdcxx_linked_is_the_one_the_process_has_mapped():
    """Asked of the dynamic loader rather than read from /proc/self/maps: both must name the same file."""
    with open("/proc/self/maps") as f:
        mapped = {os.path.realpath(line.split()[-1]) for line in f if "/libstdc++.so" in line}
    found = toolchain._loaded_library("libstdc++.so.6")
    assert found in mapped and toolchain.runtime_libstdcxx() in mapped
    assert toolchain._loaded_library("libkernelkit_never_loaded.so.1") is None


def test_gencode_flags():
    assert toolchain.gencode_flags(["9.0+PTX"]) == ["-gencode", "arch=compute_90,code=sm_90",
                                                    "-gencode", "arch=compute_90,code=compute_90"]
    assert toolchain.gencode_flags(["9.0a"]) == ["-gencode", "arch=compute_90a,code=sm_90a"]


def test_cxx_standard_follows_torchs_headers(tmp_path):
    def include_dir(name, guard):
        d = tmp_path / name / "ATen"
        d.mkdir(parents=True)
        (d / "ATen.h").write_text(f"#pragma once\n#if __cplusplus < 202002L\n#error {guard}\n#endif\n")
        return str(d.parent)

    new = include_dir("new", "C++20 or later compatible compiler is required to use ATen.")
    old = include_dir("old", "C++17 or later compatible compiler is required to use ATen.")
    assert toolchain._torch_cxx_standard([str(tmp_path / "none"), new]) == "c++20"
    assert toolchain._torch_cxx_standard([old]) == "c++17"
    assert toolchain._torch_cxx_standard([str(tmp_path / "none")]) == "c++17"  # no ATen.h: the old default
    # this torch: the flag every unit gets is the one its headers ask for
    aten = next(Path(d) / "ATen" / "ATen.h" for d in toolchain.torch_include_paths(False)
                if (Path(d) / "ATen" / "ATen.h").is_file())
    want = "c++20" if "C++20 or later" in aten.read_text() else "c++17"
    assert toolchain.cxx_standard_flag() == f"-std={want}"


def test_parse_gcc_and_nvcc_diagnostics():
    log = "\n".join([
        "/abs/k.cu(12): error: identifier \"foo\" is undefined",
        "/abs/k.cu(12): error: identifier \"foo\" is undefined",  # nvcc repeats per pass: shown once
        "/abs/b.cpp:3:7: error: expected ';' before '}' token",
        "/abs/b.cpp:2:1: note: in expansion of macro",
        "/abs/k.cu(4): warning #177-D: variable \"v\" was declared but never referenced",
        "/abs/k.cu(9): error #20: identifier \"bar\" is undefined",
    ])
    texts = {"k.cu": [f"line {i}" for i in range(1, 20)]}
    diags = parse_diagnostics(log, {"/abs/k.cu": "k.cu", "/abs/b.cpp": "b.cpp"}, texts)
    assert [(d.file, d.line, d.severity) for d in diags] == [
        ("k.cu", 12, "error"), ("b.cpp", 3, "error"), ("k.cu", 4, "warning"), ("k.cu", 9, "error")]
    assert diags[0].source_line == "line 12"
    err = BuildError("compiling k.cu", diags, log, ["nvcc"])
    text = str(err)
    assert "k.cu:12: error: identifier \"foo\" is undefined" in text and "| line 12" in text
    assert "warning" not in text  # only errors are shown; the log keeps the rest
    assert err.log == log and "<pre" in err._repr_html_()


def test_unparseable_failure_shows_log_tail():
    err = BuildError("linking x", [], "some output\n/usr/bin/ld: cannot find -lnope\ncollect2: error: ld returned 1")
    assert "cannot find -lnope" in str(err)


def test_scan_includes_transitive_and_torch(tmp_path):
    (tmp_path / "a.h").write_text('#include "sub/b.h"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.h").write_text('#include <c.h>\n#include <torch/extension.h>\n')
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "c.h").write_text("// c\n")
    deps, torch_used = scan_includes('#include "a.h"\n#include <vector>\n', tmp_path, [inc])
    assert sorted(p.name for p in deps) == ["a.h", "b.h", "c.h"]
    assert torch_used
    before = digest_tree(b"x", deps)
    (inc / "c.h").write_text("// changed\n")
    assert digest_tree(b"x", deps) != before  # a header two levels down changes the key


def test_scan_includes_quote_dirs_and_forced_includes(tmp_path):
    """-iquote dirs serve "..." includes only; a forced include is hashed with what it includes."""
    for d in ("q", "f"):
        (tmp_path / d).mkdir()
    (tmp_path / "q" / "q.h").write_text("// q\n")
    (tmp_path / "f" / "forced.h").write_text('#include "inner.h"\n')
    (tmp_path / "f" / "inner.h").write_text("// inner\n")
    deps, _ = scan_includes('#include "q.h"\n#include <q.h>\n', tmp_path, [], quote_dirs=[tmp_path / "q"],
                            forced=[tmp_path / "f" / "forced.h"])
    assert sorted(p.name for p in deps) == ["forced.h", "inner.h", "q.h"]
    deps, _ = scan_includes("#include <q.h>\n", tmp_path, [], quote_dirs=[tmp_path / "q"])
    assert deps == []


def test_gc_removes_old_entries_and_stale_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    entry = cache.subdir("lib") / "old-0123456789abcdef"
    entry.mkdir()
    (entry / "manifest.json").write_text(json.dumps({"name": "old", "key": "0123456789abcdef", "so": "x.so"}))
    fresh = cache.subdir("lib") / "new-fedcba9876543210"
    fresh.mkdir()
    (fresh / "manifest.json").write_text(json.dumps({"name": "new", "key": "fedcba9876543210", "so": "x.so"}))
    stale = cache.subdir("tmp") / "lib-dead-build"
    stale.mkdir()
    # half-written files of killed writers inside an entry still in use: the old one goes, a young one may be live
    killed, live = fresh / ".manifest.json.k1ll3d.tmp", fresh / ".manifest.json.wr1t1n.tmp"
    killed.write_text("{")
    live.write_text("{")
    long_ago = time.time() - 90 * 86400
    two_hours_ago = time.time() - 2 * 3600
    os.utime(entry / "manifest.json", (long_ago, long_ago))
    os.utime(stale, (long_ago, long_ago))
    os.utime(killed, (two_hours_ago, two_hours_ago))
    removed = cache.gc(max_age_days=30)
    assert removed["libraries"] == 1 and removed["tmp"] == 2
    assert not entry.exists() and fresh.exists() and not stale.exists()
    assert not killed.exists() and live.exists() and (fresh / "manifest.json").exists()


def _aged(path, hours_ago, size=0):
    """A file of ``size`` bytes (its folders made) last used ``hours_ago``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = time.time() - hours_ago * 3600
    os.utime(path, (stamp, stamp))
    return path


def _fake_entries():
    """A library, an object, a precompiled header, a source dir and a record, each 1 MB, oldest first (in hours),
    and two of them fresh: (path, kind) in the order the cap must take them."""
    mb = 1 << 20
    lib = cache.subdir("lib") / "old-0123456789abcdef"
    _aged(lib / "x.so", 50, mb)
    _aged(lib / "manifest.json", 50)
    pch = cache.subdir("pch") / "k1"
    _aged(pch / "kernelkit" / "binding.h.gch", 40, mb)
    _aged(pch / "pch.json", 40)
    obj = _aged(cache.object_path("a" * 64), 30, mb)
    _aged(obj.with_suffix(".json"), 30)
    src = cache.subdir("src") / "s1"
    _aged(src / "main.cpp", 20, mb)
    os.utime(src, (time.time() - 20 * 3600,) * 2)
    record = _aged(cache.cache_dir() / "records" / "split" / "r1.json", 10, mb)
    fresh_obj = _aged(cache.object_path("b" * 64), 0, mb)  # used just now: maybe in a build's hands
    _aged(fresh_obj.with_suffix(".json"), 0)
    fresh_lib = cache.subdir("lib") / "new-fedcba9876543210"
    _aged(fresh_lib / "y.so", 0, mb)
    _aged(fresh_lib / "manifest.json", 0)
    return [(lib, "libraries"), (pch, "precompiled headers"), (obj, "objects"), (src, "sources"),
            (record, "records")], [fresh_obj, fresh_lib]


def test_the_size_cap_removes_the_least_recently_used_entries_of_every_kind_first(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    old, fresh = _fake_entries()
    info = cache.info()
    assert set(info["kinds"]) == {"libraries", "objects", "precompiled headers", "sources", "records", "other"}
    assert info["kinds"]["libraries"] >= 2 << 20 and info["kinds"]["precompiled headers"] >= 1 << 20
    assert info["max_bytes"] == 4 << 30 and info["pch"] == 1
    total = info["bytes"]
    assert sum(cache.enforce_size_cap(total).values()) == 0  # under the cap: nothing goes
    assert cache.enforce_size_cap(None) == dict.fromkeys(cache.KIND_DIRS, 0)  # no cap
    removed = cache.enforce_size_cap(total - (5 << 19))  # 2.5 MB over: the three oldest entries go
    assert [p.exists() for p, _ in old] == [False, False, False, True, True], removed
    assert removed == {"libraries": 1, "precompiled headers": 1, "objects": 1, "sources": 0, "records": 0}
    removed = cache.enforce_size_cap(0)  # everything past its grace goes; what was just used stays, over the cap
    assert not any(p.exists() for p, _ in old) and all(p.exists() for p in fresh), removed
    assert cache.info()["bytes"] > 0


def test_gc_and_builds_hold_the_cache_to_its_size_setting(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    old, _ = _fake_entries()
    monkeypatch.setenv("KERNELKIT_CACHE_MAX_SIZE", "4.5M")  # 7 MB of entries: the three oldest go
    assert cli.main(["cache", "gc"]) == 0
    assert "'libraries': 1, 'objects': 1, 'pch': 1" in capsys.readouterr().out
    assert [p.exists() for p, _ in old] == [False, False, False, True, True]
    monkeypatch.setenv("KERNELKIT_CACHE_MAX_SIZE", "1K")
    (cache.cache_dir() / "last-gc").touch()  # the daily gc is done: the cap is checked every few minutes on its own
    cache.maybe_gc()
    assert not any(p.exists() for p, _ in old)
    monkeypatch.setenv("KERNELKIT_CACHE_MAX_SIZE", "off")
    assert cli.main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert "(no size cap)" in text and "libraries" in text and "precompiled headers" in text


def test_gc_sweeps_partial_writes_while_directories_come_and_go(tmp_path, monkeypatch):
    """Build dirs appear and vanish under a live cache while gc looks for old partial writes: never an error
    (the fault storm found pathlib's rglob raising FileNotFoundError here)."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    tmp, stop, sweeps = cache.subdir("tmp"), threading.Event(), 0

    def churn():
        i = 0
        while not stop.is_set():
            d = tmp / f"pins-{i}"
            (d / "a" / "b").mkdir(parents=True)
            (d / "a" / "b" / ".x.tmp").write_text("x")
            shutil.rmtree(d)
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        deadline = time.time() + 1.0
        while time.time() < deadline:
            assert collect._remove_partial_writes(time.time() - 3600) == 0  # all of them young
            sweeps += 1
    finally:
        stop.set()
        worker.join()
    assert sweeps > 10


def test_cli_cache_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    assert cli.main(["cache", "list"]) == 0
    assert "cache is empty" in capsys.readouterr().out
    entry = cache.subdir("lib") / "demo-0123456789abcdef"
    entry.mkdir()
    (entry / "manifest.json").write_text(json.dumps({"name": "demo", "key": "0123456789abcdef" * 4, "so": "d.so",
                                                     "build_seconds": 1.5}))
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out and "1.5 s" in out
    assert cli.main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["libraries"] == 1 and info["path"].startswith(str(tmp_path))
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert cache.entries() == []


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine" / "v1"
    assert oct(os.stat(cache.cache_dir()).st_mode & 0o777) == "0o700"


def test_uncreatable_cache_dir_names_the_fix_when_a_build_needs_it(tmp_path, monkeypatch):
    """Loading reads only (a read-only image's cache is fine until something must be built): planning keeps
    generated sources in memory, and a build raises why the cache cannot be written."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "afile" / "cache"))
    path = cache.cache_dir()
    assert path == tmp_path / "afile" / "cache" / "v1" and not path.exists()
    src = cache.write_source("int f() { return 1; }\n", "f.cpp")
    assert not src.exists() and cache.source_bytes(src) == b"int f() { return 1; }\n"
    assert cache.verified_library("f", "0" * 64) is None
    with pytest.raises(kernelkit.CacheUnwritable, match=r"afile/cache/v1: Not a directory.*KERNELKIT_CACHE_DIR"):
        cache.require_writable()
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "writable"))  # another cache is not blocked by it
    assert cache.require_writable() == tmp_path / "writable" / "v1"
    assert cache.source_bytes(cache.write_source("int g();\n", "g.cpp")) == b"int g();\n"


def test_threads_writing_the_same_generated_source_all_write_it(tmp_path, monkeypatch):
    """Autotune and a card's units plan in threads, so the same generated file is written by several at once:
    each write goes through a temporary file of its own (a shared one made a thread's rename fail and the text
    stay unwritten in memory), and nothing is left behind."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    for round_ in range(20):
        text = f"int f{round_}() {{ return {round_}; }}\n"
        barrier = threading.Barrier(8)

        def write(text=text, barrier=barrier):
            barrier.wait()
            return cache.write_source(text, "f.cpp")

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            paths = set(pool.map(lambda _: write(), range(8)))
        assert len(paths) == 1 and paths.pop().read_text() == text
        assert not [f for f in generated._UNWRITTEN if f.is_relative_to(tmp_path)], generated._UNWRITTEN
    assert not [p for p in (tmp_path / "c").rglob("*.tmp")]


def test_replace_file_copies_the_mode_and_leaves_nothing_when_it_fails(tmp_path):
    src = tmp_path / "lib.so"
    src.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    os.chmod(src, 0o751)
    replace_file.copy(src, tmp_path / "copy.so")
    copied = tmp_path / "copy.so"
    assert copied.read_bytes() == src.read_bytes() and copied.stat().st_mode & 0o777 == 0o751
    assert copied.stat().st_mtime == src.stat().st_mtime
    replace_file.write(tmp_path / "record.json", "{}")
    assert (tmp_path / "record.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileNotFoundError):
        replace_file.copy(tmp_path / "missing.so", copied)
    assert copied.read_bytes() == src.read_bytes()  # the old file stays whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.so", "lib.so", "record.json"]


def test_a_copied_program_runs_at_once_while_other_threads_start_processes(tmp_path):
    """A file this process opened for writing (the copy, or a temporary one for cp to fill) is "Text file busy" to
    exec while a fork of another thread still holds the descriptor: a few in a hundred here, as CI's torch 2.6 run
    met in test_standalone_executable. A program is copied by a child process into a name it creates."""
    src = tmp_path / "prog"
    src.write_bytes(Path("/bin/true").read_bytes())
    src.chmod(0o755)
    done = threading.Event()

    def start_processes():
        while not done.is_set():
            subprocess.run(["/bin/true"])

    threads = [threading.Thread(target=start_processes) for _ in range(4)]
    for t in threads:
        t.start()
    busy = 0
    try:
        for i in range(200):
            dst = tmp_path / f"copy{i}"
            replace_file.copy_executable(src, dst)
            try:
                subprocess.run([str(dst)], check=True)
            except OSError:
                busy += 1
    finally:
        done.set()
        for t in threads:
            t.join()
    assert busy == 0
    assert (tmp_path / "copy0").stat().st_mode & 0o777 == 0o755 and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(OSError, match="missing"):
        replace_file.copy_executable(tmp_path / "missing", tmp_path / "copy0")
    assert not list(tmp_path.glob(".*.tmp"))


def test_world_writable_cache_root_refused(tmp_path, monkeypatch):
    root = tmp_path / "shared" / "v1"
    root.mkdir(parents=True)
    os.chmod(root, 0o777)
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "shared"))
    with pytest.raises(kernelkit.CacheSecurityError, match="writable by group or others"):
        cache.cache_dir()


def test_lock_times_out_with_clear_message(tmp_path, monkeypatch):
    import filelock

    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("KERNELKIT_LOCK_TIMEOUT", "0.3")
    holder = filelock.FileLock(str(cache.subdir("locks") / "k.lock"), thread_local=False)
    import threading

    held, release = threading.Event(), threading.Event()

    def hold():  # another holder (a thread with its own lock object stands in for another process)
        with holder:
            held.set()
            release.wait()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    try:
        with pytest.raises(kernelkit.LockTimeout, match="waiting for another process building demo"):
            with cache.locked("k", "demo"):
                pass
    finally:
        release.set()
        t.join()


def test_flags_split_as_shlex_splits_each_stripped_flag():
    """The plain-word shortcut of ``arguments.flags`` gives what shlex gives, for words, spaces, quotes,
    escapes and the white space str.strip removes but shlex keeps."""
    import random
    import shlex

    from kernelkit.loading import arguments

    rng = random.Random(5)
    alphabet = ["-O2", "-D", "A=1", "x", " ", "\t", "\n", "\r", "'", '"', "\\", "#", "=", "\x0b", "\xa0", "é", ""]
    cases = ["-g\n\n", "-O0 -Wall", "  -DX=1  ", "-DMSG='a b'", "", "   ", "#x", "a\x0bb"]
    cases += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(3000)]
    for flag in cases:
        try:
            expected = shlex.split(flag.strip())
        except ValueError:
            with pytest.raises(ValueError, match="extra_cflags"):
                arguments.flags([flag], "extra_cflags")
            continue
        assert arguments.flags([flag], "extra_cflags") == expected, repr(flag)
