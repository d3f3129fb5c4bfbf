"""A CUDA toolkit from PyPI (``pip install "kernelkit[cuda]"``: NVIDIA's nvcc, crt, nvvm, cccl and cudart wheels)
compiles cards and torch-style extensions where no system toolkit exists (a driver-only machine).

The system toolkit is hidden from a fresh process the way a driver-only machine lacks it: no nvcc on PATH, no
CUDA_HOME, and torch's own guess (``/usr/local/cuda`` where it exists) cleared before kernelkit asks for it.
CI cost (2 cores): one card build and one small load_inline, ~1-2 min.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from kernelkit.jit import toolchain

pytestmark = pytest.mark.cuda_build

HIDDEN_TOOLKIT = textwrap.dedent("""
    import torch.utils.cpp_extension as ce
    ce.CUDA_HOME = None  # as on a machine with no system CUDA toolkit
    import kernelkit
    from kernelkit.jit import running, toolchain
""")


def _driver_only_env(tmp_path):
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvcc"))]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "KERNELKIT_NVCC")}
    env.update(PATH=os.pathsep.join(path), KERNELKIT_CACHE_DIR=str(tmp_path / "cache"), KERNELKIT_ARCH="9.0")
    return env


@pytest.fixture(scope="module")
def pip_home():
    home = toolchain.pip_cuda_home()
    if home is None:
        pytest.fail(f"no CUDA {torch.version.cuda} toolkit from PyPI: the dev extra installs kernelkit[cuda]")
    return home


def test_a_card_and_a_torch_style_extension_compile_with_the_pip_toolkit(pip_home, tmp_path):
    code = HIDDEN_TOOLKIT + textwrap.dedent("""
        print("NVCC", toolchain.nvcc())
        print("HOME", toolchain.facts()["cuda_home"])
        info = kernelkit.load("sigmoid", arch="9.0", load=False)  # compile and link, no GPU needed
        print("CARD", info.path)
        from kernelkit import cpp_extension
        ext = cpp_extension.load_inline(
            "kk_pip_toolkit", cpp_sources="void launch_twice(float* x, long n);",
            cuda_sources='''
                __global__ void twice(float* x, long n) {
                    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
                    if (i < n) x[i] *= 2;
                }
                void launch_twice(float* x, long n) { twice<<<(n + 255) / 256, 256>>>(x, n); }
            ''', functions=["launch_twice"])
        print("EXT", ext.__file__, "COMPILES", running.STATS["compiles"])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200,
                          env=_driver_only_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert out["NVCC"] == os.path.join(pip_home, "bin", "nvcc") and out["HOME"] == pip_home, proc.stdout
    assert out["CARD"].endswith(".so") and ".so" in out["EXT"], proc.stdout


def test_with_no_toolkit_at_all_cpu_code_builds_and_cuda_code_names_the_fix(tmp_path):
    """Neither a system nor a pip toolkit: a C++ extension still builds; a CUDA one says how to get nvcc."""
    code = HIDDEN_TOOLKIT + textwrap.dedent("""
        toolchain.pip_cuda_home = lambda: None  # no compiler wheels either
        m = kernelkit.load_inline("kk_no_toolkit", cpp_sources="int three() { return 3; }", functions=["three"])
        assert m.three() == 3
        try:
            kernelkit.load_inline("kk_no_toolkit_cu", cpp_sources="void f();",
                                  cuda_sources="__global__ void k() {} void f() { k<<<1, 1>>>(); }", functions=["f"])
        except kernelkit.KernelkitError as e:
            print("ERROR", e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200,
                          env=_driver_only_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR nvcc not found" in proc.stdout and "kernelkit[cuda]" in proc.stdout, proc.stdout


def test_a_cuda_runtime_without_nvcc_falls_back_to_the_pip_toolkit_and_doctor_agrees(pip_home, tmp_path):
    """A CUDA runtime image: torch finds /usr/local/cuda (libraries, no bin/nvcc). The build compiles with the
    toolkit from PyPI, and doctor names the same nvcc and says which directory had none; without the wheels the
    error names that directory."""
    runtime = tmp_path / "cuda"
    (runtime / "lib64").mkdir(parents=True)
    code = HIDDEN_TOOLKIT.replace("ce.CUDA_HOME = None", f"ce.CUDA_HOME = {str(runtime)!r}") + textwrap.dedent("""
        from kernelkit.frontends import doctor
        if sys.argv[1] == "no-wheels":
            toolchain.pip_cuda_home = lambda: None
        try:
            print("NVCC", toolchain.nvcc())
        except kernelkit.KernelkitError as e:
            print("ERROR", e)
        print("DOCTOR", *[f"{f.status} {f.detail}" for f in doctor.check_nvcc()])
    """)

    def run(case):
        env = {**_driver_only_env(tmp_path), "KERNELKIT_CACHE_DIR": str(tmp_path / case)}
        proc = subprocess.run([sys.executable, "-c", "import sys\n" + code, case], capture_output=True, text=True,
                              timeout=600, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)

    nvcc = os.path.join(pip_home, "bin", "nvcc")
    out = run("wheels")
    assert out["NVCC"] == nvcc, out
    assert out["DOCTOR"].startswith(f"ok {nvcc}: CUDA ") and out["DOCTOR"].endswith(
        f"(the CUDA toolkit from PyPI: {runtime} has no bin/nvcc)"), out
    out = run("no-wheels")
    assert out["ERROR"].startswith(f"nvcc not found: {runtime} is a CUDA directory without bin/nvcc"), out
    assert out["DOCTOR"].startswith(f"fail {out['ERROR']}"), out  # doctor says what the build says


def _toolkit(path):
    nvcc = path / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    return str(path)


def test_recorded_toolchain_facts_follow_toolkits_installed_or_removed_later(tmp_path, monkeypatch):
    """The facts file is keyed by the environment, which installing NVIDIA's wheels (or a system toolkit) does not
    change: a record made with no compiler is redone once one is installed, one naming a removed toolkit too, and
    one that chose the wheels over a CUDA directory without nvcc once that directory gains one."""
    def record(home, bare):  # what facts() records about the toolkit, with the files it came from as they are now
        return {"cuda_home": home, "cuda_home_without_nvcc": bare, "files": toolchain.toolkit_files(home, bare)}

    pip, runtime = _toolkit(tmp_path / "pip"), str(tmp_path / "runtime")
    os.makedirs(runtime)
    monkeypatch.setattr(toolchain, "pip_cuda_home", lambda: None)
    assert toolchain.choose_cuda_home(runtime) == (runtime, runtime)
    no_toolkit, runtime_only = record(None, None), record(runtime, runtime)
    assert toolchain._same_toolkit(no_toolkit) and toolchain._same_toolkit(runtime_only)
    monkeypatch.setattr(toolchain, "pip_cuda_home", lambda: pip)
    assert toolchain.choose_cuda_home(runtime) == (pip, runtime)
    assert not toolchain._same_toolkit(no_toolkit)  # installed since
    assert not toolchain._same_toolkit(runtime_only)
    wheels = record(pip, runtime)
    assert toolchain._same_toolkit(wheels)
    removed = record(_toolkit(tmp_path / "removed"), None)
    assert toolchain._same_toolkit(removed)
    shutil.rmtree(tmp_path / "removed")
    assert not toolchain._same_toolkit(removed)
    assert not toolchain._same_toolkit({k: v for k, v in wheels.items() if k != "files"})  # a record of before
    _toolkit(tmp_path / "runtime")  # a full toolkit installed where the runtime was: preferred again
    assert not toolchain._same_toolkit(wheels)
    assert toolchain.choose_cuda_home(runtime) == (runtime, None)
