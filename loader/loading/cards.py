"""``load(name)``: a card on the kernel search path (or a path to a card's source) as a :class:`Library`."""
from __future__ import annotations

from typing import Any, Dict, Optional

from ..jit import plan, syntax
from ..jit.cards import Card, find
from ..jit.distributed import joining
from . import arguments
from .opening import open_library

_REGISTRATION = ["PYBIND11_MODULE", "TORCH_LIBRARY"]


def load(name, args: Dict[str, Any], make_current: bool = True):
    """``make_current=False``: a build that serves some calls only (autotune's winner for a shape bucket)."""
    arguments.only_for_extensions(args, str(name), "sources=[...]")
    group, do_load = args.get("group"), arguments.option(args, "load", True)
    flags = arguments.build_flags(args)
    options = {k: args.get(k) for k in ("kernels_dir", "arch", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                                        "extra_include_paths")}
    with joining(group, str(name)):
        card = find(name, args.get("kernels_dir"))
        target = _plan(card, args.get("arch"), flags)
    nvrtc = _card_kernels(card, args.get("arch"), flags["extra_include_paths"], do_load, group)
    return open_library(target, card, {**options, "name": str(name)}, do_load, group, nvrtc, make_current)


def _plan(card: Card, arch, flags):
    """A card, or a file written for torch's loader given as a card (``load("my_ext.cu")``): one that defines
    its own PYBIND11_MODULE or TORCH_LIBRARY and has no card header is built the torch way."""
    blocks = [] if card.header() is not None or card.spec is not None else _registrations(card)
    if blocks:
        python_module = any(b.macro == "PYBIND11_MODULE" for b in blocks)
        return plan.plan_extension(card.name, card.sources(), arch=arch, is_python_module=python_module, **flags)
    return plan.plan_card(card, arch, flags["extra_cflags"], flags["extra_cuda_cflags"], flags["extra_ldflags"],
                          flags["extra_include_paths"])


def _registrations(card: Card):
    return [b for s in card.sources() if s.is_file()
            for b in syntax.macro_blocks(s.read_text(errors="replace"), _REGISTRATION)]


def _card_kernels(card: Card, arch, include_paths, do_load: bool, group) -> Optional[object]:
    """The card's ``nvrtc_sources`` compiled (and loaded, with a GPU) through the instant-kernel path; None
    when it has none (the instant machinery is then not imported)."""
    if not card.nvrtc_sources():
        return None
    from ..instant import card_kernels

    return card_kernels.obtain(card, arch, include_paths, compile_only=not do_load, group=group)
