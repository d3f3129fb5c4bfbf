"""Torch-including .cu files through the loader (jit.torch_cu): split into a cached host TU (g++) and a device TU
(nvcc) where the split applies, its device code proven the same as the file's as written before it is first
used, the file as written where it does not apply. Compile-only here (sm_90); the GPU differential against
torch's own build is tests/test_split_gpu.py and benchmarks/split_corpus.py.

Each build of a host TU compiles torch's headers (~20-60 s on a 2-core machine): the tests share one copy of
each file and run in order."""
import shutil
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import kernelkit
from kernelkit.errors import BuildError, KernelkitError, SourcesChanged
from kernelkit.jit import build, cache, plan, running
from kernelkit.jit.fast import pch, split, torch_cu

CORPUS = Path(__file__).parent / "fixtures" / "torch_cu"
pytestmark = pytest.mark.cuda_build


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("torch_cu")
    for f in ("relu_extension.cu", "sigmoid_dispatch.cu", "device_lambda.cu"):
        shutil.copy(CORPUS / f, d / f)
    return d


def _build(name, path, capsys, **kw):
    before = dict(running.STATS)
    info = kernelkit.load(name, [str(path)], load=False, arch="9.0", **kw)
    said = capsys.readouterr().err
    return info, {k: running.STATS[k] - before[k] for k in ("compiles", "joins", "links")}, said


def _fallback_now(name, path, tmp_path):
    """Why the split would build ``path`` as written now, asked before anything compiles (an earlier build's finding
    is answered from its record); None where it would split."""
    target = plan.plan_extension(name, [path], arch="9.0")
    (unit,) = [u for u in target.units if u.strategy]
    before = running.STATS["compiles"]
    fallback = torch_cu._split_into(unit, target, tmp_path / "unused.o", core=None)
    assert running.STATS["compiles"] == before  # a remembered finding costs no compile
    return fallback


def test_a_kernel_body_edit_recompiles_the_device_tu_only(work, capsys):
    src = work / "relu_extension.cu"
    cold, counts, said = _build("kk_tcu_relu", src, capsys)
    assert not cold.cached and counts["joins"] == 1 and counts["links"] == 1, said
    assert "split (1 kernel(s))" in said and "proven the same as the file's as written" in said, said
    assert "includes torch's headers" not in said  # no advice: done already
    original = src.read_text()
    try:
        # lines added to a kernel body: the host TU is cached by its text without its line numbers
        src.write_text(original.replace("v * slope;", "v * slope * 1.0f;\n\n"))
        edited, counts, said = _build("kk_tcu_relu", src, capsys)
        assert edited.key != cold.key and "host TU cached" in said and "proven" not in said, said
        assert counts["compiles"] <= 2 and counts["joins"] == 1, said  # the device TU, and the line table
        src.write_text(original.replace("return out;", "return out;  // a host edit"))
        host_edit, counts, said = _build("kk_tcu_relu", src, capsys)
        assert "device TU cached" in said, said
    finally:
        src.write_text(original)
    again, counts, _ = _build("kk_tcu_relu", src, capsys)
    assert again.cached and again.key == cold.key and counts["compiles"] == 0


def test_a_first_build_waits_for_its_proof_not_for_the_names_record(tmp_path, capsys, monkeypatch):
    """The names torch's headers declare are recorded after the proof's PTX, in the background: the build is
    usable first, and the record is there once the process's background work ends."""
    src = tmp_path / "relu_extension.cu"
    shutil.copy(CORPUS / src.name, src)
    released, recording = threading.Event(), threading.Event()
    real = torch_cu.Proof._record_torch_names

    def held(self, kept):
        recording.set()
        released.wait(120)
        real(self, kept)

    monkeypatch.setattr(torch_cu.Proof, "_record_torch_names", held)
    names, real_key = [], torch_cu._torch_names_key
    monkeypatch.setattr(torch_cu, "_torch_names_key", lambda *a: names.append(real_key(*a)) or names[-1])
    _, _, said = _build("kk_tcu_names_later", src, capsys)
    assert "proven the same as the file's as written" in said, said
    assert recording.wait(60) and not cache.read_record("torch-names", names[0])  # built while the record was held
    released.set()
    torch_cu.wait_for_audits(300)
    assert cache.read_record("torch-names", names[0]).get("names")


def test_a_proof_that_fails_before_its_ptx_hands_the_error_to_its_waiter(monkeypatch, tmp_path):
    def broken(*a):
        raise OSError("the cache's records cannot be read")

    monkeypatch.setattr(torch_cu.cache, "read_record", broken)
    unit = types.SimpleNamespace(path=tmp_path / "k.cu", flags=[], display="k.cu")
    proof = torch_cu.Proof(unit, None, nice=True, names_key="kk-test-broken-names")
    assert proof.ptx_ready.wait(30), "the build would wait for this proof forever"
    assert isinstance(proof.error, OSError) and "kk-test-broken-names" not in torch_cu._NAMES


def test_a_kernel_typo_is_reported_at_the_users_line_without_a_full_build(work, capsys):
    src = work / "relu_extension.cu"
    original = src.read_text()
    line = next(i for i, ln in enumerate(original.splitlines(), 1) if "v * slope;" in ln)
    try:
        src.write_text(original.replace("v * slope;", "v * slopr;"))
        with pytest.raises(BuildError) as e:
            kernelkit.load("kk_tcu_relu", [str(src)], load=False, arch="9.0")
        assert f"relu_extension.cu:{line}" in str(e.value) and "slopr" in str(e.value)
        assert "KERNELKIT_TORCH_CU=full" in str(e.value)
    finally:
        src.write_text(original)


def test_an_edit_during_the_split_build_is_not_cached(work, monkeypatch):
    """The file is edited after the split read it: the object would carry the old content's key."""
    src = work / "relu_extension.cu"
    original = src.read_text()
    real = torch_cu.split.split_source

    def split_then_edit(text, path, local_header, heavy, first_line=1):
        result = real(text, path, local_header, heavy, first_line)
        src.write_text(original.replace("v * slope;", "v * slope * 2.0f;"))
        return result

    monkeypatch.setattr(torch_cu.split, "split_source", split_then_edit)
    src.write_text(original.replace("v * slope;", "v * slope * 3.0f;"))  # content no earlier test built
    try:
        with pytest.raises(SourcesChanged, match="changed while it was being compiled"):
            kernelkit.load("kk_tcu_relu", [str(src)], load=False, arch="9.0")
    finally:
        src.write_text(original)
    monkeypatch.undo()
    assert kernelkit.load("kk_tcu_relu", [str(src)], load=False, arch="9.0").path.is_file()


_KILL = """
import os, signal, sys
import kernelkit
from kernelkit.jit import running
from kernelkit.jit.fast import torch_cu

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[2] == "before-join":  # both parts compiled and cached, the joined object not yet
    running.join_objects = die
else:  # the device TU compiled and cached, then the process dies
    real = torch_cu._compiled
    torch_cu._compiled = lambda part, target, unit, what, core: (real(part, target, unit, what, core), die())
kernelkit.load("kk_tcu_relu", [sys.argv[1]], load=False, arch="9.0")
"""


@pytest.mark.parametrize("point, slope", [("device-cached", "5.0f"), ("before-join", "6.0f")])
def test_a_split_build_killed_halfway_leaves_a_sound_cache(work, capsys, point, slope):
    """SIGKILL in the middle of a split build: what it cached verifies (generated TUs included), and the next
    load finishes the build from the parts already there."""
    from kernelkit.jit import cache

    src = work / "relu_extension.cu"
    original = src.read_text()
    try:
        src.write_text(original.replace("v * slope;", f"v * slope * {slope};"))  # content no other test built
        r = subprocess.run([sys.executable, "-c", _KILL, str(src), point], capture_output=True, text=True)
        assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
        found = cache.verify()
        assert {f["status"] for f in found} == {"ok"}, [f for f in found if f["status"] != "ok"]
        generated = [f["entry"] for f in found if f["kind"] == "source"]
        assert any(e.endswith(".host.cpp") for e in generated) and any(e.endswith(".device.cu") for e in generated)
        info, counts, said = _build("kk_tcu_relu", src, capsys)
        assert counts["joins"] == 1 and counts["links"] == 1, said  # the dead build's parts, reused
        assert "device TU cached" in said
    finally:
        src.write_text(original)


def test_cache_verify_knows_the_generated_tus(work, capsys):
    """A split's host and device TUs are cache entries verify checks; a damaged one is reported and removed (a
    split that needs it writes it again from the user's file)."""
    from kernelkit.jit import cache

    _build("kk_tcu_relu", work / "relu_extension.cu", capsys)
    sources = [f for f in cache.verify() if f["kind"] == "source" and f["entry"].endswith(".device.cu")]
    assert sources and all(f["status"] == "ok" for f in sources)
    damaged = cache.cache_dir() / "src" / sources[0]["entry"]
    damaged.write_text(damaged.read_text() + "\n// edited in the cache\n")
    [bad] = [f for f in cache.verify(fix=True) if f["status"] != "ok"]
    assert bad["kind"] == "source" and "does not hold the text" in bad["reason"] and bad["removed"]
    assert not damaged.exists() and {f["status"] for f in cache.verify()} == {"ok"}
    assert _build("kk_tcu_relu", work / "relu_extension.cu", capsys)[0].cached


def test_template_kernels_under_at_dispatch_get_exactly_their_instantiations(work, capsys):
    info, counts, said = _build("kk_tcu_sigmoid", work / "sigmoid_dispatch.cu", capsys)
    assert counts["joins"] == 1 and "split" in said, said
    names = subprocess.run(["nm", "-C", str(info.path)], capture_output=True, text=True, check=True).stdout
    stubs = [ln for ln in names.splitlines() if "sigmoid_fwd_kernel<" in ln or "sigmoid_bwd_kernel<" in ln]
    assert len([ln for ln in stubs if " t " in ln]) >= 3  # the host's specialisations, defined and kept local
    assert not [ln for ln in stubs if " U " in ln]


def test_an_unsplittable_file_is_refused_at_once_when_split_is_forced(work, monkeypatch):
    monkeypatch.setenv("KERNELKIT_TORCH_CU", "split")
    before = running.STATS["compiles"]
    with pytest.raises(KernelkitError, match="cannot be split: a __device__ lambda"):
        kernelkit.load("kk_tcu_lambda", [str(work / "device_lambda.cu")], load=False, arch="9.0",
                       extra_cuda_cflags=["--extended-lambda"])
    assert running.STATS["compiles"] == before


@pytest.mark.parametrize("flag", ["-arch=native", "-gencode=arch=compute_90,code=lto_90"])
def test_a_file_whose_gpu_code_kernelkit_cannot_read_is_built_as_written(work, monkeypatch, flag):
    """The proof compiles the file's PTX for each arch its flags name: flags that name none kernelkit can read (the
    user's own -arch or -gencode, which replace kernelkit's) leave nothing to prove, so the file is not split."""
    monkeypatch.setenv("KERNELKIT_TORCH_CU", "split")
    before = running.STATS["compiles"]
    with pytest.raises(KernelkitError, match="cannot be split: its flags name no GPU code kernelkit can read"):
        kernelkit.load("kk_tcu_archs", [str(work / "relu_extension.cu")], load=False, extra_cuda_cflags=[flag])
    assert running.STATS["compiles"] == before


def test_the_strategy_asked_for_is_in_the_key_and_checked(work, monkeypatch):
    keys = {}
    for value in ("auto", "full", "split"):
        monkeypatch.setenv("KERNELKIT_TORCH_CU", value)
        target = plan.plan_extension("kk_tcu_keys", [work / "relu_extension.cu"], arch="9.0")
        (unit,) = target.units
        assert unit.strategy == torch_cu.NAME
        keys[value] = target.key
    assert len(set(keys.values())) == 3  # switching strategies never reuses the other's object
    monkeypatch.setenv("KERNELKIT_TORCH_CU", "lite")
    with pytest.raises(KernelkitError, match="KERNELKIT_TORCH_CU='lite': expected one of auto, split, full"):
        plan.plan_extension("kk_tcu_keys", [work / "relu_extension.cu"], arch="9.0")


def _split_host_unit(work, name):
    """(target, split, host unit) of relu_extension.cu planned as extension ``name``."""
    from kernelkit.jit.fast import split

    src = work / "relu_extension.cu"
    target = plan.plan_extension(name, [src], arch="9.0")
    (unit,) = target.units
    result = split.split_source(src.read_text(), str(src), split.local_headers([work]))
    return target, result, torch_cu._host_unit(result, unit, split.host_flags(unit.flags))


def _build_pch(part) -> None:
    """The host unit's precompiled preamble, built the way the detached builder builds it (unless it is ready)."""
    from kernelkit.jit import cache

    root, gch, cmd = pch.plan(part)
    if not cache.pch_ready(root):
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", pch._PCH_BUILDER, "0", str(root / f".{gch}.tmp"), str(root / gch),
                        str(root / cache.PCH_META), *cmd], check=True)
    assert cache.pch_ready(root)


def test_the_host_tu_built_with_its_precompiled_preamble_is_the_same_object(work, monkeypatch, tmp_path):
    """A split's host TU includes its preamble (torch's headers) first; with KERNELKIT_PCH=1 gcc reads that
    precompiled, which turns a host edit's ~25 s into ~10 s on a 2-core machine. The object must be the one
    gcc makes without it, byte for byte."""
    from kernelkit.jit import cache, toolchain

    if not toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    target, _, part = _split_host_unit(work, "kk_tcu_pch")
    assert part.pch_header is not None and part.path.read_text().startswith(f"#include <{part.pch_header.name}>")
    monkeypatch.setenv("KERNELKIT_PCH", "0")
    plain = cache.cached_object(part.key) or build.compile_cached(part, target)  # an earlier test built it
    monkeypatch.setenv("KERNELKIT_PCH", "1")
    _build_pch(part)
    before = dict(running.STATS)
    build.compile_as_written(part, target, tmp_path / "pch.o", tmp_path / "pch.d")
    assert running.STATS["pch_used"] == before["pch_used"] + 1 and running.STATS["pch_rejected"] == before["pch_rejected"]
    assert (tmp_path / "pch.o").read_bytes() == plain.read_bytes()


def test_the_host_tu_compiled_for_its_line_table_reads_its_precompiled_preamble(work, monkeypatch, tmp_path):
    """A split's host TU is compiled from its preprocessed text (its __LINE__s read from a table); gcc keeps the
    precompiled preamble there only if it finds the .gch before the header, so the PCH's directory must come
    first. It once came after the header's own and every host edit parsed torch's headers again (~25 s on 2
    cores instead of ~11 s) with nothing said. The object has the code and data of the one compiled without it
    (``_code``, ``_data``)."""
    from kernelkit.jit import cache, toolchain
    from kernelkit.jit.fast import host_lines

    if not toolchain.is_gcc():
        pytest.skip("precompiled headers are used with gcc only")
    target, result, part = _split_host_unit(work, "kk_tcu_pch_lines")
    texts = []
    real = host_lines._preprocess

    def spy(*args):
        texts.append(real(*args))
        return texts[-1]

    monkeypatch.setattr(host_lines, "_preprocess", spy)
    monkeypatch.setenv("KERNELKIT_PCH", "0")
    key = host_lines.lines_key(part, result.host)
    first, second = (key[:16] + c * 8 + key[24:] for c in "01")  # the table's name is the key's first 16
    plain = host_lines._compile(part, result.host, target, first, build)
    assert cache.object_info(first).get("lines") == "table"  # the tabled path, not a fallback
    assert not any(host_lines._PCH_PRAGMA in t for t in texts)
    monkeypatch.setenv("KERNELKIT_PCH", "1")
    _build_pch(part)
    before, texts[:] = dict(running.STATS), []
    with_pch = host_lines._compile(part, result.host, target, second, build)
    assert running.STATS["pch_used"] == before["pch_used"] + 1 and running.STATS["pch_rejected"] == before["pch_rejected"]
    assert len(texts) == 2 and all(host_lines._PCH_PRAGMA in t[:4096] for t in texts)
    assert _code(with_pch) == _code(plain)
    assert _data(with_pch, tmp_path / "a") == _data(plain, tmp_path / "b")


def _code(obj: Path) -> list:
    """The object's instructions and relocations, but the ``nop`` gcc -O0 places to hold a line location (gcc
    places it differently when the preamble comes precompiled into preprocessed text) and the static
    initializer's local name (gcc names it after the file it compiles)."""
    listing = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                             check=True).stdout
    out = []
    for line in listing.splitlines()[2:]:
        address, colon, rest = line.partition(":\t")
        if colon and address.strip() and all(c in "0123456789abcdef" for c in address.strip()):
            line = rest
        if line.strip() != "nop":
            out.append(line.replace(obj.name, "").split("_GLOBAL__sub_I_")[0])
    assert len(out) > 1000, listing[:2000]  # a real object's code, not an empty listing
    return out


def _data(obj: Path, out: Path) -> bytes:
    """The object's read-only data, as one blob (written to ``out``)."""
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.rodata*", str(obj), str(out)], check=True)
    return out.read_bytes()


def test_a_cu_without_torch_is_not_touched(tmp_path):
    (tmp_path / "plain.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = 1; }\n')
    (tmp_path / "bind.cpp").write_text("#include <torch/extension.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n")
    target = plan.plan_extension("kk_tcu_plain", [tmp_path / "plain.cu", tmp_path / "bind.cpp"], arch="9.0")
    assert all(u.strategy == "" for u in target.units)


CELL = r"""
#include <torch/extension.h>

__global__ void twice_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * xx[i];
}

torch::Tensor twice(torch::Tensor x) {
  auto y = torch::empty_like(x);
  twice_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
"""


def test_load_inline_cuda_sources_are_split_and_errors_cite_the_line_torch_cites(capsys):
    """torch's load_inline form: kernelkit's cuda.cu is torch's, line for line (torch's three includes, then the
    user's string), split under the name the user knows: a typo in a kernel cites the line torch's would."""
    line = 3 + next(i for i, ln in enumerate(CELL.splitlines(), 1) if "xx[i]" in ln)
    with pytest.raises(BuildError) as e:
        kernelkit.load_inline("kk_tcu_cell", "torch::Tensor twice(torch::Tensor x);", CELL, functions=["twice"],
                              arch="9.0")
    assert f"kk_tcu_cell/cuda.cu:{line}" in str(e.value) and "xx" in str(e.value), str(e.value)


LINES = r"""
#include <torch/extension.h>
#include <sstream>

__global__ void scale_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

std::string where() {
  std::ostringstream s;
  s << __LINE__ << " " << __FILE__;
  return s.str();
}

torch::Tensor scale(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "scale: x must be a CUDA tensor");
  auto y = torch::empty_like(x);
  scale_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("where", &where); m.def("scale", &scale); }
"""


def test_lines_added_to_a_kernel_keep_the_host_object_and_its_lines_current(tmp_path, capsys):
    """Host code's __LINE__ (here, and in TORCH_CHECK) is read from a table the build writes for the current
    lines: the host TU is not compiled again, and the library names the user's current lines."""
    src = tmp_path / "lines.cu"
    src.write_text(LINES)
    info, _, said = _build("kk_tcu_lines", src, capsys)
    edited = LINES.replace("if (i < n) y[i] = 2.0f * x[i];",
                           "if (i < n) {\n    float v = x[i];\n    v = 2.0f * v;\n    y[i] = v;\n  }")
    src.write_text(edited)
    info, counts, said = _build("kk_tcu_lines", src, capsys)
    assert "host TU cached" in said, said
    module = kernelkit.load("kk_tcu_lines", [str(src)], arch="9.0")  # importing needs no GPU
    line = next(i for i, ln in enumerate(edited.splitlines(), 1) if "__LINE__" in ln)
    assert module.where() == f"{line} {src}"  # the line it moved to, in the user's file


def test_a_load_inline_kernel_edit_compiles_device_code_only(capsys):
    """load_inline's sources live under their text's hash, so an edit moves them to a new dir: the split cites
    the file by torch's name for it, and a kernel-body edit compiles the device TU only."""
    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "torch_ext"))
    import sigmoid_inline

    def load(scale):
        before = running.STATS["compiles"]
        kernelkit.load_inline("kk_tcu_sigmoid_inline", sigmoid_inline.CPP, sigmoid_inline.cuda_source(scale),
                              functions=["sigmoid"], arch="9.0")
        return running.STATS["compiles"] - before, capsys.readouterr().err

    load("1.0f")
    compiles, said = load("3.0f")
    assert compiles <= 2 and "device TU" in said and "host TU cached" in said, said


KEYWORD_CUDA = """#include <torch/extension.h>
__global__ void thrice_kernel(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 3.0f * x[i];
}
at::Tensor thrice(const at::Tensor& x) {
  auto y = at::empty_like(x);
  thrice_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}
"""
KEYWORD_CPP = """at::Tensor thrice(const at::Tensor& x);
KERNELKIT_LIBRARY(m) {
  m.def("thrice(Tensor x) -> Tensor");
  m.impl("thrice", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(thrice)));
}
"""


def test_kernelkits_own_load_inline_splits_a_torch_including_cuda_part_under_its_name(capsys):
    """``load_inline(name, cuda=..., cpp=...)`` (and the %%kernelkit magic on it) keeps its sources under their
    text's hash: the split cites ``<name>.cu``, so a kernel edit keeps the host TU and a typo cites that line."""
    def load(text):
        before = running.STATS["compiles"]
        kernelkit.load_inline("kk_tcu_keyword", cuda=text, cpp=KEYWORD_CPP, arch="9.0")
        return running.STATS["compiles"] - before, capsys.readouterr().err

    load(KEYWORD_CUDA)
    compiles, said = load(KEYWORD_CUDA.replace("3.0f * x[i]", "4.0f * x[i]"))
    assert compiles <= 2 and "host TU cached" in said, said
    line = next(i for i, ln in enumerate(KEYWORD_CUDA.splitlines(), 1) if "3.0f * x[i]" in ln)
    with pytest.raises(BuildError) as e:
        load(KEYWORD_CUDA.replace("3.0f * x[i]", "3.0f * xx[i]"))
    assert f"kk_tcu_keyword.cu:{line}" in str(e.value) and "xx" in str(e.value), str(e.value)


# --------------------------------------------------------------------------------------------- the proof
HEAVY_MACRO = r"""
#include <torch/extension.h>

__global__ void threads_kernel(float* y) {
#if AT_PARALLEL_OPENMP
  y[0] = 2.0f;  // torch's ATen/Config.h defines it; the device TU's light prelude does not
#else
  y[0] = 3.0f;
#endif
}

torch::Tensor threads(torch::Tensor y) {
  threads_kernel<<<1, 1>>>(y.data_ptr<float>());
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("threads", &threads); }
"""


def test_a_split_that_would_change_device_code_is_caught_and_built_as_written(tmp_path, capsys):
    """Device code tests a macro only torch's umbrella headers define: the split's device TU would take the
    other branch. The proof compares its PTX with the file's as written, builds the file as written and says
    why, then and on the next edit (the refusal is kept for the file)."""
    src = tmp_path / "heavy_macro.cu"
    src.write_text(HEAVY_MACRO)
    info, _, said = _build("kk_tcu_heavy", src, capsys)
    assert "full nvcc build (the split compiles threads_kernel(float*) differently" in said, said
    src.write_text(HEAVY_MACRO.replace("2.0f", "4.0f"))
    assert "found earlier for this file" in _fallback_now("kk_tcu_heavy", src, tmp_path).reason


# ------------------------------------------------------------------------- a host TU that g++ cannot judge
NVCUDA_DIRECTIVE = r"""
#include <torch/extension.h>
#include <mma.h>

// mma.h declares nvcuda only under nvcc: g++ says "not a namespace-name" (at file scope the host TU declares
// it empty for g++; inside a namespace that would change lookup, so it does not)
namespace ops { using namespace nvcuda; }

__global__ void fill_kernel(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f;
}

torch::Tensor fill(torch::Tensor y) {
  fill_kernel<<<(y.numel() + 255) / 256, 256>>>(y.data_ptr<float>(), (int)y.numel());
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fill", &fill); }
"""


def _diagnostic(path, line, message):
    from kernelkit.diagnostics import Diagnostic
    return Diagnostic(str(path), line, 1, "error", message)


def test_a_host_tu_error_on_a_line_device_code_shares_is_not_the_users(tmp_path):
    """g++ compiles the host TU without nvcc's view of CUDA's headers, so an error on a line the device TU keeps
    too (a using-directive, a typedef) is the split's to answer by building as written; an error inside host code
    proper stays the user's."""
    from kernelkit.jit.fast import split
    from kernelkit.jit.units import Target
    src = tmp_path / "nvcuda.cu"
    src.write_text(NVCUDA_DIRECTIVE)
    result = split.split_source(NVCUDA_DIRECTIVE, str(src))
    assert isinstance(result, split.Split), result
    lines = NVCUDA_DIRECTIVE.splitlines()
    directive = next(i for i, ln in enumerate(lines, 1) if ln.startswith("namespace ops { using namespace"))
    host_only = next(i for i, ln in enumerate(lines, 1) if "return y;" in ln)
    assert ("nvcuda.cu", directive) in result.device_kept and ("nvcuda.cu", host_only) not in result.device_kept
    unit = types.SimpleNamespace(display=str(src), path=src)
    target = Target("t", [], [], "", True, None, {}, {})
    judged = result.device_kept
    assert not torch_cu._users_error([_diagnostic(src, directive, "'nvcuda' is not a namespace-name")],
                                     target, unit, judged)
    assert torch_cu._users_error([_diagnostic(src, host_only, "expected ';' before '}' token")], target, unit, judged)
    missing = BuildError("compiling", [_diagnostic(src, host_only, "'numeric_limits' is not a member of 'std'")], "")
    with pytest.raises(BuildError):  # a typo of the user's, judged by g++
        torch_cu._failed(missing, target, unit, "host", judged)
    why = torch_cu._failed(missing, target, unit, "host", judged, judged=False)  # the host TU left out cub
    assert why.reason.startswith("the host part did not compile ('numeric_limits'"), why


def test_a_host_tu_that_only_nvcc_can_compile_builds_as_written_and_is_remembered(tmp_path, capsys):
    """The next kernel edit is built as written at once: no host TU is tried first (the finding is the record's)."""
    src = tmp_path / "nvcuda.cu"
    src.write_text(NVCUDA_DIRECTIVE)
    _, _, said = _build("kk_tcu_nvcuda", src, capsys)
    assert "full nvcc build (the host part did not compile" in said and "namespace-name" in said, said
    src.write_text(NVCUDA_DIRECTIVE.replace("2.0f", "3.0f"))  # a kernel edit keeps the host TU's key
    assert "found earlier for this host code" in _fallback_now("kk_tcu_nvcuda", src, tmp_path).reason



def test_namespaces_and_headers_only_nvcc_compiles_leave_the_host_tu_compilable(tmp_path, capsys):
    """At file scope, ``using namespace nvcuda;`` and ``namespace cg = cooperative_groups;`` get their namespaces
    declared for g++, ``<cooperative_groups/reduce.h>`` (device code g++ cannot compile) leaves the host TU, and a
    launch in a macro is lowered in its body: the file splits where each of them used to build it as written."""
    text = NVCUDA_DIRECTIVE.replace("namespace ops { using namespace nvcuda; }", (
        "#include <cooperative_groups.h>\n#include <cooperative_groups/reduce.h>\nusing namespace nvcuda;\n"
        "namespace cg = cooperative_groups;")).replace(
        "if (i < n) y[i] = 2.0f;", "if (i < n) y[i] = cg::reduce(cg::tiled_partition<32>(cg::this_thread_block()), "
        "1.0f, cg::plus<float>());").replace(
        "  fill_kernel<<<", "#define LAUNCH_FILL(y) fill_kernel<<<(y.numel() + 255) / 256, 256>>>(y.data_ptr<float>(), "
        "(int)y.numel())\n  LAUNCH_FILL(y);\n  if (false) fill_kernel<<<")
    assert "LAUNCH_FILL(y);" in text
    src = tmp_path / "namespaces.cu"
    src.write_text(text)
    _, counts, said = _build("kk_tcu_namespaces", src, capsys)
    assert "split (1 kernel(s))" in said and counts["joins"] == 1, said


HOST_GLOBALS = """#include <torch/types.h>
#include <pybind11/pybind11.h>
struct Registry { Registry() {} };
static Registry registry;  // its constructor runs once, in the host object
namespace {
const char* kUsage = "help";
int calls = 0;
}
int limit = 4;
__global__ void k(float* x) { x[0] = 2.0f; }
int64_t f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); ++calls; return calls + kUsage[0] + limit; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }
"""


def test_host_variables_stay_out_of_the_device_tu_and_the_split_joins(tmp_path, capsys):
    """A namespace-scope variable of host code is defined once, by the host object: kept in the device TU too,
    both objects would define it (the join fails) and its initialiser would run twice."""
    src = tmp_path / "globals.cu"
    src.write_text(HOST_GLOBALS)
    result = split.split_source(HOST_GLOBALS, str(src))
    for name in ("static Registry registry;", "kUsage", "int calls", "int limit"):
        assert name not in result.device and name in result.host.whole, name
    _, counts, said = _build("kk_tcu_globals", src, capsys)
    assert "split (1 kernel(s))" in said and counts["joins"] == 1, said
    src.write_text(HOST_GLOBALS.replace("x[0] = 2.0f;", "x[0] = sizeof(limit) + sizeof(calls);"))
    _, counts, said = _build("kk_tcu_globals", src, capsys)  # named by device code: extern there
    assert "split (1 kernel(s))" in said and counts["joins"] == 1, said


def test_split_objects_that_do_not_join_build_as_written_and_are_remembered(tmp_path, capsys):
    """A variable device code names that ``extern`` cannot declare (an array sized by its initialiser, here in
    sizeof) stays in both TUs, which then both define it: the join fails, which is the split's failure, never the
    user's; the file builds as written, the build line names the variable, and the next kernel edit is built as
    written at once."""
    text = HOST_GLOBALS.replace("int limit = 4;", "int limit = 4;\nfloat tbl[] = {1, 2};").replace(
        "x[0] = 2.0f;", "x[0] = sizeof(tbl);")
    src = tmp_path / "globals.cu"
    src.write_text(text)
    info, _, said = _build("kk_tcu_globals_sizeof", src, capsys)
    assert Path(info.path).is_file()
    assert "full nvcc build (the split's objects do not join: both TUs define tbl" in said, said
    src.write_text(text.replace("sizeof(tbl)", "sizeof(tbl) + 1"))
    assert "found earlier for this file" in _fallback_now("kk_tcu_globals_sizeof", src, tmp_path).reason
