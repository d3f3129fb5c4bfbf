"""A split's host TU compiled so that its object does not depend on where its lines are.

Adding a line to a kernel moves every host line after it, and ``__LINE__`` (in ``TORCH_CHECK``, in
``C10_CUDA_KERNEL_LAUNCH_CHECK``, in ``assert``) is part of the host code. So the host TU is preprocessed twice,
once as written and once with a ``#line`` mark before each line moving its number by its own large step; the
tokens that differ are exactly where a line number was expanded, and each tells from its step which line it
stands on. The TU is compiled from its preprocessed text with each of those numbers read from a table instead,
and cached under its text without line numbers (``HostTU.without_line_numbers``). An edit that only moves lines
then compiles nothing but the table (a few milliseconds): every ``__LINE__`` in the library still names the
user's current line.

Anything else that differs between the two runs (a line number turned into a string or a name, a ``#if`` on
``__LINE__``, ``std::source_location``) or a table the compiler will not accept in place of a number (a
``__LINE__`` in a constant expression) leaves the numbers in the object: that object then serves only the very
same marks (``baked``), and other marks compile the TU again."""
from __future__ import annotations

import concurrent.futures
import logging
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ...errors import BuildError
from .. import cache, keys, running, toolchain, units
from ..running import count
from ..sources import digest_tree
from ..units import Target, Unit
from . import pch as _pch
from .split import tree as ts
from .split.host import HostTU

VARIANT = "host-lines-1"
STEP = 1_000  # line i's number moves by STEP * (i + 1) in the second run: any difference names its line
#: what reads the line a token stands on without __LINE__ (the compiler's own notion, which a table cannot fix)
_LINE_BUILTINS = frozenset({"__builtin_LINE", "__builtin_source_location", "source_location", "SourceLocation"})
#: flags under which the object records source lines itself (debug information)
_DEBUG_FLAGS = ("-g", "-ggdb", "-g1", "-g2", "-g3", "-gdwarf")
#: gcc -E -fpch-preprocess's mark of a precompiled header it used, within the text's first bytes
_PCH_PRAGMA, _PCH_PRAGMA_WITHIN = "#pragma GCC pch_preprocess", 4096
log = logging.getLogger("kernelkit")



def compile_host(unit: Unit, host: HostTU, target: Target, core, key: str = "") -> Tuple[Path, Optional[Path]]:
    """The host TU's object and, where its line numbers live in a table, the table's object (None: none).
    ``key``: its :func:`lines_key`, where the caller has it already."""
    if any(f.startswith(_DEBUG_FLAGS) for f in unit.flags):
        return core.compile_cached(unit, target), None
    key = key or lines_key(unit, host)
    hit = cache.cached_object(key)
    if hit is None:
        with cache.locked(key, unit.display):
            hit = cache.cached_object(key, held=True) or _compile(unit, host, target, key, core)
    info = cache.object_info(key)
    lines = host.line_numbers()
    if info.get("lines") == "table":
        sites = [int(s) for s in info.get("sites", [])]
        return hit, (_table(unit, key, sites, lines, target, core) if sites else None)
    if info.get("marks") == lines:
        return hit, None
    return core.compile_cached(unit, target), None  # baked for other lines: this text's own object


def lines_key(unit: Unit, host: HostTU) -> str:
    text = host.without_line_numbers()
    digest = digest_tree(text.encode("utf-8", "surrogateescape"), unit.deps, unit.roots)
    return keys.build_variant_key(keys.unit_key(unit.kind, unit.flags, unit.local_dirs, digest,
                                                toolchain.fingerprint(), ""), VARIANT)


def _compile(unit: Unit, host: HostTU, target: Target, key: str, core) -> Path:
    lines = host.line_numbers()
    with running.private_dir("host-lines-") as tmp, concurrent.futures.ThreadPoolExecutor(1) as pool:
        pch = _pch.flags(unit, target)
        moved = cache.write_source(host.each_line_marked(STEP), unit.path.name)
        second = pool.submit(_preprocess, unit, moved, pch, tmp / "b.ii", target)  # the two side by side
        first = _preprocess(unit, unit.path, pch, tmp / "a.ii", target)
        sites = _sites(first, second.result(), lines)
        out = tmp / f"{key}.o"
        if sites is not None:
            name = f"kk_lines_{key[:16]}"
            tabled = tmp / "tabled.ii"
            tabled.write_text(_tabled(first, sites, name), errors="surrogateescape")
            try:
                running.run_tool(toolchain.launcher() + [toolchain.cxx(), *pch, *unit.flags, "-c", str(tabled),
                                                        "-o", str(out)], f"compiling {unit.display}", target,
                                "compiles")
                return cache.store_object(key, out, {"display": unit.display, "kind": "cpp", "lines": "table",
                                                     "sites": [s[0] for s in sites]})
            except BuildError:
                pass  # a number the compiler needs as a constant: compiled as written below, which says why
        core.compile_as_written(unit, target, out, tmp / "h.d")
        return cache.store_object(key, out, {"display": unit.display, "kind": "cpp", "lines": "baked",
                                             "marks": lines})


def _preprocess(unit: Unit, path: Path, pch: List[str], out: Path, target: Target) -> str:
    """The TU preprocessed; with ``pch``, its preamble left as gcc's pragma naming the precompiled header (the
    PCH's directory goes first: gcc takes the first directory holding the header or its .gch)."""
    running.run_tool(toolchain.launcher() + [toolchain.cxx(), *pch, *unit.flags, "-E", "-fpch-preprocess",
                                            str(path), "-o", str(out)], f"compiling {unit.display}", target,
                    "compiles")
    text = out.read_text(errors="surrogateescape")
    if pch and _PCH_PRAGMA not in text[:_PCH_PRAGMA_WITHIN]:
        count("pch_rejected")  # still correct (the header's text is in the output), just not faster
        log.warning("%s: the precompiled preamble was not used; its host TU is compiled from the header's text",
                    unit.display)
    return text


def _sites(first: str, second: str, lines: Sequence[int]) -> Optional[List[Tuple[int, int, int]]]:
    """(line index, start, end) of each line number the first text expanded, start and end being its span in
    ``first``; None if the texts differ in any other way."""
    cut_a, cut_b = _first_difference(first, second)
    a, b = _without_linemarkers(first[cut_a:]), _without_linemarkers(second[cut_b:])
    ta, tb = _tokens(a), _tokens(b)
    if len(ta) != len(tb) or any(t in _LINE_BUILTINS for _, t, _, _ in ta):
        return None
    base = len(first[:cut_a].encode("utf-8", "surrogateescape"))
    sites = []
    for (kind_a, text_a, s, e), (kind_b, text_b, _, _) in zip(ta, tb):
        if text_a == text_b:
            continue
        if kind_a != "number_literal" or kind_b != "number_literal" or not (text_a.isdigit() and text_b.isdigit()):
            return None
        step, rest = divmod(int(text_b) - int(text_a), STEP)
        index = step - 1
        if rest or not 0 <= index < len(lines) or int(text_a) != lines[index]:
            return None
        sites.append((index, base + s, base + e))
    return sites


def _first_difference(a: str, b: str) -> Tuple[int, int]:
    """Where in each text to start comparing tokens: at the last linemarker (a token boundary) before their
    first differing line other than a linemarker (the texts are megabytes where no PCH was used, and the same
    up to the file's own code but for the names in their linemarkers)."""
    lines_a, lines_b = a.split("\n"), b.split("\n")
    pos_a = pos_b = start_a = start_b = 0
    for la, lb in zip(lines_a, lines_b):
        if _linemarker(la) and _linemarker(lb):
            start_a, start_b = pos_a, pos_b
        elif la != lb:
            break
        pos_a, pos_b = pos_a + len(la) + 1, pos_b + len(lb) + 1
    return start_a, start_b


def _linemarker(line: str) -> bool:
    return line.startswith("# ") and line[2:3].isdigit()


def _without_linemarkers(text: str) -> str:
    """The preprocessor's ``# 12 "file"`` lines blanked (byte for byte): they carry the marks' numbers, which
    differ by design and are not code."""
    out = []
    for line in text.split("\n"):
        out.append(" " * len(line.encode("utf-8", "surrogateescape")) if _linemarker(line) else line)
    return "\n".join(out)


def _tokens(text: str) -> List[Tuple[str, str, int, int]]:
    """(kind, text, start byte, end byte) of each token the grammar sees, string contents included."""
    src = text.encode("utf-8", "surrogateescape")
    out = []
    stack = [ts.parse(text).root_node]
    while stack:
        n = stack.pop()
        if n.child_count == 0 or n.type in ("number_literal", "string_content", "raw_string_content"):
            out.append((n.type, src[n.start_byte:n.end_byte].decode("utf-8", "surrogateescape"), n.start_byte,
                        n.end_byte))
            continue
        stack.extend(reversed(n.children))
    return out


def _tabled(first: str, sites: Sequence[Tuple[int, int, int]], name: str) -> str:
    """The preprocessed TU with each line number read from ``name[i]``, declared where the TU begins."""
    raw = first.encode("utf-8", "surrogateescape")
    out, pos = [], 0
    for i, (_, s, e) in enumerate(sites):
        out += [raw[pos:s], f"(+{name}[{i}])".encode()]
        pos = e
    out.append(raw[pos:])
    text = b"".join(out).decode("utf-8", "surrogateescape")
    decl = f'extern "C" __attribute__((visibility("hidden"))) const int {name}[];\n'
    lines = text.split("\n")
    at = next((i + 1 for i, ln in enumerate(lines) if ln.startswith(_PCH_PRAGMA)), 0)
    return "\n".join(lines[:at] + [decl] + lines[at:])


def _table(unit: Unit, key: str, sites: Sequence[int], lines: Sequence[int], target: Target, core) -> Path:
    """The object holding each site's line for these lines (cached by its text: a revert finds it)."""
    values = ", ".join(str(lines[i]) for i in sites)
    text = f'extern "C" __attribute__((visibility("hidden"))) const int kk_lines_{key[:16]}[] = {{{values}}};\n'
    path = cache.write_source(text, "lines.cpp")
    table = units.plan_unit("cpp", path, text, [], ["-fPIC"], [], f"{unit.display} (line table)", optimize=None,
                             torch_style=True)
    return core.compile_cached(table, target)
