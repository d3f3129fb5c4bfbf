"""Finding prebuilt libraries at run time: the lookup every load makes after the cache.

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
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Set, Tuple

from .. import settings
from ..errors import CacheSecurityError
from . import keys, toolchain
from .progress import say
from .sources import digest_tree, sha256_file

log = logging.getLogger("kernelkit")

PACKAGE_PREBUILT = Path(__file__).resolve().parent.parent / "prebuilt"
MANIFEST = "manifest.json"
FORMAT = "kernelkit-prebuilt-1"
_GENCODE = re.compile(r"^arch=compute_\w+,code=(\[[\w,]+\]|\w+)$")
_GENCODE_FLAGS = ("-gencode", "--generate-code")
_ARCH_FLAGS = ("-arch", "--gpu-architecture")
_CODE_FLAGS = ("-code", "--gpu-code")
_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")


# ---------------------------------------------------------------------------------------- source key
def split_flags(flags: Sequence[str]) -> Tuple[List[str], List[str], List[str]]:
    """A unit's flags -> (include dirs, GPU code like 'sm_90' or 'compute_90', every other flag in order).

    The GPU code is read from every form nvcc takes: ``-gencode``/``--generate-code`` (with a space or ``=``,
    one code or a ``[list]``) and ``-arch``/``-code`` (``-arch=sm_90`` alone means SASS and PTX of 90). A value
    this does not read (``-arch=native``, ``code=lto_90``) stays among the other flags, in the source key."""
    incs, archs, rest = [], [], []
    arch = code = None
    arch_at: List[int] = []  # where -arch/-code sit in rest: they leave it once both are read
    it = iter(flags)
    for f in it:
        name, eq, value = f.partition("=") if f.startswith("-") else (f, "", "")
        if name in _GENCODE_FLAGS + _ARCH_FLAGS + _CODE_FLAGS:
            value = value if eq else next(it, "")
            spelled = f if eq else f"{f}={value}"
            m = _GENCODE.match(value) if name in _GENCODE_FLAGS else None
            codes = _code_list(m.group(1)) if m else None
            if codes:
                archs.extend(codes)
            else:
                if name not in _GENCODE_FLAGS:
                    arch_at.append(len(rest))
                    arch, code = (value, code) if name in _ARCH_FLAGS else (arch, value)
                rest.append(spelled)
        elif f == "-I":
            incs.append(next(it, ""))
        elif f.startswith("-I"):
            incs.append(f[2:])
        else:
            rest.append(f)
    implied = _arch_codes(arch, code)
    if implied:
        archs.extend(implied)
        rest = [f for i, f in enumerate(rest) if i not in arch_at]
    return incs, archs, rest


def _code_list(value: str) -> Optional[List[str]]:
    codes = [c for c in value.strip("[]").split(",") if c]
    return codes if codes and all(_ARCH.match(c) for c in codes) else None


def _arch_codes(arch: Optional[str], code: Optional[str]) -> Optional[List[str]]:
    """What ``-arch``/``-code`` ask nvcc for: ``-code``'s list, else ``-arch=sm_XY``'s SASS and PTX (a virtual
    ``-arch=compute_XY`` alone: its PTX); None where either is a value this does not read."""
    if arch is None or not _ARCH.match(arch):
        return None
    if code is not None:
        return _code_list(code)
    return [arch, "compute_" + arch.split("_", 1)[1]] if arch.startswith("sm_") else [arch]


def key_ldflags(ldflags: Sequence[str]) -> List[str]:
    """Link flags without the machine's library paths (torch's libraries are named by -l and versioned
    by the torch version in the key), cudart named one way: a toolkit with no unversioned libcudart.so (NVIDIA's
    wheels) is linked with -l:libcudart.so.<major>, which links the same library as -lcudart."""
    return ["-lcudart" if re.fullmatch(r"-l:libcudart\.so\.\d+", f) else f
            for f in ldflags if not f.startswith(("-L", "-Wl,-rpath"))]


def portable_fingerprint() -> List[str]:
    """toolchain.fingerprint() minus the C++ compiler's identity (which is local to a machine)."""
    return [line for line in toolchain.fingerprint().splitlines() if not line.startswith("cxx=")]


def source_key(target) -> str:
    """The machine-independent key of a planned build (a ``units.Target``): see ``keys.source_key``."""
    units = []
    for u in target.units:
        shard = getattr(u, "shard", None)
        if shard is not None and shard[0] > 0:  # dtype shards are one file compiled whole: one unit, as an AOT build has
            continue
        # a shard is its file's unit with one more -D, last (units.with_define): the whole file's flags without it
        _, _, flags = split_flags(u.flags[:-1] if shard else u.flags)
        # the digest the unit was planned with, where units.Unit records it (else the files as they are now)
        digest = getattr(u, "digest", None) or digest_tree(u.path.read_bytes(), u.deps, getattr(u, "roots", ()))
        units.append((u.kind, flags, digest))
    return keys.source_key(target.name, portable_fingerprint(), key_ldflags(target.ldflags), units,
                           keys.link_files(target.ldflags))


def target_archs(target) -> List[str]:
    """The GPU code a build asks for: 'sm_90' (SASS) and 'compute_90' (PTX) entries, sorted."""
    return sorted({a for u in target.units for a in split_flags(u.flags)[1]})


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
    return [d for d in [*settings.PREBUILT_PATH.get(), PACKAGE_PREBUILT] if _trusted_dir(d)]


def _trusted_owners(root: Path) -> Set[int]:
    """You and root; for the package's own prebuilt directory also whoever installed kernelkit (their
    Python code runs in this process already)."""
    owners = {os.getuid(), 0}
    if root == PACKAGE_PREBUILT:
        with contextlib.suppress(OSError):
            owners.add(os.stat(PACKAGE_PREBUILT.parent / "__init__.py").st_uid)
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
    _warn_once(root, f"ignoring prebuilt directory {root}: it is owned by uid {st.st_uid}, not by you (uid "
               f"{os.getuid()}) or root, and loading its libraries would run their code. Use a directory of your "
               f"own in {settings.PREBUILT_PATH.name}.")
    return False


def _warn_once(where: Path, message: str) -> None:
    if where not in _WARNED:
        _WARNED.add(where)
        log.warning("%s", message)


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


def _what_differs(manifest: dict) -> str:
    """Why a prebuilt's source key is not this load's: the environment lines that differ (torch, its CUDA,
    the C++ ABI, Python, kernelkit), as built and as here; else the sources or flags."""
    here = dict(line.split("=", 1) for line in portable_fingerprint())
    built = dict(str(line).split("=", 1) for line in manifest.get("fingerprint", []) if "=" in str(line))
    differ = [f"{k} {built[k]} there, {here[k]} here" for k in here if k in built and built[k] != here[k]]
    return "; ".join(differ) if differ else "other sources or flags"


def find_prebuilt(target) -> Optional[Path]:
    """The prebuilt .so for ``target`` (a planned ``units.Target``) if one matches its source key and
    covers its CUDA archs; None otherwise (the caller builds with JIT). Never writes, never locks."""
    if not settings.fast_path("prebuilt"):
        return None
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
            stale.append(f"{entry} ({_what_differs(m)})")
        elif not covers(m.get("archs", []), want):
            stale.append(f"{entry} (built for {','.join(m.get('archs', [])) or 'no GPU'}; needs {','.join(want)})")
        else:
            try:
                so = _verified(root, entry, m)
            except CacheSecurityError as e:  # someone else's problem to fix: say so once, and build
                _warn_once(entry, f"ignoring prebuilt {entry}: {e}; building with JIT instead")
                continue
            if so is not None:
                return so
    if stale:
        say(f"{target.name}: prebuilt does not match this build, using JIT: " + "; ".join(stale))
    return None
