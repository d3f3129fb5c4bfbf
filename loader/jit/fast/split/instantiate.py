"""Binding the two TUs' objects: which kernel template specialisations the host object calls (its undefined
symbols, demangled), the device TU lines that instantiate exactly those, and the host-side symbols nvcc makes
local (template and ``static`` kernels' stubs, device variables' shadows) given the names the host object
asks for."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Set, Tuple

from .layout import line_mark

#: types the torch dispatch macros instantiate kernels with, and the light header declaring each
_TORCH_TYPES = {"c10::Half": "c10/util/Half.h", "c10::BFloat16": "c10/util/BFloat16.h",
                "c10::complex": "c10/util/complex.h", "c10::ScalarType": "c10/core/ScalarType.h"}
_UNSPELLABLE = ("(anonymous namespace)", "{lambda", "{unnamed", ")::", "'lambda", "{default arg")
#: the file name instantiation lines cite: a compile error there is kernelkit's, never the user's
GENERATED = "<kernelkit: instantiations>"


class InstantiationError(ValueError):
    """The host object asks for a kernel specialisation the device TU cannot spell (a lambda's or a local
    class's type): build the file as written."""


class Symbol(NamedTuple):
    mangled: str
    demangled: str


def symbols(obj: Path, undefined: bool) -> List[Tuple[str, str, str]]:
    """(mangled, demangled, nm type letter) of ``obj``'s undefined symbols, or of those it defines."""
    flag = ["-u"] if undefined else ["--defined-only"]
    out = subprocess.run(["nm", *flag, str(obj)], capture_output=True, text=True, check=True).stdout
    rows = [ln.split() for ln in out.splitlines() if ln.strip()]
    rows = [(r[-1], r[-2] if len(r) >= 2 else "U") for r in rows]
    names = demangled([m for m, _ in rows])
    return [(m, names[m], t) for m, t in rows]


def demangled(names: Sequence[str]) -> Dict[str, str]:
    """Each mangled name -> its demangled spelling (one c++filt for them all)."""
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def wanted(undefined: Sequence[Tuple[str, str, str]], templates: Dict[str, Tuple[str, int]]) -> List[Symbol]:
    """The kernel template specialisations among the host object's undefined symbols. ``templates``: each
    template kernel's qualified name (``ns::k``) -> (path, line) of its definition."""
    found: Set[Symbol] = set()
    for mangled, demangled, _ in undefined:
        name = _function_name(demangled)
        if name is None or name.split("<")[0] not in templates or "<" not in name:
            continue
        if any(bad in demangled for bad in _UNSPELLABLE):
            raise InstantiationError(f"the host object calls {demangled}, whose template arguments name a type the "
                                     "device TU cannot spell")
        found.add(Symbol(mangled, demangled))
    return sorted(found)


def _function_name(demangled: str):
    """``void ns::k<float, 3>(float*)`` -> ``ns::k<float, 3>`` (None for what is no function)."""
    depth, end = 0, None
    for i in range(len(demangled) - 1, -1, -1):
        c = demangled[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end is None:
        return None
    head = demangled[:end]
    depth = 0
    for i in range(len(head) - 1, -1, -1):
        c = head[i]
        if c in ">)":
            depth += 1
        elif c in "<(":
            depth -= 1
        elif c == " " and depth == 0:
            return head[i + 1:]
    return head


def headers_for(specs: Sequence[Symbol]) -> List[str]:
    """The light headers declaring the torch types the specialisations' template arguments name (their
    parameters' types the kernel's own declaration spells)."""
    joined = " ".join(_template_arguments(_function_name(s.demangled) or "") for s in specs)
    out = [h for t, h in _TORCH_TYPES.items() if t in joined]
    rest = joined
    for t in _TORCH_TYPES:
        rest = rest.replace(t, "")
    for ns in ("at::", "c10::", "torch::"):
        if ns in rest:
            raise InstantiationError(f"a kernel is instantiated with a torch type other than "
                                     f"{', '.join(_TORCH_TYPES)} ({joined}); the device TU would need torch")
    return out


def instantiations(specs: Sequence[Symbol]) -> str:
    """Taking each specialisation's address in a variable marked used instantiates it (device code and host
    stub) at any optimisation level."""
    lines = []
    for i, spec in enumerate(specs):
        name = _function_name(spec.demangled)
        lines.append(line_mark(GENERATED, i + 1) +
                     f"__attribute__((used)) static auto* const kk_instance_{i} = &::{name};\n")
    return "".join(lines)


def _template_arguments(name: str) -> str:
    """``ns::k<float, 3>`` -> ``<float, 3>``."""
    at = name.find("<")
    return name[at:] if at >= 0 else ""


def local_aliases(undefined: Sequence[Tuple[str, str, str]], defined: Sequence[Tuple[str, str, str]],
                  wanted_names: Set[str]) -> Dict[str, str]:
    """Host object symbol -> the device object's local symbol of the same entity, for each undefined symbol of
    the host object that names a kernel stub or a device variable (``wanted_names``: demangled names without
    parameters) and that the device object defines only locally."""
    global_names = {m for m, _, t in defined if t.isupper()}
    local = {d: m for m, d, t in defined if t.islower()}
    out = {}
    for mangled, demangled, _ in undefined:
        if mangled in global_names:
            continue
        base = _function_name(demangled) or demangled
        if base.split("<")[0] not in wanted_names and base not in wanted_names:
            continue
        if demangled in local:
            out[mangled] = local[demangled]
    return out
