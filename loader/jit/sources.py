"""Source scanning and hashing: a translation unit's key covers its text and every local header it
includes, transitively, so editing a header is never invisible (torch's loader misses this, #47557).

Headers are looked for where the compiler looks: the includer's directory, then the directories named by
every spelling of the include flags (``-I dir``, ``-Idir``, ``-iquote``, ``-isystem``, ``-idirafter``, nvcc's
``--include-path``/``--system-include``, ``-Xcompiler`` values) and the ``CPATH`` family; files forced in with
``-include``/``-imacros``/``--pre-include`` are hashed and scanned too. Link inputs named in the link flags
(archives, objects, shared libraries, ``-l`` found in the flags' own ``-L`` directories) are hashed by content.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..errors import KernelkitError
from . import syntax

# kernelkit's own sources: the public C++ include root (cards include <kernelkit/binding.h>, ...) and its C++
# modules; here, not in toolchain, because a warm start needs the paths but none of the toolchain
INCLUDE = Path(__file__).resolve().parent.parent / "include"
CSRC = INCLUDE.parent / "csrc"

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
_TORCH_PREFIXES = ("torch/", "ATen/", "c10/", "pybind11/")


# -------------------------------------------------------------------------------------------- hashing
def sha256_bytes(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(8, "little"))
        h.update(c)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 of a regular file. Anything else (a FIFO, a device) raises OSError at once instead of
    blocking the process on a read that never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(paths: Iterable[Path]) -> Dict[Path, Optional[tuple]]:
    """Each file as it is now: identity (inode, size, mtime, ctime: an edit undone again still changes
    those) and sha256; None where it cannot be read."""
    out: Dict[Path, Optional[tuple]] = {}
    for p in paths:
        try:
            st = os.stat(p)
            out[p] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256_file(p))
        except OSError:
            out[p] = None
    return out


def resolved(names: Iterable) -> List[Path]:
    """``[Path(n).resolve() for n in names]``, each directory resolved once: realpath stats every component of
    every name, and a compiler's dependency list names thousands of headers in a few dozen directories."""
    real_dirs: Dict[str, str] = {}
    out = []
    for name in names:
        head, tail = os.path.split(os.fspath(name))
        if tail in ("", ".", ".."):
            out.append(Path(os.path.realpath(name)))
            continue
        if head not in real_dirs:
            real_dirs[head] = os.path.realpath(head)  # "" is the working directory
        p = os.path.join(real_dirs[head], tail)
        out.append(Path(os.path.realpath(p) if os.path.islink(p) else p))
    return out


def under(path: Path, roots: Iterable[Path]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one (by strings: pathlib's relative_to costs ~5 us,
    and a warm plan asks this hundreds of times)."""
    p = os.fspath(path)
    return any(p == r or p.startswith(r + "/") for r in map(os.fspath, roots))


def make_rule_inputs(rule: str) -> Optional[List[Path]]:
    """The prerequisites of the first make rule in ``rule`` (a compiler's -M/-MD output), resolved; None: no rule."""
    rule = rule.replace("\\\n", " ")
    match = re.search(r":(?:\s|$)", rule)
    if match is None:
        return None
    prereqs = rule[match.end():].split("\n", 1)[0]
    tokens = re.findall(r"(?:\\.|[^\s\\])+", prereqs)
    return resolved(re.sub(r"\\(.)", r"\1", t).replace("$$", "$") for t in tokens)


# ------------------------------------------------------------------------------------- include flags
class Search(NamedTuple):
    """Where a compile looks for headers, in the compiler's order, and the files it reads before the TU."""

    quote: Tuple[Path, ...]  # -iquote: for #include "..." only, after the includer's directory
    angle: Tuple[Path, ...]  # -I, CPATH, -isystem, CPLUS_INCLUDE_PATH, -idirafter: for both forms
    forced: Tuple[str, ...]  # -include / -imacros / --pre-include, as written


# (spelling, what it adds); a spelling takes its value joined (-Idir), after '=' (long forms) or as the next
# token. Longest first, so that -isystem is not read as -I... and -include not as -i...
_INCLUDE_FLAGS = (("--include-path", "I"), ("--system-include", "isystem"), ("--pre-include", "forced"),
                  ("-idirafter", "idirafter"), ("-isystem", "isystem"), ("-iquote", "iquote"),
                  ("-imacros", "forced"), ("-include", "forced"), ("-I", "I"))
_NVCC_LISTS = {"I", "isystem", "forced"}  # nvcc splits these option values at commas (-I a,b is two dirs)
_HOST_FLAGS = ("-Xcompiler", "--compiler-options")


def _host_tokens(flags: Sequence[str]) -> Tuple[List[str], List[str]]:
    """nvcc flags -> (its own flags, the host compiler's flags that -Xcompiler hands on, comma-split)."""
    own, host = [], []
    it = iter(flags)
    for f in it:
        spelling = next((s for s in _HOST_FLAGS if f == s or f.startswith(s + "=")), None)
        if spelling is None:
            own.append(f)
            continue
        value = f[len(spelling) + 1:] if f != spelling else next(it, "")
        host += [v for v in value.split(",") if v]
    return own, host


def _include_flags(tokens: Sequence[str], nvcc: bool) -> List[Tuple[str, str]]:
    """(what, value) for each include flag among ``tokens``, in order."""
    out = []
    it = iter(tokens)
    for f in it:
        for spelling, what in _INCLUDE_FLAGS:
            if not f.startswith(spelling):
                continue
            rest = f[len(spelling):]
            if spelling.startswith("--"):
                if rest and not rest.startswith("="):
                    continue  # another long option that shares the prefix
                rest = rest[1:]
            value = rest or next(it, "")
            values = value.split(",") if nvcc and what in _NVCC_LISTS else [value]
            out += [(what, v) for v in values if v and not v.startswith("=")]  # "=dir": under the sysroot
            break
    return out


def _env_dirs(name: str) -> List[str]:
    return [d for d in os.environ.get(name, "").split(os.pathsep) if d]


def include_search(flags: Sequence[str], nvcc: bool, outside: Sequence[Path] = ()) -> Search:
    """Where a compile with ``flags`` looks for headers (nvcc's flags when ``nvcc``). Directories under
    ``outside`` (torch's, CUDA's, Python's, the system's: covered by the toolchain fingerprint) and
    directories that do not exist are left out."""
    own, host = _host_tokens(flags) if nvcc else (list(flags), [])
    found = _include_flags(own, nvcc) + _include_flags(host, False)
    by = {w: [v for what, v in found if what == w] for w in ("I", "iquote", "isystem", "idirafter", "forced")}
    angle = [*by["I"], *_env_dirs("CPATH"), *by["isystem"], *_env_dirs("CPLUS_INCLUDE_PATH"), *by["idirafter"]]

    def dirs(values: Sequence[str]) -> Tuple[Path, ...]:
        out: Dict[Path, None] = {}
        for v in values:
            d = Path(v).resolve()  # as the compiler reads it: relative to the working directory, no ~
            if d.is_dir() and not under(d, outside):
                out[d] = None
        return tuple(out)

    return Search(dirs(by["iquote"]), dirs(angle), tuple(by["forced"]))


def resolve_forced(name: str, search: Search, outside: Sequence[Path] = ()) -> Optional[Path]:
    """A forced include as the compiler finds it: the working directory first, then the "..." chain."""
    for d in (Path.cwd(), *search.quote, *search.angle):
        cand = d / name
        if cand.is_file():
            cand = cand.resolve()
            return None if under(cand, outside) else cand
    return None


# ------------------------------------------------------------------------------------------- scanning
def includes(text: str) -> List[Tuple[str, str]]:
    """Each ``#include`` line of ``text`` as (``"<"`` or ``'"'``, the name as written), by lines."""
    return _INCLUDE.findall(text)


def every_include(text: str) -> List[Tuple[str, str]]:
    """The includes of ``text`` in every preprocessor branch, by lines and by the grammar: a header either
    misses (a parse error hides it from the grammar, a comment inside the directive from the lines) is still a
    header the compile may read."""
    return sorted(set(includes(text)) | {(i.kind, i.name) for i in syntax.directives(text).includes})


#: kernelkit's own switches: undefined in a compile unless its flags or the code it reads define them (a
#: card's .cu includes the card's header, whose torch-facing part sits under #ifdef KERNELKIT_BINDING)
OWN_MACROS = frozenset({"KERNELKIT_BINDING", "KERNELKIT_WITH_CUDA"})


def _compiled_includes(text: str, undefined: FrozenSet[str], defined: FrozenSet[str] = frozenset()
                       ) -> Set[Tuple[str, str]]:
    """The includes of ``text`` the preprocessor may reach when the macros ``undefined`` are not defined and
    ``defined`` are: all of them, unless the grammar read the whole file and put the include under a branch they
    rule out."""
    facts = syntax.directives(text)
    if not facts.whole or not (undefined or defined):
        return set(every_include(text))
    return {(i.kind, i.name) for i in facts.includes
            if all((m not in undefined) if must else (m not in defined) for m, must in i.requires)}


#: what the compiler defines itself, by the kind of TU: nvcc defines __CUDACC__ in both its passes, g++ never
COMPILER_MACROS = {"cu": (frozenset({"__CUDACC__", "__NVCC__"}), frozenset()),
                   "cpp": (frozenset(), frozenset({"__CUDACC__", "__NVCC__", "__CUDA_ARCH__"}))}


def scan_includes(text: str, here: Path, include_dirs: Sequence[Path], *, quote_dirs: Sequence[Path] = (),
                  forced: Sequence[Path] = (), flags: Sequence[str] = (), kind: str = "") -> Tuple[List[Path], bool]:
    """Local headers ``text`` includes, transitively (a "..." include resolved against its includer's
    directory, then ``quote_dirs``, then the include dirs; a <...> include against the include dirs;
    system headers are not local and are left out), in every preprocessor branch, plus the ``forced`` files
    (-include, -imacros) and what they include; and whether the compile includes torch, judged from the
    branches it may compile: kernelkit's own switches (OWN_MACROS) count as undefined unless ``flags`` or a
    file read defines them, and the compiler's own (COMPILER_MACROS, for a ``kind`` of TU) as it defines them."""
    defined, never = COMPILER_MACROS.get(kind, (frozenset(), frozenset()))
    found: Dict[Path, None] = {}
    texts: Dict[Optional[Path], str] = {None: text}  # None: the TU itself
    stack: List[Optional[Path]] = [None]
    for f in forced:
        f = f.resolve()
        found[f] = None
        texts[f] = f.read_text(errors="replace")
        stack.append(f)
    while stack:
        file = stack.pop()
        base = here if file is None else file.parent
        body = texts[file]
        for delimiter, name in every_include(body):
            dirs: Iterable[Path] = [base, *quote_dirs, *include_dirs] if delimiter == '"' else include_dirs
            for d in dirs:
                cand = d / name
                if cand.is_file():  # before resolve(): most candidates (system headers) do not exist
                    cand = cand.resolve()
                    if cand not in found:
                        found[cand] = None
                        texts[cand] = cand.read_text(errors="replace")
                        stack.append(cand)
                    break
    named = {m for f in flags for m in OWN_MACROS if m in f}
    named |= {m for body in texts.values() for m in syntax.directives(body).macros & OWN_MACROS}
    undefined = (OWN_MACROS - named) | never
    return sorted(found), _reaches_torch(texts, here, include_dirs, quote_dirs, forced, undefined, defined)


def _reaches_torch(texts: Dict[Optional[Path], str], here: Path, include_dirs: Sequence[Path],
                   quote_dirs: Sequence[Path], forced: Sequence[Path], undefined: FrozenSet[str],
                   defined: FrozenSet[str]) -> bool:
    seen: Set[Optional[Path]] = set()
    stack: List[Optional[Path]] = [None, *(f.resolve() for f in forced)]
    while stack:
        file = stack.pop()
        if file in seen:
            continue
        seen.add(file)
        base = here if file is None else file.parent
        for kind, name in _compiled_includes(texts[file], undefined, defined):
            if name.startswith(_TORCH_PREFIXES):
                return True
            dirs: Iterable[Path] = [base, *quote_dirs, *include_dirs] if kind == '"' else include_dirs
            for d in dirs:
                cand = d / name
                if cand.is_file():
                    stack.append(cand.resolve())
                    break
    return False


def portable_name(path: Path, roots: Sequence[Path]) -> str:
    """``path`` relative to the first of ``roots`` holding it (the TU's directory, then the search dirs),
    so a key names the header as the include names it wherever the checkout lives; a file outside them
    all by its path relative to the first root; with no roots, by its name."""
    p = os.fspath(path)
    for r in map(os.fspath, roots):
        if p.startswith(r + "/"):
            return p[len(r) + 1:]
    return os.path.relpath(p, roots[0]) if roots else path.name


def digest_tree(text: bytes, deps: Sequence[Path], roots: Sequence[Path] = ()) -> str:
    """Hash a TU's text together with its local headers (portable name + content, order-independent):
    two headers of one name in different directories are told apart by their place under ``roots``."""
    items = sorted((portable_name(d, roots).encode(), d.read_bytes()) for d in deps)
    chunks = [text]
    for name, body in items:
        chunks += [name, body]
    return sha256_bytes(*chunks)


# ---------------------------------------------------------------------------------------- link inputs
def _library(name: str, lib_dirs: Sequence[str]) -> Optional[Path]:
    """Where the linker finds ``-l<name>`` (``-l:<file>``) among ``lib_dirs``: .so before .a in each dir."""
    names = [name[1:]] if name.startswith(":") else [f"lib{name}.so", f"lib{name}.a"]
    for d in lib_dirs:
        for n in names:
            if os.path.isfile(os.path.join(d, n)):
                return Path(d, n)
    return None


def link_inputs(ldflags: Sequence[str], outside: Sequence[Path] = ()) -> List[Path]:
    """The files the link flags hand the linker, as resolved paths: plain paths (archives, objects,
    shared libraries), file names in ``-Wl,``/``-Xlinker`` values, and ``-l`` libraries found in the flags'
    ``-L`` dirs. Files under ``outside`` (torch's, the system's) are left out; so are missing ones (the
    link then fails)."""
    lib_dirs = [ldflags[i + 1] if f == "-L" and i + 1 < len(ldflags) else f[2:]
                for i, f in enumerate(ldflags) if f.startswith("-L")]
    candidates: List[Optional[Path]] = []
    it = iter(ldflags)
    for f in it:
        if f in ("-L", "-o"):
            next(it, None)
        elif f == "-Xlinker":
            candidates.append(Path(next(it, "")))
        elif f.startswith("-Wl,"):
            candidates += [Path(v) for v in f[4:].split(",") if v and not v.startswith("-")]
        elif f.startswith("-l") and len(f) > 2:
            candidates.append(_library(f[2:], lib_dirs))
        elif not f.startswith("-"):
            candidates.append(Path(f))
    out: Dict[Path, None] = {}
    for c in candidates:
        if c is None or not str(c) or under(c, outside) or not c.is_file():  # (torch's libraries: no stat)
            continue
        c = c.resolve()
        if not under(c, outside):
            out[c] = None
    return list(out)


# ------------------------------------------------------------------------------- nvcc's shell, refused
_SHELL = ("$", "`")


def refuse_shell_expansion(args: Sequence[str], what: str) -> None:
    """nvcc runs its steps through a shell, inside double quotes that leave ``$(...)``, ``$VAR`` and
    backticks live: an argument holding one would run or expand there, so it is refused."""
    for a in args:
        bad = next((c for c in _SHELL if c in a), None)
        if bad is not None:
            raise KernelkitError(f"{what}: {a!r} contains {bad!r}, which the shell nvcc runs its steps through would "
                                 "expand (or run); pass it without '$' and backticks (a path: move or rename it)")
