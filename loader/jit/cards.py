"""Finding cards on the kernel search path, and reading their specs.

A card named ``op`` lives in a kernels directory as ``op.cu`` (or ``op.cpp``), ``op.h`` and optionally
``op.py`` (its ``SPEC`` and ``setup(lib)``); files its spec lists in ``nvrtc_sources`` (``op.cu`` itself,
or others) are kernel-only code for NVRTC, not sources of the nvcc build. The search path is
``kernels_dir=`` when given, else the directories in ``KERNELKIT_PATH`` followed by the cards that ship
with kernelkit.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .. import settings
from ..errors import KernelkitError, SpecError

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
    return [p.resolve() for p in settings.KERNELS_PATH.get()] + [builtin_dir()]


# ------------------------------------------------------------------------------------ running a spec
def _from_dir(name: str, d: Path) -> bool:
    """Whether module ``name`` belongs to a top-level module that was imported from directory ``d``."""
    top = name.partition(".")[0]
    spec = getattr(sys.modules.get(top), "__spec__", None)
    places = [getattr(spec, "origin", None)] + list(getattr(spec, "submodule_search_locations", None) or [])
    return any(isinstance(p, str) and Path(p).parent in (d, d / top) for p in places)


class _CardDirFinder:
    """Finds the top-level modules and packages that sit in one card directory (submodules are found through
    their package's ``__path__``)."""

    def __init__(self, d: Path):
        self.d = str(d)

    def find_spec(self, name, _path=None, _target=None):
        return None if "." in name else importlib.machinery.PathFinder.find_spec(name, [self.d])


@contextlib.contextmanager
def _importable(d: Path) -> Iterator[None]:
    """While a card's spec runs, what sits beside it imports, ahead of sys.path (a ``reference`` package
    there wins even over a regular one elsewhere, which plain sys.path order would not give a directory
    without ``__init__.py``); modules already imported keep their names.

    What it imported from ``d`` leaves sys.modules again afterwards (the spec keeps it through its
    globals): two card directories that each have a ``reference`` never get each other's, and a spec run
    again after an edit imports the files beside it afresh too."""
    before = set(sys.modules)
    finder = _CardDirFinder(d)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in sorted(set(sys.modules) - before, key=len, reverse=True):  # submodules before their parent
            if _from_dir(name, d):
                del sys.modules[name]


def _failure(error: BaseException, path: Path) -> str:
    """One line saying where in the spec ``path`` ``error`` was raised, and where exactly when that was in
    a file the spec imports."""
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__)]
    if isinstance(error, SyntaxError) and error.filename:  # the compiler's error: the place it points at
        frames.append((error.filename, error.lineno))
    ours = [line for file, line in frames if file == str(path)]
    where = f"{path}:{ours[-1]}" if ours else str(path)
    file, line = frames[-1] if frames else (str(path), None)
    origin = "" if file == str(path) else f" (raised at {file}:{line})"
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    return f"{where}: the card's spec failed to import: {type(error).__name__}: {message}{origin}"


def nvrtc_entries(value, where: str) -> Dict[str, Tuple[str, ...]]:
    """``Spec.nvrtc_sources`` as {file: template instantiations}: it may be a file, a list of files, or a
    mapping file -> instantiations. SpecError (naming ``where``) for anything else."""
    if not value:
        return {}
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    if isinstance(value, Mapping):
        items = [(f, (e,) if isinstance(e, str) else tuple(e or ())) for f, e in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f, ()) for f in value]
    else:
        items = [(value, ())]
    for f, exprs in items:
        if not isinstance(f, (str, os.PathLike)) or not all(isinstance(e, str) for e in exprs):
            raise SpecError(f"{where}: nvrtc_sources: expected a file name, a list of them, or a dict file -> "
                            f'template instantiations (["axpy<float>"]), got {value!r:.120}')
    return {str(f): exprs for f, exprs in items}


@dataclasses.dataclass
class Card:
    name: str
    dir: Path
    spec_path: Optional[Path]
    _module: Optional[types.ModuleType] = None
    _module_mtime: float = -1.0

    def module(self) -> Optional[types.ModuleType]:
        """The card's Python file, imported (again when it changed on disk). Anything it raises becomes a
        SpecError naming the file and line (the original is its ``__cause__``)."""
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
                with _importable(self.dir):
                    spec.loader.exec_module(mod)
            except Exception as e:  # noqa: BLE001 - the user's file may raise anything
                sys.modules.pop(modname, None)
                raise SpecError(_failure(e, self.spec_path)) from e
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
        """The files of the nvcc/C++ build (never one of the NVRTC sources)."""
        spec = self.spec
        nvrtc = self.nvrtc_sources()
        if spec is not None and spec.sources:
            listed = [self.dir / s for s in spec.sources]
            both = next((s for s in listed if s in nvrtc), None)
            if both is not None:
                raise SpecError(f"{self.spec_path}: {both.name} is in both sources= and nvrtc_sources=; a file is "
                                "compiled by nvcc or by NVRTC, not both")
            return listed
        for ext in (".cu", ".cpp"):
            own = self.dir / f"{self.name}{ext}"
            if own.is_file() and own not in nvrtc:
                return [own]
        return []

    def nvrtc_sources(self) -> Dict[Path, Tuple[str, ...]]:
        """The spec's ``nvrtc_sources``: each file with the template instantiations to compile from it."""
        spec = self.spec
        value = getattr(spec, "nvrtc_sources", None) if spec is not None else None
        return {self.dir / f: exprs for f, exprs in nvrtc_entries(value, str(self.spec_path)).items()}

    def header(self) -> Optional[Path]:
        spec = self.spec
        name = spec.header if spec is not None and spec.header else f"{self.name}.h"
        h = self.dir / name
        return h if h.is_file() else None

    @property
    def has_cuda(self) -> bool:
        return bool(self.nvrtc_sources()) or any(s.suffix == ".cu" for s in self.sources())

    def missing_file(self) -> Optional[str]:
        """The file of this card that is gone from disk (its spec, a source), None while all are there."""
        if self.spec_path is not None and not self.spec_path.is_file():
            return str(self.spec_path)
        files = self.sources() + list(self.nvrtc_sources())
        if not files:
            return str(self.dir / f"{self.name}.cu") + " (or .cpp)"
        return next((str(s) for s in files if not s.is_file()), None)


# ------------------------------------------------------------------ a card's sources, without running it
def _is_spec_call(node: ast.AST) -> bool:
    func = getattr(node, "func", None)
    return isinstance(node, ast.Call) and (getattr(func, "attr", None) or getattr(func, "id", None)) == "Spec"


def _literal_files(spec_file: Path) -> Tuple[Optional[List[str]], List[str]]:
    """The ``sources=`` (None when it passes none) and the ``nvrtc_sources=`` files of the ``Spec(...)`` call
    in a spec file, read without running the file. ValueError when there is no such call or a value is
    computed; SyntaxError."""
    calls = [n for n in ast.walk(ast.parse(spec_file.read_text(), str(spec_file))) if _is_spec_call(n)]
    if len(calls) != 1:
        raise ValueError(f"{spec_file}: not one Spec(...) call")
    call = calls[0]
    if len(call.args) > 4 or any(isinstance(a, ast.Starred) for a in call.args) or any(
            kw.arg is None for kw in call.keywords):  # sources may be among *args / **kwargs
        raise ValueError(f"{spec_file}: Spec(...) gets its arguments unpacked")
    sources, nvrtc = None, []
    for kw in call.keywords:
        if kw.arg == "sources":
            value = ast.literal_eval(kw.value)
            sources = None if value is None else [str(s) for s in value]
        elif kw.arg == "nvrtc_sources":
            try:
                nvrtc = list(nvrtc_entries(ast.literal_eval(kw.value), str(spec_file)))
            except SpecError as e:
                raise ValueError(str(e)) from None
    return sources, nvrtc


def declared_sources(name: str, d: Path, note: Callable[[str], None] = lambda _message: None) -> List[str]:
    """The compiled files of card ``name`` in ``d``, relative to ``d``: its sources as Card.sources() gives
    them, then its NVRTC sources. Read from its spec's ``Spec(..., sources=[...], nvrtc_sources=[...])``
    without running it (and so without importing torch) when they are written out there; otherwise the
    spec is imported, and when that fails ``note`` gets why and the card's own file is listed."""
    spec_file = d / f"{name}.py"
    listed, nvrtc = None, []
    if spec_file.is_file():
        try:
            listed, nvrtc = _literal_files(spec_file)
        except (ValueError, SyntaxError):  # not a plain `Spec(..., sources=[...])`: only running it tells
            try:
                card = _card(name, d)
                spec = card.spec
                listed = list(spec.sources or []) if spec is not None else None
                nvrtc = [str(p.relative_to(d)) for p in card.nvrtc_sources()]
            except SpecError as e:
                note(str(e))
    if not listed:
        listed = [f"{name}{ext}" for ext in (".cu", ".cpp") if (d / f"{name}{ext}").is_file()
                  and f"{name}{ext}" not in nvrtc][:1]
    return listed + [f for f in nvrtc if f not in listed]


# ------------------------------------------------------------------------------------ the search path
def _is_card(d: Path, name: str) -> bool:
    return any((d / f"{name}{ext}").is_file() for ext in (".cu", ".cpp", ".py"))


_CARDS: Dict[Path, Card] = {}  # one Card object per file, so its imported spec module is reused


def _card(name: str, d: Path) -> Card:
    py = d / f"{name}.py"
    spec_path = py if py.is_file() else None
    key = d / name
    if key not in _CARDS or _CARDS[key].spec_path != spec_path:  # a spec added or removed: a new card
        _CARDS[key] = Card(name, d, spec_path)
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
            if not card.sources() and not card.nvrtc_sources():
                raise KernelkitError(f"card {name!r} in {d} has no {name}.cu or {name}.cpp (and its spec lists no sources)")
            return card
    raise KernelkitError(f"no card named {name!r}: looked for {name}.cu / {name}.cpp in " + ", ".join(map(str, dirs)))


def _own_files(card: Card) -> set:
    return {card.dir / f"{card.name}{ext}" for ext in (".cu", ".cpp")}


def _listed_files(card: Card) -> List[Path]:
    """The card's sources and NVRTC sources, or none if its spec does not import (that error is the card's
    own: it shows when the card is loaded, not while the others are listed)."""
    try:
        return card.sources() + list(card.nvrtc_sources())
    except Exception:  # noqa: BLE001 - whatever the spec raises is shown when that card is loaded
        return []


def all_cards(kernels_dir=None) -> Dict[str, Card]:
    """Every card on the search path (the first directory that has a name wins).

    A card is a ``.cu``/``.cpp`` file's stem, unless that file is one of the sources (or NVRTC sources)
    another card's spec lists (a multi-file card's second translation unit is not a card of its own)."""
    out: Dict[str, Card] = {}
    for d in search_path(kernels_dir):
        if not d.is_dir():
            continue
        found = [_card(f.stem, d) for f in sorted(d.iterdir())
                 if f.suffix in (".cu", ".cpp") and f.stem.isidentifier() and f.stem not in out]
        parts = set()  # files that cards with a spec list besides their own
        for c in found:
            if c.spec_path is not None:
                parts |= {s.resolve() for s in _listed_files(c)} - _own_files(c)
        for c in found:
            if c.spec_path is not None or not _own_files(c) & parts:
                out.setdefault(c.name, c)
    return out
