"""Compiler output parsed into diagnostics: each error mapped to the file the user knows, with its line quoted.

Separate from ``errors`` so that a warm start, which compiles nothing, never imports the parsing.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional


@dataclasses.dataclass
class Diagnostic:
    file: str  # as shown to the user (a card file path, or "<name>.cu" for an inline source)
    line: Optional[int]
    col: Optional[int]
    severity: str
    message: str
    source_line: Optional[str] = None

    def format(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        out = f"{where}: {self.severity}: {self.message}"
        if self.source_line is not None:
            out += f"\n  {self.line:>5} | {self.source_line.rstrip()}"
            if self.col:
                # keep tabs so the caret lines up under the quoted text
                pad = "".join(c if c == "\t" else " " for c in self.source_line[: self.col - 1])
                out += f"\n        | {pad}^"
        return out


# gcc/clang: file:line:col: error: message
_GCC = re.compile(r"^(?P<file>[^\s:][^:\n]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning|note): (?P<msg>.*)$")
# nvcc front end (cudafe/EDG): file(line): error: message   (also "error #20: ...")
_NVCC = re.compile(r"^(?P<file>[^\n(]+)\((?P<line>\d+)\): (?P<sev>error|warning|catastrophic error)(?: #[\w-]+(?:-D)?)?: (?P<msg>.*)$")


def _file_lines(path: str, read: Dict[str, Optional[List[str]]]) -> Optional[List[str]]:
    """The lines of a file the compiler names that is not a planned source (a header), read once per log."""
    if path not in read:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                read[path] = f.read().splitlines()
        except OSError:
            read[path] = None
    return read[path]


def parse_diagnostics(log: str, display: Dict[str, str], texts: Dict[str, List[str]]) -> List[Diagnostic]:
    """Parse a compiler log. ``display`` maps paths as the compiler prints them to the names the user
    knows; ``texts`` maps those display names to the source lines used to quote the offending line (a
    file not among them, such as a header, is read from disk for that)."""
    diags: List[Diagnostic] = []
    seen = set()
    read: Dict[str, Optional[List[str]]] = {}
    for raw in log.splitlines():
        m = _GCC.match(raw) or _NVCC.match(raw)
        if not m:
            continue
        sev = m.group("sev")
        if sev == "catastrophic error":
            sev = "fatal error"
        if sev == "note":
            continue
        path = m.group("file").strip()
        shown = display.get(path, path)
        line = int(m.group("line"))
        col = int(m.group("col")) if m.groupdict().get("col") else None
        key = (shown, line, sev, m.group("msg"))
        if key in seen:  # nvcc repeats host-side errors once per compilation pass
            continue
        seen.add(key)
        src = texts[shown] if shown in texts else _file_lines(path, read)
        quoted = src[line - 1] if src is not None and 0 < line <= len(src) else None
        diags.append(Diagnostic(shown, line, col, sev, m.group("msg").strip(), quoted))
    return diags
