"""``kernelkit check``, ``kernelkit bench``, ``kernelkit run`` and ``kernelkit tune``: registered on the main CLI's subparsers.

Importing this module does not import torch (``kernelkit --help`` stays fast); each command imports it when
it runs.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from typing import List, Optional, Sequence, Tuple

from ..errors import KernelkitError, SpecError
from ..jit.cards import Card, all_cards, search_path

_DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
           "fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16",
           "half": "float16", "float": "float32", "double": "float64"}


STRICT_HELP = "for a kernel that may cheat: run it in a process of its own on fresh inputs, verify timed calls (docs/strict.md)"


class UsageError(KernelkitError):
    """The command line asks for something this machine or search path does not have (exit code 2)."""


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
    if values is None:
        return None
    try:
        sizes = [parse_size(t) for v in values for t in v.split(",") if t.strip()]
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--sizes: {e}") from None
    if not sizes:  # an empty sweep would print an empty table
        raise UsageError(f"--sizes: expected at least one size (e.g. 4096, 2**20, 100x1024), got {' '.join(values)!r}")
    return sizes


def arch_spec(text: str) -> str:
    """An --arch value, checked as the loader reads it ('9.0', '8.0;9.0+PTX', 'sm_90a')."""
    from ..jit.toolchain import parse_arch_list  # imports torch: only when the option is given

    try:
        parse_arch_list(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("arch: ", "")) from None
    return text


def _dtype(text: str) -> str:
    """A --dtype's torch name, checked without torch (a mistake is answered before torch's import)."""
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: one of {', '.join(_DTYPES)}") from None


def _torch_dtypes(names: Optional[List[str]]):
    import torch

    return [getattr(torch, n) for n in names] if names else None


def _trials(text: str) -> int:
    """--trials: an integer >= 1 (zero trials would check nothing and pass)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}: fewer than one trial checks nothing")
    return value


def _device(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: expected cpu, cuda or cuda:N")
    return text


def check_device(device: Optional[str]) -> None:
    """Fail early, in one line, when ``device`` names a CUDA GPU that this machine does not have."""
    if device is None or not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count()
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        raise UsageError(f"--device {device}: no CUDA GPU is visible: run with --device cpu, or leave --device "
                         "out to run each card on the CPU where it has a CPU implementation")
    if index >= count:
        raise UsageError(f"--device {device}: only {count} CUDA GPU(s) are visible (cuda:0 to cuda:{count - 1})")


def find_cards(names: Sequence[str], kernels_dir=None) -> List[Card]:
    """The cards called ``names`` (all cards on the search path when empty); an unknown name is a
    UsageError that says which directories were searched."""
    # a name that no .cu/.cpp on the path carries is answered without importing the specs (and torch)
    stems = {f.stem for d in search_path(kernels_dir) if d.is_dir() for f in d.iterdir() if f.suffix in (".cu", ".cpp")}
    found = all_cards(kernels_dir) if set(names) <= stems else {s: None for s in stems if s.isidentifier()}
    missing = [n for n in names if n not in found]
    if missing:
        searched = ", ".join(str(d) for d in search_path(kernels_dir))
        have = ", ".join(sorted(found)) or "none"
        raise UsageError(f"no card named {', '.join(map(repr, missing))}: searched {searched} (cards found: {have}; "
                         "`kernelkit list` shows them)")
    return [found[n] for n in names or sorted(found)]


def card_spec(card: Card):
    """``card.spec``: a spec that fails to import raises a one-line SpecError naming its file and line."""
    return card.spec


def _targets(args) -> List[tuple]:
    """(name, spec, op, device) for each requested card, loading it; a card that cannot run says why on
    stderr and comes back as (name, None, None, None) when that is a failure, or not at all when a skip."""
    cards = find_cards(args.ops, args.kernels_dir)  # a mistyped name is answered before torch's import
    from ..harness.target import default_device, resolve

    check_device(args.device)
    out = []
    for card in cards:
        try:
            spec = card_spec(card)
        except SpecError as e:
            print(e, file=sys.stderr)
            out.append((card.name, None, None, None))
            continue
        if spec is None:
            print(f"{card.name}: no spec (kernels/<op>.py): nothing to run", file=sys.stderr)
            out.append((card.name, None, None, None))
            continue
        device = args.device or default_device(spec)
        if device is None:
            print(f"{card.name}: SKIPPED - implemented for {list(spec.devices)} only and no CUDA GPU is available "
                  f"(`kernelkit build {card.name}` compiles it)", file=sys.stderr)
            continue
        target = resolve(card.name, kernels_dir=args.kernels_dir, device=device)
        out.append((card.name, target.spec, target.op, device))
    return out


def cmd_check(args) -> int:
    targets = _targets(args)
    from ..harness.check import check

    status = 0
    for name, spec, op, device in targets:
        if spec is None:
            status = 1
            continue
        res = check(name if args.strict else op, spec=spec, device=device, dtypes=_torch_dtypes(args.dtype),
                    trials=args.trials, seed=args.seed, large=args.large, contract=not args.no_contract,
                    strict=args.strict, kernels_dir=args.kernels_dir)
        print(repr(res) + "\n")
        status |= 0 if res.ok else 1
    return status


def cmd_bench(args) -> int:
    sizes = _sizes(args.sizes)  # a bad --sizes fails before any card is built, and before torch's import
    targets = _targets(args)
    from ..harness.bench import bench, write_csv

    results, status = [], 0
    for name, spec, op, device in targets:
        if spec is None:
            status = 1
            continue
        res = bench(name if args.strict else op, spec=spec, device=device, sizes=sizes,
                    dtype=args.dtype and _torch_dtypes(args.dtype)[0], compile=args.compile, graph=args.graph,
                    budget_ms=args.budget_ms, copy_floor=args.copy_floor, max_numel=math.inf if args.all_sizes else None,
                    strict=args.strict, kernels_dir=args.kernels_dir)
        status |= 1 if args.strict and not res.strict_check.ok else 0
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
    sizes = _sizes(args.sizes)
    find_cards(args.ops, args.kernels_dir)  # a mistyped name fails now, not after building the others (or torch)
    from ..harness.runner import Options, run

    opts = Options(check=not args.no_check, bench=not args.no_bench, trials=args.trials, sizes=sizes,
                   compile=args.compile, graph=args.graph, budget_ms=args.budget_ms, arch=args.arch,
                   kernels_dir=args.kernels_dir, quick=args.quick, copy_floor=args.copy_floor, full=args.full)
    code, _ = run(args.ops, args.out, opts)
    return code


def cmd_tune(args) -> int:
    """Tune each named card over its ``Spec.tune`` space; print the table (exit 1 when nothing passed)."""
    from ..harness.tune import autotune

    check_device(args.device)
    status = 0
    for card in find_cards(args.ops, args.kernels_dir):
        spec = card_spec(card)
        if spec is None or not spec.tune:
            print(f"{card.name}: its Spec has no tune={{...}} space (parameter -> values, passed as -D flags)")
            status = 1
            continue
        try:
            result = autotune(card.name, kernels_dir=args.kernels_dir, device=args.device, retune=args.retune,
                              shape=parse_size(args.size) if args.size else None)
        except ValueError as e:
            print(e)
            status = 1
            continue
        print(result.table() + "\n")
    return status


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
    c.add_argument("--device", type=_device, help="cpu, cuda or cuda:N (default: cuda when available and implemented)")
    c.add_argument("--dtype", type=_dtype, action="append", help="dtype to check (repeatable; default: the spec's)")
    c.add_argument("--trials", type=_trials, default=5)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--large", action="store_true", help="also check > 2**31-element shapes (GPU memory!)")
    c.add_argument("--no-contract", action="store_true",
                   help="skip the op contract (opcheck, torch.compile, CUDA graph, current stream)")
    c.add_argument("--strict", action="store_true", help=STRICT_HELP)
    c.set_defaults(func=cmd_check)

    b = sub.add_parser("bench", help="time cards against eager, torch.compile and the bandwidth floor")
    _common(b)
    _timing(b)
    b.add_argument("--device", type=_device, help="cpu, cuda or cuda:N (default: as for check)")
    b.add_argument("--dtype", type=_dtype, action="append", help="dtype (default: the spec's bench_dtype)")
    b.add_argument("--all-sizes", action="store_true",
                   help="on a CPU, time the spec's whole sweep (default: sizes up to 2**22 elements)")
    b.add_argument("--plot", metavar="DIR", help="write PNG plots here")
    b.add_argument("--json", metavar="FILE", help="write results as JSON")
    b.add_argument("--csv", metavar="FILE", help="write results as CSV")
    b.add_argument("--strict", action="store_true", help=STRICT_HELP)
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("run", help="the main job: build, check and bench every card; write a report directory")
    _common(r)
    _timing(r)
    r.add_argument("--out", default="kernelkit-report", help="report directory (default: ./kernelkit-report)")
    r.add_argument("--trials", type=_trials, default=5)
    r.add_argument("--arch", type=arch_spec, help="CUDA archs to build for (default: the GPU's; without one, the loader's default)")
    r.add_argument("--no-check", action="store_true")
    r.add_argument("--no-bench", action="store_true")
    r.add_argument("--quick", action="store_true", help="CI: 2 trials, 3 smallest sizes, 10 ms budgets")
    r.add_argument("--full", action="store_true",
                   help="every bench size of each card at bench's budget (default: 5 sizes spread over the sweep, "
                   "50 ms budgets)")
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("tune", help="choose the fastest correct configuration of each card's Spec.tune space")
    _common(t)
    t.add_argument("--device", type=_device, help="cpu, cuda or cuda:N (default: cuda when available)")
    t.add_argument("--size", metavar="SIZE", help="the size to time, e.g. 2**20 (default: the largest bench size)")
    t.add_argument("--retune", action="store_true", help="tune again even where a winner is stored")
    t.set_defaults(func=cmd_tune)
