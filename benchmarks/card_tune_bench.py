"""A card's 16-configuration space tuned with ``kernelkit.autotune``, in a fresh cache: a unary card from
``kernelkit new`` whose ``.cu`` launches its float and double kernels with the accesses per thread (``TUNE_U``)
and threads per block (``TUNE_B``) given as ``-D`` values. Two shapes are tuned (two buckets), and
``kernelkit.ops`` is then checked at both against the reference. Usage:
    python benchmarks/card_tune_bench.py [--device cuda] [--sizes 16777216 4096] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

CUDA = """\
// bench_tuned: the CUDA launchers of its math, float and double with the tuned access shape, the rest default.
#include <kernelkit/elementwise.cuh>
#include "bench_tuned_math.h"

namespace kk {
#define BENCH_TUNED_LAUNCH(T)                                                                       \\
  template <>                                                                                       \\
  cudaError_t unary_launch<BenchTunedOp, T>(const T* x, T* out, int64_t n, cudaStream_t stream) {   \\
    return launch_elementwise_w<T, 1, TUNE_U, TUNE_B, 1>(out, InPtrs<T, 1>{{x}}, n,                 \\
                                                         BenchTunedOp<acc_t<T>>{}, stream);          \\
  }
BENCH_TUNED_LAUNCH(float)
BENCH_TUNED_LAUNCH(double)
}  // namespace kk

template cudaError_t kk::unary_launch<kk::BenchTunedOp, __half>(const __half*, __half*, int64_t, cudaStream_t);
template cudaError_t kk::unary_launch<kk::BenchTunedOp, __nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                                                       cudaStream_t);
"""
SPACE = {"TUNE_U": [1, 2, 4, 8], "TUNE_B": [128, 256, 512, 1024]}


def write_card(d: Path) -> None:
    from kernelkit.frontends import scaffold

    files = scaffold.card_files("bench_tuned", "unary")
    files["bench_tuned.cu"] = CUDA
    spec = files["bench_tuned.py"]
    files["bench_tuned.py"] = spec.replace(")  # EDIT: shapes", f", tune={SPACE!r})  # EDIT: shapes")
    for name, text in files.items():
        if not name.startswith("test_"):
            (d / name).write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 24, 1 << 12])
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as cards:
        os.environ["KERNELKIT_CACHE_DIR"] = cache  # before kernelkit is imported
        import torch

        import kernelkit

        write_card(Path(cards))
        runs = []
        for size in args.sizes:
            t0 = time.perf_counter()
            result = kernelkit.autotune("bench_tuned", kernels_dir=cards, shape=(size,), device=args.device)
            runs.append({"size": size, "wall_s": time.perf_counter() - t0, "phases_s": result.phases,
                         "best": result.best, "statuses": _statuses(result)})
            print(result.table(), flush=True)
        for size in args.sizes:  # each bucket's winner, through kernelkit.ops
            x = torch.randn(size, device=args.device)
            torch.testing.assert_close(kernelkit.ops.bench_tuned(x), x * x)
    print(f"device: {_device_name(args.device)}; {os.cpu_count()} CPUs")
    for r in runs:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in r["phases_s"].items())
        print(f"size {r['size']}: {r['wall_s']:.1f} s ({phases}); {r['statuses']}; best {r['best']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": _device_name(args.device), "runs": runs}, indent=1))
    return 0


def _statuses(result) -> dict:
    return dict(collections.Counter(c.status for c in result.candidates))


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"


if __name__ == "__main__":
    sys.exit(main())
