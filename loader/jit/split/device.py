"""The device TU: the file's device code with the macros, includes, types and constants it uses, the smallest
prelude that stands in for torch's headers, and a launcher after each kernel; no torch umbrella header."""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from . import tree as ts
from .errors import Refuse
from .host import line_mark, variable_symbol
from .model import DEVICE_KINDS, Item, Model, Scope, check_conditions, leading_start
from .params import device_definition, signature, variable_reference
from .source import Flat

PRELUDE_MARK = "// kernelkit split: prelude"
#: what torch's umbrella headers gave every file for free; cheap next to them (~0.1 s)
STD_BUNDLE = ("cstdint", "cstddef", "cstdio", "cstdlib", "cmath", "cfloat", "climits", "limits", "type_traits",
              "utility", "algorithm", "cuda.h", "cuda_fp16.h", "cuda_bf16.h")  # cuda.h: CUDA_VERSION
#: torch names device code may use, and the light header that declares each
TORCH_NAMES = {
    "Half": "c10/util/Half.h", "BFloat16": "c10/util/BFloat16.h", "complex": "c10/util/complex.h",
    **{n: "ATen/core/TensorAccessor.h" for n in (
        "PackedTensorAccessor32", "PackedTensorAccessor64", "GenericPackedTensorAccessor", "PackedTensorAccessor",
        "TensorAccessor", "TensorAccessorBase", "GenericPackedTensorAccessorBase", "RestrictPtrTraits",
        "DefaultPtrTraits")},
}
_TORCH_NS = ("at", "c10", "torch")
_HEADER_ORDER = ("c10/macros/Macros.h", "c10/util/Half.h", "c10/util/BFloat16.h", "c10/util/complex.h",
                 "ATen/core/TensorAccessor.h")


def device_tu(model: Model, flat: Flat) -> str:
    chosen = _closure(model)
    headers, torch_alias, directives = _prelude(model, chosen)
    out: List[str] = []
    open_scopes: Tuple[Scope, ...] = ()
    prelude_done = False
    for it in model.items:
        if it.kind == "torch_include" and not prelude_done:
            out += _close(open_scopes)
            open_scopes = ()
            out.append(prelude_text(model, headers, torch_alias, directives) + line_mark(*flat.where(it.line0 + 1)))
            prelude_done = True
            continue
        if id(it) not in chosen:
            continue
        out += _reopen(open_scopes, it.scope)
        open_scopes = it.scope
        out.append(line_mark(*flat.where(it.line0)) + _item_text(model, it) + "\n")
        out += _after(model, it, flat)
    out += _close(open_scopes)
    if not prelude_done:
        out.insert(0, prelude_text(model, headers, torch_alias, directives))
    return "".join(out)


def _item_text(model: Model, it: Item) -> str:
    """From the start of the item's first line when only blanks precede it, so columns in diagnostics agree."""
    line_start = model.src.rfind(b"\n", 0, it.start) + 1
    start = it.start if model.src[line_start:it.start].strip() else line_start
    if it.kind == "hd_fn" and _needs_inline(model, it):
        # the host TU defines the host side too: inline keeps the device TU's copy from clashing at link time
        at = leading_start(model, it.fn)
        return (model.src[start:at] + b"inline " + model.src[at:it.end]).decode("utf-8", "surrogateescape")
    return model.src[start:it.end].decode("utf-8", "surrogateescape")


def _needs_inline(model: Model, it: Item) -> bool:
    if it.tparams is not None or it.fn.type != "function_definition":
        return False
    specifiers = {model.text(k) for k in it.fn.children if k.type in ("storage_class_specifier", "type_qualifier")}
    quals = it.quals | {q for n in model.masked.masked_names(it.start, it.end) for q in model.masked.macros.get(n, ())}
    return not ({"inline", "static", "constexpr", "__forceinline__", "__inline__"} & (specifiers | quals))


def _after(model: Model, it: Item, flat: Flat) -> List[str]:
    if it.kind == "kernel":
        return [line_mark(*flat.where(it.line0)) + device_definition(model, it, signature(model, it)) + "\n"]
    if it.kind == "device_var" and it.host_used:
        return [line_mark(*flat.where(it.line0)) +
                " ".join(variable_reference(model, it, n, variable_symbol(model, it, n), n) for n in it.names) + "\n"]
    return []


def _reopen(current: Tuple[Scope, ...], wanted: Tuple[Scope, ...]) -> List[str]:
    common = 0
    while common < min(len(current), len(wanted)) and current[common] == wanted[common]:
        common += 1
    return _close(current[common:]) + [s.opener + "\n" for s in wanted[common:]]


def _close(scopes: Tuple[Scope, ...]) -> List[str]:
    return [s.closer + "\n" for s in reversed(scopes)]


def prelude_text(model: Model, headers: List[str], torch_alias: bool, directives: List[str]) -> str:
    lines = [PRELUDE_MARK]
    if model.torch_includes:
        lines += [f"#include <{h}>" for h in STD_BUNDLE]
    lines += [f"#include <{h}>" for h in headers]
    if torch_alias:
        lines.append("namespace torch { using namespace at; }")
    lines += directives
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- selection
def _uses(model: Model, it: Item) -> Set[str]:
    return {name for name, _ in ts.identifiers(it.node, model.src)}


def _closure(model: Model) -> Set[int]:
    """The items the device TU keeps: device code, every top-level macro and non-torch include (in file
    order), and the declarations device code names, transitively (types, constants, constexpr functions)."""
    chosen: Set[int] = set()
    declares: Dict[str, List[Item]] = {}
    needed: List[str] = []
    for it in model.items:
        if it.cond:
            if it.kind in ("macro", "decl", "using", "host_fn", "undef"):
                for n in it.names:
                    declares.setdefault(n, []).append(it)
            continue
        if it.kind in DEVICE_KINDS or it.kind in ("hd_fn", "macro", "undef") or \
                (it.kind == "include" and not it.scope):
            chosen.add(id(it))
            if it.kind != "macro" and it.kind != "include":
                needed += _uses(model, it)
        elif (it.kind in ("decl", "using") and _copyable(model, it)) or (it.kind == "host_fn" and _constexpr(model, it)):
            for n in it.names:
                declares.setdefault(n, []).append(it)
    for launch in model.launches:
        fn = launch.call.child_by_field_name("function")
        if fn.type == "template_function":
            needed += [n for n, _ in ts.identifiers(fn.child_by_field_name("arguments"), model.src)]
    macros = {it.names[0]: it for it in model.items if it.kind == "macro" and not it.cond}
    seen: Set[str] = set()
    while needed:
        name = needed.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in macros:
            needed += _uses(model, macros[name])
        for it in declares.get(name, ()):
            if it.cond:
                raise Refuse(f"device code uses {name}, which is declared under a preprocessor conditional",
                             it.line0 + 1)
            if id(it) not in chosen:
                check_conditions(model, it)  # a type's layout must not depend on torch's macros either
                chosen.add(id(it))
                needed += _uses(model, it)
    return chosen


def _copyable(model: Model, it: Item) -> bool:
    """Types and aliases, and variables whose copy has internal linkage (const, constexpr, static): a second
    definition of anything else would clash with the host TU's at link time."""
    if it.fn.type != "declaration" or not it.fn.children_by_field_name("declarator"):
        return True
    words = {model.text(k) for k in it.fn.children if k.type in ("storage_class_specifier", "type_qualifier")}
    return bool(words & {"const", "constexpr", "static"}) and "extern" not in words


def _constexpr(model: Model, it: Item) -> bool:
    return any(model.text(k) in ("constexpr", "consteval") for k in it.fn.children if k.type != "compound_statement")


# ----------------------------------------------------------------------------------------------- prelude
def _prelude(model: Model, chosen: Set[int]) -> Tuple[List[str], bool, List[str]]:
    """The torch headers device code needs, whether it names ``torch::`` (an alias of ``at::`` in torch), and
    the using-directives of torch namespaces its unqualified torch names rely on."""
    headers: Set[str] = set()
    torch_alias = False
    unqualified: Set[str] = set()
    for it in model.items:
        if id(it) not in chosen or it.kind in ("include", "undef"):
            continue
        for node in ts.walk(it.node):
            if node.type == "qualified_identifier" and (node.parent is None or node.parent.type != "qualified_identifier"):
                torch_alias |= _torch_name(model, node, headers)
        if any(n.startswith("C10_") for n in model.masked.masked_names(it.start, it.end)):
            headers.add("c10/macros/Macros.h")
        for name, leaf in ts.identifiers(it.node, model.src):
            if name.startswith("C10_") and it.kind != "macro":
                headers.add("c10/macros/Macros.h")
            elif name in TORCH_NAMES and leaf.parent is not None and leaf.parent.type != "qualified_identifier":
                unqualified.add(name)
    directives = _torch_directives(model)
    if unqualified and directives:
        headers |= {TORCH_NAMES[n] for n in unqualified}
    ordered = [h for h in _HEADER_ORDER if h in headers]
    return ordered, torch_alias, (directives if headers else [])


def _torch_name(model: Model, node, headers: Set[str]) -> bool:
    scope = node.child_by_field_name("scope")
    if scope is None or model.text(scope) not in _TORCH_NS:
        return False
    last = node
    while last.type == "qualified_identifier":
        last = last.child_by_field_name("name")
    name = model.text(last).split("<")[0]
    if name not in TORCH_NAMES:
        raise Refuse(f"device code uses torch's {model.text(node).split('<')[0]}, which needs torch's headers",
                     ts.line(node))
    headers.add(TORCH_NAMES[name])
    return model.text(scope) == "torch"


def _torch_directives(model: Model) -> List[str]:
    out = []
    for it in model.items:
        if it.kind != "using" or it.scope or it.names:
            continue
        target = model.text(it.node.named_children[-1]) if it.node.named_children else ""
        if target in _TORCH_NS:
            out.append(f"using namespace {'at' if target == 'torch' else target};")
    return sorted(set(out))
