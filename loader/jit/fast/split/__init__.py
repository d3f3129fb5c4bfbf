"""The automatic split of a torch-style ``.cu`` (kernels, a ``torch::Tensor`` wrapper and bindings in one file
that includes torch's headers) into a host TU for g++ and a torch-free device TU for nvcc, so that an edit of
a kernel body recompiles about a second of CUDA instead of three front ends' passes over torch's headers.

Both TUs are the file as written less what the other side owns (``device``, ``host``), so the preprocessor and
name-lookup state at each line either keeps is the file's own; what is left to differ (torch's heavy headers,
which the device TU does without) is what the proof compares (``jit.split_proof``). What the split cannot
take apart soundly is returned as ``Unsplittable(reason, line)`` and the caller builds the file as written.

Host code under g++ rather than nvcc's host pass: nvcc compiles host code with the same g++ after cudafe++,
but its preprocessing defines ``__CUDACC__``, ``__NVCC__``, ``__CUDACC_VER_*__`` and ``__CUDA_ARCH_LIST__``
and force-includes ``cuda_runtime.h``. The host TU includes ``cuda_runtime.h`` (and what torch's headers
include only under nvcc) and refuses any file whose own code tests one of those macros. In torch 2.11's headers
the ``__CUDACC__``/``__NVCC__`` branches change no host behaviour: they add ``__host__ __device__`` to
``C10_HOST_DEVICE`` functions (the host definition is the same), include ``cuda_fp16.h``/``cuda_bf16.h`` for the
``__half``/``__nv_bfloat16`` conversions of ``c10::Half``/``BFloat16``, pick an equivalent ``string_view``
comparison, hide ``TypeIdentifier::Get`` from nvcc so the host compiler computes it (as g++ does here), make a
pybind11 ``vectorize_helper`` member public, drop a ``[[maybe_unused]]`` and select glog's CUDA-safe logging
macros' definitions; the ``C10_NVCC`` value only feeds a size check. Struct layouts (``TensorAccessor``,
``Half``) do not depend on them, so a kernel's arguments mean the same in both TUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, FrozenSet, NamedTuple, Optional, Sequence, Tuple, Union

from . import tree as ts
from .device import PRELUDE_BY_NAME, PRELUDE_FILE, PRELUDE_MARK, device_lines, device_names, frame_text, prelude_text
from .errors import Refuse
from .flags import host_flags
from .host import HostTU, host_text
from .instantiate import InstantiationError, headers_for, instantiations, wanted
from .layout import marked
from .model import Item, build
from .source import Flat, LocalHeader, flatten, local_headers, sibling_headers

__all__ = ["Split", "Unsplittable", "split_source", "device_text", "host_flags", "local_headers",
           "InstantiationError", "qualified", "full_prelude"]


@dataclass(frozen=True)
class Split:
    host: HostTU  # C++ for g++: cuda_runtime.h first, #line marks citing the user's file
    device: str  # CUDA for nvcc without torch's umbrella headers, #line marks likewise
    kernels: Tuple[str, ...]  # qualified names of the kernels
    #: qualified name -> (path, line) of each kernel template: device_text() instantiates what the host calls
    templates: Dict[str, Tuple[str, int]] = field(default_factory=dict, compare=False, hash=False)
    #: qualified names of what the host TU declares and the device TU's object defines (kernels' host stubs,
    #: device variables' shadows)
    entities: FrozenSet[str] = frozenset()
    headers: Tuple[str, ...] = ()  # the local headers written into both TUs
    frame: str = ""  # the device TU without its device code (``device.frame_text``): what a proof covers
    names: FrozenSet[str] = frozenset()  # the names device code uses but does not declare (``device.device_names``)
    torch_includes: Tuple[str, ...] = ()  # the file's includes of torch's headers, as written, in order
    #: the device TU with every light header in its prelude: what is compiled when ``device`` lacks a declaration
    device_whole: str = ""
    #: (file name, line) of each line of code the device TU keeps: the host TU's g++ (no ``__CUDACC__``) is no
    #: judge of those, nvcc is
    device_kept: FrozenSet[Tuple[str, int]] = frozenset()

    @property
    def templated(self) -> bool:
        return bool(self.templates)


class Unsplittable(NamedTuple):
    reason: str  # e.g. "a __device__ lambda"
    line: int  # 1-based line of the original file that made the decision (0 if none)


def split_source(text: str, path: str, local_header: LocalHeader = sibling_headers,
                 heavy_include: Callable[[str], bool] = lambda _name: True,
                 first_line: int = 1) -> Union[Split, Unsplittable]:
    """Split ``text`` (the file at ``path``) or say why not. ``local_header(name_as_written, including_file)``
    gives (resolved path, text) for a local header (``name`` keeps its quotes or angle brackets), else None;
    ``heavy_include(name_as_written)`` says whether an include of torch's is one the device TU's prelude
    stands in for (else it is kept as written); ``first_line``: the number ``path`` gives the text's first line
    (a generated source may start with lines kernelkit wrote before the user's line 1)."""
    flat: Optional[Flat] = None
    try:
        flat = flatten(text, path, local_header, first_line)
        model = build(ts.mask(flat.text), path)
        if not model.kernels:
            return Unsplittable("no kernel defined in the file", 0)
        host = host_text(model, flat)
        lines = device_lines(model, flat, heavy_include)
        device = marked(lines)
        device_whole = marked(device_lines(model, flat, heavy_include, whole_prelude=True))
        frame = frame_text(model, flat, heavy_include)
        _verify(host.text)
    except Refuse as e:
        return _located(e, flat, path)
    templates = {qualified(it): flat.where(it.line0) for items in model.kernels.values() for it in items
                 if it.tparams is not None}
    entities = frozenset(qualified(it) for items in model.kernels.values() for it in items) | frozenset(
        qualified(it, n) for it in model.items if it.kind == "device_var" and it.host_used for n in it.names)
    return Split(host, device, tuple(sorted({qualified(i) for v in model.kernels.values() for i in v})), templates,
                 entities, tuple(flat.headers), frame, frozenset(device_names(model)),
                 tuple(model.text(it.node.child_by_field_name("path")) for it in model.items
                       if it.kind == "torch_include"), device_whole,
                 frozenset((Path(where).name, line) for text, (where, line) in lines
                           if text.strip() and where != PRELUDE_FILE))


def qualified(it: Item, name: str = "") -> str:
    return "::".join([s.name for s in it.scope if s.name] + [name or it.names[0]])


def _located(e: Refuse, flat: Optional[Flat], path: str) -> Unsplittable:
    """Lines found in the flat text are reported in the user's file; a header's own line is named in words."""
    if flat is None or e.line <= 0 or not flat.origin:
        return Unsplittable(e.reason, max(e.line, 0) if flat is None else 0)
    where, line = flat.where(e.line - 1)
    if where == path:
        return Unsplittable(e.reason, line)
    return Unsplittable(f"{e.reason} (in {Path(where).name}, line {line})", 0)


def _verify(host: str) -> None:
    """The host TU must hold no device code: a launch or a kernel body left there means the split misread it (what
    ``#if 0`` holds is never compiled, and is read as blanks)."""
    src = host.encode("utf-8", "surrogateescape")
    tree = ts.parse(ts.blank(src, ts.never_compiled(src)).decode("utf-8", "surrogateescape"))
    for n in ts.walk(tree.root_node):
        if n.type == "kernel_call_syntax":
            raise Refuse("device code the split could not move out of host code", ts.line(n))


def device_text(split: Split, host_undefined: Sequence[Tuple[str, str, str]], whole_prelude: bool = False) -> str:
    """The device TU with an instantiation of every kernel template specialisation the host object calls
    (``host_undefined``: its undefined symbols as ``instantiate.symbols`` gives them). Raises
    InstantiationError when one cannot be written without torch (the caller builds the file as written)."""
    device = split.device_whole if whole_prelude else split.device
    if not split.templated:
        return device
    specs = wanted(host_undefined, split.templates)
    extra = headers_for(specs)
    if extra:
        mark = device.find(PRELUDE_MARK)
        at = device.find("\n", mark) + 1 if mark >= 0 else 0
        device = device[:at] + "".join(f"#include <{h}>\n" for h in extra) + device[at:]
    return device + instantiations(specs)



def full_prelude() -> str:
    """The prelude with every light header it may hold: what the split's device TU can declare at most."""
    return prelude_text({name for _, names in PRELUDE_BY_NAME for name in names})
