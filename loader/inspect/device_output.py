"""Device ``printf`` and ``assert`` output in the cell, in order with Python's output.

A kernel's printf lands in a device FIFO that the driver writes to the process's file descriptor 1 at a
synchronisation. In Jupyter fd 1 is the server's log, and in a script Python's own buffered output can
overtake it. :func:`capture` points fds 1 and 2 at pipes (``wurlitzer``), synchronises the device before it
ends so the FIFO is emptied inside it, and hands the text to ``sys.stdout``/``sys.stderr``.
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
from typing import Iterator, Optional, TextIO

from ..errors import KernelkitError

_ASSERT_LINE = re.compile(r"^.*Assertion .* failed\.?\s*$", re.M)


class _Tee(io.TextIOBase):
    """Forwards to a stream (the cell) and keeps a copy (to quote a failed assert)."""

    def __init__(self, stream: TextIO):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _writes_to_fd(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return False


def _synchronize() -> Optional[str]:
    """Wait for the current CUDA device if this process has used CUDA (never initialises it); the CUDA
    error's message if that fails."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:  # torch.AcceleratorError is a RuntimeError
        return str(e) or type(e).__name__
    return None


def synchronize() -> None:
    """:func:`_synchronize`; a failure (a kernel's assert, a fault) raises a KernelkitError that says the CUDA
    context is lost."""
    message = _synchronize()
    if message is not None:
        raise _cuda_failure(message, "")


def _cuda_failure(message: str, output: str) -> KernelkitError:
    first = message.strip().splitlines()[0] if message.strip() else "CUDA error"
    if "device-side assert" in message:
        quoted = _ASSERT_LINE.findall(output)
        where = f": {quoted[0].strip()}" if quoted else " (its message, which names the kernel, file and line, " \
            "went to the process's output)"
        return KernelkitError(f"a kernel's assert failed{where}. The CUDA context is lost: every later CUDA call in "
                              "this process fails; restart the process (in Jupyter: restart the kernel).")
    return KernelkitError(f"a kernel failed ({first}). The CUDA context is lost: every later CUDA call in this "
                          "process fails; restart the process (in Jupyter: restart the kernel).")


class Capture:
    """The state of one capture: enter it, later :meth:`close` it (the notebook hooks span a cell)."""

    def __init__(self, sync: bool = True):
        self.sync = sync
        self._stack: Optional[contextlib.ExitStack] = None
        self._out = self._err = None
        self._line_buffering = None

    def open(self) -> "Capture":
        from wurlitzer import pipes  # only when capturing: it starts no thread until used

        live = not _writes_to_fd(sys.stdout, 1) and not _writes_to_fd(sys.stderr, 2)
        stack = contextlib.ExitStack()
        if live:  # Jupyter: the streams are the cell's; forward as the driver writes
            self._out, self._err = _Tee(sys.stdout), _Tee(sys.stderr)
            stack.enter_context(pipes(stdout=self._out, stderr=self._err))
        else:  # a script: Python's prints go through fd 1 too, so the pipe holds both in order
            if isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.line_buffering:
                self._line_buffering = False
                sys.stdout.reconfigure(line_buffering=True)
            self._out, self._err = stack.enter_context(pipes())
        self._stack = stack
        return self

    def close(self) -> None:
        """Synchronise (so device printf arrives), stop capturing, and emit what was captured."""
        if self._stack is None:
            return
        message = None
        try:
            if self.sync:
                message = _synchronize()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            self._stack.close()
            self._stack = None
            if self._line_buffering is False:
                sys.stdout.reconfigure(line_buffering=False)
        out, err = self.text()
        if not isinstance(self._out, _Tee):
            sys.stdout.write(out)
            sys.stderr.write(err)
            sys.stdout.flush()
            sys.stderr.flush()
        if message is not None:
            raise _cuda_failure(message, out + err)

    def text(self):
        """(stdout, stderr) captured so far."""
        if isinstance(self._out, _Tee):
            return self._out.copy.getvalue(), self._err.copy.getvalue()
        return (self._out.getvalue() if self._out else ""), (self._err.getvalue() if self._err else "")


@contextlib.contextmanager
def capture(sync: bool = True) -> Iterator[Capture]:
    """Capture C-level and device output (printf, assert messages) of the block and show it as Python output.

    On exit the current CUDA device is synchronised (``sync``; only if CUDA is in use), so every kernel
    launched in the block has printed. A failed device ``assert`` raises a KernelkitError quoting the assert
    (kernel, file, line) and saying that the CUDA context is lost."""
    cap = Capture(sync).open()
    try:
        yield cap
    except BaseException:
        with contextlib.suppress(KernelkitError):
            cap.close()
        raise
    cap.close()
