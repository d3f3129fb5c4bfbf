"""The entry points: ``load`` (a card's files, or torch-style extension sources), ``load_inline`` (strings:
torch's form or kernelkit's), ``library`` (the latest loaded build, for hot paths), ``refresh``/``autoreload``
(hot reload). ``load``/``load_inline`` take torch.utils.cpp_extension's arguments in torch's order."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import logging
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

from ..errors import KernelkitError
from . import build as _build
from . import cache, plan, prebuilt, registry
from .cards import Card, find as find_card
from .library import Library, import_extension
from .progress import say

log = logging.getLogger("kernelkit")

_LOCK = threading.RLock()
# the loaded builds and each name's current one live in jit.registry (kernelkit.ops reads them there)
_EXTENSIONS: Dict[str, tuple] = {}  # torch-style build key -> (what load returned, the built file)


@dataclasses.dataclass
class BuildInfo:
    """What ``load(..., load=False)`` returns: a build in the cache, not opened in this process."""

    name: str
    key: str
    path: Path
    cached: bool
    build_seconds: float
    #: a card's NVRTC kernels, compiled (not loaded) for every arch asked for (``instant.card_kernels``)
    nvrtc: Optional[object] = None


def obtain(target: _build.Target, prebuilt_ok: bool = True, group=None):
    """(path, cached, seconds): a verified cache entry first, then a prebuilt (AOT) library, then a build.
    Takes no process-wide lock (the cache's file locks keep concurrent builders apart). ``group``: a
    torch.distributed group whose ranks all call this; one builds, the others receive it (jit.distributed)."""
    if group is not None:
        from . import distributed

        return distributed.obtain_library(target, group, prebuilt_ok)
    so = cache.verified_library(target.name, target.key)
    if so is not None:
        return so, True, 0.0
    ready = prebuilt.find_prebuilt(target) if prebuilt_ok else None
    if ready is not None:
        say(f"{target.name}: using prebuilt {ready}")
        return ready, True, 0.0
    return _build.build(target)


def _open(target: _build.Target, card: Optional[Card], options: dict, do_load: bool, group=None, nvrtc=None):
    """``nvrtc``: the card's NVRTC kernels (``instant.card_kernels``), handed to the library before it
    becomes the card's current build."""
    with _LOCK:
        lib = registry.by_key(target.key)
        if lib is not None and group is not None:
            obtain(target, group=group)  # loaded here already, but the other ranks expect this one in the exchange
        if lib is not None:  # unchanged: no compiler, no dlopen, no hashing of the .so
            if card is not None:  # identical content may live elsewhere: watch the files asked for now
                lib.card, lib._options = card, options
            if nvrtc is not None and do_load and lib.nvrtc != nvrtc:  # only kernel files changed: no rebuild
                nvrtc.hand_to(lib)
            if registry.latest(target.name) is not lib:
                registry.activate(lib)
            return lib
        so, cached, seconds = obtain(target, group=group)
        if not do_load:
            return BuildInfo(target.name, target.key, so, cached, seconds, nvrtc)
        if cached:
            say(f"{target.name}: reusing cached build {target.key[:12]}")
        lib = _loading(target, so, lambda: Library(target.name, target.key, so, pymodule=target.pymodule,
                                                   cached=cached, build_seconds=seconds, card=card))
        lib._options = options
        if nvrtc is not None:
            nvrtc.hand_to(lib)
        module = card.module() if card is not None else None
        if module is not None and hasattr(module, "setup"):
            module.setup(lib)  # optional: the card's fake/autograd registrations, for this build's namespace
        registry.add(lib)  # its ops are bound for kernelkit.ops from the dispatcher, no card code needed
        return lib


_UNDEFINED = re.compile(r"undefined symbol: (\S+)")


def _loading(target: _build.Target, so: Path, opener):
    """Open a built library; one that names a symbol no source defines is removed from the cache (it can
    never load) and reported with the symbol demangled."""
    try:
        return opener()
    except (OSError, ImportError) as e:
        m = _UNDEFINED.search(f"{e} {e.__cause__} {e.__context__}")  # torch.ops.load_library wraps the OSError
        if m is None:
            raise
        cache.remove_library(target.name, target.key)
        raise KernelkitError(
            f"loading {target.name} failed: undefined symbol {_demangle(m.group(1))}. Something is declared and "
            "called but defined in none of the sources (a missing source file, a signature that differs between "
            "the declaration and the definition, or a library missing from extra_ldflags). The broken build "
            "was removed from the cache.") from None


def _demangle(symbol: str) -> str:
    try:
        out = subprocess.run(["c++filt", symbol], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return symbol
    return f"{out} ({symbol})" if out and out != symbol else symbol


# ------------------------------------------------------------------------------ torch-style extensions
_TORCH_LIBRARY = re.compile(r"\bTORCH_LIBRARY\s*\(\s*(\w+)\s*,")


def _refuse_redefined_namespaces(target: _build.Target) -> None:
    """torch aborts the process when a second library defines a TORCH_LIBRARY namespace: refuse first."""
    defined = {ns for u in target.units for ns in _TORCH_LIBRARY.findall(u.path.read_text(errors="replace"))}
    if not defined:
        return
    existing = {s.name.split("::")[0] for s in torch._C._jit_get_all_schemas()}
    clash = sorted(defined & existing)
    if clash:
        raise KernelkitError(
            f"{target.name}: TORCH_LIBRARY({clash[0]}, ...) is already defined in this process (by an earlier "
            "build of this code, or another library), and torch allows one definition of a namespace per "
            "process: loading this build would abort it. Restart the process (in Jupyter: restart the kernel) to "
            "load the edited code, or register the ops with KERNELKIT_LIBRARY, whose namespace is new per build.")


def _copy_into(build_directory, target: _build.Target, so: Path) -> Path:
    """torch's build_directory: the finished library (and load_inline's sources) also land there."""
    d = Path(build_directory).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    final = d / (target.name if target.standalone else f"{target.name}.so")
    tmp = d / f".{final.name}.{os.getpid()}.tmp"
    shutil.copy2(so, tmp)
    os.replace(tmp, final)
    for u in target.units:
        if u.path.parent.parent == cache.subdir("src"):  # a generated main.cpp / cuda.cu
            shutil.copy2(u.path, d / u.path.name)
    return final


def _open_extension(target: _build.Target, is_python_module: bool, build_directory, do_load: bool, group=None):
    with _LOCK:
        hit = _EXTENSIONS.get(target.key)
        if hit is not None and group is not None:
            obtain(target, prebuilt_ok=False, group=group)  # the other ranks expect this one in the exchange
        if hit is None:
            if not target.standalone and not is_python_module:
                _refuse_redefined_namespaces(target)
            so, cached, seconds = obtain(target, prebuilt_ok=False, group=group)
            if not do_load:
                return BuildInfo(target.name, target.key, so, cached, seconds)
            if cached:
                say(f"{target.name}: reusing cached build {target.key[:12]}")
            if target.standalone:
                result: object = str(so)
            elif is_python_module:
                result = _loading(target, so, lambda: _import_module(target, so))
            else:
                _loading(target, so, lambda: torch.ops.load_library(str(so)))
                result = str(so)
            hit = _EXTENSIONS[target.key] = (result, so)
        result, so = hit
        if build_directory is not None:
            copied = _copy_into(build_directory, target, so)
            if target.standalone:
                return str(copied)
        return result


def _import_module(target: _build.Target, so: Path):
    module = import_extension(target.import_name, so)
    module.__name__ = target.name  # as torch names it (its spec keeps the per-build import name)
    module.__kernelkit_key__ = target.key
    return module


# ----------------------------------------------------------------------------------------- entry points
def _entry_point(fn):
    """Raise kernelkit's errors from the user's call, not from deep in the build's thread pool (in a notebook
    the mapped compiler errors are then the first thing on screen); an unknown keyword names the one it
    resembles (torch's keywords are many and alike)."""
    params = inspect.signature(fn).parameters

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for k in kwargs:
            if k not in params:
                close = difflib.get_close_matches(k, list(params), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else f"; it takes: {', '.join(params)}"
                raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {k!r}{hint}")
        try:
            return fn(*args, **kwargs)
        except KernelkitError as e:
            raise e.with_traceback(None)

    return wrapper


def _source_paths(sources) -> List[Path]:
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise ValueError("sources: expected at least one source file")
    paths = []
    for s in items:
        if not isinstance(s, (str, os.PathLike)):
            raise TypeError(f"sources: expected file paths, got {s!r:.80}")
        p = Path(s).expanduser().resolve()
        if not p.is_file():
            raise FileNotFoundError(f"sources: {s} does not exist")
        paths.append(p)
    return paths


@_entry_point
def load(name: Union[str, os.PathLike], sources=None, extra_cflags=None, extra_cuda_cflags=None,
         extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose: bool = False,
         with_cuda: Optional[bool] = None, is_python_module: bool = True, is_standalone: bool = False,
         keep_intermediates: bool = True, *, kernels_dir=None, arch=None, load: bool = True,
         extra_sycl_cflags=None, with_sycl: Optional[bool] = None, group=None):
    """Two uses, one function.

    ``load(name, sources, ...)`` is ``torch.utils.cpp_extension.load``: the same arguments in the same order,
    torch-style sources (``<torch/extension.h>``, ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``,
    ``TORCH_LIBRARY``), the same return value (the module; the library's path with
    ``is_python_module=False``; the executable's with ``is_standalone=True``). Each source is its own
    cached unit, so an edit recompiles that file only, and a warm cache loads without a compiler.
    ``build_directory`` receives a copy of the result (the build itself lives in kernelkit's cache);
    ``keep_intermediates`` is accepted and has no effect (it is for HIP in torch).

    ``load(name)`` builds (or reuses) the card ``name`` on the kernel search path (``kernels_dir`` or
    ``KERNELKIT_PATH`` plus the built-in cards), or a path to a card's ``.cu``/``.cpp``, and returns its
    :class:`Library`. Calling again after an edit returns the new build; unchanged, the same object. A card
    whose spec lists ``nvrtc_sources`` has those files compiled by NVRTC (docs/instant.md, "Cards with NVRTC
    device code"): an edit of one recompiles it in tens of milliseconds and hands the new kernels to the
    same library object, whose binding is not rebuilt.

    Both: ``arch`` ("8.0;9.0", or a list) overrides the CUDA architectures (default: the current GPU's);
    ``load=False`` builds into the cache without opening the result (e.g. compile-only on a machine
    without a GPU) and returns a :class:`BuildInfo`. ``group``: a torch.distributed process group whose
    ranks all make this call: its rank 0 builds (or finds the build), the others receive the library over
    the group and check it against their own sources' key (README, "Multi-GPU and clusters").
    """
    _verbose(verbose)
    _refuse_sycl(extra_sycl_cflags=extra_sycl_cflags, with_sycl=with_sycl)
    cflags = plan.flag_list(extra_cflags, "extra_cflags")
    cuflags = plan.flag_list(extra_cuda_cflags, "extra_cuda_cflags")
    incs = plan.flag_list(extra_include_paths, "extra_include_paths")
    ldflags = plan.flag_list(extra_ldflags, "extra_ldflags")
    if sources is not None:
        if is_python_module and is_standalone:
            raise ValueError("is_python_module and is_standalone are mutually exclusive (pass "
                             "is_python_module=False with is_standalone=True)")
        with _joining(group, name):
            target = plan.plan_extension(str(name), _source_paths(sources), arch=arch, extra_cflags=cflags,
                                         extra_cuda_cflags=cuflags, extra_ldflags=ldflags, extra_include_paths=incs,
                                         with_cuda=with_cuda, is_python_module=is_python_module,
                                         is_standalone=is_standalone)
        return _open_extension(target, is_python_module, build_directory, load, group)
    torch_only = {"build_directory": build_directory, "with_cuda": with_cuda,
                  "is_python_module": None if is_python_module else False,
                  "is_standalone": is_standalone or None}
    given = [k for k, v in torch_only.items() if v is not None]
    if given:
        raise ValueError(f"{given[0]}= applies to torch-style builds: pass sources=[...] too, or drop it to "
                         f"load the card {name!r}")
    options = dict(kernels_dir=kernels_dir, arch=arch, extra_cflags=extra_cflags,
                   extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
                   extra_include_paths=extra_include_paths)
    with _joining(group, name):
        card = find_card(name, kernels_dir)
        target = plan.plan_card(card, arch, cflags, cuflags, ldflags, incs)
    nvrtc = _card_kernels(card, arch, incs, load, group)  # before the binding: a kernel error keeps the build in use
    return _open(target, card, {**options, "name": str(name)}, load, group, nvrtc)


def _card_kernels(card: Card, arch, include_paths, do_load: bool, group):
    """The card's ``nvrtc_sources`` compiled (and loaded, with a GPU) through the instant-kernel path; None
    when it has none (the instant machinery is then not imported)."""
    if not card.nvrtc_sources():
        return None
    from ..instant import card_kernels

    return card_kernels.obtain(card, arch, include_paths, compile_only=not do_load, group=group)


@_entry_point
def load_inline(name: str, cpp_sources=None, cuda_sources=None, functions=None, extra_cflags=None,
                extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None, build_directory=None,
                verbose: bool = False, with_cuda: Optional[bool] = None, is_python_module: bool = True,
                with_pytorch_error_handling: bool = True, keep_intermediates: bool = True, use_pch: bool = False,
                no_implicit_headers: bool = False, *, cuda: Optional[str] = None, cpp: Optional[str] = None,
                arch=None, sycl_sources=None, extra_sycl_cflags=None, with_sycl: Optional[bool] = None, group=None):
    """Build from source strings (a notebook cell). Two forms:

    torch's: ``load_inline(name, cpp_sources, cuda_sources=None, functions=None, ...)`` with
    ``torch.utils.cpp_extension.load_inline``'s arguments, order and result (the module, or the library's
    path with ``is_python_module=False``). kernelkit writes the same ``main.cpp``/``cuda.cu`` torch would,
    caches each by content (an edit of the CUDA part recompiles only it), and cites compiler errors at the
    line of the string you passed. ``use_pch`` and ``keep_intermediates`` are accepted and have no effect:
    the cached ``main.cpp`` object already spares its recompiles.

    kernelkit's: ``load_inline(name, cuda=..., cpp=..., functions=...)`` returns a :class:`Library`.
    ``cuda`` is device code compiled alone (keep torch out of it for ~1 s rebuilds); ``cpp`` the
    torch-facing side: declarations, wrappers, and a ``KERNELKIT_LIBRARY(m) {...}`` block (torch ops) or
    ``functions`` bound with pybind11. Errors name ``<name>.cu``/``<name>.cpp`` and the line in your string.

    ``group``: as for :func:`load`, one rank of a torch.distributed group builds for all of them.
    """
    _verbose(verbose)
    _refuse_sycl(sycl_sources=sycl_sources, extra_sycl_cflags=extra_sycl_cflags, with_sycl=with_sycl)
    cflags = plan.flag_list(extra_cflags, "extra_cflags")
    cuflags = plan.flag_list(extra_cuda_cflags, "extra_cuda_cflags")
    incs = plan.flag_list(extra_include_paths, "extra_include_paths")
    ldflags = plan.flag_list(extra_ldflags, "extra_ldflags")
    if cuda is None and cpp is None:
        if cpp_sources is None:
            raise TypeError("load_inline() needs source code: cpp_sources (torch's form: name, cpp_sources, "
                            "cuda_sources, functions) or kernelkit's cuda=/cpp= keywords")
        with _joining(group, name):
            target = plan.plan_torch_inline(name, cpp_sources, cuda_sources, functions,
                                            with_pytorch_error_handling=with_pytorch_error_handling,
                                            no_implicit_headers=no_implicit_headers, arch=arch, extra_cflags=cflags,
                                            extra_cuda_cflags=cuflags, extra_ldflags=ldflags,
                                            extra_include_paths=incs, with_cuda=with_cuda,
                                            is_python_module=is_python_module)
        return _open_extension(target, is_python_module, build_directory, True, group)
    if cpp_sources is not None or cuda_sources is not None:
        raise TypeError("load_inline(): pass either torch's cpp_sources/cuda_sources or kernelkit's cpp=/cuda=, "
                        "not both")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected an identifier (it names the library), got {name!r}")
    for arg, val in (("cuda", cuda), ("cpp", cpp)):
        if val is not None and not isinstance(val, str):
            raise TypeError(f"{arg}: expected source code as a str, got {type(val).__name__}")
    if not cuda and not cpp:
        raise ValueError("load_inline needs source code: pass cuda=..., cpp=... or both")
    if cpp:
        plan.refuse_device_code(cpp, "cpp", instead="cuda=")
    with _joining(group, name):
        target = plan.plan_inline(name, cuda, cpp, plan.function_map(functions), arch, cflags, cuflags, ldflags,
                                  incs)
    return _open(target, None, {}, True, group)


def _joining(group, name):
    """Under group=, a rank whose planning fails still joins the exchange, so the others raise instead of waiting."""
    if group is None:
        return contextlib.nullcontext()
    from . import distributed

    return distributed.joining(group, str(name))


def _refuse_sycl(**given) -> None:
    """torch's SYCL keywords are accepted by name (calls written for torch 2.8+ pass them) but not built."""
    for k, v in given.items():
        if v:
            raise ValueError(f"{k}: kernelkit builds C++ and CUDA sources, not SYCL")


def _verbose(verbose: Optional[bool]) -> None:
    if verbose:
        logging.basicConfig()
        log.setLevel(logging.DEBUG)


def library(name: str) -> Library:
    """The newest loaded build of ``name``, loading it on first use. No freshness check: cheap enough
    for every call of an op. Use :func:`load` or :func:`refresh` to pick up edits."""
    lib = registry.latest(name)
    if lib is None:
        lib = load(name)
    return lib


def reload(lib: Library) -> Library:
    if lib.card is None:
        raise KernelkitError(f"{lib.name} was built from strings: call load_inline again with the new code")
    opts = dict(lib._options)
    return load(opts.pop("name"), **opts)


_GONE: Dict[str, str] = {}  # card name -> the file of it found missing (noted once, until it is back)


def refresh() -> List[str]:
    """Reload every card loaded in this process whose sources changed; returns the names reloaded (a card
    whose ``nvrtc_sources`` alone changed keeps its build, which gets the recompiled kernels). A card whose
    files are gone keeps its loaded build and is skipped with a one-line warning, once."""
    changed = []
    for name, lib in registry.current().items():
        if lib.card is None:
            continue
        gone = lib.card.missing_file()
        if gone is not None:
            if _GONE.get(name) != gone:
                log.warning("kernelkit.refresh: skipping %s: %s is gone (the loaded build stays in use)", name, gone)
            _GONE[name] = gone
            continue
        _GONE.pop(name, None)
        kernels = lib.nvrtc
        new = reload(lib)
        if new is not lib or new.nvrtc != kernels:  # a new build, or new NVRTC kernels handed to the same one
            changed.append(name)
    return changed


_HOOKED = False


def autoreload(enable: bool = True) -> bool:
    """In IPython/Jupyter, reload edited cards before every cell runs. Returns whether it is active."""
    global _HOOKED
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is None:
        log.warning("autoreload works inside IPython; in a script call kernelkit.refresh()")
        return False

    def _pre_run_cell(*_):
        for name in refresh():
            say(f"reloaded {name}")

    if enable and not _HOOKED:
        shell.events.register("pre_run_cell", _pre_run_cell)
        autoreload._hook = _pre_run_cell
        _HOOKED = True
    elif not enable and _HOOKED:
        shell.events.unregister("pre_run_cell", autoreload._hook)
        _HOOKED = False
    return _HOOKED
