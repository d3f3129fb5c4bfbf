"""kernelkit: write a CUDA/C++ kernel, load it into PyTorch in about a second, check it against a
reference, and time it against eager PyTorch and torch.compile.

The public names are imported on first use (PEP 562), so ``import kernelkit`` and the ``kernelkit``
command's quick subcommands do not pay for importing torch.
"""
import importlib as _importlib

__version__ = "0.1.0"

#: public name -> (module, attribute)
_EXPORTS = {
    "BuildInfo": ("jit.api", "BuildInfo"),
    "autoreload": ("jit.api", "autoreload"),
    "library": ("jit.api", "library"),
    "load": ("jit.api", "load"),
    "load_inline": ("jit.api", "load_inline"),
    "refresh": ("jit.api", "refresh"),
    "reload": ("jit.api", "reload"),
    "load_kernels": ("instant.kernels", "load_kernels"),
    "KernelModule": ("instant.kernels", "KernelModule"),
    "STATS": ("jit.build", "STATS"),
    "cache_dir": ("jit.cache", "cache_dir"),
    "Card": ("jit.cards", "Card"),
    "cards": ("jit.cards", "all_cards"),
    "Library": ("jit.library", "Library"),
    "BuildError": ("errors", "BuildError"),
    "CacheSecurityError": ("errors", "CacheSecurityError"),
    "CacheUnwritable": ("errors", "CacheUnwritable"),
    "KernelkitError": ("errors", "KernelkitError"),
    "LockTimeout": ("errors", "LockTimeout"),
    "Spec": ("harness.spec", "Spec"),
    "BenchResult": ("harness.bench", "BenchResult"),
    "bench": ("harness.bench", "bench"),
    "CheckError": ("harness.results", "CheckError"),
    "CheckResult": ("harness.results", "CheckResult"),
    "check": ("harness.check", "check"),
    "profile": ("inspect.profiling", "profile"),
    "ELEMENTWISE_BENCH_SIZES": ("cardkit", "ELEMENTWISE_BENCH_SIZES"),
    "ELEMENTWISE_SHAPES": ("cardkit", "ELEMENTWISE_SHAPES"),
    "check_floating": ("cardkit", "check_floating"),
    "check_pair": ("cardkit", "check_pair"),
    "current_op": ("cardkit", "current_op"),
    "default_bytes_moved": ("cardkit", "default_bytes_moved"),
    "elementwise_inputs": ("cardkit", "elementwise_inputs"),
    "fake_binary": ("cardkit", "fake_binary"),
    "fake_unary": ("cardkit", "fake_unary"),
    "randn": ("cardkit", "randn"),
    "register_elementwise_fakes": ("cardkit", "register_elementwise_fakes"),
    "uniform": ("cardkit", "uniform"),
}
#: public submodules reachable as attributes (``kernelkit.ops.sigmoid``), imported on first use
_SUBMODULES = {"ops": "ops", "cpp_extension": "cpp_extension", "aot": "aot", "errors": "errors",
               "jit": "jit", "distributed": "jit.distributed", "harness": "harness", "cardkit": "cardkit", "frontends": "frontends", "magic": "frontends.magic",
               "inspect": "inspect"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "load_ipython_extension", "__version__"])


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(_importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):  # `%load_ext kernelkit`
    from .frontends import magic

    magic.register(ipython)
