"""``kernelkit`` command line: cache management and builds here; check/bench/run from the harness."""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import List, Optional

from . import cache


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "-"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_cache(args) -> int:
    if args.action == "info":
        i = cache.info()
        if args.json:
            print(json.dumps(i))
        else:
            print(f"path:      {i['path']}\nlibraries: {i['libraries']}\nobjects:   {i['objects']}\nsize:      {_size(i['bytes'])}")
    elif args.action == "list":
        rows = cache.entries()
        if args.json:
            print(json.dumps(rows, indent=1))
        elif not rows:
            print("cache is empty")
        else:
            print(f"{'name':<24} {'key':<16} {'size':>9} {'built in':>9}  {'last used':<16}")
            for r in rows:
                secs = f"{r['build_seconds']:.1f} s" if r["build_seconds"] is not None else "-"
                print(f"{r['name']:<24} {r['key']:<16} {_size(r['size']):>9} {secs:>9}  {_when(r['last_used']):<16}")
    elif args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.cache_dir()}")
    elif args.action == "gc":
        print(f"removed {cache.gc(args.max_age_days)}")
    return 0


def cmd_build(args) -> int:
    """Fill the cache without loading (works without a GPU, given --arch)."""
    from . import api, cards
    from .errors import KernelkitError

    names = args.ops or sorted(cards.all_cards(args.kernels_dir))
    failed = 0
    for name in names:
        try:
            info = api.load(name, kernels_dir=args.kernels_dir, arch=args.arch, load=False)
            how = "cached" if info.cached else f"built in {info.build_seconds:.1f} s"
            print(f"{name:<24} {info.key[:16]}  {how}  {info.path}")
        except KernelkitError as e:
            failed += 1
            print(f"{name}: {e}", file=sys.stderr)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelkit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("cache", help="inspect or clean the build cache")
    c.add_argument("action", choices=["list", "info", "clear", "gc"])
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--max-age-days", type=float, default=30.0, help="gc: remove entries unused this long")
    c.set_defaults(func=cmd_cache)

    b = sub.add_parser("build", help="compile cards into the cache without loading them")
    b.add_argument("ops", nargs="*", help="card names (default: all)")
    b.add_argument("--arch", help="CUDA archs, e.g. '8.0;9.0' (default: the current GPU, else 9.0)")
    b.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    b.set_defaults(func=cmd_build)

    from . import harness_cli

    harness_cli.register(sub)  # check, bench, run
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
