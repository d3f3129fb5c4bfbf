"""Dtype shards: a card's ``.cu`` compiled as four TUs, one per floating dtype, on machines with cores to spare.

kernelkit's instantiation macros (``KK_INSTANTIATE_FLOATING``, ``KK_UNARY_CUDA_LAUNCHER``, ...) expand only the
dtype ``KERNELKIT_DTYPE_SHARD`` names when it is defined (``<kernelkit/dtype.cuh>``), so four compiles of one
file share its device work: a math edit recompiles four quarter-size device TUs in parallel instead of one.
Linked together they are the file compiled once only where nothing but those macros gives the file's code
a definition of its own: a variable, a non-inline function or a registration would exist four times. So a
file is sharded only when the grammar reads every declaration at file and namespace scope of it and of each
header of its own it includes as one of the kinds that cannot (types, templates, inline functions,
constexpr constants, declarations, macros), and it calls one of those macros; anything else, anything the
parser is unsure of, or a file that includes torch, is compiled whole.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ... import settings
from .. import syntax
from ..sources import INCLUDE
from ..units import Unit, with_define

SHARDS = 4  # float, double, __half, __nv_bfloat16: the order of KK_INSTANTIATE_FLOATING
MIN_CPUS = 4  # fewer cores: four compiles of one file take longer than one
DEFINE = "KERNELKIT_DTYPE_SHARD"

#: the macros that expand only the shard's dtype (a call of one is what a shard is for)
SHARDED_MACROS = frozenset({
    "KK_INSTANTIATE_FLOATING", "KK_INSTANTIATE_FLOATING_OP", "KK_UNARY_CUDA_LAUNCHER", "KK_BINARY_CUDA_LAUNCHER",
    "KK_UNARY_LAUNCHER", "KK_BINARY_LAUNCHER", "KK_UNARY_CPU_LOOP", "KK_BINARY_CPU_LOOP"})
#: kernelkit's qualifier macros, read as what they expand to where nvcc compiles (<kernelkit/dtype.cuh>)
_QUALIFIERS = {b"KK_HD": b"__host__ __device__ __forceinline__", b"KK_DEVICE": b"__device__ __forceinline__",
               b"KK_MATH_FN": b"__device__ __forceinline__"}
_RESERVED = SHARDED_MACROS | {DEFINE, "KERNELKIT_BINDING", "__forceinline__", "__inline__"} | \
    {m.decode() for m in _QUALIFIERS}
_ALWAYS_SAFE = {"comment", "preproc_def", "preproc_function_def", "preproc_call",
                "struct_specifier", "class_specifier", "union_specifier", "enum_specifier", "alias_declaration",
                "type_definition", "using_declaration", "namespace_alias_definition", "static_assert_declaration",
                "template_instantiation", "concept_definition", "empty_declaration"}
_DEVICE_STORAGE = {b"__device__", b"__constant__", b"__managed__", b"__shared__"}


def count(kind: str, uses_torch: bool, text: str, deps: Sequence[Path], flags: Sequence[str], digest: str) -> int:
    """How many TUs to compile a unit as: SHARDS where it can be sharded and sharding pays here, else 1.
    ``digest``: the unit's text and what it includes, by content (a warm load reads no header again)."""
    if not settings.fast_path("dtype_shards"):
        return 1
    if settings.DTYPE_SHARDS.get() == "auto" and (os.cpu_count() or 1) < MIN_CPUS:
        return 1
    if kind != "cu" or uses_torch or any(DEFINE in f or "KERNELKIT_BINDING" in f for f in flags):
        return 1
    return SHARDS if _unit_blocker(digest, text, tuple(deps)) is None else 1


@functools.lru_cache(maxsize=256)
def _unit_blocker(digest: str, text: str, deps: Tuple[Path, ...]) -> Optional[str]:  # noqa: ARG001 - the key
    return blocker(text, deps)


def expand(unit: Unit, text: str) -> Optional[List[Unit]]:
    """A card source's dtype shards, each its unit with one more define; None: compiled whole."""
    n = count(unit.kind, unit.uses_torch, text, unit.deps, unit.flags, unit.digest)
    return None if n == 1 else [with_define(unit, define(i), shard=(i, n)) for i in range(n)]


def define(index: int) -> str:
    return f"{DEFINE}={index}"


def blocker(text: str, deps: Tuple[Path, ...]) -> Optional[str]:
    """Why a ``.cu`` of this text including these files cannot be sharded; None when it can."""
    why, calls = _file_blocker(text)
    if why:
        return why
    if not calls:
        return "no call of a kernelkit instantiation macro"
    for dep in deps:
        if dep.resolve().is_relative_to(INCLUDE.resolve()):  # kernelkit's own headers: tested sharded
            continue
        try:
            why, _ = _file_blocker(dep.read_text(errors="surrogateescape"))
        except OSError:
            return f"{dep.name} could not be read"
        if why:
            return f"{dep.name}: {why}"
    return None


@functools.lru_cache(maxsize=256)
def _file_blocker(text: str) -> Tuple[Optional[str], bool]:
    """(why this text cannot be compiled in every shard, whether it calls a sharded macro)."""
    data = text.encode("utf-8", "surrogateescape")
    if DEFINE.encode() in data:  # a file that tests it may read other headers in a shard than planned
        return f"it names {DEFINE}", False
    root = syntax.parse(syntax.as_nvcc_sees(text, _QUALIFIERS)).root_node  # (a macro it defines is left as is)
    own = {n.decode(errors="replace") for n in syntax.macros_set(root)} & _RESERVED
    if own:
        return f"it defines {sorted(own)[0]}", False
    if root.has_error:
        return "the grammar could not read all of it", False
    calls = []
    why = _scope_blocker(root.named_children, calls)
    return why, bool(calls)


def _scope_blocker(nodes, calls: list) -> Optional[str]:
    for node in nodes:
        why = _node_blocker(node, calls)
        if why:  # the innermost line: a namespace's own line says nothing
            return why if why.startswith("line ") else f"line {node.start_point[0] + 1}: {why}"
    return None


def _node_blocker(node, calls: list) -> Optional[str]:
    kind = node.type
    if kind in _ALWAYS_SAFE:
        return None
    if kind == "preproc_include":  # a computed include (#include MACRO) names a file the scan may not know
        path = node.child_by_field_name("path")
        return None if path is not None and path.type in ("string_literal", "system_lib_string") else \
            "an #include the grammar cannot name"
    if kind == "namespace_definition":
        body = node.child_by_field_name("body")
        return None if body is None else _scope_blocker(body.named_children, calls)
    if kind in syntax.CONDITIONALS or kind in ("preproc_else", "preproc_elif", "preproc_elifdef"):
        return _conditional_blocker(node, calls)
    if kind == "expression_statement":
        call = node.named_children[0] if node.named_child_count == 1 else None
        callee = call.child_by_field_name("function") if call is not None and call.type == "call_expression" else None
        if callee is not None and callee.type == "identifier" and callee.text.decode() in SHARDED_MACROS:
            calls.append(callee.text.decode())
            return None
        return "a statement that is not a call of a kernelkit instantiation macro"
    if kind == "template_declaration":
        params = next((c for c in node.named_children if c.type == "template_parameter_list"), None)
        inner = [c for c in node.named_children if c.type != "template_parameter_list"]
        if any(c.type == "declaration" and not _declares_function(c) for c in inner):
            return "a variable template"
        explicit = params is not None and params.named_child_count == 0  # template <>: a function defined once
        if explicit and any(c.type == "function_definition" and not _is_inline(c) for c in inner):
            return "an explicit specialization that is not inline (it would be defined in every shard)"
        return None
    if kind == "function_definition":
        return None if _is_inline(node) else "a function that is not inline or a template (it would be defined in every shard)"
    if kind == "declaration":
        return _declaration_blocker(node)
    return f"a {kind.replace('_', ' ')}"


def _conditional_blocker(node, calls: list) -> Optional[str]:
    """Each branch a card's .cu may compile: a ``#ifdef KERNELKIT_BINDING`` branch is the binding's alone."""
    literals = syntax.condition(node) if node.type in syntax.CONDITIONALS else None
    binding_only = literals is not None and ("KERNELKIT_BINDING", True) in literals
    alternative = node.child_by_field_name("alternative")
    fields = (node.child_by_field_name(f) for f in ("name", "condition", "alternative"))
    skip = {f.id for f in fields if f is not None}
    body = [c for c in node.named_children if c.id not in skip]
    why = None if binding_only else _scope_blocker(body, calls)
    if why or alternative is None or literals == [("KERNELKIT_BINDING", False)]:
        return why
    return _node_blocker(alternative, calls)


def _declares_function(declaration) -> bool:
    declarator = declaration.child_by_field_name("declarator")
    return declarator is not None and declarator.type == "function_declarator"


def _is_inline(fn) -> bool:
    return any(c.type == "storage_class_specifier" and c.text in (b"inline", b"__inline__") or
               c.type == "__forceinline__" or
               c.type == "type_qualifier" and c.text in (b"constexpr", b"consteval") for c in fn.children)


def _declaration_blocker(node) -> Optional[str]:
    specifiers = {c.text for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")} | \
        {c.type.encode() for c in node.children if c.type.startswith("__")}
    if specifiers & _DEVICE_STORAGE:
        return "a device variable (each shard's module would hold its own)"
    if _declares_function(node) and not specifiers & {b"static"}:
        return None
    if b"constexpr" in specifiers:
        return None
    return "a variable (it would be defined in every shard)"
