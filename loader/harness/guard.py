"""Guard bands and poison: memory around and under the op's buffers that betrays stray reads and writes.

Every buffer the op sees sits inside a larger one whose remaining memory holds a sentinel (a signalling
NaN for floats); outputs passed through ``out=`` are filled with it, and the allocator is poisoned before
each call, so an element the op never writes reads NaN and a write outside a tensor changes the sentinel.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

GUARD = 1024  # elements of NaN guard band on each side of every buffer the op sees

# Guard-band fill: a signalling NaN with a payload. Reading it yields NaN; arithmetic on it yields a
# *quiet* NaN (different bits), so a stray write of a computed NaN is still seen as a write.
_SNAN = {torch.float64: (torch.int64, 0x7FF4A5A5A5A5A5A5), torch.float32: (torch.int32, 0x7FA5A5A5),
         torch.float16: (torch.int16, 0x7D5A), torch.bfloat16: (torch.int16, 0x7FA5)}


def fill_sentinel(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with the sentinel of its dtype (in place); returns ``t``."""
    if t.dtype in _SNAN:
        int_dtype, bits = _SNAN[t.dtype]
        t.view(int_dtype).fill_(bits)
    else:
        t.fill_(float("nan") if t.dtype.is_floating_point or t.dtype.is_complex else
                True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)
    return t


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """(numel, k) integers holding each element's bytes (one integer of its size where there is one), so NaNs
    compare equal to themselves."""
    flat = torch.empty(t.numel(), dtype=t.dtype, device=t.device).copy_(t.detach().reshape(-1))
    whole = _SAME_SIZE_INT.get(flat.element_size(), torch.uint8)  # 1/itemsize of the elements to compare
    return flat.view(whole).view(flat.numel(), -1) if flat.numel() else flat.view(whole).view(0, 1)


def index(flat: int, shape: Sequence[int]) -> tuple:
    """The multi-index of element ``flat`` of a row-major tensor of ``shape``."""
    idx = []
    for s in reversed(list(shape)):
        idx.append(flat % s)
        flat //= s
    return tuple(reversed(idx))


class Guarded:
    """A tensor embedded in a larger flat buffer whose remaining memory (a band before, a band after and,
    for strided views, the gaps between elements) holds the sentinel. A read outside the view produces NaN
    in the output; a write outside it changes the sentinel, which ``stray_writes`` reports."""

    def __init__(self, like: torch.Tensor, strided: bool, fill: Optional[torch.Tensor] = None):
        self.shape = tuple(like.shape)
        self.strided = strided and like.dim() > 0
        self.inner = like.numel() * (2 if self.strided else 1)
        self.base = fill_sentinel(torch.empty(2 * GUARD + self.inner, dtype=like.dtype, device=like.device))
        self.view = self._embed(self.base)
        if fill is not None:
            self.view.copy_(fill)

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        mid = flat[GUARD:GUARD + self.inner]
        if self.strided:
            return mid.view(*self.shape[:-1], 2 * self.shape[-1])[..., ::2]
        return mid.view(self.shape)

    def stray_writes(self, what: str) -> Optional[str]:
        """A message naming where the op wrote outside the view, or None."""
        outside = torch.ones(self.base.numel(), dtype=torch.bool, device=self.base.device)
        self._embed(outside).fill_(False)
        sentinel = fill_sentinel(torch.empty(1, dtype=self.base.dtype, device=self.base.device))
        changed = ((bits(self.base) != bits(sentinel)).any(1) & outside).nonzero().flatten()
        if changed.numel() == 0:
            return None
        p = int(changed[0])
        if p < GUARD:
            where = f"{GUARD - p} element(s) before its first element"
        elif p >= GUARD + self.inner:
            where = f"element +{p - GUARD - self.inner} past its end"
        else:
            where = f"in a gap of the strided view (storage offset {p - GUARD} from the view's start)"
        return (f"{what}: wrote outside the tensor's elements: {changed.numel()} element(s) of the surrounding "
                f"memory changed, first {where}")


def poison_allocator(like: Sequence[Any], device: torch.device) -> None:
    """Fill and free a block of each expected output's size: the allocator then tends to hand the op a
    NaN-filled block, so an element the op never writes reads NaN, not a stale correct value."""
    for t in like:
        if isinstance(t, torch.Tensor) and t.numel():
            torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, device=device).fill_(255)
