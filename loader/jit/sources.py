"""Source scanning and hashing: a translation unit's key covers its text and every local header it
includes, transitively, so editing a header is never invisible (torch's loader misses this, #47557)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Set, Tuple

# kernelkit's own sources: the public C++ include root (cards include <kernelkit/binding.h>, ...) and its C++
# modules; here, not in toolchain, because a warm start needs the paths but none of the toolchain
INCLUDE = Path(__file__).resolve().parent.parent / "include"
CSRC = INCLUDE.parent / "csrc"

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
_TORCH_PREFIXES = ("torch/", "ATen/", "c10/", "pybind11/")


def sha256_bytes(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(8, "little"))
        h.update(c)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def includes(text: str) -> List[Tuple[str, str]]:
    """Each ``#include`` of ``text`` as (``"<"`` or ``'"'``, the name as written)."""
    return _INCLUDE.findall(text)


def scan_includes(text: str, here: Path, include_dirs: Sequence[Path]) -> Tuple[List[Path], bool]:
    """Local headers ``text`` includes, transitively (resolved against its own directory, then the
    include dirs; system headers are not local and are left out), and whether any of it includes torch."""
    found: Dict[Path, None] = {}
    uses_torch = False
    stack: List[Tuple[str, Path]] = [(text, here)]
    visited: Set[Path] = set()
    while stack:
        body, base = stack.pop()
        for kind, name in includes(body):
            if name.startswith(_TORCH_PREFIXES):
                uses_torch = True
            dirs: Iterable[Path] = ([base] if kind == '"' else []) + list(include_dirs)
            for d in dirs:
                cand = d / name
                if cand.is_file():  # before resolve(): most candidates (system headers) do not exist
                    cand = cand.resolve()
                    if cand not in visited:
                        visited.add(cand)
                        found[cand] = None
                        stack.append((cand.read_text(errors="replace"), cand.parent))
                    break
    return sorted(found), uses_torch


def digest_tree(text: bytes, deps: Sequence[Path]) -> str:
    """Hash a TU's text together with its local headers (name + content, order-independent)."""
    items = sorted((d.name.encode(), d.read_bytes()) for d in deps)  # independent of where they live
    chunks = [text]
    for name, body in items:
        chunks += [name, body]
    return sha256_bytes(*chunks)
