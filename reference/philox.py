"""Philox4x32-10 and the kernels' Box-Muller transforms in pure PyTorch (int64 arithmetic, exact).

The same generator and counter layout as ``loader/include/kernelkit/philox.cuh``: for (seed, subsequence, offset)
block k is Philox4x32-10 of counter (offset/4 + k, subsequence) under key seed, i.e. cuRAND's
``curand_init(seed, subsequence, offset)`` stream. Used by the tests to check the CUDA samplers bit
for bit (slow: for test-sized inputs only).
"""
from __future__ import annotations

import math

import torch

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, m: int):
    """(hi, lo) 32-bit words of a * m for uint32 values held in int64, without int64 overflow."""
    a0, a1 = a & 0xFFFF, a >> 16
    m0, m1 = m & 0xFFFF, m >> 16
    low = a0 * m0
    mid = a1 * m0 + a0 * m1
    lo_full = low + ((mid & 0xFFFF) << 16)
    hi = (a1 * m1 + (mid >> 16) + (lo_full >> 32)) & _MASK
    return hi, lo_full & _MASK


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 of ``counter`` (..., 4) under ``key`` (..., 2), uint32 words in int64 tensors."""
    c = [counter[..., j].to(torch.int64) & _MASK for j in range(4)]
    k0 = key[..., 0].to(torch.int64) & _MASK
    k1 = key[..., 1].to(torch.int64) & _MASK
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
        hi0, lo0 = _mulhilo(c[0], _M0)
        hi1, lo1 = _mulhilo(c[2], _M1)
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return torch.stack(c, dim=-1)


def philox_blocks(seed: int, subsequence: torch.Tensor, offset: int, blocks: int = 1) -> torch.Tensor:
    """The first ``blocks`` 128-bit blocks of each subsequence: (len(subsequence), blocks, 4)."""
    sub = subsequence.to(torch.int64).reshape(-1, 1)
    step = torch.arange(blocks, dtype=torch.int64).reshape(1, -1) + offset // 4
    ctr = torch.stack(torch.broadcast_tensors(step & _MASK, step >> 32, sub & _MASK, sub >> 32), dim=-1)
    key = torch.tensor([seed & _MASK, (seed >> 32) & _MASK], dtype=torch.int64)
    return philox4x32_10(ctr, key.expand(ctr.shape[:-1] + (2,)))


def box_muller_float(x: torch.Tensor, y: torch.Tensor):
    """The float transform of philox.cuh, evaluated exactly (float64): (r sin a, r cos a)."""
    u = (x.double() + 0.5) * 2.0 ** -32
    a = ((y >> 9).double() + 0.5) * 2.0 ** -23 * (2 * math.pi)
    r = torch.sqrt(-2.0 * torch.log(u))
    return r * torch.sin(a), r * torch.cos(a), r


def box_muller_double(x0, x1, y0, y1):
    """cuRAND's double transform (53-bit uniforms, sincospi), float64."""
    zx = (x0 ^ (x1 << 21)).double()
    zy = (y0 ^ (y1 << 21)).double()
    u = zx * 2.0 ** -53 + 2.0 ** -54
    v = zy * 2.0 ** -52 + 2.0 ** -53
    r = torch.sqrt(-2.0 * torch.log(u))
    return r * torch.sin(math.pi * v), r * torch.cos(math.pi * v), r


def normal4(seed: int, subsequence: torch.Tensor, offset: int, double: bool):
    """The four normals normal4() draws per subsequence: z (len, 4) and each one's radius r (len, 4)."""
    if double:
        b = philox_blocks(seed, subsequence, offset, 2)
        s0, c0, r0 = box_muller_double(b[:, 0, 0], b[:, 0, 1], b[:, 0, 2], b[:, 0, 3])
        s1, c1, r1 = box_muller_double(b[:, 1, 0], b[:, 1, 1], b[:, 1, 2], b[:, 1, 3])
    else:
        b = philox_blocks(seed, subsequence, offset, 1)[:, 0]
        s0, c0, r0 = box_muller_float(b[:, 0], b[:, 1])
        s1, c1, r1 = box_muller_float(b[:, 2], b[:, 3])
    return torch.stack([s0, c0, s1, c1], -1), torch.stack([r0, r0, r1, r1], -1)


def sample_normal_z(d: int, n: int, seed: int, offset: int = 0, double: bool = False, rows=None):
    """The z (d, n) and radii that kernelkit's CUDA sample_normal draws for (seed, offset), in float64;
    only the given ``rows`` (then (len(rows), n)) when asked."""
    chunks = (n + 3) // 4
    rows = torch.arange(d) if rows is None else torch.as_tensor(rows, dtype=torch.int64)
    sub = (rows[:, None] * chunks + torch.arange(chunks)[None, :]).reshape(-1)
    z, r = normal4(seed, sub, offset, double)
    return z.reshape(len(rows), chunks * 4)[:, :n], r.reshape(len(rows), chunks * 4)[:, :n]
