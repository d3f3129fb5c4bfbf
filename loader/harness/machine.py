"""How busy the machine's CPUs were while something was timed on them, and whether that voids a CPU timing.

A host-timed comparison on a shared machine can point the wrong way: torch's intra-op pool (OpenMP) stalls at
every barrier when another process holds one of its cores, so a contender that uses the pool can lose 10-30x
while one that does not is untouched, and the round-by-round interval stays tight. What decides it is whether
the timing's threads found idle CPUs, so :func:`measured` reads, over the timed window, the CPU time the
machine spent on this process's CPUs (``/proc/stat``) less this process's own (``time.process_time``): the CPUs
other processes kept busy; and the time this process's threads spent runnable but waiting for a CPU
(``/proc/self/task/*/schedstat``), which sees what the first cannot: a timing that got the CPU it used only in
turns (one thread beside one busy process per CPU uses little less than a CPU, yet waits a third of the time on
2 CPUs). The 1-minute load average before and after is kept beside them (and is the only measure where
``/proc`` cannot be read).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Iterator, List, Optional

#: idle CPUs a timing's threads may lack before it is void: jiffy rounding over a short window is ~0.2 CPUs
BUSY_SLACK_CPUS = 0.5
#: threads of the timing waiting for a CPU, on average over the window, before it is void (idle machine: ~0.001)
WAIT_SLACK_CPUS = 0.1


def cpu_ids() -> List[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU
        return list(range(os.cpu_count() or 1))


def loadavg() -> Optional[float]:
    """The 1-minute load average (/proc/loadavg), or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def busy_cpu_seconds(cpus: List[int]) -> Optional[float]:
    """CPU seconds the machine has spent not idle on ``cpus`` since boot (/proc/stat), or None if unreadable."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    wanted = {f"cpu{i}" for i in cpus}
    ticks = 0
    for fields in lines:
        if fields[0] in wanted:
            counts = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
            ticks += sum(counts) - counts[3] - counts[4]
    return ticks / os.sysconf("SC_CLK_TCK")


def runqueue_wait_seconds() -> Optional[float]:
    """Seconds this process's threads have spent runnable but waiting for a CPU (the second field of each
    ``/proc/self/task/<tid>/schedstat``, in ns), or None where it cannot be read."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    total, read = 0, False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
            read = True
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total / 1e9 if read else None


@dataclasses.dataclass
class Load:
    """What else ran on this process's ``cpus`` while a timing used ``threads`` of them."""

    cpus: int
    threads: int
    others_cpus: Optional[float] = None  # CPUs other processes kept busy, on average over the window
    waited_cpus: Optional[float] = None  # this process's threads waiting for a CPU, on average over the window
    loadavg_before: Optional[float] = None
    loadavg_after: Optional[float] = None

    def busy(self) -> Optional[str]:
        """Why the timing's threads did not have idle CPUs of their own (None if they did)."""
        spare = self.cpus - self.threads + BUSY_SLACK_CPUS
        if self.others_cpus is not None and self.others_cpus > spare:
            return f"machine busy: others used {self.others_cpus:.1f} of {self.cpus} CPUs"
        if self.waited_cpus is not None and self.waited_cpus > WAIT_SLACK_CPUS:
            share = min(1.0, self.waited_cpus / self.threads)
            return (f"machine busy: the timing's {self.threads} thread{'s' * (self.threads > 1)} waited for a CPU "
                    f"{share:.0%} of the time")
        if self.others_cpus is not None:
            return None
        worst = max((v for v in (self.loadavg_before, self.loadavg_after) if v is not None), default=None)
        if worst is not None and worst > self.cpus + BUSY_SLACK_CPUS:  # the average counts this timing's threads
            return f"machine busy: load average {worst:.1f} on {self.cpus} CPUs"
        return None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def measured(threads: int) -> Iterator[Load]:
    """A :class:`Load` for the block, filled in when it ends."""
    cpus = cpu_ids()
    load = Load(len(cpus), threads, loadavg_before=loadavg())
    waited0, busy0, own0, t0 = runqueue_wait_seconds(), busy_cpu_seconds(cpus), time.process_time(), time.monotonic()
    yield load
    busy1, own1, wall, waited1 = busy_cpu_seconds(cpus), time.process_time(), time.monotonic() - t0, runqueue_wait_seconds()
    if busy0 is not None and busy1 is not None and wall > 0:
        load.others_cpus = max(0.0, (busy1 - busy0 - (own1 - own0)) / wall)
    if waited0 is not None and waited1 is not None and wall > 0:
        load.waited_cpus = max(0.0, (waited1 - waited0) / wall)
    load.loadavg_after = loadavg()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads (at::parallel_for, OpenMP: what both a card's CPU loop and torch's ops use) set
    to ``n`` for the block."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def thread_settings() -> List[int]:
    """The thread counts a CPU timing runs at: 1, and torch's default where that is more."""
    import torch

    return sorted({1, torch.get_num_threads()})
