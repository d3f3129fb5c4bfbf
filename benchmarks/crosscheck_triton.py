"""Cross-check kernelkit.bench's CUDA timer against triton.testing.do_bench on one kernel (needs a GPU).

    python benchmarks/crosscheck_triton.py [--op vector_add|torch.add] [--sizes 2**20 2**24 2**26]

Both flush L2 with a 256 MB write before each call and take the median over a ~200 ms budget. Their
medians should agree within the spread: triton's median inside kernelkit's p20-p80 band, or the other way
round, or within 3% of each other.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

import torch


def _op(name: str):
    if name == "torch.add":
        return torch.add
    import kernelkit

    return getattr(kernelkit.ops, name)


def crosscheck(op: str = "vector_add", sizes: Optional[List[int]] = None, budget_ms: float = 200.0) -> List[dict]:
    import triton.testing

    from kernelkit.harness.timing import time_cuda

    fn_op = _op(op)
    rows = []
    for n in sizes or [1 << 20, 1 << 24, 1 << 26]:
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        fn = lambda: fn_op(a, b)  # noqa: E731
        kk = time_cuda(fn, budget_ms=budget_ms)
        t20, t50, t80 = triton.testing.do_bench(fn, warmup=25, rep=int(budget_ms), quantiles=[0.2, 0.5, 0.8],
                                                return_mode="median")
        tr = {"median_us": t50 * 1e3, "p20_us": t20 * 1e3, "p80_us": t80 * 1e3}
        agree = (kk.p20_us <= tr["median_us"] <= kk.p80_us or tr["p20_us"] <= kk.median_us <= tr["p80_us"]
                 or abs(kk.median_us - tr["median_us"]) <= 0.03 * tr["median_us"])
        rows.append({"op": op, "n": n, "kernelkit": {"median_us": kk.median_us, "p20_us": kk.p20_us,
                                                     "p80_us": kk.p80_us, "reps": kk.reps},
                     "triton": tr, "ratio": kk.median_us / tr["median_us"], "agree": bool(agree)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="vector_add", help="a kernelkit.ops name, or torch.add")
    p.add_argument("--sizes", nargs="+", default=["2**20", "2**24", "2**26"])
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernelkit.frontends.harness_commands import parse_size

    rows = crosscheck(args.op, [parse_size(s)[0] for s in args.sizes])
    print(f"{torch.cuda.get_device_name()}: kernelkit.bench vs triton.testing.do_bench (median, p20-p80 in us)")
    for r in rows:
        k, t = r["kernelkit"], r["triton"]
        print(f"{r['op']:>12} n={r['n']:>10}  kernelkit {k['median_us']:9.2f} ({k['p20_us']:.2f}-{k['p80_us']:.2f})"
              f"  triton {t['median_us']:9.2f} ({t['p20_us']:.2f}-{t['p80_us']:.2f})  ratio {r['ratio']:.3f}"
              f"  {'agree' if r['agree'] else 'DISAGREE'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
