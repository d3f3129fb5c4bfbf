"""Theoretical occupancy from a kernel's registers, shared memory and block size, by the per-arch limits of
the CUDA C++ Programming Guide ("Technical Specifications per Compute Capability") and its occupancy
calculator's allocation rules. No GPU needed; on a GPU, ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``
is the authority (tests compare the two there)."""
from __future__ import annotations

import dataclasses
import re
from typing import Dict

from ..errors import KernelkitError

KB = 1024


@dataclasses.dataclass(frozen=True)
class Limits:
    max_warps: int  # resident warps per SM (threads per SM / 32)
    max_blocks: int  # resident blocks per SM
    smem_per_sm: int  # shared memory per SM at the largest carveout, bytes
    smem_per_block: int  # the most one block may use (static + dynamic, with the opt-in attribute), bytes
    reserved_smem: int = 1 * KB  # the driver's reservation per block (cc 8.0 and later)
    smem_unit: int = 128  # shared memory is allocated per block in multiples of this
    regs_per_sm: int = 64 * KB  # 32-bit registers per SM
    regs_per_block: int = 64 * KB  # the most one block may use
    max_regs_per_thread: int = 255
    reg_unit: int = 256  # registers are allocated per warp in multiples of this
    sub_partitions: int = 4  # an SM's register file is split into these; a block's warps are spread over them
    max_threads_per_block: int = 1024


#: compute capability (major*10 + minor) -> its limits
LIMITS: Dict[int, Limits] = {
    70: Limits(64, 32, 96 * KB, 96 * KB, reserved_smem=0, smem_unit=256),  # V100
    72: Limits(64, 32, 96 * KB, 96 * KB, reserved_smem=0, smem_unit=256),  # Xavier
    75: Limits(32, 16, 64 * KB, 64 * KB, reserved_smem=0, smem_unit=256),  # Turing
    80: Limits(64, 32, 164 * KB, 163 * KB),  # A100
    86: Limits(48, 16, 100 * KB, 99 * KB),  # GA10x
    87: Limits(48, 16, 164 * KB, 163 * KB),  # Orin
    89: Limits(48, 24, 100 * KB, 99 * KB),  # Ada
    90: Limits(64, 32, 228 * KB, 227 * KB),  # H100/H200
    100: Limits(64, 32, 228 * KB, 227 * KB),  # B200
    103: Limits(64, 32, 228 * KB, 227 * KB),  # B300
    120: Limits(48, 32, 128 * KB, 99 * KB),  # RTX 50xx
    121: Limits(48, 32, 128 * KB, 99 * KB),  # DGX Spark
}


def limits(arch) -> Limits:
    """``arch``: "sm_90", "sm_90a", "9.0", "90" or 90."""
    text = str(arch).strip().lower().replace("sm_", "").replace("compute_", "")
    text = re.sub(r"[af]$", "", text)
    if re.fullmatch(r"\d+\.\d", text):
        text = text.replace(".", "")
    if not text.isdigit() or int(text) not in LIMITS:
        known = ", ".join(f"sm_{k}" for k in LIMITS)
        raise KernelkitError(f"arch: no occupancy limits known for {arch!r} (known: {known})")
    return LIMITS[int(text)]


@dataclasses.dataclass(frozen=True)
class Occupancy:
    block_size: int
    blocks_per_sm: int
    warps_per_sm: int
    max_warps: int
    limiter: str  # what bounds blocks_per_sm: "warps", "blocks", "registers", "shared memory"

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps

    def __str__(self) -> str:
        if self.blocks_per_sm == 0:
            return f"0% (a block of {self.block_size} does not fit: {self.limiter})"
        return f"{self.fraction:.0%} ({self.blocks_per_sm} blk, {self.limiter})"


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def occupancy(arch, registers: int, block_size: int, static_smem: int = 0, dynamic_smem: int = 0) -> Occupancy:
    """Resident blocks and warps per SM for a kernel using ``registers`` per thread and ``static_smem`` +
    ``dynamic_smem`` bytes of shared memory per block, launched with ``block_size`` threads."""
    lim = limits(arch)
    for what, value in (("registers", registers), ("static_smem", static_smem), ("dynamic_smem", dynamic_smem)):
        if not isinstance(value, int) or value < 0:
            raise KernelkitError(f"{what}: expected an integer >= 0, got {value!r}")
    if not isinstance(block_size, int) or not 1 <= block_size <= lim.max_threads_per_block:
        raise KernelkitError(f"block_size: expected 1..{lim.max_threads_per_block} threads, got {block_size!r}")
    warps = -(-block_size // 32)
    bounds = {"warps": lim.max_warps // warps, "blocks": lim.max_blocks}
    if registers:
        per_warp = _round_up(max(registers, 1) * 32, lim.reg_unit)
        # the launch check counts a block's warps rounded up to the sub-partitions, as if spread over all
        if registers > lim.max_regs_per_thread or per_warp * _round_up(warps, lim.sub_partitions) > lim.regs_per_block:
            bounds["registers"] = 0
        else:  # warps fit per sub-partition's share of the register file
            warps_per_partition = (lim.regs_per_sm // lim.sub_partitions) // per_warp
            bounds["registers"] = warps_per_partition * lim.sub_partitions // warps
    smem = static_smem + dynamic_smem
    if smem or lim.reserved_smem:
        per_block = _round_up(smem + lim.reserved_smem, lim.smem_unit)
        bounds["shared memory"] = 0 if smem > lim.smem_per_block else lim.smem_per_sm // per_block
    limiter = min(bounds, key=lambda k: (bounds[k], k != "warps"))  # ties: name the warps limit
    blocks = bounds[limiter]
    return Occupancy(block_size, blocks, blocks * warps, lim.max_warps, limiter)
