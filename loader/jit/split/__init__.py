"""The automatic split of a torch-style ``.cu`` (kernels, a ``torch::Tensor`` wrapper and bindings in one file
that includes torch's headers) into a host TU for g++ and a torch-free device TU for nvcc, so that an edit of
a kernel body recompiles about a second of CUDA instead of three front ends' passes over torch's headers.

A split must build exactly what nvcc builds from the file as written; anything the split cannot prove is
returned as ``Unsplittable(reason, line)`` and the caller builds the file as written.

Host code under g++ rather than nvcc's host pass: nvcc compiles host code with the same g++ after cudafe++,
but its preprocessing defines ``__CUDACC__``, ``__NVCC__``, ``__CUDACC_VER_*__`` and ``__CUDA_ARCH_LIST__``
and force-includes ``cuda_runtime.h``. The host TU includes ``cuda_runtime.h`` (and ``cuda.h``, which torch's
``ATen/Dispatch.h`` includes only under nvcc) and refuses any file whose own code tests one of those macros.
In torch 2.11's headers the ``__CUDACC__``/``__NVCC__`` branches change no host behaviour: they add
``__host__ __device__`` to ``C10_HOST_DEVICE`` functions (the host definition is the same), include
``cuda_fp16.h``/``cuda_bf16.h`` for the ``__half``/``__nv_bfloat16`` conversions of ``c10::Half``/``BFloat16``
(host code that uses them fails to compile under g++ rather than changing meaning), pick an equivalent
``string_view`` comparison, hide ``TypeIdentifier::Get`` from nvcc so the host compiler computes it (as g++
does here), make a pybind11 ``vectorize_helper`` member public, drop a ``[[maybe_unused]]`` and
select glog's CUDA-safe logging macros' definitions; the ``C10_NVCC`` value only feeds a size check. Struct
layouts (``TensorAccessor``, ``Half``) do not depend on them, so a launcher's arguments mean the same in both TUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, NamedTuple, Optional, Tuple, Union

from . import tree as ts
from .device import PRELUDE_MARK, device_tu
from .errors import Refuse
from .flags import host_flags
from .host import host_text
from .instantiate import InstantiationError, headers_for, instantiations, undefined_symbols, wanted
from .model import build
from .source import Flat, LocalHeader, flatten, local_headers, sibling_headers

__all__ = ["Split", "Unsplittable", "split_source", "device_text", "host_flags", "local_headers",
           "InstantiationError"]


@dataclass(frozen=True)
class Split:
    host: str  # C++ for g++: cuda_runtime.h first, #line marks citing the user's file
    device: str  # CUDA for nvcc without torch, #line marks likewise
    templated: bool  # launchers are templates: device_text() instantiates what the host object calls
    kernels: Tuple[str, ...]  # the kernels moved
    #: launcher name -> (is a template, path, line of the kernel) for device_text()
    launchers: Dict[str, Tuple[bool, str, int]] = field(default_factory=dict, compare=False, hash=False)
    #: the host TU's leading part (its prefix and the file's leading torch includes) and what follows it:
    #: ``#include <preamble>`` + ``host_rest`` compiles as ``host`` does ("" and "" where there is none)
    preamble: str = ""
    host_rest: str = ""


class Unsplittable(NamedTuple):
    reason: str  # e.g. "a __device__ lambda"
    line: int  # 1-based line of the original file that made the decision (0 if none)


def split_source(text: str, path: str, local_header: LocalHeader = sibling_headers) -> Union[Split, Unsplittable]:
    """Split ``text`` (the file at ``path``) or say why not. ``local_header(name_as_written, including_file)``
    gives (resolved path, text) for a local header (``name`` keeps its quotes or angle brackets), else None."""
    flat: Optional[Flat] = None
    try:
        flat = flatten(text, path, local_header)
        model = build(ts.mask(flat.text), path)
        if not model.kernels:
            return Unsplittable("no kernel defined in the file", 0)
        host = host_text(model, flat)
        device = device_tu(model, flat)
        _verify(host.text)
    except Refuse as e:
        return _located(e, flat, path)
    launchers = {model.launcher(k): (it.tparams is not None, *flat.where(it.line0)) for k, it in model.kernels.items()}
    return Split(host.text, device, any(t for t, _, _ in launchers.values()), tuple(model.kernels), launchers,
                 host.preamble, host.rest)


def _located(e: Refuse, flat: Optional[Flat], path: str) -> Unsplittable:
    """Lines found in the flat text are reported in the user's file; a header's own line is named in words."""
    if flat is None or e.line <= 0 or not flat.origin:
        return Unsplittable(e.reason, max(e.line, 0) if flat is None else 0)
    where, line = flat.where(e.line - 1)
    if where == path:
        return Unsplittable(e.reason, line)
    return Unsplittable(f"{e.reason} (in {Path(where).name}, line {line})", 0)


def _verify(host: str) -> None:
    """The host TU must hold no device code: a launch or __global__ left there means the split misread the file."""
    tree = ts.parse(host)
    for n in ts.walk(tree.root_node):
        if n.type in ("kernel_call_syntax", "__global__"):
            raise Refuse("device code the split could not move out of host code", ts.line(n))


def device_text(split: Split, host_object: Path) -> str:
    """The device TU with an instantiation of every template launcher specialisation ``host_object`` calls.
    Raises InstantiationError when one cannot be written without torch (the caller builds the file as written)."""
    if not split.templated:
        return split.device
    specs = wanted(undefined_symbols(Path(host_object)), split.launchers)
    extra = headers_for([a for _, a in specs])
    device = split.device
    if extra:
        mark = device.find(PRELUDE_MARK)
        at = device.find("\n", mark) + 1 if mark >= 0 else 0
        device = device[:at] + "".join(f"#include <{h}>\n" for h in extra) + device[at:]
    return device + instantiations(specs, split.launchers)
