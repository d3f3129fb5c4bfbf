"""``.pyi`` stubs of what kernelkit built, for type checkers and completion: ``kernelkit/ops.pyi`` (every op of the
cards and cells, from its schema), ``<name>.pyi`` for each torch-style extension module (from pybind11's
signatures), written into a stub directory (``typings``: pyright's default ``stubPath``; mypy's ``mypy_path``)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from ..errors import KernelkitError
from ..jit import cards, registry
from ..jit.library import Library, import_extension
from . import signatures
from .built import Built

HEADER = ("# written by kernelkit ide from the builds in its cache: rewritten by the next run\n"
          f"from typing import {', '.join(signatures.TYPING)}, overload\n"
          "import collections.abc\nimport typing\n\nimport torch\n")
#: the stub of ``kernelkit`` itself: ``kernelkit.ops`` typed, every other name untyped (as without stubs)
PACKAGE = ("# written by kernelkit ide: kernelkit.ops is typed (ops.pyi); the rest of kernelkit is untyped here\n"
           "from typing import Any\n\nfrom . import ops as ops\n\n\ndef __getattr__(name: str) -> Any: ...\n")
UNTYPED = "\n\ndef __getattr__(name: str) -> Any: ...  # {}\n"
_DEF = re.compile(r"^def (\w+)\(")


def write(typings: Path, builds: Sequence[Built]) -> List[Path]:
    """Write the stubs of ``builds`` under ``typings``; ``kernelkit/ops.pyi`` keeps the ops it had of other builds."""
    package = typings / "kernelkit"
    package.mkdir(parents=True, exist_ok=True)
    written = []
    ops: Dict[str, List[str]] = {}
    for b in builds:
        if b.standalone:
            continue
        if b.torch_style:
            written.append(_write(typings / f"{b.name}.pyi", _module_stub(b)))
        else:
            ops.update(_ops(b))
    kept = {name: lines for name, lines in _defs(package / "ops.pyi").items() if name not in ops}
    body = "\n\n".join("\n".join(lines) for _, lines in sorted({**kept, **ops}.items()))
    written.append(_write(package / "ops.pyi", HEADER + "\n\n" + body + UNTYPED.format(
        "a card not built yet: its ops untyped")))
    written.append(_write(package / "__init__.pyi", PACKAGE))
    written.append(_write(package / "py.typed", "partial\n"))  # PEP 561: where kernelkit's own files are not stubbed
    return written


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _defs(path: Path) -> Dict[str, List[str]]:
    """The ``def`` lines of an ops.pyi written before (each with its ``@overload`` line), by name."""
    found: Dict[str, List[str]] = {}
    lines = path.read_text().splitlines() if path.is_file() else []
    for i, line in enumerate(lines):
        m = _DEF.match(line)
        if m and m.group(1) != "__getattr__":
            found.setdefault(m.group(1), []).extend(
                (["@overload"] if i and lines[i - 1] == "@overload" else []) + [line])
    return found


# ------------------------------------------------------------------------------------------- ops
def _ops(b: Built) -> Dict[str, List[str]]:
    """``kernelkit.ops``'s functions of a card or cell build: each op named like it (or ``<name>_...``)."""
    lib = registry.by_key(b.key) or Library(b.name, b.key, b.so, pymodule=None, cached=True, build_seconds=0.0)
    module = _card_module(b.name)
    found = {}
    for op in lib.op_names():
        if op != b.name and not op.startswith(b.name + "_"):
            continue  # kernelkit.ops.<op> finds a build by the op's name or a prefix of it
        fn = getattr(module, op, None) if module is not None else None
        if not (callable(fn) and getattr(fn, "__module__", None) == module.__name__):
            fn = None
        found[op] = [signatures.op_def(op, getattr(lib.ops, op).default._schema, fn)]
    return found


def _card_module(name: str):
    """The card's Python file (its functions are ``kernelkit.ops``' where it defines them); None for a cell."""
    try:
        return cards.find(name).module()
    except (KernelkitError, ValueError):
        return None


# ------------------------------------------------------------------------------------------- extensions
def _module_stub(b: Built) -> str:
    loaded = registry.extension(b.key)
    module = loaded[0] if loaded is not None else import_extension(b.pymodule, b.so)
    defs, untyped = _members(module)
    text = HEADER.replace("kernelkit ide from", f"kernelkit ide for the extension {b.name} ({b.key[:12]}) from")
    text += "\n\n" + "\n\n".join("\n".join(lines) for _, lines in defs)
    return text + (UNTYPED.format("what pybind11 shows no signature of: " + ", ".join(untyped)) if untyped else "\n")


def _members(module) -> Tuple[List[Tuple[str, List[str]]], List[str]]:
    defs, untyped = [], []
    for name in sorted(n for n in dir(module) if not n.startswith("_")):
        lines = signatures.pybind_defs(name, getattr(getattr(module, name), "__doc__", None))
        if lines:
            defs.append((name, lines))
        else:
            untyped.append(name)
    return defs, untyped
