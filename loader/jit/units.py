"""Planned data: a translation unit (compiled alone, cached by its key) and a target (units linked into one library).

Both are frozen once planned: what a compile learns goes into the object's stored metadata, never back here.
"""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import cache, keys, sources, syntax, toolchain
from .sources import digest_tree


@dataclasses.dataclass(frozen=True)
class Unit:
    """One translation unit: compiled alone, cached by ``key``."""

    kind: str  # "cu" or "cpp"
    path: Path  # the file handed to the compiler
    display: str  # its name as the user knows it
    flags: List[str]
    key: str
    deps: List[Path]
    digest: str = ""  # the TU's text + local headers, by content (what an AOT source key is made of)
    pch_defines: Optional[List[str]] = None  # a binding TU that starts with <kernelkit/binding.h>
    uses_torch: bool = False  # includes torch's headers: a .cu that does takes tens of seconds to compile
    roots: List[Path] = dataclasses.field(default_factory=list)  # what the digest names deps relative to
    local_dirs: List[Path] = dataclasses.field(default_factory=list)  # include dirs the key names "-I<local>"
    #: the fast path (jit.fast) that claimed the unit at planning and compiles it its own way (its name is in
    #: the key); "" for the compiler on the file
    strategy: str = ""
    #: a header the TU includes first, by its file name through an include dir, to precompile for its flags
    #: (a split's host preamble: torch's headers, parsed once per machine rather than per host edit)
    pch_header: Optional[Path] = None
    #: (index, count): one of the dtype shards a card's .cu is compiled as (jit.fast.shards); None: the file whole
    shard: Optional[Tuple[int, int]] = None

    def command(self, out: Path, extra: Sequence[str] = ()) -> List[str]:
        compiler = toolchain.nvcc() if self.kind == "cu" else toolchain.cxx()
        return toolchain.launcher() + [compiler, *extra, *self.flags, "-c", str(self.path), "-o", str(out)]

@dataclasses.dataclass
class Target:
    """A library to build: its units, how to link them, and how to show errors in the user's terms."""

    name: str
    units: List[Unit]
    ldflags: List[str]
    key: str
    with_cuda: bool
    pymodule: Optional[str]  # the pybind11 module name, when functions are bound for Python
    display: Dict[str, str]  # compiler path -> user-facing name
    texts: Dict[str, List[str]]  # user-facing name -> lines, to quote the offending line
    standalone: bool = False  # an executable (torch's is_standalone), not a shared library

    @property
    def so_name(self) -> str:
        return self.name if self.standalone else f"kk_{self.name}_{self.key[:16]}.so"

    @property
    def import_name(self) -> Optional[str]:
        """The name Python imports the module under: unique per build, because Python and pybind11 hand back
        the module already imported under a name instead of running the new library's init."""
        if self.pymodule is None:
            return None
        return f"{self.pymodule}_kk{self.key[:16]}" if self.pymodule == self.name else self.pymodule

    def import_alias_flags(self) -> List[str]:
        """A torch-style module's init function is named for TORCH_EXTENSION_NAME, which stays the same across
        edits so that unchanged objects are reused: the link adds the per-build name as an alias."""
        if self.import_name is None or self.import_name == self.pymodule:
            return []
        return [f"-Wl,--defsym=PyInit_{self.import_name}=PyInit_{self.pymodule}"]


def plan_unit(kind: str, path: Path, text: str, include_dirs: Sequence[Path], extra: Sequence[str],
              archs: Sequence[str], display: str, optimize: Optional[str] = "-O3",
              pch_defines: Optional[List[str]] = None, torch_style: bool = False,
              pch_header: Optional[Path] = None) -> Unit:
    """``torch_style``: ``extra`` already holds every flag torch's own JIT build would pass (the
    torch.utils.cpp_extension drop-in); only the local include dirs are added."""
    incs = [f"-I{d}" for d in include_dirs]
    deps, uses_torch, roots = keys.unit_inputs(kind, path, text, [*incs, *extra])
    compiler_id = toolchain.nvcc_fingerprint() if kind == "cu" else ""
    if torch_style:
        flags = [*incs, *([optimize] if optimize else [])]
    elif kind == "cu":
        flags = [toolchain.cxx_standard_flag(), optimize, "--expt-relaxed-constexpr", "-lineinfo",
                 "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                 *toolchain.gencode_flags(archs), *incs]
        if uses_torch:  # only then pay for torch's include paths and its half-operator switches
            flags += [f"-I{p}" for p in toolchain.torch_include_paths(True)]
            flags.append(f"-I{toolchain.python_include()}")  # <torch/extension.h> pulls Python.h
            flags += toolchain.torch_nvcc_flags() + [f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}"]
    else:
        flags = [toolchain.cxx_standard_flag(), optimize, "-fPIC", "-fvisibility=hidden",
                 f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}", *incs,
                 *[f"-I{p}" for p in toolchain.torch_include_paths(toolchain.torch_has_cuda())],
                 f"-I{toolchain.python_include()}", *toolchain.pybind_abi_flags()]
    flags += list(extra)
    if kind == "cu":
        sources.refuse_shell_expansion([*flags, str(path), str(cache.cache_dir())], f"compiling {display} with nvcc")
    if any(syntax.directives(t).computed for t in [text, *(cache.source_bytes(d).decode("utf-8", "replace")
                                                             for d in deps)]):
        deps = _with_preprocessor_reads(kind, path, flags, deps)
    digest = digest_tree(text.encode(), deps, roots)
    key = keys.unit_key(kind, flags, include_dirs, digest, toolchain.fingerprint(), compiler_id)
    return Unit(kind, path, display, flags, key, deps, digest, pch_defines, uses_torch, roots, list(include_dirs),
                pch_header=pch_header)


def _with_preprocessor_reads(kind: str, path: Path, flags: Sequence[str], deps: List[Path]) -> List[Path]:
    """``deps`` and every other file the preprocessor reads outside the toolchain's dirs (``-M``), for a TU where a
    macro names a header (``#include MACRO``, ``#include_next``): the scan cannot follow those, and a key that missed
    the header would serve a stale build. A preprocessor that fails leaves ``deps`` (the compile says why)."""
    compiler = toolchain.nvcc() if kind == "cu" else toolchain.cxx()
    proc = subprocess.run([compiler, *flags, "-M", str(path)], capture_output=True, text=True,
                          errors="surrogateescape")
    reads = sources.make_rule_inputs(proc.stdout) if proc.returncode == 0 else None
    if reads is None:
        return deps
    this, outside = path.resolve(), keys.toolchain_dirs()
    return sorted({*deps, *(p for p in reads if p != this and p.is_file() and not sources.under(p, outside))})


def with_define(unit: Unit, define: str, **changes) -> Unit:
    """``unit`` compiled with one more ``-D`` that no file it reads tests in an ``#if`` (so it reads the same files:
    its planned inputs stand, and only its key changes)."""
    flags = [*unit.flags, f"-D{define}"]
    compiler_id = toolchain.nvcc_fingerprint() if unit.kind == "cu" else ""
    key = keys.unit_key(unit.kind, flags, unit.local_dirs, unit.digest, toolchain.fingerprint(), compiler_id)
    return dataclasses.replace(unit, flags=flags, key=key, **changes)


def link_flags(with_cuda: bool, pymodule: bool, extra: Sequence[str], standalone: bool = False) -> List[str]:
    # a library binds its own symbols first (-Bsymbolic): a reload never calls an older build's code
    flags = [] if standalone else ["-shared", "-Wl,-Bsymbolic"]
    libstdcxx = toolchain.runtime_libstdcxx()
    if libstdcxx:  # the process's own libstdc++, never a second (static) copy
        flags.append(libstdcxx)
    for p in toolchain.torch_library_paths(with_cuda):
        flags += [f"-L{p}", f"-Wl,-rpath,{p}"]
    flags += ["-lc10", "-ltorch_cpu", "-ltorch"]
    if with_cuda:
        flags += ["-lc10_cuda", "-ltorch_cuda", toolchain.cudart_link_flag()]
    if pymodule:
        flags += ["-ltorch_python"]
    return flags + list(extra)


def target_key(name: str, units: Sequence[Unit], ldflags: Sequence[str]) -> str:
    return keys.target_key(name, toolchain.fingerprint(), ldflags, [u.key for u in units], keys.link_files(ldflags))


def defined_namespaces(target: Target) -> List[str]:
    """The namespaces the TORCH_LIBRARY blocks in the target's sources and local headers define."""
    files = {u.path for u in target.units} | {d for u in target.units for d in u.deps}
    defined = set()
    for f in files:
        for block in syntax.macro_blocks(cache.source_bytes(f).decode(errors="replace"), ["TORCH_LIBRARY"]):
            ns = block.args[0] if block.args else ""
            defined.add(target.name if ns == "TORCH_EXTENSION_NAME" else ns)
    return sorted(defined)
