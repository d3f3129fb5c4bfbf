"""Turning a planned target into what the caller gets: a :class:`Library`, a torch-style extension's module
(or path), or a :class:`BuildInfo` when nothing is to be opened.

Locks guard only what they must: the registry lookup and the opening of one build key (a library is
opened and its ops registered once per process). Builds run outside any process-wide lock, so a build
that takes minutes never blocks another load in this process; the cache's file locks keep builders of
one entry apart.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch

from .. import replace_file
from ..errors import KernelkitError
from ..jit import cache, fast, obtain, registry
from ..jit.cards import Card
from ..jit.library import Library, import_extension
from ..jit.progress import say
from ..jit.units import Target


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


_GUARD = threading.Lock()
_KEY_LOCKS: Dict[str, threading.Lock] = {}


@contextlib.contextmanager
def _opening(key: str) -> Iterator[None]:
    """One thread at a time opens a given build key; other keys go on."""
    with _GUARD:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        yield


def _obtain(target: Target, prebuilt_ok: bool, group):
    if group is None:
        return obtain.obtain(target, prebuilt_ok)
    from ..jit import distributed

    return distributed.obtain_library(target, group, prebuilt_ok)


def open_library(target: Target, card: Optional[Card], options: dict, do_load: bool, group=None,
                 nvrtc=None, make_current: bool = True):
    """A card's or an inline cell's build as a :class:`Library` (or :class:`BuildInfo`). ``nvrtc``: the card's
    NVRTC kernels (``instant.card_kernels``), handed to the library before it becomes the card's current build;
    ``make_current=False`` loads it without that (``kernelkit.ops`` keeps calling the current build)."""
    with _opening(target.key):
        lib = registry.by_key(target.key)
        if lib is not None:
            if group is not None:  # loaded here already, but the other ranks expect this one in the exchange
                _obtain(target, True, group)
            return _reuse(lib, card, options, do_load, nvrtc, make_current)
        if do_load:
            refuse_redefined_namespaces(target)  # before minutes of compiling for nothing
        so, cached, seconds = _obtain(target, True, group)
        if not do_load:
            return BuildInfo(target.name, target.key, so, cached, seconds, nvrtc)
        if cached:
            _say_reused(target, so)
        lib = _loading(target, lambda: Library(target.name, target.key, so, pymodule=target.import_name,
                                                   cached=cached, build_seconds=seconds, card=card))
        lib._options = options
        if nvrtc is not None:
            nvrtc.hand_to(lib)
        module = card.module() if card is not None else None
        if module is not None and hasattr(module, "setup"):
            module.setup(lib)  # optional: the card's fake/autograd registrations, for this build's namespace
        registry.add(lib, make_current)  # its ops are bound for kernelkit.ops from the dispatcher, no card code
        return lib


def _reuse(lib: Library, card: Optional[Card], options: dict, do_load: bool, nvrtc, make_current: bool) -> Library:
    """An unchanged build: no compiler, no dlopen, no hashing of the .so."""
    if card is not None:  # identical content may live elsewhere: watch the files asked for now
        lib.card, lib._options = card, options
    if nvrtc is not None and do_load and lib.nvrtc != nvrtc:  # only kernel files changed: no rebuild
        nvrtc.hand_to(lib)
    if make_current and registry.latest(lib.name) is not lib:
        registry.activate(lib)
    return lib


def open_extension(target: Target, is_python_module: bool, build_directory, do_load: bool, group=None,
                   cached_only: bool = False):
    """A torch-style extension as torch returns it: the module (also under its name in ``sys.modules``, as
    torch's loader left it before torch 2.9), the library's path, or the executable's. ``cached_only``: None
    instead of a build when the cache holds no intact library for the target (a recalled plan cannot build)."""
    with _opening(target.key):
        hit = registry.extension(target.key)
        if hit is not None and group is not None:
            _obtain(target, False, group)  # the other ranks expect this one in the exchange
        if hit is not None and not do_load:
            return BuildInfo(target.name, target.key, hit[1], True, 0.0)
        if hit is None:
            if do_load and not target.standalone:
                refuse_redefined_namespaces(target)  # before minutes of compiling for nothing
            before = fast.before_verify(target) if not cached_only and group is None else None
            found = _cached(target) if cached_only else _obtain(target, False, group)
            if found is None:
                return None
            so, cached, seconds = found
            if cached and before is not None:  # its sha256 was just checked (obtain verifies every cache hit)
                fast.verified(target, so, before)
            if not do_load:
                return BuildInfo(target.name, target.key, so, cached, seconds)
            hit = _open_extension_file(target, so, cached, is_python_module)
        result, so = hit
        if is_python_module and not target.standalone:
            sys.modules[target.name] = result  # importlib.import_module(name) after load(name, ...) works
        if build_directory is not None:
            copied = _copy_into(build_directory, target, so)
            if target.standalone:
                return str(copied)
        return result


def _say_reused(target: Target, so: Path) -> None:
    # a prebuilt said so itself when it was found; a recalled target's library is always the cache's
    if fast.recalled(target) or Path(so).is_relative_to(cache.cache_dir()):
        say(f"{target.name}: reusing cached build {target.key[:12]}")


def _cached(target: Target):
    so = fast.recalled_library(target)
    return None if so is None else (so, True, 0.0)


def _open_extension_file(target: Target, so: Path, cached: bool, is_python_module: bool):
    if cached:
        _say_reused(target, so)
    if target.standalone:
        result: object = str(so)
    elif is_python_module:
        result = _loading(target, lambda: _import_module(target, so))
    else:
        _loading(target, lambda: torch.ops.load_library(str(so)))
        result = str(so)
    registry.add_extension(target.key, result, so)
    return result, so


def _import_module(target: Target, so: Path):
    module = import_extension(target.import_name, so)
    module.__name__ = target.name  # as torch names it (its spec keeps the per-build import name)
    module.__kernelkit_key__ = target.key
    return module


# ------------------------------------------------------------------------------------------ failures
def refuse_redefined_namespaces(target: Target) -> None:
    """torch aborts the process when a second library defines a TORCH_LIBRARY namespace: refuse first. The
    blocks are found in every source and local header of the target, whatever it is loaded as."""
    defined = set(fast.namespaces(target))  # a recalled plan carries them: no file is read
    clash = sorted(ns for ns in defined if _namespace_defined(ns))
    if clash:
        raise KernelkitError(
            f"{target.name}: TORCH_LIBRARY({clash[0]}, ...) is already defined in this process (by an earlier "
            "build of this code, or another library), and torch allows one definition of a namespace per "
            "process: loading this build would abort it. Restart the process (in Jupyter: restart the kernel) to "
            "load the edited code, or register the ops with KERNELKIT_LIBRARY, whose namespace is new per build.")


def _namespace_defined(ns: str) -> bool:
    """Whether a TORCH_LIBRARY block (or torch.library.Library(ns, "DEF")) defined ``ns`` in this process, asked
    the way torch itself checks: an empty definition of ``ns`` is registered and dropped at once (listing every
    schema instead costs ~20 ms of a warm load)."""
    try:
        probe = torch._C._dispatch_library("DEF", ns, "", "kernelkit namespace probe", 0)
    except RuntimeError as e:
        if "Only a single TORCH_LIBRARY" in str(e):
            return True
        raise
    probe.reset()
    return False


_UNDEFINED = re.compile(r"undefined symbol: (\S+)")
#: pybind11's words when a module binds a C++ type that a module loaded earlier bound globally
_REGISTERED = re.compile(r'generic_type: type "([^"]+)" is already registered')


def _loading(target: Target, opener):
    """Open a built library; one that names a symbol no source defines is removed from the cache (it can
    never load) and reported with the symbol demangled; one that binds a type pybind11 already bound says how to
    reload it."""
    try:
        return opener()
    except (OSError, ImportError) as e:
        registered = _REGISTERED.search(str(e))
        if registered is not None:  # the build is sound: a new process imports it
            raise KernelkitError(
                f"importing {target.name} failed: its C++ type {registered.group(1)} is already bound to Python in "
                "this process (by an earlier build of this code), and pybind11 binds a type once per process "
                "unless the binding says py::module_local(), as in py::class_<T>(m, \"T\", py::module_local()) or "
                "py::enum_<E>(m, \"E\", py::module_local()); add that to reload in this process, or restart the "
                "process (in Jupyter: restart the kernel).") from None
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


def _copy_into(build_directory, target: Target, so: Path) -> Path:
    """torch's build_directory: the finished library (and load_inline's sources) also land there."""
    d = Path(build_directory).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    final = d / (target.name if target.standalone else f"{target.name}.so")
    if not _same_copy(so, final):  # a warm load must not copy a large library again on every call
        (replace_file.copy_executable if target.standalone else replace_file.copy)(so, final)
    for u in target.units:
        if u.path.parent.parent == cache.subdir("src") and not _same_copy(u.path, d / u.path.name):
            shutil.copy2(u.path, d / u.path.name)  # a generated main.cpp / cuda.cu
    return final


def _same_copy(src: Path, dst: Path) -> bool:
    """Whether ``dst`` is what copy2 made of ``src`` (size and mtime, which copy2 keeps)."""
    try:
        a, b = os.stat(src), os.stat(dst)
    except OSError:
        return False
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns
