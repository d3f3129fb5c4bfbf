"""The device TU: the file as written, less what only the host side owns, with a light prelude in place of
torch's umbrella headers. Everything else stays where it is, line for line: pragmas, using-directives, macros
defined and undefined anywhere, include guards, linkage blocks, the preprocessor branches around each piece,
so the name lookup and preprocessor state at every kept line is the file's own.

Taken out (blanked, their directives kept): host functions and host function declarations (device code cannot
call them: nvcc rejects such a call, so a file that builds never needs one), and declarations that name torch's
heavy API (``torch::Tensor``, pybind11, registration macros) where device code does not name what they declare.
The prelude (``PRELUDE``: the c10 types, accessors and macros device code uses, and what torch's umbrella
headers include from the standard library and CUDA) is a subset of what those headers declare; what it misses
fails to compile, which builds the file as written. What a construct the model does not see might still change
is what the proof (``jit.split_proof``) compares: this TU's PTX against the file's as written."""
from __future__ import annotations

from typing import Dict, List, Set

from . import tree as ts
from .layout import Edit, Line, blank_keeping_directives, directive_spans, rewrite
from .model import DEVICE_KINDS, Item, Model, anon_opener
from .source import Flat

#: what torch's umbrella headers gave device code, light enough to compile with it in about a second: the
#: standard and CUDA headers always, and each of torch's light headers where kept code names what it declares
PRELUDE = ("cstdint", "cstddef", "cstdio", "cstdlib", "cmath", "cfloat", "climits", "limits", "type_traits",
           "utility", "algorithm", "cuda.h", "cuda_fp16.h", "cuda_bf16.h", "c10/macros/Macros.h")
_ACCESSORS = ("PackedTensorAccessor32", "PackedTensorAccessor64", "GenericPackedTensorAccessor",
              "PackedTensorAccessor", "TensorAccessor", "TensorAccessorBase", "GenericPackedTensorAccessorBase",
              "RestrictPtrTraits", "DefaultPtrTraits")
PRELUDE_BY_NAME = (("c10/util/Half.h", ("Half",)), ("c10/util/BFloat16.h", ("BFloat16",)),
                   ("c10/util/complex.h", ("complex",)), ("c10/core/ScalarType.h", ("ScalarType",)),
                   ("ATen/core/TensorAccessor.h", _ACCESSORS))
PRELUDE_MARK = "// kernelkit split: prelude"
PRELUDE_FILE = "<kernelkit: prelude>"  # what the prelude's lines cite
#: torch's umbrella headers declare torch:: as at:: (torch/types.h); the prelude says the same
TORCH_ALIAS = "namespace torch { using namespace at; }"
#: namespaces of torch's heavy API: a declaration naming one is host code unless device code names it
HEAVY_SCOPES = frozenset({"torch", "at", "c10", "caffe2", "pybind11", "py"})
#: what the prelude declares under those namespaces (anything else there needs torch's umbrella headers)
LIGHT_NAMES = frozenset({
    "Half", "BFloat16", "complex", "ScalarType", "PackedTensorAccessor32", "PackedTensorAccessor64", "GenericPackedTensorAccessor",
    "PackedTensorAccessor", "TensorAccessor", "TensorAccessorBase", "GenericPackedTensorAccessorBase",
    "RestrictPtrTraits", "DefaultPtrTraits", "Float8_e4m3fn", "Float8_e5m2", "cuda", "detail", "headeronly"})
#: macro prefixes of torch's heavy API (TORCH_CHECK, AT_DISPATCH_*, PYBIND11_MODULE, C10_CUDA_CHECK, ...)
HEAVY_MACROS = ("TORCH_", "AT_", "PYBIND11_", "C10_CUDA_", "C10_REGISTER", "C10_DEFINE", "C10_DECLARE",
                "TORCH_LIBRARY")
_REMOVABLE = frozenset({"decl", "using", "other", "fn_decl", "host_fn"})


def prelude_text(names) -> str:
    """The prelude for kept code that uses ``names``."""
    headers = list(PRELUDE) + [h for h, wanted in PRELUDE_BY_NAME if set(wanted) & names]
    return "\n".join([PRELUDE_MARK] + [f"#include <{h}>" for h in headers] + [TORCH_ALIAS]) + "\n"


def device_lines(model: Model, flat: Flat, heavy_include, frame: bool = False, whole_prelude: bool = False
                 ) -> List[Line]:
    """The device TU as (line, origin) pairs. ``heavy_include(name)``: whether an ``#include`` of torch's (the
    name as written) is one the prelude stands in for, rather than a light header kept as written. ``frame``:
    without its device code too (what a proof covers besides the names that code uses). ``whole_prelude``: with
    every light header (for code that reaches a torch type without naming it)."""
    src = model.src
    needed = _named_by_device_code(model)
    removed = _host_only_items(model, needed)
    prelude = prelude_text({n for _, names in PRELUDE_BY_NAME for n in names} if whole_prelude
                           else _kept_names(model, removed))
    edits: List[Edit] = []
    prelude_done = False
    for it in model.items:
        if it.kind == "torch_include":
            name = model.text(it.node.child_by_field_name("path"))
            if not heavy_include(name):
                continue
            edits.append(Edit(it.start, it.end, "" if prelude_done else prelude, cite=PRELUDE_FILE))
            prelude_done = True
        elif id(it) in removed or (frame and (it.kind in DEVICE_KINDS or it.kind == "hd_fn")):
            edits.append(Edit(it.start, it.end, blank_keeping_directives(src, it.start, it.end,
                                                                         directive_spans(it.node, model.src))))
    for ns in model.anon_namespaces:
        body = ns.child_by_field_name("body")
        edits.append(Edit(ns.start_byte, body.start_byte + 1, anon_opener(model)))
    lines = rewrite(src, edits, flat)
    if not prelude_done and model.torch_includes:
        lines = [(ln, (PRELUDE_FILE, i + 1)) for i, ln in enumerate(prelude.splitlines())] + lines
    return lines


def _kept_names(model: Model, removed: Set[int]) -> Set[str]:
    """Every name the code the device TU keeps uses."""
    return {name for it in model.items if it.kind not in ("torch_include", "include") and
            id(it) not in removed for name, _ in ts.identifiers(it.node, model.src)}


def _host_only_items(model: Model, needed: Set[str]) -> Set[int]:
    """The items the device TU leaves out (by id): host code (``_host_only``), and then, until nothing more
    goes, what device code does not name and that names something left out (``Fn g_fn;`` after ``struct Fn``
    went for naming torch)."""
    removed = {id(it) for it in model.items if _host_only(model, it, needed)}
    while True:
        gone = {n for it in model.items if id(it) in removed for n in it.names}
        more = {id(it) for it in model.items
                if id(it) not in removed and it.kind in _REMOVABLE and not it.constexpr
                and not (set(it.names) & needed) and _names(model, it) & gone}
        if not more:
            return removed
        removed |= more


def _names(model: Model, it: Item) -> Set[str]:
    return {name for name, _ in ts.identifiers(it.node, model.src)}


def _host_only(model: Model, it: Item, needed: Set[str]) -> bool:
    """Host code the device TU leaves out: host functions (but constexpr ones, which device code may call),
    host function declarations, and declarations of torch's heavy API that device code does not name."""
    if it.kind not in _REMOVABLE or it.constexpr:
        return False
    if it.kind in ("host_fn", "fn_decl"):
        return True
    if defines_host_variable(it):  # kept, both objects would define it, and its initialiser would run twice
        return not (set(it.names) & needed)
    return not (set(it.names) & needed) and names_heavy_api(model, it)


def defines_host_variable(it: Item) -> bool:
    """A namespace-scope variable definition of host code (``int calls = 0;``, ``static Registry reg;``): not
    constexpr, not a device variable, not a mere ``extern`` declaration."""
    if it.kind != "decl" or it.fn is None or it.fn.type != "declaration" or it.constexpr:
        return False
    return not any(k.type == "storage_class_specifier" and k.text.strip() == b"extern" for k in it.fn.children)


def names_heavy_api(model: Model, it: Item) -> bool:
    for n in ts.walk(it.node):
        if n.type == "qualified_identifier" and (n.parent is None or n.parent.type != "qualified_identifier"):
            scope = n.child_by_field_name("scope")
            if scope is not None and model.text(scope).split("<")[0] in HEAVY_SCOPES and \
                    _last_name(model, n) not in LIGHT_NAMES:
                return True
        elif n.type == "namespace_identifier" and model.text(n) in ("pybind11", "py", "caffe2"):
            return True
    for name, _ in ts.identifiers(it.node, model.src):
        if name.startswith(HEAVY_MACROS):
            return True
    return it.node.type == "using_declaration" and any(k.type == "namespace" for k in it.node.children) and \
        model.text(it.node.named_children[-1]) in ("pybind11", "py", "caffe2", "torch::indexing")


def _last_name(model: Model, n) -> str:
    while n.type == "qualified_identifier":
        inner = n.child_by_field_name("name")
        if inner is None:
            break
        n = inner
    return model.text(n).split("<")[0]


def _named_by_device_code(model: Model) -> Set[str]:
    """Every name device code uses, and, transitively, every name the declarations of those names use."""
    declares: Dict[str, List[Item]] = {}
    for it in model.items:
        if it.kind not in DEVICE_KINDS and it.kind != "hd_fn":
            for n in it.names:
                declares.setdefault(n, []).append(it)
    todo = [name for it in model.items if it.kind in DEVICE_KINDS or it.kind == "hd_fn"
            for name, _ in ts.identifiers(it.node, model.src)]
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for it in declares.get(name, ()):
            todo += [n for n, _ in ts.identifiers(it.node, model.src)]
    return seen


def frame_text(model: Model, flat: Flat, heavy_include) -> str:
    """The device TU without its device code, as text without line structure."""
    return "\n".join(text for text, _ in device_lines(model, flat, heavy_include, frame=True) if text.strip())


#: nodes that declare a name local to the function they are in
_LOCAL_DECLARATIONS = frozenset({"parameter_declaration", "optional_parameter_declaration",
                                 "variadic_parameter_declaration", "type_parameter_declaration",
                                 "optional_type_parameter_declaration", "variadic_type_parameter_declaration",
                                 "template_template_parameter_declaration", "for_range_loop", "declaration",
                                 "init_declarator", "structured_binding_declarator"})


def device_names(model: Model) -> Set[str]:
    """The names device code uses that it does not declare itself (parameters, locals, template parameters):
    what a proof of its device code has to have seen."""
    used: Set[str] = set()
    for it in model.items:
        if it.kind not in DEVICE_KINDS and it.kind != "hd_fn":
            continue
        local = _locals(model, it)
        used |= {name for name, leaf in ts.identifiers(it.node, model.src)
                 if name not in local and (leaf.type in ts.IDENTIFIER_TYPES or leaf.type == "preproc_arg")}
    return used


def _locals(model: Model, it: Item) -> Set[str]:
    """Names ``it`` declares inside itself (its own name, declared at namespace scope, is not one of them)."""
    out: Set[str] = set()
    top = it.fn
    for n in ts.walk(it.node):
        if n.type not in _LOCAL_DECLARATIONS or n is top:
            continue
        if n.type == "declaration" and n.parent is not None and n.parent.type not in (
                "compound_statement", "for_statement", "condition_clause"):
            continue
        for leaf in ts.walk(n):
            if leaf.type in ("identifier", "type_identifier") and _declares(leaf):
                out.add(model.text(leaf))
    return out


def _declares(leaf) -> bool:
    """Whether ``leaf`` is the name a declarator introduces (not a name its type or initialiser uses)."""
    parent = leaf.parent
    if parent is None:
        return False
    if parent.type in ("type_parameter_declaration", "optional_type_parameter_declaration",
                       "variadic_type_parameter_declaration"):
        return True
    field = None
    for name in ("declarator", "name"):
        if parent.child_by_field_name(name) is leaf or parent.child_by_field_name(name) == leaf:
            field = name
    if field is None:
        return parent.type == "structured_binding_declarator"
    return parent.type not in ("qualified_identifier", "template_function", "template_type", "call_expression")
