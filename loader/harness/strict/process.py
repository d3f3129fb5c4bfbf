"""One strict worker process: started with a plan, read until it is done, and killed with everything it started.

The worker runs in a session of its own (its process group dies with it: threads, children, a hung build),
under a wall-clock deadline and, when asked, a memory limit: RLIMIT_DATA on a CPU run (RLIMIT_AS would refuse
torch's own libraries, which map gigabytes of address space), and on any run the parent watches the worker's
resident memory (on a GPU, where the CUDA driver's mappings make rlimits unusable, that is the limit).
Its stdout and stderr, where the op may print, go to a log whose tail explains a crash.
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from .channel import ChannelError, Reader, decode_tensor, new_key

LOG_TAIL = 1500  # characters of the worker's output kept to explain a crash


@dataclasses.dataclass
class Limits:
    """A worker's wall-clock ``timeout_s`` (whole run) and memory limit ``memory_mb`` (None: no limit)."""

    timeout_s: float = 600.0
    memory_mb: Optional[int] = None

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: expected a number of seconds > 0, got {self.timeout_s!r}")
        if self.memory_mb is not None and not self.memory_mb > 0:
            raise ValueError(f"memory_mb: expected a number of MiB > 0 or None, got {self.memory_mb!r}")


@dataclasses.dataclass
class Run:
    """What one worker reported: its build, its calls (with decoded outputs), errors, timings, and how it ended
    ("done", or why not)."""

    built: Optional[bool] = None
    build_error: str = ""
    build_s: float = 0.0
    import_evidence: List[str] = dataclasses.field(default_factory=list)
    calls: List[Tuple[dict, list]] = dataclasses.field(default_factory=list)
    raised: List[dict] = dataclasses.field(default_factory=list)
    timings: Dict[int, dict] = dataclasses.field(default_factory=dict)
    ended: str = ""
    log_tail: str = ""
    wall_s: float = 0.0

    @property
    def done(self) -> bool:
        return self.ended == "done"


def run_worker(plan: dict, limits: Limits) -> Run:
    """Start a worker on ``plan``, collect its reports until it is done, dies, overruns or outgrows its memory."""
    key = new_key()
    read_fd, write_fd = os.pipe()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "kernelkit.harness.strict.worker", str(write_fd)],
                            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                            start_new_session=True)
    os.close(write_fd)
    _limit_memory(proc.pid, plan, limits)
    run, t0 = Run(), time.monotonic()
    try:
        proc.stdin.write(json.dumps({**plan, "key": key.hex()}).encode())
        proc.stdin.close()
        _collect(Reader(read_fd, key), run, t0 + limits.timeout_s, proc.pid, limits)
    except BrokenPipeError:
        run.ended = "the worker exited before reading its plan"
    finally:
        os.close(read_fd)
        _kill_group(proc)
        run.wall_s = time.monotonic() - t0
        run.ended = run.ended if run.ended == "done" else _why_ended(run.ended, proc, limits)
        log.seek(0)
        run.log_tail = log.read().decode(errors="replace")[-LOG_TAIL:]
        log.close()
    return run


def _limit_memory(pid: int, plan: dict, limits: Limits) -> None:
    """RLIMIT_DATA on a CPU run (soft = hard: the op cannot raise it); every run is watched too (:func:`_rss_mb`)."""
    resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))  # a crashing candidate leaves no core file
    if limits.memory_mb is not None and not str(plan.get("device", "")).startswith("cuda"):
        size = int(limits.memory_mb) << 20
        resource.prlimit(pid, resource.RLIMIT_DATA, (size, size))


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:")), 0.0)
    except OSError:
        return 0.0


class _OverMemory(Exception):
    pass


def _collect(reader: Reader, run: Run, deadline: float, pid: int, limits: Limits) -> None:
    def watch():
        if limits.memory_mb is not None and _rss_mb(pid) > limits.memory_mb:
            raise _OverMemory

    try:
        while True:
            head, blobs = reader.receive(deadline, watch)
            if head["type"] == "done":
                run.ended = "done"
                return
            _take(run, head, blobs)
    except ChannelError as e:
        run.ended = str(e)
    except _OverMemory:
        run.ended = "memory"


def _take(run: Run, head: dict, blobs: List[bytes]) -> None:
    kind = head["type"]
    if kind == "built":
        run.built, run.build_error = bool(head["ok"]), head.get("error", "")
        run.build_s = float(head.get("seconds", 0.0))
        run.import_evidence = list(head.get("evidence", []))
        if not run.built:
            run.log_tail = head.get("trace", "")
    elif kind == "call":
        run.calls.append((head, _outputs(head, blobs)))
    elif kind == "raised":
        run.raised.append(head)
    elif kind == "timing":
        run.timings[int(head["group"])] = head


def _outputs(head: dict, blobs: List[bytes]) -> list:
    """The call's outputs: tensors decoded from raw bytes, JSON values as sent, other types by name."""
    outs, it = [], iter(blobs)
    for desc in head.get("outputs", []) or []:
        if "tensor" in desc:
            outs.append(decode_tensor(desc["tensor"], next(it)))
        elif "value" in desc:
            outs.append(desc["value"])
        else:
            outs.append(_Unsendable(desc.get("type", "?")))
    return outs


@dataclasses.dataclass
class _Unsendable:
    type_name: str

    def __repr__(self) -> str:
        return f"<a {self.type_name}>"


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the worker's whole process group (threads, children, a hung compiler) and reap the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel (D state)
        pass


def _why_ended(channel: str, proc: subprocess.Popen, limits: Limits) -> str:
    if channel == "timeout":
        return f"timed out after {limits.timeout_s:g} s (killed)"
    if channel == "memory":
        return f"used more than {limits.memory_mb} MiB of memory (killed)"
    code = proc.returncode
    if code is not None and code < 0 and code != -signal.SIGKILL:
        return f"the op's process died of signal {signal.Signals(-code).name}"
    if code not in (None, 0, -signal.SIGKILL):
        return f"the op's process exited with status {code}"
    return f"the op's process ended without finishing ({channel})"
