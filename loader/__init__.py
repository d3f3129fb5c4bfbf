"""kernelkit: write a CUDA/C++ kernel, load it into PyTorch in about a second, check it against a
reference, and time it against eager PyTorch and torch.compile.

The public names are imported on first use (PEP 562), so ``import kernelkit`` and the ``kernelkit``
command's quick subcommands do not pay for importing torch.
"""
import importlib as _importlib
import warnings as _warnings

from . import settings as _settings
from .version import __version__ as __version__

if _settings.PATCH_TORCH.get():
    from . import patch as _patch  # torch.utils.cpp_extension goes through kernelkit (README, "Porting")

    _patch.patch_when_imported()

#: public name -> (module, attribute), by group
_EXPORTS = {
    # loading
    "load": ("loading", "load"),
    "load_inline": ("loading", "load_inline"),
    "load_kernels": ("instant.kernels", "load_kernels"),
    "library": ("loading", "library"),
    "reload": ("loading", "reload"),
    "refresh": ("loading", "refresh"),
    "autoreload": ("loading", "autoreload"),
    "Library": ("jit.library", "Library"),
    "KernelModule": ("instant.kernels", "KernelModule"),
    "BuildInfo": ("loading", "BuildInfo"),
    "Card": ("jit.cards", "Card"),
    "cards": ("jit.cards", "all_cards"),
    "STATS": ("jit.running", "STATS"),
    # checking and timing
    "Spec": ("harness.spec", "Spec"),
    "check": ("harness.check", "check"),
    "CheckResult": ("harness.results", "CheckResult"),
    "CheckError": ("harness.results", "CheckError"),
    "bench": ("harness.bench", "bench"),
    "BenchResult": ("harness.bench", "BenchResult"),
    "profile": ("inspect.profiling", "profile"),
    "autotune": ("harness.tune", "autotune"),
    # errors
    "KernelkitError": ("errors", "KernelkitError"),
    "BuildError": ("errors", "BuildError"),
    "CacheSecurityError": ("errors", "CacheSecurityError"),
    "CacheUnwritable": ("errors", "CacheUnwritable"),
    "LockTimeout": ("errors", "LockTimeout"),
}
#: public submodules reachable as attributes (``kernelkit.ops.sigmoid``), imported on first use
_SUBMODULES = {"ops": "ops", "cardkit": "cardkit", "inspect": "inspect", "cpp_extension": "cpp_extension",
               "aot": "aot", "distributed": "distributed", "errors": "errors"}
#: old names that keep working for one release, with a DeprecationWarning naming the new one
_DEPRECATED = {
    **{name: ("cardkit", name, f"kernelkit.cardkit.{name}") for name in (
        "ELEMENTWISE_BENCH_SIZES", "ELEMENTWISE_SHAPES", "check_floating", "check_pair", "current_op",
        "default_bytes_moved", "elementwise_inputs", "fake_binary", "fake_unary", "randn",
        "register_elementwise_fakes", "uniform")},
    "cache_dir": ("jit.cache", "cache_dir", "the `kernelkit cache` command (or kernelkit.jit.cache.cache_dir)"),
}
#: the notebook helpers of the %%kernelkit magic (``kernelkit.magic.promote``), reachable but not advertised
_HIDDEN = {"magic": "frontends.magic"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(_importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES or name in _HIDDEN:
        return _importlib.import_module(f".{_SUBMODULES.get(name) or _HIDDEN[name]}", __name__)
    if name in _DEPRECATED:
        module, attr, instead = _DEPRECATED[name]
        _warnings.warn(f"kernelkit.{name} is deprecated and goes in the next release; use {instead}",
                       DeprecationWarning, stacklevel=2)
        mod = _importlib.import_module(f".{module}", __name__)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):  # `%load_ext kernelkit`
    from .frontends import magic

    magic.register(ipython)
