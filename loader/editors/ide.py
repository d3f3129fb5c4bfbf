"""``kernelkit ide``: the compile database and the stubs of the builds in the cache, written into one directory."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Sequence

from ..jit import commands
from . import built, headers, stubs


@dataclasses.dataclass
class Written:
    """What one run wrote, and what it could not."""

    builds: List[str]
    database: Path
    files: int  # entries written for the builds asked for: their TUs
    headers: int  # and the local headers those include
    stubs: List[Path]
    unrecorded: List[str]  # TUs compiled before kernelkit kept commands (or whose record was collected)
    notes: List[str]


def write(names: Sequence[str], out: Path) -> Written:
    """compile_commands.json (each TU, and each local header they include: ``headers``) and .clangd in ``out``,
    the stubs in ``out/typings``, for the newest build of each of ``names`` (default: every name in the cache)."""
    builds = built.recent(names)
    keys = [key for b in builds for _, key in b.units]
    entries = commands.entries(keys)
    unrecorded = sorted({f"{b.name}: {display}" for b in builds for display, key in b.units
                         if commands.entry(key) is None})
    included = headers.entries(entries)
    notes = commands.write(out, entries + included)
    written = stubs.write(out / "typings", builds)
    return Written([b.name for b in builds], out / commands.DATABASE, len(entries), len(included), written,
                   unrecorded, notes)
