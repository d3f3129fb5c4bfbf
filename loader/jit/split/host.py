"""The host TU: the file for g++, with device code taken out (line count kept, so diagnostics and
``__LINE__`` keep citing the user's lines), every ``<<<>>>`` launch turned into a call of the kernel's
launcher, and each kernel definition replaced by that launcher's declaration in the same place."""
from __future__ import annotations

from typing import List, NamedTuple, Tuple

from . import tree as ts
from .errors import Refuse
from .model import TORCH_INCLUDES, Model, anon_opener, leading_start
from .params import host_declaration, signature, variable_reference
from .source import Flat

Edit = Tuple[int, int, str]
_BLANK = ("__host__", "__device__")


class HostTU(NamedTuple):
    text: str  # the whole TU
    #: the prefix and the file's leading ``#include <...>`` lines when they include torch, else ""; then
    #: ``#include <preamble>`` + ``rest`` is the same token stream as ``text`` (``rest`` keeps the line marks).
    #: Many files start with the same includes, so the preamble is worth precompiling (``build._pch_plan``).
    preamble: str = ""
    rest: str = ""


def host_text(model: Model, flat: Flat) -> HostTU:
    edits: List[Edit] = []
    for it in model.items:
        if it.kind in ("kernel", "kernel_decl"):
            decl = host_declaration(model, it, signature(model, it))
            edits.append(_replace(model, it.start, it.end, decl))
        elif it.kind == "device_fn":
            edits.append(_replace(model, it.start, it.end, ""))
        elif it.kind == "device_var":
            edits.append(_replace(model, it.start, it.end, _host_variable(model, it)))
        elif it.kind == "macro" and it.names[0] in model.masked.macros:
            edits += _blank_tokens_in_macro(model, it)
        elif it.kind in ("hd_fn", "decl", "other", "using", "host_fn"):
            edits += _strip_members(model, it.node)
    for ns in model.anon_namespaces:
        body = ns.child_by_field_name("body")
        edits.append((ns.start_byte, body.start_byte + 1, anon_opener(model)))
    edits += _launch_edits(model)
    text = _apply(model.src, edits)
    whole = _with_lines(text, flat, prefix=_prefix(model))
    includes, rest_line0 = _leading_includes(model)
    if not any(p[1:-1].startswith(TORCH_INCLUDES) for p in includes):
        return HostTU(whole)
    preamble = _prefix(model) + "".join(f"#include {p}\n" for p in includes)
    return HostTU(whole, preamble, _with_lines(text, flat, prefix="", start=rest_line0))


def _leading_includes(model: Model) -> Tuple[List[str], int]:
    """The ``<...>`` paths the file includes before anything but comments (a #define or #if before or between
    them would change what they mean), and the 0-based line after the last. No edit touches those lines."""
    includes, rest_line0 = [], 0
    for c in model.masked.tree.root_node.children:
        if c.type == "comment":
            continue
        path = c.child_by_field_name("path") if c.type == "preproc_include" else None
        if path is None or path.type != "system_lib_string":
            break
        includes.append(model.text(path))
        rest_line0 = model.src.count(b"\n", 0, c.end_byte) + (not model.src[:c.end_byte].endswith(b"\n"))
    return includes, rest_line0


#: cuda_runtime.h's C++ overloads taking a device variable by reference exist only under nvcc; without them
#: g++ would pass a pointer variable's value (not its address) to the C API. The same templates, for g++.
SYMBOL_API = """template <class T> static inline cudaError_t cudaMemcpyToSymbol(const T& symbol, const void* src, \
size_t count, size_t offset = 0, enum cudaMemcpyKind kind = cudaMemcpyHostToDevice) { \
return ::cudaMemcpyToSymbol((const void*)&symbol, src, count, offset, kind); }
template <class T> static inline cudaError_t cudaMemcpyToSymbolAsync(const T& symbol, const void* src, \
size_t count, size_t offset = 0, enum cudaMemcpyKind kind = cudaMemcpyHostToDevice, cudaStream_t stream = 0) { \
return ::cudaMemcpyToSymbolAsync((const void*)&symbol, src, count, offset, kind, stream); }
template <class T> static inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t count, \
size_t offset = 0, enum cudaMemcpyKind kind = cudaMemcpyDeviceToHost) { \
return ::cudaMemcpyFromSymbol(dst, (const void*)&symbol, count, offset, kind); }
template <class T> static inline cudaError_t cudaMemcpyFromSymbolAsync(void* dst, const T& symbol, size_t count, \
size_t offset = 0, enum cudaMemcpyKind kind = cudaMemcpyDeviceToHost, cudaStream_t stream = 0) { \
return ::cudaMemcpyFromSymbolAsync(dst, (const void*)&symbol, count, offset, kind, stream); }
template <class T> static inline cudaError_t cudaGetSymbolAddress(void** devPtr, const T& symbol) { \
return ::cudaGetSymbolAddress(devPtr, (const void*)&symbol); }
template <class T> static inline cudaError_t cudaGetSymbolSize(size_t* size, const T& symbol) { \
return ::cudaGetSymbolSize(size, (const void*)&symbol); }
"""


#: torch 2.11 declares RestrictPtrTraits only under nvcc (torch/headeronly/core/TensorAccessor.h); host code
#: naming it (``packed_accessor32<float, 2, torch::RestrictPtrTraits>()``) gets the same template here
RESTRICT_PTR_TRAITS = """namespace torch { namespace headeronly { template <typename T> struct RestrictPtrTraits { \
typedef T* __restrict__ PtrType; }; } }
namespace at { using torch::headeronly::RestrictPtrTraits; }
"""


def _prefix(model: Model) -> str:
    # what nvcc adds before the file (-include cuda_runtime.h), and cuda.h, which torch's Dispatch.h includes
    # only under nvcc: code testing CUDA_VERSION sees what it saw there
    return "#include <cuda_runtime.h>\n" + ("#include <cuda.h>\n" if model.torch_includes else "") + SYMBOL_API + \
        (RESTRICT_PTR_TRAITS if b"RestrictPtrTraits" in model.src else "")


def _replace(model: Model, start: int, end: int, text: str) -> Edit:
    """Replace src[start:end] by ``text`` padded to the same number of lines."""
    lines = model.src[start:end].count(b"\n")
    if text.count("\n") > lines:
        text = " ".join(text.split("\n"))
    return start, end, text + "\n" * (lines - text.count("\n"))


def _host_variable(model: Model, var) -> str:
    """Device variables host code names (``cudaMemcpyToSymbol(c, ...)``) become references to the host shadow
    nvcc emits for them in the device TU, so the runtime is handed the very address it registered."""
    refs = [variable_reference(model, var, n, variable_symbol(model, var, n), None) for n in var.names
            if var.host_used]
    return " ".join(refs)


def variable_symbol(model: Model, var, name: str) -> str:
    """Named by the variable's scope and name, not its position: a kernel edit above it keeps the host TU."""
    import hashlib

    where = hashlib.sha256("\0".join([s.opener for s in var.scope] + [name]).encode()).hexdigest()[:8]
    return f"kk_var_{model.tag}_{where}_{name}"


def _blank_tokens_in_macro(model: Model, it) -> List[Edit]:
    value = it.node.child_by_field_name("value")
    body = model.text(value)
    for q in _BLANK + ("__global__",):
        body = body.replace(q, " " * len(q))
    return [(value.start_byte, value.end_byte, body)]


def _strip_members(model: Model, node) -> List[Edit]:
    """In host code: __host__/__device__ tokens blanked (g++ would warn about them), and the bodies of
    device-only member functions dropped (g++ cannot compile device intrinsics; nvcc never ran them on the host)."""
    edits: List[Edit] = []
    skip_until = -1
    for n in ts.walk(node):
        if n.start_byte < skip_until:
            continue
        if n.type in _BLANK:
            edits.append((n.start_byte, n.end_byte, " " * (n.end_byte - n.start_byte)))
        elif n.type == "function_definition" and n != node and _device_only(model, n):
            body = n.child_by_field_name("body")
            for k in n.children:
                if k.type in _BLANK:
                    edits.append((k.start_byte, k.end_byte, " " * (k.end_byte - k.start_byte)))
            edits.append(_replace(model, body.start_byte, n.end_byte, ";"))
            skip_until = n.end_byte
    return edits


def _device_only(model: Model, fn) -> bool:
    types = {k.type for k in fn.children}
    quals = set(types) | set(model.masked.qualifiers_in(leading_start(model, fn),
                                                        fn.child_by_field_name("declarator").start_byte))
    if "__global__" in quals:
        raise Refuse("a __global__ function inside a class", ts.line(fn))
    return "__device__" in quals and "__host__" not in quals


def _launch_edits(model: Model) -> List[Edit]:
    edits = []
    for launch in model.launches:
        call = launch.call
        config = next(k for k in call.children if k.type == "kernel_call_syntax")
        args = call.child_by_field_name("arguments")
        exprs = [k for k in config.named_children if k.type != "comment"]
        if not 2 <= len(exprs) <= 4:
            raise Refuse("a launch configuration without 2 to 4 values", ts.line(config))
        inner = model.src[config.children[0].end_byte:config.children[-1].start_byte].decode("utf-8", "surrogateescape")
        has_args = any(k.type not in ("(", ")", "comment") for k in args.children)
        gap = model.src[config.end_byte:args.start_byte].count(b"\n")
        text = "(" + inner + ", 0" * (4 - len(exprs)) + (", " if has_args else "") + "\n" * gap
        edits.append((launch.callee.start_byte, launch.callee.end_byte, model.launcher(launch.kernel)))
        edits.append((config.start_byte, args.start_byte + 1, text))
    return edits


def _apply(src: bytes, edits: List[Edit]) -> str:
    out, pos = [], 0
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < pos:
            raise Refuse("overlapping rewrites (the split could not place a launch or definition)", 0)
        out += [src[pos:start], text.encode("utf-8", "surrogateescape")]
        pos = end
    out.append(src[pos:])
    return b"".join(out).decode("utf-8", "surrogateescape")


def line_mark(path: str, line: int) -> str:
    return f'#line {line} "{quote(path)}"\n'


def quote(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')


def _with_lines(text: str, flat: Flat, prefix: str, start: int = 0) -> str:
    """``text`` (line for line the flat file) from its line ``start`` on, with a ``#line`` mark wherever the
    origin jumps."""
    out = [prefix]
    prev = None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, ln in enumerate(lines[start:], start):
        where = flat.where(i)
        if prev is None or where != (prev[0], prev[1] + 1):
            out.append(line_mark(*where))
        out.append(ln + "\n")
        prev = where
    return "".join(out)
