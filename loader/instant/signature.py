"""Kernel signatures read from CUDA source, and what each parameter accepts from Python.

NVRTC compiles a kernel but does not say what its parameters are, and the driver only knows their sizes.
So the declarations are parsed here: each parameter gets a packing code for the launcher (see
``loader/csrc/launch.cpp``) and, for pointers, the torch dtype a tensor argument must have. A Python float
is converted to the declared type (``float``, ``double``, ``half``, ...), never guessed.
"""
from __future__ import annotations

import re
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

_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|__grid_constant__|struct)\b")
_ATTRIBUTES = ("__launch_bounds__", "__maxnreg__", "__cluster_dims__")


class Param(NamedTuple):  # NamedTuples, not dataclasses: creating a dataclass costs a warm start ~0.7 ms
    name: str
    ctype: str  # as declared, qualifiers removed, e.g. "float*" or "unsigned int"
    code: str  # the launcher's packing code; "?" for a type kernelkit cannot pass
    dtype: Optional[torch.dtype] = None  # pointers: the tensor dtype required (None: any)

    def describe(self) -> str:
        return f"{self.ctype} {self.name}"


class Signature(NamedTuple):
    kernel: str  # the name expression: "scale" or "axpy<float>"
    params: Tuple[Param, ...]

    def __str__(self) -> str:
        return f"{self.kernel}({', '.join(p.describe() for p in self.params)})"

    def unsupported(self) -> List[Param]:
        return [p for p in self.params if p.code == "?"]


class Declaration(NamedTuple):
    """A ``__global__`` function as written: its template parameters and raw parameter list."""
    name: str
    template: Tuple[Tuple[str, str], ...]  # (kind, name): ("typename", "T"), ("int", "BLOCK")
    params: Tuple[str, ...]
    extern_c: bool


def strip_comments(text: str) -> str:
    """The source without comments and string contents (so braces and keywords in them are not seen)."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)
    return pattern.sub(lambda m: '""' if m.group(0).startswith('"') else "\n" * m.group(0).count("\n") or " ", text)


def _balanced(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {open_ch}{close_ch} in a kernel declaration")


def split_top_level(text: str) -> List[str]:
    """Split on commas outside <>, () and []."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


def _template_params(prefix: str) -> Tuple[Tuple[str, str], ...]:
    """The parameters of the ``template <...>`` in ``prefix`` (the declaration's text before ``__global__``)."""
    m = re.search(r"\btemplate\s*<", prefix)
    if not m:
        return ()
    end = _balanced(prefix, m.end() - 1, "<", ">")
    out = []
    for p in split_top_level(prefix[m.end():end - 1]):
        words = re.sub(r"\s*=.*$", "", p).split()  # without default arguments
        if len(words) >= 2:
            out.append((" ".join(words[:-1]), words[-1]))
    return tuple(out)


def declarations(source: str) -> Dict[str, Declaration]:
    """Every ``__global__`` function in ``source`` by name (declarations and definitions; a repeated
    name must declare the same parameters)."""
    text = strip_comments(source)
    found: Dict[str, Declaration] = {}
    for m in re.finditer(r"\b__global__\b", text):
        i = m.end()
        name = None
        while True:
            w = re.compile(r"\s*([A-Za-z_]\w*)\s*").match(text, i)
            if not w:
                break
            i = w.end()
            if w.group(1) in _ATTRIBUTES and i < len(text) and text[i] == "(":
                i = _balanced(text, i, "(", ")")
                continue
            if i < len(text) and text[i] == "(":
                name = w.group(1)
                break
        if name is None:
            continue
        end = _balanced(text, i, "(", ")")
        params = tuple(p for p in split_top_level(text[i + 1:end - 1]) if p and p != "void")
        prefix = text[_declaration_start(text, m.start()):m.start()]
        extern_c = bool(re.search(r'\bextern\s+""', prefix)) or _in_extern_c_block(text, m.start())
        decl = Declaration(name, _template_params(prefix), params, extern_c)
        if name in found and found[name].params != decl.params:
            raise ValueError(f"kernel {name} is declared twice with different parameters (overloads are not "
                             f"supported: give each kernel its own name)")
        found[name] = decl
    return found


def _declaration_start(text: str, pos: int) -> int:
    """Where the declaration holding ``pos`` begins (after the previous ';', '}' or '{')."""
    starts = [text.rfind(c, 0, pos) for c in ";}{"]
    return max(starts) + 1


def _in_extern_c_block(text: str, pos: int) -> bool:
    for m in re.finditer(r'extern\s+""\s*\{', text[:pos]):
        if _balanced(text, m.end() - 1, "{", "}") > pos:
            return True
    return False


def _normalise(ctype: str) -> str:
    return " ".join(_QUALIFIERS.sub(" ", ctype).split())


def parse_param(raw: str, index: int, types: Dict[str, str]) -> Param:
    """One parameter, e.g. ``const float* __restrict__ x`` -> Param("x", "float*", "p", torch.float32).
    ``types`` substitutes template type parameters by whole word."""
    raw = re.sub(r"\s*=.*$", "", raw.strip())
    array = raw.endswith("]")
    raw = re.sub(r"\[[^\]]*\]\s*$", "", raw)
    m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*$", raw, re.S)
    if m and m.group(1).strip() and not m.group(1).rstrip().endswith("::"):
        ctype, name = m.group(1), m.group(2)
    else:  # unnamed parameter
        ctype, name = raw, f"arg{index}"
    for t, actual in types.items():
        ctype = re.sub(rf"\b{re.escape(t)}\b", actual, ctype)
    depth = ctype.count("*") + (1 if array else 0)
    base = _normalise(ctype.replace("*", " "))
    shown = base + "*" * depth
    if "&" in ctype:
        return Param(name, _normalise(ctype), "?")
    if depth == 1:
        return Param(name, shown, "p", _POINTEES.get(base)) if base in _POINTEES else Param(name, shown, "p", None)
    if depth > 1:
        return Param(name, shown, "p", None)
    return Param(name, shown, _SCALARS.get(base, "?"))


def template_arguments(expression: str) -> Tuple[str, List[str]]:
    """``"axpy<float, 256>"`` -> ("axpy", ["float", "256"])."""
    expression = expression.strip()
    if "<" not in expression:
        return expression, []
    name = expression[:expression.index("<")].strip()
    inner = expression[expression.index("<") + 1:expression.rindex(">")]
    return name, split_top_level(inner)


def signature(decl: Declaration, expression: Optional[str] = None) -> Signature:
    """The signature of ``decl`` as instantiated by ``expression`` (``"axpy<float>"``)."""
    expression = expression or decl.name
    _, args = template_arguments(expression)
    types = {}
    if decl.template:
        if len(args) > len(decl.template):
            raise ValueError(f"{expression}: {decl.name} has {len(decl.template)} template parameter(s)")
        for (kind, tname), actual in zip(decl.template, args):
            if kind in ("typename", "class"):
                types[tname] = actual
    return Signature(expression, tuple(parse_param(p, i, types) for i, p in enumerate(decl.params)))


def kernel_signatures(source: str, name_expressions: Sequence[str] = ()) -> Dict[str, Signature]:
    """Signatures of the source's non-template kernels, and of each template instantiation asked for."""
    decls = declarations(source)
    out = {name: signature(d) for name, d in decls.items() if not d.template}
    for expr in name_expressions:
        base, _ = template_arguments(expr)
        if base not in decls:
            known = ", ".join(sorted(decls)) or "none"
            raise ValueError(f"name_expressions: {expr!r} names no __global__ function of the source (kernels: {known})")
        out[expr] = signature(decls[base], expr)
    return out
