"""Which specialisations of the template launchers the host object calls (its undefined symbols, demangled),
and the device TU that instantiates exactly those."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, List, Set, Tuple

from .errors import Refuse
from .host import line_mark

#: types the torch dispatch macros instantiate kernels with, and the light header declaring each
_TORCH_TYPES = {"c10::Half": "c10/util/Half.h", "c10::BFloat16": "c10/util/BFloat16.h",
                "c10::complex": "c10/util/complex.h"}
_UNSPELLABLE = ("(anonymous namespace)", "{lambda", "{unnamed", ")::", "'lambda", "{default arg")


class InstantiationError(ValueError):
    """The host object asks for a launcher specialisation the device TU cannot spell (a lambda's or a local
    class's type): build the file as written."""


def undefined_symbols(obj: Path) -> List[str]:
    out = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout
    mangled = [ln.split()[-1] for ln in out.splitlines() if ln.strip()]
    if not mangled:
        return []
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                               check=True).stdout
    return demangled.splitlines()


def wanted(symbols: List[str], launchers: Dict[str, Tuple[bool, str, int]]) -> List[Tuple[str, str]]:
    """(qualified launcher name, "<template args>") for each template launcher specialisation referenced."""
    found: Set[Tuple[str, str]] = set()
    for sym in symbols:
        for name, (templated, _, _) in launchers.items():
            i = sym.find(name)
            if i < 0 or not templated:
                continue
            j = i + len(name)
            if j >= len(sym) or sym[j] != "<":
                continue
            args = _balanced(sym, j)
            qual = _qualifier(sym, i)
            if any(bad in args for bad in _UNSPELLABLE) or any(bad in qual for bad in _UNSPELLABLE):
                raise InstantiationError(f"the host object calls {qual}{name}{args}, whose template arguments "
                                         "name a type the device TU cannot spell")
            found.add((qual + name, args))
    return sorted(found)


def _balanced(s: str, j: int) -> str:
    depth = 0
    for k in range(j, len(s)):
        c = s[k]
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
            if depth == 0:
                return s[j:k + 1]
    raise InstantiationError(f"cannot read the template arguments of {s!r}")


def _qualifier(s: str, i: int) -> str:
    k = i
    while k > 0 and (s[k - 1].isalnum() or s[k - 1] in "_:"):
        k -= 1
    return s[k:i]


def headers_for(args: List[str]) -> List[str]:
    joined = " ".join(args)
    out = [h for t, h in _TORCH_TYPES.items() if t in joined]
    for ns in ("at::", "c10::", "torch::"):
        rest = joined
        for t in _TORCH_TYPES:
            rest = rest.replace(t, "")
        if ns in rest:
            raise InstantiationError(f"a launcher is instantiated with a torch type other than "
                                     f"{', '.join(_TORCH_TYPES)} ({joined}); the device TU would need torch")
    return out


def instantiations(specs: List[Tuple[str, str]], launchers: Dict[str, Tuple[bool, str, int]]) -> str:
    """Taking each specialisation's address in a variable marked used instantiates it and keeps it (and the
    kernel it launches) in the object at any optimisation level."""
    lines = []
    for i, (qual, args) in enumerate(specs):
        base = qual.rsplit("::", 1)[-1]
        _, path, line = launchers[base]
        lines.append(line_mark(path, line) +
                     f"__attribute__((used)) static auto const kk_instance_{i} = &::{qual}{args};\n")
    return "".join(lines)


def check_refuse(e: Refuse) -> InstantiationError:
    return InstantiationError(e.reason)
