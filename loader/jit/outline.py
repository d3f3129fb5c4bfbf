"""What kernel-only CUDA source declares, read with tree-sitter's CUDA grammar: its ``#include`` directives, the
object-like macros an include may name, and its ``__global__`` functions with their parameters as written.

The JIT core reads the includes and macros (``nvrtc`` hands every local header to NVRTC from memory); instant
kernels read the kernels (``instant.signature`` turns each parameter into what it accepts from Python). The parse
sees every preprocessor branch: which one is compiled is NVRTC's to decide.
"""
from __future__ import annotations

import functools
import json
from typing import Dict, NamedTuple, Tuple

#: nodes whose children can declare kernels or hold directives (function bodies are entered only when they hold a "#")
_CONTAINERS = frozenset({"translation_unit", "preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif",
                         "preproc_elifdef", "linkage_specification", "namespace_definition", "declaration_list",
                         "template_declaration", "ERROR"})
#: CUDA attributes the grammar does not know: blanked out before parsing, as they only tune code generation
_UNKNOWN_ATTRIBUTES = ("__cluster_dims__", "__maxnreg__")
_DECLARATORS = ("pointer_declarator", "abstract_pointer_declarator", "array_declarator", "abstract_array_declarator")


class RawParam(NamedTuple):
    """A parameter as written, before template arguments are substituted."""
    name: str
    base: str  # the type without qualifiers or declarators: "float", "T", "unsigned long long"
    depth: int  # pointer levels (an array parameter is a pointer)
    plain: bool  # False for references, function pointers and anything the grammar could not read


class Declaration(NamedTuple):
    """A ``__global__`` function as written: its template parameters and parameters."""
    name: str  # qualified by its named namespaces: "scale", "ns::scale"
    template: Tuple[Tuple[str, str], ...]  # (kind, name): ("typename", "T"), ("int", "BLOCK")
    params: Tuple[RawParam, ...]
    extern_c: bool
    line: int  # 1-based
    defined: bool  # a definition, not only a declaration


class Include(NamedTuple):
    kind: str  # '"', "<", or "macro" (``#include NAME``: ``name`` is the macro's name, or the text written)
    name: str
    line: int


class Outline(NamedTuple):
    includes: Tuple[Include, ...]
    macros: Dict[str, Tuple[str, ...]]  # object-like macro -> every value it is given (any branch)
    kernels: Tuple[Declaration, ...]

    def to_json(self) -> str:
        return json.dumps([self.includes, self.macros, self.kernels])

    @staticmethod
    def from_json(text: str) -> "Outline":
        """The outline :meth:`to_json` wrote (ValueError/TypeError if ``text`` is not one)."""
        includes, macros, kernels = json.loads(text)
        return Outline(tuple(Include(*i) for i in includes), {k: tuple(v) for k, v in macros.items()},
                       tuple(Declaration(name, tuple(map(tuple, template)), tuple(RawParam(*p) for p in params),
                                         extern_c, line, defined)
                             for name, template, params, extern_c, line, defined in kernels))


@functools.lru_cache(maxsize=256)
def scan(text: str) -> Outline:
    """The include directives, object-like macros and ``__global__`` functions of ``text``, in file order, in
    every preprocessor branch. Linear in the text; cached by content (a reload of an unchanged file is free)."""
    from . import syntax  # the parser: only when a text is read (a warm start reads the cached outline)

    data = _blank_unknown_attributes(text.encode("utf-8", "surrogateescape"))
    includes, macros, kernels = [], {}, []
    stack = [(syntax.parser().parse(data).root_node, (), False, ())]
    while stack:
        node, scope, extern_c, template = stack.pop()
        kind = node.type
        if kind == "preproc_include":
            includes.append(_include(node))
        elif kind == "preproc_def":
            value = node.child_by_field_name("value")
            macros.setdefault(_text(node.child_by_field_name("name")), []).append(_text(value).strip() if value else "")
        elif kind in ("function_definition", "declaration") and any(c.type == "__global__" for c in node.children):
            kernels.append(_declaration(node, scope, extern_c, template))
        scope, extern_c, template = _context(node, scope, extern_c, template)
        if kind in _CONTAINERS or (node.child_count and data.find(b"#", node.start_byte, node.end_byte) >= 0):
            stack.extend((c, scope, extern_c, template) for c in reversed(node.children))
    return Outline(tuple(includes), {k: tuple(v) for k, v in macros.items()}, tuple(kernels))


def _text(node) -> str:
    return node.text.decode("utf-8", "replace") if node is not None else ""


def _blank_unknown_attributes(data: bytes) -> bytes:
    """``data`` with each ``__cluster_dims__(...)``/``__maxnreg__(...)`` replaced by spaces (offsets and lines kept),
    found as the grammar's own tokens, so that the kernel they qualify parses as one declaration."""
    if not any(a.encode() in data for a in _UNKNOWN_ATTRIBUTES):
        return data
    from . import syntax

    out = bytearray(data)
    stack = [syntax.parser().parse(data).root_node]
    while stack:
        node = stack.pop()
        if node.child_count == 0 and _text(node) in _UNKNOWN_ATTRIBUTES:
            end = _after_parentheses(data, node.end_byte)
            out[node.start_byte:end] = bytes(b if b == 0x0A else 0x20 for b in data[node.start_byte:end])
        stack.extend(node.children)
    return bytes(out)


def _after_parentheses(data: bytes, i: int) -> int:
    """The offset just past the parenthesised argument list that starts at ``i`` (after blanks); ``i`` if none."""
    j = i
    while j < len(data) and data[j] in b" \t\r\n":
        j += 1
    if j >= len(data) or data[j] != 0x28:
        return i
    depth = 0
    for k in range(j, len(data)):
        depth += {0x28: 1, 0x29: -1}.get(data[k], 0)
        if depth == 0:
            return k + 1
    return len(data)


def _include(node) -> Include:
    path = node.child_by_field_name("path")
    line = node.start_point[0] + 1
    if path is not None and path.type == "string_literal":
        return Include('"', "".join(_text(c) for c in path.named_children), line)
    if path is not None and path.type == "system_lib_string":
        return Include("<", _text(path)[1:-1], line)
    return Include("macro", _text(path), line)


def _context(node, scope: Tuple[str, ...], extern_c: bool, template: tuple):
    """(named namespaces, inside ``extern "C"``, template parameters) for ``node``'s children."""
    if node.type == "namespace_definition":
        name = node.child_by_field_name("name")
        parts = [_text(c) for c in name.named_children] if name is not None and name.named_children else \
            ([_text(name)] if name is not None else [])  # an anonymous namespace qualifies nothing
        return scope + tuple(parts), extern_c, ()
    if node.type == "linkage_specification":
        return scope, _text(node.child_by_field_name("value")) == '"C"', ()
    if node.type == "template_declaration":
        return scope, extern_c, _template_params(node.child_by_field_name("parameters"))
    return scope, extern_c, () if node.type not in ("preproc_if", "preproc_ifdef", "preproc_else",
                                                    "preproc_elif", "preproc_elifdef") else template


def _template_params(plist) -> Tuple[Tuple[str, str], ...]:
    out = []
    for p in plist.named_children if plist is not None else ():
        if p.type in ("type_parameter_declaration", "optional_type_parameter_declaration",
                      "variadic_type_parameter_declaration"):
            keyword = next((c.type for c in p.children if c.type in ("typename", "class")), "typename")
            keyword += "..." if p.type.startswith("variadic") else ""
            name = p.child_by_field_name("name") or next((c for c in p.named_children if c.type == "type_identifier"),
                                                         None)
            out.append((keyword, _text(name)))
        elif p.type in ("parameter_declaration", "optional_parameter_declaration"):
            out.append((" ".join(_text(p.child_by_field_name("type")).split()),
                        _text(_innermost(p.child_by_field_name("declarator"))[0])))
    return tuple(out)


def _function_declarator(node):
    d = node.child_by_field_name("declarator")
    while d is not None and d.type != "function_declarator":
        d = d.child_by_field_name("declarator")
    return d


def _declaration(node, scope: Tuple[str, ...], extern_c: bool, template: tuple) -> Declaration:
    fn = _function_declarator(node)
    line = node.start_point[0] + 1
    if fn is None:  # the grammar could not read it: NVRTC decides whether it exists, its parameters are unknown
        return Declaration("", template, (), extern_c, line, False)
    name = "".join(_text(fn.child_by_field_name("declarator")).split())
    params = [c for c in fn.child_by_field_name("parameters").named_children if c.type != "comment"]
    raw = tuple(_raw_param(p, i) for i, p in enumerate(params))
    if raw == (RawParam("arg0", "void", 0, True),):  # k(void)
        raw = ()
    return Declaration("::".join(scope + (name,)), template, raw, extern_c, line,
                       node.type == "function_definition")


def _innermost(declarator) -> Tuple[object, int, bool]:
    """(the name node or None, pointer depth, plain) of a parameter's declarator."""
    depth, plain = 0, True
    while declarator is not None and declarator.type not in ("identifier", "field_identifier"):
        if declarator.type in _DECLARATORS:
            depth += 1
        else:  # references, function pointers, parenthesised declarators: not passed from Python
            plain = False
        inner = declarator.child_by_field_name("declarator")
        if inner is None:
            inner = next((c for c in declarator.named_children if c.type != "type_qualifier"), None)
        declarator = inner
    return declarator, depth, plain


def _raw_param(node, index: int) -> RawParam:
    if node.type not in ("parameter_declaration", "optional_parameter_declaration") or node.has_error:
        return RawParam(f"arg{index}", _text(node), 0, False)
    kind = node.child_by_field_name("type")
    name, depth, plain = _innermost(node.child_by_field_name("declarator"))
    if kind is not None and kind.type in ("struct_specifier", "class_specifier", "union_specifier",
                                          "enum_specifier"):
        kind = kind.child_by_field_name("name")
    base = " ".join(_text(kind).split())
    if not plain:  # shown as written, less its name: "float &", "void (*)(int)"
        written = node.text if name is None else \
            node.text[:name.start_byte - node.start_byte] + node.text[name.end_byte - node.start_byte:]
        base, depth = " ".join(written.decode("utf-8", "replace").split()), 0
    return RawParam(_text(name) if name is not None else f"arg{index}", base, depth, plain)
