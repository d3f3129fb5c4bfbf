"""The floor: bytes an op must move / the device's bandwidth, measured once with a large copy and cached."""
from __future__ import annotations

import platform
import time
from typing import Any, Callable

import torch

from ..jit import cache, keys
from .timing import time_fn


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _device_key(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"cuda|{p.name}|cc{p.major}.{p.minor}|{p.total_memory}|{getattr(p, 'uuid', '')}"
    return f"cpu|{device_name(device)}|{platform.node()}"


def device_bandwidth(device=None, *, refresh: bool = False) -> float:
    """Bytes/s (read + write) of a large device-to-device copy; measured once per device, kept in the cache's
    bandwidth records (``records/bandwidth/``)."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    identity = _device_key(device)
    key = keys.bandwidth_key(identity)
    known = cache.read_record("bandwidth", key)
    if not refresh and isinstance(known.get("bytes_per_s"), (int, float)):
        return float(known["bytes_per_s"])
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = int(min(1 << 30, free // 8))
    else:
        nbytes = 1 << 27
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device, flush=False, budget_ms=300, min_reps=10)
    bw = 2 * nbytes / (t.median_us * 1e-6)
    cache.write_record("bandwidth", key, {"device": identity, "bytes_per_s": bw, "nbytes": nbytes,
                                          "median_us": t.median_us, "torch": torch.__version__,
                                          "measured": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return bw


def tensor_bytes(*xs: Any) -> int:
    """Bytes of every tensor in ``xs`` (nested tuples/lists too): the default bytes-moved estimate."""
    total = 0
    for x in xs:
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, (tuple, list)):
            total += tensor_bytes(*x)
    return total


def copy_contender(nbytes: int, device: torch.device) -> Callable:
    """A device copy that moves ``nbytes`` in all: half read, half written (torch copies contiguous bytes
    with cudaMemcpyAsync on a GPU, memcpy on a CPU): the measured floor for an op moving those bytes."""
    src = torch.ones(max(1, nbytes // 2), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)
