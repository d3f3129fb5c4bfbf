"""group= (compile once per job): 4 gloo ranks on this machine, each with its own cache directory (nodes
without a shared filesystem), rendezvous through a FileStore. One job runs the collective scenarios in
order and each test checks one of them; a second job kills the building rank mid-compile.

Run as a script, this file is one rank: ``python test_distributed.py ROOT RANK WORLD JOB``."""
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORLD = 4
HERE = Path(__file__).resolve()
TIMEOUT_S = 20  # the killed job's process group timeout: how long a rank may wait for a dead one
BUILD_TIMEOUT_S = 240  # the main job's: longer than a cold build of a card (torch headers) on a busy 2-core box

TU = '#include "v.h"\nextern "C" __attribute__((visibility("default"))) int {fn}() {{ return V * 100 + {w}; }}\n'
KERNEL = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }'


# ------------------------------------------------------------------------------------------- one rank
def _files(rank: int) -> None:
    """Each rank writes its own copy of the sources (its own 'node'); rank 3's diff/v.h differs."""
    for d, text, header in [("ok", TU.format(fn="f", w=1), "#define V 4\n"),
                            ("part", TU.format(fn="g", w=2), "#define V 5\n"),
                            ("shared", TU.format(fn="h", w=3), "#define V 6\n"),
                            ("bad", 'extern "C" int f() { return undefined_name; }\n', ""),
                            ("diff", TU.format(fn="f", w=7), "#define V 9\n" if rank == 3 else "#define V 8\n")]:
        Path(d).mkdir()
        (Path(d) / "f.cpp").write_text(text)
        (Path(d) / "v.h").write_text(header)


def _lib(name, src, group, **kw):
    import kernelkit

    return kernelkit.load(name, [src], is_python_module=False, group=group, **kw)


def _scenario(fn, rank, group):
    """Run one collective step; whatever it raised is recorded, not fatal, so the next step still runs."""
    import ctypes

    import kernelkit
    from kernelkit.jit import distributed

    c0, r0 = kernelkit.STATS["compiles"], distributed.STATS["received"]
    t0 = time.perf_counter()
    out = {}
    try:
        out.update(fn(rank, group) or {})
    except Exception as e:
        out["error"], out["message"] = type(e).__name__, str(e)
    out.update(seconds=time.perf_counter() - t0, compiles=kernelkit.STATS["compiles"] - c0,
               received=distributed.STATS["received"] - r0)
    if "so" in out:
        out["sha256"] = hashlib.sha256(Path(out["so"]).read_bytes()).hexdigest()
        out["value"] = getattr(ctypes.CDLL(out["so"]), out.pop("fn", "f"))()
    return out


def _ok(rank, group):
    return {"so": _lib("f", "ok/f.cpp", group)}


def _partial(rank, group):
    if rank == 1:  # this rank's cache has it already: it must be left out of the transfer
        _lib("g", "part/f.cpp", None)
    return {"so": _lib("g", "part/f.cpp", group), "fn": "g"}


def _shared(rank, group):
    os.environ["KERNELKIT_CACHE_DIR"] = str(Path("..", "shared-cache").resolve())  # one node, one cache
    try:
        return {"so": _lib("h", "shared/f.cpp", group), "fn": "h"}
    finally:
        os.environ["KERNELKIT_CACHE_DIR"] = str(Path("cache").resolve())


def _node(rank, group):
    from kernelkit import distributed

    node = rank // 2  # two "nodes" of two ranks, each node one cache
    os.environ["KERNELKIT_CACHE_DIR"] = str(Path("..", f"node{node}-cache").resolve())
    try:
        return {"so": _lib("n", "shared/f.cpp", distributed.node_group(local_world_size=2)), "fn": "h"}
    finally:
        os.environ["KERNELKIT_CACHE_DIR"] = str(Path("cache").resolve())


def _missing(rank, group):
    return {"so": _lib("f", "ok/f.cpp" if rank != 2 else "ok/nope.cpp", group)}


def _unsafe(rank, group):
    """Rank 2's own cache holds the build, but world-writable: its lookup raises before the exchange."""
    lib = _lib("u", "part/f.cpp", None) if rank == 2 else None
    if lib is not None:
        os.chmod(lib, 0o777)
    try:
        return {"so": _lib("u", "part/f.cpp", group), "fn": "g"}
    finally:
        if lib is not None:
            os.chmod(lib, 0o700)  # the later scenarios verify this cache


def _kernels(rank, group):
    import kernelkit

    mod = kernelkit.load_kernels(KERNEL, name="scaling", arch="9.0", group=group)
    return {"cubin_sha256": hashlib.sha256(mod.cubin.read_bytes()).hexdigest(), "cached": mod.cached,
            "in_own_cache": str(mod.cubin).startswith(str(Path("cache").resolve()))}


def _card(rank, group):
    import shutil

    import torch

    import kernelkit

    shutil.copytree(HERE.parent / "fixtures" / "cards", "cards", ignore=shutil.ignore_patterns("__pycache__"))
    lib = kernelkit.load("kk_add_skip_last", kernels_dir="cards", group=group)  # a card, by name
    return {"card_so": str(lib.path), "card_sha256": hashlib.sha256(lib.path.read_bytes()).hexdigest(),
            "out": lib.kk_add_ok(torch.arange(5.0), torch.ones(5)).tolist()}


def _card_kernels(rank, group):
    import shutil

    from kernelkit.instant import card_kernels
    from kernelkit.jit import cards

    shutil.copytree(HERE.parent / "fixtures" / "cards_nvrtc", "nvrtc_cards", ignore=shutil.ignore_patterns("__pycache__"))
    found = card_kernels.obtain(cards.find("kk_scale_nvrtc", "nvrtc_cards"), arch="9.0", group=group)
    return {"cubin_sha256": [hashlib.sha256(m.cubin.read_bytes()).hexdigest() for m in found.modules],
            "cached": [m.cached for m in found.modules]}


def _verify(rank, group):
    from kernelkit.jit import cache

    return {"corrupt": [e for e in cache.verify() if e["status"] != "ok"]}


SCENARIOS = {"ok": _ok, "again": _ok, "partial": _partial, "shared": _shared, "node": _node,
             "bad": lambda r, g: {"so": _lib("bad", "bad/f.cpp", g)},
             "diff": lambda r, g: {"so": _lib("diff", "diff/f.cpp", g)},
             "missing": _missing, "unsafe": _unsafe, "kernels": _kernels, "card": _card,
             "card_kernels": _card_kernels, "verify": _verify}


def worker(root: Path, rank: int, world: int, job: str) -> None:
    import torch.distributed as dist

    os.chdir(root / f"rank{rank}")
    os.environ["KERNELKIT_CACHE_DIR"] = str(Path("cache").resolve())
    _files(rank)
    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S if job == "killed" else BUILD_TIMEOUT_S))
    group = dist.group.WORLD
    if job == "killed":
        if rank == 0:  # the compiler launcher kills this rank mid-build
            os.environ["KERNELKIT_COMPILER_LAUNCHER"] = f"sh -c 'kill -9 {os.getpid()}; sleep 60' --"
        results = {"killed": _scenario(_ok, rank, group)}
    else:
        results = {name: _scenario(fn, rank, group) for name, fn in SCENARIOS.items()}
    (root / f"result{rank}.json").write_text(json.dumps(results))
    if job != "killed":
        dist.destroy_process_group()
    os._exit(0)  # a group with a dead member must not hang this process at exit


def run_job(root: Path, job: str) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    for r in range(WORLD):
        (root / f"rank{r}").mkdir()
    env = {**os.environ, "KERNELKIT_VERBOSE": "0", "KERNELKIT_PCH": "0"}
    env.pop("KERNELKIT_COMPILER_LAUNCHER", None)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(HERE), str(root), str(r), str(WORLD), job], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(WORLD)]
    out = {}
    for r, p in enumerate(procs):
        try:
            log, _ = p.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} of the {job} job hung")
        res = root / f"result{r}.json"
        out[r] = {"rc": p.returncode, "log": log.decode(errors="replace")[-3000:],
                  **(json.loads(res.read_text()) if res.exists() else {})}
    out["wall"] = time.perf_counter() - t0
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("dist"), "main")


def _all(job, scenario):
    for r in range(WORLD):
        assert scenario in job[r], f"rank {r} recorded no {scenario!r}: rc {job[r]['rc']}\n{job[r]['log']}"
    return [job[r][scenario] for r in range(WORLD)]


# ------------------------------------------------------------------------------------------------ tests
def test_one_compile_in_total_and_every_rank_gets_the_same_library(job):
    res = _all(job, "ok")
    assert [r.get("error") for r in res] == [None] * WORLD, res
    assert sum(r["compiles"] for r in res) == 1 and res[0]["compiles"] == 1
    assert [r["received"] for r in res] == [0, 1, 1, 1]
    assert {r["value"] for r in res} == {401}
    assert len({r["sha256"] for r in res}) == 1
    for r, x in enumerate(res):  # each rank loads from its own cache, not from another rank's files
        assert f"rank{r}/cache/" in x["so"]


def test_ranks_whose_cache_holds_the_build_skip_the_transfer(job):
    again = _all(job, "again")
    assert [r.get("error") for r in again] == [None] * WORLD
    assert [(r["compiles"], r["received"]) for r in again] == [(0, 0)] * WORLD
    part = _all(job, "partial")  # rank 1 built it alone first; in the group only ranks 2, 3 lack it
    assert [r.get("error") for r in part] == [None] * WORLD, part
    assert [r["compiles"] for r in part] == [1, 1, 0, 0]
    assert [r["received"] for r in part] == [0, 0, 1, 1]
    assert {r["value"] for r in part} == {502} and len({r["sha256"] for r in part}) == 1


def test_a_card_by_name_is_built_once_per_job(job):
    res = _all(job, "card")
    assert [r.get("error") for r in res] == [None] * WORLD, res
    assert res[0]["compiles"] >= 1 and [r["compiles"] for r in res[1:]] == [0] * (WORLD - 1)
    assert [r["received"] for r in res] == [0, 1, 1, 1]
    assert len({r["card_sha256"] for r in res}) == 1
    assert [r["out"] for r in res] == [[1.0, 2.0, 3.0, 4.0, 5.0]] * WORLD
    for r, x in enumerate(res):
        assert f"rank{r}/cache/" in x["card_so"]


def test_a_shared_cache_means_one_build_and_no_transfer(job):
    res = _all(job, "shared")
    assert [r.get("error") for r in res] == [None] * WORLD, res
    assert sum(r["compiles"] for r in res) == 1 and sum(r["received"] for r in res) == 0
    assert {r["value"] for r in res} == {603} and len({r["so"] for r in res}) == 1


def test_node_groups_build_once_per_node(job):
    res = _all(job, "node")
    assert [r.get("error") for r in res] == [None] * WORLD, res
    assert [r["compiles"] for r in res] == [1, 0, 1, 0] and sum(r["received"] for r in res) == 0
    assert {r["value"] for r in res} == {603} and res[0]["so"] == res[1]["so"] != res[2]["so"] == res[3]["so"]


def test_a_compile_error_is_raised_on_every_rank_with_the_same_message(job):
    res = _all(job, "bad")
    assert [r.get("error") for r in res] == ["BuildError"] * WORLD
    assert "undefined_name" in res[0]["message"] and "f.cpp:1" in res[0]["message"]
    assert {r["message"] for r in res} == {res[0]["message"]}
    assert sum(r["compiles"] for r in res) == 1


def test_differing_sources_are_named_on_every_rank_before_any_build(job):
    res = _all(job, "diff")
    assert [r.get("error") for r in res] == ["KernelkitError"] * WORLD
    for r in res:
        assert "rank 3's sources differ from rank 0's: file diff/v.h" in r["message"], r["message"]
        assert r["compiles"] == 0


def test_a_rank_that_cannot_plan_makes_every_rank_raise(job):
    res = _all(job, "missing")
    assert res[2]["error"] == "FileNotFoundError" and "nope.cpp" in res[2]["message"]
    for r in (0, 1, 3):
        assert res[r]["error"] == "KernelkitError" and "rank 2: FileNotFoundError" in res[r]["message"]
        assert "nope.cpp" in res[r]["message"]


def test_a_rank_whose_own_cache_raises_makes_every_rank_raise_at_once(job):
    """Not a wait for the process group's timeout: the failing rank raises its own error, the others name it."""
    res = _all(job, "unsafe")
    assert res[2]["error"] == "CacheSecurityError", res[2]
    for r in (0, 1, 3):
        assert res[r]["error"] == "KernelkitError" and "rank 2: CacheSecurityError" in res[r]["message"], res[r]
        assert res[r]["seconds"] < 60 and res[r]["compiles"] == 0


def test_instant_kernels_compile_once_and_arrive_in_each_cache(job):
    pytest.importorskip("cuda.bindings.nvrtc", reason="instant kernels need cuda-bindings (torch's CUDA 13 wheels bring it)")
    res = _all(job, "kernels")
    assert [r.get("error") for r in res] == [None] * WORLD, res
    assert [r["cached"] for r in res] == [False, True, True, True]
    assert [r["received"] for r in res] == [0, 1, 1, 1]
    assert len({r["cubin_sha256"] for r in res}) == 1 and all(r["in_own_cache"] for r in res)


def test_a_cards_nvrtc_kernels_compile_once_per_job(job):
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC cards need cuda-bindings (torch's CUDA 13 wheels bring it)")
    res = _all(job, "card_kernels")
    assert [r.get("error") for r in res] == [None] * WORLD, res
    assert [r["cached"] for r in res] == [[False], [True], [True], [True]]  # the card's one kernel file, for sm_90
    assert [r["received"] for r in res] == [0, 1, 1, 1]
    assert len({tuple(r["cubin_sha256"]) for r in res}) == 1


def test_received_entries_pass_the_cache_verification(job):
    for r in _all(job, "verify"):
        assert r.get("error") is None and r["corrupt"] == []


def test_a_killed_building_rank_does_not_hang_the_others(tmp_path):
    res = run_job(tmp_path / "killed", "killed")
    assert res[0]["rc"] == -9 and "killed" not in res[0]
    for r in (1, 2, 3):
        x = res[r].get("killed")
        assert x is not None, res[r]["log"]
        assert x.get("error") == "KernelkitError" and "rank 0" in x["message"], x
        assert x["seconds"] < TIMEOUT_S + 10


def test_group_needs_an_initialized_process_group(tmp_path, monkeypatch):
    import kernelkit
    from kernelkit.errors import KernelkitError

    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "f.cpp").write_text('extern "C" int f() { return 1; }\n')
    with pytest.raises(KernelkitError, match=r"group=: torch.distributed is not initialized"):
        kernelkit.load("f", [tmp_path / "f.cpp"], is_python_module=False, group=object())
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        with pytest.raises(TypeError, match=r"group=: expected a torch.distributed process group"):
            kernelkit.load("f", [tmp_path / "f.cpp"], is_python_module=False, group="world")
        with pytest.raises(TypeError, match=r"group=: expected"):
            kernelkit.load_kernels(KERNEL, name="scaling", arch="9.0", group=1)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    worker(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
