"""C++/CUDA source at the syntax level, through tree-sitter's CUDA grammar: the blocks a file defines with
registration macros (``PYBIND11_MODULE(name, m) {...}``, ``TORCH_LIBRARY(ns, m) {...}``), found where the
grammar sees a definition, not where the text merely mentions one (a comment, a string, a macro body)."""
from __future__ import annotations

import functools
from typing import Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Sequence, Tuple


class MacroBlock(NamedTuple):
    macro: str  # e.g. "TORCH_LIBRARY"
    args: List[str]  # its arguments as written: ["myops", "m"]
    line: int  # 1-based


@functools.lru_cache(maxsize=None)
def parser():
    import tree_sitter
    import tree_sitter_cuda

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))


def parse(text: str):
    return parser().parse(text.encode("utf-8", "surrogateescape"))


def walk(node) -> Iterator:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def macro_blocks(text: str, macros: Sequence[str]) -> List[MacroBlock]:
    """Every ``MACRO(args) { ... }`` block of ``text`` whose macro is one of ``macros``, in file order, inside
    namespaces and preprocessor conditionals too (which branch is compiled is not decided here)."""
    wanted = set(macros)
    if not any(m in text for m in wanted):  # most files: no parse at all
        return []
    found = []
    for node in walk(parse(text).root_node):
        if node.type != "function_definition":
            continue
        declarator = node.child_by_field_name("declarator")
        if declarator is None or declarator.type != "function_declarator":
            continue
        callee = declarator.child_by_field_name("declarator")
        params = declarator.child_by_field_name("parameters")
        if callee is None or params is None or callee.text.decode() not in wanted:
            continue
        args = [c.text.decode(errors="replace") for c in params.named_children]
        found.append(MacroBlock(callee.text.decode(), args, node.start_point[0] + 1))
    return found


_TORCH_NAMESPACES = {"torch", "at", "c10"}


def mentions_torch(text: str) -> bool:
    """Whether code (not a comment or string) names something in torch's namespaces: ``torch::Tensor``,
    ``at::cuda::getCurrentCUDAStream()``, ``using namespace c10;``."""
    if "::" not in text and "using" not in text:
        return False
    for node in walk(parse(text).root_node):
        if node.type == "namespace_identifier" and node.text.decode() in _TORCH_NAMESPACES:
            parent = node.parent
            if parent is not None and parent.type == "qualified_identifier" \
                    and parent.child_by_field_name("scope") == node:
                return True
        elif node.type == "using_declaration" and any(c.type == "namespace" for c in node.children):
            if node.named_children and node.named_children[-1].text.decode() in _TORCH_NAMESPACES:
                return True
    return False


def includes_torch(text: str) -> bool:
    """Whether an ``#include`` of ``text`` names a header of torch's (``torch/``, ``ATen/``, ``c10/``), in any
    preprocessor branch."""
    if "include" not in text:
        return False
    for node in walk(parse(text).root_node):
        if node.type == "preproc_include":
            path = node.child_by_field_name("path")
            if path is not None and path.text.decode(errors="replace").strip('<>"').split("/")[0] in (
                    "torch", "ATen", "c10"):
                return True
    return False


def leading_include(text: str) -> Optional[str]:
    """The name in ``#include <name>`` when that directive is the first thing in ``text`` but comments (where gcc can
    take the header precompiled), else None."""
    for node in parse(text).root_node.children:
        if node.type == "comment":
            continue
        path = node.child_by_field_name("path") if node.type == "preproc_include" else None
        if path is None or path.type != "system_lib_string" or node.has_error:
            return None
        return path.text.decode(errors="replace")[1:-1].strip() or None
    return None


def line_names(text: str) -> FrozenSet[str]:
    """The file names ``#line`` directives in ``text`` give (nvcc's dependency file lists them as if read)."""
    if "#line" not in text:
        return frozenset()
    found = set()
    for node in walk(parse(text).root_node):
        if node.type == "preproc_call" and node.child_by_field_name("directive") is not None and \
                node.child_by_field_name("directive").text == b"#line":
            arg = node.child_by_field_name("argument")
            words = arg.text.decode(errors="replace").split(None, 1) if arg is not None else []
            if len(words) == 2 and words[1].startswith('"') and words[1].rstrip().endswith('"'):
                found.add(words[1].strip()[1:-1].replace('\\"', '"').replace("\\\\", "\\"))
    return frozenset(found)


def first_cuda_token(text: str, tokens: Sequence[str]) -> Optional[str]:
    """The first of ``tokens`` (CUDA-only keywords and ``<<<``: ``__global__``, ``__shared__``, ...) that the
    grammar sees in ``text`` as code rather than in a comment or string, or None."""
    wanted = set(tokens)
    if not any(t in text for t in wanted):
        return None
    for node in walk(parse(text).root_node):
        if node.child_count == 0 and node.type in wanted:
            return node.type
    return None


class Include(NamedTuple):
    kind: str  # "<" or '"'
    name: str  # as written between the delimiters
    #: (macro, must be defined) for each enclosing ``#ifdef``/``#ifndef``/``#if defined(...)`` branch the grammar
    #: can read; a condition it cannot read (``#if X > 2``) adds nothing (the branch may be compiled)
    requires: Tuple[Tuple[str, bool], ...]


class Directives(NamedTuple):
    includes: Tuple[Include, ...]
    macros: FrozenSet[str]  # names the text #defines or #undefs
    #: no directive sits where the text failed to parse (else an include may be hidden from the grammar, or a
    #: conditional's end misplaced); an unknown macro before a declaration (``KK_HD A f()``) does not count
    whole: bool
    #: an include whose header no scan of names can find: ``#include MACRO``, ``#include_next``
    computed: bool = False


CONDITIONALS = {"preproc_if", "preproc_ifdef", "preproc_elif", "preproc_elifdef"}


@functools.lru_cache(maxsize=512)
def directives(text: str) -> Directives:
    """The ``#include`` directives of ``text`` with the preprocessor conditions they sit under, as the grammar
    sees them (also inside namespaces, functions and class bodies)."""
    found, macros, whole, computed = [], set(), True, False
    root = parse(text).root_node
    for node in walk(root):
        if node.type == "ERROR" and b"#" in node.text or node.is_missing and node.type.startswith("#"):
            whole = False
        if node.type in ("preproc_def", "preproc_function_def"):
            macros.add(node.child_by_field_name("name").text.decode(errors="replace"))
            continue
        if node.type == "preproc_call":
            directive = node.child_by_field_name("directive").text.decode(errors="replace").replace(" ", "")
            arg = node.child_by_field_name("argument")
            value = arg.text.decode(errors="replace").strip() if arg is not None else ""
            if directive == "#undef":
                macros.add(value)
            elif directive == "#include" and value[:1] in "<\"" and value[-1:] in ">\"" and len(value) > 2:
                found.append(Include(value[0], value[1:-1], _requires(node)))
            elif directive in ("#include", "#include_next", "#import"):
                computed = True
            continue
        if node.type == "preproc_include":
            path = node.child_by_field_name("path")
            written = path.text.decode(errors="replace") if path is not None else ""
            if path is not None and path.type in ("string_literal", "system_lib_string") and len(written) > 2:
                found.append(Include(written[0], written[1:-1], _requires(node)))
            else:
                computed = True
    return Directives(tuple(found), frozenset(macros), whole, computed)


def _requires(node) -> Tuple[Tuple[str, bool], ...]:
    out = []
    child, parent = node, node.parent
    while parent is not None:
        if parent.type in CONDITIONALS:
            literals = condition(parent)
            if parent.child_by_field_name("alternative") == child:
                if literals is not None and len(literals) == 1:  # not (m defined) is (m not defined)
                    out.append((literals[0][0], not literals[0][1]))
            elif literals is not None:
                out += literals
        child, parent = parent, parent.parent
    return tuple(out)


def condition(node) -> Optional[List[Tuple[str, bool]]]:
    """A conditional's test as (macro, defined) literals that must all hold, or None where it is not that."""
    if node.type in ("preproc_ifdef", "preproc_elifdef"):
        name = node.child_by_field_name("name")
        negated = any(c.type in ("#ifndef", "#elifndef") for c in node.children)
        return None if name is None else [(name.text.decode(errors="replace"), not negated)]
    return _literals(node.child_by_field_name("condition"))


def _literals(expr) -> Optional[List[Tuple[str, bool]]]:
    if expr is None:
        return None
    if expr.type == "parenthesized_expression" and expr.named_child_count == 1:
        return _literals(expr.named_children[0])
    if expr.type == "preproc_defined" and expr.named_child_count == 1:
        return [(expr.named_children[0].text.decode(errors="replace"), True)]
    if expr.type == "unary_expression" and expr.child_by_field_name("operator").type == "!":
        inner = _literals(expr.child_by_field_name("argument"))
        return [(inner[0][0], not inner[0][1])] if inner is not None and len(inner) == 1 else None
    if expr.type == "binary_expression" and expr.child_by_field_name("operator").type == "&&":
        left, right = _literals(expr.child_by_field_name("left")), _literals(expr.child_by_field_name("right"))
        return left + right if left is not None and right is not None else None
    return None


#: directives a function body may hold without reaching past it (``#pragma unroll``); ``#define``, ``#undef``,
#: ``#include``, ``#line`` and conditionals in a body may change what follows it or what the host compiles
_BODY_SAFE_DIRECTIVES = {"#pragma"}


@functools.lru_cache(maxsize=64)
def device_only_bodies(text: str) -> Optional[Tuple[Tuple[int, int], ...]]:
    """Byte spans of the bodies of the functions ``text`` compiles for the device only (``__global__``, or
    ``__device__`` without ``__host__``): nvcc's host side sees only their declarations, so an edit inside
    them changes the device code alone. A body is left out where that is not plain: a deduced return type,
    a directive, or a macro that opens or closes a brace. None when the grammar could not parse all of the
    text (its recovery may take host code for a body), or the text declares a device variable template (a
    body's use of it adds a registration on the host side). A ``constexpr`` function is left out too: with
    ``--expt-relaxed-constexpr`` host code may call it. kernelkit's ``KK_MATH_FN`` counts as the ``__device__``
    it is wherever nvcc compiles (``<kernelkit/dtype.cuh>``)."""
    root = parse(as_nvcc_sees(text, _NVCC_QUALIFIER_MACROS)).root_node
    if root.has_error:
        return None
    brace_macros = _brace_macros(root)
    spans = []
    for node in walk(root):
        if node.type == "template_declaration" and any(
                c.type == "declaration" and _qualifiers(c) & {"__device__", "__constant__", "__managed__"}
                for c in node.named_children):
            return None
        if node.type != "function_definition" or "__host__" in _qualifiers(node):
            continue
        body = node.child_by_field_name("body")
        if body is None or not _qualifiers(node) & {"__global__", "__device__"} or _deduced(node) or _constexpr(node):
            continue
        if _plain_body(body, brace_macros):
            spans.append((body.start_byte, body.end_byte))
    return tuple(spans)


#: kernelkit's macros that nvcc always sees as a qualifier of the same length (spans stay valid)
_NVCC_QUALIFIER_MACROS = {b"KK_MATH_FN": b"__device__"}


def as_nvcc_sees(text: str, meanings: Dict[bytes, bytes]) -> str:
    """``text`` with each use of a macro of ``meanings`` (kernelkit's qualifier macros) written as what it expands
    to, unless the text defines or undefines that macro itself (then it is left alone: its meaning is the text's)."""
    data = text.encode("utf-8", "surrogateescape")
    if not any(m in data for m in meanings):
        return text
    root = parse(text).root_node
    own = macros_set(root)
    uses = [n for n in walk(root) if n.type in ("identifier", "type_identifier") and n.child_count == 0
            and n.text in meanings and n.text not in own]
    out = bytearray(data)
    for n in sorted(uses, key=lambda n: n.start_byte, reverse=True):  # from the end: what precedes stays put
        out[n.start_byte:n.end_byte] = meanings[n.text]
    return out.decode("utf-8", "surrogateescape")


def sets_nvcc_qualifier_macros(text: str) -> bool:
    """Whether ``text`` defines or undefines one of kernelkit's qualifier macros (``KK_MATH_FN``): then what it
    means in a TU that includes ``text`` is not what :func:`device_only_bodies` assumes."""
    data = text.encode("utf-8", "surrogateescape")
    return any(m in data for m in _NVCC_QUALIFIER_MACROS) and bool(
        macros_set(parse(text).root_node) & set(_NVCC_QUALIFIER_MACROS))


def macros_set(root) -> set:
    """Names the text ``#define``s or ``#undef``s."""
    names = set()
    for n in walk(root):
        if n.type in ("preproc_def", "preproc_function_def") and n.child_by_field_name("name") is not None:
            names.add(n.child_by_field_name("name").text)
        if n.type == "preproc_call" and n.child_by_field_name("directive").text == b"#undef":
            argument = n.child_by_field_name("argument")
            names.update(argument.text.split() if argument is not None else ())
    return names


def _constexpr(fn) -> bool:
    return any(c.type == "type_qualifier" and c.text in (b"constexpr", b"consteval") for c in fn.children)


def _qualifiers(node) -> set:
    return {c.type for c in node.children if c.type.startswith("__")}


def _deduced(fn) -> bool:
    """``auto f() {...}``: the body decides the type that host code may ask for (a trailing ``-> T`` does not)."""
    kind = fn.child_by_field_name("type")
    declarator = fn.child_by_field_name("declarator")
    trailing = declarator is not None and any(c.type == "trailing_return_type" for c in walk(declarator))
    return kind is not None and kind.type == "placeholder_type_specifier" and not trailing


def _plain_body(body, brace_macros: FrozenSet[str]) -> bool:
    stack = [body]
    while stack:
        n = stack.pop()
        if n.type == "ERROR" or n.is_missing:
            return False
        if n.type.startswith("preproc_"):
            directive = n.child_by_field_name("directive")
            if n.type != "preproc_call" or directive is None or directive.text.decode(errors="replace") \
                    not in _BODY_SAFE_DIRECTIVES:
                return False
            continue
        if n.type == "identifier" and n.text.decode(errors="replace") in brace_macros:
            return False
        stack.extend(n.children)
    return True


def _brace_macros(root) -> FrozenSet[str]:
    """Macros of the text whose replacement has unbalanced braces: a use may end a function body."""
    found = set()
    for n in walk(root):
        if n.type in ("preproc_def", "preproc_function_def"):
            value = n.child_by_field_name("value")
            body = value.text.decode(errors="replace") if value is not None else ""
            if body.count("{") != body.count("}"):
                found.add(n.child_by_field_name("name").text.decode(errors="replace"))
    return frozenset(found)
