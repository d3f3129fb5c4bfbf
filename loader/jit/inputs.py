"""Checked inputs: the files a compile read are the ones its key covers, unchanged since planning and while it ran.

An object is cached under the key of the content it was planned from, so a TU or header edited during a compile
(or read by the compiler without the include scan seeing it) must fail the build rather than be cached.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Set

from ..errors import SourcesChanged
from . import cache, keys, sources, syntax
from .sources import digest_tree, sha256_file
from .units import Target, Unit

log = logging.getLogger("kernelkit")


def snapshot(unit: Unit) -> Dict[Path, Optional[tuple]]:
    """The TU and each local header it includes, as they are now: identity (inode, size, mtime, ctime:
    an edit that is undone again still changes those) and sha256. None: missing. A generated source is
    taken by content only: other processes may rewrite it, always with the same text."""
    out: Dict[Path, Optional[tuple]] = {}
    for p in [unit.path, *unit.deps]:
        try:
            st = os.stat(p)
            identity = () if cache.is_generated_source(p) else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            out[p] = (*identity, sha256_file(p))
        except OSError:
            out[p] = None
    return out


def as_planned(unit: Unit) -> bool:
    """Whether the TU and its local headers hash to the digest the unit's key was made from."""
    try:
        return any(digest_tree(t, unit.deps, unit.roots) == unit.digest for t in _planned_texts(unit.path.read_bytes()))
    except OSError:
        return False


def _planned_texts(raw: bytes) -> Set[bytes]:
    """The TU's bytes as plan_unit may have hashed them: as written (an inline source), or as read_text()
    gives them (newlines normalised; undecodable bytes kept or replaced)."""
    out = {raw}
    for errors in ("surrogateescape", "replace"):
        text = raw.decode("utf-8", errors).replace("\r\n", "\n").replace("\r", "\n")
        out.add(text.encode("utf-8", "surrogateescape"))
    return out


def changed_error(unit: Unit, target: Target, before: Dict[Path, Optional[tuple]], during: bool) -> SourcesChanged:
    """The error for sources that no longer match the unit's key. A generated source in the cache that
    was damaged is removed, so the next load writes it again."""
    after = snapshot(unit)
    changed = [p for p in after if after[p] != before.get(p)] if during else []
    names = ", ".join(target.display.get(str(p), str(p)) for p in changed or [unit.path, *unit.deps])
    when = ("changed while it was being compiled" if changed else
            "no longer match what the build was planned from (changed after planning)")
    advice = "Load again to build what is on disk now."
    if cache.is_generated_source(unit.path):
        cache.discard_source(unit.path)
        advice = f"The generated source {unit.path} in the cache was damaged and is removed; load again."
    return SourcesChanged(f"{unit.display}: {names} {when}; nothing was cached (the object would carry the "
                          f"key of the old content). {advice}")


def _depfile_inputs(depfile: Path) -> Optional[List[Path]]:
    """The files a compiler read, from the make rule it wrote with -MD -MF (None: it wrote none)."""
    try:
        return sources.make_rule_inputs(depfile.read_text(errors="surrogateescape"))
    except OSError:
        return None


def check(unit: Unit, target: Target, depfile: Path, before: Dict[Path, Optional[tuple]]) -> None:
    """After a compile: every file the compiler read outside the toolchain's dirs is one the key covers,
    unchanged since planning (by content) and untouched while compiling (by identity: an edit undone again
    is caught too)."""
    if snapshot(unit) != before or not as_planned(unit):
        raise changed_error(unit, target, before, during=True)
    read = _depfile_inputs(depfile)
    if read is None:  # a launcher that drops -MD: the planned files were checked above
        log.debug("no dependency file from compiling %s", unit.display)
        return
    covered = set(sources.resolved([unit.path, *unit.deps]))
    # nvcc lists the names #line marks give as if it had read them: a split's TUs cite the user's files so
    marked = set(sources.resolved(name for p in [unit.path, *unit.deps]
                                  for name in syntax.line_names(cache.source_bytes(p).decode("utf-8", "replace"))))
    unseen = [p for p in read if p not in covered | marked and not sources.under(p, keys.toolchain_dirs())
              and p.exists()]
    if unseen:
        raise SourcesChanged(
            f"{unit.display}: the compiler read {', '.join(map(str, unseen))}, which kernelkit's include scan "
            "did not find (an #include through a macro, or #include_next?), so the cache key does not cover it; "
            "nothing was cached. Include it by name (#include \"...\" or <...> through an include flag).")
