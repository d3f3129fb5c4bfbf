"""Rewriting the flat text into a TU: edits applied to its bytes, each line of the result knowing which line of
the file it came from, and ``#line`` marks wherever that does not follow from the line before."""
from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from .errors import Refuse
from .source import Flat


class Edit(NamedTuple):
    start: int  # byte span of the flat text replaced
    end: int
    text: str  # what replaces it
    #: the 0-based flat line the replacement's first line stands for (None: the line the span starts on);
    #: each newline in ``text`` moves on by one
    line0: Optional[int] = None
    #: a file kernelkit writes the replacement's lines as (its own lines, from 1), instead of the flat text's
    cite: Optional[str] = None


Line = Tuple[str, Tuple[str, int]]  # (text without its newline, (path, 1-based line) it stands for)


def rewrite(src: bytes, edits: Sequence[Edit], flat: Flat) -> List[Line]:
    """``src`` (the flat text's bytes) with ``edits`` applied, line by line, each line with its origin."""
    pieces: List[Tuple[bytes, Callable[[int], Tuple[str, int]]]] = []  # (bytes, origin of their i-th line)

    def flat_lines(line0: int) -> Callable[[int], Tuple[str, int]]:
        return lambda i: flat.where(line0 + i)

    pos = 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        if e.start < pos:
            raise Refuse("overlapping rewrites (the split could not place a launch or declaration)", 0)
        pieces.append((src[pos:e.start], flat_lines(src.count(b"\n", 0, pos))))
        line0 = src.count(b"\n", 0, e.start) if e.line0 is None else e.line0
        cite = (lambda i, f=e.cite: (f, i + 1)) if e.cite else flat_lines(line0)
        pieces.append((e.text.encode("utf-8", "surrogateescape"), cite))
        pos = e.end
    pieces.append((src[pos:], flat_lines(src.count(b"\n", 0, pos))))
    lines: List[Line] = []
    current, origin = b"", None
    for chunk, where in pieces:
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            ends = i < len(parts) - 1
            if origin is None and (part or ends):  # a line's origin is where its first byte came from
                origin = where(i)
            current += part
            if ends:
                lines.append((current.decode("utf-8", "surrogateescape"), origin))
                current, origin = b"", None
    if current:
        lines.append((current.decode("utf-8", "surrogateescape"), origin))
    if lines and lines[-1][0] == "":
        lines.pop()
    return lines


def marked(lines: Sequence[Line], prefix: str = "", numbers: Optional[Callable[[int, int], int]] = None) -> str:
    """The TU's text: ``prefix``, then ``lines`` with a ``#line`` mark wherever the origin jumps. ``numbers(i,
    line)``: the number the i-th mark writes for ``line`` (default: the line)."""
    out = [prefix]
    for i, (path, line, start) in enumerate(marks(lines)):
        out.append(line_mark(path, numbers(i, line) if numbers else line))
        end = marks_end(lines, start)
        out += [text + "\n" for text, _ in lines[start:end]]
    return "".join(out)


def marks(lines: Sequence[Line]) -> List[Tuple[str, int, int]]:
    """(path, line, index into ``lines``) of each ``#line`` mark ``marked`` writes."""
    out, prev = [], None
    for i, (_, where) in enumerate(lines):
        if prev is None or where != (prev[0], prev[1] + 1):
            out.append((where[0], where[1], i))
        prev = where
    return out


def marks_end(lines: Sequence[Line], start: int) -> int:
    """Where the run of lines a mark at ``start`` numbers ends."""
    end = start + 1
    while end < len(lines) and lines[end][1] == (lines[end - 1][1][0], lines[end - 1][1][1] + 1):
        end += 1
    return end


def line_mark(path: str, line: int) -> str:
    return f'#line {max(line, 1)} "{quote(path)}"\n'


def quote(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')


def directive_spans(node, src: bytes) -> List[Tuple[int, int]]:
    """Byte spans of the preprocessor directives under ``node`` that outlive the code around them: a ``#define``,
    an ``#undef`` or an ``#include`` (what follows the code sees their effect), and the ``#if``/``#else``/
    ``#endif`` lines around them (not the code between). None where there is no such directive: a ``#pragma``
    or a conditional in a body concerns that body alone."""
    out: List[Tuple[int, int]] = []
    lasting = False
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in ("preproc_def", "preproc_function_def", "preproc_call", "preproc_include"):
            directive = n.child_by_field_name("directive")
            if n.type != "preproc_call" or (directive is not None and src[directive.start_byte:directive.end_byte]
                                             .strip() == b"#undef"):
                out.append((n.start_byte, n.end_byte))
                lasting = True
            continue
        if n.type in ("preproc_if", "preproc_ifdef", "preproc_elif", "preproc_elifdef", "preproc_else"):
            head_end = _head_end(n)
            out.append((n.start_byte, head_end))
            for k in n.children:
                if k.type == "#endif":
                    out.append((k.start_byte, k.end_byte))
        stack.extend(reversed(n.children))
    return sorted(out) if lasting else []


def _head_end(n) -> int:
    """Where a conditional's directive line ends: after its condition or name, or its keyword."""
    cond = n.child_by_field_name("condition") or n.child_by_field_name("name")
    return (cond if cond is not None else n.children[0]).end_byte


def blank_keeping_directives(src: bytes, start: int, end: int, spans: Sequence[Tuple[int, int]]) -> str:
    """``src[start:end]`` blanked line for line but for the directive ``spans`` in it (a ``#define`` inside a
    body still defines its macro for what follows)."""
    out, pos = [], start
    for s, e in spans:
        s, e = max(s, start), min(e, end)
        if s < pos or s >= e:
            continue
        out.append(b"\n" * src.count(b"\n", pos, s))
        out.append(src[s:e].rstrip(b"\n"))
        pos = s + len(src[s:e].rstrip(b"\n"))
    out.append(b"\n" * src.count(b"\n", pos, end))
    return b"".join(out).decode("utf-8", "surrogateescape")
