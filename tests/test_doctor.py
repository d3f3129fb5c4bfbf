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
