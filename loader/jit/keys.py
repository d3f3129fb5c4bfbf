"""Every cache key kernelkit derives, in one place, under one schema version (``SCHEMA``).

A key is the sha256 of everything that can change what a build produces; an entry is used only under the
key it was built for, so an edit is never served from the old build. What invalidates what:

**Toolchain fingerprint** (``toolchain.fingerprint``, in every key below but the NVRTC ones): kernelkit's
version, torch's version and CUDA version, the C++ ABI, the Python tag, the C++ compiler's identity (path,
size, mtime). Headers and libraries under the toolchain's own directories -- torch's, CUDA's (the toolkit and
NVIDIA's wheels), Python's, the system's and the compilers' (``toolchain_dirs``) -- are covered by it and
are not hashed one by one: hashing torch's ~7,000 headers on every load would cost more than it protects.

**Unit** (``unit_key``: one translation unit -> ``obj/<key>.o``): the unit kind; the fingerprint and, for a
.cu, nvcc's identity; every flag in order (the dirs kernelkit itself adds as include dirs enter as
``-I<local>``, so the same card in another checkout shares its objects); the TU's text; and every file the
compile reads outside the toolchain's dirs, by portable name and content (``sources.digest_tree``): headers
included by ``"..."`` or ``<...>`` through the includer's dir or any include flag in any spelling (``-I dir``,
``-Idir``, ``-iquote``, ``-isystem``, ``-idirafter``, nvcc's ``--include-path``/``--system-include``,
``-Xcompiler`` values, ``CPATH``/``CPLUS_INCLUDE_PATH``), and forced includes (``-include``, ``-imacros``,
``--pre-include``) with what they include. After each compile the dependency file the compiler wrote is
checked: a file it read outside the toolchain's dirs that the key does not cover (an ``#include`` through a
macro) fails the build and nothing is cached; so does a covered file that changed during the compile.

**Build variant** (``build_variant_key``): a torch-including .cu built by ``jit.torch_cu`` (split into a host TU
for g++ and a device TU for nvcc, joined into one object) is keyed by its unit key and the strategy asked for
(``KERNELKIT_TORCH_CU``); its host and device TUs are units of their own, generated into ``src/``, so a
kernel-body edit finds the host TU's object cached.

**Host shape** (``host_shape_key`` -> ``shapes/<key>``, naming the unit key of an object): what the host side
of a .cu's object is made of -- the unit key's parts with the bodies of device-only functions
(``syntax.device_only_bodies``) blanked line for line in the TU and each local header (kernelkit's own
headers count as they are). Two texts of one shape differ only inside such bodies, so an object of the one
with the other's device code (``nvcc --fatbin``, swapped into the ``.nv_fatbin`` section) is the other's
object; none where a flag makes device code relocatable (``-rdc``: a body may then call code the host side
links), or a text defines kernelkit's ``KK_MATH_FN`` itself.

**Autotuning record** (``tune_key`` -> ``tune/<key>.json``): the op's name, the content it is built from as
the caller names it, the device's name and compute capability, the dtype and the shape bucket; the record
holds the winning configuration, used only while it is still in the space asked for.

**Library target** (``target_key`` -> ``lib/<name>-<key16>/``): the name, the fingerprint, the link flags in
order, each unit's key, and by content every file the link flags hand the linker outside the toolchain's
dirs (``.a``/``.o``/``.so`` paths, ``-Wl,`` file values, ``-l`` found in the flags' own ``-L`` dirs). A link
input edited after planning or during the link fails the build; nothing is cached.

**Precompiled header** (``pch_key`` -> ``pch/<key24>/``): the fingerprint, the binding TU's flags less the
card's include dirs, the defines the binding text sets, and <kernelkit/binding.h> with the kernelkit headers
it includes, by content. gcc itself refuses a PCH that does not match (``-Winvalid-pch``).

**NVRTC program** (``program_key`` -> ``obj/<key>.o`` holding a cubin): NVRTC's version, the arch, the CUDA
include dir NVRTC is pointed at, the options, the name expressions, the source text and each local header
handed to NVRTC (name as written + content).

**AOT source key** (``source_key``, prebuilt manifests): what the unit and target keys cover, minus what
differs between the build machine and its users -- compiler identities, include paths, library paths and
the CUDA archs (recorded in the manifest and matched by coverage instead).

**Small records** (``records/<store>/<key>.json`` and ``plans/``, through ``cache.record_path``): what a warm
start reads instead of working it out again. Each key folds in its row's schema (``store.STORES``) besides
``SCHEMA``, so bumping either retires the row's records (gc collects them by age):

- ``launcher_record_key``: the instant-kernel launcher library, by launch.cpp's text, the Python, torch's and
  kernelkit's versions; the library it points to is verified by sha256 before it is loaded.
- ``nvrtc_facts_key``: NVRTC's version and include dir, by what decides which NVRTC is found (prefix and the
  CUDA environment variables).
- ``torch_signatures_key``: the parameter order of torch's ``load``/``load_inline``, by the installed module
  file's identity (path, size, mtime) and torch's version.
- ``plan_key``: a warm plan of a torch-style extension (``jit.fast.recall``), by everything the plan derives its
  target from besides the files it reads (their identities are checked against the record).
- ``bandwidth_key``: a device's measured copy bandwidth, by the device's identity.
- ``report_key``: the last two compile reports of a target name.
- The toolchain facts (``toolchain.facts_key``: the prefix, torch's file and version, the CUDA and PATH
  variables) are keyed in ``toolchain`` itself, the only recipe outside this module: ``toolchain_dirs`` below
  imports the toolchain, which could not import this module back.

Every entry records its key (object metadata, library manifests), so an entry copied or renamed over
another key's is detected by ``cache.cached_object``/``verified_library`` and ``kernelkit cache verify``.
Changing what any key covers means bumping ``SCHEMA``: every key changes, nothing old is reused.

This module imports nothing heavy (no torch, no toolchain at import time): the warm paths of ``load`` and
``load_kernels`` derive their keys through it.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from . import sources, store, syntax
from .sources import sha256_bytes

SCHEMA = "kernelkit-keys-2"


def _key(kind: str, *parts: str) -> str:
    return sha256_bytes(SCHEMA.encode(), kind.encode(), *[p.encode("utf-8", "surrogateescape") for p in parts])


def _record_key(store_name: str, *parts: str) -> str:
    """A small record's key: its row's schema with ``SCHEMA``, so bumping either retires the row's records."""
    return _key(f"{store_name}/{store.row(store_name).schema}", *parts)


def _joined(items: Iterable[str]) -> str:
    return "\0".join(items)


# ---------------------------------------------------------------------------------------- what stays out
@functools.lru_cache(maxsize=None)
def toolchain_dirs() -> Tuple[Path, ...]:
    """The toolchain's own directories (resolved): torch's, CUDA's, Python's, the system's and the
    compilers'. Files under them are covered by the toolchain fingerprint, not hashed one by one."""
    import shutil

    from . import toolchain  # a build or a plan needs it anyway; keeps it out of this module's import

    facts = toolchain.facts()
    dirs: List[str] = [*facts["include_cpu"], *facts["include_cuda"], *facts["lib_cpu"], *facts["lib_cuda"],
                       str(facts["python_include"]), os.path.join(sys.prefix, "include"),
                       os.path.join(sys.base_prefix, "include"),
                       "/usr/include", "/usr/local/include", "/usr/lib", "/usr/lib64", "/lib", "/lib64"]
    if facts.get("cuda_home"):
        dirs.append(str(facts["cuda_home"]))
    dirs += [os.path.join(entry, "nvidia") for entry in sys.path if entry]  # NVIDIA's CUDA wheels
    dirs += _compiler_dirs([toolchain.cxx_if_present() or "", shutil.which("gcc") or "", shutil.which("nvcc") or ""])
    dirs.append(toolchain.runtime_libstdcxx() or "")  # a file, linked by path: the process's own libstdc++
    # as written and resolved: a path in the flags is checked as written first (no system calls)
    out = {p for d in dirs if d and os.path.exists(d) for p in (Path(os.path.abspath(d)), Path(d).resolve())}
    return tuple(sorted(out))


def _compiler_dirs(compilers: Sequence[str]) -> List[str]:
    """Where a compiler installed under a prefix keeps its own headers and libraries (a relocated or
    conda gcc has them outside /usr)."""
    out = []
    for c in compilers:
        if not c:
            continue
        prefix = Path(os.path.realpath(c)).parent.parent
        if str(prefix) in ("/", "/usr"):  # the system dirs above cover these
            continue
        out += [str(prefix / d) for d in ("include", "lib/gcc", "lib64/gcc", "lib/clang", "libexec")]
        out += [str(p) for p in prefix.glob("*-linux-gnu*")]  # a cross/conda compiler's sysroot
    return out


# ------------------------------------------------------------------------------------------------ keys
def unit_key(kind: str, flags: Sequence[str], local_dirs: Iterable[Path], digest: str, fingerprint: str,
             compiler_id: str) -> str:
    """One translation unit. ``digest``: its text and every file it reads (``sources.digest_tree``)."""
    return _key("unit", kind, fingerprint, compiler_id, _joined(_key_flags(flags, local_dirs)), digest)


def _key_flags(flags: Sequence[str], local_dirs: Iterable[Path]) -> List[str]:
    local = {f"-I{d}" for d in local_dirs}
    return ["-I<local>" if f in local else f for f in flags]


def build_variant_key(unit_key_: str, variant: str) -> str:
    """A unit built another way than by running its compiler on it (a torch-including .cu split into a host
    and a device TU: ``variant`` names the strategy asked for, so switching strategies never reuses the other's
    object)."""
    return _key("variant", unit_key_, variant)


_RELOCATABLE = ("-rdc", "--relocatable-device-code", "-dc", "--device-c", "-ewp", "--extensible-whole-program",
                "-dlink", "--device-link")


def host_shape_key(kind: str, flags: Sequence[str], local_dirs: Iterable[Path], fingerprint: str, compiler_id: str,
                   text: str, deps: Sequence[Path], roots: Sequence[Path], variant: str) -> Optional[str]:
    """The host shape of a .cu unit (see above): like its unit key, it names no file and no dir kernelkit
    adds as an include dir (load_inline's lives under its text's hash). None where device code cannot be
    rebuilt alone: relocatable device code, or a text the grammar cannot read whole."""
    if kind != "cu" or any(f.split("=")[0] in _RELOCATABLE for f in flags):
        return None
    texts = [(None, text), *((d, d.read_text(errors="surrogateescape")) for d in deps)]
    if any(syntax.sets_nvcc_qualifier_macros(t) for path, t in texts if not _kernelkits_own(path)):
        return None  # KK_MATH_FN may not be the __device__ that blanking takes it for
    shapes = []
    for path, source in texts:
        shape = _blanked(source)
        if shape is None and not _kernelkits_own(path):
            return None
        shapes.append(source if shape is None else shape)
    named = sorted((sources.portable_name(d, roots), s) for d, s in zip(deps, shapes[1:]))
    return _key("host-shape", kind, fingerprint, compiler_id, _joined(_key_flags(flags, local_dirs)), variant, shapes[0],
                _joined(f"{n}\0{s}" for n, s in named))


def _kernelkits_own(path: Optional[Path]) -> bool:
    """A header of kernelkit's include dir: the grammar cannot read its macros, and it needs no blanking (nobody
    edits it); it counts as it is. It declares no device variable template (tests/test_device_rebuild.py)."""
    return path is not None and path.resolve().is_relative_to(sources.INCLUDE)


def _blanked(text: str) -> Optional[str]:
    """``text`` with each device-only body replaced by its braces and newlines (lines keep their numbers:
    host code's ``__LINE__`` is part of its shape)."""
    spans = syntax.device_only_bodies(text)
    if spans is None:
        return None
    raw = text.encode("utf-8", "surrogateescape")
    out, last = [], 0
    for start, end in spans:
        out += [raw[last:start], b"{", b"\n" * raw.count(b"\n", start, end), b"}"]
        last = end
    out.append(raw[last:])
    return b"".join(out).decode("utf-8", "surrogateescape")


def tune_key(name: str, source: str, device: str, dtype: str, bucket: str) -> str:
    """An autotuning record: the op's name, what it is built from, the device (name and arch), the dtype and
    the shape bucket (``harness.tune``)."""
    return _key("tune", name, source, device, dtype, bucket)


def target_key(name: str, fingerprint: str, ldflags: Sequence[str], unit_keys: Sequence[str],
               link_files: Sequence[Tuple[str, str]]) -> str:
    """A linked library. ``link_files``: (path, sha256) of each file the link flags hand the linker."""
    files = [f"{p}\0{sha}" for p, sha in link_files]
    return _key("target", name, fingerprint, _joined(ldflags), _joined(unit_keys), _joined(files))


def pch_key(fingerprint: str, flags: Sequence[str], defines: Sequence[str], digest: str) -> str:
    return _key("pch", fingerprint, _joined([*flags, *defines]), digest)[:24]


def program_key(nvrtc_version: Tuple[int, int], arch: str, include_dir: str, options: Sequence[str],
                name_expressions: Sequence[str], text: str, headers: Sequence[Tuple[str, str]],
                compiler: str = "") -> str:
    """An NVRTC program. ``headers``: (include name as written, content) of each header handed to NVRTC;
    ``compiler``: how kernelkit drives NVRTC (its format and default options), which decide the cubin too."""
    parts = ["%d.%d" % tuple(nvrtc_version), arch, include_dir, _joined(options), _joined(name_expressions), text,
             compiler]
    for name, content in headers:
        parts += [name, content]
    return _key("nvrtc", *parts)


def scan_key(scan_format: str, text: str) -> str:
    """An instant-kernel source's parsed outline (its kernels' parameters), kept in ``obj/`` by content."""
    return _key("scan", scan_format, text)


def nvrtc_facts_key(prefix: str, env: Sequence[str]) -> str:
    return _record_key("nvrtc", prefix, *env)[:24]


def source_key(name: str, portable_fingerprint: Sequence[str], ldflags: Sequence[str],
               units: Sequence[Tuple[str, Sequence[str], str]], link_files: Sequence[Tuple[str, str]]) -> str:
    """A prebuilt library's machine-independent key. ``units``: (kind, flags without include dirs and
    archs, digest); ``link_files``: (file name, sha256), by name, not by where the file is."""
    parts = [name, "\n".join(portable_fingerprint), _joined(ldflags)]
    for kind, flags, digest in units:
        parts += [kind, _joined(flags), digest]
    parts += [f"{Path(p).name}\0{sha}" for p, sha in link_files]
    return _key("source", *parts)


def launcher_record_key(source: bytes, python: str, prefix: str, torch_version: str, kernelkit_version: str) -> str:
    return _record_key("launcher", source.decode("utf-8", "surrogateescape"), python, prefix, torch_version,
                       kernelkit_version)[:24]


def torch_signatures_key(module_file: str, size: int, mtime_ns: int, torch_version: str) -> str:
    """The parameter orders of an installed torch's ``torch.utils.cpp_extension``, by its file's identity."""
    return _record_key("torch-signatures", module_file, str(size), str(mtime_ns), torch_version)[:24]


def plan_key(parts: Sequence[str]) -> str:
    """A warm plan (``jit.fast.recall.call_key``): ``parts`` are what the plan derives its target from."""
    return _record_key("plans", *parts)


def torch_headers_key(fingerprint: str, include_dirs: Sequence[str]) -> str:
    """Which of an installed torch's headers reach its heavy API (``fast.torch_headers``), by toolchain and dirs."""
    return _record_key("torch-headers", fingerprint, *include_dirs)[:24]


def bandwidth_key(device: str) -> str:
    """A device's measured bandwidth; ``device``: its identity (``harness.bandwidth``)."""
    return _record_key("bandwidth", device)[:24]


def report_key(name: str) -> str:
    """The compile reports remembered for a target ``name`` (``inspect.compile_report``)."""
    return _record_key("reports", name)[:24]


# ------------------------------------------------------------------------------------ what keys cover
def unit_inputs(kind: str, path: Path, text: str, flags: Sequence[str]) -> Tuple[List[Path], bool, List[Path]]:
    """What a unit's key covers besides its text and flags: (every file its compile reads outside the
    toolchain's dirs, found as the compiler finds it; whether any of it includes torch; the roots their
    portable names are taken against: the TU's dir, then the search dirs)."""
    search = sources.include_search(flags, kind == "cu", toolchain_dirs())
    deps, uses_torch = sources.scan_includes(text, path.parent, search.angle, quote_dirs=search.quote,
                                             forced=forced_files(search), flags=flags, kind=kind)
    return deps, uses_torch, [path.parent.resolve(), *search.quote, *search.angle]


def forced_files(search: sources.Search) -> List[Path]:
    """The files -include/-imacros/--pre-include force into a compile, where they are found outside the
    toolchain's dirs (a missing one fails the compile)."""
    found = (sources.resolve_forced(name, search, toolchain_dirs()) for name in search.forced)
    return [f for f in found if f is not None]


def link_files(ldflags: Sequence[str]) -> List[Tuple[str, str]]:
    """(path, sha256) of each file the link flags hand the linker outside the toolchain's dirs."""
    out = []
    for p in sources.link_inputs(ldflags, toolchain_dirs()):
        try:
            out.append((str(p), sources.sha256_file(p)))
        except OSError:  # removed or replaced by something unreadable since it was found: the link fails
            out.append((str(p), "unreadable"))
    return out
