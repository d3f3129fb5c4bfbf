"""Exceptions, and compiler-output parsing that turns a build log into a few readable lines."""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence


class KernelkitError(RuntimeError):
    """Base class of kernelkit's errors."""


class SpecError(KernelkitError):
    """A card's spec file (or a module it imports) raised while it was imported; the message names the file
    and line, ``__cause__`` is the original exception."""


class CacheSecurityError(KernelkitError):
    """A cache entry is owned by another user or writable by others: it is never loaded."""


class CacheUnwritable(KernelkitError):
    """The cache directory cannot be created or written (a build needs it; a warm load only reads)."""


class LockTimeout(KernelkitError):
    """Another process held the build lock for longer than the timeout."""


class SourcesChanged(KernelkitError):
    """A translation unit or a local header it includes changed between planning and compiling, so the
    object would not match its cache key; nothing was cached."""


#: bounds on a BuildError's message (a template error can run to megabytes; ``.log`` keeps all of it)
MAX_SHOWN_ERRORS = 8
MAX_DIAGNOSTIC_CHARS = 2048
MAX_MESSAGE_CHARS = 16384


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f" ... [{len(text) - limit} more characters in .log]"


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


class BuildError(KernelkitError):
    """A compile or link step failed. ``str()`` shows the compiler's errors mapped to the user's files;
    ``.log`` holds the full output and ``.command`` the failing command line."""

    def __init__(self, what: str, diagnostics: Sequence[Diagnostic], log: str, command: Sequence[str] = ()):
        self.what = what
        self.diagnostics = list(diagnostics)
        self.log = log
        self.command = list(command)
        super().__init__(self._message())

    def _message(self) -> str:
        errors = [d for d in self.diagnostics if d.severity in ("error", "fatal error")]
        if errors:
            parts = [d.format() for d in errors[:MAX_SHOWN_ERRORS]]
        else:  # no parseable diagnostic (a linker or driver failure): the tail of the log is the message
            parts = [ln for ln in self.log.strip().splitlines() if ln.strip()][-12:]
        lines = [f"{self.what} failed"]
        used = 0
        for part in (_clip(p, MAX_DIAGNOSTIC_CHARS) for p in parts):
            if used + len(part) > MAX_MESSAGE_CHARS:
                break
            lines.append(part)
            used += len(part) + 1
        left_out = (len(errors) if errors else len(parts)) - (len(lines) - 1)
        if left_out:
            lines.append(f"... and {left_out} more " + ("errors" if errors else "lines"))
        lines.append("(full compiler output: the exception's .log attribute)")
        return "\n".join(lines)

    def _render_traceback_(self):  # IPython shows this instead of a traceback: just the mapped errors
        return [str(self)]

    def _repr_html_(self) -> str:  # notebooks: the mapped errors in the cell, not the server's terminal
        import html

        return f"<pre style='color:#b00'>{html.escape(str(self))}</pre>"


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
