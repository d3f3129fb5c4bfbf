"""``kernelkit check``, ``kernelkit bench`` and ``kernelkit run``: registered on the main CLI's subparsers."""
from __future__ import annotations

import argparse
import re
import sys
from typing import List, Optional, Tuple

import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16,
           "half": torch.float16, "float": torch.float32, "double": torch.float64}


def parse_size(text: str) -> Tuple[int, ...]:
    """"4096", "1e6", "2**20", "2^20", "100x1024" -> a shape tuple."""
    def dim(t: str) -> int:
        m = re.fullmatch(r"(\d+)(?:\*\*|\^)(\d+)", t)
        value = int(m.group(1)) ** int(m.group(2)) if m else float(t)
        if value != int(value) or value < 0:
            raise ValueError
        return int(value)

    try:
        return tuple(dim(t) for t in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4096, 1e6, 2**20 or 100x1024") from None


def _sizes(values: Optional[List[str]]) -> Optional[List[Tuple[int, ...]]]:
    if not values:
        return None
    return [parse_size(t) for v in values for t in v.split(",") if t]


def _dtype(text: str) -> torch.dtype:
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: one of {', '.join(_DTYPES)}") from None


def _targets(args) -> List[tuple]:
    """(name, spec, op, device) for each requested card, loading it; prints why a card is skipped."""
    from .cards import all_cards
    from .spec import load_card

    cards = all_cards(args.kernels_dir)
    out = []
    for name in args.ops or sorted(cards):
        card = cards.get(name)
        spec = card.spec if card is not None else None
        if spec is None:
            print(f"{name}: " + ("no such card" if card is None else "no spec (kernels/<op>.py): nothing to run"),
                  file=sys.stderr)
            out.append((name, None, None, None))
            continue
        device = args.device or ("cuda" if torch.cuda.is_available() and "cuda" in spec.devices else
                                 "cpu" if "cpu" in spec.devices else None)
        if device is None:
            print(f"{name}: SKIPPED - implemented for {list(spec.devices)} only and no CUDA GPU is available "
                  f"(`kernelkit build {name}` compiles it)", file=sys.stderr)
            continue
        spec, op = load_card(name, args.kernels_dir)
        out.append((name, spec, op, device))
    return out


def cmd_check(args) -> int:
    from .check import check
    from .errors import KernelkitError

    status = 0
    try:
        targets = _targets(args)
    except KernelkitError as e:
        print(e, file=sys.stderr)
        return 1
    for name, spec, op, device in targets:
        if spec is None:
            status = 1
            continue
        res = check(op, spec=spec, device=device, dtypes=args.dtype, trials=args.trials, seed=args.seed,
                    large=args.large)
        print(repr(res) + "\n")
        status |= 0 if res.ok else 1
    return status


def cmd_bench(args) -> int:
    from .bench import bench, write_csv
    from .errors import KernelkitError

    try:
        targets = _targets(args)
    except KernelkitError as e:
        print(e, file=sys.stderr)
        return 1
    results, status = [], 0
    for name, spec, op, device in targets:
        if spec is None:
            status = 1
            continue
        res = bench(op, spec=spec, device=device, sizes=_sizes(args.sizes), dtype=args.dtype and args.dtype[0],
                    compile=args.compile, graph=args.graph, budget_ms=args.budget_ms, copy_floor=args.copy_floor)
        print(repr(res) + "\n")
        results.append(res)
        if args.plot:
            for p in res.plot(args.plot):
                print(f"wrote {p}")
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps([r.to_dict() for r in results], indent=1))
    if args.csv and results:
        write_csv(results, args.csv)
    return status


def cmd_run(args) -> int:
    from .runner import Options, run

    opts = Options(check=not args.no_check, bench=not args.no_bench, trials=args.trials, sizes=_sizes(args.sizes),
                   compile=args.compile, graph=args.graph, budget_ms=args.budget_ms, arch=args.arch,
                   kernels_dir=args.kernels_dir, quick=args.quick, copy_floor=args.copy_floor)
    code, _ = run(args.ops, args.out, opts)
    return code


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", help="card names (default: every card on the kernel search path)")
    p.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")


def _timing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", nargs="+", metavar="SIZE", help="sweep sizes, e.g. 4096 2**20 100x1024 (default: the spec's)")
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no launch overhead)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="include torch.compile(reference) (default: on with a GPU, off on a CPU)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--budget-ms", type=float, help="time budget per measurement (default 100 GPU / 50 CPU)")
    p.add_argument("--copy-floor", action="store_true",
                   help="also time a device copy of the same bytes in the same rounds: a measured floor")


def register(sub) -> None:
    """Add check, bench and run to the ``kernelkit`` command's subparsers; each sets ``func``."""
    c = sub.add_parser("check", help="check cards against their references")
    _common(c)
    c.add_argument("--device", help="cuda or cpu (default: cuda when available and implemented)")
    c.add_argument("--dtype", type=_dtype, action="append", help="dtype to check (repeatable; default: the spec's)")
    c.add_argument("--trials", type=int, default=5)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--large", action="store_true", help="also check > 2**31-element shapes (GPU memory!)")
    c.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="time cards against eager, torch.compile and the bandwidth floor")
    _common(b)
    _timing(b)
    b.add_argument("--device", help="cuda or cpu")
    b.add_argument("--dtype", type=_dtype, action="append", help="dtype (default: the spec's bench_dtype)")
    b.add_argument("--plot", metavar="DIR", help="write PNG plots here")
    b.add_argument("--json", metavar="FILE", help="write results as JSON")
    b.add_argument("--csv", metavar="FILE", help="write results as CSV")
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("run", help="the main job: build, check and bench every card; write a report directory")
    _common(r)
    _timing(r)
    r.add_argument("--out", default="kernelkit-report", help="report directory (default: ./kernelkit-report)")
    r.add_argument("--trials", type=int, default=5)
    r.add_argument("--arch", help="CUDA archs to build for (default: the GPU's; without one, the loader's default)")
    r.add_argument("--no-check", action="store_true")
    r.add_argument("--no-bench", action="store_true")
    r.add_argument("--quick", action="store_true", help="CI: 2 trials, 3 smallest sizes, 10 ms budgets")
    r.set_defaults(func=cmd_run)
