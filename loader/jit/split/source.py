"""The file as the compiler sees it before macros: local headers inlined where they are included (once, when
guarded by ``#pragma once`` or an include guard), with a map from each line back to its file and line."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Set, Tuple

from . import tree as ts
from .errors import Refuse

LocalHeader = Callable[[str, str], Optional[Tuple[str, str]]]


def sibling_headers(name: str, including: str) -> Optional[Tuple[str, str]]:
    """The default resolver: a quoted include found next to the file that includes it."""
    return local_headers(())(name, including)


def local_headers(include_dirs) -> LocalHeader:
    """A resolver that looks where the preprocessor would: a quoted name next to the including file, then
    in ``include_dirs``; an angled name in ``include_dirs`` only. ``name`` is written with its delimiters."""
    dirs = [Path(d) for d in include_dirs]

    def resolve(name: str, including: str) -> Optional[Tuple[str, str]]:
        quoted, bare = name.startswith('"'), name[1:-1]
        for d in ([Path(including).parent] if quoted else []) + dirs:
            cand = d / bare
            if cand.is_file():
                cand = cand.resolve()
                return str(cand), cand.read_text(errors="replace")
        return None

    return resolve


@dataclass
class Flat:
    text: str = ""
    origin: List[Tuple[str, int]] = field(default_factory=list)  # per line: (path, 1-based line)
    headers: List[str] = field(default_factory=list)  # inlined header paths

    def where(self, line0: int) -> Tuple[str, int]:
        return self.origin[min(line0, len(self.origin) - 1)]


def _guard(root, src: bytes) -> Optional[Tuple[object, object]]:
    """(#ifndef node, its #define) when the whole file is ``#ifndef X / #define X ... #endif``."""
    code = [c for c in root.children if c.type != "comment"]
    if len(code) != 1 or code[0].type != "preproc_ifdef" or ts.text(code[0].children[0], src) != "#ifndef":
        return None
    node = code[0]
    name = node.child_by_field_name("name")
    body = [c for c in node.named_children if c.type not in ("comment",) and c != name]
    if not body or body[0].type != "preproc_def" or any(c.type.startswith("preproc_else") for c in body):
        return None
    if ts.text(body[0].child_by_field_name("name"), src) != ts.text(name, src) or \
            body[0].child_by_field_name("value") is not None:
        return None
    return node, body[0]


def _blank_lines(src: bytes, start: int, end: int) -> bytes:
    return b"\n" * src[start:end].count(b"\n")


def _header_body(text: str, path: str) -> Tuple[str, bool]:
    """The header's text with its guard lines blanked (line count kept), and whether it is guarded."""
    src = text.encode("utf-8", "surrogateescape")
    root = ts.parse(text).root_node
    once = [c for c in root.children if c.type == "preproc_call" and ts.text(c, src).split()[:2] == ["#pragma", "once"]]
    if once:
        n = once[0]
        return (src[:n.start_byte] + _blank_lines(src, n.start_byte, n.end_byte) + src[n.end_byte:]).decode(
            "utf-8", "surrogateescape"), True
    guard = _guard(root, src)
    if guard is None:
        return text, False
    node, define = guard
    opener_end = node.child_by_field_name("name").end_byte
    closer = node.children[-1]  # "#endif"
    if closer.type != "#endif":
        raise Refuse(f"the include guard of {Path(path).name} could not be read", 1)
    out = (src[:node.start_byte] + b" " * (opener_end - node.start_byte) + src[opener_end:closer.start_byte]
           + b" " * (closer.end_byte - closer.start_byte) + src[closer.end_byte:])
    return out.decode("utf-8", "surrogateescape"), True


def flatten(text: str, path: str, resolve: LocalHeader) -> Flat:
    flat = Flat()
    _inline(text, path, resolve, flat, seen=set(), once=set(), depth=0)
    return flat


def _inline(text: str, path: str, resolve: LocalHeader, flat: Flat, seen: Set[str], once: Set[str],
            depth: int) -> None:
    if depth > 32:
        raise Refuse(f"local headers nest deeper than 32 (at {Path(path).name})", 0)
    src = text.encode("utf-8", "surrogateescape")
    root = ts.parse(text).root_node
    pos, line0 = 0, 0
    for inc in (n for n in ts.walk(root) if n.type == "preproc_include"):
        target = inc.child_by_field_name("path")
        name = ts.text(target, src) if target is not None else ""
        found = resolve(name, path) if name[:1] in '"<' else None
        if found is None:
            continue
        start = src.rfind(b"\n", 0, inc.start_byte) + 1
        if inc.parent != root or src[start:inc.start_byte].strip():
            raise Refuse(f"local header {name} is included inside a block, an #if or mid-line", ts.line(inc))
        _emit(flat, src[pos:start], path, line0)
        line0 += src[pos:start].count(b"\n")
        _include(name, found, resolve, flat, seen, once, depth, ts.line(inc))
        line0 += src[start:inc.end_byte].count(b"\n")
        pos = inc.end_byte
    _emit(flat, src[pos:], path, line0)


def _include(name: str, found: Tuple[str, str], resolve: LocalHeader, flat: Flat, seen: Set[str], once: Set[str],
             depth: int, line: int) -> None:
    hpath, htext = found
    if hpath in once:
        return  # a guarded header's second inclusion adds nothing
    if hpath in seen:
        raise Refuse(f"local header {name} is included twice and has no include guard", line)
    body, guarded = _header_body(htext, hpath)
    seen.add(hpath)
    if guarded:
        once.add(hpath)
    flat.headers.append(hpath)
    _inline(body if body.endswith("\n") else body + "\n", hpath, resolve, flat, seen, once, depth + 1)


def _emit(flat: Flat, chunk: bytes, path: str, line0: int) -> None:
    if not chunk:
        return
    s = chunk.decode("utf-8", "surrogateescape")
    flat.text += s
    n = s.count("\n") + (0 if s.endswith("\n") else 1)
    flat.origin += [(path, line0 + 1 + i) for i in range(n)]
