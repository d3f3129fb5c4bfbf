"""``kernelkit eval CANDIDATES... --ref REF``: judge many candidate kernels for one problem in strict mode.

Registered on the main CLI's subparsers; importing this module does not import torch.
"""
from __future__ import annotations

import argparse
import sys

from .harness_commands import UsageError, _device

FORMAT = """candidate format (docs/strict.md):
  REF        a Python file defining inputs(seed, device) -> tuple and reference(*inputs); optional
             TOLERANCE = (rtol, atol), MUTATES = (input indices the op may write), NAME
  CANDIDATE  a Python file defining forward(*inputs) (it may build a kernel with kernelkit.load_inline),
             a .cu/.cpp file defining torch::Tensor forward(...), or inline Python source"""


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
        return value
    return parse


def cmd_eval(args) -> int:
    """Evaluate each candidate; print a table and write the rows. Exit 0 once every row is written (the rows
    carry the verdicts); 2 when the problem itself cannot be used."""
    from ..harness.strict.evaluation import Options, evaluate, table, write_csv, write_json
    from ..harness.strict.process import Limits

    options = Options(device=args.device, trials=args.trials, budget_ms=args.budget_ms, verify=args.verify,
                      limits=Limits(timeout_s=args.timeout, memory_mb=args.memory_mb))
    try:
        rows = evaluate(args.candidates, args.ref, options, progress=lambda r: print(
            f"{r.candidate}: {'correct' if r.correct else 'REJECTED'}"
            + (f", {r.speedup:.2f}x" if r.speedup else "") + (f" ({r.reason.splitlines()[0][:160]})" if r.reason else ""),
            file=sys.stderr))
    except (ValueError, FileNotFoundError, ImportError, SyntaxError, AttributeError) as e:
        raise UsageError(f"--ref {args.ref}: {e}") from None
    print(table(rows))
    for path, write in ((args.json, write_json), (args.csv, write_csv)):
        if path:
            print(f"wrote {write(rows, path)}")
    return 0


def register(sub) -> None:
    """Add ``eval`` to the ``kernelkit`` command's subparsers."""
    e = sub.add_parser("eval", help="judge candidate kernels for one problem in strict mode: one row each",
                       description="Build, check and time each candidate in a process of its own (strict mode: "
                       "fresh inputs, verified timed calls, no access to the checker), under a time and memory "
                       "limit; a candidate that crashes or hangs costs only its row.", epilog=FORMAT,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("candidates", nargs="+", metavar="CANDIDATE", help="candidate files (or inline Python source)")
    e.add_argument("--ref", required=True, help="the problem's reference file")
    e.add_argument("--device", type=_device, help="cpu, cuda or cuda:N (default: cuda when available)")
    e.add_argument("--trials", type=_positive(int), default=5, help="check calls per candidate (default 5)")
    e.add_argument("--budget-ms", type=_positive(float), help="timed calls' budget (default 100 GPU / 50 CPU)")
    e.add_argument("--verify", type=_positive(int), default=8, help="timed calls whose outputs are verified (default 8)")
    e.add_argument("--timeout", type=_positive(float), default=300.0, help="seconds per candidate (default 300)")
    e.add_argument("--memory-mb", type=_positive(int), help="memory per candidate in MiB (default: no limit)")
    e.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    e.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    e.set_defaults(func=cmd_eval)
