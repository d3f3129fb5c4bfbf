"""``kernelkit ide``: what editors and type checkers need to see the builds: compile_commands.json (and .clangd) for
clangd, .pyi stubs for kernelkit.ops and torch-style extension modules."""
from __future__ import annotations

import sys
from pathlib import Path

HELP = "write compile_commands.json and .pyi stubs of the builds, for clangd and type checkers"
DESCRIPTION = (
    "Write compile_commands.json (each translation unit with the command kernelkit ran; a split torch .cu under its "
    "own path; each local header they include, with an including TU's flags) and a .clangd that lets clangd take nvcc's commands into DIR, and .pyi stubs into DIR/typings: "
    "kernelkit/ops.pyi from each op's schema, <name>.pyi for each torch-style extension module from pybind11's "
    "signatures. Point pyright's stubPath or mypy's mypy_path at DIR/typings. Reads the cache: build or load first. "
    "Set KERNELKIT_COMPILE_COMMANDS=DIR to keep the database current on every build.")


def cmd_ide(args) -> int:
    from ..editors import ide  # imports torch: only when the command runs

    try:
        done = ide.write(args.names, Path(args.out))
    except OSError as e:
        print(f"kernelkit ide: cannot write into {args.out}: {e}", file=sys.stderr)
        return 1
    print(f"{done.database}: {done.files} file(s) and {done.headers} header(s) of "
          f"{', '.join(done.builds) or 'no build'}")
    for path in done.stubs:
        print(f"{path}")
    if done.unrecorded:
        print("no command recorded (compiled before kernelkit kept them: clear the cache or edit to rebuild): "
              + "; ".join(done.unrecorded))
    for note in done.notes:
        print(note)
    return 0


def register(sub) -> None:
    """Add the ``ide`` subcommand to the ``kernelkit`` parser's subparsers."""
    p = sub.add_parser("ide", help=HELP, description=DESCRIPTION)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="cards, extensions and cells, by name (default: the newest build of every name in the cache)")
    p.add_argument("--out", default=".", metavar="DIR",
                   help="where to write (default: the current directory; clangd reads .clangd in the sources' "
                        "folders and theirs above, so your project's root)")
    p.set_defaults(func=cmd_ide)
