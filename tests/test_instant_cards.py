"""Cards whose device code NVRTC compiles (Spec.nvrtc_sources), without a GPU: the spec field, a binding key
that kernel edits leave alone, compile-only NVRTC on load, errors cited in the kernel file, the C++ header
(<kernelkit/kernels.h>) built into bindings of several translation units, and its lookup and argument errors."""
import shutil
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC cards need cuda-bindings (torch's CUDA 13 wheels bring it)")

import kernelkit  # noqa: E402
from kernelkit.errors import BuildError, KernelkitError, SpecError  # noqa: E402
from kernelkit.instant import card_kernels  # noqa: E402
from kernelkit.jit import cards, plan  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cards_nvrtc"
CARD = "kk_scale_nvrtc"
EDIT = ("out[i] = a * x[i];", "out[i] = a * x[i] + T(1);")


@pytest.fixture
def card_dir(tmp_path, monkeypatch):
    """A copy of the fixture card to edit; no arch from the environment (the tests pass one)."""
    for var in ("KERNELKIT_ARCH", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    d = tmp_path / "cards"
    shutil.copytree(FIXTURE, d)
    return d


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# ------------------------------------------------------------------------------------------ the spec
def test_archs_follow_the_toolchain_order_but_compile_nothing_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("KERNELKIT_ARCH", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert card_kernels._archs(None, compile_only=False) == ([], None)  # nvcc builds would get 9.0 here
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5;8.6+PTX")
    assert card_kernels._archs(None, compile_only=True) == (["75", "86"], None)
    monkeypatch.setenv("KERNELKIT_ARCH", "sm_90a")
    assert card_kernels._archs(None, compile_only=True) == (["90a"], None)
    assert card_kernels._archs("8.0", compile_only=True) == (["80"], None)
    with pytest.raises(KernelkitError, match="arch"):
        card_kernels._archs("ninety", compile_only=True)


def test_nvrtc_sources_forms():
    assert cards.nvrtc_entries(None, "s") == {}
    assert cards.nvrtc_entries("k.cu", "s") == {"k.cu": ()}
    assert cards.nvrtc_entries(["a.cu", "b.cu"], "s") == {"a.cu": (), "b.cu": ()}
    assert cards.nvrtc_entries({"a.cu": ["f<float>", "f<double>"], "b.cu": "g<int>"}, "s") == {
        "a.cu": ("f<float>", "f<double>"), "b.cu": ("g<int>",)}
    with pytest.raises(SpecError, match="spec.py: nvrtc_sources: expected a file name"):
        cards.nvrtc_entries({"a.cu": [1]}, "spec.py")


def test_the_kernel_file_is_not_an_nvcc_source_and_the_card_is_listed(card_dir):
    card = cards.find(CARD, card_dir)
    assert card.sources() == [] and card.has_cuda
    assert card.nvrtc_sources() == {card_dir / f"{CARD}.cu": ("scale<float>", "scale<double>")}
    assert list(cards.all_cards(card_dir)) == [CARD]
    assert cards.declared_sources(CARD, card_dir) == [f"{CARD}.cu"]  # read without running the spec
    (card_dir / f"{CARD}.cu").unlink()
    assert card.missing_file() == str(card_dir / f"{CARD}.cu")


def test_a_file_in_both_lists_is_refused(card_dir):
    edit(card_dir / f"{CARD}.py", "nvrtc_sources=", f'sources=["{CARD}.cu"], nvrtc_sources=')
    with pytest.raises(SpecError, match=f"{CARD}.cu is in both sources= and nvrtc_sources="):
        cards.find(CARD, card_dir).sources()


@pytest.mark.cuda_build
def test_kernel_edits_leave_the_binding_key_alone(card_dir):
    def key():
        return plan.plan_card(cards.find(CARD, card_dir), "9.0", [], [], [], []).key

    first = key()
    edit(card_dir / f"{CARD}.cu", *EDIT)
    assert key() == first  # the kernel file is not part of the nvcc build
    edit(card_dir / f"{CARD}.h", "factor * in[i]", "in[i] * factor")
    assert key() != first  # the binding is


# --------------------------------------------------------------------------------------- loading it
@pytest.mark.cuda_build
def test_load_compiles_the_kernels_with_nvrtc_and_an_edit_rebuilds_nothing_else(card_dir):
    lib = kernelkit.load(CARD, kernels_dir=card_dir, arch="9.0")
    x = torch.randn(1000, dtype=torch.float64)
    torch.testing.assert_close(lib.kk_scale_nvrtc(x, 1.5), 1.5 * x)  # the CPU path works without a GPU
    (module,) = lib.nvrtc.modules
    assert module.arch == "sm_90" and module.cubin.is_file()
    assert set(module.kernels) == {"scale<float>", "scale<double>"}
    if not torch.cuda.is_available():
        assert "no CUDA device in this process (compiled for sm_90 only)" in lib.nvrtc.problem

    kernelkit.refresh()  # rebuilds now what other tests of this worker left edited or set otherwise
    stats, key = dict(kernelkit.STATS), lib.nvrtc.key
    edit(card_dir / f"{CARD}.cu", *EDIT)
    t0 = time.perf_counter()
    assert CARD in kernelkit.refresh()
    seconds = time.perf_counter() - t0
    assert kernelkit.library(CARD) is lib and lib.nvrtc.key != key and not module.cached
    assert (kernelkit.STATS["compiles"], kernelkit.STATS["links"]) == (stats["compiles"], stats["links"])
    print(f"kernel edit -> refreshed (NVRTC, sm_90, binding untouched): {seconds * 1e3:.1f} ms")


@pytest.mark.cuda_build
def test_a_compile_error_cites_the_kernel_file_and_keeps_the_build(card_dir):
    lib = kernelkit.load(CARD, kernels_dir=card_dir, arch="9.0")
    edit(card_dir / f"{CARD}.cu", "a * x[i]", "a * xx[i]")
    with pytest.raises(BuildError) as e:
        kernelkit.load(CARD, kernels_dir=card_dir, arch="9.0")
    msg = str(e.value)
    assert f"{CARD}.cu:6: error" in msg and 'identifier "xx" is undefined' in msg, msg
    assert "if (i < n) out[i] = a * xx[i];" in msg  # the line, quoted
    assert kernelkit.library(CARD) is lib


@pytest.mark.cuda_build
def test_compile_only_for_several_archs(card_dir):
    kernels = card_kernels.obtain(cards.find(CARD, card_dir), "8.0;9.0", compile_only=True)  # load(..., load=False)
    assert kernels.entries == () and kernels.problem == ""
    src = card_dir / f"{CARD}.cu"
    for arch in ("8.0", "9.0"):  # both cubins are in the cache now: loading either compiles nothing
        exprs = ["scale<float>", "scale<double>"]
        assert kernelkit.load_kernels(src, "probe_archs", arch=arch, name_expressions=exprs).cached


@pytest.mark.cuda_build
def test_a_kernel_name_in_two_files_is_refused(card_dir):
    (card_dir / "more.cu").write_text("template <typename T> __global__ void scale(T* x) {}\n")
    edit(card_dir / f"{CARD}.py", '["scale<float>", "scale<double>"]}', '["scale<float>"], "more.cu": ["scale<float>"]}')
    with pytest.raises(KernelkitError, match=r"kernel 'scale<float>' is defined in both .*kk_scale_nvrtc.cu and "
                                             r".*more.cu; kernels are found by name"):
        card_kernels.obtain(cards.find(CARD, card_dir), "9.0")


@pytest.mark.cuda_build
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a process without a GPU")
def test_without_a_gpu_or_an_arch_the_kernels_are_not_compiled(card_dir):
    lib = kernelkit.load(CARD, kernels_dir=card_dir)
    assert lib.nvrtc.modules == () and "were not compiled (pass arch='9.0'" in lib.nvrtc.problem
    x = torch.randn(5)
    torch.testing.assert_close(lib.kk_scale_nvrtc(x, 2.0), 2.0 * x)


# ------------------------------------------------------------------------------------- the C++ header
PROBE_H = textwrap.dedent("""\
    // Probe of <kernelkit/kernels.h>: lookups and launches from a second translation unit.
    #pragma once
    #include <cstdint>
    #include <string>

    std::string probe_lookup(const std::string& name);
    std::string probe_launch(const std::string& name, int64_t grid, bool wrong_type);

    #ifdef KERNELKIT_BINDING
    #include <kernelkit/kernels.h>

    inline std::string lookup(std::string name) { return probe_lookup(name); }
    inline std::string launch(std::string name, int64_t grid, bool wrong) { return probe_launch(name, grid, wrong); }
    inline bool here(std::string name) { return kk::has_kernel(name); }  // asked in this TU

    KERNELKIT_LIBRARY(m) {
      m.def("lookup(str name) -> str", &lookup);
      m.def("launch(str name, int grid, bool wrong_type) -> str", &launch);
      m.def("here(str name) -> bool", &here);
    }
    #endif
    """)
PROBE_CPP = textwrap.dedent("""\
    #include "probe.h"
    #include <kernelkit/kernels.h>

    std::string probe_lookup(const std::string& name) {
      try {
        kk::NvrtcKernel k = kk::kernel(name);
        return "found " + k.name() + " in " + k.source();
      } catch (const std::exception& e) {
        return e.what();
      }
    }

    std::string probe_launch(const std::string& name, int64_t grid, bool wrong_type) {
      try {
        float* x = nullptr;
        if (wrong_type) kk::kernel(name).launch(unsigned(grid), 32, 0, nullptr, x, 2.0);
        else kk::kernel(name).launch(unsigned(grid), 32, 0, nullptr, x, 2);
        return "launched";
      } catch (const std::exception& e) {
        return e.what();
      }
    }
    """)
PROBE_SPEC = textwrap.dedent("""\
    import torch
    import kernelkit

    SPEC = kernelkit.Spec(name="{name}", reference=torch.neg, make_inputs=kernelkit.elementwise_inputs(1),
                          header="probe.h", sources=["probe_lookup.cpp"], nvrtc_sources=["probe_kernels.cu"])
    """)


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Two cards of the same code (its objects are compiled once) with a binding TU and a second TU."""
    d = tmp_path_factory.mktemp("probe_cards")
    (d / "probe.h").write_text(PROBE_H)
    (d / "probe_lookup.cpp").write_text(PROBE_CPP)
    (d / "probe_kernels.cu").write_text('extern "C" __global__ void twice(float* x, int n) { x[threadIdx.x] *= 2; }\n')
    libs = []
    for name in ("kk_probe_a", "kk_probe_b"):
        (d / f"{name}.py").write_text(PROBE_SPEC.format(name=name))
        libs.append(kernelkit.load(name, kernels_dir=d, arch="9.0"))
    return libs


@pytest.mark.cuda_build
@pytest.mark.skipif(torch.cuda.is_available(), reason="hands made-up kernel handles, which only a GPU-less process may")
def test_the_header_finds_kernels_by_name_in_every_translation_unit(probes):
    a, b = probes
    before = a.lookup("twice")
    assert "kernel 'twice' of " in before and "probe_kernels.cu is not loaded: no CUDA device" in before
    a.set_nvrtc_kernels([("twice", 0x1234, "k.cu", [(8, "float* x"), (4, "int n")])], "k.cu", "")
    assert a.lookup("twice") == "found twice in k.cu" and a.here("twice")  # handed once, seen by both TUs
    assert "not loaded" in b.lookup("twice") and not b.here("twice")  # each card library has its own table
    assert a.lookup("thrice") == ("kernelkit: no kernel 'thrice' in k.cu (kernels: twice); a template instantiation "
                                  'must be listed in Spec.nvrtc_sources = {file: ["name<type>", ...]}')
    assert a.launch("twice", 1, True) == ("kernelkit: kernel 'twice' (k.cu): argument 2 'int n' is 4 bytes, got double "
                                          "(8 bytes); cast it to the declared type")
    assert a.launch("twice", 0, False) == "launched"  # an empty grid: the arguments checked, nothing launched
    assert a.launch("twice", 1, False).startswith("kernelkit: kernel 'twice' (k.cu): launch failed: ")
    a.set_nvrtc_kernels([("twice", 0x1234, "k.cu", None)], "k.cu", "")  # parameters unknown: no check
    assert a.launch("twice", 0, True) == "launched"
