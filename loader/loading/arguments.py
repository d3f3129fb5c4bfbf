"""The arguments of ``load``/``load_inline``: torch.utils.cpp_extension's, positional ones in the order of the
torch installed (torch 2.8 inserted the SYCL parameters), plus kernelkit's keywords; and torch's handling of
flags (each stripped, then split the way the shell of torch's ninja build splits a command line)."""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import settings

#: kernelkit's own keywords, beside torch's
KERNELKIT_KEYWORDS = {
    "load": ("kernels_dir", "arch", "load", "group"),
    "load_inline": ("cuda", "cpp", "arch", "group"),
}
#: torch's keywords in every supported version (2.6+), so a call written for another torch is understood
TORCH_KEYWORDS = {
    "load": ("sources", "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags",
             "extra_include_paths", "build_directory", "verbose", "with_cuda", "with_sycl", "is_python_module",
             "is_standalone", "keep_intermediates"),
    "load_inline": ("cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags", "extra_cuda_cflags",
                    "extra_sycl_cflags", "extra_ldflags", "extra_include_paths", "build_directory", "verbose",
                    "with_cuda", "with_sycl", "is_python_module", "with_pytorch_error_handling",
                    "keep_intermediates", "use_pch", "no_implicit_headers", "gil_not_used"),
}


#: the leading positional parameters every supported torch (2.6+) has in this order: a call that passes no more
#: needs no look at the installed torch's signature (a record read on a warm load)
SHARED_ORDER = {"load": ("sources", "extra_cflags", "extra_cuda_cflags"), "load_inline": ("cpp_sources", "cuda_sources")}


@functools.lru_cache(maxsize=None)
def torch_order(function: str) -> Tuple[str, ...]:
    """The parameters after ``name`` of the installed torch's ``torch.utils.cpp_extension.<function>``: from the
    module where it is imported, else from a record of it in the cache (importing it pulls in setuptools, tens
    of milliseconds of a warm load); KERNELKIT_FAST=off imports it."""
    module = sys.modules.get("torch.utils.cpp_extension")
    if module is not None or not settings.fast_path("records"):
        return _order(module or importlib.import_module("torch.utils.cpp_extension"), function)
    return _recorded_orders()[function]


def _order(module, function: str) -> Tuple[str, ...]:
    return tuple(inspect.signature(getattr(module, function)).parameters)[1:]


def _recorded_orders() -> Dict[str, Tuple[str, ...]]:
    """Both functions' orders, recorded per torch install (keyed by the module file's size and mtime)."""
    import torch

    from ..jit import cache, keys

    src = os.path.join(os.path.dirname(torch.__file__), "utils", "cpp_extension.py")
    st = os.stat(src)
    key = keys.torch_signatures_key(src, st.st_size, st.st_mtime_ns, torch.__version__)
    recorded = cache.read_record("torch-signatures", key)
    if all(isinstance(recorded.get(f), list) for f in ("load", "load_inline")):
        return {f: tuple(recorded[f]) for f in ("load", "load_inline")}
    from torch.utils import cpp_extension

    orders = {f: _order(cpp_extension, f) for f in ("load", "load_inline")}
    cache.write_record("torch-signatures", key, orders)  # best effort: a read-only cache imports the module again
    return orders


def bind(function: str, positional: Sequence[Any], keywords: Dict[str, Any]) -> Dict[str, Any]:
    """Every argument by its name: positional ones in the installed torch's order (``load(name, sources,
    extra_cflags, ...)``), keywords checked against torch's and kernelkit's names."""
    accepted = TORCH_KEYWORDS[function] + KERNELKIT_KEYWORDS[function]
    for k in keywords:
        if k not in accepted:
            close = difflib.get_close_matches(k, accepted, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f"; it takes: name, {', '.join(accepted)}"
            raise TypeError(f"{function}() got an unexpected keyword argument {k!r}{hint}")
    bound = dict(keywords)
    if len(positional) > len(TORCH_KEYWORDS[function]):  # more than any torch takes: no need to ask the one here
        raise TypeError(f"{function}() takes at most {len(TORCH_KEYWORDS[function]) + 1} positional arguments "
                        f"(name, then torch's), got {len(positional) + 1}")
    if positional:
        shared = SHARED_ORDER[function]
        order = shared if len(positional) <= len(shared) else torch_order(function)
        if len(positional) > len(order):
            raise TypeError(f"{function}() takes at most {len(order) + 1} positional arguments (torch's order: name, "
                            f"{', '.join(order)}), got {len(positional) + 1}")
        for k, v in zip(order, positional):
            if k in bound:
                raise TypeError(f"{function}() got multiple values for argument {k!r} (positional, in torch's "
                                f"order: name, {', '.join(order[:len(positional)])})")
            bound[k] = v
    return bound


def _strings(value, what: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        raise TypeError(f"{what}: expected a list of strings, got the string {value!r} (wrap it in a list)")
    out = list(value)
    if not all(isinstance(v, str) for v in out):
        raise TypeError(f"{what}: expected a list of strings, got {value!r}")
    return out


#: what makes shlex.split of a stripped flag more than the flag itself: its white space, quotes and escape
_SHELL_SPECIAL = frozenset(" \t\r\n'\"\\")


def flags(value, what: str) -> List[str]:
    """``extra_cflags=["-g\\n", "-O0 -Wall"]`` is ``["-g", "-O0", "-Wall"]``, as torch's build runs it."""
    out = []
    for flag in _strings(value, what):
        flag = flag.strip()
        if flag and not _SHELL_SPECIAL.intersection(flag):  # a plain word: what shlex gives, without its tokenizer
            out.append(flag)
            continue
        try:
            out += shlex.split(flag)
        except ValueError as e:
            raise ValueError(f"{what}: cannot split {flag!r} as a command line would ({e})") from None
    return out


def paths(value, what: str) -> List[str]:
    """Include paths as torch takes them: each stripped of surrounding white space."""
    return [p.strip() for p in _strings(value, what)]


def refuse_sycl(args: Dict[str, Any]) -> None:
    """torch's SYCL keywords are understood (calls written for torch 2.8+ pass them) but not built."""
    for k in ("sycl_sources", "extra_sycl_cflags", "with_sycl"):
        if args.get(k):
            hint = ""
            if k == "sycl_sources" and _names(args[k]):  # functions= passed fourth, in torch 2.7's order
                hint = (f" ({args[k]!r} looks like function names: since torch 2.8 the fourth positional argument "
                        "of load_inline is sycl_sources; pass functions=[...] by keyword)")
            raise ValueError(f"{k}: kernelkit builds C++ and CUDA sources, not SYCL{hint}")


def _names(value) -> bool:
    items = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple, dict)) else []
    return bool(items) and all(isinstance(v, str) and v.isidentifier() for v in items)


def build_flags(args: Dict[str, Any]) -> Dict[str, List[str]]:
    """The four flag lists every plan takes, normalised as torch normalises them."""
    return {"extra_cflags": flags(args.get("extra_cflags"), "extra_cflags"),
            "extra_cuda_cflags": flags(args.get("extra_cuda_cflags"), "extra_cuda_cflags"),
            "extra_ldflags": flags(args.get("extra_ldflags"), "extra_ldflags"),
            "extra_include_paths": paths(args.get("extra_include_paths"), "extra_include_paths")}


def check_inline(name, args: Dict[str, Any]) -> None:
    """``load_inline(name, cuda=..., cpp=...)``'s arguments, checked before anything is imported or planned."""
    if args.get("cpp_sources") is not None or args.get("cuda_sources") is not None:
        raise TypeError("load_inline(): pass either torch's cpp_sources/cuda_sources or kernelkit's cpp=/cuda=, "
                        "not both")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected an identifier (it names the library), got {name!r}")
    for arg in ("cuda", "cpp"):
        if args.get(arg) is not None and not isinstance(args[arg], str):
            raise TypeError(f"{arg}: expected source code as a str, got {type(args[arg]).__name__}")
    if not args.get("cuda") and not args.get("cpp"):
        raise ValueError("load_inline needs source code: pass cuda=..., cpp=... or both")
    only_for_extensions(args, name, "cpp_sources=/cuda_sources= (torch's form)")


def only_for_extensions(args: Dict[str, Any], name: str, needs: str) -> None:
    """Keywords that mean something only for torch-style builds, given to a card or kernelkit-style load."""
    given = [k for k in ("build_directory", "with_cuda", "is_standalone") if args.get(k) is not None and args.get(k) is not False]
    if args.get("is_python_module") is False:
        given.append("is_python_module")
    if given:
        raise ValueError(f"{given[0]}= applies to torch-style builds: pass {needs} too, or drop it to load {name!r}")


def option(args: Dict[str, Any], key: str, default: Optional[Any] = None) -> Any:
    value = args.get(key)
    return default if value is None else value
