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
    n_bad = n_nonfinite = 0
    found: List[Mismatch] = []
    for start in range(0, g.numel(), CHUNK):
        sl = slice(start, start + CHUNK)
        if exact:
            bad = g[sl] != e[sl]
        else:
            gc, ec = g[sl].double(), e[sl].double()
            close = torch.isclose(gc, ec, rtol=rtol, atol=atol, equal_nan=True)
            case.max_abs, case.max_rel = _errors(case.max_abs, case.max_rel, gc, ec, atol)
            if e64 is not None:
                e6 = e64[sl].double()
                close |= torch.isclose(gc, e6, rtol=rtol, atol=atol, equal_nan=True)
                case.max_abs64, case.max_rel64 = _errors(case.max_abs64, case.max_rel64, gc, e6, atol)
            bad = ~close
            n_nonfinite += int((~torch.isfinite(gc) & torch.isfinite(ec)).sum())
        n_bad += int(bad.sum())
        for i in bad.nonzero().flatten()[: max(0, limit - len(found))].tolist():
            k = start + i
            found.append(Mismatch(index(k, exp.shape), g[k].item(), e[k].item(),
                                  e64[k].item() if e64 is not None else None))
    if n_bad:
        case.mismatches += found
        tol = "exact" if exact else f"rtol={rtol:g}, atol={atol:g}"
        extra = f"; {n_nonfinite} NaN/inf where the reference is finite" if n_nonfinite else ""
        where = f"at {found[0].format()}" if len(found) == 1 else \
            "first at:" + "".join(f"\n      {m.format()}" for m in found)
        case.fail(f"{name}: {n_bad} of {g.numel()} elements differ ({tol}){extra}; {where}")


def _max(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return b if a is None else a if b is None else max(a, b)


def _errors(max_abs, max_rel, g: torch.Tensor, e: torch.Tensor, atol: float):
    """The running (max abs, max rel) errors updated with this chunk's finite elements."""
    finite = torch.isfinite(g) & torch.isfinite(e)
    if not bool(finite.any()):
        return max_abs, max_rel
    zero = g.new_zeros(())  # masked with where, not indexing: no host round trip per mask
    err = torch.where(finite, (g - e).abs(), zero)
    ref = e.abs()
    big = finite & (ref > max(atol, 1e-30))
    rel = float(torch.where(big, err / ref, zero).max()) if bool(big.any()) else None
    return _max(max_abs, float(err.max())), _max(max_rel, rel)
