"""What a strict worker does around each call of the op: inputs it has never seen, and evidence of tricks.

- :func:`place`: every tensor argument copied into a new allocation at a random 256-byte-aligned offset, so
  neither a pointer nor a tensor object repeats from an earlier call (unless a probe asks for it).
- :func:`perturb`: a few elements changed, the same way in the worker and the parent (a cache keyed on a
  sample of the input's elements then replays a stale result).
- :class:`Tamper`: the identity of the functions a checker and a timer rely on (clocks, CUDA events and
  synchronisation, torch's comparisons, kernelkit's harness) and the precision flags (TF32), taken before the
  op is imported; any later difference names what the op replaced.
- :func:`aliases`: outputs that share memory with an input.
- :func:`reset_persisting_l2` / :func:`persisting_l2_state`: the persisting L2 lines and limit, and the current
  stream's access-policy window, through CUDA's runtime (cuda-python), so a pinned working set does not
  survive the flush between timed calls.
"""
from __future__ import annotations

import importlib
import random
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

import torch

ALIGN_BYTES = 256
OFFSETS = 64  # distinct aligned offsets a relocated tensor may land at
PERTURBED = 3  # elements changed per tensor by a perturbation probe

_RNG = random.Random()  # seeded by the OS: an op cannot predict where its inputs land


def place(args: tuple) -> tuple:
    """``args`` with every tensor copied into a fresh allocation at a random aligned offset."""
    return tuple(_relocated(a) if isinstance(a, torch.Tensor) else a for a in args)


def _relocated(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous() or t.numel() == 0:
        return t.clone()
    step = max(1, ALIGN_BYTES // t.element_size())
    pad = step * _RNG.randrange(OFFSETS)
    buf = torch.empty(t.numel() + pad, dtype=t.dtype, device=t.device)
    view = buf[pad:].view(t.shape)
    view.copy_(t)
    return view.requires_grad_(t.requires_grad) if t.is_floating_point() else view


def perturb(args: tuple, seed: int) -> tuple:
    """``args`` (changed in place) with PERTURBED elements of each contiguous numeric tensor moved by one."""
    gen = torch.Generator().manual_seed(seed)
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_contiguous() and a.numel() and a.dtype != torch.bool:
            pos = torch.randint(a.numel(), (PERTURBED,), generator=gen).unique().to(a.device)
            flat = a.detach().view(-1)
            flat[pos] = flat[pos] + 1
    return args


def aliases(outputs: Sequence, args: tuple) -> List[str]:
    """"output k shares memory with input i" for each such pair (an op must return new memory)."""
    spans = {i: _span(a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel()}
    found = []
    for k, o in enumerate(outputs):
        if isinstance(o, torch.Tensor) and o.numel():
            lo, hi = _span(o)
            found += [f"output {k} shares memory with input {i}" for i, (a_lo, a_hi) in spans.items()
                      if lo < a_hi and a_lo < hi]
    return found


def _span(t: torch.Tensor):
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def live_threads() -> set:
    return set(threading.enumerate())


def wait_for(before: set, timeout_s: float) -> None:
    """Wait (up to ``timeout_s`` in all) for the threads started since ``before`` to finish."""
    deadline = time.monotonic() + timeout_s
    for t in set(threading.enumerate()) - before:
        t.join(max(0.0, deadline - time.monotonic()))


# ------------------------------------------------------------------------------------------------ tamper

#: (module, attribute holding a namespace or None for the module itself) whose callables are watched
WATCHED = [("time", None), ("torch", None), ("torch", "Tensor"), ("torch._C", "TensorBase"), ("torch.cuda", None), ("torch.cuda", "Event"),
           ("torch.cuda", "Stream"), ("torch.nn.functional", None), ("torch.testing", None), ("builtins", None),
           ("kernelkit.harness.compare", None), ("kernelkit.harness.check", None),
           ("kernelkit.harness.timing", None), ("kernelkit.harness.strict.guards", None),
           ("kernelkit.harness.strict.channel", None), ("kernelkit.harness.strict.worker", None)]


def _flags() -> Dict[str, object]:
    """The precision switches a reference's accuracy depends on."""
    return {"torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
            "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}


class Tamper:
    """A snapshot of the watched functions' identities and the precision flags; :meth:`changes` names what
    differs now (new names, such as a lazily imported submodule, are not changes)."""

    def __init__(self):
        self.ids = _identities()
        self.flags = _flags()

    def changes(self) -> List[str]:
        now = _identities()
        changed = [name for name, ident in self.ids.items() if now.get(name, ident) != ident]
        flags = _flags()
        changed += [f"{name} ({self.flags[name]!r} -> {flags[name]!r})" for name in self.flags
                    if flags[name] != self.flags[name]]
        return changed


def _identities() -> Dict[str, int]:
    out: Dict[str, int] = {}
    for module_name, attr in WATCHED:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        space = getattr(module, attr, None) if attr else module
        prefix = f"{module_name}.{attr}" if attr else module_name
        for name, value in list(vars(space).items()):
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                out[f"{prefix}.{name}"] = id(value)
    return out


#: modules whose import legitimately rewraps a watched function (torch._dynamo wraps torch.manual_seed): imported
#: before the snapshot, so an op that uses torch.compile is not taken for one that patches torch
REWRAPPING = ("torch._dynamo",)


def import_watched() -> None:
    """Import the watched modules (and those that rewrap them), so the snapshot holds them before the op can
    touch them."""
    for module_name in [m for m, _ in WATCHED] + list(REWRAPPING):
        importlib.import_module(module_name)


# ------------------------------------------------------------------------------------------- persisting L2

def _runtime():
    try:
        from cuda.bindings import runtime
    except ImportError:  # pragma: no cover - cuda-python comes with torch's CUDA 13 wheels
        return None
    return runtime


def reset_persisting_l2(stream: Optional[torch.cuda.Stream] = None) -> Optional[str]:
    """Demote every persisting L2 line, set the persisting limit to 0 and clear the stream's access-policy
    window; returns why it could not (None when done)."""
    rt = _runtime()
    if rt is None:
        return "cuda-python is not installed: persisting L2 lines are not reset"
    stream = stream or torch.cuda.current_stream()
    errors = [rt.cudaCtxResetPersistingL2Cache()[0],
              rt.cudaDeviceSetLimit(rt.cudaLimit.cudaLimitPersistingL2CacheSize, 0)[0]]
    value = rt.cudaStreamAttrValue()
    value.accessPolicyWindow.num_bytes = 0
    value.accessPolicyWindow.hitRatio = 0.0
    window = rt.cudaStreamAttrID.cudaLaunchAttributeAccessPolicyWindow
    errors.append(rt.cudaStreamSetAttribute(stream.cuda_stream, window, value)[0])
    bad = [e for e in errors if e != rt.cudaError_t.cudaSuccess]
    return f"resetting persisting L2 failed: {bad[0]!r}" if bad else None


def persisting_l2_limit() -> int:
    """The device's persisting L2 limit now (0 where it cannot be read)."""
    rt = _runtime()
    if rt is None:
        return 0
    err, limit = rt.cudaDeviceGetLimit(rt.cudaLimit.cudaLimitPersistingL2CacheSize)
    return limit if err == rt.cudaError_t.cudaSuccess else 0


def persisting_l2_state(stream: Optional[torch.cuda.Stream] = None, limit_before: int = 0) -> Optional[str]:
    """What the op left set: a persisting L2 limit above ``limit_before`` (the limit is the device's: another
    process on the GPU may have set one already) or an access-policy window on the current stream (None if
    neither, or if it cannot be read)."""
    rt = _runtime()
    if rt is None:
        return None
    stream = stream or torch.cuda.current_stream()
    found = []
    limit = persisting_l2_limit()
    if limit > limit_before:
        found.append(f"a persisting L2 limit of {limit} bytes")
    window = rt.cudaStreamAttrID.cudaLaunchAttributeAccessPolicyWindow
    err, value = rt.cudaStreamGetAttribute(stream.cuda_stream, window)
    if err == rt.cudaError_t.cudaSuccess and value.accessPolicyWindow.num_bytes:
        found.append(f"an access-policy window of {value.accessPolicyWindow.num_bytes} bytes on the current stream")
    return " and ".join(found) or None
