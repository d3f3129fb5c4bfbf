"""Compilers, torch's include/library paths, and the CUDA arch list: everything a build depends on that is
not a source file. Identities are cheap (stat, no process spawned) so a warm load never runs a compiler."""
from __future__ import annotations

import _ctypes
import ctypes
import functools
import logging
import os
import re
import shutil
import sys
from typing import Dict, List, Optional, Sequence

import torch

from .. import settings
from ..errors import KernelkitError
from ..version import __version__
from . import cache, store
from .sources import sha256_bytes

log = logging.getLogger("kernelkit")


def _identity(find) -> str:
    """What a compiler is, for the cache key: its resolved path, size and mtime (no spawn). A compiler that
    is absent has an identity too, so keys can be made and a cached or prebuilt library found on a machine
    without one; only a build asks for the compiler itself (and then says it is missing)."""
    path = _present(find)
    if path is None:
        return "absent"
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{int(st.st_mtime)}"


def _present(find) -> Optional[str]:
    try:
        return find()
    except KernelkitError:
        return None


def cxx_if_present() -> Optional[str]:
    return _present(cxx)


@functools.lru_cache(maxsize=None)
def cxx() -> str:
    name = os.environ.get("CXX", "c++")
    found = shutil.which(name)
    if not found:
        raise KernelkitError(f"C++ compiler {name!r} not found (set CXX to a g++ or clang++ path)")
    return found


@functools.lru_cache(maxsize=None)
def nvcc() -> str:
    env = settings.NVCC.get()
    home = facts()["cuda_home"]
    candidates = [lambda: env, lambda: home and os.path.join(home, "bin", "nvcc"), lambda: shutil.which("nvcc")]
    for candidate in candidates:  # PATH is searched only when the others fail (a warm load keys nvcc)
        c = candidate()
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return str(c)
    bare = facts().get("cuda_home_without_nvcc")
    where = f": {bare} is a CUDA directory without bin/nvcc (a CUDA runtime, not the toolkit)" if bare else ""
    raise KernelkitError(f"nvcc not found{where}: install the CUDA toolkit or {pip_toolkit_advice()}, or set "
                         "KERNELKIT_NVCC or CUDA_HOME")


def has_nvcc(home: Optional[str]) -> bool:
    """Whether the CUDA directory ``home`` holds a compiler (a CUDA runtime image has the directory, not nvcc)."""
    return bool(home) and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK)


def choose_cuda_home(system: Optional[str]) -> "tuple[Optional[str], Optional[str]]":
    """(the CUDA toolkit to build with, a CUDA directory passed over or lacking nvcc): ``system`` (torch's
    CUDA_HOME) where it holds nvcc, else a toolkit from PyPI where one is installed, else ``system``."""
    if has_nvcc(system):
        return system, None
    pip = pip_cuda_home()
    if pip is not None:
        if system:  # said once per environment: the choice is recorded with the facts
            log.warning("kernelkit: found the CUDA directory %s without bin/nvcc (a CUDA runtime, not the toolkit) "
                        "and the CUDA toolkit from PyPI at %s: compiling with the latter", system, pip)
        return pip, system
    return system, system


def pip_toolkit_advice() -> str:
    """What PyPI offers for torch's CUDA major version: NVIDIA's compiler wheels from CUDA 13 on; for CUDA 12
    nvidia-cuda-nvcc-cu12 holds ptxas and libnvvm but no nvcc, so only instant kernels (NVRTC) work from pip."""
    major = str(torch.version.cuda or "13").split(".")[0]
    if major.isdigit() and int(major) < 13:
        return (f"use instant kernels (kernelkit.load_kernels), which need only NVRTC: pip install "
                f"'cuda-bindings=={major}.*' (PyPI has no nvcc for CUDA {major})")
    return "pip install 'kernelkit[cuda]' (NVIDIA's compiler wheels)"


def cudart_link_flag() -> str:
    """``-lcudart``, or the versioned file where the toolkit has no unversioned libcudart.so (NVIDIA's wheels
    ship libcudart.so.13 alone)."""
    dirs = torch_library_paths(True)
    if any(os.path.exists(os.path.join(d, "libcudart.so")) for d in dirs):
        return "-lcudart"
    major = str(torch.version.cuda).split(".")[0]
    if any(os.path.exists(os.path.join(d, f"libcudart.so.{major}")) for d in dirs):
        return f"-l:libcudart.so.{major}"
    return "-lcudart"


def pip_cuda_home() -> Optional[str]:
    """A CUDA toolkit installed from PyPI (``cuda-toolkit[nvcc,...]``: NVIDIA's wheels unpack bin/nvcc, include/
    and lib/ under ``nvidia/cu<major>``) of torch's CUDA major version, or None. Used where no system toolkit
    is found: a driver-only machine (Colab-like images, containers) compiles with it."""
    if not torch_has_cuda():
        return None
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    major = str(torch.version.cuda).split(".")[0]
    for root in (spec.submodule_search_locations or []) if spec else []:
        home = os.path.join(root, f"cu{major}")
        if os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return home
    return None


@functools.lru_cache(maxsize=None)
def is_gcc() -> bool:
    """Whether cxx() is GCC (its precompiled headers are what kernelkit uses). Spawns the compiler once,
    on a build path only."""
    import subprocess

    try:
        out = subprocess.run([cxx(), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "clang" not in out.lower() and ("gcc" in out.lower() or "g++" in out.lower() or "free software" in out.lower())


def launcher() -> List[str]:
    """Optional compiler launcher (ccache, sccache, a wrapper): prefixes every compile, not in the key."""
    import shlex  # not needed by a warm start

    return shlex.split(settings.COMPILER_LAUNCHER.get())


def torch_has_cuda() -> bool:
    return torch.version.cuda is not None


@functools.lru_cache(maxsize=None)
def cpp_extension():
    """torch.utils.cpp_extension, imported without its 'No CUDA runtime is found' warning on GPU-less
    machines (building CUDA code there is what kernelkit's compile-only mode is for)."""
    lg = logging.getLogger("torch.utils.cpp_extension")
    old = lg.level
    lg.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension as ce
    finally:
        lg.setLevel(old)
    return ce


def _paths(fn, device_type: str) -> List[str]:
    try:
        return list(fn(device_type=device_type))
    except TypeError:  # torch < 2.6 took a bool
        return list(fn(device_type == "cuda"))


def _compute_facts() -> Dict[str, object]:
    import sysconfig  # here, not at the top: a warm start computes no facts
    import warnings

    ce = cpp_extension()
    abi = getattr(ce, "_get_pybind11_abi_build_flags", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # torch writes them escaped for a shell/ninja line (-DX=\\"_gcc\\"); we pass argv directly
        pybind = [f.replace('\\"', '"') for f in abi()] if abi else []
    home, bare = choose_cuda_home(ce.CUDA_HOME)
    include_cuda, lib_cuda = _cuda_paths(ce, home) if torch_has_cuda() else ([], [])
    return {
        "cuda_home": home,
        "cuda_home_without_nvcc": bare,
        "include_cpu": _paths(ce.include_paths, "cpu"),
        "include_cuda": include_cuda,
        "lib_cpu": _paths(ce.library_paths, "cpu"),
        "lib_cuda": lib_cuda,
        "nvcc_flags": list(ce.COMMON_NVCC_FLAGS),
        "pybind_flags": pybind,
        "cuda_toolkit_version": _toolkit_version(home),
        "cxx_std": _torch_cxx_standard(_paths(ce.include_paths, "cpu")),
        "python_include": sysconfig.get_paths()["include"],
        "files": toolkit_files(home, bare),
    }


#: torch's guess at CUDA_HOME where neither CUDA_HOME, CUDA_PATH nor an nvcc on PATH names one (Linux)
TORCH_DEFAULT_CUDA_HOME = "/usr/local/cuda"


def _file_identity(path: str) -> str:
    """A file's size and mtime, or "absent" (a stat, no read)."""
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    return f"{st.st_size}:{st.st_mtime_ns}"


def toolkit_files(home: Optional[str], bare: Optional[str]) -> Dict[str, str]:
    """The files the CUDA facts came from, or whose arrival would change them, with their size and mtime: the
    chosen toolkit's nvcc and cuda.h (an upgrade in place changes its version and headers), the nvcc of a
    directory passed over and of torch's default guess, and, where the chosen directory has no nvcc, the nvcc
    PATH finds (a toolkit installed since). A few stats: cheap enough to check on every cold facts read."""
    paths = [os.path.join(d, "bin", "nvcc") for d in (home, bare, TORCH_DEFAULT_CUDA_HOME) if d]
    paths += [os.path.join(home, "include", "cuda.h")] if home else []
    files = {p: _file_identity(p) for p in dict.fromkeys(paths)}
    if not has_nvcc(home):
        on_path = shutil.which("nvcc")
        files["PATH:nvcc"] = f"{on_path}:{_file_identity(on_path)}" if on_path else "absent"
    return files


def _same_toolkit(stored: Dict[str, object]) -> bool:
    """Whether recorded facts still name the toolkit there is (installing or removing NVIDIA's wheels, or a
    system toolkit, changes no environment variable): the one recorded still has its nvcc and the directory
    passed over for it still has none; where none had nvcc, none has been installed from PyPI since (only
    that case pays for looking)."""
    home, bare = stored["cuda_home"], stored["cuda_home_without_nvcc"]
    if stored.get("files") != toolkit_files(home, bare):  # a file they came from changed, or a toolkit arrived
        return False
    if has_nvcc(home):
        return not has_nvcc(bare)
    return (home is None or os.path.isdir(home)) and pip_cuda_home() is None


def _cuda_paths(ce, home: Optional[str]):
    """torch's include and library paths for CUDA, with ``home`` as its CUDA_HOME (torch looks only for a
    system toolkit; a toolkit from PyPI is told to it here). With no toolkit at all: the CPU paths, so C++
    builds still work and a CUDA build says that nvcc is missing."""
    if not home:
        return _paths(ce.include_paths, "cpu"), _paths(ce.library_paths, "cpu")
    saved = ce.CUDA_HOME
    ce.CUDA_HOME = home
    try:
        return _paths(ce.include_paths, "cuda"), _paths(ce.library_paths, "cuda")
    finally:
        ce.CUDA_HOME = saved


def _torch_cxx_standard(include_dirs: List[str]) -> str:
    """The C++ standard torch's headers require, as ATen.h states it in its guard (#error "C++20 or later
    compatible compiler is required"): C++17 through torch 2.11, C++20 in later releases. Asking the
    headers rather than the version number keeps nightlies and backports right."""
    for d in include_dirs:
        try:
            with open(os.path.join(d, "ATen", "ATen.h"), errors="replace") as f:
                m = re.search(r"C\+\+\s*(\d+) or later compatible compiler is required", f.read(1 << 16))
        except OSError:
            continue
        if m:
            return f"c++{max(17, int(m.group(1)))}"
    return "c++17"


def _toolkit_version(home: Optional[str]) -> Optional[str]:
    """The CUDA toolkit's version from its cuda.h (no nvcc spawn), e.g. '13.0'."""
    return cuda_header_version(os.path.join(home, "include")) if home else None


def cuda_header_version(include: "str | os.PathLike") -> Optional[str]:
    """The CUDA version of the headers in ``include`` (its cuda.h's CUDA_VERSION), e.g. '12.4'."""
    try:
        with open(os.path.join(include, "cuda.h"), errors="replace") as f:
            m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", f.read(1 << 18))
    except OSError:
        return None
    return f"{int(m.group(1)) // 1000}.{int(m.group(1)) % 1000 // 10}" if m else None


def check_cuda_match(what: str) -> None:
    """torch refuses code built by another CUDA major version; say so before compiling anything."""
    if not torch_has_cuda():
        raise KernelkitError(f"{what} has CUDA sources, but this torch ({torch.__version__}) is a CPU-only "
                             "build: install a CUDA build of torch to compile it")
    toolkit = facts().get("cuda_toolkit_version")
    if toolkit and toolkit.split(".")[0] != str(torch.version.cuda).split(".")[0]:
        raise KernelkitError(
            f"{what}: this torch is built for CUDA {torch.version.cuda}, but the CUDA toolkit at "
            f"{facts()['cuda_home']} is {toolkit}; code built by one CUDA major version cannot load into the "
            "other. Install a torch build for that CUDA, or point CUDA_HOME / KERNELKIT_NVCC at a matching toolkit "
            "(`kernelkit doctor` checks the whole toolchain).")


def facts_key() -> str:
    """The key of the toolchain facts record: what the facts depend on, and the row's schema (``store.STORES``).
    Derived here, not in ``keys``: keys.toolchain_dirs imports this module, which cannot import keys back."""
    env = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "PATH", "ROCM_HOME")]
    parts = [f"toolchain/{store.row('toolchain').schema}", sys.prefix, torch.__file__, torch.__version__, *env]
    return sha256_bytes(*[p.encode("utf-8", "surrogateescape") for p in parts])[:24]


@functools.lru_cache(maxsize=None)
def facts() -> Dict[str, object]:
    """torch's include/library paths, CUDA_HOME and nvcc flags. Importing torch.utils.cpp_extension
    (it imports setuptools) costs ~0.2 s, so a warm load reads them from a small record in the cache,
    keyed by the environment they depend on (``facts_key``) and trusted only while the files they came from
    are unchanged (``toolkit_files``, ``_same_toolkit``)."""
    key = facts_key()
    lists = ("include_cpu", "include_cuda", "lib_cpu", "lib_cuda", "nvcc_flags", "pybind_flags")
    optional = ("cuda_home", "cuda_home_without_nvcc", "cuda_toolkit_version")
    stored = cache.read_record("toolchain", key)
    # a damaged record (valid JSON of the wrong shape, e.g. `{}`) is recomputed, never trusted
    if (isinstance(stored, dict) and isinstance(stored.get("cxx_std"), str)
            and isinstance(stored.get("python_include"), str)
            and all(isinstance(stored.get(k), list) and all(isinstance(x, str) for x in stored[k]) for k in lists)
            and all(k in stored and (stored[k] is None or isinstance(stored[k], str)) for k in optional)
            and _same_toolkit(stored)):
        return stored
    found = _compute_facts()
    cache.write_record("toolchain", key, found)  # best effort: a read-only cache still works, just slower
    return found


def pybind_abi_flags() -> List[str]:
    """Flags that make a pybind11 module ABI-compatible with torch's own (empty on new torch)."""
    return list(facts()["pybind_flags"])


def torch_include_paths(cuda: bool) -> List[str]:
    return list(facts()["include_cuda" if cuda else "include_cpu"])


def torch_library_paths(cuda: bool) -> List[str]:
    return list(facts()["lib_cuda" if cuda else "lib_cpu"])


@functools.lru_cache(maxsize=None)
def runtime_libstdcxx() -> Optional[str]:
    """The libstdc++ this process runs with (torch's). Linked explicitly: a compiler that only has a static
    libstdc++.a (seen on a GPU host's relocated gcc) would otherwise embed a second copy whose locale state
    is never initialised, and formatting a number in an error message then crashes the process."""
    loaded = _loaded_library("libstdc++.so.6")
    if loaded is not None:
        return loaded
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split() if "/libstdc++.so" in line else ()  # split only the few lines that can match
                if len(fields) >= 6 and "/libstdc++.so" in fields[-1] and os.path.isfile(fields[-1]):
                    return fields[-1]
    except OSError:
        pass
    return None


class _LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]  # the head of glibc's struct link_map


_LINK_MAP_POINTER = ctypes.POINTER(_LinkMap)


def _loaded_library(soname: str) -> Optional[str]:
    """The file of a shared library this process has loaded, asked of the dynamic loader (dlinfo): a warm load
    cannot afford to read the hundreds of lines of /proc/self/maps of a process that imported torch."""
    try:  # the process's own symbols and a bare handle: a ctypes.CDLL each would make a class per library
        dlinfo = ctypes.pythonapi.dlinfo
        handle = _ctypes.dlopen(soname, os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):  # not loaded, or no dlinfo (not glibc)
        return None
    link_map = _LINK_MAP_POINTER()
    if dlinfo(ctypes.c_void_p(handle), 2, ctypes.byref(link_map)) != 0 or not link_map:  # 2: RTLD_DI_LINKMAP
        return None
    name = link_map.contents.l_name
    return os.path.realpath(os.fsdecode(name)) if name and os.path.isfile(name) else None


def cxx11_abi() -> int:
    return int(torch._C._GLIBCXX_USE_CXX11_ABI)


def python_include() -> str:
    """Where Python.h is (read from the cached facts: sysconfig takes milliseconds to load)."""
    return str(facts()["python_include"])


def cxx_standard_flag() -> str:
    """-std= for every unit: the standard torch's headers require (a card's TUs and the binding share it)."""
    return f"-std={facts().get('cxx_std', 'c++17')}"


def torch_nvcc_flags() -> List[str]:
    """torch's own nvcc flags, needed only when a .cu includes torch headers (they disable cuda_fp16's
    operators, which would clash with c10::Half)."""
    return list(facts()["nvcc_flags"])


@functools.lru_cache(maxsize=None)
def fingerprint() -> str:
    """Everything outside the sources that changes what a build produces."""
    parts = [
        f"kernelkit={__version__}",
        f"torch={torch.__version__}",
        f"torch.cuda={torch.version.cuda}",
        f"abi={cxx11_abi()}",
        f"python={sys.implementation.cache_tag}",
        f"cxx={_identity(cxx)}",
    ]
    return "\n".join(parts)


#: what nvcc reads from the environment that changes what it builds
NVCC_ENVIRONMENT = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")


@functools.lru_cache(maxsize=None)
def _nvcc_identity() -> str:
    return f"nvcc={_identity(nvcc)}"


def nvcc_fingerprint() -> str:
    """nvcc's identity and the environment it reads (its flags there change every object it makes)."""
    env = ";".join(f"{k}={os.environ[k]}" for k in NVCC_ENVIRONMENT if k in os.environ)
    return _nvcc_identity() + (f";{env}" if env else "")


# -------------------------------------------------------------------------------------------- arch list
_ARCH = re.compile(r"^(?:sm_|compute_)?(\d+)\.?(\d)([af]?)(\+PTX)?$", re.I)


def parse_arch_list(spec: "str | Sequence[str]") -> List[str]:
    """'8.0;9.0+PTX', '8.0 9.0', ['sm_90a'] -> ['8.0', '9.0+PTX'] (normalised, deduplicated)."""
    # str methods, not re.split: a warm load parses TORCH_CUDA_ARCH_LIST, and compiling a pattern costs 0.1 ms
    items = spec.replace(";", " ").replace(",", " ").split() if isinstance(spec, str) else list(spec)
    out: List[str] = []
    for item in items:
        if not item:
            continue
        m = _ARCH.match(str(item).strip())
        if not m:
            raise ValueError(f"arch: expected entries like '9.0', '8.6+PTX', 'sm_90a', got {item!r}")
        norm = f"{m.group(1)}.{m.group(2)}{m.group(3).lower()}" + ("+PTX" if m.group(4) else "")
        if norm not in out:
            out.append(norm)
    if not out:
        raise ValueError(f"arch: empty arch list {spec!r}")
    return out


_warned_no_gpu = False


def arch_list(explicit: "str | Sequence[str] | None" = None, no_gpu: Sequence[str] = ("9.0",)) -> List[str]:
    """Argument > KERNELKIT_ARCH > TORCH_CUDA_ARCH_LIST > the current device > ``no_gpu`` (no GPU visible;
    ``()`` builds nothing there)."""
    global _warned_no_gpu
    for source in (explicit, settings.ARCH.get(), os.environ.get("TORCH_CUDA_ARCH_LIST")):
        if source:
            return parse_arch_list(source)
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return [f"{major}.{minor}"]
    if not no_gpu:
        return []
    archs = parse_arch_list(no_gpu)
    if not _warned_no_gpu:
        built = ", ".join("sm_" + a.replace(".", "").replace("+PTX", "") for a in archs)
        log.info("no CUDA device visible: building CUDA code for %s (set KERNELKIT_ARCH to choose)", built)
        _warned_no_gpu = True
    return archs


def gencode_flags(archs: Sequence[str]) -> List[str]:
    flags = []
    for a in archs:
        ptx = a.endswith("+PTX")
        num = a.replace("+PTX", "").replace(".", "")
        flags += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
        if ptx:
            flags += ["-gencode", f"arch=compute_{num},code=compute_{num}"]
    return flags
