"""A loaded build: the .so opened in this process, its ops registered under a namespace that carries the
build's content key (a namespace can be defined once per process, so each new build gets a new one)."""
from __future__ import annotations

import ctypes
import importlib.util
import re
from pathlib import Path
from typing import Any, List, Optional, Sequence

import torch

from ..errors import KernelkitError


def namespace_for(name: str, key: str) -> str:
    return f"kk_{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{key[:12]}"


def import_extension(name: str, path) -> Any:
    """Import the Python extension module `name` from the shared object at `path` (not via sys.path)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Library:
    """What ``kernelkit.load`` and ``load_inline`` return.

    Attribute access gives the library's ops (``lib.sigmoid`` is ``torch.ops.<ns>.sigmoid``) and, for
    ``load_inline(functions=...)``, its pybind11 functions.
    """

    def __init__(self, name: str, key: str, path: Path, *, pymodule: Optional[str], cached: bool,
                 build_seconds: float, card=None):
        self.name = name
        self.key = key
        self.path = Path(path)
        self.cached = cached
        self.build_seconds = build_seconds
        self.card = card
        self.ns: Optional[str] = None
        self._op_names: Optional[List[str]] = None
        #: the card's NVRTC kernels handed to this library (``instant.card_kernels.CardKernels``), if it has any
        self.nvrtc = None
        self._handle = ctypes.CDLL(str(self.path))
        self._pymodule = None
        if pymodule:
            self._pymodule = import_extension(pymodule, self.path)
        if hasattr(self._handle, "kernelkit_register"):
            self.ns = namespace_for(name, key)
            register = self._handle.kernelkit_register
            register.argtypes, register.restype = [ctypes.c_char_p], ctypes.c_int
            if register(self.ns.encode()) != 0:
                last = self._handle.kernelkit_last_error
                last.restype = ctypes.c_char_p
                raise KernelkitError(f"registering the ops of {name} failed: {last().decode(errors='replace')}")

    def set_nvrtc_kernels(self, entries: Sequence[tuple], files: str, problem: str) -> None:
        """Replace the kernels the binding launches by name (``<kernelkit/kernels.h>``): ``entries`` are (name,
        CUkernel handle, file, [(size, declaration)] or None) each; ``problem`` says why there are none."""
        hand = getattr(self._handle, "kernelkit_nvrtc_kernels", None)
        if hand is None:
            raise KernelkitError(f"{self.name}: its library does not include <kernelkit/kernels.h>, so it cannot take "
                                 "NVRTC kernels")
        n = len(entries)
        texts, pointers = ctypes.c_char_p * max(n, 1), ctypes.c_void_p * max(n, 1)
        names = texts(*[name.encode() for name, _, _, _ in entries])
        handles = pointers(*[handle for _, handle, _, _ in entries])
        sources = texts(*[source.encode() for _, _, source, _ in entries])
        params = texts(*[None if p is None else "".join(f"{size} {decl}\n" for size, decl in p).encode()
                         for _, _, _, p in entries])
        text_array, pointer_array = ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_void_p)
        hand.argtypes = [ctypes.c_int, text_array, pointer_array, text_array, text_array, ctypes.c_char_p,
                         ctypes.c_char_p]
        hand.restype = ctypes.c_int
        if hand(n, names, handles, sources, params, files.encode(), problem.encode()) != 0:
            raise KernelkitError(f"{self.name}: handing its NVRTC kernels to the library failed")

    @property
    def spec(self):
        return self.card.spec if self.card is not None else None

    @property
    def ops(self):
        """The ``torch.ops`` namespace holding this build's ops."""
        if self.ns is None:
            raise AttributeError(f"{self.name} registers no ops (it has no KERNELKIT_LIBRARY block)")
        return getattr(torch.ops, self.ns)

    def op_names(self) -> List[str]:
        """The ops this build's ``KERNELKIT_LIBRARY`` block defines (without overload names)."""
        if self.ns is None:
            return []
        if self.__dict__.get("_op_names") is None:  # fixed once registered; the scan costs milliseconds
            prefix = self.ns + "::"
            names = torch._C._dispatch_get_all_op_names()  # "ns::op" or "ns::op.overload"
            self._op_names = sorted({n[len(prefix):].split(".")[0] for n in names if n.startswith(prefix)})
        return self._op_names

    def qualname(self, op: str) -> str:
        """``"<ns>::<op>"``, the name torch.library's register_fake/register_autograd take."""
        return f"{self.ns}::{op}"

    def __getattr__(self, item: str) -> Any:
        if item.startswith("_"):
            raise AttributeError(item)
        mod = self.__dict__.get("_pymodule")
        if mod is not None and hasattr(mod, item):
            return getattr(mod, item)
        if self.__dict__.get("ns"):
            try:  # a direct lookup: listing every schema (op_names) costs tens of milliseconds
                return getattr(getattr(torch.ops, self.ns), item)
            except (AttributeError, RuntimeError):
                pass
        raise AttributeError(f"{self.name} has no op or function {item!r}; it has: "
                             + (", ".join(self.functions()) or "nothing"))

    def functions(self) -> List[str]:
        py = [n for n in dir(self._pymodule) if not n.startswith("_")] if self._pymodule else []
        return py + self.op_names()

    def __dir__(self):
        return list(super().__dir__()) + self.functions()

    def __repr__(self) -> str:
        how = "cached" if self.cached else f"built in {self.build_seconds:.1f} s"
        return f"<kernelkit.Library {self.name} key={self.key[:12]} ns={self.ns} ({how}): {', '.join(self.functions())}>"
