"""tree-sitter helpers for the split: parsing, walking, identifier tokens, and the masking of what the grammar
cannot see through: qualifier macros (``#define HD __host__ __device__``, ``C10_HOST_DEVICE``) and the header
name of ``__has_include(<...>)``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterator, List, Tuple

from ... import syntax

#: tokens a qualifier macro may expand to: whatever else a macro holds, the split does not guess at it
QUALIFIER_TOKENS = frozenset({"__host__", "__device__", "__global__", "__forceinline__", "__noinline__",
                              "__inline__", "inline", "static", "constexpr"})
#: torch's qualifier macros (c10/macros/Macros.h), by what they mean to nvcc
TORCH_QUALIFIERS: Dict[str, FrozenSet[str]] = {
    "C10_HOST_DEVICE": frozenset({"__host__", "__device__"}),
    "C10_DEVICE": frozenset({"__device__"}),
    "C10_HOST": frozenset({"__host__"}),
    "C10_ALWAYS_INLINE": frozenset({"inline"}),
}
#: torch's launch-bounds macros, replaced by the grammar's own keyword (same length after padding) to parse
LAUNCH_BOUNDS_MACROS = ("C10_LAUNCH_BOUNDS_0", "C10_LAUNCH_BOUNDS_1", "C10_LAUNCH_BOUNDS_2")
IDENTIFIER_TYPES = frozenset({"identifier", "type_identifier", "namespace_identifier"})
_PREPROC_NAMES = frozenset({"preproc_def", "preproc_function_def", "preproc_ifdef", "preproc_defined",
                            "preproc_call"})
_SKIP = frozenset({"comment", "string_literal", "raw_string_literal", "char_literal", "system_lib_string"})


def parse(text: str):
    return syntax.parse(text)


walk = syntax.walk  # every node, in document order


def leaves(node) -> Iterator:
    """Leaf tokens in order, without comments and literals (whose text is not code)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in _SKIP:
            continue
        if n.child_count == 0:
            yield n
        else:
            stack.extend(reversed(n.children))


def text(node, src: bytes) -> str:
    return src[node.start_byte:node.end_byte].decode("utf-8", "surrogateescape")


def line(node) -> int:
    return node.start_point[0] + 1


def identifiers(node, src: bytes) -> Iterator[Tuple[str, object]]:
    """(name, leaf) for every identifier-like token under ``node``, macro bodies included (tokenised by
    parsing the body on its own: the grammar keeps a macro's replacement text as one leaf)."""
    for leaf in leaves(node):
        if leaf.type in IDENTIFIER_TYPES:
            yield text(leaf, src), leaf
        elif leaf.type == "preproc_arg":
            for name in macro_body_names(text(leaf, src)):
                yield name, leaf
        elif leaf.type in QUALIFIER_TOKENS or leaf.type.startswith("__"):
            yield leaf.type, leaf


def macro_body_names(body: str) -> List[str]:
    """Identifier tokens of a macro's replacement text, keywords such as ``__global__`` included."""
    tree = parse(body)
    src = body.encode("utf-8", "surrogateescape")
    out = []
    for leaf in leaves(tree.root_node):
        if leaf.type in IDENTIFIER_TYPES or leaf.type == "field_identifier":
            out.append(text(leaf, src))
        elif leaf.type.startswith("__") or leaf.type in ("<<<", ">>>"):
            out.append(leaf.type)
    return out


def has_launch_syntax(body: str) -> bool:
    return any(n.type == "kernel_call_syntax" for n in walk(parse(body).root_node)) or "<<<" in body


@dataclass
class Masked:
    """The text the grammar parses: qualifier macros blanked (same length, so byte offsets agree with the
    original), with where each one was and what it stands for."""

    src: bytes
    tree: object
    qualifiers: List[Tuple[int, int, FrozenSet[str]]]  # (start byte, end byte, qualifier tokens)
    macros: Dict[str, FrozenSet[str]]  # qualifier macro name -> tokens (the user's and torch's)
    names: List[Tuple[int, str]] = field(default_factory=list)  # (start byte, macro name) of every masked use
    #: start bytes of the ``__has_include`` tokens whose argument is a ``<...>`` header name (masked to blanks):
    #: the one form whose answer does not depend on where the file including it is written
    angle_probes: FrozenSet[int] = frozenset()

    def masked_names(self, start: int, end: int) -> List[str]:
        return [n for s, n in self.names if start <= s < end]

    def qualifiers_in(self, start: int, end: int) -> FrozenSet[str]:
        found = set()
        for s, e, q in self.qualifiers:
            if start <= s and e <= end:
                found |= q
        return frozenset(found)


def qualifier_macros(root, src: bytes) -> Dict[str, FrozenSet[str]]:
    """Object-like macros whose replacement is only CUDA qualifiers, in file order (one may use another)."""
    found: Dict[str, FrozenSet[str]] = dict(TORCH_QUALIFIERS)
    for node in walk(root):
        if node.type != "preproc_def":
            continue
        name, value = node.child_by_field_name("name"), node.child_by_field_name("value")
        if name is None or value is None:
            continue
        words = text(value, src).split()
        expanded = set()
        for w in words:
            if w in QUALIFIER_TOKENS:
                expanded.add(w)
            elif w in found:
                expanded |= found[w]
            else:
                break
        else:
            if words and expanded & {"__host__", "__device__", "__global__", "__forceinline__"}:
                found[text(name, src)] = frozenset(expanded)
    return found


def mask(text_: str) -> Masked:
    src = text_.encode("utf-8", "surrogateescape")
    tree = parse(text_)
    macros = qualifier_macros(tree.root_node, src)
    buf = bytearray(src)
    spans, names = [], []
    for leaf in leaves(tree.root_node):
        if leaf.type not in IDENTIFIER_TYPES:
            continue
        name = text(leaf, src)
        if leaf.parent is not None and leaf.parent.type in _PREPROC_NAMES:
            continue  # the macro's own name in its #define, or a test of whether it is defined
        if name in macros:
            buf[leaf.start_byte:leaf.end_byte] = b" " * (leaf.end_byte - leaf.start_byte)
            spans.append((leaf.start_byte, leaf.end_byte, macros[name]))
            names.append((leaf.start_byte, name))
        elif name in LAUNCH_BOUNDS_MACROS:
            names.append((leaf.start_byte, name))
            kw = b"__launch_bounds__"
            buf[leaf.start_byte:leaf.end_byte] = kw + b" " * (leaf.end_byte - leaf.start_byte - len(kw))
    probes = header_name_probes(tree.root_node, src)
    for _, start, end in probes:
        buf[start:end] = b" " * (end - start)
    skipped = never_compiled(src)
    if not names and not probes and not skipped:
        return Masked(src, tree, [], macros)
    masked = blank(bytes(buf), skipped)
    return Masked(src, parse(masked.decode("utf-8", "surrogateescape")), spans, macros, names,
                  frozenset(p for p, _, _ in probes))


def header_name_probes(root, src: bytes) -> List[Tuple[int, int, int]]:
    """(identifier start, ``<`` start, ``>`` end) for each ``__has_include(<name>)``: the grammar lexes the header
    name as operators (an ERROR), so its bytes are read the way the preprocessor lexes a header name instead."""
    out = []
    for leaf in leaves(root):
        if leaf.type not in IDENTIFIER_TYPES or text(leaf, src) != "__has_include":
            continue
        i = leaf.end_byte
        while i < len(src) and src[i] in b" \t":
            i += 1
        if src[i:i + 1] != b"(":
            continue
        lt = i + 1
        while lt < len(src) and src[lt] in b" \t":
            lt += 1
        gt = src.find(b">", lt)
        name = src[lt + 1:gt]
        if src[lt:lt + 1] != b"<" or gt < 0 or any(c in name for c in b"\n\"()<") or b"//" in name or b"/*" in name:
            continue  # not one header name on the line (or one with a comment opener in it): left to refuse
        close = gt + 1
        while close < len(src) and src[close] in b" \t":
            close += 1
        if src[close:close + 1] == b")":
            out.append((leaf.start_byte, lt, gt + 1))
    return out


def blank(src: bytes, spans: List[Tuple[int, int]]) -> bytes:
    """``src`` with the bytes of ``spans`` blanked, newlines kept (so lines and byte offsets still agree)."""
    buf = bytearray(src)
    for start, end in spans:
        buf[start:end] = bytes(b if b == 0x0A else 0x20 for b in src[start:end])
    return bytes(buf)


def never_compiled(src: bytes) -> List[Tuple[int, int]]:
    """Byte spans of the groups under ``#if 0`` (up to its ``#else``/``#elif``/``#endif``), which the preprocessor
    skips whatever they hold, found as it finds them: directives at the start of a line, outside comments,
    counted through nested conditionals. Old code kept there need not parse. An unclosed group gives nothing."""
    out: List[Tuple[int, int]] = []
    depth, start, in_comment, pos = 0, -1, False, 0
    for raw in src.splitlines(keepends=True):
        line_start, pos = pos, pos + len(raw)
        code, in_comment = _outside_comments(raw, in_comment)
        if not code.startswith(b"#"):
            continue
        words = code[1:].split()
        word = words[0] if words else b""
        if start < 0:
            if word == b"if" and words[1:2] == [b"0"] and len(words) == 2:
                start, depth = pos, 0
            continue
        if word in (b"if", b"ifdef", b"ifndef"):
            depth += 1
        elif word == b"endif" and depth:
            depth -= 1
        elif word in (b"endif", b"else", b"elif", b"elifdef", b"elifndef") and depth == 0:
            out.append((start, line_start))
            start = -1
    return out


def _outside_comments(line: bytes, in_comment: bool) -> Tuple[bytes, bool]:
    """``line`` with its comments removed (stripped), and whether a block comment is still open at its end."""
    kept, i = bytearray(), 0
    while i < len(line):
        if in_comment:
            end = line.find(b"*/", i)
            if end < 0:
                return bytes(kept).strip(), True
            i, in_comment = end + 2, False
            kept += b" "
        elif line.startswith(b"/*", i):
            in_comment, i = True, i + 2
        elif line.startswith(b"//", i):
            break
        else:
            kept.append(line[i])
            i += 1
    return bytes(kept).strip(), in_comment
