"""The strict worker: runs an op in an interpreter of its own and reports what happened, never a verdict.

Started by :mod:`kernelkit.harness.strict` as ``python -m kernelkit.harness.strict.worker FD``: it reads its plan from stdin (the
channel's key among it) before the op is imported, binds the clocks, events and synchronisation it times with,
snapshots what the op must not replace (:class:`.guards.Tamper`), then imports the op and calls it:
first the check calls the plan lists (fresh, same-address and perturbed inputs), then, per timing group,
timed calls on fresh inputs, each behind a persisting-L2 reset and a 256 MB flush. Every call goes through
the same function, so the op cannot tell a checked call from a timed one by its caller. It sends outputs
(for the parent to compare with its own reference), samples and the evidence of tricks through
:class:`.channel.Writer`; the parent decides.
"""
from __future__ import annotations

import hashlib
import json
import random
import statistics
import sys
import time
import traceback
from typing import Callable, List, Optional

import torch

from ..compare import flat_outputs
from ..guard import bits, poison_allocator
from . import guards
from .channel import Writer, encode_value
from .origin import Origin, seed_inputs

# Bound before the op is imported: replacing torch's or time's attributes later does not reach these.
_CLOCK = time.perf_counter
_SYNC = torch.cuda.synchronize
_EVENT = torch.cuda.Event
_RECORD = torch.cuda.Event.record
_WAIT = torch.cuda.Event.synchronize
_ELAPSED = torch.cuda.Event.elapsed_time
_EQUAL = torch.equal

FLUSH_BYTES = 256 << 20
THREAD_WAIT_S = 0.5  # how long a checked call waits for threads the op started before reading its outputs again
EVIDENCE_STOP = 3  # timed calls with evidence after which a timing group stops: the verdict is made


class Runner:
    """One op on one device, and the evidence its calls leave."""

    def __init__(self, plan: dict, writer: Writer):
        self.plan, self.out = plan, writer
        self.device = torch.device(plan["device"])
        self.cuda = self.device.type == "cuda"
        self.mutates = set(plan.get("mutates", ()))
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=self.device) if self.cuda else None
        self.idle_drain_us = self._idle_drain_us() if self.cuda else 0.0
        self.last_outputs: list = []
        self.tamper: Optional[guards.Tamper] = None
        self.op: Optional[Callable] = None
        self.make: Optional[Callable] = None

    def _idle_drain_us(self) -> float:
        _SYNC()
        samples = []
        for _ in range(20):
            t0 = _CLOCK()
            _SYNC()
            samples.append((_CLOCK() - t0) * 1e6)
        return statistics.median(samples)

    # -------------------------------------------------------------------------------------------- one call

    def call(self, args: tuple, timed: bool, report: bool) -> dict:
        """Call the op once on ``args``: its time (timed calls go behind an L2 reset and flush), and the
        evidence: inputs written, outputs aliasing inputs, outputs still changing, threads or device work left
        running, persisting L2 set, functions replaced. ``report``: keep the outputs to send."""
        before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
        poison_allocator(self.last_outputs, self.device)
        threads = guards.live_threads()
        start, end = (_EVENT(enable_timing=True), _EVENT(enable_timing=True)) if self.cuda else (None, None)
        if timed and self.cuda:
            l2_problem = guards.reset_persisting_l2()
            self.flush.zero_()
        l2_before = guards.persisting_l2_limit() if self.cuda else 0
        t0 = _CLOCK()
        if self.cuda:
            _RECORD(start)
        got = self.op(*args)
        if self.cuda:
            _RECORD(end)
        t1 = _CLOCK()
        outs = flat_outputs(got)
        # the outputs as a consumer on the current stream would read them now: work left elsewhere shows later
        early = [o.clone() if isinstance(o, torch.Tensor) else None for o in outs] if report else []
        found = {"outputs": outs, "evidence": []}
        if self.cuda:
            snapped = _EVENT()
            _RECORD(snapped)
            _WAIT(end)
            found["us"] = _ELAPSED(start, end) * 1e3
            _WAIT(snapped)  # the snapshot's own copy is not work the op left running
            d0 = _CLOCK()
            _SYNC()
            found["drain_us"] = (_CLOCK() - d0) * 1e6
            found["l2"] = guards.persisting_l2_state(limit_before=l2_before)
            if timed and l2_problem:
                found["note"] = l2_problem
        else:
            found["us"] = (t1 - t0) * 1e6
        if report:
            guards.wait_for(threads, THREAD_WAIT_S)  # a thread the op started gets time to betray late writes
        self._evidence(found, args, before, early)
        if report:  # what the op returned, as it was when it returned
            found["outputs"] = [e if e is not None else o for o, e in zip(outs, early)]
        self.last_outputs = [o for o in outs if isinstance(o, torch.Tensor)]
        return found

    def _evidence(self, found: dict, args: tuple, before: list, early: list) -> None:
        ev = found["evidence"]
        for i, (a, b) in enumerate(zip(args, before)):
            if b is not None and i not in self.mutates and not _EQUAL(bits(a), bits(b)):
                ev.append(f"wrote its input {i} (an op must not write its inputs unless the problem declares it)")
        ev += [f"{m} (an op must return new memory)" for m in guards.aliases(found["outputs"], args)]
        for k, (o, e) in enumerate(zip(found["outputs"], early)):
            if e is not None and not _EQUAL(bits(o), bits(e)):
                ev.append(f"output {k} changed after the op returned: its work was still running (another stream "
                          "or thread)")
        if found.get("l2"):
            ev.append(f"set {found['l2']}: a working set pinned in L2 across calls survives the flush")
        if self.tamper is not None:
            ev += [f"replaced {name}" for name in self.tamper.changes()]

    # ------------------------------------------------------------------------------------------- reporting

    def send_call(self, phase: str, group: int, index: int, seed: dict, args_sha: List[str], found: dict,
                  report: bool) -> None:
        head = {"type": "call", "phase": phase, "group": group, "index": index, **seed, "inputs_sha": args_sha,
                "evidence": found["evidence"], "us": found.get("us")}
        blobs: List[bytes] = []
        if report:
            descs = []
            for o in found["outputs"]:
                desc, raw = encode_value(o)
                descs.append(desc)
                blobs += raw
            head["outputs"] = descs
        self.out.send(head, blobs)

    def inputs(self, group: dict, seed: int) -> tuple:
        return seed_inputs(self.make, self.plan["style"], seed, str(self.device), group.get("shape"),
                           getattr(torch, group["dtype"]) if group.get("dtype") else None)


def digest(args: tuple) -> List[str]:
    """sha256 of each tensor argument's bytes (the parent regenerates the inputs and compares)."""
    return [hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            if isinstance(t, torch.Tensor) else "" for t in args]


# ---------------------------------------------------------------------------------------------- phases

def check_group(r: Runner, g: int, group: dict) -> None:
    """The plan's check calls of one group: fresh inputs, the same addresses with new values, perturbed."""
    held: Optional[tuple] = None
    for i, c in enumerate(group["calls"]):
        fresh = r.inputs(group, c["seed"])
        if c["probe"] == "same-address" and held is not None:
            for old, new in zip(held, fresh):
                if isinstance(old, torch.Tensor):
                    old.detach().copy_(new)
            args = held
        else:
            args = guards.place(fresh)
        if c.get("perturb") is not None:
            args = guards.perturb(args, c["perturb"])
        sha = digest(args)
        try:
            found = r.call(args, timed=False, report=True)
        except Exception as e:  # noqa: BLE001 - the parent records it as this call's failure
            r.out.send({"type": "raised", "phase": "check", "group": g, "index": i, "error": _one_line(e)})
            if _cuda_broken(r):
                raise
            continue
        r.send_call("check", g, i, {k: c.get(k) for k in ("seed", "probe", "perturb")}, sha, found, True)
        held = args


def time_group(r: Runner, g: int, group: dict) -> None:
    """Timed calls on fresh inputs: three warm-ups, then as many as the budget allows (within the plan's
    bounds); the calls whose outputs are sent are drawn from the plan's key, the last always among them."""
    base = group["seed"]
    try:
        warm = [r.call(guards.place(r.inputs(group, base - 1 - k)), timed=True, report=False)["us"] for k in range(3)]
        reps = int(min(group["max_reps"], max(group["min_reps"], group["budget_ms"] * 1e3 / max(min(warm), 1e-3))))
        verify = set(random.Random(group["verify_key"]).sample(range(reps), min(group["verify"], reps))) | {reps - 1}
        samples, drains, notes, caught = [], [], set(), 0
        for i in range(reps):
            args = guards.place(r.inputs(group, base + i))
            sha = digest(args) if i in verify else []
            found = r.call(args, timed=True, report=i in verify)
            samples.append(found["us"])
            drains.append(found.get("drain_us", 0.0))
            notes.update([found["note"]] if found.get("note") else [])
            if i in verify or found["evidence"]:
                r.send_call("time", g, i, {"seed": base + i}, sha, found, i in verify)
            caught += bool(found["evidence"])
            if caught >= EVIDENCE_STOP:
                break
    except Exception as e:  # noqa: BLE001
        r.out.send({"type": "raised", "phase": "time", "group": g, "index": -1, "error": _one_line(e)})
        if _cuda_broken(r):
            raise
        return
    r.out.send({"type": "timing", "group": g, "samples_us": samples, "drain_us": drains, "reps": reps,
                "stopped": len(samples) < reps,
                "verified": sorted(verify), "idle_drain_us": r.idle_drain_us, "notes": sorted(notes)})


def _cuda_broken(r: Runner) -> bool:
    if not r.cuda:
        return False
    try:
        _SYNC()
        return False
    except Exception:  # noqa: BLE001 - a sticky CUDA error: the context is gone
        return True


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:500]


def run(plan: dict, writer: Writer) -> None:
    """Import the op (its build counts as "built"), then the check calls and the timing groups."""
    device = torch.device(plan["device"])
    if device.type == "cuda":
        if device.index is not None:  # plain "cuda" is the current device (set_device refuses it)
            torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # on a shared CPU, torch's threads wait on each other for whole scheduler slices
    guards.import_watched()
    r = Runner(plan, writer)
    r.tamper = guards.Tamper()
    t0 = _CLOCK()
    try:
        r.make = Origin(**plan["make"]).load(str(device))
        r.op = Origin(**plan["op"]).load(str(device))
    except BaseException as e:  # noqa: BLE001 - a candidate that does not build costs only its row
        writer.send({"type": "built", "ok": False, "error": _one_line(e), "trace": traceback.format_exc()[-2000:]})
        return
    writer.send({"type": "built", "ok": True, "seconds": _CLOCK() - t0,
                 "evidence": [f"replaced {n} when imported" for n in r.tamper.changes()]})
    for g, group in enumerate(plan.get("groups", [])):
        check_group(r, g, group)
    for g, group in enumerate(plan.get("timing", [])):
        time_group(r, g, group)
    writer.send({"type": "done"})


def main(argv: List[str]) -> int:
    plan = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    sys.path[:0] = [p for p in plan.pop("sys_path", []) if p not in sys.path]  # the caller's modules, importable here
    writer = Writer(int(argv[1]), bytes.fromhex(plan.pop("key")))
    run(plan, writer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
