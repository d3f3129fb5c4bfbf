"""A one-line build status with elapsed time, on a terminal (redrawn in place), in a notebook (an
updating display), or as plain start/end lines in logs. KERNELKIT_VERBOSE=0 silences it."""
from __future__ import annotations

import sys
import threading
import time
from typing import List, Optional

from .. import settings


def verbosity() -> int:
    return settings.VERBOSE.get()


def _notebook_display():
    """An IPython display handle when running inside a Jupyter kernel, else None."""
    ipy = sys.modules.get("IPython")
    if ipy is None or "ipykernel" not in sys.modules:
        return None
    try:
        shell = ipy.get_ipython()
        if shell is None or not hasattr(shell, "kernel"):
            return None
        from IPython.display import display

        return display({"text/plain": ""}, raw=True, display_id=True)
    except Exception:  # noqa: BLE001 - no usable notebook display: plain lines on stderr instead
        return None


_OUT = threading.Lock()  # one writer of stderr at a time: concurrent builds each report
_LIVE: List["Status"] = []  # the one Status redrawing a terminal line in place, if any


def _line_out(line: str) -> None:
    """Write ``line`` to stderr, above the status line being redrawn in place, if there is one."""
    with _OUT:
        if _LIVE:
            sys.stderr.write("\r" + line + "\033[K\n" + _LIVE[0]._line())
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def say(message: str) -> None:
    if verbosity() > 0:
        _line_out(f"kernelkit: {message}")


class Status:
    """``with Status("building sigmoid"):`` shows the message and a ticking elapsed time."""

    def __init__(self, message: str):
        self.message = message
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._handle = None
        self._tty = False

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _line(self) -> str:
        return f"kernelkit: {self.message} ... {self.elapsed:.1f} s"

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._draw()

    def _draw(self) -> None:
        if self._handle is not None:
            self._handle.update({"text/plain": self._line()}, raw=True)
        elif self._tty:
            with _OUT:
                sys.stderr.write("\r" + self._line() + "\033[K")
                sys.stderr.flush()

    def _claim_terminal(self) -> bool:
        """Whether this status may redraw the terminal's last line: only one at a time may, the others
        (concurrent builds) print start and end lines above it."""
        if not sys.stderr.isatty():
            return False
        with _OUT:
            if _LIVE:
                return False
            _LIVE.append(self)
            return True

    def __enter__(self) -> "Status":
        if verbosity() <= 0:
            return self
        self._handle = _notebook_display()
        self._tty = self._handle is None and self._claim_terminal()
        if self._handle is None and not self._tty:
            say(self.message + " ...")
        else:
            self._draw()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def finish(self, result: str) -> None:
        self.message = result

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        verdict = "failed" if exc_type else "done"
        final = f"kernelkit: {self.message} ({verdict} in {self.elapsed:.1f} s)"
        if self._tty:  # it claimed the terminal's line (the verbosity allowed it then): finish and release
            with _OUT:
                sys.stderr.write("\r" + final + "\033[K\n")
                sys.stderr.flush()
                _LIVE.remove(self)
        elif verbosity() <= 0:
            return
        elif self._handle is not None:
            self._handle.update({"text/plain": final}, raw=True)
        else:
            _line_out(final)
