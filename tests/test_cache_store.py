"""The cache's store table (kernelkit.jit.store, issue 55): every file kernelkit writes under the cache belongs to a
row, and gc, clear, verify and the CLI go through the rows. Real files in a private cache, no mocks: the writers
reachable without a GPU run, then the cache root is walked."""
import importlib
import json
import os
import time
from pathlib import Path

import pytest

import kernelkit
from kernelkit.frontends import cli
from kernelkit.harness.bandwidth import device_bandwidth
from kernelkit.inspect import compile_report
from kernelkit.jit import cache, keys, store, toolchain
from kernelkit.jit.fast import recall
from kernelkit.loading import arguments

TU = 'extern "C" __attribute__((visibility("default"))) int kk_store_f() { return 7; }\n'


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KERNELKIT_COMPILER_LAUNCHER", raising=False)
    # files the test wrote a moment ago are 'racy' for a warm plan: record it anyway (as tests/test_patch.py does)
    monkeypatch.setattr(recall, "RACY_SECONDS", -3600.0)
    monkeypatch.setattr(recall, "FINE_RACY_SECONDS", -3600.0)
    toolchain.facts.cache_clear()  # its record is written into this cache, not read from memory
    yield cache.cache_dir()
    toolchain.facts.cache_clear()


def _files(root: Path):
    """Every file under ``root``, relative to it."""
    return sorted(Path(d, f).relative_to(root).as_posix() for d, _, files in os.walk(root) for f in files)


def _owners(root: Path):
    return {rel: store.owner(rel) for rel in _files(root)}


def _age(root: Path, seconds: float) -> None:
    """Make everything under ``root`` last used ``seconds`` ago."""
    stamp = time.time() - seconds
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            os.utime(Path(d, name), (stamp, stamp), follow_symlinks=False)


def _exercise(root: Path, tmp_path: Path) -> None:
    """Run every writer of the cache reachable on a CPU: a build (objects, a library, a warm plan, locks, toolchain
    facts, gc's stamp), load_inline (generated sources), torch's signatures, bandwidth, a tuning winner and a
    compile report."""
    src = tmp_path / "proj" / "f.cpp"
    src.parent.mkdir()
    src.write_text(TU)
    info = kernelkit.load("kk_store_walk", [str(src)], is_python_module=False, load=False)
    kernelkit.load_inline("kk_store_inline", TU.replace("kk_store_f", "kk_store_g"), is_python_module=False,
                          no_implicit_headers=True)
    arguments._recorded_orders()
    device_bandwidth("cpu")
    cache.store_tune_record(keys.tune_key("op", "src", "cpu", "float32", "small"), {"best": {"block": 128}})
    compile_report._HISTORY.clear()
    compile_report._remember(compile_report._Target(info.name, info.key, Path(info.path), None), [])
    assert {"plans", "toolchain", "torch-signatures", "bandwidth", "reports", "tune", "sources", "libraries",
            "objects"} <= {row.name for row in _owners(root).values() if row is not None}, _files(root)


def test_every_file_written_belongs_to_a_row(cache_root, tmp_path):
    _exercise(cache_root, tmp_path)
    unclaimed = [rel for rel, row in _owners(cache_root).items() if row is None]
    assert unclaimed == []


def test_gc_with_no_max_age_collects_aged_plans_reports_and_records(cache_root, tmp_path):
    _exercise(cache_root, tmp_path)
    _age(cache_root, 2 * 86400)
    removed = cache.gc(max_age_days=0)
    assert all(removed[name] >= 1 for name in ("plans", "reports", "toolchain", "torch-signatures", "bandwidth",
                                                "libraries", "objects", "sources")), removed
    left = {rel: row.name for rel, row in _owners(cache_root).items()}
    assert set(left.values()) <= {"stamps", "tune"}, left  # what no age collects: gc's stamp, tuning winners


def test_clear_removes_everything(cache_root, tmp_path, capsys):
    _exercise(cache_root, tmp_path)
    _age(cache_root, 2 * 3600)  # generated sources and build dirs younger than an hour may be a live build's
    assert cli.main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    left = {rel: row.name for rel, row in _owners(cache_root).items()}
    assert set(left.values()) <= {"stamps"}, left
    assert all(s["entries"] == 0 for s in cache.store_usage() if s["name"] != "stamps")


def test_verify_reports_and_removes_a_corrupt_record(cache_root, capsys):
    toolchain.facts()
    [record] = (cache_root / "records" / "toolchain").glob("*.json")
    record.write_text("{not json")
    [bad] = [f for f in cache.verify() if f["status"] != "ok"]
    assert bad["kind"] == "toolchain" and bad["entry"] == f"toolchain/{record.name}" and "JSON" in bad["reason"]
    assert cli.main(["cache", "verify"]) == 1
    assert "corrupt toolchain" in capsys.readouterr().out
    assert cli.main(["cache", "verify", "--fix"]) == 0
    assert not record.exists()
    toolchain.facts.cache_clear()
    assert isinstance(toolchain.facts()["include_cpu"], list) and json.loads(record.read_text())  # written again


def test_what_lies_in_no_rows_place_is_collected_by_age(cache_root):
    """Files an older kernelkit wrote elsewhere (the root's toolchain-*.json, records of a retired kind)."""
    old = [cache_root / "toolchain-0123.json", cache_root / "records" / "split" / "r1.json"]
    young = cache_root / "bandwidth.json"
    for p in (*old, young):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    for p in (*old, old[1].parent):
        os.utime(p, (time.time() - 40 * 86400,) * 2)
    assert all(store.owner(p.relative_to(cache_root).as_posix()) is None for p in (*old, young))
    assert cache.gc(max_age_days=30)["unclaimed"] == 2
    assert not any(p.exists() for p in old) and young.exists()
    assert cache.clear() == 1 and not young.exists()


def test_only_rows_are_written(cache_root):
    for name in ("reports", "records", "records/split", ".", "../elsewhere"):
        with pytest.raises(ValueError, match="store table|STORES"):
            cache.subdir(name)
    with pytest.raises(ValueError, match="not a store"):
        cache.write_record("split", "k", {})
    with pytest.raises(ValueError, match="no JSON records"):
        cache.record_path("libraries", "k")
    with pytest.raises(ValueError, match="record key"):
        cache.record_path("toolchain", "../k")
    assert cache.subdir("plans") == cache_root / "plans"  # jit.fast.recall's folder is a row
    path = cache.record_path("frames", "f00d")
    assert path == cache_root / "records" / "frames" / "f00d.json" and path.parent.is_dir()
    assert oct(os.stat(path.parent.parent).st_mode & 0o777) == "0o700"


def test_the_table_is_whole():
    """Every row names a key recipe that exists (in keys but for the two that keys' own imports rule out), a gc rule
    and a verify check that gc, clear and verify know, a folder no other row has with the same patterns."""
    rules = {store.AGED, store.AGED_SOURCES, store.STALE, store.IDLE, store.WITH_OBJECT, store.KEPT, store.NEVER}
    checks = {store.SO_SHA256, store.OBJECT_SHA256, store.PCH_SHA256, store.TEXT_HASH, store.JSON, store.NOTHING}
    outside_keys = set()
    for row in store.STORES:
        assert row.gc in rules and row.verify in checks and row.kind in (*store.KINDS, "other"), row
        for recipe in row.recipes:
            module, _, function = recipe.partition(".")
            assert callable(getattr(importlib.import_module(f"kernelkit.jit.{module}"), function)), recipe
            outside_keys |= {recipe} if module != "keys" else set()
    assert outside_keys == {"toolchain.facts_key", "cache.generated_source_key"}
    assert len({row.name for row in store.STORES}) == len(store.STORES)
    assert len({(row.folder, row.patterns) for row in store.STORES}) == len(store.STORES)


def test_the_cli_lists_each_store(cache_root, capsys):
    toolchain.facts()
    assert cli.main(["cache", "list", "--store", "toolchain"]) == 0
    assert "records/toolchain/" in capsys.readouterr().out
    assert cli.main(["cache", "list", "--store", "plans", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert cli.main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert all(row.name in text for row in store.STORES) and "records/toolchain/" in text


@pytest.mark.gpu
def test_every_file_a_gpu_build_writes_belongs_to_a_row(cache_root, tmp_path):
    """Instant kernels (NVRTC's facts, the launcher, cubins, outlines) and a split torch .cu (its frame, torch's
    names, and a host shape once a kernel body is edited) write into rows too."""
    import torch

    mod = kernelkit.load_kernels('extern "C" __global__ void kk_store_k(float* x) { x[threadIdx.x] += 1.0f; }',
                                 "kk_store_k")
    x = torch.zeros(32, device="cuda")
    mod.kk_store_k[1, 32](x)
    assert x.sum().item() == 32
    src = tmp_path / "relu_extension.cu"
    text = (Path(__file__).parent / "fixtures" / "torch_cu" / "relu_extension.cu").read_text()
    src.write_text(text)
    kernelkit.load("kk_store_relu", [str(src)], load=False)
    src.write_text(text.replace("v * slope;", "v * slope * 2.0f;"))  # a kernel-body edit: device code alone
    kernelkit.load("kk_store_relu", [str(src)], load=False)
    from kernelkit.jit.fast import torch_cu

    torch_cu.wait_for_audits(300)  # the edit's background proof writes (and removes) files under tmp/ meanwhile
    owners = _owners(cache_root)
    assert [rel for rel, row in owners.items() if row is None] == []
    assert {"nvrtc", "frames", "torch-names", "shapes", "objects", "libraries"} <= {r.name for r in owners.values()}
    assert all(f["status"] == "ok" for f in cache.verify())
