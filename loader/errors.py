"""kernelkit's exceptions. A BuildError's diagnostics come from ``kernelkit.diagnostics``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .diagnostics import Diagnostic


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


#: the last line of a BuildError's message; a command line replaces it with the file it wrote the log to
LOG_HINT = "(full compiler output: the exception's .log attribute)"
#: headers a build needs from the machine (Python's, the CUDA toolkit's), not from the user's code
_ENVIRONMENT_HEADERS = ("Python.h", "cuda_runtime.h", "cuda.h", "cuda_runtime_api.h")


def _names_missing(message: str, header: str) -> bool:
    """gcc: 'Python.h: No such file or directory'; nvcc: 'cannot open source file "Python.h"'."""
    return f"{header}: No such file" in message or f'cannot open source file "{header}"' in message


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
        missing = sorted({h for d in errors for h in _ENVIRONMENT_HEADERS if _names_missing(d.message, h)})
        if missing:
            lines.append(f"{', '.join(missing)} is part of the machine's toolchain, not of this code: "
                         "`kernelkit doctor` says what is missing and how to install it")
        lines.append(LOG_HINT)
        return "\n".join(lines)

    def _render_traceback_(self):  # IPython shows this instead of a traceback: just the mapped errors
        return [str(self)]

    def _repr_html_(self) -> str:  # notebooks: the mapped errors in the cell, not the server's terminal
        import html

        return f"<pre style='color:#b00'>{html.escape(str(self))}</pre>"
