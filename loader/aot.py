"""Ahead-of-time builds of the cards (torch's ``CUDAExtension``/``BuildExtension``), and finding them at
run time.

A prebuilt library is matched by its **source key**: what the JIT key covers minus the compilers'
identities (path, size, mtime) and local paths, which differ between the build machine and the machines
that use the build. It covers the card name, every TU's text and the local headers it includes (by
content), the compile and link flags (without include/library paths), and torch version, torch's CUDA
version, C++ ABI, Python tag and kernelkit version. The CUDA archs are kept out of the key and recorded
in the manifest instead: a build for ``8.0;9.0`` serves a load that asks for ``9.0``.

A prebuilt directory holds ``<name>-<sourcekey16>/`` entries, each with ``manifest.json`` and the
``.so`` whose sha256 the manifest records. Such directories are the installed package's
``kernelkit/prebuilt`` (``KERNELKIT_AOT=1 pip install --no-build-isolation .``) and those listed in
``KERNELKIT_PREBUILT_PATH`` (``python -m kernelkit.aot --out DIR``). They are only read, never written
or locked, so one directory can be shared read-only by every machine and rank of a fleet.

Command line::

    python -m kernelkit.aot --out DIR [--arch 8.0,9.0] [--kernels-dir D] [--jit] [OP ...]

``--jit`` fills DIR from kernelkit's own JIT builds (reusing the local cache) instead of BuildExtension.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import toolchain
from .errors import CacheSecurityError, KernelkitError
from .plan import plan_card
from .progress import say
from .sources import digest_tree, sha256_bytes, sha256_file

log = logging.getLogger("kernelkit")

PREBUILT_ENV = "KERNELKIT_PREBUILT_PATH"
PACKAGE_PREBUILT = Path(__file__).resolve().parent / "prebuilt"
MANIFEST = "manifest.json"
FORMAT = "kernelkit-prebuilt-1"
# torch's BuildExtension puts its half-operator switches on every nvcc line; the JIT adds them only to a
# .cu that includes torch. Undo them for torch-free device code so both builds compile the same program.
_UNDO_TORCH_NVCC = [f"-U{f[2:]}" for f in ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                                            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__")]
_GENCODE = re.compile(r"^arch=compute_\w+,code=((?:sm|compute)_\w+)$")
_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")
FASTCALL = "fastcall"  # the name of kernelkit.fastcall's module among the AOT targets


# ---------------------------------------------------------------------------------------- source key
def _split_flags(flags: Sequence[str]) -> Tuple[List[str], List[str], List[str]]:
    """A unit's flags -> (include dirs, gencode targets like 'sm_90', every other flag in order)."""
    incs, archs, rest = [], [], []
    it = iter(flags)
    for f in it:
        if f == "-gencode":
            m = _GENCODE.match(next(it, ""))
            if not m:
                raise KernelkitError(f"unexpected -gencode value in {list(flags)}")
            archs.append(m.group(1))
        elif f.startswith("-I"):
            incs.append(f[2:])
        else:
            rest.append(f)
    return incs, archs, rest


def _key_ldflags(ldflags: Sequence[str]) -> List[str]:
    """Link flags without the machine's library paths (torch's libraries are named by -l and versioned
    by the torch version in the key)."""
    return [f for f in ldflags if not f.startswith(("-L", "-Wl,-rpath"))]


def _portable_fingerprint() -> List[str]:
    """toolchain.fingerprint() minus the C++ compiler's identity (which is local to a machine)."""
    return [line for line in toolchain.fingerprint().splitlines() if not line.startswith("cxx=")]


def source_key(target) -> str:
    """The machine-independent key of a planned build (a ``build.Target``)."""
    chunks = [b"kernelkit-source-key-1", target.name.encode(), "\n".join(_portable_fingerprint()).encode(),
              "\0".join(_key_ldflags(target.ldflags)).encode()]
    for u in target.units:
        _, _, flags = _split_flags(u.flags)
        # the digest the unit was planned with, where build.Unit records it (else the files as they are now)
        digest = getattr(u, "digest", None) or digest_tree(u.path.read_bytes(), u.deps)
        chunks += [u.kind.encode(), "\0".join(flags).encode(), digest.encode()]
    return sha256_bytes(*chunks)


def target_archs(target) -> List[str]:
    """The GPU code a build asks for: 'sm_90' (SASS) and 'compute_90' (PTX) entries, sorted."""
    return sorted({a for u in target.units for a in _split_flags(u.flags)[1]})


def _arch_num(a: str) -> Optional[Tuple[str, int, int, str]]:
    m = _ARCH.match(a)
    return (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)) if m else None


def covers(have: Iterable[str], want: Iterable[str]) -> bool:
    """Whether GPU code built for ``have`` runs on every arch in ``want``: the same SASS, SASS of the same
    major and a lower minor (binary compatible), or PTX of an equal or lower arch (JIT-compiled by the
    driver on first load). A PTX request needs that exact PTX."""
    have_p = [p for p in map(_arch_num, have) if p]
    for w in want:
        pw = _arch_num(w)
        if pw is None or w in have:
            continue
        kind, major, minor, suffix = pw
        if kind == "compute":
            return False
        ok = any((k == "sm" and M == major and m <= minor and not s and not suffix)
                 or (k == "compute" and (M, m) <= (major, minor) and not s)
                 for k, M, m, s in have_p)
        if not ok:
            return False
    return True


# ------------------------------------------------------------------------------- finding at run time
def prebuilt_dirs() -> List[Path]:
    """KERNELKIT_PREBUILT_PATH (in order), then the installed package's prebuilt directory: those that
    exist and are trusted (see ``_trusted_owners``); an untrusted one is skipped with a warning."""
    env = [Path(p).expanduser() for p in os.environ.get(PREBUILT_ENV, "").split(os.pathsep) if p]
    return [d for d in env + [PACKAGE_PREBUILT] if _trusted_dir(d)]


def _trusted_owners(root: Path) -> Set[int]:
    """You and root; for the package's own prebuilt directory also whoever installed kernelkit (their
    Python code runs in this process already)."""
    owners = {os.getuid(), 0}
    if root == PACKAGE_PREBUILT:
        with contextlib.suppress(OSError):
            owners.add(os.stat(Path(__file__).resolve()).st_uid)
    return owners


_WARNED: Set[Path] = set()


def _trusted_dir(root: Path) -> bool:
    try:
        st = os.stat(root)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_uid in _trusted_owners(root):
        return True
    if root not in _WARNED:
        _WARNED.add(root)
        log.warning("ignoring prebuilt directory %s: it is owned by uid %d, not by you (uid %d) or root, and "
                    "loading its libraries would run their code. Use a directory of your own in %s.",
                    root, st.st_uid, os.getuid(), PREBUILT_ENV)
    return False


def _check_trusted(path: Path, owner: int) -> None:
    """Like cache.check_safe, for directories other people may own: a prebuilt directory is trusted as
    far as whoever owns it (the installer of the package, or the owner of a directory you listed in
    KERNELKIT_PREBUILT_PATH). Everything in it must be owned by them (or by you, or root) and be
    writable by nobody else, and nothing may be a symbolic link."""
    st = os.stat(path, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise CacheSecurityError(f"{path} is a symbolic link; kernelkit does not follow links in a prebuilt directory")
    if st.st_uid not in (owner, os.getuid(), 0):
        raise CacheSecurityError(f"{path} is owned by uid {st.st_uid}, not by the owner of its prebuilt directory "
                                 f"(uid {owner}), you or root: refusing to load it")
    if st.st_mode & 0o022:
        raise CacheSecurityError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                                 f"refusing to load it. Fix with: chmod go-w '{path}'")


def read_manifest(entry: Path) -> Optional[dict]:
    try:
        m = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("format") == FORMAT else None


def _verified(root: Path, entry: Path, manifest: dict) -> Optional[Path]:
    """The entry's .so if it is safe to load and matches its recorded sha256. Reads only."""
    so = entry / str(manifest.get("so", ""))
    if so.parent != entry or not so.is_file():
        log.warning("prebuilt entry %s names no library that exists; ignoring it", entry)
        return None
    owner = os.stat(root).st_uid
    for p in (root, entry, entry / MANIFEST, so):
        _check_trusted(p, owner)
    if sha256_file(so) != manifest.get("sha256"):
        log.warning("prebuilt %s does not match its recorded sha256 (corrupt or replaced); ignoring it", so)
        return None
    return so


def find_prebuilt(target) -> Optional[Path]:
    """The prebuilt .so for ``target`` (a planned ``build.Target``) if one matches its source key and
    covers its CUDA archs; None otherwise (the caller builds with JIT). Never writes, never locks."""
    candidates = []
    for root in prebuilt_dirs():
        try:
            entries = sorted(root.glob(f"{target.name}-*")) if root.is_dir() else []
        except OSError:
            continue
        candidates += [(root.resolve(), e) for e in entries if e.is_dir()]
    if not candidates:
        return None
    key, want = source_key(target), target_archs(target)
    stale = []
    for root, entry in sorted(candidates, key=lambda c: not c[1].name.endswith(key[:16])):
        m = read_manifest(entry)
        if m is None or m.get("name") != target.name:
            continue
        if m.get("source_key") != key:
            stale.append(f"{entry} (other sources, flags or torch)")
        elif not covers(m.get("archs", []), want):
            stale.append(f"{entry} (built for {','.join(m.get('archs', [])) or 'no GPU'}; needs {','.join(want)})")
        else:
            so = _verified(root, entry, m)
            if so is not None:
                return so
    if stale:
        say(f"{target.name}: prebuilt does not match this build, using JIT: " + "; ".join(stale))
    return None


# ------------------------------------------------------------------------------------ building (AOT)
def plan(ops: Optional[Sequence[str]] = None, arch=None, kernels_dir=None) -> List[Tuple[object, object]]:
    """(card, target) for each card, planned exactly as ``kernelkit.load`` plans it; all cards and the
    fast call module (``"fastcall"``, card None) by default."""
    from .cards import all_cards, find  # (the package's `cards` attribute is the all_cards function)

    names = list(ops) if ops else sorted(all_cards(kernels_dir)) + [FASTCALL]
    out = []
    for name in names:
        if name == FASTCALL:  # kernelkit.ops' call path: prebuilt too, so no compiler is ever needed
            from . import fastcall

            out.append((None, fastcall.target()))
            continue
        card = find(name, kernels_dir)
        out.append((card, plan_card(card, arch, [], [], [], [])))
    return out


def _compile_args(kind: str, flags: Sequence[str], archs: Sequence[str]) -> Dict[str, List[str]]:
    """BuildExtension's per-compiler flags for units of one kind compiled with ``flags`` (the JIT's,
    without include paths) for ``archs``."""
    if kind == "cpp":
        return {"cxx": list(flags) + ["-g0"], "nvcc": []}  # -g0: setuptools adds Python's -g
    nvcc = list(flags)
    if not any(f in toolchain.torch_nvcc_flags() for f in nvcc):
        nvcc += _UNDO_TORCH_NVCC
    return {"cxx": [], "nvcc": nvcc + [x for a in archs for x in ("-gencode", f"arch=compute_{a.split('_', 1)[1]},code={a}")]}


def extension(target, prefix: str = ""):
    """A torch ``CUDAExtension`` (``CppExtension`` for a CPU card) compiling the same TUs as the JIT
    (the card's sources and the same generated binding TU) with the same flags where they matter, and
    the manifest to write next to it (``ext.kernelkit_manifest``). An extension has one flag set per
    compiler: units planned with other flags (a CPU card's -O3 device .cpp next to its -O2 binding) are
    compiled separately by :class:`BuildPrebuilt` (``ext.kernelkit_extra``) and linked in."""
    ce = toolchain.cpp_extension()
    archs = target_archs(target)
    incs: Dict[str, None] = {}
    groups: Dict[Tuple[str, Tuple[str, ...]], List[str]] = {}
    for u in reversed(target.units):  # the binding TU (planned last) sets the extension's C++ flags
        inc, _, flags = _split_flags(u.flags)
        incs.update(dict.fromkeys(inc))
        groups.setdefault((u.kind, tuple(flags)), []).insert(0, str(u.path))
    main: Dict[str, Tuple[str, ...]] = {}
    for kind, flags in groups:
        main.setdefault(kind, flags)
    link = [f for f in _key_ldflags(target.ldflags) if f != "-shared" and not f.startswith("-l")]
    manifest = _manifest(target, "torch.utils.cpp_extension.BuildExtension")
    entry = f"{target.name}-{manifest['source_key'][:16]}"
    compile_args = {"cxx": _compile_args("cpp", main.get("cpp", ()), archs)["cxx"],
                    "nvcc": _compile_args("cu", main["cu"], archs)["nvcc"] if "cu" in main else []}
    sources = [src for (kind, flags), srcs in groups.items() if main[kind] == flags for src in srcs]
    make = ce.CUDAExtension if target.with_cuda else ce.CppExtension
    ext = make(f"{prefix}{entry}.kk_{target.name}", sources, include_dirs=list(incs), extra_link_args=link,
               extra_compile_args=compile_args)
    if not target.pymodule:  # a C++ program (examples/cpp) loads cards without Python: no libtorch_python
        ext.libraries = [lib for lib in ext.libraries if lib != "torch_python"]
    ext.kernelkit_extra = [(srcs, _compile_args(kind, flags, archs))
                           for (kind, flags), srcs in groups.items() if main[kind] != flags]
    ext.kernelkit_manifest = manifest
    return ext


def _manifest(target, built_with: str) -> dict:
    return {"format": FORMAT, "name": target.name, "source_key": source_key(target),
            "archs": target_archs(target), "jit_key": target.key, "units": [u.display for u in target.units],
            "fingerprint": _portable_fingerprint(), "built_with": built_with}


def _write_manifest(info: dict, so: Path, seconds: float) -> None:
    manifest = {**info, "so": so.name, "sha256": sha256_file(so), "created": time.time(),
                "build_seconds": round(seconds, 3)}
    (so.parent / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _build_ext_class():
    """BuildExtension that writes each library's manifest (its sha256 and source key) next to it."""
    ce = toolchain.cpp_extension()

    class BuildPrebuilt(ce.BuildExtension):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("no_python_abi_suffix", True)  # a plain kk_<op>.so, for C++ consumers too
            super().__init__(*args, **kwargs)

        def get_source_files(self):  # for egg_info/sdist: the generated binding TUs live in the cache
            return [s for s in super().get_source_files() if not os.path.isabs(s)]

        def build_extension(self, ext):
            t0 = time.perf_counter()
            say(f"AOT: building {ext.name} ...")
            for sources, args in getattr(ext, "kernelkit_extra", []):  # (self.compiler.compile is torch's here)
                ext.extra_objects = list(ext.extra_objects or []) + self.compiler.compile(
                    sources, output_dir=self.build_temp, include_dirs=ext.include_dirs, extra_postargs=args)
            super().build_extension(ext)
            info = getattr(ext, "kernelkit_manifest", None)
            if info is None:
                return
            so = Path(self.get_ext_fullpath(ext.name))
            seconds = time.perf_counter() - t0
            _write_manifest(info, so, seconds)
            say(f"AOT: {info['name']} built in {seconds:.1f} s -> {so.parent}")

    return BuildPrebuilt


def setup_kwargs(ops=None, arch=None, kernels_dir=None) -> dict:
    """What setup.py passes to ``setup()`` for ``KERNELKIT_AOT=1``: the extensions (installed under
    ``kernelkit/prebuilt/``) and the build command."""
    exts = [extension(t, prefix="kernelkit.prebuilt.") for _, t in plan(ops, arch, kernels_dir)]
    return {"ext_modules": exts, "cmdclass": {"build_ext": _build_ext_class()}}


def build_dir(out, ops=None, arch=None, kernels_dir=None, build_temp=None) -> List[Path]:
    """Build the cards into the prebuilt directory ``out`` (usable with KERNELKIT_PREBUILT_PATH);
    returns the built entries."""
    from setuptools import Distribution

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    exts = [extension(t) for _, t in plan(ops, arch, kernels_dir)]
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    dist = Distribution({"name": "kernelkit-prebuilt", "ext_modules": exts,
                         "cmdclass": {"build_ext": _build_ext_class()}})
    dist.script_name = "kernelkit-aot"
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(out)
    cmd.build_temp = str(build_temp or Path(tempfile.gettempdir()) / f"kernelkit-aot-{os.getuid()}")
    dist.run_command("build_ext")
    return [out / e.name.split(".")[0] for e in exts]


def export_jit(out, ops=None, arch=None, kernels_dir=None) -> List[Path]:
    """Fill the prebuilt directory ``out`` from kernelkit's own JIT builds (built now, or reused from the
    cache): the cheap way to share a cache with a fleet read-only, at no extra compile."""
    import shutil

    from . import build as _build

    out = Path(out).resolve()
    entries = []
    for _, target in plan(ops, arch, kernels_dir):
        so, _, seconds = _build.build(target)
        info = _manifest(target, "kernelkit JIT")
        entry = out / f"{target.name}-{info['source_key'][:16]}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=out))
        lib = tmp / f"kk_{target.name}.so"
        shutil.copyfile(so, lib)
        os.chmod(lib, 0o755)
        _write_manifest(info, lib, seconds)
        os.chmod(tmp, 0o755)
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
        entries.append(entry)
    return entries


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernelkit.aot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ops", nargs="*", help="card names, and 'fastcall' for kernelkit.ops' call path (default: all)")
    p.add_argument("--out", required=True, help="prebuilt directory to write (then set KERNELKIT_PREBUILT_PATH)")
    p.add_argument("--arch", help="CUDA archs, e.g. '8.0,9.0' (default: KERNELKIT_ARCH, TORCH_CUDA_ARCH_LIST, "
                                  "the current GPU, else 9.0)")
    p.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    p.add_argument("--build-temp", help="object directory (kept for incremental rebuilds)")
    p.add_argument("--jit", action="store_true", help="copy kernelkit's own JIT builds (reusing the cache) "
                                                     "instead of building with torch's BuildExtension")
    args = p.parse_args(argv)
    ops = args.ops or None
    try:
        if args.jit:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            entries = export_jit(args.out, ops, args.arch, args.kernels_dir)
        else:
            entries = build_dir(args.out, ops, args.arch, args.kernels_dir, args.build_temp)
        for entry in entries:
            print(entry)
    except KernelkitError as e:
        print(f"kernelkit.aot: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
