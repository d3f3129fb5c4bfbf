"""Finding cards on the kernel search path, and reading their specs.

A card named ``op`` lives in a kernels directory as ``op.cu`` (or ``op.cpp``), ``op.h`` and optionally
``op.py`` (its ``SPEC`` and ``setup(lib)``). The search path is ``kernels_dir=`` when given, else the
directories in ``KERNELKIT_PATH`` followed by the cards that ship with kernelkit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from ..errors import KernelkitError

PathLike = Union[str, os.PathLike]


def builtin_dir() -> Path:
    spec = importlib.util.find_spec("kernelkit.kernels")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    return (Path(__file__).resolve().parent.parent / "kernels").resolve()


def search_path(kernels_dir: Optional[Union[PathLike, Sequence[PathLike]]] = None) -> List[Path]:
    if kernels_dir is not None:
        dirs = [kernels_dir] if isinstance(kernels_dir, (str, os.PathLike)) else list(kernels_dir)
        return [Path(d).expanduser().resolve() for d in dirs]
    env = [Path(p).expanduser().resolve() for p in os.environ.get("KERNELKIT_PATH", "").split(os.pathsep) if p]
    return env + [builtin_dir()]


@dataclasses.dataclass
class Card:
    name: str
    dir: Path
    spec_path: Optional[Path]
    _module: Optional[types.ModuleType] = None
    _module_mtime: float = -1.0

    def module(self) -> Optional[types.ModuleType]:
        """The card's Python file, imported (again when it changed on disk)."""
        if self.spec_path is None:
            return None
        mtime = self.spec_path.stat().st_mtime
        if self._module is None or mtime != self._module_mtime:
            if self.dir == builtin_dir():
                modname = f"kernelkit.kernels.{self.name}"
            else:
                modname = f"kernelkit_cards_{hashlib.sha1(str(self.dir).encode()).hexdigest()[:10]}.{self.name}"
            spec = importlib.util.spec_from_file_location(modname, self.spec_path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[modname] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop(modname, None)
                raise
            self._module, self._module_mtime = mod, mtime
        return self._module

    @property
    def spec(self):
        mod = self.module()
        return getattr(mod, "SPEC", None) if mod else None

    def sources(self) -> List[Path]:
        spec = self.spec
        if spec is not None and spec.sources:
            return [self.dir / s for s in spec.sources]
        for ext in (".cu", ".cpp"):
            if (self.dir / f"{self.name}{ext}").is_file():
                return [self.dir / f"{self.name}{ext}"]
        return []

    def header(self) -> Optional[Path]:
        spec = self.spec
        name = spec.header if spec is not None and spec.header else f"{self.name}.h"
        h = self.dir / name
        return h if h.is_file() else None

    @property
    def has_cuda(self) -> bool:
        return any(s.suffix == ".cu" for s in self.sources())


def _is_card(d: Path, name: str) -> bool:
    return any((d / f"{name}{ext}").is_file() for ext in (".cu", ".cpp", ".py"))


_CARDS: Dict[Path, Card] = {}  # one Card object per file, so its imported spec module is reused


def _card(name: str, d: Path) -> Card:
    py = d / f"{name}.py"
    key = d / name
    if key not in _CARDS:
        _CARDS[key] = Card(name, d, py if py.is_file() else None)
    return _CARDS[key]


def find(name: PathLike, kernels_dir=None) -> Card:
    """The card called ``name`` (or the card whose source file ``name`` is)."""
    p = Path(name)
    if p.suffix in (".cu", ".cpp") and p.is_file():
        return _card(p.stem, p.resolve().parent)
    if not str(name).isidentifier():
        raise ValueError(f"name: expected a card name (an identifier) or a path to a .cu/.cpp file, got {name!r}")
    dirs = search_path(kernels_dir)
    for d in dirs:
        if _is_card(d, str(name)):
            card = _card(str(name), d)
            if not card.sources():
                raise KernelkitError(f"card {name!r} in {d} has no {name}.cu or {name}.cpp (and its spec lists no sources)")
            return card
    raise KernelkitError(f"no card named {name!r}: looked for {name}.cu / {name}.cpp in " + ", ".join(map(str, dirs)))


def _own_files(card: Card) -> set:
    return {card.dir / f"{card.name}{ext}" for ext in (".cu", ".cpp")}


def _listed_sources(card: Card) -> List[Path]:
    """The card's sources, or none if its spec does not import (that error is the card's own: it shows when
    the card is loaded, not while the others are listed)."""
    try:
        return card.sources()
    except Exception:
        return []


def all_cards(kernels_dir=None) -> Dict[str, Card]:
    """Every card on the search path (the first directory that has a name wins).

    A card is a ``.cu``/``.cpp`` file's stem, unless that file is one of the sources another card's spec
    lists (a multi-file card's second translation unit is not a card of its own)."""
    out: Dict[str, Card] = {}
    for d in search_path(kernels_dir):
        if not d.is_dir():
            continue
        found = [_card(f.stem, d) for f in sorted(d.iterdir())
                 if f.suffix in (".cu", ".cpp") and f.stem.isidentifier() and f.stem not in out]
        parts = set()  # files that cards with a spec list besides their own
        for c in found:
            if c.spec_path is not None:
                parts |= {s.resolve() for s in _listed_sources(c)} - _own_files(c)
        for c in found:
            if c.spec_path is not None or not _own_files(c) & parts:
                out.setdefault(c.name, c)
    return out
