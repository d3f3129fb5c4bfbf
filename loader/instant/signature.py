"""What each parameter of a kernel-only CUDA source's ``__global__`` functions accepts from Python.

NVRTC compiles a kernel but does not say what its parameters are, and the driver only knows their sizes.
So the declarations (read by ``jit.outline``) are turned here into a packing code per parameter for the launcher
(see ``loader/csrc/launch.cpp``) and, for pointers, the torch dtype a tensor argument must have. A Python float
is converted to the declared type (``float``, ``double``, ``half``, ...), never guessed.

The parse sees every preprocessor branch (which one is compiled is NVRTC's to decide): :func:`bind` keeps
exactly the kernels the compiled cubin holds, and gives each its declaration where the source has one.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..jit.outline import Declaration, RawParam, scan

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
