"""``kernelkit doctor``: each check finds the problem it is for, says how to fix it, and the exit status says
whether builds can work."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from kernelkit.diagnostics import Diagnostic
from kernelkit.errors import BuildError
from kernelkit.frontends import doctor
from kernelkit.jit import toolchain


def _doctor(*args, **env):
    return subprocess.run([sys.executable, "-m", "kernelkit", "doctor", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **{k: str(v) for k, v in env.items()}})


def _by_check(findings):
    return {f.check: f for f in findings}


def test_this_machine_can_build_and_the_json_names_every_check(tmp_path):
    proc = _doctor("--json", KERNELKIT_CACHE_DIR=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # CI compiles cards: nothing may block builds here
    report = json.loads(proc.stdout)
    checks = {f["check"]: f for f in report["findings"]}
    assert report["blocking"] is False
    assert {"settings", "Python headers", "C++ compiler", "nvcc", "ninja", "cache", "cache locks",
            "cuobjdump"} <= set(checks)
    assert checks["cache"]["status"] == "ok" and str(tmp_path / "cache") in checks["cache"]["detail"]
    assert checks["cache locks"]["status"] == "ok"


def test_a_setting_that_does_not_parse_is_named(monkeypatch):
    monkeypatch.setenv("KERNELKIT_PCH", "sometimes")
    found = _by_check(doctor.check_settings())
    pch = found["KERNELKIT_PCH"]
    assert pch.status == doctor.FAIL and "KERNELKIT_PCH='sometimes': expected one of auto" in pch.detail
    monkeypatch.setenv("KERNELKIT_PCH", "off")
    assert [f.status for f in doctor.check_settings()] == [doctor.OK]


def test_a_missing_compiler_blocks_builds_and_says_what_to_do(tmp_path):
    proc = _doctor(CXX=tmp_path / "no-such-c++", KERNELKIT_CACHE_DIR=tmp_path / "cache")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "C++ compiler" in ln)
    assert line.startswith("fail") and "no-such-c++" in line and "not found" in line
    assert "-> install g++" in proc.stdout and "builds cannot work until the 'fail' lines are fixed" in proc.stdout


def test_missing_python_headers_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "python_include", lambda: str(tmp_path))
    [finding] = doctor.check_python_headers()
    assert finding.status == doctor.FAIL and str(tmp_path) in finding.detail and "-dev" in finding.fix


def test_a_cuda_major_mismatch_is_named(monkeypatch, tmp_path):
    import torch

    if not toolchain.torch_has_cuda():
        pytest.skip("a CPU build of torch has no CUDA version to mismatch")
    other = "12.4" if not torch.version.cuda.startswith("12") else "13.0"
    monkeypatch.setattr(toolchain, "nvcc", lambda: str(tmp_path / "bin" / "nvcc"))
    monkeypatch.setattr(toolchain, "facts", lambda: {"cuda_toolkit_version": other})
    [finding] = doctor.check_nvcc()
    assert finding.status == doctor.FAIL
    assert f"CUDA {other}" in finding.detail and f"built for CUDA {torch.version.cuda}" in finding.detail


def _cuda_dir(path, version, nvcc=False):
    """A CUDA directory as it lies on disk: include/cuda.h of ``version`` (e.g. 13000), lib64/, and bin/nvcc
    (a script: nothing here runs it) where ``nvcc``."""
    (path / "include").mkdir(parents=True, exist_ok=True)
    (path / "lib64").mkdir(exist_ok=True)
    (path / "include" / "cuda.h").write_text(f"#define CUDA_VERSION {version}\n")
    if nvcc:
        (path / "bin").mkdir(exist_ok=True)
        (path / "bin" / "nvcc").write_text("#!/bin/sh\nexit 1\n")
        (path / "bin" / "nvcc").chmod(0o755)
    return str(path)


@pytest.fixture
def fresh_toolchain(tmp_path, monkeypatch):
    """Toolchain facts computed into a cache of the test's own, forgotten by this process before and after."""
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELKIT_NVCC", raising=False)
    computed = []
    compute = toolchain._compute_facts
    monkeypatch.setattr(toolchain, "_compute_facts", lambda: computed.append(1) or compute())

    def forget():
        toolchain.facts.cache_clear()
        toolchain.nvcc.cache_clear()

    forget()
    yield computed, forget
    forget()


def test_a_cuda_directory_without_nvcc_falls_back_to_pip_and_the_facts_follow_their_files(
        tmp_path, monkeypatch, caplog, fresh_toolchain):
    """torch's CUDA_HOME is a CUDA runtime (include/, lib64/, no bin/nvcc) and NVIDIA's wheels hold a toolkit: the
    build takes the wheels' nvcc and says it found the one and not the other, doctor names the same nvcc; the
    recorded facts are redone when a file they came from changes (nvcc installed into the runtime's directory,
    its cuda.h upgraded in place), and read from the cache while nothing did."""
    if not toolchain.torch_has_cuda():
        pytest.skip("a CPU build of torch looks for no CUDA toolkit")
    import torch

    computed, forget = fresh_toolchain
    major = int(str(torch.version.cuda).split(".")[0])
    runtime, pip = _cuda_dir(tmp_path / "cuda", major * 1000), _cuda_dir(tmp_path / "pip", major * 1000, nvcc=True)
    monkeypatch.setattr(toolchain.cpp_extension(), "CUDA_HOME", runtime)
    monkeypatch.setattr(toolchain, "pip_cuda_home", lambda: pip)
    with caplog.at_level("WARNING", logger="kernelkit"):
        assert toolchain.nvcc() == os.path.join(pip, "bin", "nvcc")
    assert f"found the CUDA directory {runtime} without bin/nvcc" in caplog.text and pip in caplog.text
    [finding] = doctor.check_nvcc()
    assert finding.status == doctor.OK and finding.detail.startswith(os.path.join(pip, "bin", "nvcc"))
    assert finding.detail.endswith(f"(the CUDA toolkit from PyPI: {runtime} has no bin/nvcc)")
    assert len(computed) == 1
    forget()
    assert toolchain.facts()["cuda_home"] == pip and len(computed) == 1  # nothing changed: read from the cache

    _cuda_dir(tmp_path / "cuda", major * 1000, nvcc=True)  # the full toolkit installed where the runtime was
    forget()
    assert toolchain.nvcc() == os.path.join(runtime, "bin", "nvcc") and len(computed) == 2
    assert toolchain.facts()["cuda_home_without_nvcc"] is None
    assert doctor.check_nvcc()[0].detail.startswith(os.path.join(runtime, "bin", "nvcc"))

    cuda_h = tmp_path / "cuda" / "include" / "cuda.h"
    cuda_h.write_text(f"#define CUDA_VERSION {major * 1000 + 10}\n")  # upgraded in place: the same path
    os.utime(cuda_h, ns=(cuda_h.stat().st_atime_ns, cuda_h.stat().st_mtime_ns + 10**9))
    forget()
    assert toolchain.facts()["cuda_toolkit_version"] == f"{major}.1" and len(computed) == 3


def test_a_cuda_directory_without_nvcc_and_no_wheels_is_named_by_the_build_and_doctor(
        tmp_path, monkeypatch, fresh_toolchain):
    if not toolchain.torch_has_cuda():
        pytest.skip("a CPU build of torch looks for no CUDA toolkit")
    runtime = _cuda_dir(tmp_path / "cuda", 13000)
    monkeypatch.setattr(toolchain.cpp_extension(), "CUDA_HOME", runtime)
    monkeypatch.setattr(toolchain, "pip_cuda_home", lambda: None)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name, *a, **k: None)  # no nvcc on PATH either
    with pytest.raises(toolchain.KernelkitError) as e:
        toolchain.nvcc()
    assert str(e.value).startswith(f"nvcc not found: {runtime} is a CUDA directory without bin/nvcc")
    [finding] = doctor.check_nvcc()
    assert finding.status == doctor.FAIL and finding.detail.startswith(str(e.value))


def test_locks_that_do_not_exclude_are_a_blocking_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    assert _by_check(doctor.check_cache())["cache locks"].status == doctor.OK
    monkeypatch.setattr(doctor.fcntl, "flock", lambda fd, op: None)  # a file system that grants every lock
    locks = _by_check(doctor.check_cache())["cache locks"]
    assert locks.status == doctor.FAIL and "not exclusive" in locks.detail and "local disk" in locks.fix
    assert not [p for p in (tmp_path / "cache" / "v1").iterdir() if p.name.startswith(".doctor")]  # probe removed


@pytest.mark.parametrize("setting, capability, status", [
    ("9.0", (9, 0), doctor.OK),
    ("8.0;9.0", (8, 6), doctor.OK),  # sm_80 SASS runs on sm_86
    ("9.0", (8, 0), doctor.FAIL),
    ("7.5+PTX", (9, 0), doctor.OK),  # PTX is compiled by the driver for newer GPUs
    ("nine", (9, 0), doctor.FAIL),
])
def test_an_arch_setting_must_build_code_the_gpu_runs(monkeypatch, setting, capability, status):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setenv("KERNELKIT_ARCH", setting)
    [finding] = doctor._arch_setting_covers(capability)
    assert finding.status == status, finding


def test_a_check_that_raises_is_reported_not_fatal():
    def check_broken():
        raise RuntimeError("boom")

    [finding] = doctor.run_checks([check_broken])
    assert finding.status == doctor.FAIL and finding.check == "broken" and "RuntimeError: boom" in finding.detail


@pytest.mark.parametrize("message", ["Python.h: No such file or directory", 'cannot open source file "Python.h"'])
def test_a_build_error_from_a_missing_system_header_points_to_the_doctor(message):
    error = BuildError("compiling x.cpp", [Diagnostic("x.cpp", 1, 10, "fatal error", message)], "log")
    assert "`kernelkit doctor`" in str(error) and "Python.h is part of the machine's toolchain" in str(error)
    plain = BuildError("compiling x.cpp", [Diagnostic("x.cpp", 3, 1, "error", "'y' was not declared")], "log")
    assert "doctor" not in str(plain)


def test_a_closed_pipe_ends_a_command_quietly():
    """`kernelkit cache list | head`: the reader closing the pipe is no error."""
    code = textwrap.dedent("""
        import sys
        from kernelkit.frontends import cli
        def broken(args):
            raise BrokenPipeError(32, "Broken pipe")
        parser = cli.build_parser
        def patched():
            p = parser()
            p._subparsers._group_actions[0].choices["list"].set_defaults(func=broken)
            return p
        cli.build_parser = patched
        sys.exit(cli.main(["list"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
