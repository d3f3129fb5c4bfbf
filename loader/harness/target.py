"""What to check, bench or run: a card name, a :class:`Spec` or a callable, resolved to (spec, op, device).

``kernelkit.check``, ``kernelkit.bench``, ``kernelkit run`` and the ``kernelkit`` command all resolve their
target here, so a card found through ``kernels_dir=`` (or ``KERNELKIT_PATH``) gets exactly what a
built-in one gets.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from ..errors import KernelkitError
from .spec import Spec


@dataclasses.dataclass
class Resolved:
    spec: Optional[Spec]  # None for a bare callable
    op: Callable[..., Any]
    device: torch.device
    lib: Any = None  # the card's loaded kernelkit.Library, when a card was loaded


def default_device(spec: Optional[Spec]) -> Optional[str]:
    """CUDA when there is a GPU and the card implements it, else the CPU when it does; None when neither."""
    devices = spec.devices if spec is not None else ("cuda", "cpu")
    if torch.cuda.is_available() and "cuda" in devices:
        return "cuda"
    return "cpu" if "cpu" in devices else None


def card_op(spec: Spec, lib: Any = None) -> Callable[..., Any]:
    """The public op of a card: ``spec.op`` when set; else, for a built-in card, ``kernelkit.ops.<name>``;
    else (a card outside kernelkit, or one loaded from another directory) its library's op ``lib.<name>``."""
    if spec.op is not None:
        return spec.op
    from .. import ops
    from ..jit.cards import builtin_dir

    builtin = lib is None or getattr(lib, "card", None) is None or lib.card.dir == builtin_dir()
    if builtin and hasattr(ops, spec.name):
        return getattr(ops, spec.name)
    if lib is None:
        from .. import loading

        lib = loading.load(spec.name)
    return getattr(lib, spec.name)


def load(name: str, kernels_dir: Any = None, **load_kw) -> Any:
    """Build/load the card ``name`` (searched in ``kernels_dir``, else KERNELKIT_PATH + built-in); it must
    have a spec."""
    from .. import loading

    lib = loading.load(name, kernels_dir=kernels_dir, **load_kw)
    if lib.spec is None:
        raise KernelkitError(f"card {name!r} has no spec ({name}.py defining SPEC): nothing to check or time")
    return lib


def resolve(target: Any, *, spec: Optional[Spec] = None, kernels_dir: Any = None, device: Any = None,
            lib: Any = None) -> Resolved:
    """(spec, op, device, lib) for ``target``: a card name (built/loaded from ``kernels_dir``), a
    :class:`Spec` (its op: :func:`card_op`), or a callable (``spec`` describes it, when given). ``lib`` is
    the card's library when the caller loaded it already. ``device`` defaults to :func:`default_device`."""
    if isinstance(target, str):
        lib = lib or load(target, kernels_dir)
        spec = spec or lib.spec
        op = card_op(spec, lib)
    elif isinstance(target, Spec):
        spec = target
        if lib is None and spec.op is None and kernels_dir is not None:
            lib = load(spec.name, kernels_dir)
        op = card_op(spec, lib)
    elif callable(target):
        op = target
    else:
        raise TypeError(f"expected a card name, a kernelkit.Spec or a callable op, got {type(target).__name__}")
    if device is None:
        device = default_device(spec)
        if device is None:
            raise KernelkitError(f"{spec.name}: implemented for {list(spec.devices)} only, and no CUDA GPU is "
                                 "available")
    return Resolved(spec, op, torch.device(device), lib)
