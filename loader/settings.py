"""Every ``KERNELKIT_*`` environment variable kernelkit reads, declared once: its type, default, a one-line doc,
and whether its value can change what a build produces (``changes_build``: a warm-plan record keys on exactly
those, :func:`build_environment`).

A value is read from ``os.environ`` at each access (tests and users change it while a process runs) and parsed
by one rule per type. Every on/off setting reads ``1/on/true/yes`` as on and ``0/off/false/no`` as off, in any
case; blanks around a value are ignored, and an unset or empty variable means the default. Anything else raises
a one-line :class:`KernelkitError` naming the variable, its value and what it takes.

``KERNELKIT_FAST=0`` turns every optional fast path (``FAST_PATHS``, asked through :func:`fast_path`) off: the
slow path is the specification, and with it alone the core builds every card, extension and cell correctly.

This module imports nothing heavy: ``import kernelkit`` and the patch read it before torch is imported.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from .errors import KernelkitError

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")
_BOOL = {**dict.fromkeys(ON, True), **dict.fromkeys(OFF, False)}
#: the spellings of a choice's ``on`` and ``off`` values: the same as a boolean's
SWITCH = {**dict.fromkeys(ON, "on"), **dict.fromkeys(OFF, "off")}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One variable, a string as set. ``shown``: the default as README's configuration table words it."""

    name: str
    default: object
    doc: str
    changes_build: bool = False
    shown: str = ""
    kind = "str"

    def get(self):
        """The variable's value now, parsed; the default when it is unset or empty."""
        raw = os.environ.get(self.name, "").strip()
        return self.parse(raw) if raw else self.default

    def parse(self, raw: str):
        return raw

    def shown_default(self) -> str:
        return self.shown or str(self.default)

    def bad(self, raw: str, expected: str) -> KernelkitError:
        return KernelkitError(f"{self.name}={raw!r}: expected {expected}")


@dataclasses.dataclass(frozen=True)
class Flag(Setting):
    kind = "bool"

    def parse(self, raw: str) -> bool:
        value = _BOOL.get(raw.lower())
        if value is None:
            raise self.bad(raw, f"on ({', '.join(ON)}) or off ({', '.join(OFF)})")
        return value

    def shown_default(self) -> str:
        return self.shown or ("on" if self.default else "off")


@dataclasses.dataclass(frozen=True)
class Integer(Setting):
    kind = "int"

    def parse(self, raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise self.bad(raw, "a whole number") from None


@dataclasses.dataclass(frozen=True)
class Number(Setting):
    """A positive, finite number (seconds, days)."""

    kind = "float"

    def parse(self, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise self.bad(raw, "a positive number")
        return value

    def shown_default(self) -> str:
        return self.shown or f"{self.default:g}"


@dataclasses.dataclass(frozen=True)
class Size(Setting):
    """A number of bytes, e.g. 500M, 4G, 2.5GB (K, M, G, T: powers of 1024); 0 or off: no limit (None)."""

    kind = "size"

    def parse(self, raw: str) -> Optional[int]:
        if raw.lower() in OFF:
            return None
        m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", raw.lower())
        if not m:
            raise self.bad(raw, "a size such as 500M or 4G, or off")
        return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclasses.dataclass(frozen=True)
class Choice(Setting):
    """One of ``choices``; ``aliases`` maps other spellings to them (any case)."""

    choices: Tuple[str, ...] = ()
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kind = "choice"

    def parse(self, raw: str) -> str:
        value = raw.lower()
        value = self.aliases.get(value, value)
        if value not in self.choices:
            raise self.bad(raw, self.expected())
        return value

    def expected(self) -> str:
        """The choices, each with its other spellings: ``one of auto, on (1, true, yes), off (0, false, no)``."""
        spelled = [(c, [a for a, to in self.aliases.items() if to == c and a != c]) for c in self.choices]
        return "one of " + ", ".join(f"{c} ({', '.join(others)})" if others else c for c, others in spelled)


@dataclasses.dataclass(frozen=True)
class PathSetting(Setting):
    """A file or directory (``~`` expanded)."""

    kind = "path"

    def parse(self, raw: str) -> Path:
        return Path(raw).expanduser()


@dataclasses.dataclass(frozen=True)
class PathList(Setting):
    """Directories separated by ``os.pathsep`` (``~`` expanded, empty entries skipped), in order."""

    kind = "path list"

    def parse(self, raw: str) -> Tuple[Path, ...]:
        return tuple(Path(p).expanduser() for p in raw.split(os.pathsep) if p)


def _switch(name: str, doc: str, **kw) -> Choice:
    """A choice of auto, on and off, spelled as booleans are."""
    return Choice(name, "auto", doc, choices=("auto", "on", "off"), aliases=SWITCH, **kw)


# ------------------------------------------------------------------------------------------- the table
CACHE_DIR = PathSetting("KERNELKIT_CACHE_DIR", None, "cache root (created 0700); builds write it, warm loads only "
                        "read it", shown="the user cache dir")
KERNELS_PATH = PathList("KERNELKIT_PATH", (), "extra card directories, searched before the built-in ones",
                        shown="none")
PREBUILT_PATH = PathList("KERNELKIT_PREBUILT_PATH", (), "directories of AOT-built libraries, only ever read, "
                         "searched before the package's own", shown="none")
ARCH = Setting("KERNELKIT_ARCH", None, "CUDA archs to build for, e.g. 8.0;9.0+PTX (TORCH_CUDA_ARCH_LIST next)",
               changes_build=True, shown="the current GPU")
NVCC = PathSetting("KERNELKIT_NVCC", None, "the nvcc to compile CUDA with", changes_build=True,
                   shown="CUDA_HOME's, else PATH's")
COMPILER_LAUNCHER = Setting("KERNELKIT_COMPILER_LAUNCHER", "", "a compiler launcher (ccache, a wrapper) prefixing "
                            "every compile; its output is the compiler's", shown="none")
# a cold build of a large card on a small machine can take minutes
LOCK_TIMEOUT = Number("KERNELKIT_LOCK_TIMEOUT", 900.0, "seconds to wait for another process's build")
CACHE_MAX_AGE_DAYS = Number("KERNELKIT_CACHE_MAX_AGE_DAYS", 30.0, "cache entries unused this many days are "
                            "garbage-collected (at most once a day, after a build)")
CACHE_MAX_SIZE = Size("KERNELKIT_CACHE_MAX_SIZE", 4 << 30, "the cache's size cap: after a build, the least recently "
                      "used entries go until it fits (off: no cap)", shown="4G")
VERBOSE = Integer("KERNELKIT_VERBOSE", 1, "0 (or less) silences build status lines")
FAST = Flag("KERNELKIT_FAST", True, "off: every optional fast path off (FAST_PATHS), whatever its own setting",
            changes_build=True)
PCH = _switch("KERNELKIT_PCH", "precompiled binding and torch headers (gcc); on: also built as soon as a compile "
              "wants one, auto: so with 4 CPUs or more, else once that build is done")
DTYPE_SHARDS = Choice("KERNELKIT_DTYPE_SHARDS", "auto", "a card's .cu as four TUs, one per floating dtype, where "
                      "that gives the same library; auto: with 4 CPUs or more, 4: with fewer too, off (or 1): "
                      "one TU", changes_build=True, choices=("auto", "off", "4"),
                      aliases={**dict.fromkeys(OFF, "off"), "1": "off"})
LINK_STAND_INS = Flag("KERNELKIT_LINK_STAND_INS", True, "a relink whose objects reference nothing new in torch "
                      "links against small stand-ins proven to give the same dynamic interface")
DEVICE_REBUILD = Flag("KERNELKIT_DEVICE_REBUILD", True, "an edit of a .cu's device code alone recompiles device "
                      "code only and patches it into the cached host object")
TORCH_CU = Choice("KERNELKIT_TORCH_CU", "auto", "a .cu that includes torch: auto splits it into host and device "
                  "TUs where it can, split insists, full builds it as written", changes_build=True,
                  choices=("auto", "split", "full"))
FASTCALL = _switch("KERNELKIT_FASTCALL", "kernelkit.ops calls through the fast call module (off: torch.ops); on: "
                   "a missing module is built in the background with fewer than 4 CPUs too")
PATCH_TORCH = Flag("KERNELKIT_PATCH_TORCH", False, "route torch.utils.cpp_extension's load/load_inline through "
                   "kernelkit where the program imports kernelkit")
CAPTURE = Choice("KERNELKIT_CAPTURE", "on", "%%kernelkit cells: C-level and device output into the cell; launch: "
                 "each custom op's output labelled (synchronising after it)", choices=("on", "off", "launch"),
                 aliases=SWITCH)
REPORT = Flag("KERNELKIT_REPORT", True, "%%kernelkit cells: a compact compile report after a cell that built")
NCU = PathSetting("KERNELKIT_NCU", None, "Nsight Compute's ncu for kernelkit.profile", shown="PATH's, else the "
                  "newest installed")
COMPILE_COMMANDS = PathSetting("KERNELKIT_COMPILE_COMMANDS", None, "a directory where every build updates "
                               "compile_commands.json (and .clangd) for editors, as kernelkit ide writes them",
                               shown="none")
# a build cache a team or fleet shares (jit.remote; docs/remote-cache.md): read through and written through
REMOTE_CACHE = Setting("KERNELKIT_REMOTE_CACHE", "", "a shared build cache behind the local one: file:///path, "
                       "s3://bucket/prefix (any fsspec URL) or redis://host:port/db", shown="none")
REMOTE_CACHE_MODE = Choice("KERNELKIT_REMOTE_CACHE_MODE", "readwrite", "read: only fetch from the remote cache, "
                           "write: only publish to it, readwrite: both", choices=("read", "write", "readwrite"))
REMOTE_CACHE_REQUIRE = Flag("KERNELKIT_REMOTE_CACHE_REQUIRE", False, "on: a library neither cache holds raises "
                            "instead of being compiled")
REMOTE_CACHE_TIMEOUT = Number("KERNELKIT_REMOTE_CACHE_TIMEOUT", 5.0, "seconds a request to the remote cache may "
                              "take; one that does not answer is not asked again by the process")
REMOTE_CACHE_SECRET = PathSetting("KERNELKIT_REMOTE_CACHE_SECRET", None, "a file holding the team secret that signs "
                                  "and verifies remote cache entries (HMAC-SHA256)", shown="none")
REMOTE_CACHE_SIGNING_KEY = PathSetting("KERNELKIT_REMOTE_CACHE_SIGNING_KEY", None, "an ed25519 private key file "
                                       "(kernelkit cache keygen) that signs the entries this process publishes",
                                       shown="none")
REMOTE_CACHE_TRUSTED_KEYS = PathList("KERNELKIT_REMOTE_CACHE_TRUSTED_KEYS", (), "ed25519 public key files whose "
                                     "signatures a reader accepts, separated by os.pathsep", shown="none")
AOT = Flag("KERNELKIT_AOT", False, "pip install/wheel of this tree builds the cards ahead of time (setup.py)")
AOT_OPS = Setting("KERNELKIT_AOT_OPS", "", "the cards KERNELKIT_AOT builds, separated by commas or blanks",
                  shown="all")
AOT_KERNELS_DIR = PathSetting("KERNELKIT_AOT_KERNELS_DIR", None, "the directory of cards KERNELKIT_AOT builds",
                              shown="the built-in cards")
AOT_BUILD_DIR = PathSetting("KERNELKIT_AOT_BUILD_DIR", None, "KERNELKIT_AOT's build directory, kept between "
                            "builds", shown="setuptools'")

#: name -> setting, every one
SETTINGS: Dict[str, Setting] = {s.name: s for s in (
    CACHE_DIR, KERNELS_PATH, PREBUILT_PATH, ARCH, NVCC, COMPILER_LAUNCHER, LOCK_TIMEOUT, CACHE_MAX_AGE_DAYS,
    CACHE_MAX_SIZE, VERBOSE,
    FAST, PCH, DTYPE_SHARDS, LINK_STAND_INS, DEVICE_REBUILD, TORCH_CU, FASTCALL, PATCH_TORCH, CAPTURE, REPORT, NCU,
    COMPILE_COMMANDS, REMOTE_CACHE, REMOTE_CACHE_MODE, REMOTE_CACHE_REQUIRE, REMOTE_CACHE_TIMEOUT,
    REMOTE_CACHE_SECRET, REMOTE_CACHE_SIGNING_KEY, REMOTE_CACHE_TRUSTED_KEYS, AOT, AOT_OPS, AOT_KERNELS_DIR,
    AOT_BUILD_DIR)}
_BUILD_SETTINGS = tuple(s for s in SETTINGS.values() if s.changes_build)


def build_environment() -> Tuple[Tuple[str, object], ...]:
    """(name, value) of every setting that can change what a build produces: what a warm-plan record keys on."""
    return tuple((s.name, s.get()) for s in _BUILD_SETTINGS)


# ----------------------------------------------------------------------------------------- fast paths
@dataclasses.dataclass(frozen=True)
class FastPath:
    """An optional path that makes something faster and nothing different. ``knob``: its own setting (None:
    KERNELKIT_FAST alone turns it off), whose value ``off`` turns it off."""

    name: str
    knob: Optional[Setting]
    off: object
    doc: str


FAST_PATHS: Dict[str, FastPath] = {p.name: p for p in (
    FastPath("torch_cu_split", TORCH_CU, "full", "a .cu that includes torch split into a host TU and a torch-free "
             "device TU (jit.fast.torch_cu)"),
    FastPath("device_rebuild", DEVICE_REBUILD, False, "a device-only edit recompiles device code alone "
             "(jit.fast.device_rebuild)"),
    FastPath("pch", PCH, "off", "precompiled headers for binding and host TUs (jit.fast.pch)"),
    FastPath("dtype_shards", DTYPE_SHARDS, "off", "a card's .cu compiled as one TU per floating dtype "
             "(jit.fast.shards)"),
    FastPath("link_stand_ins", LINK_STAND_INS, False, "relinks against stand-ins for torch's libraries "
             "(jit.fast.stand_ins)"),
    FastPath("records", None, None, "warm-plan, torch-signature and launcher records skip planning on a warm load "
             "(jit.fast.recall via loading.extensions, loading.arguments, instant.launcher)"),
    FastPath("fastcall", FASTCALL, "off", "kernelkit.ops calls through the fast call module (jit.fastcall)"),
    FastPath("prebuilt", None, None, "AOT-built libraries used before a JIT build (jit.prebuilt)"),
)}


def fast_path(name: str) -> bool:
    """Whether the fast path ``name`` (a key of FAST_PATHS) is on: KERNELKIT_FAST and its own setting allow it."""
    path = FAST_PATHS[name]
    return FAST.get() and (path.knob is None or path.knob.get() != path.off)
