"""The libraries ``kernelkit ide`` describes: the newest cached build of each card, extension and cell name."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import KernelkitError
from ..jit import cache


@dataclasses.dataclass(frozen=True)
class Built:
    """One cached library, from its manifest."""

    name: str
    key: str
    so: Path
    pymodule: Optional[str]  # its pybind11 module's name, if it has one
    units: List[Tuple[str, str]]  # (file as the user knows it, object key) of each TU: its command record's name
    created: float

    @property
    def standalone(self) -> bool:
        """An executable (torch's is_standalone): named as the user named it, not ``kk_<name>_<key>.so``."""
        return self.so.name == self.name

    @property
    def torch_style(self) -> bool:
        """A torch.utils.cpp_extension-style module: imported under its own name (``import <name>`` after load)."""
        return self.pymodule == self.name


def recent(names: Sequence[str] = ()) -> List[Built]:
    """The newest intact build of each name in the cache (of ``names`` only, when given), by name."""
    newest: Dict[str, Built] = {}
    for row in cache.entries():
        found = _built(Path(row["path"]))
        if found is not None and (found.name not in newest or found.created > newest[found.name].created):
            newest[found.name] = found
    missing = [n for n in names if n not in newest]
    if missing:
        raise KernelkitError(f"no build of {', '.join(missing)} in the cache ({cache.cache_dir()}); it has: "
                             f"{', '.join(sorted(newest)) or 'none'}. Load or build it first.")
    return [newest[n] for n in (names or sorted(newest))]


def _built(entry: Path) -> Optional[Built]:
    m = cache.read_manifest(entry) or {}
    name, key = m.get("name"), m.get("key")
    if not (isinstance(name, str) and isinstance(key, str)):
        return None
    so = cache.verified_library(name, key)  # ours, not writable by others, its sha256 as recorded
    if so is None:
        return None
    units = [(str(u.get("file")), u["key"]) for u in m.get("units", [])
             if isinstance(u, dict) and isinstance(u.get("key"), str)]
    pymodule = m.get("pymodule") if isinstance(m.get("pymodule"), str) else None
    created = m.get("created") if isinstance(m.get("created"), (int, float)) else 0.0
    return Built(name, key, so, pymodule, units, float(created))
