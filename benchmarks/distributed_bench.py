"""Wall time for N ranks to get a new op, three ways, in one run (issue 26):

  group   kernelkit.load(..., group=WORLD): rank 0 compiles, the others receive the library (gloo)
  alone   kernelkit.load(...) on each rank: each compiles it
  torch   torch.utils.cpp_extension.load(...) on each rank: each compiles it

Every rank has its own cache / TORCH_EXTENSIONS_DIR (nodes without a shared filesystem) and its own copy of
the sources. Timed per rank from a barrier after init_process_group to the op's first correct call; the
figure is the slowest rank's. Usage: python benchmarks/distributed_bench.py [--ranks 4] [--out DIR]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = r"""
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
at::Tensor twice_plus(const at::Tensor& x, double a) { return at::add(x, x, a); }
TORCH_LIBRARY(distbench_%(tag)s, m) { m.def("twice_plus(Tensor x, float a) -> Tensor", twice_plus); }
TORCH_LIBRARY_IMPL(distbench_%(tag)s, CPU, m) { m.impl("twice_plus", twice_plus); }
"""


def rank_main(root: Path, rank: int, world: int, mode: str, tag: str) -> None:
    import torch
    import torch.distributed as dist

    here = root / f"rank{rank}"
    here.mkdir(parents=True, exist_ok=True)
    os.environ["KERNELKIT_CACHE_DIR"] = str(here / "kk-cache")
    os.environ["TORCH_EXTENSIONS_DIR"] = str(here / "torch-ext")
    src = here / "op.cpp"
    src.write_text(SOURCE % {"tag": tag})
    dist.init_process_group("gloo", init_method=f"file://{root}/rdv", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=900))
    import kernelkit

    dist.barrier()
    t0 = time.perf_counter()
    name = f"distbench_{tag}"
    if mode == "torch":
        from torch.utils.cpp_extension import load

        load(name, [str(src)], is_python_module=False, verbose=False)
    else:
        kernelkit.load(name, [src], is_python_module=False, group=dist.group.WORLD if mode == "group" else None)
    x = torch.arange(4.0)
    got = getattr(torch.ops, name).twice_plus(x, 1.0)
    assert torch.equal(got, 2 * x), got
    seconds = time.perf_counter() - t0
    (root / f"rank{rank}.json").write_text(json.dumps({"seconds": seconds,
                                                       "compiles": kernelkit.STATS["compiles"]}))
    dist.destroy_process_group()


def run_mode(mode: str, ranks: int, base: Path) -> dict:
    root = base / mode
    root.mkdir(parents=True)
    tag = f"{mode}{os.getpid()}"  # a new op each mode: no cache or loaded library carries over
    env = {**os.environ, "KERNELKIT_VERBOSE": "0"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(ranks), "--mode", mode,
                               "--root", str(root), "--tag", tag], env=env) for r in range(ranks)]
    rcs = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    if any(rcs):
        raise SystemExit(f"{mode}: a rank failed (exit codes {rcs})")
    per = [json.loads((root / f"rank{r}.json").read_text()) for r in range(ranks)]
    return {"mode": mode, "slowest_rank_s": round(max(p["seconds"] for p in per), 2),
            "ranks_s": [round(p["seconds"], 2) for p in per],
            "kernelkit_compiles": sum(p["compiles"] for p in per), "wall_with_startup_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--modes", default="group,alone,torch")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--mode")
    ap.add_argument("--root", type=Path)
    ap.add_argument("--tag")
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a.root, a.rank, a.world, a.mode, a.tag)
    base = Path(tempfile.mkdtemp(prefix="kk-distbench-"))
    results = []
    for mode in a.modes.split(","):
        r = run_mode(mode, a.ranks, base)
        print(json.dumps(r), flush=True)
        results.append(r)
    if a.out:
        a.out.write_text(json.dumps({"ranks": a.ranks, "cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
