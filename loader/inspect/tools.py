"""Finding and running NVIDIA's binary tools (cuobjdump, ncu) and c++filt."""
from __future__ import annotations

import functools
import glob
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..errors import KernelkitError
from ..settings import Setting

#: the PyPI package that ships each tool, for machines without the full CUDA toolkit
PACKAGES = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}


def _wheel_bins() -> List[Path]:
    """bin/ folders of NVIDIA's PyPI packages (nvidia/cu13/bin, nvidia/cuda_cuobjdump/bin, ...)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for root in spec.submodule_search_locations:
        found += sorted(Path(root).glob("*/bin"), reverse=True)  # cu13 before cu12
    return found


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@functools.lru_cache(maxsize=None)
def find(name: str) -> str:
    """:func:`locate` with its defaults, once per process (cuobjdump and c++filt do not move while it runs)."""
    return locate(name)


def locate(name: str, env: Optional[Setting] = None, dirs: Optional[Tuple[str, ...]] = None) -> str:
    """The tool's path: the file the setting ``env`` names when it is set, else the first found in CUDA_HOME/bin,
    CUDA_PATH/bin, PATH, /usr/local/cuda/bin, then NVIDIA's PyPI wheels. ``dirs`` (glob patterns, newest match
    first) replace all of these but PATH."""
    named = env.get() if env else None
    if named:
        if not _executable(named):
            raise KernelkitError(f"{name}: {env.name}={named} is not an executable file")
        return str(named)
    if dirs is None:
        before = [Path(home) / "bin" for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if home]
        after = [Path("/usr/local/cuda/bin"), *_wheel_bins()]
    else:
        before = []
        after = [Path(d) for pattern in dirs for d in sorted(glob.glob(pattern), reverse=True)]  # 2025.3 before 2024.1
    for d in before:
        if _executable(d / name):
            return str(d / name)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    for d in after:
        if _executable(d / name):
            return str(d / name)
    if dirs is not None:
        unset = f"in {env.name} (unset), " if env else ""
        raise KernelkitError(f"{name}: not found {unset}on PATH, nor in {', '.join(d + '/' for d in dirs)}")
    package = PACKAGES.get(name, name)
    raise KernelkitError(f"kernelkit.inspect needs NVIDIA's {name}, found neither in CUDA_HOME/bin nor on PATH nor "
                         f"in a PyPI wheel: pip install 'kernelkit[inspect]' (or pip install {package})")


def _tool_env() -> dict:
    """cuobjdump disassembles through nvdisasm, which it finds on PATH only: where nvdisasm came from a PyPI
    wheel (or CUDA_HOME/bin), its folder goes first on the child's PATH."""
    env = dict(os.environ)
    try:
        env["PATH"] = os.pathsep.join([str(Path(find("nvdisasm")).parent), env.get("PATH", "")])
    except KernelkitError:
        pass  # cuobjdump says itself that it needs nvdisasm, for the views that do
    return env


def run(tool: str, args: Sequence[str], path: Path) -> str:
    """The tool's standard output for ``path``; its error output in the exception when it fails."""
    cmd = [find(tool), *args, str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120, env=_tool_env())
    except subprocess.TimeoutExpired:
        raise KernelkitError(f"{tool} took over 120 s on {path}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise KernelkitError(f"{tool} {' '.join(args)} failed on {path}: {why[-1] if why else done.returncode}")
    return done.stdout


def demangle(symbols: Sequence[str]) -> List[str]:
    """C++ names for mangled symbols (one c++filt process for all); the symbol itself where it cannot."""
    mangled = [s for s in symbols if s.startswith("_Z")]
    exe: Optional[str] = shutil.which("c++filt")
    if not mangled or exe is None:
        return list(symbols)
    try:
        out = subprocess.run([exe], input="\n".join(mangled), capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return list(symbols)
    names = dict(zip(mangled, out.splitlines()))
    return [names.get(s) or s for s in symbols]
