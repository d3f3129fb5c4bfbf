"""IPython integration: ``%load_ext kernelkit`` then

    %%kernelkit NAME [--functions f g] [--arch 9.0] [--flags -DX=1] [--cuda-flags ...] [--cpp]
    <CUDA device code, torch-free>
    // --- binding ---
    <C++ binding: declarations, torch wrappers, KERNELKIT_LIBRARY(m) {...} or --functions>

compiles the cell through ``kernelkit.load_inline`` and binds the library as ``NAME`` and each of its ops
and functions by name in the notebook. Re-running an edited cell hot-reloads it. Compiler errors name
the cell's own line numbers. ``--cpp`` makes the whole cell C++ (CPU code, no CUDA).
"""
from __future__ import annotations

import argparse
import re
import shlex
from typing import Optional, Tuple

from pathlib import Path
from typing import Dict

from ..jit import api

#: name -> (line, cell) of the last %%kernelkit cell run with that name
CELLS: Dict[str, Tuple[str, str]] = {}

SEPARATOR = re.compile(r"^\s*//\s*-{2,}\s*binding\s*-{2,}\s*$", re.M)


def split_cell(cell: str, cpp_only: bool) -> Tuple[Optional[str], Optional[str]]:
    """(cuda, cpp), each padded with blank lines so that compiler line numbers are the cell's as the
    notebook shows them (line 1 is the %%kernelkit line itself)."""
    if cpp_only:
        return None, "\n" + cell
    m = SEPARATOR.search(cell)
    if m is None:
        return "\n" + cell, None
    separator_line = cell[: m.end()].count("\n") + 2  # as shown: after the %%kernelkit line
    return "\n" + cell[: m.start()], "\n" * separator_line + cell[m.end() + 1:]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%kernelkit", add_help=False)
    p.add_argument("name")
    p.add_argument("--functions", nargs="+", default=None)
    p.add_argument("--arch", default=None)
    p.add_argument("--flags", nargs="+", default=None, help="extra C++ compiler flags")
    p.add_argument("--cuda-flags", nargs="+", default=None, help="extra nvcc flags")
    p.add_argument("--cpp", action="store_true", help="the whole cell is C++ (no CUDA)")
    return p


def kernelkit_cell(line: str, cell: str, user_ns: dict):
    try:
        args = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise ValueError("usage: %%kernelkit NAME [--functions f g] [--arch 9.0] [--flags ...] "
                         "[--cuda-flags ...] [--cpp]") from None
    cuda, cpp = split_cell(cell, args.cpp)
    if cuda is not None and cpp is None and not args.functions:
        raise ValueError("%%kernelkit: a CUDA cell needs a '// --- binding ---' line followed by the "
                         "torch-facing C++ (or --cpp for a C++-only cell)")
    lib = api.load_inline(args.name, cuda=cuda, cpp=cpp, functions=args.functions, arch=args.arch,
                          extra_cflags=args.flags, extra_cuda_cflags=args.cuda_flags)
    CELLS[args.name] = (line, cell)
    user_ns[args.name] = lib
    for fn in lib.functions():
        user_ns[fn] = getattr(lib, fn)
    return None


def last_cell(name: str) -> str:
    """The source of the last ``%%kernelkit NAME`` cell that compiled (to edit it from code)."""
    if name not in CELLS:
        raise KeyError(f"no %%kernelkit {name} cell has run in this session")
    return CELLS[name][1]


def promote(name: str, directory) -> Path:
    """Write the last ``%%kernelkit NAME`` cell as a card (``NAME.cu`` + ``NAME.h``) in ``directory``,
    ready for ``kernelkit.load(NAME, kernels_dir=directory)``. Returns the card's .h path."""
    line, cell = CELLS[name] if name in CELLS else (None, None)
    if cell is None:
        raise KeyError(f"no %%kernelkit {name} cell has run in this session")
    cpp_only = "--cpp" in shlex.split(line)
    m = None if cpp_only else SEPARATOR.search(cell)
    cuda, binding = (None, cell) if cpp_only else (cell[: m.start()], cell[m.end() + 1:]) if m else (cell, "")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    header = d / f"{name}.h"
    header.write_text(f"// {name}: promoted from a %%kernelkit cell\n#pragma once\n#ifdef KERNELKIT_BINDING\n"
                      f"{binding.rstrip()}\n#endif  // KERNELKIT_BINDING\n")
    if cuda is not None:
        (d / f"{name}.cu").write_text(cuda)
    else:  # a C++-only card: its source is the header's binding; an empty TU keeps the card shape
        (d / f"{name}.cpp").write_text(f'#include "{name}.h"\n')
    return header


def register(ipython) -> None:
    def cell_magic(line, cell):
        return kernelkit_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(cell_magic, magic_kind="cell", magic_name="kernelkit")
    api.autoreload(True)  # edited card files are reloaded before each cell
