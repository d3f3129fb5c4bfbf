"""What kernel-only CUDA source declares, read with tree-sitter's CUDA grammar: its ``#include`` directives, the
object-like macros an include may name, its ``__global__`` functions, and what each parameter accepts from Python.

NVRTC compiles a kernel but does not say what its parameters are, and the driver only knows their sizes.
So the declarations are parsed here: each parameter gets a packing code for the launcher (see
``loader/csrc/launch.cpp``) and, for pointers, the torch dtype a tensor argument must have. A Python float
is converted to the declared type (``float``, ``double``, ``half``, ...), never guessed.

The parse sees every preprocessor branch (which one is compiled is NVRTC's to decide): :func:`bind` keeps
exactly the kernels the compiled cubin holds, and gives each its declaration where the source has one.
"""
from __future__ import annotations

import functools
import json
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

#: scalar C types -> packing code of the launcher
_SCALARS = {
    "bool": "b",
    "char": "c", "signed char": "c", "int8_t": "c",
    "unsigned char": "C", "uint8_t": "C",
    "short": "s", "short int": "s", "signed short": "s", "int16_t": "s",
    "unsigned short": "S", "unsigned short int": "S", "uint16_t": "S",
    "int": "i", "signed": "i", "signed int": "i", "int32_t": "i",
    "unsigned": "I", "unsigned int": "I", "uint32_t": "I",
    "long": "l", "long int": "l", "long long": "l", "long long int": "l", "int64_t": "l", "ptrdiff_t": "l",
    "unsigned long": "L", "unsigned long int": "L", "unsigned long long": "L", "unsigned long long int": "L",
    "uint64_t": "L", "size_t": "L",
    "float": "f",
    "double": "d",
    "half": "h", "__half": "h",
    "__nv_bfloat16": "B", "nv_bfloat16": "B",
}

#: pointee C types -> the dtype a tensor passed for it must have (None: any dtype)
_POINTEES = {
    "void": None,
    "float": torch.float32, "float2": torch.float32, "float4": torch.float32,
    "double": torch.float64, "double2": torch.float64,
    "half": torch.float16, "__half": torch.float16, "half2": torch.float16, "__half2": torch.float16,
    "__nv_bfloat16": torch.bfloat16, "nv_bfloat16": torch.bfloat16, "__nv_bfloat162": torch.bfloat16,
    "bool": torch.bool,
    "char": torch.int8, "signed char": torch.int8, "int8_t": torch.int8,
    "unsigned char": torch.uint8, "uint8_t": torch.uint8,
    "short": torch.int16, "int16_t": torch.int16,
    "int": torch.int32, "int32_t": torch.int32, "int2": torch.int32, "int4": torch.int32,
    "unsigned": torch.uint32, "unsigned int": torch.uint32, "uint32_t": torch.uint32,
    "long": torch.int64, "long long": torch.int64, "int64_t": torch.int64,
    "unsigned long": torch.uint64, "unsigned long long": torch.uint64, "uint64_t": torch.uint64,
    "size_t": torch.uint64,
}

#: nodes whose children can declare kernels or hold directives (function bodies are entered only when they hold a "#")
_CONTAINERS = frozenset({"translation_unit", "preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif",
                         "preproc_elifdef", "linkage_specification", "namespace_definition", "declaration_list",
                         "template_declaration", "ERROR"})
#: CUDA attributes the grammar does not know: blanked out before parsing, as they only tune code generation
_UNKNOWN_ATTRIBUTES = ("__cluster_dims__", "__maxnreg__")
_DECLARATORS = ("pointer_declarator", "abstract_pointer_declarator", "array_declarator", "abstract_array_declarator")


class Param(NamedTuple):  # NamedTuples, not dataclasses: creating a dataclass costs a warm start ~0.7 ms
    name: str
    ctype: str  # as declared, qualifiers removed, e.g. "float*" or "unsigned int"
    code: str  # the launcher's packing code; "?" for a type kernelkit cannot pass
    dtype: Optional[torch.dtype] = None  # pointers: the tensor dtype required (None: any)

    def describe(self) -> str:
        return f"{self.ctype} {self.name}"


class Signature(NamedTuple):
    kernel: str  # the name expression: "scale", "ns::scale" or "axpy<float>"
    params: Tuple[Param, ...]
    declared: bool = True  # False: the program has the kernel, the source shows no declaration of it (a macro?)

    def __str__(self) -> str:
        if not self.declared:
            return f"{self.kernel}(?)"
        return f"{self.kernel}({', '.join(p.describe() for p in self.params)})"

    def unsupported(self) -> List[Param]:
        return [p for p in self.params if p.code == "?"]


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
    from ..jit import syntax  # the parser: only when a text is read (a warm start reads the cached outline)

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
    from ..jit import syntax

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


def param(raw: RawParam, types: Dict[str, str]) -> Param:
    """What ``raw`` accepts from Python; ``types`` substitutes template type parameters (``{"T": "float"}``)."""
    base = types.get(raw.base, raw.base)
    shown = base + "*" * raw.depth
    if not raw.plain:
        return Param(raw.name, shown, "?")
    if raw.depth == 1:
        return Param(raw.name, shown, "p", _POINTEES.get(base))
    if raw.depth > 1:
        return Param(raw.name, shown, "p", None)
    return Param(raw.name, shown, _SCALARS.get(base, "?"))


def parse_param(text: str, index: int = 0, types: Optional[Dict[str, str]] = None) -> Param:
    """One parameter as written, e.g. ``const float* __restrict__ x`` -> Param("x", "float*", "p", torch.float32)."""
    decl = scan(f"__global__ void k({text});").kernels[0]
    raw = decl.params[0]
    return param(raw._replace(name=f"arg{index}") if raw.name == "arg0" else raw, types or {})


def template_arguments(expression: str) -> Tuple[str, List[str]]:
    """``"axpy<float, 256>"`` -> ("axpy", ["float", "256"])."""
    expression = expression.strip()
    if "<" not in expression:
        return expression, []
    name = expression[:expression.index("<")].strip()
    inner = expression[expression.index("<") + 1:expression.rindex(">")]
    return name, _split_top_level(inner, ",")


def _split_top_level(text: str, sep: str) -> List[str]:
    """Split a name expression or a demangled name on ``sep`` outside <>, () and []."""
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += 1 if ch in "<([" else -1 if ch in ">)]" else 0
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    return parts + [tail] if tail else parts


def signature(decl: Declaration, expression: Optional[str] = None) -> Signature:
    """The signature of ``decl`` as instantiated by ``expression`` (``"axpy<float>"``)."""
    expression = expression or decl.name
    _, args = template_arguments(expression)
    if len(args) > len(decl.template) and not any(kind.endswith("...") for kind, _ in decl.template):
        raise ValueError(f"{expression}: {decl.name} has {len(decl.template)} template parameter(s)")
    types = {name: " ".join(actual.split()) for (kind, name), actual in zip(decl.template, args)
             if kind in ("typename", "class")}
    return Signature(expression, tuple(param(p, types) for p in decl.params))


def kernel_name(demangled: str) -> str:
    """The name expression a demangled kernel symbol stands for: ``"void axpy<double, 4>(double*, long long)"``
    -> ``"axpy<double, 4>"``, ``"ns::scale(float*)"`` -> ``"ns::scale"``, ``"(anonymous namespace)::k(int)"`` -> ``"k"``."""
    head = demangled.strip()
    depth = 0
    for i in range(len(head) - 1, -1, -1):  # the parameter list is the last parenthesised group
        depth += {")": 1, "(": -1}.get(head[i], 0)
        if depth == 0:
            head = head[:i]
            break
    words = _split_top_level(head, " ")  # a template's name follows its return type
    return (words[-1] if words else head).replace("(anonymous namespace)::", "")


def _index(kernels: Sequence[Declaration]) -> Dict[Tuple[str, bool], List[Declaration]]:
    """(name, by C name) -> declarations: each kernel under its qualified name, and an ``extern "C"`` one also
    under its unqualified name (its symbol's)."""
    index: Dict[Tuple[str, bool], List[Declaration]] = {}
    for k in kernels:
        if k.name:
            index.setdefault((k.name, False), []).append(k)
            if k.extern_c:
                index.setdefault((k.name.rsplit("::", 1)[-1], True), []).append(k)
    return index


def declared(kernels: Sequence[Declaration], name: str, extern_c: Optional[bool] = None,
             index: Optional[Dict[Tuple[str, bool], List[Declaration]]] = None) -> Optional[Declaration]:
    """The declaration of the kernel ``name`` (an ``extern "C"`` symbol is matched by its unqualified name), None
    if the source shows none. Raises ValueError when declarations of that name differ in their parameters."""
    found = (_index(kernels) if index is None else index).get((name, bool(extern_c)), [])
    found = [k for k in found if extern_c is None or k.extern_c == extern_c]
    if len(found) > 1 and len({(k.template, tuple(p._replace(name="") for p in k.params)) for k in found}) > 1:
        lines = ", ".join(str(k.line) for k in found)
        raise ValueError(f"kernel {name} is declared with different parameters (lines {lines}: overloads, or "
                         "#if branches); kernelkit cannot tell which one NVRTC compiled: give each kernel its own name")
    return next((k for k in found if k.defined), found[0] if found else None)


def check_expressions(kernels: Sequence[Declaration], name_expressions: Sequence[str]) -> None:
    """Each name expression must name a ``__global__`` function of the source (ValueError otherwise)."""
    names = {k.name for k in kernels if k.name}
    for expr in name_expressions:
        if template_arguments(expr)[0] not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ValueError(f"name_expressions: {expr!r} names no __global__ function of the source (kernels: {known})")


def bind(kernels: Sequence[Declaration], entries: Sequence[Tuple[str, str]], lowered: Dict[str, str]
         ) -> Tuple[Dict[str, Signature], Dict[str, str]]:
    """Exactly the kernels a compiled program holds: (name -> Signature, name -> symbol in the cubin).
    ``entries``: the cubin's kernels as (symbol, demangled name; "" for C linkage); ``lowered``: each name
    expression compiled -> its symbol. A kernel the source shows no declaration of (one a macro defines) is
    kept with ``declared=False``: it exists, but its parameters are not known."""
    signatures: Dict[str, Signature] = {}
    symbols: Dict[str, str] = {}
    index = _index(kernels)
    for expr, symbol in lowered.items():
        decl = declared(kernels, template_arguments(expr)[0], index=index)
        signatures[expr] = signature(decl, expr) if decl is not None else Signature(expr, (), False)
        symbols[expr] = symbol
    claimed = set(lowered.values())
    for symbol, demangled in entries:
        if symbol in claimed:
            continue
        name = kernel_name(demangled) if demangled else symbol
        decl = declared(kernels, template_arguments(name)[0], extern_c=not demangled, index=index)
        signatures.setdefault(name, signature(decl, name) if decl is not None else Signature(name, (), False))
        symbols.setdefault(name, symbol)
    return signatures, symbols
