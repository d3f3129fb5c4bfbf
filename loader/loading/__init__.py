"""The front door: ``load`` and ``load_inline`` (cards, torch-style extensions, kernelkit's inline cells),
``library`` (the current build of a name, for hot paths) and hot reload (``reload``, ``refresh``,
``autoreload``). ``load``/``load_inline`` take torch.utils.cpp_extension's arguments, positional ones in the
order of the torch installed, and return what torch returns for torch's forms. Importing this package imports no
torch: a call's arguments are checked first, so a mistake is answered at once, not after torch's import."""
from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Dict, List

from ..errors import KernelkitError
from ..jit.progress import say
from . import arguments

if TYPE_CHECKING:
    from ..jit.library import Library

__all__ = ["BuildInfo", "autoreload", "library", "load", "load_inline", "refresh", "reload"]

log = logging.getLogger("kernelkit")


def _entry_point(fn):
    """kernelkit's errors surface at the user's call, not deep in the build's thread pool (in a notebook the
    mapped compiler errors are then the first thing on screen)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KernelkitError as e:
            raise e.with_traceback(None) from e.__cause__

    return wrapper


@_entry_point
def load(name, *args, **kwargs):
    """Load a card, or build torch-style extension sources.

    ``load(name, sources, ...)`` is ``torch.utils.cpp_extension.load``: the same arguments in the same order
    (that of the torch installed), torch-style sources (``<torch/extension.h>``,
    ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``, ``TORCH_LIBRARY``), the same result (the module, also left in
    ``sys.modules[name]``; the library's path with ``is_python_module=False``; the executable's with
    ``is_standalone=True``). Each source is its own cached unit, so an edit recompiles that file only, and a
    warm cache loads without a compiler. ``build_directory`` receives a copy of the result (the build lives in
    kernelkit's cache); ``keep_intermediates`` is accepted and has no effect.

    ``load(name)`` builds (or reuses) the card ``name`` on the kernel search path (``kernels_dir`` or
    ``KERNELKIT_PATH`` plus the built-in cards), or a path to a card's ``.cu``/``.cpp`` (a file written for
    torch's loader, with its own ``PYBIND11_MODULE``, works too), and returns its :class:`Library`. Calling again
    after an edit returns the new build; unchanged, the same object. A card whose spec lists ``nvrtc_sources``
    has those files compiled by NVRTC: an edit of one recompiles it in tens of milliseconds and hands the new
    kernels to the same library object.

    kernelkit's keywords: ``arch`` ("8.0;9.0", or a list) overrides the CUDA architectures (default: the current
    GPU's); ``load=False`` builds into the cache without opening the result and returns a :class:`BuildInfo`;
    ``group``: a torch.distributed process group whose ranks all make this call: one builds, the others receive
    the library and check it against their own sources' key (README, "Multi-GPU and clusters").
    """
    a = arguments.bind("load", args, kwargs)
    _prepare(a)
    from . import cards, extensions  # torch, once the arguments are known to be good

    if a.get("sources") is not None:
        return extensions.load(name, a)
    return cards.load(name, a)


@_entry_point
def load_inline(name, *args, **kwargs):
    """Build from source strings (a notebook cell). Two forms:

    torch's: ``load_inline(name, cpp_sources, cuda_sources=None, ...)`` with
    ``torch.utils.cpp_extension.load_inline``'s arguments, order (that of the torch installed) and result.
    kernelkit writes the same ``main.cpp``/``cuda.cu`` torch would, caches each by content (an edit of the CUDA
    part recompiles only it), and cites compiler errors at the line of the string you passed. ``use_pch`` and
    ``keep_intermediates`` are accepted and have no effect.

    kernelkit's: ``load_inline(name, cuda=..., cpp=..., functions=...)`` returns a :class:`Library`. ``cuda`` is
    device code compiled alone (keep torch out of it for ~1 s rebuilds); ``cpp`` the torch-facing side:
    declarations, wrappers, and a ``KERNELKIT_LIBRARY(m) {...}`` block (torch ops) or ``functions`` bound with
    pybind11. Code with its own ``PYBIND11_MODULE``/``TORCH_LIBRARY`` block is built the torch way under either
    form. ``group``: as for :func:`load`.
    """
    a = arguments.bind("load_inline", args, kwargs)
    _prepare(a)
    if a.get("cuda") is None and a.get("cpp") is None:
        from . import extensions  # torch, once the arguments are known to be good

        return extensions.load_inline(name, a)
    arguments.check_inline(name, a)
    from . import inline

    return inline.load(name, a)


def _prepare(a: dict) -> None:
    arguments.refuse_sycl(a)
    arguments.build_flags(a)  # their types and quoting
    if a.get("verbose"):  # torch's verbose=True: kernelkit's build details on the log
        logging.basicConfig()
        log.setLevel(logging.DEBUG)


def library(name: str) -> Library:
    """The current loaded build of ``name``, loading it on first use. No freshness check: cheap enough for
    every call of an op. Use :func:`load` or :func:`refresh` to pick up edits."""
    from ..jit import registry

    lib = registry.latest(name)
    return lib if lib is not None else load(name)


def reload(lib: Library) -> Library:
    """``lib``'s card loaded again with the options it was loaded with: the new build after an edit."""
    if lib.card is None:
        raise KernelkitError(f"{lib.name} was built from strings: call load_inline again with the new code")
    opts = {k: v for k, v in lib._options.items() if v is not None}
    return load(opts.pop("name"), **opts)


_GONE: Dict[str, str] = {}  # card name -> the file of it found missing (noted once, until it is back)


def refresh() -> List[str]:
    """Reload every card loaded in this process whose sources changed; returns the names reloaded (a card
    whose ``nvrtc_sources`` alone changed keeps its build, which gets the recompiled kernels). A card whose
    files are gone keeps its loaded build and is skipped with a one-line warning, once."""
    from ..jit import registry

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


_HOOK: List = []


def autoreload(enable: bool = True) -> bool:
    """In IPython/Jupyter, reload edited cards before every cell runs. Returns whether it is active."""
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

    if enable and not _HOOK:
        shell.events.register("pre_run_cell", _pre_run_cell)
        _HOOK.append(_pre_run_cell)
    elif not enable and _HOOK:
        shell.events.unregister("pre_run_cell", _HOOK.pop())
    return bool(_HOOK)


def __getattr__(name: str):
    if name == "BuildInfo":  # with torch, on first use
        from .opening import BuildInfo

        return BuildInfo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
