"""Which of torch's headers a split's device TU keeps as written and which its prelude stands in for.

A header whose includes reach torch's tensor API, the Python bindings or torch's autograd (``HEAVY``) costs
tens of seconds in nvcc's two front ends and is what the split exists to avoid; the rest (``c10/util``,
``ATen/cuda/Atomic.cuh``, ``c10/cuda/CUDAException.h``, ...) compile in about a second and may declare what
device code uses, so they stay."""
from __future__ import annotations

import functools
import subprocess
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .. import cache, keys, sources, syntax, toolchain

#: where torch's heavy API starts: a header reaching one of these is heavy
HEAVY = ("ATen/core/TensorBody.h", "ATen/Context.h", "torch/csrc/", "pybind11/", "Python.h", "c10/core/TensorImpl.h")
#: a closure this large is heavy whatever it holds
MAX_HEADERS = 300


@functools.lru_cache(maxsize=None)
def heavy(name: str) -> bool:
    """Whether the include ``name`` (as written, with its delimiters) reaches torch's heavy API. The answers are
    kept in a record per torch: finding one parses up to a few hundred headers (~1 s for a process's first split)."""
    bare = name[1:-1]
    if bare.startswith(HEAVY) or bare.startswith(("torch/", "pybind11/")):
        return True
    key, known = _known()
    if isinstance(known.get(name), bool):
        return known[name]
    dirs = [Path(p) for p in toolchain.torch_include_paths(True)]
    found = _reaches(bare, None, dirs, set())
    known[name] = found
    cache.write_record("torch-headers", key, known)  # best effort: a read-only cache finds it again next time
    return found


@functools.lru_cache(maxsize=None)
def _known() -> Tuple[str, Dict[str, bool]]:
    """This torch's record of answers (its key, and the answers, which ``heavy`` adds to)."""
    key = keys.torch_headers_key(toolchain.fingerprint(), toolchain.torch_include_paths(True))
    return key, dict(cache.read_record("torch-headers", key))


def _reaches(bare: str, here: Path, dirs: List[Path], seen: Set[Path]) -> bool:
    path = _find(bare, here, dirs)
    if path is None:
        return False  # a CUDA or system header
    if path in seen:
        return False
    seen.add(path)
    if len(seen) > MAX_HEADERS:
        return True
    for kind, name in sources.every_include(path.read_text(errors="replace")):
        if name.startswith(HEAVY):
            return True
        if _reaches(name, path.parent if kind == '"' else None, dirs, seen):
            return True
    return False


def _find(bare: str, here, dirs: List[Path]):
    for d in ([here] if here is not None else []) + dirs:
        cand = d / bare
        if cand.is_file():
            return cand.resolve()
    return None


def declared_names(preprocessed: str) -> Counter:
    """How many declarations of each name the parts of nvcc's preprocessed text that come from torch's headers
    hold (by its linemarkers): functions, variables, types, templates, enumerators, namespaces, members; not
    parameters or what function bodies declare, which no lookup from outside them finds."""
    roots = tuple(str(Path(p).resolve()) for p in toolchain.torch_include_paths(True))
    kept, mine = [], False
    for line in preprocessed.split("\n"):
        if line.startswith("# ") and line[2:3].isdigit():
            parts = line.split('"')
            if len(parts) >= 2:
                mine = str(Path(parts[1]).resolve()).startswith(roots)
            kept.append("")
            continue
        kept.append(line if mine else "")
    text = "\n".join(kept)
    src = text.encode("utf-8", "surrogateescape")
    counts: Counter = Counter()
    stack = [syntax.parse(text).root_node]
    while stack:
        n = stack.pop()
        if n.type in _BODIES:
            continue
        name = _declared_by(n)
        if name is not None:
            counts[src[name.start_byte:name.end_byte].decode("utf-8", "surrogateescape")] += 1
        stack.extend(n.children)
    return counts


#: where the names declared are local to a function or a parameter list
_BODIES = frozenset({"compound_statement", "parameter_list", "lambda_expression", "template_parameter_list",
                     "field_initializer_list", "initializer_list", "argument_list"})
_NAMED = frozenset({"struct_specifier", "class_specifier", "union_specifier", "enum_specifier", "namespace_definition",
                    "alias_declaration", "enumerator", "concept_definition"})
_DECLARATORS = frozenset({"function_declarator", "init_declarator", "array_declarator", "pointer_declarator",
                          "reference_declarator"})


def _declared_by(n):
    """The name node a declaration-ish node introduces, if any."""
    if n.type in _NAMED:
        return n.child_by_field_name("name")
    if n.type in ("declaration", "field_declaration", "type_definition", "function_definition"):
        d = n.child_by_field_name("declarator")
        while d is not None and d.type in _DECLARATORS:
            d = d.child_by_field_name("declarator")
        if d is not None and d.type in ("identifier", "field_identifier", "type_identifier", "operator_name"):
            return d
        if d is not None and d.type in ("qualified_identifier", "template_function"):
            return d.child_by_field_name("name")
    return None


def defined_macros(text: str, flags: Sequence[str]) -> Optional[Dict[str, str]]:
    """Macro name -> definition once ``text`` (includes) is preprocessed by nvcc with ``flags`` (None: nvcc could
    not say)."""
    cmd = [toolchain.nvcc(), *[f for f in flags if f not in ("-c",)], "-E", "-Xcompiler", "-dM", "-x", "cu", "-"]
    out = subprocess.run(cmd, input=text, capture_output=True, text=True, errors="replace")
    if out.returncode != 0:
        return None
    found = {}
    for line in out.stdout.splitlines():
        words = line.split(None, 2)
        if len(words) >= 2 and words[0] == "#define":
            found[words[1].split("(")[0]] = line
    return found


def risky_names(as_written: Counter, prelude: Counter, macros: Dict[str, str], prelude_macros: Dict[str, str]
                ) -> Set[str]:
    """The names torch's umbrella headers declare more often than the split's prelude does (an overload or a
    specialisation lookup could find there and not here), and the macros they define otherwise: a name device
    code starts to use is proven before its split is used if it is one of these."""
    declared = {n for n, count in as_written.items() if count > prelude.get(n, 0)}
    return declared | {n for n, line in macros.items() if prelude_macros.get(n) != line}
