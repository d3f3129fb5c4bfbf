"""Fault storm (issue 23): a build SIGKILLed at 20 points, sources edited at random moments during builds,
and 16 processes mixing loads, edits, gc, clear (and SIGKILLs) for KERNELKIT_STORM_SECONDS (default 60);
and (issue 37) 6 processes editing headers reached through every include flag spelling and a linked
archive while they load (at most 15 s).
Each ends with every cache entry verified, no process hung, and every load returning the code its sources
say; the counts are printed at the end of the module (pytest -s shows them).

Children fork from a forkserver that imported kernelkit and torch once: a fresh Python
with torch costs ~2.5 s here. The forkserver keeps the environment it started with, so every child is
handed its cache dir and compiler launcher explicitly (``_enter``)."""
import collections
import contextlib
import fcntl
import json
import multiprocessing
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import time
import traceback
from pathlib import Path

import pytest
from test_faults import TU, _running_in_group, _value, cache_root, call_f, card, launcher, make_target  # noqa: F401

from kernelkit.errors import SourcesChanged
from kernelkit.jit import build, cache, running, units
from kernelkit.jit.cache import objects as object_store

STORM_SECONDS = float(os.environ.get("KERNELKIT_STORM_SECONDS", "60"))
STORM_PROCS = 16
EDIT_SECONDS = 6.0
V_POOL = range(1, 13)  # few header values and TU variants: contents recur, so keys are shared between
W_POOL = range(1, 5)  # processes and edits get undone while a compile reads them
PUBLISH_DEBRIS = {"object without its metadata"}  # a killed build published the .o but not its record
REMOVAL_DEBRIS = {"metadata without its object"}  # a killed gc or clear removed the .o but not its record


# ---------------------------------------------------------------------------------------------- helpers
def _ctx():
    ctx = multiprocessing.get_context("forkserver")
    # what this module imports, by names the forkserver can import (it does not get the tests' sys.path);
    # a child then imports just this module and test_faults, cheaply
    ctx.set_forkserver_preload(["torch", "pytest", "filelock", "kernelkit.jit.build", "kernelkit.jit.plan",
                                "kernelkit.jit.prebuilt", "kernelkit.frontends.cli"])
    return ctx


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KERNELKIT_COMPILER_LAUNCHER"}
    # a lock held by nobody alive would otherwise wait 900 s: here it fails the test as a LockTimeout
    return {**env, "KERNELKIT_VERBOSE": "0", "KERNELKIT_LOCK_TIMEOUT": "60", **extra}


def _enter(env: dict) -> None:
    """In a child: a process group of its own (a group kill reaches it and its threads, never the test)."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)


def _returning(fn, args, results) -> None:
    try:
        results.put((True, fn(*args)))
    except BaseException as e:  # noqa: BLE001 - reported to the test, not lost in the child's stderr
        results.put((False, f"{type(e).__name__}: {e}"))


def _in_child(fn, *args, timeout: float = 120.0):
    """fn(*args) in a fresh process; its return value (its error fails the test, as does a hang)."""
    ctx = _ctx()
    results = ctx.Queue()
    proc = ctx.Process(target=_returning, args=(fn, args, results))
    proc.start()
    try:
        ok, value = results.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"{fn.__name__} hung for {timeout:.0f} s in a child")
    finally:
        proc.join(10)
        if proc.is_alive():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.join()
    assert ok, value
    return value


@contextlib.contextmanager
def _card_lock(card_dir: Path, mode: int):
    """Editors hold it exclusively, planners shared: a load knows exactly which texts it planned from,
    while edits still land at any moment of the compile that follows."""
    fd = os.open(card_dir / ".edit.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


def _edit(card_dir: Path, rng: random.Random, in_place: bool = False) -> None:
    name = rng.choice(["f.cpp", "v.h"])
    text = TU.format(w=rng.choice(W_POOL)) if name == "f.cpp" else f"#define V {rng.choice(V_POOL)}\n"
    with _card_lock(card_dir, fcntl.LOCK_EX):
        if in_place:  # truncate, then write: a compiler may read the file half written
            (card_dir / name).write_text(text)
        else:
            tmp = card_dir / f".{name}.{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, card_dir / name)


def _planned(card_dir: Path):
    """(target, the value its texts say), planned under the card's lock."""
    with _card_lock(card_dir, fcntl.LOCK_SH):
        tu, header = (card_dir / "f.cpp").read_text(), (card_dir / "v.h").read_text()
        return make_target(card_dir / "f.cpp", text=tu), _value(tu, header)


def _load_and_count(card_dir: Path, counts: collections.Counter) -> None:
    """Load the card as its files are now and count the outcome: a load (``wrong`` when f() is not what the
    planned texts say), refused (edited during the build), or vanished (cleared between build and dlopen)."""
    target, expected = _planned(card_dir)
    try:
        so, cached, _ = build.build(target)
    except SourcesChanged:
        counts["refused"] += 1
        return
    try:
        got = call_f(so)
    except OSError:
        counts["vanished"] += 1
        return
    counts["loads"] += 1
    counts["cached"] += cached
    counts["wrong"] += got != expected


def _load_cards(env: dict, cards: list) -> list:
    """In a fresh process: load each card as its files are now; (got, expected, cached) for each."""
    _enter(env)
    out = []
    for c in map(Path, cards):
        target, expected = _planned(c)
        so, cached, _ = build.build(target)
        out.append((call_f(so), expected, cached))
    return out


def _audit(env: dict, workdir: str) -> tuple:
    """In a fresh process: every library in the cache has the key of some (V, w) of the pools, and returns
    V * 100 + w (keys do not depend on where a card lives, so each combination is planned in a scratch dir).
    (entries checked, entries of unknown keys, wrong)."""
    _enter(env)
    expected = {}
    for v in V_POOL:
        for w in W_POOL:
            d = Path(workdir) / f"v{v}w{w}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "v.h").write_text(f"#define V {v}\n")
            (d / "f.cpp").write_text(TU.format(w=w))
            expected[make_target(d / "f.cpp").key] = v * 100 + w
    checked, unknown, wrong = 0, [], 0
    for e in cache.entries():
        manifest = cache.read_manifest(Path(e["path"])) or {}
        if manifest.get("key") not in expected:
            unknown.append(e["entry"])
            continue
        so = cache.verified_library(manifest["name"], manifest["key"])
        assert so is not None, f"{e['entry']} did not verify"
        checked += 1
        wrong += call_f(so) != expected[manifest["key"]]
    return checked, unknown, wrong


def _verify_fix_clean(debris=PUBLISH_DEBRIS) -> dict:
    """verify() may report only what a killed process leaves; verify(fix=True) removes all of it and a
    second verify() finds every entry intact. Returns counts."""
    corrupt = [f for f in cache.verify() if f["status"] != "ok"]
    assert {f["reason"] for f in corrupt} <= debris, corrupt
    fixed = cache.verify(fix=True)
    assert all(f["removed"] for f in fixed if f["status"] != "ok"), fixed
    after = cache.verify()
    assert all(f["status"] == "ok" for f in after), after
    return {"corrupt": len(corrupt), "verified": len(after)}


def _groups_end(pids_file: Path, timeout: float = 30.0) -> int:
    """Wait until no process of the compiler/linker groups listed in ``pids_file`` runs; how many groups."""
    groups = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    deadline = time.time() + timeout
    while (running := [g for g in groups if _running_in_group(g)]) and time.time() < deadline:
        time.sleep(0.1)
    assert not running, f"compiler groups {running} still running {timeout:.0f} s after their build was killed"
    return len(groups)


@pytest.fixture(scope="module")
def tally():
    totals = collections.Counter()
    yield totals
    faults = totals["kills"] + totals["edits"] + totals["gcs"] + totals["clears"]
    print(f"\nfault storm: faults injected {faults} (kills {totals['kills']}, edits {totals['edits']}, "
          f"gcs {totals['gcs']}, clears {totals['clears']}), loads checked {totals['loads']} "
          f"(refused as edited {totals['refused']}, vanished before dlopen {totals['vanished']}), "
          f"wrong results {totals['wrong']}, hung processes {totals['hung']}, "
          f"entries verified at the end of each test {totals['verified']}")


# ------------------------------------------------------------------------------ SIGKILL at 20 points
def _die(marks: Path, point: str) -> None:
    (marks / "reached").write_text(point)
    os.kill(0, signal.SIGKILL)  # the child's whole process group, as `kill -9 -PGID` does


def _arm(point: str, marks: Path) -> None:
    """Make this process's build SIGKILL itself at ``point``."""

    def after(owner, name, when=lambda *a: True):
        real = getattr(owner, name)

        def hooked(*args, **kwargs):
            result = real(*args, **kwargs)
            if when(*args):
                _die(marks, point)
            return result

        setattr(owner, name, hooked)

    if point in ("lib-lock", "obj-lock"):
        real_locked = cache.locked

        @contextlib.contextmanager
        def locked(lock_id, what, on_wait=None):
            with real_locked(lock_id, what, on_wait):
                if lock_id.startswith("lib-") == (point == "lib-lock"):
                    _die(marks, point)
                yield

        cache.locked = locked
    elif point in ("obj-tmpdir", "lib-tmpdir"):
        after(cache, "private_tmpdir", lambda prefix: prefix.startswith(point[:4]))
    elif point == "compiled":
        after(build, "_compile_to")
    elif point in ("obj-meta-half", "manifest-half"):
        real_write = Path.write_text

        def write_text(self, data, *args, **kwargs):
            if (self.name == "manifest.json") if point == "manifest-half" else (
                    self.suffix == ".json" and self.parent.name.startswith("obj-")):
                real_write(self, data[: len(data) // 2], *args, **kwargs)
                _die(marks, point)
            return real_write(self, data, *args, **kwargs)

        Path.write_text = write_text
    elif point == "obj-published":  # hooked where the object store calls it
        after(object_store, "publish_file", lambda tmp, final: final.suffix == ".o")
    elif point == "meta-published":
        after(object_store, "publish_file", lambda tmp, final: final.suffix == ".json")
    elif point == "pinned":
        after(build, "_pin")
    elif point == "linker-running":
        real_spawn = running.spawn

        def spawn(cmd):
            proc = real_spawn(cmd)
            if "-c" not in cmd:  # the link: its group is left running
                with open(marks / "pids", "a") as f:
                    f.write(f"{proc.pid}\n")
                _die(marks, point)
            return proc

        running.spawn = spawn
    elif point == "linked":
        after(running, "run_tool", lambda cmd, what, *rest: what.startswith("linking"))
    elif point == "manifest-written":
        after(cache, "write_manifest")
    elif point == "before-publish":
        real_publish = cache.publish_library

        def publish(*args):
            _die(marks, point)
            return real_publish(*args)

        cache.publish_library = publish
    elif point == "published":
        after(cache, "publish_library")
    elif point == "gc-removing":  # the daily gc after the build: renamed a stale dir to trash, not deleted yet
        real_rmtree = shutil.rmtree

        def rmtree(path, *args, **kwargs):
            if Path(path).name.startswith("trash-"):
                _die(marks, point)
            return real_rmtree(path, *args, **kwargs)

        shutil.rmtree = rmtree


def _killed_build(point: str, env: dict, src: str, marks: str) -> None:
    _enter(env)
    marks = Path(marks)
    target = make_target(Path(src))
    _arm(point, marks)
    (marks / "started").touch()
    build.build(target)
    (marks / "done").touch()


HOOKED = ["lib-lock", "obj-lock", "obj-tmpdir", "compiled", "obj-meta-half", "obj-published", "meta-published",
          "pinned", "lib-tmpdir", "linker-running", "linked", "manifest-half", "manifest-written",
          "before-publish", "published", "gc-removing"]
EXTERNAL = ["launcher-sleeping", "compiler-running", "random-1", "random-2"]  # killed by the test
POINTS = HOOKED + EXTERNAL
AFTER_PUBLISH = {"published", "gc-removing"}


@pytest.fixture(scope="module")
def kill_cache(tmp_path_factory):
    """One cache for all 20 kills: each build meets the debris of the kills before it."""
    return tmp_path_factory.mktemp("kill-cache")


def _wait_for(path: Path, proc, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.exitcode is None, f"the build ended ({proc.exitcode}) before {what}"
        assert time.time() < deadline, f"{what} never happened"
        time.sleep(0.01)


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_20_points_of_a_build(point, kill_cache, tmp_path, monkeypatch, tally):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(kill_cache))
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER", raising=False)
    i = POINTS.index(point)
    src_dir, marks = tmp_path / "card", tmp_path / "marks"
    src_dir.mkdir()
    marks.mkdir()
    (src_dir / "v.h").write_text("#define V 7\n")
    slow = "#include <regex>\n" if point == "compiler-running" else ""  # ~0.7 s of cc1plus to land in
    (src_dir / "f.cpp").write_text(slow + TU.format(w=10 + i))  # a new key: every point builds cold
    record = f"echo $$ >> {marks / 'pids'}"
    body = {"launcher-sleeping": f"{record}\ntouch {marks / 'ready'}\nsleep 0.5",
            "compiler-running": f"{record}\ntouch {marks / 'ready'}",
            "random-1": f"{record}\nsleep 1", "random-2": f"{record}\nsleep 1"}.get(point, record)
    if point == "gc-removing":  # a dead build's dir, two hours old, for the build's daily gc to remove
        stale = cache.private_tmpdir("obj-")
        os.utime(stale, (time.time() - 7200, time.time() - 7200))
        (cache.cache_dir() / "last-gc").unlink(missing_ok=True)
    env = _env(KERNELKIT_COMPILER_LAUNCHER=launcher(tmp_path, body))
    proc = _ctx().Process(target=_killed_build, args=(point, env, str(src_dir / "f.cpp"), str(marks)))
    proc.start()
    if point in ("launcher-sleeping", "compiler-running"):
        _wait_for(marks / "ready", proc, "the compile")
        if point == "compiler-running":
            time.sleep(0.2)
            group = int((marks / "pids").read_text().split()[0])
            assert _running_in_group(group), "the compiler had finished: the kill would not land in it"
        os.killpg(proc.pid, signal.SIGKILL)
    elif point.startswith("random"):
        _wait_for(marks / "started", proc, "the build")
        time.sleep(random.Random(point).uniform(0.0, 0.6))  # the launcher alone sleeps 1 s of the build
        os.killpg(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL, proc.exitcode  # killed, not finished or failed
    if point in HOOKED:
        assert (marks / "reached").read_text() == point
    assert (marks / "started").exists() and not (marks / "done").exists()  # the kill landed inside the build
    tally["kills"] += 1

    debris = _verify_fix_clean()  # before the next load repairs anything on its own
    [(got, expected, cached)] = _in_child(_load_cards, _env(), [str(src_dir)])
    assert got == expected == 700 + 10 + i
    if not point.startswith("random"):  # a published entry survives its builder's death; nothing else is used
        assert cached == (point in AFTER_PUBLISH), (point, cached)
    tally["loads"] += 1
    groups = _groups_end(marks / "pids")  # the killed build's watchdog ended its compilers and linker
    assert groups >= 1 or point in ("lib-lock", "obj-lock", "obj-tmpdir")
    status = {f["entry"]: f["status"] for f in cache.verify()}
    assert set(status.values()) == {"ok"}, status
    key = make_target(src_dir / "f.cpp").key
    assert status[f"lib/{cache.library_dir('f', key).name}"] == "ok"
    print(f"kill at {point}: debris reported and removed by verify --fix: {debris['corrupt']}, "
          f"compiler groups ended: {groups}")
    if point == POINTS[-1]:  # what the 20 dead builds left in tmp/ is collected once stale
        cache.gc(now=time.time() + 2 * 3600)
        assert not list(cache.subdir("tmp").iterdir())
        tally["verified"] += len(status)


# ------------------------------------------------------------------------ edits at random moments
def _build_while_edited(env: dict, card_dir: str, seconds: float) -> dict:
    """In a child: build the card over and over while the test edits it. Every build must be refused
    (SourcesChanged) or return the code of the texts it planned from."""
    _enter(env)
    card_dir, end = Path(card_dir), time.time() + seconds
    counts = collections.Counter()
    # past the edits too, until one load lands: on a slow machine every build of the edit phase may be refused
    while time.time() < end or (not counts["loads"] and time.time() < end + 60):
        _load_and_count(card_dir, counts)
    return dict(counts)


def test_edits_at_random_moments_during_builds(cache_root, card, tmp_path, tally):
    env = _env(KERNELKIT_COMPILER_LAUNCHER=launcher(tmp_path, "sleep 0.05"))  # a wider compile to land in
    result = _ctx().Queue()
    proc = _ctx().Process(target=_returning, args=(_build_while_edited, (env, str(card), EDIT_SECONDS), result))
    proc.start()
    rng, edits, t0 = random.Random(23), 0, time.time()
    while time.time() - t0 < EDIT_SECONDS:
        time.sleep(rng.uniform(0.0, 0.12))
        _edit(card, rng, in_place=rng.random() < 0.5)  # half of them in place: read half written
        edits += 1
    ok, counts = result.get(timeout=120)
    proc.join(30)
    assert ok, counts
    print(f"edits during builds: {edits} edits, {counts}")
    assert counts.get("wrong", 0) == 0 and counts.get("vanished", 0) == 0, counts  # nothing clears the cache here
    # the edits did land mid-build, and a load followed (between them, or once they stopped on a slow machine)
    assert counts.get("loads", 0) >= 1 and counts.get("refused", 0) >= 1, counts
    assert counts.get("loads", 0) + counts.get("refused", 0) >= 10, counts
    [(got, expected, _)] = _in_child(_load_cards, _env(), [str(card)])
    assert got == expected  # what the files on disk say now
    debris = _verify_fix_clean()
    assert debris["corrupt"] == 0  # nothing was killed here: no debris at all
    checked, unknown, wrong = _in_child(_audit, _env(), str(tmp_path / "audit"))
    assert not unknown and wrong == 0 and checked >= 1, (checked, unknown, wrong)
    tally.update(edits=edits, loads=counts["loads"] + 1, refused=counts.get("refused", 0),
                 wrong=counts.get("wrong", 0) + wrong, verified=debris["verified"])


# ---------------------------------------------------------------------------------------------- storm
def _storm_worker(slot: int, env: dict, cards: list, end: float, counts_file: str) -> None:
    """Load, edit, gc (everything unused), clear and verify --fix at random until ``end``; the counts are written after
    every step, so a worker the test kills still reports what it did."""
    _enter(env)
    rng = random.Random(slot)
    counts, errors = collections.Counter(), collections.Counter()
    samples = []
    path = Path(counts_file)

    def save(finished: bool) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"counts": counts, "errors": errors, "samples": samples, "finished": finished}))
        os.replace(tmp, path)

    save(False)
    while time.time() < end:
        card_dir, action = Path(rng.choice(cards)), rng.random()
        try:
            if action < 0.65:
                _load_and_count(card_dir, counts)
            elif action < 0.88:
                _edit(card_dir, rng)
                counts["edits"] += 1
            elif action < 0.92:
                cache.gc(max_age_days=0)
                counts["gcs"] += 1
            elif action < 0.97:
                cache.clear()
                counts["clears"] += 1
            else:
                cache.verify(fix=True)  # removes only what is corrupt; never fails on what others remove
                counts["verify_fixes"] += 1
        except Exception as e:  # noqa: BLE001 - counted by type; any is a failure
            errors[type(e).__name__] += 1
            if len(samples) < 3:
                samples.append(traceback.format_exc()[-1500:])
        finally:
            save(False)
    save(True)


def test_storm_of_16_processes(cache_root, tmp_path, tally):
    cards = []
    for i in range(3):
        d = tmp_path / f"card{i}"
        d.mkdir()
        (d / "v.h").write_text("#define V 1\n")
        (d / "f.cpp").write_text(TU.format(w=1))
        cards.append(str(d))
    pids = tmp_path / "compiler-pids"
    env = _env(KERNELKIT_COMPILER_LAUNCHER=launcher(tmp_path, f"echo $$ >> {pids}\nsleep 0.02"))
    counts_dir = tmp_path / "counts"
    counts_dir.mkdir()
    ctx, rng = _ctx(), random.Random(16)
    end = time.time() + 3 + STORM_SECONDS  # the forkserver needs a few seconds to start
    workers = {}

    def start(slot: int) -> None:
        p = ctx.Process(target=_storm_worker, args=(slot, env, cards, end, str(counts_dir / f"{slot}.json")))
        p.start()
        workers[slot] = p

    for slot in range(STORM_PROCS):
        start(slot)
    killed, slot = set(), STORM_PROCS
    while time.time() < end - 2:  # SIGKILL a random worker now and then; a new one takes its place
        time.sleep(rng.uniform(1.0, 3.0))
        alive = [s for s, p in workers.items() if s not in killed and p.is_alive()]
        if not alive:
            break
        victim = rng.choice(alive)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(workers[victim].pid, signal.SIGKILL)
        killed.add(victim)
        start(slot)
        slot += 1
    deadline = end + 60  # the last step of a worker on a loaded machine, with room
    for p in workers.values():
        p.join(max(0.0, deadline - time.time()))
    hung = [s for s, p in workers.items() if p.is_alive()]
    for s in hung:
        os.killpg(workers[s].pid, signal.SIGKILL)
        workers[s].join()
    assert not hung, f"workers {hung} still running {deadline - end:.0f} s after the storm ended"
    reports = {s: json.loads((counts_dir / f"{s}.json").read_text()) for s in workers
               if s not in killed or (counts_dir / f"{s}.json").exists()}  # killed before its first report
    unfinished = [s for s, r in reports.items()
                  if s not in killed and not (r["finished"] and workers[s].exitcode == 0)]
    assert not unfinished, {s: (workers[s].exitcode, reports[s]) for s in unfinished}
    total, errors = collections.Counter(), collections.Counter()
    for r in reports.values():
        total.update(r["counts"])
        errors.update(r["errors"])
    samples = [x for r in reports.values() for x in r["samples"]]
    total["kills"] = len(killed)
    print(f"storm: {len(workers)} processes over {STORM_SECONDS:.0f} s, {dict(total)}, errors {dict(errors)}")
    assert total["wrong"] == 0, total
    if errors:  # a refused or vanished load is counted above; anything else is a failure
        pytest.fail(f"errors {dict(errors)}:\n" + "\n".join(samples), pytrace=False)
    assert total["loads"] >= 50 and total["refused"] >= 1 and total["cached"] >= 1, total
    assert min(total[k] for k in ("edits", "gcs", "clears")) >= 5 and total["kills"] >= 5, total
    groups = _groups_end(pids)  # no compiler of a killed worker keeps running
    debris = _verify_fix_clean(PUBLISH_DEBRIS | REMOVAL_DEBRIS)  # its workers were killed mid-build and mid-gc
    finals = _in_child(_load_cards, _env(), cards)
    assert all(got == expected for got, expected, _ in finals), finals  # what each card's files say now
    checked, unknown, wrong = _in_child(_audit, _env(), str(tmp_path / "audit"))
    assert not unknown and wrong == 0 and checked >= 1, (checked, unknown, wrong)
    status = [f["status"] for f in cache.verify()]
    assert status and set(status) == {"ok"}, status
    print(f"storm end: {groups} compiler groups ended, killed-build debris removed by verify --fix: "
          f"{debris['corrupt']}, entries verified: {len(status)}, libraries audited against their key: {checked}")
    tally.update(kills=total["kills"], edits=total["edits"], gcs=total["gcs"], clears=total["clears"],
                 loads=total["loads"] + len(finals), refused=total["refused"], vanished=total["vanished"],
                 wrong=total["wrong"] + wrong, hung=len(hung), verified=len(status))


# ------------------------------------------------ headers through every include flag, and a linked archive
# input -> (file in the card dir, the flags that reach it, how f.cpp includes it); each input is one decimal
# digit of f(), so a build that missed any edit returns a number its planned files do not say
FLAG_INPUTS = {
    "a": ("inc_a/a.h", ["-I", "{d}/inc_a"], "#include <a.h>"),
    "b": ("inc_b/b.h", ["-I{d}/inc_b"], "#include <b.h>"),
    "c": ("sys_c/c.h", ["-isystem", "{d}/sys_c"], "#include <c.h>"),
    "s": ("sys_s/s.h", ["-isystem{d}/sys_s"], "#include <s.h>"),
    "e": ("after/e.h", ["-idirafter", "{d}/after"], "#include <e.h>"),
    "q": ("quote/q.h", ["-iquote", "{d}/quote"], '#include "q.h"'),
    "i": ("forced/i.h", ["-include", "{d}/forced/i.h"], ""),
    "m": ("forced/m.h", ["-imacros", "{d}/forced/m.h"], ""),
}
ARCHIVE = "lib/libz.a"  # linked by its path in the link flags; z() is the top digit
DIGIT_POOL = range(1, 4)
FLAG_STORM_PROCS = 6
FLAG_STORM_SECONDS = min(STORM_SECONDS, 15.0)


def _flag_card(root: Path) -> Path:
    """The card, and one archive per digit of the pool under variants/ (an edit copies one in)."""
    d = root / "flagcard"
    (d / "variants").mkdir(parents=True)
    for v in DIGIT_POOL:
        c = d / "variants" / f"z{v}.c"
        c.write_text(f"int z(void) {{ return {v}; }}\n")
        subprocess.run(["cc", "-fPIC", "-c", str(c), "-o", str(c.with_suffix(".o"))], check=True)
        subprocess.run(["ar", "rcs", str(d / "variants" / f"libz{v}.a"), str(c.with_suffix(".o"))], check=True)
    digits = " + ".join(f"X_{k.upper()} * {10 ** i}" for i, k in enumerate(FLAG_INPUTS))
    body = [inc for _, _, inc in FLAG_INPUTS.values() if inc]
    body += ['extern "C" int z(void);',
             f'extern "C" __attribute__((visibility("default"))) int f() {{ return {digits} + z() * {10 ** len(FLAG_INPUTS)}; }}']
    (d / "f.cpp").write_text("\n".join(body) + "\n")
    for k in FLAG_INPUTS:
        _flag_edit_file(d, k, 1, in_place=False)
    _flag_edit_file(d, "z", 1, in_place=False)
    return d


def _flag_edit_file(d: Path, what: str, value: int, in_place: bool) -> None:
    path = d / (ARCHIVE if what == "z" else FLAG_INPUTS[what][0])
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (d / "variants" / f"libz{value}.a").read_bytes() if what == "z" else f"#define X_{what.upper()} {value}\n".encode()
    if in_place:  # truncate, then write: a compiler or the linker may read it half written
        path.write_bytes(data)
    else:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def _flag_planned(d: Path):
    """(target, the value its files say), planned under the card's lock."""
    with _card_lock(d, fcntl.LOCK_SH):
        expected = sum(int(re.search(rb" (\d+)\n", (d / rel).read_bytes()).group(1)) * 10 ** i
                       for i, (rel, _, _) in enumerate(FLAG_INPUTS.values()))
        archive = (d / ARCHIVE).read_bytes()
        z = next(v for v in DIGIT_POOL if (d / "variants" / f"libz{v}.a").read_bytes() == archive)
        flags = [f.format(d=d) for _, spelled, _ in FLAG_INPUTS.values() for f in spelled]
        src = d / "f.cpp"
        unit = units.plan_unit("cpp", src, src.read_text(), [d], flags, [], src.name)
        ldflags = ["-shared", str(d / ARCHIVE)]
        target = units.Target(name="flags", units=[unit], ldflags=ldflags, key=units.target_key("flags", [unit], ldflags),
                              with_cuda=False, pymodule=None, display={str(src): src.name}, texts={})
        return target, expected + z * 10 ** len(FLAG_INPUTS)


def _flag_worker(env: dict, d: str, seconds: float, seed: int) -> dict:
    """In a child: load the card, or edit one of its inputs (half of the edits in place), until the time is up.
    Returns the counts and, for each library key it loaded, the value its files said."""
    _enter(env)
    d, rng, end = Path(d), random.Random(seed), time.time() + seconds
    counts, said = collections.Counter(), {}
    while time.time() < end:
        if rng.random() < 0.35:
            what = rng.choice([*FLAG_INPUTS, "z"])
            with _card_lock(d, fcntl.LOCK_EX):
                _flag_edit_file(d, what, rng.choice(DIGIT_POOL), in_place=rng.random() < 0.5)
            counts["edits"] += 1
            continue
        target, expected = _flag_planned(d)
        try:
            so, cached, _ = build.build(target)
        except SourcesChanged:
            counts["refused"] += 1
            continue
        got = call_f(so)
        counts["loads"] += 1
        counts["cached"] += cached
        counts["wrong"] += got != expected
        said.setdefault(target.key, set()).add(expected)
    return {"counts": dict(counts), "said": {k: sorted(v) for k, v in said.items()}}


def _flag_final(env: dict, d: str) -> tuple:
    """In a fresh process: (f() of a load now, what the files say)."""
    _enter(env)
    target, expected = _flag_planned(Path(d))
    so, _, _ = build.build(target)
    return call_f(so), expected


def test_storm_of_edits_through_every_include_flag_and_a_linked_archive(cache_root, tmp_path, tally):
    """Headers reached through -I dir, -Idir, -isystem dir, -isystemdir, -idirafter, -iquote, -include and
    -imacros, and an archive named in the link flags, edited by 6 processes that also load the card, during
    builds and between them: 0 wrong results, and one value per library key."""
    d = _flag_card(tmp_path)
    env = _env(KERNELKIT_COMPILER_LAUNCHER=launcher(tmp_path, "sleep 0.02"))  # a wider compile to land in
    ctx = _ctx()
    results = ctx.Queue()
    procs = [ctx.Process(target=_returning, args=(_flag_worker, (env, str(d), FLAG_STORM_SECONDS, seed), results))
             for seed in range(FLAG_STORM_PROCS)]
    for p in procs:
        p.start()
    reports = []
    for _ in procs:
        ok, report = results.get(timeout=FLAG_STORM_SECONDS + 180)
        assert ok, report
        reports.append(report)
    for p in procs:
        p.join(30)
    total, said = collections.Counter(), {}
    for r in reports:
        total.update(r["counts"])
        for key, values in r["said"].items():
            said.setdefault(key, set()).update(values)
    print(f"flag storm: {FLAG_STORM_PROCS} processes over {FLAG_STORM_SECONDS:.0f} s, {dict(total)}")
    assert total["wrong"] == 0, total
    assert all(len(v) == 1 for v in said.values()), {k: v for k, v in said.items() if len(v) > 1}  # a key, a value
    assert total["loads"] >= 10 and total["edits"] >= 10, total
    got, expected = _in_child(_flag_final, _env(), str(d))
    assert got == expected  # what the files on disk say now
    debris = _verify_fix_clean()
    assert debris["corrupt"] == 0
    tally.update(edits=total["edits"], loads=total["loads"] + 1, refused=total.get("refused", 0),
                 wrong=total["wrong"], verified=debris["verified"])
