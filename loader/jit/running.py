"""Running the build's tools: compiler and linker processes in their own process groups, ended together when a
build is interrupted or its process dies (``reaper``), counted, their failures turned into diagnostics in the
user's terms; the private dirs a build step works in.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set

from ..diagnostics import parse_diagnostics
from ..errors import BuildError, KernelkitError
from . import cache, reaper, toolchain
from .units import Target, Unit

log = logging.getLogger("kernelkit")

#: counters a test (or a curious user) can read: how many compiler/linker processes this process ran
STATS = {"compiles": 0, "links": 0, "joins": 0, "pch_builds": 0, "pch_used": 0, "pch_rejected": 0,
         "device_rebuilds": 0, "stand_in_links": 0, "proofs": 0, "binds": 0}
_STATS_LOCK = threading.Lock()  # builds run in threads (autotune, a card's units): `+=` on a dict is not atomic


def count(counter: str) -> None:
    with _STATS_LOCK:
        STATS[counter] += 1



# ----------------------------------------------------------------------------------------------- running
class Children:
    """The compiler process groups one build is running, so an interrupted build can end them at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: Set[subprocess.Popen] = set()
        self.cancelled = False

    def add(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.add(proc)
            cancelled = self.cancelled
        if cancelled:  # started by a worker just as the build was interrupted
            reaper.end_group(proc)

    def discard(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def kill_all(self) -> None:
        with self.lock:
            self.cancelled = True
            procs = list(self.procs)
        for proc in procs:
            reaper.end_group(proc)


@dataclasses.dataclass
class BuildState:
    """What one build keeps while it runs: its compilers, a private dir where the objects to link are pinned
    (hard-linked, so a gc or clear of obj/ in another process cannot pull one from under it), and work a fast
    path asked to run once the build's cores are free."""

    children: Children
    pins: Path
    later: Dict[str, Callable[[], None]] = dataclasses.field(default_factory=dict)  # by what it is: once


_BUILDS: Dict[int, BuildState] = {}  # id(target) -> its running build


def state(target: Target) -> Optional[BuildState]:
    """The running build of ``target`` (None: none in this process, e.g. a proof's own compile)."""
    return _BUILDS.get(id(target))


@contextlib.contextmanager
def build_state(target: Target) -> Iterator[BuildState]:
    with private_dir(f"pins-{target.name}-") as pins:
        _BUILDS[id(target)] = BuildState(Children(), pins)
        try:
            yield _BUILDS[id(target)]
        finally:
            del _BUILDS[id(target)]


@contextlib.contextmanager
def private_dir(prefix: str) -> Iterator[Path]:
    """A private dir in the cache's tmp/ for one step of a build, removed after it (a no-op when it was
    renamed into the cache), or by the watchdog if this process dies first."""
    path = cache.private_tmpdir(prefix)
    reaper.watch_dir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        reaper.unwatch_dir(path)


def spawn(cmd: List[str]) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (so that it and its children can be ended together), which
    the watchdog ends should this process die first (_run tells it when the group has ended)."""
    reaper.ready()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:  # the program itself is missing or not executable
        launcher = toolchain.launcher()
        if launcher and cmd[:len(launcher)] == launcher:
            raise KernelkitError(f"the compiler launcher {launcher[0]!r} (KERNELKIT_COMPILER_LAUNCHER) cannot be "
                                 f"run: {e.strerror or e}. Install it, fix the path, or unset "
                                 "KERNELKIT_COMPILER_LAUNCHER.") from None
        raise KernelkitError(f"cannot run {cmd[0]!r}: {e.strerror or e}") from None
    reaper.watch_group(proc.pid)
    return proc


def run_tool(cmd: List[str], what: str, target: Target, counter: str, children: Optional["Children"] = None) -> str:
    """Run a compiler or binutils tool for ``target``'s build (ended with it if interrupted, or with ``children``
    when given); a failure raises BuildError with its diagnostics in the user's terms."""
    count(counter)
    log.debug("running: %s", " ".join(cmd))
    running = state(target)
    children = children or (running.children if running else Children())
    proc = spawn(cmd)
    children.add(proc)
    try:
        output, _ = proc.communicate()
    except BaseException:  # KeyboardInterrupt while waiting: the compiler must not outlive the build
        reaper.end_group(proc)
        raise
    finally:
        children.discard(proc)
        reaper.unwatch_group(proc.pid)
    if proc.returncode != 0:
        diags = parse_diagnostics(output, target.display, target.texts)
        raise BuildError(what, diags, output, cmd)
    if output.strip():
        log.debug("%s output:\n%s", what, output)
    return output


def in_parallel(fn: Callable[[Unit], Path], units: Sequence[Unit], target: Target) -> List[Path]:
    """``[fn(u) for u in units]`` on a thread per core. A compile error lets the others finish (their
    objects are cached for the next try); an interruption cancels what has not started, ends the running
    compilers and is re-raised at once."""
    workers = max(1, min(len(units), os.cpu_count() or 1))
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:
        # the slowest first (torch's headers take tens of seconds), so no long compile waits for a free thread
        longest_first = sorted(units, key=lambda u: (not u.uses_torch, u.kind != "cu"))
        futures = {id(u): pool.submit(fn, u) for u in longest_first}
        concurrent.futures.wait(futures.values())
        return [futures[id(u)].result() for u in units]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        _BUILDS[id(target)].children.kill_all()
        raise
    finally:
        pool.shutdown(wait=False)


def join_objects(objects: Sequence[Path], out: Path, target: Target) -> None:
    """One relocatable object from several (``ld -r``): a split TU is cached and linked as one object."""
    run_tool([toolchain.cxx(), "-r", "-nostdlib", *map(str, objects), "-o", str(out)],
             f"joining the objects of {target.name}", target, "joins")


