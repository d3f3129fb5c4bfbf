"""Compile once per job (docs/distributed.md): ``load``/``load_inline``/``load_kernels`` take ``group=``; here
are the helpers around it. The ranks of a job trust each other: a rank that receives a build checks it
against the sha256 the sending rank announces for the key it computed itself, which catches a damaged
transfer or different sources, not a malicious rank (objects travel pickled between ranks anyway)."""
from __future__ import annotations

from .jit.distributed import STATS, check_group, node_group
from .loading import load

__all__ = ["STATS", "check_group", "node_group", "prepare"]


def prepare(*cards: str, group=None, kernels_dir=None, arch=None) -> list:
    """Load ``cards`` on every rank of ``group`` (default: the whole job) with one build each, before code
    calls them through ``kernelkit.ops``, which then finds them loaded. Collective: every rank calls it with
    the same cards in the same order. Returns the Library of each."""
    if not cards or not all(isinstance(c, str) for c in cards):
        raise TypeError(f"prepare: expected card names, got {cards!r}")
    group = check_group(group)
    return [load(c, kernels_dir=kernels_dir, arch=arch, group=group) for c in cards]
