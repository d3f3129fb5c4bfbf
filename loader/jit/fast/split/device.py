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

from typing import Dict, List, Optional, Set

from . import tree as ts
from .errors import Refuse
from .layout import Edit, Line, blank_keeping_directives, directive_spans, rewrite
from .model import DEVICE_KINDS, Item, Model, anon_opener, declarator_name
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
    used = _named_by_device_code(model, device_names(model))  # not a local that happens to share a name
    forms = {id(it): host_variable_form(model, it, used) for it in model.items if defines_host_variable(it)}
    removed = _host_only_items(model, needed, forms)
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
        elif forms.get(id(it)) in ("type", "extern"):
            edits += _variable_edits(model, it, forms[id(it)])
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


def _host_only_items(model: Model, needed: Set[str], forms: Dict[int, str]) -> Set[int]:
    """The items the device TU leaves out (by id): host code (``_host_only``), host variables whose ``forms``
    says so, and then, until nothing more goes, what device code does not name and that names something left
    out (``Fn g_fn;`` after ``struct Fn`` went for naming torch)."""
    removed = {id(it) for it in model.items if forms.get(id(it)) == "drop" or
               (id(it) not in forms and _host_only(model, it, needed))}
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
    return not (set(it.names) & needed) and names_heavy_api(model, it)


def defines_host_variable(it: Item) -> bool:
    """A namespace-scope variable definition of host code (``int calls = 0;``, ``static Registry reg;``): not
    constexpr, not a device variable, not a mere ``extern`` declaration."""
    if it.kind != "decl" or it.fn is None or it.fn.type != "declaration" or it.constexpr:
        return False
    return not any(k.type == "storage_class_specifier" and k.text.strip() == b"extern" for k in it.fn.children)


def host_variable_form(model: Model, it: Item, needed: Set[str]) -> str:
    """What the device TU keeps of a host variable's definition (``defines_host_variable``), which the host
    object alone must define and initialise (kept in both, both objects would define it, or, with internal
    linkage, run its initialiser twice): "drop" it; only the "type" it defines (``struct P {...} g_p;`` where
    device code names ``P``); an "extern" declaration (device code names it, say in ``sizeof``); "keep" it
    whole, where a second copy changes nothing (``const float kScale = 2.0f;``) or the objects' join will fail
    and build the file as written. Raises Refuse where a second copy would run code (``static Registry r;``
    named by device code) or could differ (``static int mode;``, which a ``__host__ __device__`` function's
    host side in the device object would read apart from the host object's)."""
    decl = it.fn
    declarators = decl.children_by_field_name("declarator")
    variables = {declarator_name(model, d) for d in declarators}
    if not variables & needed:
        ty = decl.child_by_field_name("type")
        defines_type = ty is not None and ty.child_by_field_name("body") is not None
        return "type" if defines_type and set(it.names) & needed else "drop"
    const = all(_const_object(model, decl, d) for d in declarators)
    if "static" in it.quals or const:  # internal linkage: each object would have a copy of its own
        name = sorted(variables & needed)[0]
        why = _runs_code(model, decl, declarators)
        if why:
            raise Refuse(f"device code names the host variable {name}, whose initialisation {why}: a second "
                         "copy in the device TU would run it twice", it.line0 + 1)
        if not const:  # a __host__ __device__ function's host side in the device object would read its own copy
            raise Refuse(f"device code names the static host variable {name}, which the device TU cannot share "
                         "with the host TU", it.line0 + 1)
        return "keep"
    if it.tparams is not None or any(not _externable(model, decl, d) for d in declarators):
        return "keep"
    return "extern"


def _variable_edits(model: Model, it: Item, form: str) -> List[Edit]:
    """The edits that leave of a host variable's definition its type alone, or an ``extern`` declaration."""
    declarators = it.fn.children_by_field_name("declarator")
    if form == "type":
        start, end = declarators[0].start_byte, declarators[-1].end_byte
        return [Edit(start, end, blank_keeping_directives(model.src, start, end, []))]
    at = it.fn.child_by_field_name("type").start_byte
    edits = [Edit(at, at, "extern ")]
    for d in declarators:
        if d.type == "init_declarator":
            start, end = d.child_by_field_name("declarator").end_byte, d.end_byte
            edits.append(Edit(start, end, blank_keeping_directives(model.src, start, end, [])))
    return edits


_PRIMITIVE = frozenset({"primitive_type", "sized_type_specifier"})
_CODE = frozenset({"call_expression", "new_expression", "lambda_expression", "assignment_expression",
                   "update_expression", "co_await_expression", "throw_expression"})


def _runs_code(model: Model, decl, declarators) -> str:
    """Why initialising these variables may run code (a constructor, a call), or "" where it cannot: a value of
    a built-in type computed by operators, literals, other variables and constexpr or ``std::`` functions."""
    ty = decl.child_by_field_name("type")
    if ty is None or ty.type not in _PRIMITIVE:
        return f"constructs a {model.text(ty) if ty is not None else 'value'}"
    constexpr_fns = {n for it in model.items if it.constexpr for n in it.names}
    for d in declarators:
        inner = d
        while inner is not None and inner.type not in ("identifier", "reference_declarator"):
            inner = inner.child_by_field_name("declarator")
        if inner is not None and inner.type == "reference_declarator":
            return "binds a reference"
        for n in ts.walk(d):
            if n.type not in _CODE:
                continue
            callee = n.child_by_field_name("function") if n.type == "call_expression" else None
            name = model.text(callee) if callee is not None else ""
            if callee is None or not (name.startswith("std::") or name in constexpr_fns):
                return f"calls {name}" if name else f"evaluates {model.text(n)[:40]}"
    return ""


def _const_object(model: Model, decl, d) -> bool:
    """Whether the declared object itself is const (``const int n``, ``char* const p``; not ``const char* p``),
    which gives it internal linkage at namespace scope unless it is ``extern``."""
    while d is not None and d.type in ("init_declarator", "array_declarator", "attributed_declarator"):
        d = d.child_by_field_name("declarator") or (d.named_children[0] if d.named_children else None)
    if d is not None and d.type == "pointer_declarator":
        return any(k.type == "type_qualifier" and model.text(k) == "const" for k in d.children)
    return any(k.type == "type_qualifier" and model.text(k) == "const" for k in decl.children)


def _externable(model: Model, decl, d) -> bool:
    """Whether ``extern`` and the declarator without its initialiser declare the same variable: not a static
    member's out-of-class definition, a deduced type, an array whose size its initialiser gives, or a declaration
    with more than a type and its qualifiers before the declarators."""
    ty = decl.child_by_field_name("type")
    if ty is None or ty.type in ("placeholder_type_specifier", "auto") or model.text(ty) in ("auto",
                                                                                            "decltype(auto)"):
        return False
    declarators = decl.children_by_field_name("declarator")
    if any(k.is_named and k != ty and k not in declarators and k.type != "comment" and
           not (k.type == "type_qualifier" and model.text(k) in ("const", "volatile"))
           for k in decl.children):  # attributes, alignas, thread_local: where "extern" goes is not plain
        return False
    while d is not None:
        if d.type in ("qualified_identifier", "template_function"):
            return False
        if d.type == "array_declarator" and d.child_by_field_name("size") is None:
            return False
        d = d.child_by_field_name("declarator")
    return True


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


def _named_by_device_code(model: Model, roots: Optional[Set[str]] = None) -> Set[str]:
    """Every name device code uses (or ``roots``), and, transitively, every name the declarations of those names
    use (of a host variable's definition that also defines a type, naming the type reaches the type alone)."""
    declares: Dict[str, List[object]] = {}
    for it in model.items:
        if it.kind in DEVICE_KINDS or it.kind == "hd_fn":
            continue
        variable = defines_host_variable(it)
        variables = {declarator_name(model, d) for d in it.fn.children_by_field_name("declarator")} if variable \
            else set()
        for n in it.names:
            part = it.fn.child_by_field_name("type") if variable and n not in variables else it.node
            declares.setdefault(n, []).append(part)
    todo = list(roots) if roots is not None else [name for it in model.items if it.kind in DEVICE_KINDS or
                                                  it.kind == "hd_fn" for name, _ in ts.identifiers(it.node, model.src)]
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in declares.get(name, ()):
            todo += [n for n, _ in ts.identifiers(node, model.src)]
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
