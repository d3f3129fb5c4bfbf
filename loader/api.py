"""The entry points: ``load`` (a card's files), ``load_inline`` (strings from a notebook cell),
``library`` (the latest loaded build, for hot paths), ``refresh``/``autoreload`` (hot reload)."""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import threading
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from . import build as _build
from . import aot, cache, cards, toolchain
from .errors import KernelkitError
from .library import Library
from .progress import say
from .sources import sha256_bytes

log = logging.getLogger("kernelkit")

_LOCK = threading.RLock()
_BY_KEY: Dict[str, Library] = {}  # every build loaded in this process (a .so cannot be unloaded)
_LATEST: Dict[str, Library] = {}  # card/inline name -> its newest build
_ON_ACTIVATE: List = []  # callbacks(lib) run whenever a name switches to another already-set-up build


def on_activate(callback) -> None:
    """Call ``callback(lib)`` whenever ``load`` makes an earlier build of a name its newest again (an
    edit undone: the build is reused, its card's ``setup`` is not run again). New builds are announced
    by their card's ``setup(lib)``."""
    _ON_ACTIVATE.append(callback)


@dataclasses.dataclass
class BuildInfo:
    """What ``load(..., load=False)`` returns: a build in the cache, not opened in this process."""

    name: str
    key: str
    path: Path
    cached: bool
    build_seconds: float


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _write_source(text: str, filename: str) -> Path:
    """Generated or inline sources live in the cache under their content hash (written once)."""
    d = cache.subdir("src") / sha256_bytes(text.encode(), filename.encode())[:24]
    path = d / filename
    if not path.is_file():
        with cache.writing(d):
            d.mkdir(exist_ok=True, mode=0o700)
            tmp = d / f".{filename}.{os.getpid()}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
    return path


def _flags(value, what: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        raise TypeError(f"{what}: expected a list of strings, got the string {value!r} (wrap it in a list)")
    out = list(value)
    if not all(isinstance(v, str) for v in out):
        raise TypeError(f"{what}: expected a list of strings, got {value!r}")
    return out


def _make_target(name: str, units: List[_build.Unit], with_cuda: bool, pymodule: Optional[str],
                 extra_ldflags: Sequence[str], texts: Dict[str, List[str]]) -> _build.Target:
    ldflags = _build.link_flags(with_cuda, bool(pymodule), extra_ldflags)
    display = {str(u.path): u.display for u in units}
    for u in units:
        display.update({str(d): _display(d) for d in u.deps})
    return _build.Target(name, units, ldflags, _build.target_key(name, units, ldflags), with_cuda, pymodule,
                         display, texts)


def _plan_card(card: cards.Card, arch, extra_cflags, extra_cuda_cflags, extra_ldflags,
               extra_include_paths) -> _build.Target:
    spec = card.spec
    cflags = list(getattr(spec, "extra_cflags", ()) or ()) + extra_cflags
    cuflags = list(getattr(spec, "extra_cuda_cflags", ()) or ()) + extra_cuda_cflags
    sources = card.sources()
    with_cuda = any(s.suffix == ".cu" for s in sources)
    if with_cuda:
        toolchain.check_cuda_match(f"card {card.name}")
    archs = toolchain.arch_list(arch) if with_cuda else []
    include_dirs = [card.dir, toolchain.CSRC] + [Path(p).resolve() for p in extra_include_paths]
    units, texts = [], {}
    for src in sources:
        if not src.is_file():
            raise KernelkitError(f"card {card.name}: source {src} does not exist")
        text = src.read_text()
        kind = "cu" if src.suffix == ".cu" else "cpp"
        units.append(_build.plan_unit(kind, src, text, include_dirs, cuflags if kind == "cu" else cflags,
                                      archs, _display(src)))
        texts[_display(src)] = text.splitlines()
    header = card.header()
    if header is not None:
        text = "".join([
            "#define KERNELKIT_BINDING 1\n",
            "#define KERNELKIT_WITH_CUDA 1\n" if with_cuda else "",
            "#include <kernelkit/binding.h>\n",
            f'#include "{header.name}"\n',
        ])
        path = _write_source(text, f"{card.name}_binding.cpp")
        units.append(_build.plan_unit("cpp", path, text, include_dirs, cflags, archs,
                                      f"{_display(header)} (binding)", optimize="-O2",
                                      pch_defines=_pch_defines(with_cuda)))
    return _make_target(card.name, units, with_cuda, None, _flags(extra_ldflags, "extra_ldflags"), texts)


def _open(target: _build.Target, card: Optional[cards.Card], options: dict, do_load: bool):
    with _LOCK:
        lib = _BY_KEY.get(target.key)
        if lib is not None:  # unchanged: no compiler, no dlopen, no hashing of the .so
            if card is not None:  # identical content may live elsewhere: watch the files asked for now
                lib.card, lib._options = card, options
            if _LATEST.get(target.name) is not lib:
                _LATEST[target.name] = lib
                for callback in _ON_ACTIVATE:
                    callback(lib)
            return lib
        prebuilt = aot.find_prebuilt(target)
        if prebuilt is not None:
            so, cached, seconds = prebuilt, True, 0.0
            say(f"{target.name}: using prebuilt {prebuilt}")
        else:
            so, cached, seconds = _build.build(target)
        if not do_load:
            return BuildInfo(target.name, target.key, so, cached, seconds)
        if cached and prebuilt is None:
            say(f"{target.name}: reusing cached build {target.key[:12]}")
        lib = Library(target.name, target.key, so, pymodule=target.pymodule, cached=cached,
                      build_seconds=seconds, card=card)
        lib._options = options
        module = card.module() if card is not None else None
        if module is not None and hasattr(module, "setup"):
            module.setup(lib)  # the card's fake/autograd registrations, for this build's namespace
        _BY_KEY[target.key] = lib
        _LATEST[target.name] = lib
        return lib


def _short_traceback(fn):
    """Raise kernelkit's errors from the user's call, not from deep in the build's thread pool: in a
    notebook the mapped compiler errors are then the first thing on screen."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KernelkitError as e:
            raise e.with_traceback(None)

    return wrapper


@_short_traceback
def load(name: Union[str, os.PathLike], *, kernels_dir=None, arch=None, extra_cflags=None,
         extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None, load: bool = True,
         verbose: Optional[bool] = None) -> Union[Library, BuildInfo]:
    """Build (or reuse) the card ``name`` and return its :class:`Library`.

    ``name`` is a card name looked up on the kernel search path (``kernels_dir`` or ``KERNELKIT_PATH``
    plus the built-in cards), or a path to a ``.cu``/``.cpp`` file. Calling again after an edit returns
    the new build; with nothing changed it returns the same object at once, spawning no compiler.
    ``arch`` ("8.0;9.0", or a list) overrides the CUDA architectures (default: the current GPU's).
    ``load=False`` builds into the cache without opening the library (e.g. to fill a cache for CUDA
    cards on a machine with no GPU).
    """
    _verbose(verbose)
    options = dict(kernels_dir=kernels_dir, arch=arch, extra_cflags=extra_cflags,
                   extra_cuda_cflags=extra_cuda_cflags, extra_ldflags=extra_ldflags,
                   extra_include_paths=extra_include_paths)
    card = cards.find(name, kernels_dir)
    target = _plan_card(card, arch, _flags(extra_cflags, "extra_cflags"),
                        _flags(extra_cuda_cflags, "extra_cuda_cflags"), extra_ldflags,
                        _flags(extra_include_paths, "extra_include_paths"))
    return _open(target, card, {**options, "name": str(name)}, load)


_USES_TORCH_NAMES = re.compile(r"\b(torch|at|c10)::")
_INCLUDES_TORCH = re.compile(r'#\s*include\s*[<"](torch|ATen|c10)/')


@_short_traceback
def load_inline(name: str, cuda: Optional[str] = None, cpp: Optional[str] = None,
                functions: Union[None, str, Sequence[str], Mapping[str, str]] = None, *, arch=None,
                extra_cflags=None, extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None,
                verbose: Optional[bool] = None) -> Library:
    """Build from source strings (a notebook cell) and return a :class:`Library`.

    ``cuda``: device code (compiled alone by nvcc; keep torch out of it for ~1 s rebuilds).
    ``cpp``: the torch-facing side: declarations of what ``cuda`` defines, wrappers, and either a
    ``KERNELKIT_LIBRARY(m) {...}`` block (torch ops) or ``functions`` to bind with pybind11 as in
    ``torch.utils.cpp_extension.load_inline``. Compiler errors name ``<name>.cu``/``<name>.cpp`` and the
    line within the string you passed.
    """
    _verbose(verbose)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected an identifier (it names the library), got {name!r}")
    for arg, val in (("cuda", cuda), ("cpp", cpp)):
        if val is not None and not isinstance(val, str):
            raise TypeError(f"{arg}: expected source code as a str, got {type(val).__name__}")
    if not cuda and not cpp:
        raise ValueError("load_inline needs source code: pass cuda=..., cpp=... or both")
    if isinstance(functions, str):
        functions = [functions]
    funcs: Dict[str, str] = dict(functions) if isinstance(functions, Mapping) else {f: f for f in functions or []}
    for f in funcs:
        if not f.isidentifier():
            raise ValueError(f"functions: {f!r} is not a C++ identifier")

    cflags, cuflags = _flags(extra_cflags, "extra_cflags"), _flags(extra_cuda_cflags, "extra_cuda_cflags")
    incs = [Path(p).resolve() for p in _flags(extra_include_paths, "extra_include_paths")]
    include_dirs = [toolchain.CSRC] + incs
    with_cuda = bool(cuda)
    if with_cuda:
        toolchain.check_cuda_match(name)
    archs = toolchain.arch_list(arch) if with_cuda else []
    units, texts = [], {}
    if cuda:
        text = cuda
        if _USES_TORCH_NAMES.search(cuda) and not _INCLUDES_TORCH.search(cuda):
            # torch-style cell (as torch's load_inline accepts): give it torch's types, keep line numbers
            text = f'#include <torch/types.h>\n#line 1 "{name}.cu"\n' + cuda
        path = _write_source(text, f"{name}.cu")
        units.append(_build.plan_unit("cu", path, text, include_dirs, cuflags, archs, f"{name}.cu"))
        texts[f"{name}.cu"] = cuda.splitlines()
    pymodule = None
    if cpp or funcs:
        head = "#define KERNELKIT_BINDING 1\n" + ("#define KERNELKIT_WITH_CUDA 1\n" if with_cuda else "")
        if funcs:
            head += "#include <torch/extension.h>\n"
        head += "#include <kernelkit/binding.h>\n"
        body = f'#line 1 "{name}.cpp"\n' + (cpp or "") + "\n"
        tail = ""
        if funcs:
            pymodule = "kk_py_" + sha256_bytes(head.encode(), body.encode(), repr(sorted(funcs.items())).encode())[:16]
            defs = "".join(f'  m.def("{f}", &{f}, {_cpp_string(doc)});\n' for f, doc in funcs.items())
            tail = f'#line 1 "{name}_bindings.cpp"\nPYBIND11_MODULE({pymodule}, m) {{\n{defs}}}\n'
            texts[f"{name}_bindings.cpp"] = tail.splitlines()[1:]
        text = head + body + tail
        path = _write_source(text, f"{name}_binding.cpp")
        units.append(_build.plan_unit("cpp", path, text, include_dirs, cflags, archs, f"{name}.cpp", optimize="-O2",
                                      pch_defines=None if funcs else _pch_defines(with_cuda)))
        texts[f"{name}.cpp"] = (cpp or "").splitlines()
    target = _make_target(name, units, with_cuda, pymodule, _flags(extra_ldflags, "extra_ldflags"), texts)
    return _open(target, None, {}, True)


def _pch_defines(with_cuda: bool) -> List[str]:
    """The macros the generated binding text defines before <kernelkit/binding.h> (a PCH must see the same)."""
    return ["KERNELKIT_BINDING=1"] + (["KERNELKIT_WITH_CUDA=1"] if with_cuda else [])


def _cpp_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _verbose(verbose: Optional[bool]) -> None:
    if verbose:
        logging.basicConfig()
        log.setLevel(logging.DEBUG)


def library(name: str) -> Library:
    """The newest loaded build of ``name``, loading it on first use. No freshness check: cheap enough
    for every call of an op. Use :func:`load` or :func:`refresh` to pick up edits."""
    lib = _LATEST.get(name)
    if lib is None:
        lib = load(name)
    return lib


def reload(lib: Library) -> Library:
    if lib.card is None:
        raise KernelkitError(f"{lib.name} was built from strings: call load_inline again with the new code")
    opts = dict(lib._options)
    return load(opts.pop("name"), **opts)


def refresh() -> List[str]:
    """Reload every card loaded in this process whose sources changed; returns the names reloaded."""
    changed = []
    for name, lib in list(_LATEST.items()):
        if lib.card is None:
            continue
        new = reload(lib)
        if new is not lib:
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
