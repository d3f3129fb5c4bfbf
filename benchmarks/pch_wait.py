"""Wait for kernelkit's background precompiled-header builders, shared by the edit benchmarks: an edit is timed
as a user sees it some minutes after the first build, not while a builder competes for the cores."""
from __future__ import annotations

import fcntl
import time
from pathlib import Path


def wait_for_pch_builders(cache: Path, limit_s: float = 600) -> None:
    """Each builder holds its claim's ``building`` flock (<cache>/<layout>/pch/<key>/building) until it exits."""
    deadline = time.time() + limit_s
    for claim in sorted(Path(cache).glob("*/pch/*/building")):
        with open(claim) as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.time() > deadline:
                        return
                    time.sleep(0.5)
