"""The proof that a split changed nothing in device code: the device TU's PTX against the PTX nvcc makes of the
file as written (torch's umbrella headers and all), function by function.

The device TU keeps the file's text in place and leaves out only host code and torch's heavy headers, so what
could still differ is what those headers declared for device code (an overload, a specialisation, a macro
tested in a branch). Each kernel, each device function and each device variable the kernels reach is compared,
names and bodies, after what differs by construction is set aside: debug line records, and the unique names
nvcc gives what has internal linkage (``_INTERNAL_<hash>_<file>``, unnamed namespaces, which the split names
``kk_anon_<tag>``). Equal PTX is equal device code: ptxas turns it into the same SASS."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .split.instantiate import demangled

#: a PTX function or variable at file scope, as a line starts it
_TOP = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(entry|func|global|const|shared)\b")
_NAME = re.compile(r"[A-Za-z_$%][\w$]*")
_SKIP = re.compile(r"^\s*(?://|\.loc\b|\.file\b|$)")
_INTERNAL = re.compile(r"_INTERNAL_[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}::")
_LABEL = re.compile(r"\$L__[A-Za-z_]+\d+(?:_\d+)?|__local_depot\d+")
_VISIBILITY = re.compile(r"^\s*(?:\.(?:visible|weak)\s+)+")
_ANON = re.compile(r"\(anonymous namespace\)|_GLOBAL__N__[0-9A-Za-z_]+?(?=::)|kk_anon_[0-9a-f]{10}")


def blocks(ptx: str) -> Dict[str, Tuple[str, str]]:
    """Each function (``.entry``/``.func``) and variable declared at file scope: its mangled name -> (kind, its
    lines without comments and debug records)."""
    out: Dict[str, Tuple[str, str]] = {}
    cur: List[str] = []
    kind, name, depth = "", "", 0
    for line in ptx.splitlines():
        if _SKIP.match(line):
            continue
        if depth == 0 and not cur:
            m = _TOP.match(line)
            if m is None:
                continue
            kind, name = m.group(1), _declared_name(line[m.end():])
        cur.append(line.rstrip())
        depth += line.count("{") - line.count("}")
        if depth == 0 and (line.rstrip().endswith((";", "}")) or kind in ("global", "const", "shared")):
            if kind in ("global", "const", "shared") and not line.rstrip().endswith((";", "}")):
                continue  # an initializer spanning lines
            out[name] = (kind, "\n".join(cur))
            cur = []
    return out


def _declared_name(rest: str) -> str:
    """The name a declaration's remainder declares: the last name before ``(``, ``[``, ``=``, ``;`` or the end
    (``.align 4 .b8 _Z4coef[16] = {...}``, ``.entry _Z1kPf(``, ``.func (.param .b32 r) _Z3twof(``)."""
    rest = rest.lstrip()
    if rest.startswith("("):  # a function's return parameters come first
        rest = rest[rest.find(")") + 1:]
    head = re.split(r"[(\[=;]", rest, maxsplit=1)[0]
    names = [n for n in _NAME.findall(head) if not n.startswith(("%", "."))]
    return names[-1] if names else rest.strip()


def _normal(demangled: str) -> str:
    return _ANON.sub("(anon)", _INTERNAL.sub("", demangled))


def reachable(found: Dict[str, Tuple[str, str]], roots: List[str]) -> Set[str]:
    """What ``roots`` reach, transitively (themselves included)."""
    seen: Set[str] = set()
    while roots:
        n = roots.pop()
        if n in seen or n not in found:
            continue
        seen.add(n)
        roots += [m for m in _NAME.findall(found[n][1]) if m in found and m != n]
    return seen


def normalized(ptx: str) -> Tuple[Dict[str, str], Set[str]]:
    """The device code a PTX module holds, by normalized name (what two builds of the same code agree on): the
    kernels, the variables visible outside it (``__device__`` variables host code may reach) and what they
    reach; and the normalized names of what the kernels reach."""
    found = blocks(ptx)
    entries = [n for n, (kind, _) in found.items() if kind == "entry"]
    visible = [n for n, (kind, text) in found.items()
               if kind in ("global", "const") and text.lstrip().startswith((".visible", ".weak"))]
    kept = reachable(found, entries + visible)
    tokens = {t for n in kept for t in _NAME.findall(found[n][1]) if t.startswith("_Z")}  # local statics too
    names = demangled(sorted(kept | tokens))
    rename = {m: _normal(d) for m, d in names.items()}

    def name(token: str) -> str:
        base, sep, n = token.rpartition("_param_")  # a parameter is named for its function
        if sep and n.isdigit() and base in rename:
            return f"{rename[base]}_param_{n}"
        return rename.get(token, token)

    def sub(text: str) -> str:
        labels: Dict[str, str] = {}  # numbered by the function's place in the module: renumbered by first use
        text = _LABEL.sub(lambda mm: labels.setdefault(mm.group(0), f"$L__{len(labels)}"), text)
        return _NAME.sub(lambda mm: name(mm.group(0)), text)

    # linkage is set aside: without relocatable device code no other module links to a kernel, and an unnamed
    # namespace (the split names it) is the only way the two builds' linkage differs
    code = {rename[n]: _VISIBILITY.sub("", sub(found[n][1]), count=1) for n in kept}
    return code, {rename[n] for n in reachable(found, entries)}


def difference(as_written: str, split: str) -> Optional[str]:
    """None when the two PTX modules hold the same device code; else what differs, in a few words."""
    (a, _), (d, from_kernels) = normalized(as_written), normalized(split)
    missing = sorted(set(a) - set(d))
    extra = sorted(set(d) - set(a) & from_kernels)  # a variable the split named visible but no kernel uses: none
    if missing:
        return f"the split's device code lacks {_few(missing)}"
    if extra:
        return f"the split's device code has {_few(extra)}, which the file as written does not"
    changed = sorted(n for n in a if a[n] != d[n])
    if changed:
        return f"the split compiles {_few(changed)} differently from the file as written"
    return None


def _few(names: Sequence[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
