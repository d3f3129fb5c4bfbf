"""The file as the preprocessor reads it: every local header it includes written in place of its ``#include``,
guard directives and all, so that the compilers of both TUs decide what each inclusion keeps exactly as they
would for the file as written; with a map from each line back to its file and line.

Only two things are decided here: a ``#pragma once`` becomes an include guard named for the header's path (the
same effect for one spelling of one file), and a header included again inside its own inclusion is left out
when its whole text is guarded (its guard is defined by then, so the preprocessor would add nothing)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

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
    headers: List[str] = field(default_factory=list)  # inlined header paths, once each, in order

    def where(self, line0: int) -> Tuple[str, int]:
        return self.origin[min(line0, len(self.origin) - 1)]


def flatten(text: str, path: str, resolve: LocalHeader, first_line: int = 1) -> Flat:
    """``text`` (the file at ``path``, its first line numbered ``first_line``) with its local headers written in."""
    flat = Flat()
    _inline(text, path, resolve, flat, stack=(), first=first_line)
    return flat


def once_guard(path: str) -> str:
    return "KK_ONCE_" + hashlib.sha256(path.encode()).hexdigest()[:16]


def _inline(text: str, path: str, resolve: LocalHeader, flat: Flat, stack: Tuple[str, ...], first: int = 1) -> None:
    if len(stack) > 32:
        raise Refuse(f"local headers nest deeper than 32 (at {Path(path).name})", 0)
    src = text.encode("utf-8", "surrogateescape")
    root = ts.parse(text).root_node
    pos, line0 = 0, 0
    for node in ts.walk(root):
        if node.type == "preproc_call" and ts.text(node.child_by_field_name("directive"), src) == "#include_next":
            raise Refuse("#include_next", ts.line(node))
        if node.type != "preproc_include":
            continue
        target = node.child_by_field_name("path")
        name = ts.text(target, src) if target is not None else ""
        if name[:1] not in '"<':
            raise Refuse(f"an #include of a macro ({name})", ts.line(node))
        found = resolve(name, path)
        if found is None:
            continue  # a system header, or one that no branch the compiler takes may need
        start = src.rfind(b"\n", 0, node.start_byte) + 1
        if src[start:node.start_byte].strip():
            raise Refuse(f"local header {name} is included mid-line", ts.line(node))
        _emit(flat, src[pos:start], path, line0 + first - 1)
        line0 += src[pos:start].count(b"\n")
        end = node.end_byte if src[node.end_byte - 1:node.end_byte] == b"\n" else node.end_byte
        directive_lines = max(src[start:end].count(b"\n"), 1)
        _include(name, found, resolve, flat, stack + (path,), (path, line0 + first), directive_lines)
        line0 += src[start:end].count(b"\n")
        pos = end
    _emit(flat, src[pos:], path, line0 + first - 1)


def _include(name: str, found: Tuple[str, str], resolve: LocalHeader, flat: Flat, stack: Tuple[str, ...],
             at: Tuple[str, int], directive_lines: int) -> None:
    hpath, htext = found
    guard = whole_file_guard(htext)
    if hpath in stack:
        if guard is None:
            raise Refuse(f"local header {name} includes itself and is not guarded as a whole", at[1])
        _synthesized(flat, "", at, directive_lines)  # its guard is defined by now: the inclusion adds nothing
        return
    if hpath not in flat.headers:
        flat.headers.append(hpath)
    body = htext if htext.endswith("\n") else htext + "\n"
    once = _pragma_once(body)
    if once is not None:
        body = body[:once[0]] + "\n" * body.count("\n", once[0], once[1]) + body[once[1]:]
        _synthesized(flat, f"#ifndef {once_guard(hpath)}\n#define {once_guard(hpath)}\n", (hpath, 1), 0)
    _inline(body, hpath, resolve, flat, stack)
    if once is not None:
        _synthesized(flat, "#endif\n", (hpath, body.count("\n")), 0)
    _synthesized(flat, "", at, directive_lines - 1)


def _synthesized(flat: Flat, text: str, at: Tuple[str, int], pad_lines: int) -> None:
    """Lines kernelkit writes (a guard for ``#pragma once``; blanks standing for an inclusion's directive),
    cited as ``at``."""
    text += "\n" * max(pad_lines, 0)
    flat.text += text
    flat.origin += [at] * text.count("\n")


def whole_file_guard(text: str) -> Optional[str]:
    """The macro that guards ``text`` as a whole (``#ifndef G`` / ``#define G`` ... ``#endif`` around everything
    but comments, or ``#pragma once``), or None."""
    if _pragma_once(text) is not None:
        return "#pragma once"
    src = text.encode("utf-8", "surrogateescape")
    code = [c for c in ts.parse(text).root_node.children if c.type != "comment"]
    if len(code) != 1 or code[0].type != "preproc_ifdef" or ts.text(code[0].children[0], src) != "#ifndef":
        return None
    node = code[0]
    name = node.child_by_field_name("name")
    body = [c for c in node.named_children if c.type != "comment" and c != name]
    if not body or body[0].type != "preproc_def" or any(c.type.startswith("preproc_else") for c in body):
        return None
    if ts.text(body[0].child_by_field_name("name"), src) != ts.text(name, src):
        return None
    return ts.text(name, src)


def _pragma_once(text: str) -> Optional[Tuple[int, int]]:
    """Byte span of a top-level ``#pragma once`` (its line), or None."""
    src = text.encode("utf-8", "surrogateescape")
    for c in ts.parse(text).root_node.children:
        if c.type == "preproc_call" and ts.text(c, src).split()[:2] == ["#pragma", "once"]:
            return len(src[:c.start_byte].decode("utf-8", "surrogateescape")), \
                len(src[:c.end_byte].decode("utf-8", "surrogateescape"))
    return None


def _emit(flat: Flat, chunk: bytes, path: str, line0: int) -> None:
    if not chunk:
        return
    s = chunk.decode("utf-8", "surrogateescape")
    flat.text += s
    n = s.count("\n") + (0 if s.endswith("\n") else 1)
    flat.origin += [(path, line0 + 1 + i) for i in range(n)]
