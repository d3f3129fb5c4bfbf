"""Where a strict run finds its op, reference and inputs: plain data a fresh interpreter can follow.

Strict mode runs the op in a process of its own, so the op cannot be handed over as a Python object: it is
named instead, by an :class:`Origin` (a candidate file, a kernel source, a card, or a module-level function
pickled by reference). The problem format of ``kernelkit eval`` (in the style of gpu-mode's reference kernels):

- a **reference file** (``--ref``) defines ``inputs(seed, device) -> tuple`` (fresh random values, the same
  for the same seed) and ``reference(*inputs)``, and may set ``TOLERANCE = (rtol, atol)`` (default: by the
  output's dtype), ``MUTATES = (indices of inputs the op may write)`` and ``NAME``;
- a **candidate** is a Python file defining ``forward(*inputs)`` (it may build its kernel with
  ``kernelkit.load_inline``), or a ``.cu``/``.cpp`` file defining ``forward`` (built with
  ``kernelkit.load_inline(..., functions=["forward"])``).
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import pickle
import re
from pathlib import Path
from typing import Any, Callable, Optional

import torch

SOURCE_SUFFIXES = (".cu", ".cpp")
_PROTOTYPE = re.compile(r"^[ \t]*((?:torch|at)::Tensor|std::vector<(?:torch|at)::Tensor>)\s+forward\s*\([^)]*\)",
                        re.M)


@dataclasses.dataclass
class Origin:
    """How to reach one callable: ``kind`` "file" (a Python file's ``attr``), "source" (a .cu/.cpp file's
    ``forward``, built), "card" (a card's "op" or spec attribute ``attr``) or "pickle" (by reference)."""

    kind: str
    value: str
    attr: str = ""
    kernels_dir: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load(self, device: str) -> Callable:
        if self.kind == "file":
            return _attr(load_file(self.value), self.attr, self.value)
        if self.kind == "source":
            return build_source(Path(self.value))
        if self.kind == "card":
            return _card_attr(self.value, self.attr, self.kernels_dir, device)
        if self.kind == "pickle":
            return pickle.loads(base64.b64decode(self.value))
        raise ValueError(f"origin: unknown kind {self.kind!r}")


def _attr(module, name: str, where: str):
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"{where} defines no function {name}()")
    return fn


def load_file(path) -> Any:
    """Import a Python file as a module of its own (a name from its path's hash: files never collide)."""
    path = Path(path).resolve()
    name = f"kk_strict_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_source(path: Path) -> Callable:
    """The ``forward`` of a .cu/.cpp candidate, built by kernelkit.load_inline."""
    from ... import loading

    text = path.read_text()
    name = f"kk_candidate_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if path.suffix == ".cpp":
        return loading.load_inline(name, cpp_sources=text, functions=["forward"]).forward
    match = _PROTOTYPE.search(text)
    if match is None:
        raise ValueError(f"{path}: no `torch::Tensor forward(...)` definition to bind")
    return loading.load_inline(name, cpp_sources=match.group(0).strip() + ";", cuda_sources=text,
                               functions=["forward"]).forward


def _card_attr(name: str, attr: str, kernels_dir, device: str):
    if attr == "op":
        from ..target import resolve

        return resolve(name, kernels_dir=kernels_dir, device=device).op
    from ...jit.cards import all_cards

    return getattr(all_cards(kernels_dir)[name].spec, attr)


def of_callable(fn: Callable, who: str) -> Origin:
    """An Origin for a module-level function (pickled by reference); anything else is a TypeError."""
    try:
        data = pickle.dumps(fn)
        same = pickle.loads(data) is fn and getattr(fn, "__module__", None) != "__main__"  # a script's: not importable
    except Exception:  # noqa: BLE001 - lambdas, closures, bound methods of local objects
        same = False
    if not same:
        raise TypeError(f"{who}: strict=True runs it in a process of its own, so it must be importable there: give a "
                        f"module-level function, a card name or a file, not {getattr(fn, '__qualname__', type(fn).__name__)!r}")
    return Origin("pickle", base64.b64encode(data).decode())


def of_target(target: Any, who: str, attr: str = "forward") -> Origin:
    """An Origin for a candidate file (.py, .cu, .cpp), a card name or a module-level callable."""
    if isinstance(target, (str, Path)) and Path(target).suffix in (".py",) + SOURCE_SUFFIXES:
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"{who}: no such file: {path}")
        kind = "source" if path.suffix in SOURCE_SUFFIXES else "file"
        return Origin(kind, str(path.resolve()), attr if kind == "file" else "forward")
    if isinstance(target, str):
        return Origin("card", target, "op")
    return of_callable(target, who)


@dataclasses.dataclass
class Problem:
    """A reference file: ``inputs(seed, device)``, ``reference(*inputs)`` and optional TOLERANCE, MUTATES, NAME."""

    path: Path
    inputs: Callable[[int, str], tuple]
    reference: Callable
    tolerance: Optional[tuple]
    mutates: tuple
    name: str

    @classmethod
    def load(cls, path) -> "Problem":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"ref: no such file: {path}")
        module = load_file(path)
        tol = getattr(module, "TOLERANCE", None)
        if tol is not None and not (isinstance(tol, (tuple, list)) and len(tol) == 2):
            raise ValueError(f"{path}: TOLERANCE: expected (rtol, atol), got {tol!r}")
        return cls(path.resolve(), _attr(module, "inputs", str(path)), _attr(module, "reference", str(path)),
                   tuple(tol) if tol is not None else None, tuple(getattr(module, "MUTATES", ())),
                   str(getattr(module, "NAME", path.stem)))

    def origin(self, attr: str) -> Origin:
        return Origin("file", str(self.path), attr)


def seed_inputs(make: Callable, style: str, seed: int, device: str, shape=None, dtype=None) -> tuple:
    """One call's inputs: ``make(seed, device)`` for a reference file ("seed"), a spec's
    ``make_inputs(shape, dtype=, device=, generator=)`` seeded ("spec")."""
    if style == "seed":
        return tuple(make(seed, device))
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(make(tuple(shape), dtype=dtype, device=device, generator=gen))
