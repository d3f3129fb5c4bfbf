"""Python signatures, as ``.pyi`` lines, of what kernelkit builds: an op from its schema (or the card's own Python
function, its unannotated parameters typed from the schema), a pybind11 function from its docstring."""
from __future__ import annotations

import inspect
import keyword
import re
import typing
from typing import Dict, List, Optional

#: the schema's type names (``Argument.real_type``), as Python sees the values
_SCHEMA_NAMES = {
    "Tensor": "torch.Tensor", "int": "int", "SymInt": "int", "float": "float", "SymFloat": "float", "bool": "bool",
    "SymBool": "bool", "str": "str", "number": "Union[int, float, bool]", "Scalar": "Union[int, float, bool]",
    "ScalarType": "torch.dtype", "Layout": "torch.layout", "Device": "torch.device",
    "MemoryFormat": "torch.memory_format", "Generator": "torch.Generator", "Optional": "Optional",
    "List": "Sequence", "Tuple": "Tuple", "NoneType": "None",
}
#: C++ names a pybind11 docstring shows where no caster names a Python type
_CPP_NAMES = {
    "at::Tensor": "torch.Tensor", "torch::Tensor": "torch.Tensor", "at::ScalarType": "torch.dtype",
    "c10::ScalarType": "torch.dtype", "at::Device": "torch.device", "c10::Device": "torch.device",
    "std::string": "str", "double": "float", "int64_t": "int", "long": "int", "void": "None",
}
#: what a stub may name: these modules' attributes, the builtins below and the names it imports from typing
_MODULES = ("torch.", "typing.", "collections.abc.")
_BUILTINS = {"int", "float", "bool", "str", "bytes", "complex", "object", "list", "dict", "tuple", "set", "None",
             "type", "Ellipsis", "..."}
TYPING = ("Any", "Callable", "Dict", "List", "Optional", "Sequence", "Tuple", "Union")
_NAME = re.compile(r"[A-Za-z_][\w.]*(?:::[\w:]+)?")


def schema_type(real_type: str, returned: bool = False) -> str:
    """A schema type (``Optional[List[int]]``) as a Python annotation; a list is any sequence where it is taken,
    a list where it is returned."""
    def name(m: re.Match) -> str:
        word = m.group(0)
        if word == "List" and returned:
            return "List"
        return _SCHEMA_NAMES.get(word, "Any")

    return _NAME.sub(name, real_type)


def annotation(text: str) -> str:
    """A type a docstring or annotation wrote, where a stub can name it: C++ names mapped to Python's, and anything
    a stub cannot import (another package's class) as ``Any``."""
    text = text.strip()
    if "::" in text and text not in _CPP_NAMES:
        for cpp, py in sorted(_CPP_NAMES.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(cpp, py)
    text = _CPP_NAMES.get(text, text)
    names = _NAME.findall(text)
    known = all(n in _BUILTINS or n in TYPING or n.startswith(_MODULES) for n in names)
    return text if known and _balanced(text) else "Any"


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0 and "<" not in text


def _param(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) else name


# ------------------------------------------------------------------------------------------- ops
def op_def(name: str, schema, fn=None) -> str:
    """``def name(...) -> ...: ...`` for the op with torch ``schema``; ``fn``: the card's Python function that
    ``kernelkit.ops.<name>`` is instead, whose annotations win."""
    types = {a.name: schema_type(str(a.real_type)) for a in schema.arguments}
    returns = _schema_returns(schema)
    if fn is not None:
        params = _function_params(fn, types)
        if params is not None:
            return f"def {name}({', '.join(params[0])}) -> {params[1] or returns}: ..."
    params, star = [], False
    for a in schema.arguments:
        if a.kwarg_only and not star:
            params.append("*")
            star = True
        default = " = ..." if a.has_default_value() else ""
        params.append(f"{_param(a.name)}: {types[a.name]}{default}")
    return f"def {name}({', '.join(params)}) -> {returns}: ..."


def _schema_returns(schema) -> str:
    types = [schema_type(str(r.real_type), returned=True) for r in schema.returns]
    if not types:
        return "None"
    return types[0] if len(types) == 1 else f"Tuple[{', '.join(types)}]"


def _function_params(fn, schema_types: Dict[str, str]):
    """(parameter texts, return annotation or "") of a card's Python function; None if it has no signature."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a hint that does not evaluate here: typed from the schema instead
        hints = {}
    out, kinds = [], inspect.Parameter
    for p in sig.parameters.values():
        if p.kind == kinds.KEYWORD_ONLY and not any(t.startswith("*") for t in out):
            out.append("*")
        given = _formatted(hints[p.name]) if p.name in hints else None
        text = given or schema_types.get(p.name, "Any")
        prefix = {kinds.VAR_POSITIONAL: "*", kinds.VAR_KEYWORD: "**"}.get(p.kind, "")
        default = " = ..." if p.default is not p.empty else ""
        out.append(f"{prefix}{p.name}: {text}{default}")
        if p.kind == kinds.POSITIONAL_ONLY and _last_positional_only(sig, p):
            out.append("/")
    ret = _formatted(hints["return"]) if "return" in hints else ""
    return out, ret


def _last_positional_only(sig: inspect.Signature, p: inspect.Parameter) -> bool:
    only = [q for q in sig.parameters.values() if q.kind == inspect.Parameter.POSITIONAL_ONLY]
    return only[-1] is p


def _formatted(hint) -> Optional[str]:
    text = inspect.formatannotation(hint).replace("NoneType", "None")
    return None if annotation(text) == "Any" and text != "Any" else text


# ------------------------------------------------------------------------------------------- pybind11
def pybind_defs(name: str, doc: Optional[str]) -> List[str]:
    """``def`` lines (``@overload``-ed where pybind11 lists several) from a pybind11 function's docstring;
    [] when it shows no signature."""
    found = []
    for line in (doc or "").splitlines():
        m = re.fullmatch(rf"\s*(?:\d+\.\s+)?{re.escape(name)}\((.*)\)\s*->\s*(.+?)\s*", line)
        if m:
            found.append(f"def {name}({', '.join(_pybind_params(m.group(1)))}) -> {annotation(m.group(2))}: ...")
    if len(found) > 1:
        return [line for d in found for line in ("@overload", d)]
    return found


def _pybind_params(text: str) -> List[str]:
    out = []
    for part in _split_top(text):
        part = part.strip()
        if part in ("*", "/") or not part:
            out += [part] if part else []
            continue
        head, _, default = _split_default(part)
        pname, _, ptype = head.partition(":")
        pname = pname.strip()
        stars = len(pname) - len(pname.lstrip("*"))
        typed = annotation(ptype) if ptype.strip() else "Any"
        out.append(f"{pname[:stars]}{_param(pname[stars:])}: {typed}{' = ...' if default else ''}")
    return out


def _split_top(text: str, sep: str = ",") -> List[str]:
    """``text`` split at ``sep`` outside brackets, parentheses and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _split_default(part: str):
    pieces = _split_top(part, "=")
    return (pieces[0], "=", "=".join(pieces[1:])) if len(pieces) > 1 else (part, "", "")
