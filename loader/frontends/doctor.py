"""``kernelkit doctor``: what kernelkit needs on this machine, checked, with what to do about each problem.

Each check is a small function returning :class:`Finding`\\ s. ``fail`` means builds cannot work (the command then
exits 1); ``warn`` means something optional is missing or a build may surprise (no GPU to run on, no ninja for
ahead-of-time builds, no cuobjdump for compile reports).
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Optional

from .. import settings
from ..errors import KernelkitError

OK, WARN, FAIL = "ok", "warn", "fail"
_MIN_FREE_BYTES = 2 << 30  # a torch extension's objects and libraries take hundreds of MB


@dataclasses.dataclass
class Finding:
    check: str
    status: str  # ok / warn / fail
    detail: str
    fix: str = ""


# ------------------------------------------------------------------------------------------- checks
def check_settings() -> List[Finding]:
    """Every KERNELKIT_* setting parses: a bad value fails whatever reads it, which may be half-way through a build."""
    found = []
    for setting in settings.SETTINGS.values():
        try:
            setting.get()
        except KernelkitError as e:
            found.append(Finding(setting.name, FAIL, str(e), f"unset {setting.name} or give it a value it takes"))
    return found or [Finding("settings", OK, "every KERNELKIT_* setting that is set parses")]


def check_python_headers() -> List[Finding]:
    from ..jit import toolchain

    header = Path(toolchain.python_include()) / "Python.h"
    if header.is_file():
        return [Finding("Python headers", OK, str(header))]
    return [Finding("Python headers", FAIL, f"no Python.h in {header.parent}",
                    f"install the headers of this Python ({sys.version.split()[0]}): e.g. apt install "
                    f"python{sys.version_info[0]}.{sys.version_info[1]}-dev, or use a Python from conda or pyenv")]


def check_host_compiler() -> List[Finding]:
    from ..jit import toolchain

    try:
        cxx = toolchain.cxx()
    except KernelkitError as e:
        return [Finding("C++ compiler", FAIL, str(e), "install g++ (apt install g++) or point CXX at one")]
    version = _first_line([cxx, "--version"])
    return [Finding("C++ compiler", OK if version else WARN, f"{cxx}: {version or 'did not say its version'}")]


def check_nvcc() -> List[Finding]:
    import torch

    from ..jit import toolchain

    if not toolchain.torch_has_cuda():
        return [Finding("nvcc", WARN, f"this torch ({torch.__version__}) is a CPU build: CUDA code is not built",
                        "install a CUDA build of torch to build CUDA cards")]
    try:
        nvcc = toolchain.nvcc()
    except KernelkitError as e:
        return [Finding("nvcc", FAIL, f"{e} (C++ cards still build)",
                        f"install a CUDA {torch.version.cuda.split('.')[0]} toolkit or {toolchain.pip_toolkit_advice()}, "
                        "or set CUDA_HOME / KERNELKIT_NVCC")]
    found = toolchain.facts().get("cuda_toolkit_version") or _nvcc_release(nvcc)
    if found and str(found).split(".")[0] != torch.version.cuda.split(".")[0]:
        return [Finding("nvcc", FAIL, f"{nvcc} is CUDA {found}, this torch is built for CUDA {torch.version.cuda}: "
                        "code from one CUDA major version cannot load into the other",
                        "install the matching toolkit (or torch), or point CUDA_HOME / KERNELKIT_NVCC at it")]
    facts = toolchain.facts()
    bare, home = facts.get("cuda_home_without_nvcc"), facts.get("cuda_home")
    from_pip = bare and home != bare and nvcc.startswith(str(home))
    passed = f" (the CUDA toolkit from PyPI: {bare} has no bin/nvcc)" if from_pip else ""
    return [Finding("nvcc", OK, f"{nvcc}: CUDA {found or '?'}, torch's CUDA {torch.version.cuda}{passed}")]


def check_gpu() -> List[Finding]:
    import torch

    if not torch.cuda.is_available():
        why = "no CUDA device visible" if torch.version.cuda else "a CPU build of torch"
        return [Finding("GPU", WARN, f"{why}: CUDA code is compiled (for KERNELKIT_ARCH, default sm_90), not run")]
    found = []
    driver = _driver_cuda_version()
    runtime = torch.version.cuda
    if driver and tuple(map(int, driver.split("."))) < tuple(map(int, runtime.split(".")[:2])):
        found.append(Finding("driver", WARN, f"the driver supports CUDA {driver}, torch's runtime is {runtime}",
                             "update the NVIDIA driver (older drivers run newer runtimes only in compatibility mode)"))
    else:
        found.append(Finding("driver", OK, f"supports CUDA {driver or '?'} (torch's runtime: {runtime})"))
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        found.append(Finding(f"GPU {i}", OK, f"{torch.cuda.get_device_name(i)}, sm_{major}{minor}"))
    found += _arch_setting_covers(torch.cuda.get_device_capability(0))
    return found


def _arch_setting_covers(capability) -> List[Finding]:
    """KERNELKIT_ARCH / TORCH_CUDA_ARCH_LIST, when set, must build code the GPU runs."""
    from ..jit import prebuilt, toolchain

    for var, value in ((settings.ARCH.name, settings.ARCH.get()),
                       ("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST"))):
        if value:
            try:
                archs = toolchain.parse_arch_list(value)
            except ValueError as e:
                return [Finding(var, FAIL, f"{var}={value}: {e}",
                                f"unset {var} or give archs like 9.0 or '8.0;9.0+PTX'")]
            have = [f"sm_{a.replace('+PTX', '').replace('.', '')}" for a in archs]
            have += [f"compute_{a[:-4].replace('.', '')}" for a in archs if a.endswith("+PTX")]
            want = f"sm_{capability[0]}{capability[1]}"
            if not prebuilt.covers(have, [want]):
                return [Finding(var, FAIL, f"{var}={value} builds no code this GPU ({want}) runs",
                                f"add {capability[0]}.{capability[1]} to {var}, or unset it")]
            return [Finding(var, OK, f"{value} covers {want}")]
    return []


def check_ninja() -> List[Finding]:
    found = shutil.which("ninja")
    if found:
        return [Finding("ninja", OK, found)]
    return [Finding("ninja", WARN, "not found: only ahead-of-time builds (torch's BuildExtension) need it",
                    "pip install ninja")]


def check_cache() -> List[Finding]:
    from ..jit import cache

    try:
        path = cache.require_writable()
        cache.check_safe(path)
    except KernelkitError as e:
        return [Finding("cache", FAIL, str(e), "point KERNELKIT_CACHE_DIR at a private directory of your own")]
    found = [Finding("cache", OK, f"{path} (yours, private, writable)")]
    free = shutil.disk_usage(path).free
    if free < _MIN_FREE_BYTES:
        found.append(Finding("cache space", WARN, f"{free / 2**30:.1f} GiB free at {path}",
                             "kernelkit cache gc --max-age-days 7, or a KERNELKIT_CACHE_DIR on a disk with room"))
    problem = _lock_problem(path)
    if problem:
        found.append(Finding("cache locks", FAIL, problem,
                             "put KERNELKIT_CACHE_DIR on a local disk (not NFS or another network file system)"))
    else:
        found.append(Finding("cache locks", OK, "file locks are honoured"))
    return found


def _lock_problem(path: Path) -> Optional[str]:
    """Two open files of one path locked exclusively must exclude each other (filelock relies on it): on a
    network file system without lock support the second lock is granted too, or the first fails."""
    fd, probe = tempfile.mkstemp(prefix=".doctor-lock-", dir=path)
    other = os.open(probe, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return f"locking a file in {path} fails: {e.strerror}"
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return None if e.errno in (errno.EAGAIN, errno.EACCES) else f"locking a file in {path} fails: {e.strerror}"
        return f"file locks in {path} are not exclusive: two builders of one entry would not wait for each other"
    finally:
        os.close(other)
        os.close(fd)
        os.unlink(probe)


def check_binary_tools() -> List[Finding]:
    from ..inspect import profiling, tools

    found = []
    for name, find, user, fix in (
            ("cuobjdump", lambda: tools.find("cuobjdump"), "compile reports", "pip install 'kernelkit[inspect]'"),
            ("nvdisasm", lambda: tools.find("nvdisasm"), "SASS views", "pip install 'kernelkit[inspect]'"),
            ("ncu", profiling.find_ncu, "kernelkit profile", "install Nsight Compute, or set KERNELKIT_NCU")):
        try:
            found.append(Finding(name, OK, find()))
        except KernelkitError:
            found.append(Finding(name, WARN, f"not found (needed only by {user})", fix))
    return found


CHECKS: List[Callable[[], List[Finding]]] = [check_settings, check_python_headers, check_host_compiler, check_nvcc,
                                             check_gpu, check_ninja, check_cache, check_binary_tools]


def run_checks(checks: List[Callable[[], List[Finding]]] = CHECKS) -> List[Finding]:
    """Every check's findings; a check that raises is a finding too (the doctor never stops half-way)."""
    found = []
    for check in checks:
        try:
            found += check()
        except Exception as e:  # noqa: BLE001 - a broken environment is what this command is for
            found.append(Finding(check.__name__.replace("check_", "").replace("_", " "), FAIL,
                                 f"the check itself failed: {type(e).__name__}: {e}"))
    return found


# ------------------------------------------------------------------------------------------ helpers
def _first_line(cmd: List[str]) -> str:
    out = _run_text(cmd).strip()
    return out.splitlines()[0] if out else ""


def _nvcc_release(nvcc: str) -> Optional[str]:
    """'13.0' from nvcc --version's last 'release 13.0, V13.0.88' line."""
    for line in reversed(_run_text([nvcc, "--version"]).splitlines()):
        if "release " in line:
            return line.split("release ", 1)[1].split(",")[0].strip()
    return None


def _run_text(cmd: List[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _driver_cuda_version() -> Optional[str]:
    """The CUDA version the driver supports ('13.0'), from the driver API through torch."""
    import torch

    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    try:
        v = int(get()) if get else 0
    except (RuntimeError, TypeError, ValueError):
        return None
    return f"{v // 1000}.{v % 1000 // 10}" if v else None


# --------------------------------------------------------------------------------------- the command
def cmd_doctor(args) -> int:
    found = run_checks()
    blocking = any(f.status == FAIL for f in found)
    if args.json:
        print(json.dumps({"blocking": blocking, "findings": [dataclasses.asdict(f) for f in found]}, indent=1))
    else:
        width = max(len(f.check) for f in found)
        for f in found:
            print(f"{f.status:<4}  {f.check:<{width}}  {f.detail}")
            if f.fix and f.status != OK:
                print(f"{'':<4}  {'':<{width}}  -> {f.fix}")
        print("builds cannot work until the 'fail' lines are fixed" if blocking else "nothing blocks builds")
    return 1 if blocking else 0


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="check what kernelkit needs here (compilers, CUDA, GPU, cache) and say "
                       "how to fix each problem",
                       description="Check Python's headers, the C++ compiler, nvcc and its CUDA version against "
                       "torch's, the driver and GPU, ninja, the cache directory (private, writable, free space, "
                       "file locks) and NVIDIA's binary tools. Exits 1 when something blocks builds.")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_doctor)
