"""kernelkit: write a CUDA/C++ kernel, load it into PyTorch in about a second, check it against a
reference, and time it against eager PyTorch and torch.compile.

The public names are imported on first use (PEP 562), so ``import kernelkit`` and the ``kernelkit``
command's quick subcommands do not pay for importing torch.
"""
import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys
import threading as _threading
import types as _types

__version__ = "0.1.0"

#: public name -> (module, attribute)
_EXPORTS = {
    "BuildInfo": ("api", "BuildInfo"),
    "autoreload": ("api", "autoreload"),
    "library": ("api", "library"),
    "load": ("api", "load"),
    "load_inline": ("api", "load_inline"),
    "refresh": ("api", "refresh"),
    "reload": ("api", "reload"),
    "STATS": ("build", "STATS"),
    "cache_dir": ("cache", "cache_dir"),
    "Card": ("cards", "Card"),
    "cards": ("cards", "all_cards"),
    "BuildError": ("errors", "BuildError"),
    "CacheSecurityError": ("errors", "CacheSecurityError"),
    "CacheUnwritable": ("errors", "CacheUnwritable"),
    "KernelkitError": ("errors", "KernelkitError"),
    "LockTimeout": ("errors", "LockTimeout"),
    "Library": ("library", "Library"),
    "Spec": ("spec", "Spec"),
    "BenchResult": ("bench", "BenchResult"),
    "bench": ("bench", "bench"),
    "CheckError": ("check", "CheckError"),
    "CheckResult": ("check", "CheckResult"),
    "check": ("check", "check"),
}
#: submodules reachable as attributes (``kernelkit.ops.sigmoid``), imported on first use
_SUBMODULES = ("ops", "cpp_extension")
#: modules that import without torch: their names are bound one at a time
_LIGHT = ("errors", "cache")

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "load_ipython_extension", "__version__"])

_state = _threading.local()  # per thread: binding is under way (a re-entrant lookup must fall through)


class _Package(_types.ModuleType):
    def __setattr__(self, name, value):
        # The import system sets `kernelkit.check` (and cards, bench, library) to the submodule when that
        # loads; the public function must keep the name, as it did when everything was imported eagerly.
        if name in _EXPORTS and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


def _bind(name: str) -> None:
    module, attr = _EXPORTS[name]
    globals()[name] = getattr(_importlib.import_module(f".{module}", __name__), attr)


def _bind_all() -> None:
    """Import every exported module first, then bind the names: api.py does `from . import cards`, which
    must find the submodule, not the public function of the same name."""
    _state.binding = True
    try:
        for module in dict.fromkeys(m for m, _ in _EXPORTS.values()):
            _importlib.import_module(f".{module}", __name__)
        for name in _EXPORTS:
            _bind(name)
    finally:
        _state.binding = False


def _is_submodule(name: str) -> bool:
    return not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}") is not None


def __getattr__(name: str):
    if name in _EXPORTS:
        if getattr(_state, "binding", False):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        if _EXPORTS[name][0] in _LIGHT:
            _bind(name)
        else:
            _bind_all()
        return globals()[name]
    if name in _SUBMODULES or _is_submodule(name):  # e.g. kernelkit.spec.DEFAULT_TOLERANCES, as when eager
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):  # `%load_ext kernelkit`
    from . import magic

    magic.register(ipython)


_sys.modules[__name__].__class__ = _Package
