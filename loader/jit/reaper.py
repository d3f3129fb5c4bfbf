"""A watchdog that ends this process's compilers, and removes its private build dirs, once it has died.

Compilers run in process groups of their own, so that an interrupted build ends each with everything it
started (cicc, ptxas, cc1plus: end_group). A process that is killed outright (SIGKILL, the OOM
killer) ends none of them: they would run on, competing with the retry, and leave their files in the
cache's tmp/. So the first build of a process starts one small watchdog (``python -S -I``, in a session
of its own so that a signal to this process's group or terminal does not reach it). It reads a socket
whose other end only this process holds (close-on-exec, and closed in forked children), and is told each
compiler group and private dir as they come and go. When that socket reports EOF, or the watchdog is
reparented, this process is gone: it ends the groups still listed (SIGTERM, then SIGKILL) and removes the
dirs. A process that exits normally has nothing listed, and its watchdog just exits.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import List, Optional, Set

log = logging.getLogger("kernelkit")

GRACE_SECONDS = 1.0  # between SIGTERM and SIGKILL: compilers end on SIGTERM at once

_WATCHDOG = r"""
import os, select, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
os.chdir("/")  # never the reason a directory cannot be unmounted
try:
    inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
except OSError:
    inherited = []
for fd in inherited:  # keep nothing of the parent's but the socket (0): a copy could hold a pipe open
    try:
        os.close(fd)
    except OSError:
        pass
parent, grace = int(sys.argv[1]), float(sys.argv[2])
groups, dirs, pending = {}, set(), b""


def start_time(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def signal_groups(sig):
    for pgid, started in list(groups.items()):
        if started is not None and start_time(pgid) not in (None, started):
            del groups[pgid]  # the number names a newer process: that group is not the compiler's
            continue
        try:
            os.killpg(pgid, sig)
        except OSError:
            del groups[pgid]


while True:
    if (groups or dirs) and not select.select([0], [], [], 1.0)[0]:
        if os.getppid() != parent:  # reparented: the parent died while a fork of it still holds the socket
            break
        continue
    try:
        data = os.read(0, 65536)
    except OSError:
        data = b""
    if not data:
        break
    *lines, pending = (pending + data).split(b"\n")
    for line in lines:
        op, arg = line[:1], line[1:]
        if op == b"+":
            groups[int(arg)] = start_time(int(arg))
        elif op == b"-":
            groups.pop(int(arg), None)
        elif op == b"d":
            dirs.add(bytes.fromhex(arg.decode()))
        elif op == b"u":
            dirs.discard(bytes.fromhex(arg.decode()))
signal_groups(signal.SIGTERM)
deadline = time.monotonic() + grace
while groups and time.monotonic() < deadline:
    time.sleep(0.05)
    signal_groups(0)
signal_groups(signal.SIGKILL)
if dirs:
    import shutil
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
"""


class _Watchdog:
    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.owner = os.getpid()
        self.pid = pid
        self.sock = sock

    @classmethod
    def start(cls) -> "_Watchdog":
        """Spawn it (posix_spawn: a Popen object would warn about a child still running when freed at exit)."""
        ours, theirs = socket.socketpair()
        try:
            # at fd 3 or above, so that moving it to the watchdog's stdin can never be a no-op dup2(0, 0)
            src = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
            try:
                pid = os.posix_spawn(
                    sys.executable, [sys.executable, "-S", "-I", "-c", _WATCHDOG, str(os.getpid()), str(GRACE_SECONDS)],
                    os.environ, setsid=True,
                    file_actions=[(os.POSIX_SPAWN_DUP2, src, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                  (os.POSIX_SPAWN_DUP2, 1, 2)])
            finally:
                os.close(src)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(pid, ours)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data, socket.MSG_NOSIGNAL)  # a dead watchdog is an error here, never a SIGPIPE

    def drop(self) -> None:
        """Forget a watchdog that died (or, in a forked child, the parent's): close our end and reap it."""
        with contextlib.suppress(OSError):  # closed behind our back (a daemonizing closerange)
            self.sock.close()
        if self.owner == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)


MAX_STARTS = 3  # per process: a watchdog that keeps dying is not started again and again

_lock = threading.Lock()
_watchdog: Optional[_Watchdog] = None
_starts_left = MAX_STARTS
_groups: Set[int] = set()  # what the watchdog knows, to tell a replacement
_dirs: Set[str] = set()  # absolute paths


def ready() -> None:
    """Start the watchdog (where none runs for this process) before a group is spawned: the group's watch is then
    one message after its start, not a Python process's start, so a kill in between is all but impossible."""
    with _lock:
        if _watchdog is None or _watchdog.owner != os.getpid():
            _tell(b"")


def watch_group(pgid: int) -> None:
    """Have process group ``pgid`` (a compiler's) ended should this process die before it ends."""
    with _lock:
        _groups.add(pgid)
        _tell(b"+%d\n" % pgid)


def unwatch_group(pgid: int) -> None:
    """The group has ended (its leader reaped): its number may name another group from now on."""
    with _lock:
        _groups.discard(pgid)
        _tell(b"-%d\n" % pgid)


def watch_dir(path: os.PathLike) -> None:
    """Have ``path`` (a private build dir) removed should this process die before removing it."""
    path = os.path.abspath(path)  # the watchdog works in /, and this process may change its directory
    with _lock:
        _dirs.add(path)
        _tell(b"d%s\n" % _hex(path))


def unwatch_dir(path: os.PathLike) -> None:
    path = os.path.abspath(path)
    with _lock:
        _dirs.discard(path)
        _tell(b"u%s\n" % _hex(path))


def end_group(proc: subprocess.Popen) -> None:
    """End a tool started in a group of its own and everything it started (cc1plus, cicc, ptxas, ld)."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(cmd: List[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a short tool (nm, readelf, a linker) as compilers run: in a group of its own, ended with this
    process or an interrupt, never left writing into a dir the watchdog removes. Text output captured."""
    ready()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            stdin=subprocess.DEVNULL, start_new_session=True)
    watch_group(proc.pid)
    try:
        out, err = proc.communicate()
    except BaseException:
        end_group(proc)
        raise
    finally:
        unwatch_group(proc.pid)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _hex(path: str) -> bytes:
    return os.fsencode(path).hex().encode()  # a path may hold any byte but NUL, newlines included


def _tell(line: bytes) -> None:
    """Send ``line``, starting the watchdog first if there is none yet (or it died): a new one is told
    everything listed, which includes what ``line`` says. Caller holds _lock."""
    global _watchdog
    if _watchdog is not None and _watchdog.owner != os.getpid():  # forked without the fork hook running
        _forget_parents()
    while True:
        if _watchdog is None:
            _watchdog = _start()
            if _watchdog is None:
                return
            line = b"".join([b"+%d\n" % g for g in _groups] + [b"d%s\n" % _hex(d) for d in _dirs])
        try:
            _watchdog.send(line)
            return
        except OSError:
            _watchdog.drop()
            _watchdog = None


def _start() -> Optional[_Watchdog]:
    """A new watchdog, or None where there can be none: builds then go on without one."""
    global _starts_left
    if _starts_left <= 0:
        return None
    _starts_left -= 1
    name = os.path.basename(sys.executable).lower()
    if "python" not in name and "pypy" not in name:  # an embedding program: no telling what it would run
        _starts_left = 0
        log.debug("no compiler watchdog: sys.executable %r is not a Python", sys.executable)
        return None
    try:
        return _Watchdog.start()
    except (OSError, NotImplementedError) as e:
        _starts_left = 0
        log.debug("cannot start the compiler watchdog (%s): compilers of a killed build may run on", e)
        return None


def _forget_parents() -> None:
    """In a forked child: the groups and dirs are the parent's, and so is the watchdog."""
    global _watchdog, _starts_left
    if _watchdog is not None:
        _watchdog.drop()
        _watchdog = None
    _starts_left = MAX_STARTS
    _groups.clear()
    _dirs.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _forget_parents()


os.register_at_fork(after_in_child=_after_fork_in_child)
