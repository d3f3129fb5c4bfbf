"""kernelkit: write a CUDA/C++ kernel, load it into PyTorch in about a second, check it against a
reference, and time it against eager PyTorch and torch.compile."""
__version__ = "0.1.0"

from .api import BuildInfo, autoreload, library, load, load_inline, refresh, reload  # noqa: E402
from .build import STATS  # noqa: E402
from .cache import cache_dir  # noqa: E402
from .cards import Card, all_cards as cards  # noqa: E402
from .errors import BuildError, CacheSecurityError, CacheUnwritable, KernelkitError, LockTimeout  # noqa: E402
from .library import Library  # noqa: E402
from .spec import Spec  # noqa: E402

from .bench import BenchResult, bench  # noqa: E402
from .check import CheckError, CheckResult, check  # noqa: E402


def __getattr__(name):
    if name == "ops":  # imported on first use: it loads cards lazily too
        import importlib

        return importlib.import_module(".ops", __name__)
    raise AttributeError(f"module 'kernelkit' has no attribute {name!r}")


def load_ipython_extension(ipython):  # `%load_ext kernelkit`
    from . import magic

    magic.register(ipython)
