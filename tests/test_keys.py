"""Every input in the cache key (issue 37): headers reached through every spelling of every include flag,
forced includes, macro includes, linked archives; the keys module itself; object metadata that carries its
key; a FIFO in the cache; nvcc's shell.

The differential test builds small torch-free C++ libraries the torch way (``plan.plan_extension``, the
flags torch passes) and calls them with ctypes, so it runs on CPU: each exported function returns the
constant one input provides, and after every edit of any input every load must return the new constants,
in this process and in a new one."""
import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_fault_storm import _enter, _env, _in_child  # forkserver children, made as the storm makes them

import kernelkit
from kernelkit.errors import KernelkitError, SourcesChanged
from kernelkit.frontends import cli
from kernelkit.jit import build, cache, keys, plan, sources, toolchain, units


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER", raising=False)
    return cache.cache_dir()


# ---------------------------------------------------------------------------- a project with every input
# kind -> (file under the project, the flags that reach it, how the TU includes it)
HEADERS = {
    "local": ("src/local.h", [], '#include "local.h"'),
    "I_separate": ("i_sep/i_sep.h", ["-I", "{p}/i_sep"], "#include <i_sep.h>"),
    "nested": ("i_sep/i_nested.h", [], ""),  # included by i_sep.h as "i_nested.h"
    "I_joined": ("i_joined/i_joined.h", ["-I{p}/i_joined"], "#include <i_joined.h>"),
    "isystem_separate": ("s_sep/s_sep.h", ["-isystem", "{p}/s_sep"], "#include <s_sep.h>"),
    "isystem_joined": ("s_joined/s_joined.h", ["-isystem{p}/s_joined"], "#include <s_joined.h>"),
    "idirafter": ("after/after.h", ["-idirafter", "{p}/after"], "#include <after.h>"),
    "iquote": ("quote/quote.h", ["-iquote", "{p}/quote"], '#include "quote.h"'),
    "include": ("forced/forced.h", ["-include", "{p}/forced/forced.h"], ""),
    "imacros": ("macros/macros.h", ["-imacros", "{p}/macros/macros.h"], ""),
}
# kind -> (archive under the project, the link flags that name it, the function it defines)
ARCHIVES = {"archive": ("lib/libv.a", ["{p}/lib/libv.a"], "lib_v"),
            "l_with_L": ("libw/libw.a", ["-L", "{p}/libw", "-lw"], "lib_w")}
KINDS = [*HEADERS, *ARCHIVES]


def _symbol(kind: str) -> str:
    return f"V_{kind.upper()}"


def _write_header(proj: Path, kind: str, value: int) -> None:
    path = proj / HEADERS[kind][0]
    path.parent.mkdir(parents=True, exist_ok=True)
    inner = '#include "i_nested.h"\n' if kind == "I_separate" else ""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{inner}#define {_symbol(kind)} {value}\n")
    os.replace(tmp, path)


def _write_archive(proj: Path, kind: str, value: int) -> None:
    rel, _, fn = ARCHIVES[kind]
    path = proj / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    c = path.with_suffix(".c")
    c.write_text(f"int {fn}(void) {{ return {value}; }}\n")
    obj, tmp = c.with_suffix(".o"), path.with_name(f".{path.name}.tmp")
    subprocess.run(["cc", "-fPIC", "-c", str(c), "-o", str(obj)], check=True)
    tmp.unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", str(tmp), str(obj)], check=True)
    os.replace(tmp, path)


def _write(proj: Path, kind: str, value: int) -> None:
    (_write_header if kind in HEADERS else _write_archive)(proj, kind, value)


def _project(root: Path) -> Path:
    proj = root / "proj"
    (proj / "src").mkdir(parents=True)
    body = [inc for _, _, inc in HEADERS.values() if inc]
    body += [f'extern "C" int {fn}(void);' for _, _, fn in ARCHIVES.values()]
    body += [f'extern "C" int get_{k}() {{ return {_symbol(k)}; }}' for k in HEADERS]
    body += [f'extern "C" int get_{k}() {{ return {fn}(); }}' for k, (_, _, fn) in ARCHIVES.items()]
    (proj / "src" / "f.cpp").write_text("\n".join(body) + "\n")
    (proj / "src" / "m.cpp").write_text('#define MACRO_HEADER "m.h"\n#include MACRO_HEADER\n'
                                        'extern "C" int get_m() { return V_M; }\n')
    (proj / "src" / "m.h").write_text("#define V_M 1\n")
    for k in KINDS:
        _write(proj, k, 1)
    return proj


def _flags(proj: Path):
    cflags = [f.format(p=proj) for _, flags, _ in HEADERS.values() for f in flags]
    ldflags = [f.format(p=proj) for _, flags, _ in ARCHIVES.values() for f in flags]
    return cflags, ldflags


def _load(proj: Path, tu: str = "f.cpp"):
    cflags, ldflags = _flags(proj)
    target = plan.plan_extension(tu.split(".")[0], [proj / "src" / tu], extra_cflags=cflags, extra_ldflags=ldflags,
                                 is_python_module=False)
    so, _, _ = build.build(target)
    return target, ctypes.CDLL(str(so))


def _values(proj: Path) -> dict:
    _, lib = _load(proj)
    values = {k: getattr(lib, f"get_{k}")() for k in KINDS}
    try:
        _, m = _load(proj, "m.cpp")
        values["macro"] = m.get_m()
    except SourcesChanged as e:
        values["macro"] = "refused" if "include scan did not find" in str(e) else str(e)
    return values


def _values_in_child(env: dict, proj: str) -> dict:
    _enter(env)
    return _values(Path(proj))


def test_every_input_edited_is_loaded_in_process_and_in_a_new_process(cache_root, tmp_path):
    proj = _project(tmp_path)
    expected = {**{k: 1 for k in KINDS}, "macro": 1}
    stale = []
    for round_, kind in enumerate(["none", *KINDS, "macro"]):
        if kind == "macro":
            (proj / "src" / "m.h").write_text("#define V_M 2\n")
            expected["macro"] = 2
        elif kind != "none":
            expected[kind] = 10 + round_
            _write(proj, kind, expected[kind])
        here = _values(proj)
        there = _in_child(_values_in_child, _env(KERNELKIT_CACHE_DIR=str(cache_root.parent)), str(proj))
        stale += [(kind, where, got) for where, got in (("in process", here), ("new process", there))
                  if got != expected]
    assert not stale, stale  # 0 stale results: every edit of every input is seen, a header a macro names too
    assert all(f["status"] == "ok" for f in cache.verify())


@pytest.mark.usefixtures("cache_root")
def test_torch_style_one_token_include_dir_loads_through_the_front_door(tmp_path):
    """torch's usual spelling f"-I{cutlass}/include" made every load raise SourcesChanged."""
    inc, src = tmp_path / "cutlass" / "include", tmp_path / "k.cpp"
    inc.mkdir(parents=True)
    (inc / "hdr6.h").write_text("#define KVAL 3\n")
    src.write_text('#include <hdr6.h>\nextern "C" int kval() { return KVAL; }\n')
    got = []
    for value in (3, 4):
        (inc / "hdr6.h").write_text(f"#define KVAL {value}\n")
        so = kernelkit.load("hdr6", sources=[str(src)], extra_cflags=[f"-I{inc}"], is_python_module=False)
        got.append(ctypes.CDLL(str(so)).kval())
    assert got == [3, 4]


# ------------------------------------------------------------------------------- keys, without compiling
def _unit(kind: str, tmp_path: Path, flags, text: str):
    src = tmp_path / ("k.cu" if kind == "cu" else "k.cpp")
    src.write_text(text)
    return units.plan_unit(kind, src, text, [], flags, toolchain.arch_list("9.0") if kind == "cu" else [], src.name,
                           torch_style=True)


CXX_SPELLINGS = [["-I", "{d}"], ["-I{d}"], ["-isystem", "{d}"], ["-isystem{d}"], ["-idirafter", "{d}"],
                 ["-idirafter{d}"], ["-iquote", "{d}"], ["-iquote{d}"]]
NVCC_SPELLINGS = [["-I", "{d}"], ["-I{d}"], ["--include-path", "{d}"], ["--include-path={d}"], ["-I", "/nonexistent,{d}"],
                  ["-isystem", "{d}"], ["--system-include={d}"], ["-Xcompiler", "-I{d}"], ["-Xcompiler=-isystem,{d}"],
                  ["--compiler-options", "-iquote,{d}"]]
CXX_FORCED = [["-include", "{h}"], ["-include{h}"], ["-imacros", "{h}"], ["-imacros{h}"]]
NVCC_FORCED = [["-include", "{h}"], ["--pre-include", "{h}"], ["--pre-include={h}"], ["-Xcompiler", "-include,{h}"]]


def _key_follows_the_header(kind: str, tmp_path: Path, spelling, include: str) -> None:
    d = tmp_path / "dir with space"
    d.mkdir()
    h = d / "kval.h"
    h.write_text("#define KVAL 3\n")
    flags = [f.format(d=d, h=h) for f in spelling]
    before = _unit(kind, tmp_path, flags, include + "int k() { return KVAL; }\n")
    assert h in before.deps
    h.write_text("#define KVAL 4\n")
    after = _unit(kind, tmp_path, flags, include + "int k() { return KVAL; }\n")
    assert after.key != before.key and after.digest != before.digest


@pytest.mark.parametrize("spelling", CXX_SPELLINGS, ids=" ".join)
@pytest.mark.usefixtures("cache_root")
def test_header_through_each_gcc_include_flag_is_in_the_key(tmp_path, spelling):
    _key_follows_the_header("cpp", tmp_path, spelling, '#include "kval.h"\n' if "iquote" in spelling[0] else
                            "#include <kval.h>\n")


@pytest.mark.parametrize("spelling", CXX_FORCED, ids=" ".join)
@pytest.mark.usefixtures("cache_root")
def test_forced_include_is_in_the_key(tmp_path, spelling):
    _key_follows_the_header("cpp", tmp_path, spelling, "")


@pytest.mark.cuda_build
@pytest.mark.parametrize("spelling", NVCC_SPELLINGS + NVCC_FORCED, ids=" ".join)
@pytest.mark.usefixtures("cache_root")
def test_header_through_each_nvcc_include_flag_is_in_the_key(tmp_path, spelling):
    forced = spelling in NVCC_FORCED
    quote = any("iquote" in f for f in spelling)
    _key_follows_the_header("cu", tmp_path, spelling, "" if forced else '#include "kval.h"\n' if quote else
                            "#include <kval.h>\n")


def test_include_search_order_and_what_stays_out(tmp_path, monkeypatch):
    dirs = {n: tmp_path / n for n in ("a", "b", "c", "q", "env")}
    for d in dirs.values():
        d.mkdir()
    monkeypatch.setenv("CPATH", str(dirs["env"]))
    torch_inc = toolchain.torch_include_paths(False)[0]
    flags = ["-isystem", str(dirs["c"]), f"-I{dirs['a']}", "-I", str(dirs["b"]), "-iquote", str(dirs["q"]),
             "-isystem", torch_inc, "-I", str(tmp_path / "missing"), "-include", "x.h", "-O2"]
    search = sources.include_search(flags, False, keys.toolchain_dirs())
    # the compiler's order: -I, CPATH, -isystem; torch's dirs (the fingerprint covers them) and missing ones out
    assert search.angle == (dirs["a"], dirs["b"], dirs["env"], dirs["c"])
    assert search.quote == (dirs["q"],) and search.forced == ("x.h",)
    monkeypatch.delenv("CPATH")
    assert sources.include_search(["-I", f"{dirs['a']},{dirs['b']}"], True).angle == (dirs["a"], dirs["b"])
    assert sources.include_search(["-I", f"{dirs['a']},{dirs['b']}"], False).angle == ()  # gcc: one odd name


def test_resolved_names_are_what_pathlib_resolves(tmp_path, monkeypatch):
    """The compiler's dependency lists are resolved a directory at a time: links in a directory, in the file
    name itself, ``..`` after a link, relative names and missing files must come out as pathlib's resolve."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    for f in ("real/sub/a.h", "real/b.h", "elsewhere.h"):
        (tmp_path / f).write_text("")
    (tmp_path / "lnk").symlink_to("real")
    (tmp_path / "real" / "to_a.h").symlink_to("sub/a.h")
    (tmp_path / "real" / "sub" / "out.h").symlink_to(tmp_path / "elsewhere.h")
    monkeypatch.chdir(tmp_path)
    names = ["lnk/sub/a.h", "lnk/to_a.h", "lnk/sub/out.h", "lnk/sub/../b.h", "b.h", "lnk/missing.h",
             f"{tmp_path}/./lnk//sub/a.h", "lnk/sub/", "lnk/..", "lnk/sub/a.h"]
    assert sources.resolved(names) == [Path(n).resolve() for n in names]
    assert sources.resolved(["lnk/sub/out.h"]) == [tmp_path / "elsewhere.h"]


@pytest.mark.usefixtures("cache_root")
def test_two_headers_of_one_name_are_told_apart_by_where_they_are(tmp_path):
    """The key named headers by file name only: swapping the contents of a/x.h and b/x.h kept the key."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    text = '#include "a/x.h"\n#include "b/x.h"\n'
    (tmp_path / "a" / "x.h").write_text("#define A 1\n")
    (tmp_path / "b" / "x.h").write_text("#define B 2\n")
    before = _unit("cpp", tmp_path, [], text).key
    (tmp_path / "a" / "x.h").write_text("#define B 2\n")
    (tmp_path / "b" / "x.h").write_text("#define A 1\n")
    assert _unit("cpp", tmp_path, [], text).key != before


def test_link_inputs_every_spelling_and_toolchain_libraries_left_out(tmp_path):
    (tmp_path / "L").mkdir()
    files = {n: tmp_path / n for n in ("a.a", "o.o", "s.so", "L/libw.a", "L/exact.a", "wl.a")}
    for f in files.values():
        f.write_bytes(b"x")
    torch_lib = toolchain.torch_library_paths(False)[0]
    ldflags = ["-shared", str(files["a.a"]), str(files["o.o"]), str(files["s.so"]), f"-L{torch_lib}", "-lc10",
               "-L", str(tmp_path / "L"), "-lw", "-l:exact.a", f"-Wl,--whole-archive,{files['wl.a']},--no-whole-archive",
               f"-Wl,-rpath,{tmp_path}", "-lnothere"]
    found = sources.link_inputs(ldflags, keys.toolchain_dirs())
    assert found == [files[n].resolve() for n in ("a.a", "o.o", "s.so", "L/libw.a", "L/exact.a", "wl.a")]


@pytest.mark.usefixtures("cache_root")
def test_archive_in_extra_ldflags_is_in_the_target_key(tmp_path):
    archive = tmp_path / "libv.a"
    archive.write_bytes(b"!<arch>\nfirst")
    key = units.target_key("t", [], ["-shared", str(archive)])
    archive.write_bytes(b"!<arch>\nsecond")
    assert units.target_key("t", [], ["-shared", str(archive)]) != key


def test_keys_module_imports_nothing_heavy():
    code = ("import sys; import kernelkit.jit.keys; "
            "heavy = [m for m in ('torch', 'kernelkit.jit.toolchain', 'kernelkit.jit.build') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_one_schema_version_in_every_key():
    """Each derivation starts from keys.SCHEMA: bumping it changes every key."""
    import kernelkit.jit.keys as k

    derived = [k.unit_key("cpp", ["-O2"], [], "d", "fp", ""), k.target_key("t", "fp", [], ["u"], []),
               k.pch_key("fp", [], [], "d"), k.program_key((13, 0), "90", "inc", [], [], "text", []),
               k.nvrtc_facts_key("prefix", []), k.source_key("t", ["fp"], [], [], []),
               k.launcher_record_key(b"src", "3.11", "prefix", "2.11", "0.1"),
               k.host_shape_key("cu", [], [], "fp", "nvcc", "int x;", [], [], "compiler")]
    original = k.SCHEMA
    try:
        k.SCHEMA = "kernelkit-keys-test"
        again = [k.unit_key("cpp", ["-O2"], [], "d", "fp", ""), k.target_key("t", "fp", [], ["u"], []),
                 k.pch_key("fp", [], [], "d"), k.program_key((13, 0), "90", "inc", [], [], "text", []),
                 k.nvrtc_facts_key("prefix", []), k.source_key("t", ["fp"], [], [], []),
                 k.launcher_record_key(b"src", "3.11", "prefix", "2.11", "0.1"),
                 k.host_shape_key("cu", [], [], "fp", "nvcc", "int x;", [], [], "compiler")]
    finally:
        k.SCHEMA = original
    assert all(a != b for a, b in zip(derived, again))
    assert len(set(derived)) == len(derived)


# ------------------------------------------------------------------------------- the cache's own entries
def _tiny(tmp_path: Path, name: str, value: int) -> units.Target:
    d = tmp_path / name
    d.mkdir()
    src = d / "f.cpp"
    src.write_text(f'extern "C" __attribute__((visibility("default"))) int f() {{ return {value}; }}\n')
    return plan.plan_extension(name, [src], is_python_module=False)


@pytest.mark.usefixtures("cache_root")
def test_object_swapped_over_another_keys_is_detected(tmp_path):
    one, two = _tiny(tmp_path, "one", 1), _tiny(tmp_path, "two", 2)
    build.build(one)
    build.build(two)
    k1, k2 = one.units[0].key, two.units[0].key
    for suffix in (".o", ".json"):  # object and metadata, copied together: both sha256s still match
        cache.object_path(k2).with_suffix(suffix).write_bytes(cache.object_path(k1).with_suffix(suffix).read_bytes())
    found = {f["entry"]: f for f in cache.verify()}
    assert found[f"obj/{k2}.o"]["status"] == "corrupt" and "another key" in found[f"obj/{k2}.o"]["reason"]
    assert found[f"obj/{k1}.o"]["status"] == "ok"
    assert cache.cached_object(k2) is None and not cache.object_path(k2).exists()  # removed: rebuilt next time
    assert json.loads(cache.object_path(k1).with_suffix(".json").read_text())["key"] == k1


def _no_hang(seconds: int = 20):
    def hung(*_):
        raise TimeoutError("hung on a FIFO")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)


@pytest.mark.parametrize("what", ["so", "manifest", "object-meta"])
@pytest.mark.usefixtures("cache_root")
def test_fifo_in_the_cache_is_reported_and_removed_never_read(tmp_path, capsys, what):
    target = _tiny(tmp_path, "fifo", 5)
    so, _, _ = build.build(target)
    entry = cache.library_dir(target.name, target.key)
    path = {"so": so, "manifest": entry / "manifest.json",
            "object-meta": cache.object_path(target.units[0].key).with_suffix(".json")}[what]
    path.unlink()
    os.mkfifo(path, 0o600)
    _no_hang()
    try:
        assert cli.main(["cache", "verify"]) == 1
        assert "corrupt" in capsys.readouterr().out
        so, cached, _ = build.build(target)  # the entry with a FIFO is removed and built again
        assert cached == (what == "object-meta") and ctypes.CDLL(str(so)).f() == 5
        assert (cache.cached_object(target.units[0].key) is None) == (what == "object-meta")
        assert cli.main(["cache", "verify", "--fix"]) == 0
        assert all(f["status"] == "ok" for f in cache.verify())
    finally:
        signal.alarm(0)


def test_sha256_file_refuses_a_fifo_at_once(tmp_path):
    os.mkfifo(tmp_path / "p")
    _no_hang(10)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            sources.sha256_file(tmp_path / "p")
    finally:
        signal.alarm(0)


# --------------------------------------------------------------------------------------- nvcc's shell
@pytest.mark.cuda_build
@pytest.mark.parametrize("flag", ["-DX=$(touch /tmp/kernelkit-pwned)", "-DX=`id`", "-DX=$HOME"])
@pytest.mark.usefixtures("cache_root")
def test_nvcc_flag_a_shell_would_expand_is_refused(tmp_path, flag):
    with pytest.raises(KernelkitError, match=r"contains '[$`]', which the shell nvcc runs its steps through") as e:
        _unit("cu", tmp_path, [flag], "__global__ void k() {}\n")
    assert flag in str(e.value) and "\n" not in str(e.value)


@pytest.mark.cuda_build
@pytest.mark.usefixtures("cache_root")
def test_nvcc_source_path_a_shell_would_expand_is_refused(tmp_path):
    d = tmp_path / "$(id)"
    d.mkdir()
    with pytest.raises(KernelkitError, match=r"\$\(id\).*contains '\$'"):
        _unit("cu", d, [], "__global__ void k() {}\n")


@pytest.mark.usefixtures("cache_root")
def test_gcc_flags_are_not_refused(tmp_path):
    """g++ is run without a shell: a '$' in a -D value reaches it as written."""
    unit = _unit("cpp", tmp_path, ["-DX=$HOME"], "int k();\n")
    assert "-DX=$HOME" in unit.flags


# ------------------------------------------------------------------------- the repro, with nvcc
@pytest.mark.cuda_build
@pytest.mark.usefixtures("cache_root")
def test_cuda_header_through_two_token_include_flag_rebuilds(tmp_path):
    """load_inline(cuda=src, extra_cuda_cflags=['-I', d]) with <cutlass/cutlass.h> defining KVAL: an edit was
    a cache hit, and a fresh cache built the new value under the same key."""
    d = tmp_path / "cutlass_root"
    (d / "cutlass").mkdir(parents=True)
    header = d / "cutlass" / "cutlass.h"
    src = textwrap.dedent("""\
        #include <cutlass/cutlass.h>
        __global__ void k(int* x) { x[0] = KVAL; }
        extern "C" int kval() { return KVAL; }
        """)
    results = []
    for value in (3, 4):
        header.write_text(f"#define KVAL {value}\n")
        target = plan.plan_inline("cutl2", src, None, {}, "9.0", [], ["-I", str(d)], [], [])
        so, cached, _ = build.build(target)
        results.append((target.key, cached))
    assert results[0][0] != results[1][0] and not results[1][1]


def test_torch_is_judged_from_the_branches_a_compile_may_take(tmp_path):
    """A card's .cu includes its header, whose torch-facing part sits under #ifdef KERNELKIT_BINDING: that .cu does
    not include torch (no torch flags, no advice about torch's headers) unless a flag or its code defines the
    switch; every branch's headers stay in the key."""
    from kernelkit.jit import sources

    (tmp_path / "card.h").write_text("#pragma once\n#ifdef KERNELKIT_BINDING\n#include <torch/library.h>\n"
                                     "#include \"glue.h\"\n#endif\n")
    (tmp_path / "glue.h").write_text("#include <ATen/ATen.h>\n")
    cu = '#include "card.h"\n__global__ void k() {}\n'
    deps, torch_ = sources.scan_includes(cu, tmp_path, [])
    assert not torch_ and {d.name for d in deps} == {"card.h", "glue.h"}
    assert sources.scan_includes(cu, tmp_path, [], flags=["-DKERNELKIT_BINDING"])[1]
    assert sources.scan_includes("#define KERNELKIT_BINDING 1\n" + cu, tmp_path, [])[1]
    # a branch the grammar cannot read (the directive inside code that failed to parse): counted
    (tmp_path / "odd.h").write_text("int f( {\n#ifdef KERNELKIT_BINDING\n#include <ATen/ATen.h>\n#endif\n")
    assert sources.scan_includes('#include "odd.h"\n', tmp_path, [])[1]
