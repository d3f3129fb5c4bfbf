"""Comparing an op's outputs with its reference's: dtype-aware tolerances, max errors, first mismatches.

An element passes when it is close to the reference computed in the same dtype or (when given) in
float64; a case records the max abs/rel errors against both and the first mismatching indices.
"""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import torch

from .guard import index

CHUNK = 1 << 24  # elements compared at a time (keeps > 2**31-element checks within memory)


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "-"


def _val(v) -> str:
    return f"{v:.8g}" if isinstance(v, float) else str(v)


def map_tensors(x, fn):
    """``fn`` applied to every tensor in ``x`` (nested tuples/lists too), other values kept."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(map_tensors(v, fn) for v in x)
    return x


def flat_outputs(x) -> List[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def upcast(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


@dataclasses.dataclass
class Mismatch:
    index: tuple
    got: Any
    expected: Any
    expected64: Any = None

    def format(self) -> str:
        s = f"index {self.index}: got {_val(self.got)}, expected {_val(self.expected)}"
        return s + (f" (float64 reference {_val(self.expected64)})" if self.expected64 is not None else "")


def check_meta(case, name: str, got: Any, exp: torch.Tensor) -> bool:
    """A tensor of the reference output's shape, dtype and device? Failures go to ``case.fail``."""
    if not isinstance(got, torch.Tensor):
        case.fail(f"{name}: the op returned {type(got).__name__}, expected a tensor")
        return False
    for attr in ("shape", "dtype", "device"):
        if getattr(got, attr) != getattr(exp, attr):
            hint = " (wrong dtype handling: outputs must keep the reference's dtype)" if attr == "dtype" else ""
            case.fail(f"{name}: {attr} {getattr(got, attr)}, expected {getattr(exp, attr)}{hint}")
            return False
    return True


def compare(case, name: str, got: Any, exp: Any, exp64: Any, rtol: float, atol: float, limit: int = 5) -> None:
    """Compare one output with the reference in the same dtype and (when given) in float64; an element
    passes when it is close to either. Records max errors and the first ``limit`` mismatches in ``case``
    (a :class:`kernelkit.harness.results.Case`)."""
    if not isinstance(exp, torch.Tensor):
        if got != exp:
            case.fail(f"{name}: got {got!r}, expected {exp!r}")
        return
    if not check_meta(case, name, got, exp):
        return
    g, e = got.detach().reshape(-1), exp.detach().reshape(-1)
    e64 = exp64.detach().reshape(-1) if isinstance(exp64, torch.Tensor) else None
    exact = not (got.is_floating_point() or got.is_complex())
    n_bad = 0
    for start in range(0, g.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        if exact:
            n_bad += int((g[sl] != e[sl]).sum())
            continue
        gc, ec = g[sl].double(), e[sl].double()
        e6 = e64[sl].double() if e64 is not None else None
        # the chunk's stats in one tensor, read back with one synchronisation
        stats = [_bad(gc, ec, e6, rtol, atol).sum().double(), *_errors(gc, ec, atol),
                 *(_errors(gc, e6, atol) if e6 is not None else [])]
        bad, *errors = torch.stack(stats).tolist()
        n_bad += int(bad)
        _note_errors(case, errors)
    if n_bad:
        _fail(case, name, g, e, e64, exact, n_bad, rtol, atol, exp.shape, limit)


def _bad(gc: torch.Tensor, ec: torch.Tensor, e6: Optional[torch.Tensor], rtol: float, atol: float) -> torch.Tensor:
    """Which elements of ``gc`` are close neither to ``ec`` nor to ``e6`` (float64 all; torch.isclose, NaN equal
    to NaN)."""
    close = torch.isclose(gc, ec, rtol=rtol, atol=atol, equal_nan=True)
    if e6 is not None:
        close |= torch.isclose(gc, e6, rtol=rtol, atol=atol, equal_nan=True)
    return ~close


def _fail(case, name: str, g, e, e64, exact: bool, n_bad: int, rtol: float, atol: float, shape, limit: int) -> None:
    """The failure message: how many elements differ, how many of them are NaN/inf where the reference is finite,
    and the first ``limit`` of them (a second pass over the chunks, taken only when something differs)."""
    found: List[Mismatch] = []
    n_nonfinite = 0
    for start in range(0, g.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        if exact:
            bad = g[sl] != e[sl]
        else:
            gc, ec = g[sl].double(), e[sl].double()
            bad = _bad(gc, ec, e64[sl].double() if e64 is not None else None, rtol, atol)
            n_nonfinite += int((~torch.isfinite(gc) & torch.isfinite(ec)).sum())
        for i in bad.nonzero().flatten()[: max(0, limit - len(found))].tolist():
            k = start + i
            found.append(Mismatch(index(k, shape), g[k].item(), e[k].item(), e64[k].item() if e64 is not None else None))
    case.mismatches += found
    tol = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
    extra = f"; {n_nonfinite} NaN/inf where the reference is finite" if n_nonfinite else ""
    where = f"at {found[0].format()}" if len(found) == 1 else \
        "first at:" + "".join(f"\n      {m.format()}" for m in found)
    case.fail(f"{name}: {n_bad} of {g.numel()} elements differ ({tol}){extra}; {where}")


def _max(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return b if a is None else a if b is None else max(a, b)


def _errors(g: torch.Tensor, e: torch.Tensor, atol: float) -> List[torch.Tensor]:
    """This chunk's (max abs, max rel) errors over its finite elements, as 0-dim tensors, -1 where there is none
    (rel: none where no reference element is larger than atol)."""
    finite = torch.isfinite(g) & torch.isfinite(e)
    none = g.new_full((), -1.0)  # masked with where, not indexing: no host round trip per mask
    err = torch.where(finite, (g - e).abs(), none)
    ref = e.abs()
    rel = torch.where(finite & (ref > max(atol, 1e-30)), err / ref, none)
    return [err.max(), rel.max()]


def _note_errors(case, errors: List[float]) -> None:
    """Fold a chunk's (abs, rel[, abs64, rel64]) maxima (-1: none) into the case's running ones."""
    for field, value in zip(("max_abs", "max_rel", "max_abs64", "max_rel64"), errors):
        if value >= 0:
            setattr(case, field, _max(getattr(case, field), value))
