"""Database entries for the user's headers, so that clangd opens a ``.h``/``.cuh`` with the flags of a TU that
includes it rather than with its own guess.

clangd gives a file the database does not list the command of the entry whose path looks most like it (with ``-x``
from its extension): a card's ``.h`` gets its ``.cu``'s nvcc command, so its torch-facing half under ``#ifdef
KERNELKIT_BINDING`` (defined by the generated binding TU before it includes the header) is dead code to clangd, and a
header in a folder of its own may get an unrelated TU's flags. Here each local header a recorded TU includes (its
``"..."`` and ``<...>`` includes found through the command's include dirs, transitively; torch's, CUDA's, the
system's and kernelkit's own headers are not the user's) gets the command of an including TU, with the file replaced,
the language said (``-x cuda`` for an nvcc TU, ``-x c++`` else) and what its includer has before the ``#include``
line outside any ``#if``: each ``#define`` as ``-D``, each ``#include`` as ``-include``, so a header that is not
self-contained (a card's binding half, an extension's ``kernels.cuh`` after ``<torch/extension.h>``) parses as in
the TU. A header included by several TUs takes a ``.cuh``'s nvcc TU, a ``.h``'s C++ TU (a card's binding) first.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ..jit import cache, keys, sources, syntax

_CUDA_HEADERS = (".cuh",)


class _Include(NamedTuple):
    """Where a header was reached: the entry (of the TU, or of the header that includes it) and what comes first."""

    base: Dict[str, object]
    nvcc: bool  # the TU is nvcc's
    before: List[str]  # the flags that do what the includer has before its #include line
    direct: bool  # the TU's own #include, not a header's


def entries(tus: Sequence[Dict[str, object]]) -> List[Dict[str, object]]:
    """An entry for each local header the TUs of ``tus`` include (none for a file ``tus`` lists itself)."""
    listed = {str(e["file"]) for e in tus}
    skip = [sources.INCLUDE.resolve(), cache.cache_dir().resolve()]  # kernelkit's own headers, generated files
    found: Dict[Path, List[_Include]] = {}
    for tu in tus:
        for header, how in _walk(tu, skip).items():
            if str(header) not in listed:
                found.setdefault(header, []).append(how)
    return [_entry(header, _choose(header, hows)) for header, hows in sorted(found.items())]


def _walk(tu: Dict[str, object], skip: Sequence[Path]) -> Dict[Path, _Include]:
    """Each local header ``tu`` reads, with the first place it is included from (breadth first: the TU's own
    includes before theirs)."""
    args = [str(a) for a in list(tu["arguments"])]  # type: ignore[arg-type]
    nvcc = any(Path(a).name == "nvcc" for a in args[:3])
    search = sources.include_search(args[1:], nvcc, keys.toolchain_dirs())
    seen: Dict[Path, _Include] = {}
    queue: List[Tuple[Path, Dict[str, object], bool]] = [(Path(str(tu["file"])), tu, True)]
    while queue:
        path, base, direct = queue.pop(0)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for (kind, name), before in _includes_with_preamble(text, path.parent, search):
            header = _resolve(kind, name, path.parent, search)
            if header is not None and header not in seen and not any(header.is_relative_to(s) for s in skip):
                seen[header] = _Include(base, nvcc, before, direct)
                queue.append((header, _entry(header, seen[header]), False))
    return seen


def _includes_with_preamble(text: str, here: Path, search: sources.Search
                            ) -> Iterator[Tuple[Tuple[str, str], List[str]]]:
    """Each ``#include`` of ``text`` (at any depth, as tree-sitter reads it) with the flags that do what the file's
    top-level directives before it do (inside an ``#if`` a directive may not apply, so only top-level ones count)."""
    before: List[str] = []
    for top in syntax.parse(text).root_node.children:
        for node in syntax.walk(top):
            written = _included(node)
            if written is not None:
                yield written, list(before)
        before += _preamble_flags(top, here, search)


def _included(node) -> Optional[Tuple[str, str]]:
    """(``<`` or ``"``, the name) of an ``#include`` node with a literal path; None for anything else."""
    if node.type != "preproc_include":
        return None
    path = node.child_by_field_name("path")
    written = path.text.decode(errors="replace") if path is not None else ""
    if path is None or path.type not in ("string_literal", "system_lib_string") or len(written) <= 2:
        return None
    return written[0], written[1:-1]


def _resolve(kind: str, name: str, here: Path, search: sources.Search) -> Optional[Path]:
    """The file ``#include`` finds, as the compiler looks (a "..." include in its includer's folder first)."""
    dirs = [here, *search.quote, *search.angle] if kind == '"' else list(search.angle)
    for d in dirs:
        cand = d / name
        if cand.is_file():
            return cand.resolve()
    return None


def _preamble_flags(node, here: Path, search: sources.Search) -> List[str]:
    """The flags that have the compiler do what the top-level directive ``node`` does before the header: ``-D``
    an object-like ``#define``, ``-include`` an ``#include`` (by its path where it is found, else as written: a
    system header through the command's own dirs)."""
    if node.type == "preproc_def":
        name = node.child_by_field_name("name").text.decode(errors="replace")
        value = node.child_by_field_name("value")
        body = value.text.decode(errors="replace").strip() if value is not None else ""
        return [f"-D{name}={body}" if body else f"-D{name}"]
    written = _included(node)
    if written is None:
        return []
    found = _resolve(*written, here, search)
    return ["-include", str(found) if found is not None else written[1]]


def _choose(header: Path, hows: List[_Include]) -> _Include:
    """A .cuh takes an nvcc TU's flags, any other header a C++ TU's (a card's binding) where it has both;
    a direct include before one through another header."""
    cuda = header.suffix in _CUDA_HEADERS
    return min(hows, key=lambda h: (h.nvcc != cuda, not h.direct))


def _entry(header: Path, how: _Include) -> Dict[str, object]:
    """The includer's command on ``header``: the language said, the includer's preamble before ``-c``."""
    args = [str(a) for a in list(how.base["arguments"])]  # type: ignore[arg-type]
    old = str(how.base["file"])
    at = len(args) - 1 - args[::-1].index(old) if old in args else len(args)
    lang = ["-x", "cuda" if how.nvcc else "c++"]
    head = [a for a in args[:at] if a != "-c"]
    if len(head) >= 2 and head[-2] == "-x":  # the includer's own -x (a header's entry): replaced
        head = head[:-2]
    return {"directory": how.base["directory"], "file": str(header),
            "arguments": [*head, *how.before, "-c", *lang, str(header), *args[at + 1:]]}
