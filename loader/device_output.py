"""Device ``printf`` and ``assert`` output in the cell, in order with Python's output, labelled per launch.

A kernel's printf lands in a device FIFO that the driver writes to the process's file descriptor 1 at a
synchronisation. In Jupyter fd 1 is the server's log, and in a script Python's own buffered output can
overtake it. :func:`capture` points fds 1 and 2 at pipes (``wurlitzer``), synchronises the device before it
ends so the FIFO is emptied inside it, and hands the text to ``sys.stdout``/``sys.stderr``.

Inside a capture, :func:`launch_bracket` wraps one launch: it writes a marker to fds 1 and 2, runs the
launch, synchronises its stream (which empties the FIFO) and writes a closing marker. The reader of the pipes
(:class:`_Sink`) takes the markers out and prefixes each line between them with the launch's label.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import itertools
import os
import re
import secrets
import sys
import threading
from typing import Dict, Iterator, List, Optional, Set, TextIO

from .errors import KernelkitError

_ASSERT_LINE = re.compile(r"^.*Assertion .* failed\.?\s*$", re.M)
_LINES = re.compile(r"[^\n]*\n|[^\n]+")
_WAIT_S = 2.0  # a bracket waits at most this long for its output to reach the cell, then goes on
_OPEN: List["Capture"] = []  # the captures open now, innermost last: it holds fds 1 and 2
# torch's own namespaces: their kernels do not printf, so per_launch leaves their ops unbracketed
_TORCH_NAMESPACES = frozenset({
    "aten", "prim", "prims", "rngprims", "debugprims", "profiler", "c10d", "c10d_functional", "_c10d_functional",
    "_c10d_functional_autograd", "_dtensor", "quantized", "_quantized", "inductor", "higher_order", "mkldnn",
    "onednn", "_test",
})


class _Markers:
    """What one capture writes around a launch: a random head that no program prints, then ``+N`` (start) or
    ``-N`` (end) for launch number N, whose label is kept here."""

    def __init__(self):
        self.head = f"\x1fkk{secrets.token_hex(6)}"
        self.pattern = re.compile(re.escape(self.head) + r"([+-])(\d+)\x1f")
        self.labels: Dict[int, str] = {}
        self._ended: Set[int] = set()
        self._numbers = itertools.count(1)

    def open(self, label: str) -> int:
        number = next(self._numbers)
        self.labels[number] = label
        return number

    def ended(self, number: int) -> None:
        """Each of the two sinks calls this at launch ``number``'s end marker: the label goes after the second."""
        if number in self._ended:
            self._ended.discard(number)
            self.labels.pop(number, None)
        else:
            self._ended.add(number)

    def marker(self, number: int, end: bool) -> bytes:
        return f"{self.head}{'-' if end else '+'}{number}\x1f".encode()

    def cut(self, text: str) -> bool:
        """Whether ``text`` may be the beginning of a marker whose rest is still in the pipe."""
        n = min(len(text), len(self.head))
        return text[:n] == self.head[:n] and re.fullmatch(r"([+-]\d*)?", text[len(self.head):]) is not None


class _Sink(io.TextIOBase):
    """Where the pipe reader writes one fd's text: markers taken out, each line inside a bracket prefixed with
    ``[label] ``; forwarded to ``stream`` (live, in Jupyter) and kept (a script's output, a failed assert's
    quote)."""

    def __init__(self, markers: _Markers, stream: Optional[TextIO] = None):
        self.markers, self.stream = markers, stream
        self.copy = io.StringIO()
        self.label: Optional[str] = None
        self._tail = ""  # the beginning of a marker that a pipe read cut off
        self._line_start = True
        self._waiting: Dict[int, threading.Event] = {}

    def writable(self) -> bool:
        return True

    def expect(self, number: int) -> threading.Event:
        """An event set once the end marker of launch ``number`` has been written through."""
        event = self._waiting[number] = threading.Event()
        return event

    def write(self, text: str) -> int:
        size = len(text)
        text, self._tail = self._tail + text, ""
        while text:
            at = text.find("\x1f")
            if at < 0:
                self._emit(text)
                break
            self._emit(text[:at])
            text = text[at:]
            found = self.markers.pattern.match(text)
            if found:
                self._mark(int(found.group(2)), end=found.group(1) == "-")
                text = text[found.end():]
            elif self.markers.cut(text):
                self._tail = text
                break
            else:  # a \x1f of the program's own
                self._emit(text[0])
                text = text[1:]
        return size

    def flush(self) -> None:
        if self.stream is not None:
            self.stream.flush()

    def finish(self) -> None:
        """At close: end a bracket left open (its text is already labelled) and release whoever waits."""
        self._tail = ""  # markers are written whole, so a tail left now is no program's text
        if self.label is not None and not self._line_start:
            self._emit("\n")
        self.label = None
        for event in self._waiting.values():
            event.set()

    def _mark(self, number: int, end: bool) -> None:
        if not self._line_start:  # a launch's lines start, and end, on a line of their own
            self._emit("\n")
        if not end:
            self.label = self.markers.labels.get(number, "launch")
            return
        self.label = None
        self.markers.ended(number)
        event = self._waiting.pop(number, None)
        if event is not None:
            event.set()

    def _emit(self, text: str) -> None:
        if not text:
            return
        if self.label is not None:
            prefix = f"[{self.label}] "
            lines = _LINES.findall(text)
            text = "".join(line if i == 0 and not self._line_start else prefix + line for i, line in enumerate(lines))
        self._line_start = text.endswith("\n")
        self.copy.write(text)
        if self.stream is not None:
            self.stream.write(text)


def _writes_to_fd(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return False


@functools.lru_cache(maxsize=None)
def _libc():
    return ctypes.CDLL(None)


def _flush_all(python: bool) -> None:
    """C's buffered output, and Python's (``python``: where it goes through fd 1), so that it is in the pipe
    before a marker."""
    if python:
        sys.stdout.flush()
        sys.stderr.flush()
    _libc().fflush(None)


def _torch_cuda():
    """torch.cuda if this process has used CUDA (never initialises it), else None."""
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_initialized() else None


def _cuda_wait(wait) -> Optional[str]:
    """Run ``wait(torch.cuda)`` if this process has used CUDA; the CUDA error's message if that fails."""
    cuda = _torch_cuda()
    if cuda is None:
        return None
    try:
        wait(cuda)
    except RuntimeError as e:  # torch.AcceleratorError is a RuntimeError
        return str(e) or type(e).__name__
    return None


def _synchronize() -> Optional[str]:
    """Wait for the current CUDA device if this process has used CUDA (never initialises it); the CUDA
    error's message if that fails."""
    return _cuda_wait(lambda cuda: cuda.synchronize())


def _synchronize_stream(stream=None) -> Optional[str]:
    """Wait for a launch's stream: a torch stream, None for the current one, or a raw handle (which torch
    cannot wait for alone, so the whole device); the CUDA error's message if that fails."""
    def wait(cuda):
        if hasattr(stream, "synchronize"):
            stream.synchronize()
        elif stream is None:
            cuda.current_stream().synchronize()
        else:
            cuda.synchronize()
    return _cuda_wait(wait)


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


@functools.lru_cache(maxsize=None)
def _op_brackets_mode():
    """The TorchDispatchMode of ``per_launch``: each call of an op outside torch's own namespaces runs in a
    :func:`launch_bracket` named ``ns::op`` (made on first use, as it imports torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpBrackets(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            namespace = getattr(func, "namespace", "aten")
            if namespace in _TORCH_NAMESPACES:
                return func(*args, **kwargs)
            with launch_bracket(_op_label(func)):
                return func(*args, **kwargs)

    return OpBrackets


def _op_label(func) -> str:
    overload = getattr(func, "_overloadname", "default")
    name = f"{func.namespace}::{getattr(func, '_opname', func)}"
    return name if overload == "default" else f"{name}.{overload}"


class Capture:
    """The state of one capture: enter it, later :meth:`close` it (the notebook hooks span a cell).

    ``per_launch``: also bracket every call of a custom op (not torch's own), so its printf is labelled
    ``ns::op``; that synchronises after each such op."""

    def __init__(self, sync: bool = True, per_launch: bool = False):
        self.sync, self.per_launch = sync, per_launch
        self._stack: Optional[contextlib.ExitStack] = None
        self._out = self._err = None
        self._markers: Optional[_Markers] = None
        self._live = False
        self._line_buffering = None
        self._failed = False  # a bracket raised the CUDA failure already: close does not repeat it

    def open(self) -> "Capture":
        from wurlitzer import pipes  # only when capturing: it starts no thread until used

        # Jupyter: the streams are the cell's, so forward as the driver writes; a script: Python's prints go
        # through fd 1 too, so the pipe holds both in order and is written out at close
        self._live = not _writes_to_fd(sys.stdout, 1) and not _writes_to_fd(sys.stderr, 2)
        self._markers = _Markers()
        self._out = _Sink(self._markers, sys.stdout if self._live else None)
        self._err = _Sink(self._markers, sys.stderr if self._live else None)
        if not self._live and isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.line_buffering:
            self._line_buffering = False
            sys.stdout.reconfigure(line_buffering=True)
        stack = contextlib.ExitStack()
        stack.enter_context(pipes(stdout=self._out, stderr=self._err))
        _OPEN.append(self)
        stack.callback(_OPEN.remove, self)
        if self.per_launch:
            stack.enter_context(_op_brackets_mode()())
        self._stack = stack
        return self

    def begin(self, label: str, stream=None) -> int:
        """Open launch ``label``'s bracket: what was printed before, by Python or by earlier kernels, goes out
        unlabelled."""
        message = _synchronize_stream(stream)  # else the driver writes an earlier kernel's printf at this launch
        if message is not None:
            self._failed = True
            out, err = self.text()
            raise _cuda_failure(message, out + err)
        _flush_all(python=not self._live)  # live, Python's prints go to the cell directly, not through fd 1
        number = self._markers.open(label)
        _write_marker(self._markers.marker(number, end=False))
        return number

    def end(self, number: int, stream=None) -> Optional[KernelkitError]:
        """Close bracket ``number``: wait for the launch's stream (the driver then writes its printf out), and,
        live or on a failure, for the text to pass the sink. The CUDA failure, if any, to raise."""
        message = _synchronize_stream(stream)
        _flush_all(python=not self._live)
        wait = self._live or message is not None  # a script's pipe keeps the order; a failure quotes the text
        events = [sink.expect(number) for sink in (self._out, self._err)] if wait else []
        _write_marker(self._markers.marker(number, end=True))
        for event in events:
            event.wait(_WAIT_S)
        if message is None:
            return None
        self._failed = True
        out, err = self.text()
        return _cuda_failure(message, out + err)

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
            self._out.finish()
            self._err.finish()
        out, err = self.text()
        if not self._live:
            sys.stdout.write(out)
            sys.stderr.write(err)
            sys.stdout.flush()
            sys.stderr.flush()
        if message is not None and not self._failed:
            raise _cuda_failure(message, out + err)

    def text(self):
        """(stdout, stderr) captured so far, labelled and without markers."""
        if self._out is None:
            return "", ""
        return self._out.copy.getvalue(), self._err.copy.getvalue()


def _write_marker(marker: bytes) -> None:
    # to both fds: an assert's message or a launch's stderr is labelled too, and both sinks see the end
    os.write(1, marker)
    os.write(2, marker)


def _capturing_graph() -> bool:
    cuda = _torch_cuda()
    return cuda is not None and cuda.is_current_stream_capturing()


def capturing() -> bool:
    """Whether a capture is open (a launch that prints is then worth bracketing)."""
    return bool(_OPEN)


@contextlib.contextmanager
def launch_bracket(label: str, stream=None) -> Iterator[None]:
    """Label the output of the launch in the block: inside a capture, each line it prints (device printf, an
    assert's message) comes out as ``[label] line``, before any Python output after the block.

    Synchronises ``stream`` (default the current one) after the block; a failure there (a kernel's assert, a
    fault) raises a KernelkitError that says the CUDA context is lost. Outside a capture, and while the
    current stream is capturing a CUDA graph (where it cannot synchronise), it does nothing."""
    cap = _OPEN[-1] if _OPEN else None
    if cap is None or _capturing_graph():
        yield
        return
    number = cap.begin(label, stream)
    try:
        yield
    finally:
        failure = cap.end(number, stream)
    if failure is not None:
        raise failure


@contextlib.contextmanager
def capture(sync: bool = True, per_launch: bool = False) -> Iterator[Capture]:
    """Capture C-level and device output (printf, assert messages) of the block and show it as Python output.

    On exit the current CUDA device is synchronised (``sync``; only if CUDA is in use), so every kernel
    launched in the block has printed. A failed device ``assert`` raises a KernelkitError quoting the assert
    (kernel, file, line) and saying that the CUDA context is lost. Instant kernels that print are labelled per
    launch (``[scale[4, 256]] ...``); ``per_launch=True`` labels every custom op's output too (``ns::op``), at
    the price of a synchronisation after each such op (so time nothing inside it)."""
    cap = Capture(sync, per_launch).open()
    try:
        yield cap
    except BaseException:
        with contextlib.suppress(KernelkitError):
            cap.close()
        raise
    cap.close()
