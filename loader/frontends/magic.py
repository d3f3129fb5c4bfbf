"""IPython integration: ``%load_ext kernelkit`` then

    %%kernelkit NAME [--functions f g] [--arch 9.0] [--flags -DX=1 -O3] [--cuda-flags ...] [--cpp]
    <CUDA device code, torch-free>
    // --- binding ---
    <C++ binding: declarations, torch wrappers, KERNELKIT_LIBRARY(m) {...} or --functions>

compiles the cell through ``kernelkit.load_inline`` and binds the library as ``NAME`` and each of its ops
and functions by name in the notebook. Re-running an edited cell hot-reloads it. Compiler errors name
the cell's own line numbers. ``--cpp`` makes the whole cell C++ (CPU code, no CUDA).

    %%kernelkit NAME --kernels [--arch 9.0] [--flags -DBLOCK=256]
    <kernel-only CUDA C++: __global__ functions and device helpers>

compiles the cell in-process with NVRTC (``kernelkit.load_kernels``, tens of milliseconds) and binds the
module as ``NAME``: ``NAME.my_kernel[grid, block](tensor, ..., n)``.

    %%kernelkit NAME --kernels --tune VAR [--arch 9.0] [--flags ...]

tunes that cell (``kernelkit.harness.tune.tuned``): ``VAR`` is the notebook's dict with ``space`` (name ->
values, each configuration compiled with ``-D<name>=<value>``), ``launch(kernels, config, *args)`` (runs one
configuration's module), ``reference`` and ``inputs`` (as for ``kernelkit.autotune``; more of its keywords may
follow). ``NAME`` is then an op that runs, per call, the checked winner for its shape bucket.

``NAME`` must be a Python identifier that is free in the notebook or bound to what kernelkit made (a
library, an instant-kernels module, or what an earlier cell bound): a cell never shadows a module such as
``torch`` or the notebook's own variables. ``--flags``/``--cuda-flags`` take every value up to the next of
the magic's own options (``--flags -DX=1 -O3``), and repeat (``--flags -DX=1 --flags -DY=2``); a value
spelled like one of those options is written ``--flags=--arch``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import keyword
import re
import shlex
import sys
import types
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from .. import device_output as _capture
from .. import inspect as kk_inspect
from .. import loading, settings
from ..errors import BuildError, KernelkitError
from ..harness import tune
from ..instant.kernels import KernelModule, load_kernels, loaded_modules
from ..jit import registry, syntax
from ..jit.library import Library
from ..jit.sources import sha256_bytes

#: name -> (line, cell) of the last %%kernelkit cell run with that name
CELLS: Dict[str, Tuple[str, str]] = {}
#: (id of a user namespace, name) -> what a cell bound there last: a re-run cell may rebind it
_BOUND: Dict[Tuple[int, str], object] = {}
_OPTIONS = ("--functions", "--arch", "--flags", "--cuda-flags", "--cpp", "--kernels", "--tune")
_VALUE_LISTS = ("--flags", "--cuda-flags")  # their values are compiler flags, which start with '-'

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


_CUDA_TOKENS = ("__global__", "__device__", "<<<", "__shared__")


def cpp_only(line: str, cell: str) -> bool:
    """Whether the cell is all C++: ``--cpp``, or no binding separator and nothing only nvcc compiles (a
    KERNELKIT_LIBRARY cell written like the README's CPU example goes to the C++ compiler)."""
    return "--cpp" in shlex.split(line) or (SEPARATOR.search(cell) is None and "--kernels" not in shlex.split(line)
                                            and syntax.first_cuda_token(cell, _CUDA_TOKENS) is None)


_USAGE = ("usage: %%kernelkit NAME [--functions f g] [--arch 9.0] [--flags -DX=1 ...] [--cuda-flags ...] "
          "[--cpp | --kernels [--tune VAR]]")


class _CellArguments(argparse.ArgumentParser):
    """Its error is one ValueError (the message and the usage, said once), not argparse's print and exit."""

    def error(self, message):
        raise ValueError(f"%%kernelkit: {message}\n{_USAGE}")


def _parser() -> argparse.ArgumentParser:
    p = _CellArguments(prog="%%kernelkit", add_help=False)
    p.add_argument("name", help="the library's name; it is bound under this name (its ops under theirs)")
    p.add_argument("--functions", nargs="+", action="extend", default=None, help="C++ functions to bind with pybind11")
    p.add_argument("--arch", default=None, help="CUDA archs, e.g. 9.0 (default: the current GPU)")
    p.add_argument("--flags", action="append", default=None,
                   help="extra C++ compiler flags (NVRTC options with --kernels), e.g. --flags -DX=1 -O3")
    p.add_argument("--cuda-flags", action="append", default=None, help="extra nvcc flags, e.g. --cuda-flags -lineinfo")
    p.add_argument("--cpp", action="store_true", help="the whole cell is C++ (no CUDA)")
    p.add_argument("--kernels", action="store_true", help="kernel-only CUDA compiled with NVRTC (instant kernels)")
    p.add_argument("--tune", default=None, metavar="VAR",
                   help="with --kernels: tune the cell over the notebook's dict VAR (space, launch, reference, inputs)")
    return p


def _tokens(line: str) -> List[str]:
    """The magic line's words, each value of ``--flags``/``--cuda-flags`` attached to its option
    (``--flags=-DX=1``) so that argparse reads it as a value: the values run up to the next of the magic's
    own options."""
    out: List[str] = []
    taking, got = None, 0
    for token in shlex.split(line) + ["--end"]:
        if token == "--end" or token.split("=", 1)[0] in _OPTIONS:
            if taking is not None and got == 0:
                out.append(taking)  # no value: argparse reports the usage error
            taking, got = (token, 0) if token in _VALUE_LISTS else (None, 0)
            if taking is None and token != "--end":
                out.append(token)
        elif taking is not None:
            out.append(f"{taking}={token}")
            got += 1
        else:
            out.append(token)
    return out


def _check_name(name: str, user_ns: dict, only_modules: bool = False) -> None:
    """Refuse to bind ``name`` where it would shadow a module, or (unless ``only_modules``) anything kernelkit
    did not make: a cell's name must be an identifier, free or already a kernelkit library or module."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"%%kernelkit: NAME must be a Python identifier, got {name!r}")
    if name not in user_ns:
        return
    current = user_ns[name]
    if current is _BOUND.get((id(user_ns), name)) or isinstance(current, (KernelModule, Library)):
        return
    if isinstance(current, types.ModuleType):
        raise ValueError(f"%%kernelkit: {name!r} is the module {current.__name__} in this notebook; binding the cell "
                         "there would shadow it: give the cell another name")
    if not only_modules:
        raise ValueError(f"%%kernelkit: {name!r} already names an object of type {type(current).__name__} that "
                         f"kernelkit did not make; give the cell another name (or `del {name}` first)")


#: build keys of C++-only cells
_NO_DEVICE_CODE: set = set()


def _bind(user_ns: dict, name: str, value) -> None:
    user_ns[name] = value
    _BOUND[(id(user_ns), name)] = value


def kernelkit_cell(line: str, cell: str, user_ns: dict):
    args = _parser().parse_args(_tokens(line))
    _check_name(args.name, user_ns)
    if args.tune is not None:
        _bind(user_ns, args.name, _tuned_cell(args, cell, user_ns))
        CELLS[args.name] = (line, cell)
        return None
    if args.kernels:
        # a blank first line: compiler line numbers are the cell's, whose line 1 is the %%kernelkit line
        with _errors_cite_the_cell(args.name):
            _bind(user_ns, args.name, load_kernels("\n" + cell, args.name, arch=args.arch, options=args.flags or ()))
        CELLS[args.name] = (line, cell)
        return None
    cuda, cpp = split_cell(cell, cpp_only(line, cell))
    if cuda is not None and cpp is None and not args.functions:
        raise ValueError("%%kernelkit: a CUDA cell needs a '// --- binding ---' line followed by the "
                         "torch-facing C++ (or --cpp for a C++-only cell)")
    with _errors_cite_the_cell(args.name):
        lib = loading.load_inline(args.name, cuda=cuda, cpp=cpp, functions=args.functions, arch=args.arch,
                              extra_cflags=args.flags, extra_cuda_cflags=args.cuda_flags)
    CELLS[args.name] = (line, cell)
    if cuda is None:
        _NO_DEVICE_CODE.add(lib.key)  # nothing for a compile report to show (and no cuobjdump to ask for)
    names = lib.functions()
    handle = args.name if args.name not in names else f"{args.name}_lib"  # an op named like the cell keeps its name
    _check_name(handle, user_ns)
    for fn in names:
        _check_name(fn, user_ns, only_modules=True)  # an op may replace the notebook's own function of its name
    if handle != args.name:
        print(f"kernelkit: {args.name} is the op; the library is bound as {handle}", file=sys.stderr)
    _bind(user_ns, handle, lib)
    for fn in names:
        _bind(user_ns, fn, getattr(lib, fn))
    return None


_TUNE_KEYS = ("space", "launch", "reference", "inputs")


def _tuned_cell(args, cell: str, user_ns: dict):
    """The --kernels cell as a space of NVRTC compiles, one module per configuration of the notebook's dict
    ``args.tune`` (its values as -D defines), tuned per shape bucket on first use (``tune.tuned``)."""
    if not args.kernels:
        raise ValueError(f"%%kernelkit: --tune tunes a --kernels cell (NVRTC); add --kernels\n{_USAGE}")
    settings = user_ns.get(args.tune)
    if not isinstance(settings, dict) or not set(_TUNE_KEYS) <= set(settings):
        got = "nothing" if args.tune not in user_ns else f"a {type(settings).__name__}" + (
            f" without {', '.join(k for k in _TUNE_KEYS if k not in settings)}" if isinstance(settings, dict) else "")
        raise ValueError(f"%%kernelkit: --tune {args.tune}: expected the notebook's dict with keys "
                         f"{', '.join(_TUNE_KEYS)}, got {got}")
    launch, flags = settings["launch"], list(args.flags or ())
    # kernels take pointers and kernelkit's launcher refuses strided tensors: contiguous inputs unless the dict asks
    options = {"noncontiguous": False, **{k: v for k, v in settings.items() if k not in ("space", "launch")}}

    def make(config):
        defines = [f"-D{k}={v}" for k, v in config.items()]
        tag = sha256_bytes(repr(sorted(config.items())).encode())[:12]  # its own module: load_kernels updates by name
        kernels = load_kernels("\n" + cell, f"{args.name}_{tag}", arch=args.arch, options=flags + defines)
        return functools.partial(launch, kernels, dict(config))

    source = sha256_bytes(cell.encode(), repr((flags, args.arch)).encode())  # an edited cell is tuned again
    return tune.tuned(make, settings["space"], name=args.name, **{"source": source, **options})


@contextlib.contextmanager
def _errors_cite_the_cell(name: str) -> Iterator[None]:
    """Compiler errors in the cell's code name the cell ("cell %%kernelkit NAME:3:5: error: ..."), not the
    ``NAME.cu``/``NAME.cpp`` files kernelkit wrote it to; the lines already are the cell's."""
    try:
        yield
    except BuildError as e:
        own = {f"{name}.cu", f"{name}.cpp"}
        if not any(d.file in own for d in e.diagnostics):
            raise
        cited = [dataclasses.replace(d, file=f"cell %%kernelkit {name}") if d.file in own else d for d in e.diagnostics]
        what = e.what
        for file in own:
            what = what.replace(file, f"the %%kernelkit {name} cell")
        raise BuildError(what, cited, e.log, e.command) from None


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
    all_cpp = cpp_only(line, cell)
    m = None if all_cpp else SEPARATOR.search(cell)
    cuda, binding = (None, cell) if all_cpp else (cell[: m.start()], cell[m.end() + 1:]) if m else (cell, "")
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

    cell_magic.__doc__ = __doc__ + "\n" + _parser().format_help()  # what %%kernelkit? shows

    ipython.register_magic_function(cell_magic, magic_kind="cell", magic_name="kernelkit")
    loading.autoreload(True)  # edited card files are reloaded before each cell
    _register_cell_hooks(ipython)


_CELL_HOOKS: Dict[int, tuple] = {}  # id(shell) -> its (pre, post) hooks, so a second %load_ext adds none


def _builds() -> Dict[str, object]:
    """name -> the current build of every card, inline library and instant-kernels module in this process."""
    return {**registry.current(), **{m.name: m for m in loaded_modules()}}


def _register_cell_hooks(ipython) -> None:
    """Per cell: capture C-level and device output into the cell (KERNELKIT_CAPTURE=off turns it off), and
    after a cell that built something, a compact compile report of each new build (KERNELKIT_REPORT=off: none)."""
    if id(ipython) in _CELL_HOOKS:
        return
    state: Dict[str, object] = {}

    def pre_run_cell(*_):
        state["builds"] = {n: getattr(b, "key", None) for n, b in _builds().items()}
        capture = settings.CAPTURE.get()
        if capture != "off":
            try:
                state["capture"] = _capture.Capture(per_launch=capture == "launch").open()
            except (ImportError, OSError) as e:  # no wurlitzer, or no fds to redirect: run the cell uncaptured
                print(f"kernelkit: not capturing device output in this cell: {e}", file=sys.stderr)

    def post_run_cell(*_):
        cap = state.pop("capture", None)
        if cap is not None:
            try:
                cap.close()
            except KernelkitError as e:  # raising here would only print a hook traceback
                print(f"kernelkit: {e}", file=sys.stderr)
        before = state.pop("builds", {})
        if not settings.REPORT.get():
            return
        for name, build in _builds().items():
            key = getattr(build, "key", None)
            if before.get(name) == key or getattr(build, "cached", True) or key in _NO_DEVICE_CODE:
                continue
            try:
                print(kk_inspect.report(build).compact())
            except KernelkitError as e:  # said once: a missing cuobjdump would repeat it after every build
                if not state.get("report_failed"):
                    print(f"kernelkit: no compile report for {name}: {e}", file=sys.stderr)
                state["report_failed"] = True

    ipython.events.register("pre_run_cell", pre_run_cell)
    ipython.events.register("post_run_cell", post_run_cell)
    _CELL_HOOKS[id(ipython)] = (pre_run_cell, post_run_cell)
