"""A .cu edit inside the bodies of device-only functions compiles the device code alone (``nvcc --fatbin``)
and places it into the object of the earlier text, whose host side it cannot have changed
(``keys.host_shape_key``). Proven here by comparing such an object with a full compile of the same text,
section by section; the GPU side (the edited kernel runs) is in tests/test_split_gpu.py."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import kernelkit
from kernelkit.errors import SourcesChanged
from kernelkit.jit import build, cache, keys, running, sources, syntax
from kernelkit.jit.fast import split

CORPUS = Path(__file__).parent / "fixtures" / "torch_cu"

KERNEL = """#include <cstdint>
__constant__ float c_bias[2];
__device__ float twice(float x) { return 2.0f * x; }
__host__ __device__ inline float both(float x) { return x + 1.0f; }
template <typename T>
__global__ void scale(const T* x, T* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(x[i]) + c_bias[0];
}
void launch_scale(const float* x, float* y, int64_t n, cudaStream_t s) {
    scale<float><<<(n + 255) / 256, 256, 0, s>>>(x, y, n);
}
"""


def _shape(text, flags=("-O3",), deps=(), roots=()):
    return keys.host_shape_key("cu", list(flags), [], "fp", "nvcc", text, list(deps), list(roots), "compiler")


# ------------------------------------------------------------------------------------ which edits keep it
@pytest.mark.parametrize("old, new", [
    ("return 2.0f * x;", "return 3.0f * x;"),  # a __device__ function's body
    ("y[i] = twice(x[i]) + c_bias[0];", "y[i] = twice(x[i]) * c_bias[1];"),  # a kernel's body
])
def test_an_edit_inside_a_device_only_body_keeps_the_host_shape(old, new):
    assert _shape(KERNEL) is not None
    assert _shape(KERNEL.replace(old, new)) == _shape(KERNEL)


@pytest.mark.parametrize("old, new", [
    ("return x + 1.0f;", "return x + 2.0f;"),  # __host__ __device__: the host compiles it too
    ("scale<float><<<(n + 255) / 256, 256", "scale<float><<<(n + 127) / 128, 128"),  # host code
    ("const T* x, T* y, int64_t n", "const T* x, T* y, int n"),  # a kernel's signature
    ("__constant__ float c_bias[2];", "__constant__ float c_bias[4];"),  # a device variable
    ("return 2.0f * x;", "return 2.0f *\n x;"),  # the lines after it move: host code's __LINE__ with them
    ("#include <cstdint>", "#include <cstdint>\n#define EXTRA 1"),
])
def test_any_other_edit_changes_the_host_shape(old, new):
    edited = KERNEL.replace(old, new)
    assert edited != KERNEL and _shape(edited) != _shape(KERNEL)


def test_an_edit_of_a_constexpr_device_body_changes_the_host_shape():
    """With --expt-relaxed-constexpr (torch's flags, kernelkit's) host code may call it, at run or compile time."""
    text = KERNEL.replace("__device__ float twice", "__device__ constexpr float twice")
    assert _shape(text) is not None and _shape(text.replace("2.0f * x", "3.0f * x")) != _shape(text)


def test_flags_and_headers_are_part_of_the_shape(tmp_path):
    header = tmp_path / "helpers.cuh"
    header.write_text("__device__ float h(float x) { return x; }\ninline int host_side() { return 1; }\n")
    base = _shape(KERNEL, deps=[header], roots=[tmp_path])
    header.write_text("__device__ float h(float x) { return -x; }\ninline int host_side() { return 1; }\n")
    assert _shape(KERNEL, deps=[header], roots=[tmp_path]) == base  # a device body in a local header
    header.write_text("__device__ float h(float x) { return -x; }\ninline int host_side() { return 2; }\n")
    assert _shape(KERNEL, deps=[header], roots=[tmp_path]) != base
    assert _shape(KERNEL, flags=("-O2",)) != _shape(KERNEL)


def test_a_header_that_defines_kk_math_fn_takes_the_shape_away(tmp_path):
    """A local header may make KK_MATH_FN host code too; then the TU's KK_MATH_FN bodies are not device-only."""
    tu = "#include \"m.h\"\nstruct Op { KK_MATH_FN float operator()(float x) const { return x; } };\n"
    header = tmp_path / "m.h"
    header.write_text("#pragma once\n")
    assert _shape(tu, deps=[header], roots=[tmp_path]) is not None
    header.write_text("#define KK_MATH_FN __host__ __device__\n")
    assert _shape(tu, deps=[header], roots=[tmp_path]) is None
    header.write_text("#undef KK_MATH_FN\n#define KK_MATH_FN inline\n")
    assert _shape(tu, deps=[header], roots=[tmp_path]) is None


def test_kernelkits_own_headers_count_whole_and_declare_no_device_variable_template(tmp_path):
    """They are beyond the grammar as written (their qualifier macros), so a shape takes them whole; that is
    right only while none declares a device variable template (a body's use of one registers it on the host
    side), which their text with the macros expanded shows."""
    own = sorted(p for p in sources.INCLUDE.rglob("*") if p.is_file())
    assert len(own) >= 8
    for header in own:
        text = header.read_text()
        for macro, expansion in (("KK_HD", "__host__ __device__ __forceinline__"),
                                 ("KK_DEVICE", "__device__ __forceinline__"), ("KK_MATH_FN", "__device__")):
            text = text.replace(macro, expansion)
        assert syntax.device_only_bodies(text) is not None, header
    assert _shape(KERNEL, deps=own) is not None and _shape(KERNEL, deps=own) != _shape(KERNEL)
    theirs = tmp_path / "theirs.cuh"
    theirs.write_text((sources.INCLUDE / "kernelkit" / "dtype.cuh").read_text())
    assert _shape(KERNEL, deps=[theirs], roots=[tmp_path]) is None  # the same text elsewhere: not trusted


@pytest.mark.parametrize("flags", [["-rdc=true"], ["-dc"], ["--relocatable-device-code", "true"]])
def test_relocatable_device_code_has_no_shape(flags):
    assert _shape(KERNEL, flags=flags) is None


@pytest.mark.parametrize("text, bodies", [
    ("__global__ void k(float* y) {\n#pragma unroll\n for (int i = 0; i < 4; ++i) y[i] = 0; }", 1),
    ("__global__ void k() {\n#define LEAKS 1\n}", 0),  # a #define in a body reaches past it
    ("__global__ void k() {\n#if 1\n#endif\n}", 0),
    ("#define CLOSE }\n__global__ void k() { CLOSE; }", 0),  # a macro that may end the body
    ("__device__ auto f(float x) { return x; }", 0),  # the body decides a type host code may use
    ("__device__ auto f(float x) -> float { return x; }", 1),
    ("namespace { __device__ __forceinline__ float f(float x) { return x; } }", 1),
    ("struct S { __device__ float d() const { return 1.f; } float h() const { return 2.f; } };", 1),
    ("static __global__ void __launch_bounds__(256) k(float* y) { y[0] = 1; }", 1),
    ("__device__ constexpr int f() { return 3; }", 0),  # host code may call it (--expt-relaxed-constexpr)
    ("constexpr __device__ int f() { return 3; }", 0),
    ("template <typename A> struct Op { KK_MATH_FN A operator()(A x) const { return x * x; } };", 1),
    ("// KK_MATH_FN in a comment\n__device__ float f(float x) { return x; }", 1),
])
def test_device_only_bodies(text, bodies):
    assert len(syntax.device_only_bodies(text)) == bodies


@pytest.mark.parametrize("text", [
    "template <typename T> __device__ T table[4];\n__global__ void k(float* y) { y[0] = table<float>[0]; }",
    "__global__ void k( { }\nvoid host() {}",  # the grammar's recovery could take host code for a body
    # KK_MATH_FN is __device__ only as kernelkit defines it
    "#define KK_MATH_FN __host__ __device__\nstruct Op { KK_MATH_FN float operator()(float x) const { return x; } };",
    "#undef KK_MATH_FN\nstruct Op { KK_MATH_FN float operator()(float x) const { return x; } };",
])
def test_no_shape_where_a_body_may_reach_the_host_side(text):
    assert syntax.device_only_bodies(text) is None


# ------------------------------------------------------------------------ the object, against a full compile
def _nvcc(*args):
    subprocess.run([build.toolchain.nvcc(), *args], check=True, capture_output=True, text=True)


def _sections(obj: Path, tmp: Path):
    """Every section's bytes but the symbol and string tables (whose names include nvcc's temp file names),
    and the symbols' names, types and sections without nvcc's per-run file symbol."""
    listing = subprocess.run(["readelf", "-SW", str(obj)], capture_output=True, text=True, check=True).stdout
    rows = [line.split("]", 1)[1].split() for line in listing.splitlines()
            if line.strip().startswith("[") and not line.strip().startswith("[Nr]")]
    out = {}
    for name, kind, _address, _offset, size, *_ in rows:
        if name in (".symtab", ".strtab", ".shstrtab") or name.startswith(".note") or name == ".comment":
            continue
        dump = tmp / "section.bin"
        dump.unlink(missing_ok=True)
        subprocess.run(["objcopy", "--dump-section", f"{name}={dump}", str(obj), str(tmp / "scratch.o")],
                       check=True, capture_output=True)
        out[name] = (kind, int(size, 16), dump.read_bytes() if dump.exists() else None)  # NOBITS: no bytes
    symbols = subprocess.run(["readelf", "-sW", str(obj)], capture_output=True, text=True, check=True).stdout
    out["symbols"] = sorted(" ".join(line.split()[3:]) for line in symbols.splitlines()
                            if line.split()[:1] and line.split()[0].rstrip(":").isdigit() and " FILE " not in line)
    return out


def _device_tus():
    """The device TUs the split writes for the corpus files whose kernels are no templates (those need the
    host object to say what to instantiate) and that have a host shape (hd_macro.cu's qualifier macro is
    beyond the grammar: no shape, always compiled whole)."""
    out = []
    for path in sorted(CORPUS.glob("*.cu")):
        result = split.split_source(path.read_text(), str(path), split.local_headers([CORPUS]))
        if isinstance(result, split.Split) and not result.templated:
            text = split.device_text(result, None)
            if syntax.device_only_bodies(text):
                out.append(pytest.param(text, id=path.stem))
    return out


def _torch_includes():
    """The split's device prelude reads c10's macros, as the split's own device compile finds them."""
    from torch.utils.cpp_extension import include_paths

    return [f"-I{p}" for p in include_paths()]


def _edited(text: str) -> str:
    """``text`` with a statement added at the start of its first kernel's body, on the same line."""
    raw = text.encode()
    kernels = [s for s, _ in syntax.device_only_bodies(text) if b"__global__" in raw[max(0, s - 400):s]]
    at = kernels[0] + 1
    return (raw[:at] + b' if (threadIdx.x == 7777u) asm volatile("trap;");' + raw[at:]).decode()


@pytest.mark.cuda_build
@pytest.mark.parametrize("device_tu", [pytest.param(KERNEL, id="templated-kernel"), *_device_tus()])
def test_swapped_device_code_gives_the_object_a_full_compile_gives(device_tu, tmp_path):
    edited = _edited(device_tu)
    assert _shape(edited) == _shape(device_tu) is not None
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", "-Xcompiler", "-fPIC",
             "-gencode", "arch=compute_90,code=sm_90", f"-I{CORPUS}", *_torch_includes()]
    for name, text in (("old", device_tu), ("new", edited)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "k.device.cu").write_text(text)
    _nvcc(*flags, "-c", str(tmp_path / "old" / "k.device.cu"), "-o", str(tmp_path / "old.o"))
    _nvcc(*flags, "-c", str(tmp_path / "new" / "k.device.cu"), "-o", str(tmp_path / "full.o"))
    _nvcc(*flags, "--fatbin", str(tmp_path / "new" / "k.device.cu"), "-o", str(tmp_path / "new.fatbin"))
    shutil.copyfile(tmp_path / "old.o", tmp_path / "swapped.o")
    subprocess.run(["objcopy", "--update-section", f".nv_fatbin={tmp_path / 'new.fatbin'}", str(tmp_path / "swapped.o")],
                   check=True)
    full, swapped, old = (_sections(tmp_path / f"{n}.o", tmp_path) for n in ("full", "swapped", "old"))
    assert full[".nv_fatbin"][2] != old[".nv_fatbin"][2]  # the edit reached the device code: the check is not idle
    assert swapped == full


@pytest.mark.cuda_build
def test_a_card_math_edit_swapped_in_gives_the_object_a_full_compile_gives(tmp_path):
    """``kernelkit new``'s layout: the .cu instantiates kernelkit's launchers over the functors of <card>_math.h
    (KK_MATH_FN). After an edit of a functor's body the .cu keeps its host shape, and its old object with the new
    device code is, section for section, what nvcc gives compiling the edited card whole."""
    from kernelkit.frontends import scaffold

    files = scaffold.card_files("kk_swap", "unary", backward=True)
    flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", "-Xcompiler", "-fPIC",
             "-gencode", "arch=compute_90,code=sm_90", f"-I{sources.INCLUDE}"]
    texts = {"old": files["kk_swap_math.h"],
             "new": files["kk_swap_math.h"].replace("return x * x; }", "return x * x + A(3); }")}
    shapes = {}
    for name, math in texts.items():
        d = tmp_path / name
        d.mkdir()
        (d / "kk_swap_math.h").write_text(math)
        (d / "kk_swap.cu").write_text(files["kk_swap.cu"])
        own = sorted(p for p in (sources.INCLUDE / "kernelkit").iterdir())
        shapes[name] = _shape(files["kk_swap.cu"], flags=flags, deps=[d / "kk_swap_math.h", *own], roots=[d])
        _nvcc(*flags, f"-I{d}", "-c", str(d / "kk_swap.cu"), "-o", str(tmp_path / f"{name}.o"))
    assert shapes["old"] == shapes["new"] is not None
    new = tmp_path / "new"
    _nvcc(*flags, f"-I{new}", "--fatbin", str(new / "kk_swap.cu"), "-o", str(tmp_path / "new.fatbin"))
    shutil.copyfile(tmp_path / "old.o", tmp_path / "swapped.o")
    subprocess.run(["objcopy", "--update-section", f".nv_fatbin={tmp_path / 'new.fatbin'}", str(tmp_path / "swapped.o")],
                   check=True)
    full, swapped, old = (_sections(tmp_path / f"{n}.o", tmp_path) for n in ("new", "swapped", "old"))
    assert full[".nv_fatbin"][2] != old[".nv_fatbin"][2]  # the edit reached the device code: the check is not idle
    for sections in (full, swapped):  # nvcc numbers the device names of static header functions anew each run
        kind, size, data = sections[".nv_fatbin"]
        sections[".nv_fatbin"] = (kind, size, _INTERNAL_RUN.sub(lambda m: m.group(1) + b"0" * len(m.group(2)), data))
    assert swapped == full


_INTERNAL_RUN = re.compile(rb"(_INTERNAL_[0-9a-f]{8}_\d+_\w+?_[0-9a-f]{8}_)(\d{4,5})(?=\d)")


# ------------------------------------------------------------------------------------ through the loader
def _load(path: Path, capsys):
    before = dict(running.STATS)
    info = kernelkit.load("kk_device_rebuild", [str(path)], load=False, arch="9.0", is_python_module=False)
    capsys.readouterr()
    return info, {k: running.STATS[k] - before[k] for k in ("compiles", "device_rebuilds")}


@pytest.mark.cuda_build
def test_the_loader_rebuilds_device_code_only_where_the_shape_matches(tmp_path, capsys):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    cold, counts = _load(src, capsys)
    assert counts == {"compiles": 1, "device_rebuilds": 0}
    src.write_text(KERNEL.replace("2.0f * x", "4.0f * x"))
    edited, counts = _load(src, capsys)
    assert edited.key != cold.key and counts == {"compiles": 1, "device_rebuilds": 1}
    src.write_text(KERNEL.replace("x + 1.0f", "x + 4.0f"))  # a __host__ __device__ body: compiled whole
    _, counts = _load(src, capsys)
    assert counts == {"compiles": 1, "device_rebuilds": 0}


@pytest.mark.cuda_build
def test_device_rebuilds_can_be_turned_off(tmp_path, capsys, monkeypatch):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    _load(src, capsys)
    monkeypatch.setenv("KERNELKIT_DEVICE_REBUILD", "0")
    src.write_text(KERNEL.replace("2.0f * x", "6.0f * x"))
    _, counts = _load(src, capsys)
    assert counts == {"compiles": 1, "device_rebuilds": 0}


@pytest.mark.cuda_build
def test_a_record_naming_an_object_of_another_shape_is_not_used(tmp_path, capsys):
    base = KERNEL.replace("2.0f * x", "11.0f * x")  # a text no other test built: its record is the newest
    src = tmp_path / "k.cu"
    src.write_text(base)
    _load(src, capsys)
    records = sorted((cache.cache_dir() / "shapes").iterdir(), key=lambda p: p.stat().st_mtime)
    record = records[-1]
    other = tmp_path / "other.cu"
    other.write_text("__global__ void other_shape(float* y) { y[0] = 1; }\n")
    _load(other, capsys)
    other_key = sorted((cache.cache_dir() / "shapes").iterdir(), key=lambda p: p.stat().st_mtime)[-1].read_text()
    meta = json.loads(cache.object_path(other_key).with_suffix(".json").read_text())
    assert meta["shape"] != record.name
    record.write_text(other_key)  # points at an intact object of another shape
    src.write_text(KERNEL.replace("2.0f * x", "12.0f * x"))
    _, counts = _load(src, capsys)
    assert counts == {"compiles": 1, "device_rebuilds": 0}


@pytest.mark.cuda_build
def test_an_edit_during_a_device_only_rebuild_is_not_cached(tmp_path, capsys, monkeypatch):
    """The file changes while nvcc --fatbin runs: nothing is cached under either text's key, and the next load
    builds what is on disk."""
    base = KERNEL.replace("2.0f * x", "9.0f * x")  # a text no other test built: compiled here, its shape recorded
    src = tmp_path / "k.cu"
    src.write_text(base)
    _load(src, capsys)
    real = running.run_tool

    def edit_while_compiling(cmd, what, target, counter):
        out = real(cmd, what, target, counter)
        if "--fatbin" in cmd:
            src.write_text(KERNEL.replace("2.0f * x", "8.0f * x"))
        return out

    monkeypatch.setattr(running, "run_tool", edit_while_compiling)
    src.write_text(KERNEL.replace("2.0f * x", "7.0f * x"))
    with pytest.raises(SourcesChanged, match="changed while it was being compiled"):
        _load(src, capsys)
    monkeypatch.undo()
    info, counts = _load(src, capsys)
    assert counts == {"compiles": 1, "device_rebuilds": 1} and info.path.is_file()
