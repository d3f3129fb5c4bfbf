"""The fast paths: optional ways to the core's own result, each behind a hook of this table.

The core (``jit.plan``, ``jit.build``) is the specification: it compiles every TU with its compiler as written and
links against torch. It calls the fast paths only through the functions below, at five points (planning a unit,
expanding it, compiling it, compiling it as written, linking); each hook returns a result or None, after which the
core does the plain thing. ``KERNELKIT_FAST=0`` turns every one off (``settings.fast_path``); ``PATHS`` says, per
path, where it hooks in, what gates it, where its measured gain is written down and which test proves it the same.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..units import Target, Unit
from . import device_rebuild, pch, recall, shards, stand_ins


@dataclasses.dataclass(frozen=True)
class FastPath:
    """One fast path: ``name`` is its key in ``settings.FAST_PATHS`` (its switch)."""

    name: str
    hooks: Tuple[str, ...]  # the functions of this module it answers
    gates: str  # when it applies, besides its switch
    docs: str  # the docs section with its measured gain: "file#heading"
    test: str  # the tests that prove it gives the core's result


_PERF = "docs/performance.md#"
PATHS = (
    FastPath("torch_cu_split", hooks=("claim", "compile"),
             gates="a torch-style .cu that includes torch's headers and that the split's model can keep equal (else "
                   "built as written, saying why)",
             docs=_PERF + "the-split-rebuilt-both-tus-the-file-less-what-the-other-side-owns-proven-against-the-file-"
                          "2026-12-06",
             test="tests/test_torch_cu.py tests/test_split.py tests/test_split_corpus.py"),
    FastPath("device_rebuild", hooks=("compile_as_written", "facts", "stored"),
             gates="a .cu whose host shape has a cached object; binutils objcopy",
             docs=_PERF + "device-code-only-an-edit-inside-kernel-bodies-keeps-the-host-side",
             test="tests/test_device_rebuild.py"),
    FastPath("pch", hooks=("compile_as_written",),
             gates="gcc; a card's binding, a split host TU's torch preamble, or a C++ file whose first line includes "
                   "a torch header; a verified PCH for the TU's flags (else one is built in the background)",
             docs=_PERF + "a-cpp-edit-with-its-leading-torch-header-precompiled-2026-12-07",
             test="tests/test_faults.py tests/test_torch_cu.py tests/test_cpp_extension.py"),
    FastPath("dtype_shards", hooks=("expand",),
             gates="a card's .cu with a dtype dispatch, on 4+ cores (KERNELKIT_DTYPE_SHARDS=on: any machine)",
             docs=_PERF + "a-cards-math-edit-the-cu-in-dtype-shards",
             test="tests/test_shards.py"),
    FastPath("records", hooks=("recall_key", "recall_plan", "remember_plan", "recalled", "recalled_library",
                               "namespaces", "before_verify", "verified"),
             gates="a torch-style load whose every file and include dir has the identity recorded by its full plan",
             docs=_PERF + "a-warm-load-by-section-2026-12-02",
             test="tests/test_patch.py tests/test_settings.py"),
    FastPath("link_stand_ins", hooks=("link",),
             gates="a relink whose objects reference nothing new in torch's libraries, after stand-ins were proven "
                   "for these flags in this process",
             docs=_PERF + "a-cards-math-edit-relinked-against-stand-ins-for-torchs-libraries",
             test="tests/test_stand_ins.py"),
)


@dataclasses.dataclass(frozen=True)
class Core:
    """What the core lends a fast path that builds a unit out of other units (the split)."""

    compile_cached: Callable[[Unit, Target], Path]  # a unit's object, from the cache or compiled now
    compile_as_written: Callable[[Unit, Target, Path, Path], dict]  # the plain compile, and what it learned


def claim(unit: Unit) -> Unit:
    """The unit as planned, or claimed by a fast path that compiles it its own way (its strategy in the key)."""
    if unit.kind != "cu":
        return unit
    from . import torch_cu  # the split's parser loads for a .cu only: a warm load, which plans nothing, skips ~15 ms

    return torch_cu.claim(unit) or unit


def expand(unit: Unit, text: str) -> List[Unit]:
    """The units a card's source is compiled as: itself, or its dtype shards."""
    return shards.expand(unit, text) or [unit]


def compile(unit: Unit, target: Target, out: Path, depfile: Path, core: Core) -> Optional[dict]:
    """``out`` made by the fast path that claimed the unit (what it learned, for the object's metadata); None:
    the core compiles it as written."""
    if not unit.strategy:
        return None
    from . import torch_cu

    return torch_cu.compile_split(unit, target, out, depfile, core)


def compile_as_written(unit: Unit, target: Target, out: Path, depfile: Path) -> Optional[dict]:
    """``out`` compiled from the unit's file by a faster route (device code only, a precompiled header); None:
    the core runs the compiler on it."""
    made = device_rebuild.compile_device_only(unit, target, out, depfile)
    return made if made is not None else pch.compile_with_pch(unit, target, out, depfile)


def facts(unit: Unit) -> dict:
    """What the fast paths keep with an object compiled as written."""
    return device_rebuild.facts(unit)


def stored(unit: Unit, info: dict) -> None:
    """After the core stored an object with ``info`` (what it was compiled as, what the fast paths learned)."""
    device_rebuild.stored(unit, info)


def link(target: Target, cmd: List[str]) -> Optional[bool]:
    """True when a fast path linked ``cmd``'s output; None: the core links it."""
    return stand_ins.link(target, cmd)


def recall_key(name: str, paths: Sequence[Path], flags_by_kind: Dict[str, List[str]], ldflags: Sequence[str],
               pymodule: Optional[str], standalone: bool) -> str:
    """What a torch-style plan derives its target from, besides the files it reads: a warm-plan record's key."""
    return recall.call_key(name, paths, flags_by_kind, ldflags, pymodule, standalone)


def recall_plan(call: str) -> Optional[Target]:
    """Before planning: the target a full plan of this call recorded, if nothing it read has changed; None: plan."""
    return recall.recall(call)


def remember_plan(call: str, target: Target, started: float) -> None:
    """After a full plan: record it for the next process."""
    recall.remember(call, target, started)


def recalled(target: Target) -> bool:
    """Whether ``target`` was read back from a record: it can open a cached library, not build one."""
    return isinstance(target, recall.Recalled)


def recalled_library(target: Target) -> Optional[Path]:
    """A recalled target's cached library if it is intact; None: not recalled, or no intact library."""
    return recall.verified_library(target) if recalled(target) else None


def namespaces(target: Target) -> List[str]:
    """The namespaces the target's TORCH_LIBRARY blocks define, without reading a file for a recalled target."""
    return recall.namespaces(target)


def before_verify(target: Target) -> Optional[List[int]]:
    """Before a load hashes a fully planned target's library: its entry's identity, for ``verified``."""
    return recall.entry_before_hash(target)


def verified(target: Target, so: Path, before: Optional[List[int]]) -> None:
    """After a load found the library's sha256 matching: the record keeps its identity, so the next process need
    not hash it again."""
    recall.stamp_verified(target, so, before)
