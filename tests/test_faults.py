"""Cache integrity under faults: sources edited mid-build, damaged cache files and metadata, precompiled
headers, interrupted builds, unsafe directories, gc/clear racing builds, and a short fault-injection run.

Everything here builds tiny torch-free C++ libraries through units.plan_unit/Target/build directly
(~0.2 s each) and calls them with ctypes."""
import contextlib
import ctypes
import errno
import itertools
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest

from kernelkit.diagnostics import Diagnostic
from kernelkit.errors import BuildError, CacheSecurityError, CacheUnwritable, KernelkitError, SourcesChanged
from kernelkit.frontends import cli
from kernelkit.jit import build, cache, plan, prebuilt, reaper, running, sources, toolchain, units
from kernelkit.jit.fast import pch
from kernelkit.jit.sources import sha256_file

TU = '#include "v.h"\nextern "C" __attribute__((visibility("default"))) int f() {{ return V * 100 + {w}; }}\n'


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER", raising=False)
    return cache.cache_dir()


@pytest.fixture
def card(tmp_path):
    """A one-file C++ library f() = V * 100 + w, V from the local header v.h."""
    d = tmp_path / "card"
    d.mkdir()
    (d / "v.h").write_text("#define V 1\n")
    (d / "f.cpp").write_text(TU.format(w=1))
    return d


def make_target(src: Path, text=None, name="f", include_dirs=None, pch_defines=None) -> units.Target:
    text = src.read_text() if text is None else text
    unit = units.plan_unit("cpp", src, text, include_dirs or [src.parent], [], [], src.name,
                           pch_defines=pch_defines)
    ldflags = ["-shared"]
    display = {str(src): src.name, **{str(d): d.name for d in unit.deps}}
    return units.Target(name=name, units=[unit], ldflags=ldflags, key=units.target_key(name, [unit], ldflags),
                        with_cuda=False, pymodule=None, display=display, texts={src.name: text.splitlines()})


def call_f(so: Path) -> int:
    return ctypes.CDLL(str(so)).f()


def launcher(tmp_path: Path, body: str) -> str:
    script = tmp_path / f"launcher-{abs(hash(body))}.sh"
    script.write_text("#!/bin/sh\n" + body + '\nexec "$@"\n')
    script.chmod(0o755)
    return str(script)


# ------------------------------------------------------------------------------------- edits mid-build
@pytest.mark.parametrize("edited", ["f.cpp", "v.h"])
def test_edit_during_compile_is_not_cached_under_the_old_key(cache_root, card, tmp_path, monkeypatch, edited):
    target = make_target(card / "f.cpp")  # planned from V=1, w=1: f() == 101
    old = {p: (card / p).read_text() for p in ("f.cpp", "v.h")}
    edit = {"f.cpp": "s/+ 1;/+ 2;/", "v.h": "s/V 1/V 2/"}[edited]
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", launcher(tmp_path, f"sed -i '{edit}' {card / edited}"))
    with pytest.raises(SourcesChanged, match=rf"{edited} changed while it was being compiled"):
        build.build(target)
    assert cache.cached_object(target.units[0].key) is None
    assert cache.verified_library(target.name, target.key) is None
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER")
    for p, text in old.items():
        (card / p).write_text(text)
    so, cached, _ = build.build(make_target(card / "f.cpp"))
    assert not cached and call_f(so) == 101


def test_edit_undone_during_compile_is_caught(cache_root, card, tmp_path, monkeypatch):
    """The compiler reads the edit, which is undone before the build checks the file's content again."""
    target = make_target(card / "f.cpp")
    src = card / "f.cpp"
    script = tmp_path / "edit-and-undo.sh"
    script.write_text(f"#!/bin/sh\nsed -i 's/+ 1;/+ 2;/' {src}\n\"$@\"\nrc=$?\nsed -i 's/+ 2;/+ 1;/' {src}\nexit $rc\n")
    script.chmod(0o755)
    os.utime(src, (time.time() - 60, time.time() - 60))
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", str(script))
    with pytest.raises(SourcesChanged, match="f.cpp changed while it was being compiled"):
        build.build(target)
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER")
    so, _, _ = build.build(make_target(src))
    assert call_f(so) == 101


@pytest.mark.cuda_build
def test_header_edit_during_nvcc_compile_is_not_cached(cache_root, tmp_path, monkeypatch):
    d = tmp_path / "cu"
    d.mkdir()
    (d / "k.cuh").write_text("#define K 3\n")
    src = d / "k.cu"
    src.write_text('#include "k.cuh"\n__global__ void k(int* x) { x[0] = K; }\n')
    unit = units.plan_unit("cu", src, src.read_text(), [d], [], toolchain.arch_list("9.0"), "k.cu")
    target = units.Target(name="k", units=[unit], ldflags=["-shared"], key=units.target_key("k", [unit], ["-shared"]),
                          with_cuda=True, pymodule=None, display={str(src): "k.cu", str(d / "k.cuh"): "k.cuh"},
                          texts={})
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", launcher(tmp_path, f"sed -i 's/K 3/K 4/' {d / 'k.cuh'}"))
    with pytest.raises(SourcesChanged, match="k.cuh changed while it was being compiled"):
        build.build(target)
    assert cache.cached_object(unit.key) is None


def test_crlf_and_undecodable_sources_are_not_mistaken_for_edits(cache_root, card):
    src = card / "f.cpp"
    src.write_bytes(b"// caf\xe9\r\n" + TU.format(w=3).replace("\n", "\r\n").encode())
    so, _, _ = build.build(make_target(src, text=src.read_text(errors="replace")))
    assert call_f(so) == 103


def test_tampered_generated_source_is_not_compiled_under_its_key(cache_root, card):
    text = TU.format(w=1)
    src = cache.subdir("src") / "0123456789abcdef01234567" / "f.cpp"
    src.parent.mkdir()
    src.write_text(TU.format(w=9))  # not what the key is made of
    with pytest.raises(SourcesChanged, match="generated source .* damaged"):
        build.build(make_target(src, text=text, include_dirs=[card]))
    assert not src.exists()  # so the next load writes it again
    src.write_text(text)
    so, _, _ = build.build(make_target(src, text=text, include_dirs=[card]))
    assert call_f(so) == 101


def test_generated_source_rewritten_with_the_same_text_is_no_edit(cache_root, card, tmp_path, monkeypatch):
    """Processes that load the same inline code at once each write its source (same text, new inode)."""
    text = TU.format(w=1)
    src = cache.subdir("src") / "0123456789abcdef01234567" / "f.cpp"
    src.parent.mkdir()
    src.write_text(text)
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", launcher(tmp_path, f"cp {src} {src}.tmp && mv {src}.tmp {src}"))
    so, _, _ = build.build(make_target(src, text=text, include_dirs=[card]))
    assert call_f(so) == 101


def test_damaged_generated_source_is_written_again_not_reused(cache_root):
    text = TU.format(w=1)
    path = plan.write_source(text, "f.cpp")
    for damage in (text[:20], TU.format(w=9)):  # truncated (a full disk), same-length other text (tampered)
        path.write_text(damage)
        assert plan.write_source(text, "f.cpp") == path
        assert path.read_text() == text
    assert [p.name for p in path.parent.iterdir()] == ["f.cpp"]  # no temporary file left behind


def test_error_in_a_header_quotes_the_header_line(cache_root, card):
    (card / "v.h").write_text("#define V 1\nint broken = ;\n")
    with pytest.raises(BuildError) as e:
        build.build(make_target(card / "f.cpp"))
    diag = next(d for d in e.value.diagnostics if d.file == "v.h")
    assert diag.line == 2 and diag.source_line == "int broken = ;"
    assert "v.h:2:" in str(e.value) and "    2 | int broken = ;" in str(e.value)


def test_a_header_the_key_missed_fails_the_build_and_nothing_is_cached(cache_root, card, monkeypatch):
    """The depfile check behind the key: here the preprocessor's list of reads is withheld from the plan."""
    monkeypatch.setattr(units, "_with_preprocessor_reads", lambda kind, path, flags, deps: deps)
    (card / "f.cpp").write_text('#define HEADER "v.h"\n#include HEADER\n'
                                'extern "C" __attribute__((visibility("default"))) int f() { return V; }\n')
    with pytest.raises(SourcesChanged, match=r"v\.h, which kernelkit's include scan did not find"):
        build.build(make_target(card / "f.cpp"))
    assert not list(cache.subdir("obj").rglob("*.o"))


# ------------------------------------------------------------------------------ damaged cache contents
def _built(card) -> units.Target:
    target = make_target(card / "f.cpp")
    build.build(target)
    return target


@pytest.mark.parametrize("so_field", ["abs", "../"])
def test_manifest_pointing_outside_its_entry_is_corrupt(cache_root, card, tmp_path, so_field):
    target = _built(card)
    entry = cache.library_dir(target.name, target.key)
    other = tmp_path / "elsewhere" / "other.so"
    other.parent.mkdir()
    other.write_bytes((entry / target.so_name).read_bytes())
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["so"] = str(other) if so_field == "abs" else os.path.relpath(other, entry)
    manifest["sha256"] = sha256_file(other)
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert cache.verified_library(target.name, target.key) is None
    assert not entry.exists()


@pytest.mark.parametrize("manifest", [["so"], {"name": "f", "key": 5, "so": 7, "sha256": None}, {"so": ["x.so"]}])
def test_manifest_of_the_wrong_type_is_corrupt(cache_root, card, manifest):
    target = _built(card)
    entry = cache.library_dir(target.name, target.key)
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert cache.verified_library(target.name, target.key) is None
    so, cached, _ = build.build(target)
    assert not cached and call_f(so) == 101


def test_object_metadata_of_the_wrong_type_is_corrupt(cache_root, card):
    target = _built(card)
    key = target.units[0].key
    cache.object_path(key).with_suffix(".json").write_text("[1, 2]")
    assert cache.cached_object(key) is None
    assert not cache.object_path(key).exists()


def test_file_where_an_entry_directory_belongs_is_replaced(cache_root, card):
    target = make_target(card / "f.cpp")
    cache.library_dir(target.name, target.key).write_text("not a directory")
    cache.object_path(target.units[0].key).mkdir()  # and a directory where the object belongs
    (cache.object_path(target.units[0].key).with_suffix(".json")).write_text("{}")
    so, cached, _ = build.build(target)
    assert not cached and call_f(so) == 101


def test_corrupt_entry_is_removed_only_under_its_lock(cache_root, card):
    target = _built(card)
    entry = cache.library_dir(target.name, target.key)
    (entry / target.so_name).write_bytes(b"damaged")
    holder = filelock.FileLock(str(cache.subdir("locks") / f"{cache.library_lock(target.name, target.key)}.lock"))
    with holder:  # another process is rebuilding it right now: its entry is not ours to remove
        assert cache.verified_library(target.name, target.key) is None
        assert entry.exists()
    assert cache.verified_library(target.name, target.key) is None
    assert not entry.exists()


def test_toolchain_facts_file_of_the_wrong_shape_is_recomputed(cache_root):
    toolchain.facts.cache_clear()
    toolchain.facts()
    [facts_file] = cache_root.glob("records/toolchain/*.json")
    for bad in ("{}", '{"include_cpu": 5}', "[]"):
        facts_file.write_text(bad)
        toolchain.facts.cache_clear()
        assert isinstance(toolchain.facts()["include_cpu"], list) and toolchain.torch_include_paths(False)
    assert isinstance(json.loads(facts_file.read_text())["include_cpu"], list)  # and written back whole


def test_malformed_manifests_do_not_break_list_gc_or_info(cache_root, capsys):
    for i, m in enumerate([[], {"so": 5, "key": 7, "build_seconds": "slow", "name": None}, "x"]):
        entry = cache.subdir("lib") / f"bad{i}-0123456789abcdef"
        entry.mkdir()
        (entry / "manifest.json").write_text(json.dumps(m))
    (cache.subdir("lib") / "afile-0123456789abcdef").write_text("")
    assert cli.main(["cache", "list"]) == 0
    assert "bad1" in capsys.readouterr().out
    cache.info()
    assert cache.gc(max_age_days=30)["libraries"] == 0
    assert cache.gc(max_age_days=30, now=time.time() + 90 * 86400)["libraries"] == 4


# ------------------------------------------------------------------------------------ verify and CLI
def test_verify_reports_and_fixes_corrupt_entries(cache_root, card, capsys):
    good = _built(card)
    (card / "f.cpp").write_text(TU.format(w=2))
    bad = _built(card)
    (cache.library_dir(bad.name, bad.key) / bad.so_name).write_bytes(b"damaged")
    cache.object_path(good.units[0].key).write_bytes(b"damaged")
    found = {f["entry"]: f for f in cache.verify()}
    corrupt = {e for e, f in found.items() if f["status"] == "corrupt"}
    assert corrupt == {f"lib/{cache.library_dir(bad.name, bad.key).name}", f"obj/{good.units[0].key}.o"}
    assert "sha256" in found[f"obj/{good.units[0].key}.o"]["reason"]
    assert found[f"lib/{cache.library_dir(good.name, good.key).name}"]["status"] == "ok"
    assert cli.main(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert "would be removed by --fix" in out and "2 corrupt" in out
    assert cli.main(["cache", "verify", "--fix"]) == 0
    assert "removed" in capsys.readouterr().out
    assert all(f["status"] == "ok" for f in cache.verify())
    assert cache.verified_library(good.name, good.key) is not None


# ------------------------------------------------------------------------------ precompiled headers
@pytest.mark.fast_path("pch")
def test_pch_is_on_unless_turned_off_and_built_at_once_with_four_cores(monkeypatch):
    if not toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    monkeypatch.delenv("KERNELKIT_PCH", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert pch.enabled() and not pch.at_once()
    monkeypatch.setenv("KERNELKIT_PCH", "1")
    assert pch.enabled() and pch.at_once()
    monkeypatch.setenv("KERNELKIT_PCH", "0")
    assert not pch.enabled()
    monkeypatch.delenv("KERNELKIT_PCH")
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert pch.enabled() and pch.at_once()


@pytest.mark.fast_path("pch")
@pytest.mark.parametrize("cpus, after_link", [(2, True), (16, False)])
def test_a_small_machine_builds_a_wanted_pch_after_the_build_at_the_lowest_priority(cache_root, tmp_path,
                                                                                    monkeypatch, cpus, after_link):
    """A machine of few cores starts the builder once the build that wanted the PCH is done (its cores are then
    free), niced; with 4 cores or more it starts while the build runs. Either way the build's library is right."""
    if not toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    monkeypatch.delenv("KERNELKIT_PCH", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    inc = tmp_path / "inc"
    (inc / "kernelkit").mkdir(parents=True)
    (inc / "kernelkit" / "binding.h").write_text("#pragma once\ninline int g() { return 7; }\n")
    src = tmp_path / "b.cpp"
    src.write_text('#include <kernelkit/binding.h>\nextern "C" __attribute__((visibility("default"))) '
                   "int f() { return g(); }\n")
    target = make_target(src, include_dirs=[inc], pch_defines=[])
    root = tmp_path / "pch"
    monkeypatch.setattr(pch, "plan", lambda unit: (root, "kernelkit/binding.h.gch", ["true"]))
    started = []
    monkeypatch.setattr(pch, "_start_pch_build",
                        lambda r, gch, cmd, nice=False: started.append((r, nice, running.STATS["links"])))
    links = running.STATS["links"]
    so, _, _ = build.build(target)
    assert call_f(so) == 7
    assert started == [(root, after_link, links + (1 if after_link else 0))]


def test_the_pch_builder_runs_at_the_niceness_it_is_given(tmp_path):
    """The detached builder lowers its own priority before it runs the compiler (no preexec_fn in a process
    with threads), and renames a finished header into place."""
    gch, meta = tmp_path / "h.gch", tmp_path / "pch.json"
    tmp = tmp_path / ".h.gch.1"
    shown = tmp_path / "nice"
    cmd = [sys.executable, "-c", f"import os, sys; open({str(shown)!r}, 'w').write(str(os.nice(0))); "
           "open(sys.argv[2], 'w').write('pch')"]
    subprocess.run([sys.executable, "-c", pch._PCH_BUILDER, "19", str(tmp), str(gch), str(meta), *cmd], check=True)
    assert int(shown.read_text()) >= 19 and gch.read_text() == "pch" and json.loads(meta.read_text())["size"] == 3


def _binding_unit(tmp_path) -> units.Unit:
    src = tmp_path / "b.cpp"
    text = "#include <kernelkit/binding.h>\n"
    src.write_text(text)
    return units.plan_unit("cpp", src, text, [sources.CSRC], [], [], "b.cpp", pch_defines=["KERNELKIT_BINDING=1"])


@pytest.fixture
def pch_on(cache_root, monkeypatch):
    if not toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    monkeypatch.setenv("KERNELKIT_PCH", "1")
    monkeypatch.setattr(pch, "_PCH_BUILDER", "pass", raising=False)  # never spend 25 s on a real one


@pytest.mark.fast_path("pch")
def test_truncated_pch_is_not_used_and_is_rebuilt(pch_on, tmp_path):
    unit = _binding_unit(tmp_path)
    root, _, _ = pch.plan(unit)
    gch = root / "kernelkit" / "binding.h.gch"
    gch.parent.mkdir(parents=True)
    gch.write_bytes(b"P" * 4096)
    (root / "pch.json").write_text(json.dumps({"file": "kernelkit/binding.h.gch", "size": 4096,
                                               "sha256": sha256_file(gch)}))
    assert pch.flags(unit) == [f"-I{root}", "-Winvalid-pch"]  # intact: used
    gch.write_bytes(b"P" * 100)  # truncated
    builds = running.STATS["pch_builds"]
    assert pch.flags(unit) == []
    assert not gch.exists() and running.STATS["pch_builds"] == builds + 1


@pytest.mark.fast_path("pch")
def test_killed_pch_builder_leaves_no_claim_or_partial_file(pch_on, tmp_path, capfd, monkeypatch):
    unit = _binding_unit(tmp_path)
    root, _, _ = pch.plan(unit)
    (root / "kernelkit").mkdir(parents=True)
    (root / "building").write_text("")  # its builder was killed a moment ago: the claim is not held
    partial = root / "kernelkit" / ".binding.h.gch.4242"
    partial.write_bytes(b"half")
    builds = running.STATS["pch_builds"]
    monkeypatch.setattr(pch, "_PCH_ANNOUNCED", False, raising=False)
    assert pch.flags(unit) == []
    assert not partial.exists() and running.STATS["pch_builds"] == builds + 1
    deadline = time.time() + 30
    while (held := cache.try_flock(root / "building")) is None:  # the started builder holds it until it exits
        assert time.time() < deadline
        time.sleep(0.05)
    try:  # a live builder (now us): nobody starts a second one
        assert pch.flags(unit) == [] and running.STATS["pch_builds"] == builds + 1
    finally:
        os.close(held)
    pch.flags(unit)
    assert capfd.readouterr().err.count("building a precompiled header") == 1  # announced once per process


@pytest.mark.fast_path("pch")
def test_unreadable_pch_is_dropped_and_the_unit_compiled_without(pch_on, tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    (inc / "kernelkit").mkdir(parents=True)
    header = inc / "kernelkit" / "binding.h"
    header.write_text("#pragma once\n#include <map>\n#include <string>\ninline int g() { return 7; }\n")
    src = tmp_path / "b.cpp"
    src.write_text('#include <kernelkit/binding.h>\nextern "C" __attribute__((visibility("default"))) '
                   "int f() { return g(); }\n")
    target = make_target(src, include_dirs=[inc], pch_defines=[])
    root = tmp_path / "pch"
    gch = root / "kernelkit" / "binding.h.gch"
    gch.parent.mkdir(parents=True)
    subprocess.run([toolchain.cxx(), *target.units[0].flags, "-x", "c++-header", str(header), "-o", str(gch)],
                   check=True, capture_output=True)
    gch.write_bytes(gch.read_bytes()[: gch.stat().st_size // 2])  # recorded as it is: only gcc can tell
    (root / "pch.json").write_text(json.dumps({"file": "kernelkit/binding.h.gch", "size": gch.stat().st_size,
                                               "sha256": sha256_file(gch)}))
    monkeypatch.setattr(pch, "plan", lambda unit: (root, "kernelkit/binding.h.gch", ["true"]))
    rejected = running.STATS["pch_rejected"]
    so, _, _ = build.build(target)
    assert call_f(so) == 7
    assert running.STATS["pch_rejected"] == rejected + 1 and not gch.exists() and not (root / "pch.json").exists()


def test_a_preamble_pch_serves_every_edit_and_no_changed_header(cache_root, tmp_path):
    """load_inline's sources live under their text's hash, so each edit's host TU has its own -I dir: the key of
    the split preamble's PCH leaves such dirs out (gcc does not need -I to match), never a header it reads."""
    inc, pre = tmp_path / "inc", tmp_path / "pre"
    inc.mkdir()
    pre.mkdir()
    (inc / "mine.h").write_text("inline int mine() { return 1; }\n")
    header = pre / "kk_host_preamble_0.h"
    header.write_text("#include <vector>\n#include <mine.h>\n")

    def root_for(edit: int) -> Path:
        d = tmp_path / f"src{edit}"
        d.mkdir(exist_ok=True)
        text = f"#include <{header.name}>\nint f() {{ return {edit}; }}\n"
        (d / "x.host.cpp").write_text(text)
        unit = units.plan_unit("cpp", d / "x.host.cpp", text, [d, pre], [f"-I{inc}"], [], "x.cu (cpp part)",
                               optimize=None, torch_style=True, pch_header=header)
        return pch.plan(unit)[0]

    first = root_for(0)
    assert root_for(1) == first
    (inc / "mine.h").write_text("inline int mine() { return 2; }\n")
    assert root_for(2) != first


def test_pch_is_sized_collected_and_cleared(cache_root):
    root = cache.subdir("pch") / "k1"
    (root / "kernelkit").mkdir(parents=True)
    (root / "kernelkit" / "binding.h.gch").write_bytes(b"x" * 5000)
    (root / "pch.json").write_text(json.dumps({"file": "kernelkit/binding.h.gch", "size": 5000, "sha256": "0"}))
    assert cache.info()["subdirs"]["pch"] >= 5000
    assert cache.gc(max_age_days=30)["pch"] == 0
    assert cache.gc(max_age_days=30, now=time.time() + 90 * 86400)["pch"] == 1 and not root.exists()
    (root / "kernelkit").mkdir(parents=True)
    assert cache.clear() >= 1 and not root.exists()


# ------------------------------------------------------------------------------------ compiler output
def test_compiler_messages_are_bounded():
    huge = [Diagnostic("a.cpp", i, 1, "error", "template<" * 100000) for i in range(50)]
    e = BuildError("compiling a.cpp", huge, "full log " * 100000)
    assert len(str(e)) <= 17000 and "more errors" in str(e) and len(e.log) == 900000
    tail = BuildError("linking a", [], "\n".join("undefined reference " + "x" * 9000 for _ in range(30)))
    assert len(str(tail)) <= 17000


def test_real_template_error_message_is_bounded(cache_root, tmp_path):
    src = tmp_path / "t.cpp"
    # the type's name doubles with every level: gcc spells all ~2^15 leaves out in the error
    src.write_text("template <class A, class B> struct P {};\n"
                   "template <int N> struct T { using type = P<typename T<N - 1>::type, typename T<N - 1>::type>; };\n"
                   "template <> struct T<0> { using type = int; };\n"
                   "int x = T<15>::type{};\n")
    with pytest.raises(BuildError) as info:
        build.build(make_target(src))
    assert len(str(info.value)) <= 17000 and len(info.value.log) > 100000
    assert "t.cpp:4" in str(info.value)


# ------------------------------------------------------------------------------- safety of directories
def test_world_writable_cache_dir_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(root))
    with pytest.raises(CacheSecurityError, match=r"writable by group or others.*chmod go-w"):
        cache.cache_dir()


def test_cache_is_created_private_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "new" / "kk"))
    old = os.umask(0)
    try:
        v1 = cache.cache_dir()
        cache.subdir("lib")
    finally:
        os.umask(old)
    for p in (tmp_path / "new", tmp_path / "new" / "kk", v1, v1 / "lib"):
        assert p.stat().st_mode & 0o077 == 0, p


@pytest.mark.skipif(os.getuid() != 0, reason="changing a directory's owner needs root")
def test_cache_dir_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(root))
    with pytest.raises(CacheSecurityError, match="owned by uid 12345"):
        cache.cache_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="changing a directory's owner needs root")
def test_prebuilt_dir_owned_by_another_user_is_skipped(tmp_path, monkeypatch, caplog):
    theirs, mine = tmp_path / "theirs", tmp_path / "mine"
    theirs.mkdir()
    mine.mkdir()
    os.chown(theirs, 12345, 12345)
    monkeypatch.setenv("KERNELKIT_PREBUILT_PATH", os.pathsep.join([str(theirs), str(mine)]))
    dirs = prebuilt.prebuilt_dirs()
    assert theirs not in dirs and mine in dirs
    assert "owned by uid 12345" in caplog.text


# --------------------------------------------------------------------------------- environment, disk
def test_bad_max_age_setting_warns_and_never_fails_a_build(cache_root, card, monkeypatch, caplog):
    target = _built(card)
    for bad in ("thirty", "-1", "nan"):
        monkeypatch.setenv("KERNELKIT_CACHE_MAX_AGE_DAYS", bad)
        (cache_root / "last-gc").unlink(missing_ok=True)
        cache.maybe_gc()
        assert "KERNELKIT_CACHE_MAX_AGE_DAYS" in caplog.text
        assert cache.verified_library(target.name, target.key) is not None  # the default 30 days kept it


def test_missing_compiler_launcher_is_named(cache_root, card, monkeypatch):
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", "/nonexistent/ccache")
    with pytest.raises(KernelkitError, match="KERNELKIT_COMPILER_LAUNCHER"):
        build.build(make_target(card / "f.cpp"))


def test_disk_full_while_writing_the_manifest(cache_root, card, monkeypatch):
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name == "manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    target = make_target(card / "f.cpp")
    with pytest.raises(CacheUnwritable, match=r"no space left.*kernelkit cache gc.*clear"):
        build.build(target)
    assert not cache.library_dir(target.name, target.key).exists()
    assert not [p for p in cache.subdir("tmp").iterdir() if p.name.startswith("lib-")]


# --------------------------------------------------------------------------------- locks, gc, clear
def test_idle_lock_files_and_old_sources_are_collected(cache_root):
    locks = cache.subdir("locks")
    idle, held, fresh = (locks / f"{n}.lock" for n in ("idle", "held", "fresh"))
    for p in (idle, held, fresh):
        p.write_text("")
    src_old, src_new = cache.subdir("src") / "old", cache.subdir("src") / "new"
    src_old.mkdir()
    src_new.mkdir()
    two_days_ago = time.time() - 2 * 86400
    for p in (idle, held):
        os.utime(p, (two_days_ago, two_days_ago))
    long_ago = time.time() - 60 * 86400
    os.utime(src_old, (long_ago, long_ago))
    with filelock.FileLock(str(held)):
        removed = cache.gc(max_age_days=30)
    assert removed["locks"] == 1 and removed["sources"] == 1
    assert not idle.exists() and held.exists() and fresh.exists()
    assert not src_old.exists() and src_new.exists()


def test_gc_and_clear_leave_what_another_process_is_building(cache_root, card):
    target = _built(card)
    entry = cache.library_dir(target.name, target.key)
    obj = cache.object_path(target.units[0].key)
    live_tmp = cache.private_tmpdir("obj-")  # another build's private directory, at work
    lib_lock = filelock.FileLock(str(cache.subdir("locks") / f"{cache.library_lock(target.name, target.key)}.lock"))
    obj_lock = filelock.FileLock(str(cache.subdir("locks") / f"{target.units[0].key}.lock"))
    with lib_lock, obj_lock:
        cache.clear()
        assert entry.exists() and obj.exists() and live_tmp.exists()
        removed = cache.gc(max_age_days=30, now=time.time() + 90 * 86400)
        assert removed["libraries"] == removed["objects"] == 0 and entry.exists() and obj.exists()
    cache.clear()
    assert not entry.exists() and not obj.exists()


# --------------------------------------------------------------------------------------- interruption
BUILD_CHILD = """
import signal, sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job inherits SIGINT ignored; Ctrl-C is not
sys.path.insert(0, {tests!r})
from test_faults import call_f, make_target
from kernelkit.jit import build, reaper
so, cached, _ = build.build(make_target(Path({src!r})))
print(call_f(so), cached, reaper._watchdog.pid)
"""


def _build_child(card: Path, env: dict) -> subprocess.Popen:
    """A fresh Python process building the card (it prints f(), whether the library was cached, and its
    watchdog's pid)."""
    code = BUILD_CHILD.format(tests=str(Path(__file__).parent), src=str(card / "f.cpp"))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _compiling_child(card: Path, tmp_path: Path, body: str) -> tuple:
    """A child building the card whose compiler launcher runs ``body``: (the child, the launcher's path
    and process group), once the launcher has started."""
    pidfile = tmp_path / "launcher.pid"
    slow = launcher(tmp_path, f"echo $$ > {pidfile}\n{body}")
    child = _build_child(card, {**os.environ, "KERNELKIT_COMPILER_LAUNCHER": slow})
    deadline = time.time() + 120
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert child.poll() is None, child.communicate()
        assert time.time() < deadline, "the compile never started"
        time.sleep(0.05)
    return child, slow, int(pidfile.read_text())


def test_sigint_ends_the_build_and_its_compilers_at_once(cache_root, card, tmp_path):
    child, _, group = _compiling_child(card, tmp_path, "sleep 30")
    t0 = time.time()
    child.send_signal(signal.SIGINT)
    try:
        _, err = child.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("SIGINT did not end the build within 15 s")
    assert "KeyboardInterrupt" in err and time.time() - t0 < 10
    time.sleep(0.2)
    assert _running_in_group(group) == []  # the launcher and its sleep: ended, not left to run out


def test_sigkill_of_the_building_process_ends_its_compilers(cache_root, card, tmp_path):
    """Nothing in the killed process can end its compilers (their own process groups, for Ctrl-C): its
    watchdog does, and removes the build's private dirs; the retry in a new process then builds alone."""
    child, marker, group = _compiling_child(card, tmp_path, "sleep 60")
    try:
        assert _running_with(marker) and _running_in_group(group)
        child.kill()
        child.communicate()
        deadline = time.time() + 5
        while (_running_with(marker) or _running_in_group(group)) and time.time() < deadline:
            time.sleep(0.05)
        assert _running_with(marker) == [] and _running_in_group(group) == [], "the compiler outlived its build"
    finally:
        for pid in {*_running_with(marker), *_running_in_group(group)}:  # after a failure: not left for 60 s
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    deadline = time.time() + 5
    while list(cache.subdir("tmp").iterdir()) and time.time() < deadline:
        time.sleep(0.05)
    assert list(cache.subdir("tmp").iterdir()) == []  # the killed build's partial files, removed
    retry = _build_child(card, os.environ)
    out, err = retry.communicate(timeout=120)
    assert retry.returncode == 0, err
    value, cached, watchdog = out.split()
    assert (value, cached) == ("101", "False")
    deadline = time.time() + 5
    while _alive(int(watchdog)) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(int(watchdog)), "the watchdog outlived a process that exited normally"


TOOL_CHILD = """
import sys
from kernelkit.jit import reaper
reaper.run(["sh", "-c", "sleep 1; echo $$ > " + sys.argv[1] + "; exec sleep 60"])  # named once surely watched
"""


def test_sigkill_of_a_process_ends_the_tool_it_runs_in_a_watched_group(tmp_path):
    """The link stand-ins' nm, readelf and proving link run through reaper.run: a process killed meanwhile
    leaves none of them running."""
    pidfile = tmp_path / "tool.pid"
    child = subprocess.Popen([sys.executable, "-c", TOOL_CHILD, str(pidfile)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert child.poll() is None, child.communicate()
        assert time.time() < deadline, "the tool never started"
        time.sleep(0.05)
    group = int(pidfile.read_text())
    try:
        assert group != os.getpgid(child.pid) and _running_in_group(group)
        child.kill()
        child.communicate()
        deadline = time.time() + 20  # the watchdog's own start on a loaded CI box
        while _running_in_group(group) and time.time() < deadline:
            time.sleep(0.05)
        assert _running_in_group(group) == [], "the tool outlived its process"
    finally:
        for pid in _running_in_group(group):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def test_reaper_run_returns_the_output_and_raises_on_failure(monkeypatch):
    told = []
    monkeypatch.setattr(reaper, "watch_group", lambda pgid: told.append(("+", pgid)))
    monkeypatch.setattr(reaper, "unwatch_group", lambda pgid: told.append(("-", pgid)))
    assert reaper.run(["sh", "-c", "echo out; echo err >&2"]).stdout == "out\n"
    assert reaper.run(["sh", "-c", "exit 3"], check=False).returncode == 3
    with pytest.raises(subprocess.CalledProcessError, match="exit status 3") as failed:
        reaper.run(["sh", "-c", "echo why >&2; exit 3"])
    assert failed.value.stderr == "why\n"
    assert [sign for sign, _ in told] == ["+", "-"] * 3 and told[0][1] == told[1][1] != told[2][1]


def _fork_has_its_own_watchdog(parents_end: str, scratch: Path, results) -> None:
    if parents_end in _open_files():
        results.put("the parent's end of the watchdog socket is open in the forked child")
        return
    reaper.watch_dir(scratch)
    reaper.unwatch_dir(scratch)
    results.put(reaper._watchdog.pid)


def test_a_forked_child_never_talks_to_its_parents_watchdog(cache_root, card, tmp_path):
    """A fork (a DataLoader worker) must not hold the parent's end open (the watchdog would not see the
    parent die) nor tell the parent's watchdog about its own compilers."""
    build.build(make_target(card / "f.cpp"))
    ours = reaper._watchdog
    results = multiprocessing.get_context("fork").Queue()
    parents_end = os.readlink(f"/proc/self/fd/{ours.sock.fileno()}")  # socket:[inode]
    child = multiprocessing.get_context("fork").Process(target=_fork_has_its_own_watchdog,
                                                        args=(parents_end, tmp_path / "scratch", results))
    child.start()
    theirs = results.get(timeout=60)
    child.join(30)
    assert isinstance(theirs, int) and theirs != ours.pid, theirs
    reaper.watch_dir(tmp_path / "scratch")  # the parent's watchdog still listens: no restart
    reaper.unwatch_dir(tmp_path / "scratch")
    assert reaper._watchdog is ours and _alive(ours.pid)


def _open_files() -> set:
    files = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            files.add(os.readlink(fd))
    return files


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not: a container's init may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _running_with(marker: str) -> list:
    """Processes whose command line mentions ``marker``, other than this one."""
    running = []
    for pid in _pids():
        cmdline = Path("/proc", pid, "cmdline")
        try:
            if marker.encode() in cmdline.read_bytes() and int(cmdline.parent.name) != os.getpid():
                running.append(cmdline.parent.name)
        except OSError:
            continue
    return running


def _pids() -> list:
    """Process ids under /proc; listed once, because a glob's own stat of an exiting process raises."""
    return [name for name in os.listdir("/proc") if name.isdigit()]


def _running_in_group(pgid: int) -> list:
    """Processes of group ``pgid`` that are not zombies (a container's init may never reap those)."""
    running = []
    for pid in _pids():
        stat_file = Path("/proc", pid, "stat")
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            running.append(stat_file.parent.name)
    return running


# ------------------------------------------------------------------------------------ fault injection
FAULT_SECONDS = 30.0


def _value(tu: str, header: str) -> int:
    return int(re.search(r"#define V (\d+)", header).group(1)) * 100 + int(re.search(r"\+ (\d+);", tu).group(1))


def _loader(card: Path, seconds: float, seed: int, results) -> None:
    """Edit the card now and then, load it, and check that every load returns what its planned text says."""
    counts = {"loads": 0, "cached": 0, "refused": 0, "vanished": 0, "edits": 0, "wrong": 0}
    try:
        _load_and_edit(card, time.time() + seconds, seed, counts)
    except BaseException as e:  # reported, not lost in a child's stderr
        counts["error"] = repr(e)
    results.put(counts)


def _load_and_edit(card: Path, end: float, seed: int, counts: dict) -> None:
    rng, serial = random.Random(seed), itertools.count((seed + 1) * 100000)
    while time.time() < end:
        if rng.random() < 0.4:
            # the TU flips between few values (an edit undone mid-compile must be caught); the header's
            # values are unique, so comparing it before and after planning tells what the plan hashed
            name = rng.choice(["f.cpp", "v.h"])
            unique = next(serial)
            text = TU.format(w=rng.randint(1, 4)) if name == "f.cpp" else f"#define V {unique}\n"
            tmp = card / f".{name}.{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, card / name)
            counts["edits"] += 1
        header = (card / "v.h").read_text()
        tu = (card / "f.cpp").read_text()
        target = make_target(card / "f.cpp", text=tu)
        if (card / "v.h").read_text() != header:
            continue  # edited while planning: what the plan hashed is unknown here
        try:
            so, cached, _ = build.build(target)
            got = call_f(so)
        except SourcesChanged:
            counts["refused"] += 1
            continue
        except OSError:  # cleared between the build and dlopen
            counts["vanished"] += 1
            continue
        counts["loads"] += 1
        counts["cached"] += cached
        counts["wrong"] += got != _value(tu, header)


def _collector(seconds: float, seed: int, results) -> None:
    """gc (everything unused for a second), clear, and verify --fix at random moments."""
    rng = random.Random(seed)
    counts = {"gc": 0, "clear": 0, "verify_fix": 0}
    end = time.time() + seconds
    try:
        while time.time() < end:
            time.sleep(rng.uniform(0.2, 1.0))
            action = rng.choice(["gc", "clear", "verify_fix"])
            if action == "gc":
                cache.gc(max_age_days=1 / 86400)
            elif action == "clear":
                cache.clear()
            else:
                cache.verify(fix=True)
            counts[action] += 1
    except BaseException as e:
        counts["error"] = repr(e)
    results.put(counts)


def test_fault_injection_loads_stay_true_to_their_sources(cache_root, card, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", launcher(tmp_path, "sleep 0.2"))
    monkeypatch.setenv("KERNELKIT_VERBOSE", "0")
    ctx = multiprocessing.get_context("fork")  # kernelkit and torch are imported already
    results = ctx.Queue()
    procs = [ctx.Process(target=_loader, args=(card, FAULT_SECONDS, seed, results)) for seed in range(3)]
    procs.append(ctx.Process(target=_collector, args=(FAULT_SECONDS, 99, results)))
    for p in procs:
        p.start()
    counts = [results.get(timeout=FAULT_SECONDS + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    errors = [c.pop("error") for c in counts if "error" in c]
    assert not errors, errors
    total = {k: sum(c.get(k, 0) for c in counts) for c in counts for k in c}
    print("fault injection:", total)
    assert total["wrong"] == 0, total
    assert total["loads"] >= 20 and total["edits"] >= 10 and total["refused"] + total["loads"] > 0, total
    problems = [f for f in cache.verify() if f["status"] != "ok"]
    assert not problems, problems
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER")
    header, tu = (card / "v.h").read_text(), (card / "f.cpp").read_text()
    so, _, _ = build.build(make_target(card / "f.cpp"))
    assert call_f(so) == _value(tu, header)


@pytest.mark.parametrize("days", ["-1", "nan", "inf", "thirty"])
def test_bad_gc_age_on_the_command_line_is_refused_and_removes_nothing(cache_root, card, days, capsys):
    target = _built(card)
    with pytest.raises(SystemExit) as e:
        cli.main(["cache", "gc", "--max-age-days", days])
    assert e.value.code == 2 and "--max-age-days: expected a number of days >= 0" in capsys.readouterr().err
    assert cache.verified_library(target.name, target.key) is not None


def test_a_compile_that_fails_on_a_half_written_header_is_sources_changed(cache_root, card, tmp_path, monkeypatch):
    """The compiler read the header while an edit had it empty: that is an edit during the build, not an
    error in the sources, so the load says to load again instead of showing a compiler error."""
    target = make_target(card / "f.cpp")
    # the edit (truncating the header, as an in-place write does first) lands just before the compiler reads
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", launcher(tmp_path, f"printf '' > {card / 'v.h'}"))
    with pytest.raises(SourcesChanged, match="changed while it was being compiled"):
        build.build(target)


# ------------------------------------------------------- inputs reached through flags (issue 37)
@pytest.mark.parametrize("spelling", [["-I", "{d}"], ["-I{d}"], ["-isystem", "{d}"], ["-iquote", "{d}"]], ids=" ".join)
def test_header_through_an_include_flag_edited_during_compile_is_not_cached(cache_root, tmp_path, monkeypatch,
                                                                            spelling):
    d, src = tmp_path / "inc", tmp_path / "src" / "f.cpp"
    d.mkdir()
    src.parent.mkdir()
    (d / "w.h").write_text("#define W 1\n")
    src.write_text('#include "w.h"\nextern "C" __attribute__((visibility("default"))) int f() { return W; }\n')
    flags = [f.format(d=d) for f in spelling]
    unit = units.plan_unit("cpp", src, src.read_text(), [src.parent], flags, [], src.name)
    assert d / "w.h" in unit.deps
    target = units.Target(name="f", units=[unit], ldflags=["-shared"], key=units.target_key("f", [unit], ["-shared"]),
                          with_cuda=False, pymodule=None, display={str(src): src.name}, texts={})
    monkeypatch.setenv("KERNELKIT_COMPILER_LAUNCHER", launcher(tmp_path, f"sed -i 's/W 1/W 2/' {d / 'w.h'}"))
    with pytest.raises(SourcesChanged, match="w.h changed while it was being compiled"):
        build.build(target)
    assert cache.cached_object(unit.key) is None and cache.verified_library("f", target.key) is None


def _archive(path: Path, value: int) -> None:
    c = path.with_suffix(".c")
    c.write_text(f"int g(void) {{ return {value}; }}\n")
    subprocess.run(["cc", "-fPIC", "-c", str(c), "-o", str(c.with_suffix(".o"))], check=True)
    path.unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", str(path), str(c.with_suffix(".o"))], check=True)


@pytest.mark.parametrize("when", ["after planning", "during the link"])
def test_archive_edited_after_planning_or_during_the_link_is_not_cached(cache_root, tmp_path, monkeypatch, when):
    src, archive = tmp_path / "f.cpp", tmp_path / "libg.a"
    src.write_text('extern "C" int g(void);\nextern "C" __attribute__((visibility("default"))) int f() { return g(); }\n')
    _archive(archive, 1)
    unit = units.plan_unit("cpp", src, src.read_text(), [tmp_path], [], [], src.name)
    ldflags = ["-shared", str(archive)]
    target = units.Target(name="f", units=[unit], ldflags=ldflags, key=units.target_key("f", [unit], ldflags),
                          with_cuda=False, pymodule=None, display={str(src): src.name}, texts={})
    if when == "after planning":
        _archive(archive, 2)
    else:
        real_run = running.run_tool

        def run(cmd, what, *args, **kwargs):  # the edit lands while the linker runs
            out = real_run(cmd, what, *args, **kwargs)
            if what.startswith("linking"):
                _archive(archive, 2)
            return out

        monkeypatch.setattr(running, "run_tool", run)
    with pytest.raises(SourcesChanged, match=f"libg.a\\) changed {'after planning' if when == 'after planning' else 'while'}"):
        build.build(target)
    assert cache.verified_library("f", target.key) is None
    monkeypatch.undo()
    unit = units.plan_unit("cpp", src, src.read_text(), [tmp_path], [], [], src.name)
    fresh = units.Target(name="f", units=[unit], ldflags=ldflags, key=units.target_key("f", [unit], ldflags),
                         with_cuda=False, pymodule=None, display={str(src): src.name}, texts={})
    so, cached, _ = build.build(fresh)
    assert fresh.key != target.key and not cached and call_f(so) == 2
