"""What kernelkit says once about a slow build, and how to avoid it."""
from __future__ import annotations

from .progress import say
from .units import Unit

SLOW_TORCH_UNIT_SECONDS = 8.0
_HINTED: set = set()


def torch_cost_advice(unit: Unit, seconds: float, why: str) -> None:
    """Once per file: what including torch's headers in a .cu cost, and how to avoid it by hand."""
    if unit.display in _HINTED:
        return
    _HINTED.add(unit.display)
    say(f"{unit.display} includes torch's headers, so every edit of it recompiles them{why}: this took "
        f"{seconds:.0f} s. Kernels in a .cu without torch headers (launchers taking pointers and a "
        "cudaStream_t, called from your .cpp) recompile in about a second: see the README, "
        "'Porting from torch.utils.cpp_extension'.")
