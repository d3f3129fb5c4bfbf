"""``kernelkit`` command line: cache management, listing and builds here; check/bench/run from the harness.

``--help``, ``--version``, ``list`` and ``cache`` do not import torch; the commands that need it import it
when they run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..errors import LOG_HINT, BuildError, KernelkitError
from ..harness import report
from ..jit import cache, store
from ..jit.cards import declared_sources, search_path
from ..version import __version__
from . import doctor, eval_command, harness_commands, ide, scaffold

DESCRIPTION = "Build, check and time the CUDA/C++ kernel cards on the search path, and manage the build cache."
EXAMPLES = """examples:
  kernelkit list                      the cards found, and where kernelkit looked
  kernelkit check sigmoid             check a card against its PyTorch reference
  kernelkit bench sigmoid --sizes 2**20 2**24
  kernelkit run --quick               build, check and time every card; write a report
  kernelkit new relu --backward       write a new card (a unary op with autograd) to edit
  kernelkit profile vector_add        its kernels under Nsight Compute: what limits them
  kernelkit doctor                    what is missing on this machine, and how to fix it
  kernelkit ide                       compile_commands.json and .pyi stubs of the builds, for editors
  kernelkit <command> --help          the options of one command"""


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "-"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _days(text: str) -> float:
    """A number of days >= 0 (a negative one would remove every entry, NaN none)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {text!r}")
    return value


def cmd_cache(args) -> int:
    if args.action == "info":
        i = cache.info()
        print(json.dumps(i) if args.json else _info_text(i))
    elif args.action == "list" and args.store:
        found = cache.store_entries(args.store)
        print(json.dumps(found, indent=1) if args.json else _store_text(args.store, found))
    elif args.action == "list":
        rows = cache.entries()
        print(json.dumps(rows, indent=1) if args.json else _entries_text(rows))
    elif args.action == "tuned":
        records = cache.tune_records()
        print(json.dumps(records, indent=1) if args.json else _tuned_text(records))
    elif args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.cache_dir()}")
    elif args.action == "gc":
        print(f"removed {cache.gc(args.max_age_days, max_bytes=cache.max_bytes())}")
    elif args.action == "verify":
        return _cache_verify(args)
    elif args.action == "keygen":
        return _cache_keygen(args)
    elif args.action == "why":
        return _cache_why(args)
    return 0


def _cache_why(args) -> int:
    """``kernelkit cache why CARD``: whether the caches hold the card's build, and what differs from the remote
    cache's nearest entry (docs/remote-cache.md)."""
    if not args.path:
        raise KernelkitError("kernelkit cache why CARD: name the card")
    from ..jit import cards, plan, remote

    card = cards.find(args.path, args.kernels_dir)
    target = plan.plan_card(card, args.arch, [], [], [], [])
    print(remote.why(target))
    return 0


def _cache_keygen(args) -> int:
    """``kernelkit cache keygen DIR``: an ed25519 pair that signs and verifies a remote cache's entries."""
    if not args.path:
        raise KernelkitError("kernelkit cache keygen DIR: name the directory to write the key pair to")
    from ..jit import remote

    private, public = remote.keygen(Path(args.path))
    print(f"wrote {private} (the writers' signing key: keep it secret) and {public} (hand it to the readers)")
    return 0


def _entries_text(rows: List[dict]) -> str:
    """The cached libraries, one line each."""
    if not rows:
        return "cache is empty"
    lines = [f"{'name':<24} {'key':<16} {'size':>9} {'built in':>9}  {'last used':<16}  origin"]
    for r in rows:
        secs = f"{r['build_seconds']:.1f} s" if r["build_seconds"] is not None else "-"
        origin = ("built here" if r.get("received_from_rank") is None else f"received from rank {r['received_from_rank']}")
        if r.get("fetched_from"):
            origin = f"fetched from {r['fetched_from']}"
        lines.append(f"{r['name']:<24} {r['key']:<16} {_size(r['size']):>9} {secs:>9}  {_when(r['last_used']):<16}  {origin}")
    return "\n".join(lines)


def _tuned_text(records: List[dict]) -> str:
    """The stored autotuning winners, one line each."""
    if not records:
        return "no tuning records (kernelkit.autotune stores one per op, device, dtype and shape bucket)"
    lines = []
    for r in records:
        best = ", ".join(f"{k}={v}" for k, v in r["best"].items())
        lines.append(f"{r.get('name', '?'):<20} {r.get('dtype', ''):<15} bucket {r.get('bucket', ''):<8} {best:<32} "
                     f"{r.get('median_us', float('nan')):9.2f} us  {r.get('device', '')}")
    return "\n".join(lines)


def _cache_verify(args) -> int:
    """``kernelkit cache verify``: 1 while a corrupt entry is left in the cache."""
    found = cache.verify(fix=args.fix)
    bad = [f for f in found if f["status"] != "ok"]
    if args.json:
        print(json.dumps(found, indent=1))
    for f in [] if args.json else bad:
        done = "removed" if f["removed"] else "left: in use" if args.fix else "would be removed by --fix"
        print(f"corrupt {f['kind']} {f['entry']}: {f['reason']} ({done})")
    if not args.json:
        print(f"{len(found) - len(bad)} entries ok, {len(bad)} corrupt")
        received = sum(1 for r in cache.entries() if r.get("received_from_rank") is not None)
        if received:
            print(f"{received} libraries were received from another rank of a group= job: verify checks that "
                  "they are the bytes recorded when they arrived, which matched the sha256 the sending rank "
                  "announced; it cannot tell what that rank compiled (docs/distributed.md, 'What a rank trusts')")
    return 1 if any(not f["removed"] for f in bad) else 0


def _store_text(name: str, found: List[dict]) -> str:
    """The entries of one store, oldest use first."""
    if not found:
        return f"no entries in the store {name}"
    lines = [f"{'entry':<60} {'size':>9}  last used"]
    for e in sorted(found, key=lambda e: e["last_used"]):
        lines.append(f"{e['entry']:<60} {_size(e['bytes']):>9}  {_when(e['last_used'])}")
    return "\n".join(lines)


def _info_text(i: dict) -> str:
    """The cache's path, size against its cap, and what takes the room, largest first."""
    cap = f" of {_size(i['max_bytes'])} (KERNELKIT_CACHE_MAX_SIZE: least recently used entries go past it)" \
        if i["max_bytes"] else " (no size cap)"
    lines = [f"path:      {i['path']}", f"size:      {_size(i['bytes'])}{cap}"]
    counts = {"libraries": i["libraries"], "objects": i["objects"], "precompiled headers": i["pch"]}
    for kind, n in i["kinds"].items():
        share = f"{100 * n / i['bytes']:3.0f}%" if i["bytes"] else "  -"
        count = f"  ({counts[kind]})" if kind in counts else ""
        lines.append(f"  {kind:<20} {_size(n):>9} {share}{count}")
    if i["bytes"] and i["kinds"].get("precompiled headers", 0) > i["bytes"] / 2:
        lines.append("precompiled headers take most of it: one per set of compile flags, ~0.5-0.9 GB each "
                     "(KERNELKIT_PCH=off builds none; host compiles are then slower)")
    lines.append("stores (`kernelkit cache list --store NAME` lists one's entries):")
    for st in i["stores"]:
        where = "(in no row's place)" if st["name"] == store.UNCLAIMED.name else \
            "(the cache root)" if st["folder"] == "." else st["folder"] + "/"
        lines.append(f"  {st['name']:<17} {where:<25} {st['entries']:>6} {_size(st['bytes']):>9}  gc: {st['gc']}")
    return "\n".join(lines)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def _cards_in(d: Path, taken) -> List[dict]:
    """The cards of one directory, by the rules of cards.all_cards (a file that another card's spec lists
    besides its own is a part of that card, not a card)."""
    names = dict.fromkeys(f.stem for f in sorted(d.iterdir())
                          if f.suffix in (".cu", ".cpp") and f.stem.isidentifier() and f.stem not in taken)
    rows, parts = [], set()
    for name in names:
        spec_file = d / f"{name}.py"
        spec_file = spec_file if spec_file.is_file() else None
        sources = declared_sources(name, d, note=_note)
        own = {d / f"{name}{ext}" for ext in (".cu", ".cpp")}
        if spec_file is not None:
            parts |= {(d / s).resolve() for s in sources} - own
        rows.append(({"name": name, "dir": str(d), "sources": sources, "cuda": any(s.endswith(".cu") for s in sources),
                      "spec": str(spec_file) if spec_file else None}, own))
    return [row for row, own in rows if row["spec"] or not own & parts]


def list_cards(kernels_dir=None) -> Tuple[List[Path], List[dict]]:
    """(the directories searched, one row per card on the search path), without importing the specs."""
    dirs = search_path(kernels_dir)
    found: Dict[str, dict] = {}
    for d in dirs:
        if d.is_dir():
            for row in _cards_in(d, found):
                found.setdefault(row["name"], row)
    return dirs, [found[n] for n in sorted(found)]


def cmd_list(args) -> int:
    dirs, rows = list_cards(args.kernels_dir)
    if args.json:
        print(json.dumps({"searched": [str(d) for d in dirs], "cards": rows}, indent=1))
        return 0
    searched = ", ".join(str(d) + ("" if d.is_dir() else " (missing)") for d in dirs)
    print(f"searched: {searched}")
    if not rows:
        print("no cards found (a card is <op>.cu or <op>.cpp, with <op>.h and optionally <op>.py)")
        return 0
    table = [(r["name"], "yes" if r["cuda"] else "no", "yes" if r["spec"] else "no", " ".join(r["sources"]), r["dir"])
             for r in rows]
    print(report.text_table(("card", "cuda", "spec", "sources", "directory"), table))
    return 0


def cmd_build(args) -> int:
    """Fill the cache without loading (works without a GPU, given --arch)."""
    from .. import loading

    failed = 0
    for card in harness_commands.find_cards(args.ops, args.kernels_dir):
        try:
            harness_commands.card_spec(card)
            info = loading.load(card.name, kernels_dir=args.kernels_dir, arch=args.arch, load=False)
            how = "cached" if info.cached else f"built in {info.build_seconds:.1f} s"
            print(f"{card.name:<24} {info.key[:16]}  {how}  {info.path}")
        except KernelkitError as e:
            failed += 1
            print(f"{card.name}: {_for_the_terminal(e)}", file=sys.stderr)
    return 1 if failed else 0


def cmd_inspect(args) -> int:
    """A card's compile report, or its SASS/PTX (optionally as a diff against its previous build)."""
    from .. import inspect as kk_inspect

    if args.sass or args.ptx:
        print(kk_inspect.code(args.card, "ptx" if args.ptx else "sass", diff=args.diff, arch=args.arch,
                              kernels_dir=args.kernels_dir))
        return 0
    rep = kk_inspect.report(args.card, args.block_size, arch=args.arch, kernels_dir=args.kernels_dir)
    print(rep)
    if args.diff and not rep.changes:
        print("no change in registers, spills, stack, shared memory or occupancy since the previous build"
              if rep.previous else "no previous build is known to compare with")
    return 0


def cmd_profile(args) -> int:
    """A card's kernels under Nsight Compute: the table (or JSON), and optionally the roofline as PNG."""
    from ..inspect.profiling import profile

    inputs = {k: v for k, v in (("size", args.size), ("dtype", args.dtype)) if v is not None}
    result = profile(args.card, kernels_dir=args.kernels_dir, **inputs)
    print(json.dumps(result.to_dict(), indent=1) if args.json else result)
    if args.plot:
        result.plot(args.plot)
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _block_size(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected a number of threads per block, 1..1024, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelkit", description=DESCRIPTION, epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kernelkit {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _add_cards_and_cache(sub)
    _add_inspect_and_profile(sub)
    for commands in (harness_commands, scaffold, doctor, ide, eval_command):  # check, bench, run; new; doctor; ide; eval
        commands.register(sub)
    return p


def _add_cards_and_cache(sub) -> None:
    """``kernelkit list``, ``cache`` and ``build``."""
    ls = sub.add_parser("list", help="the cards on the kernel search path (without importing torch)",
                        description="List the cards on the kernel search path. Each spec's Spec(..., sources=[...]) "
                        "is read without running it; a spec that computes its sources is imported (with torch).")
    ls.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_list)

    c = sub.add_parser("cache", help="inspect or clean the build cache")
    c.add_argument("action", choices=["list", "info", "tuned", "clear", "gc", "verify", "keygen", "why"])
    c.add_argument("path", nargs="?", help="keygen: the directory to write a remote cache's signing key pair to; "
                   "why: the card whose build the local and remote caches hold or not, and why (docs/remote-cache.md)")
    c.add_argument("--arch", type=harness_commands.arch_spec, help="why: CUDA archs, e.g. '9.0' (default: the "
                   "current GPU, else 9.0)")
    c.add_argument("--kernels-dir", help="why: directory of cards (default: KERNELKIT_PATH + built-in)")
    c.add_argument("--fix", action="store_true", help="verify: remove the corrupt entries it finds")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--max-age-days", type=_days, default=30.0, help="gc: remove entries unused this long")
    c.add_argument("--store", choices=[row.name for row in store.STORES] + [store.UNCLAIMED.name],
                   help="list: the entries of one store of the cache (default: the libraries)")
    c.set_defaults(func=cmd_cache)

    b = sub.add_parser("build", help="compile cards into the cache without loading them")
    b.add_argument("ops", nargs="*", help="card names (default: all)")
    b.add_argument("--arch", type=harness_commands.arch_spec, help="CUDA archs, e.g. '8.0;9.0' (default: the current GPU, else 9.0)")
    b.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    b.set_defaults(func=cmd_build)


def _add_inspect_and_profile(sub) -> None:
    """``kernelkit inspect`` and ``profile``: what a card's compiled kernels use, and what limits them on the GPU."""
    ins = sub.add_parser("inspect", help="a card's registers, spills, shared memory and occupancy; its SASS/PTX",
                         description="Build the card if needed (no GPU needed with --arch) and show its compile report "
                         "read from the cached binary, or its code. Needs NVIDIA's cuobjdump (CUDA toolkit, or "
                         "pip install 'kernelkit[inspect]').")
    ins.add_argument("card", help="card name (or the path of a card's .cu, or of a cubin/object/library)")
    ins.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    ins.add_argument("--arch", type=harness_commands.arch_spec, help="CUDA arch, e.g. 9.0 (default: the current GPU, else 9.0)")
    view = ins.add_mutually_exclusive_group()
    view.add_argument("--sass", action="store_true", help="print the SASS instead of the report")
    view.add_argument("--ptx", action="store_true", help="print the PTX (builds embed it only with arch '9.0+PTX')")
    ins.add_argument("--diff", action="store_true", help="against the previous build of the card")
    ins.add_argument("--block-size", type=_block_size, help="threads per block for the occupancy column (default 256)")
    ins.set_defaults(func=cmd_inspect)

    prof = sub.add_parser("profile", help="a card's kernels under Nsight Compute: time, DRAM/L2/SM throughput, "
                          "occupancy, the limiter, a roofline",
                          description="Run the card once (after a warm-up) in a fresh process under Nsight Compute "
                          "(ncu: KERNELKIT_NCU, PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*/) and show "
                          "per kernel launch what limits it. Needs a CUDA GPU and permission to read its counters.")
    prof.add_argument("card", help="card name")
    prof.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    prof.add_argument("--size", type=harness_commands.parse_size,
                      help="input size, e.g. 2**28 or 100x1024 (default: the spec's largest bench size)")
    prof.add_argument("--dtype", type=harness_commands._dtype, help="input dtype (default: the spec's bench dtype)")
    prof.add_argument("--json", action="store_true", help="machine-readable output")
    prof.add_argument("--plot", metavar="PATH", help="write the roofline plot here (PNG)")
    prof.set_defaults(func=cmd_profile)


def _for_the_terminal(e: KernelkitError) -> str:
    """A build error's message with its full log in a file (an attribute of the exception means nothing here)."""
    if not isinstance(e, BuildError) or not e.log:
        return str(e)
    fd, path = tempfile.mkstemp(prefix="kernelkit-build-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(e.log)
    return str(e).replace(LOG_HINT, f"(full compiler output: {path})")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `kernelkit cache list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail too
        return 0
    except KernelkitError as e:  # the user's mistake or the card's, said in their terms; other errors are bugs
        print(f"kernelkit {args.command}: {_for_the_terminal(e)}", file=sys.stderr)
        return 2 if isinstance(e, harness_commands.UsageError) else 1


if __name__ == "__main__":
    sys.exit(main())
