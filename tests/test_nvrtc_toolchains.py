"""Instant kernels with the NVRTC that torch's CUDA wheels bring, whatever CUDA toolkit the machine has: CI runs
this with torch's CUDA 13 wheels (and a CUDA 13 toolkit) and with torch 2.6's CUDA 12 wheels plus cuda-bindings
12 (next to the same CUDA 13 toolkit). NVRTC must get the headers of its own CUDA version, and compile for the
GPUs users have (T4 = sm_75, A100 = sm_80, H100 = sm_90). No GPU needed."""
import struct
import sys
from pathlib import Path

import pytest
import torch

from kernelkit.jit import nvrtc, toolchain

SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <typename T> __global__ void axpy(T a, const T* x, T* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _fake_headers(d: Path, version: int) -> Path:
    d.mkdir(parents=True)
    (d / "cuda.h").write_text(f"#define CUDA_VERSION {version}\n")
    (d / "cuda_fp16.h").write_text("// fake\n")
    return d


@pytest.mark.parametrize("major, chosen", [(12, "wheel"), (13, "toolkit"), (11, "toolkit")])
def test_nvrtc_gets_the_headers_of_its_own_cuda_version(tmp_path, monkeypatch, major, chosen):
    """A CUDA 13 toolkit and torch's CUDA 12 runtime wheel: NVRTC 12 gets the wheel's headers, NVRTC 13 the
    toolkit's; with no match, the first found (the toolkit's), as before."""
    toolkit = _fake_headers(tmp_path / "cuda" / "include", 13000)
    wheel = _fake_headers(tmp_path / "site" / "nvidia" / "cuda_runtime" / "include", 12040)
    monkeypatch.setattr(toolchain, "facts", lambda: {"cuda_home": str(toolkit.parent)})
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    assert nvrtc._find_cuda_include(major) == {"wheel": wheel, "toolkit": toolkit}[chosen]


def test_cuda_header_version_reads_cuda_h(tmp_path):
    assert toolchain.cuda_header_version(_fake_headers(tmp_path / "inc", 12040)) == "12.4"
    assert toolchain.cuda_header_version(tmp_path / "missing") is None


@pytest.mark.parametrize("arch", ["7.5", "8.0", "9.0"])
def test_instant_kernels_compile_for_the_gpus_users_have(arch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="instant kernels need cuda-bindings")
    from kernelkit.instant import kernels

    build = kernels.compile_kernels(SRC, name=f"kk_nvrtc_sm{arch.replace('.', '')}", arch=arch,
                                    name_expressions=["axpy<float>", "axpy<__half>", "axpy<__nv_bfloat16>"])
    raw = build.compiled.cubin.read_bytes()
    machine, flags = struct.unpack_from("<H", raw, 18)[0], struct.unpack_from("<I", raw, 48)[0]
    sm = int(arch.replace(".", ""))
    assert raw[:4] == b"\x7fELF" and machine == 190  # EM_CUDA
    assert sm in (flags & 0xFF, (flags >> 8) & 0xFF), hex(flags)  # where CUDA 12 and 13 put the SM
    assert sorted(build.symbols) == ["axpy<__half>", "axpy<__nv_bfloat16>", "axpy<float>"]
    include = nvrtc.cuda_include_dir()
    major = nvrtc.version()[0]
    assert include is not None and toolchain.cuda_header_version(include).split(".")[0] == str(major)
    if torch.version.cuda:  # the NVRTC found is the one of torch's CUDA (its wheels, or a matching toolkit)
        assert str(major) == torch.version.cuda.split(".")[0]


@pytest.mark.parametrize("cuda, says", [("12.4", "PyPI has no nvcc for CUDA 12"), ("13.0", "kernelkit[cuda]")])
def test_the_pip_advice_fits_torchs_cuda(monkeypatch, cuda, says):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert says in toolchain.pip_toolkit_advice()
