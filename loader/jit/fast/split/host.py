"""The host TU: the file for g++ with the device code taken out, as nvcc's host pass sees it. Kernels stay as
declarations of the functions nvcc makes of them (their host-side stubs, which the device TU's object defines),
a ``<<<>>>`` launch becomes what nvcc makes of it (the configuration pushed first, then the stub called with the
arguments), device variables that host code names become ``extern`` declarations of the same type (bound to the
device TU's host shadows), and device functions go (their directives stay: a ``#define`` in a kernel body still
defines its macro for the host code after it).

Lines that device code took are gone, not blanked: a ``#line`` mark says where each run of host lines comes
from, so an edit that adds lines to device code changes the TU only in the numbers of its marks
(``jit.host_lines`` compiles it so that those numbers are not part of the object)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from . import tree as ts
from .errors import Refuse
from .layout import Edit, Line, directive_spans, marked, quote, rewrite
from .model import DEVICE_KINDS, TORCH_INCLUDES, Item, Model, anon_opener, leading_start
from .source import Flat

#: what nvcc's launch calls first (cuda_runtime.h declares it only for nvcc)
PUSH_CONFIGURATION = ("extern \"C\" unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, "
                      "size_t sharedMem = 0, struct CUstream_st *stream = 0);\n")
#: cuda_runtime.h's C++ overloads taking a device symbol or a kernel exist only under nvcc; without them g++
#: would pass a pointer variable's value (not its address) to the C API. The same templates, for g++.
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
template <class T> static inline cudaError_t cudaFuncSetCacheConfig(T* func, enum cudaFuncCache cacheConfig) { \
return ::cudaFuncSetCacheConfig((const void*)func, cacheConfig); }
template <class T> static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, T* entry) { \
return ::cudaFuncGetAttributes(attr, (const void*)entry); }
template <class T> static inline cudaError_t cudaFuncSetAttribute(T* entry, enum cudaFuncAttribute attr, \
int value) { return ::cudaFuncSetAttribute((const void*)entry, attr, value); }
"""
#: torch 2.11 declares RestrictPtrTraits only under nvcc (torch/headeronly/core/TensorAccessor.h); host code
#: naming it (``packed_accessor32<float, 2, torch::RestrictPtrTraits>()``) gets the same template here
RESTRICT_PTR_TRAITS = """namespace torch { namespace headeronly { template <typename T> struct RestrictPtrTraits { \
typedef T* __restrict__ PtrType; }; } }
namespace at { using torch::headeronly::RestrictPtrTraits; }
"""
_DROPPED_SPECIFIERS = ("static", "inline", "__forceinline__", "__noinline__", "__inline__")


@dataclass(frozen=True)
class HostTU:
    """The host TU as lines with their origins. Where the file starts with ``#include <...>`` lines that include
    torch, those and the prefix are a header of their own (the preamble, which many files share and gcc can
    take precompiled); the TU is then ``#include <preamble>`` and the rest."""

    prefix: str
    lines: Tuple[Line, ...]
    preamble_lines: int  # how many of ``lines`` belong to the preamble (0: no preamble)
    #: the includes of the file the TU leaves out (``DEVICE_LIBRARIES``): a name g++ then misses may be theirs
    left_out: Tuple[str, ...] = ()

    @property
    def preamble(self) -> str:
        if not self.preamble_lines:
            return ""
        return self.prefix + "".join(text + "\n" for text, _ in self.lines[:self.preamble_lines])

    @property
    def preamble_name(self) -> str:
        return f"kk_host_preamble_{hashlib.sha256(self.preamble.encode()).hexdigest()[:16]}.h"

    def include_line(self) -> str:
        """What stands for the preamble (the prefix itself where there is none)."""
        return f"#include <{self.preamble_name}>\n" if self.preamble_lines else self.prefix

    def rest_text(self, numbers: Optional[Callable[[int, int], int]] = None) -> str:
        """The lines after the preamble with their marks (``numbers``: as for ``layout.marked``)."""
        return marked(self.lines[self.preamble_lines:], numbers=numbers)

    @property
    def rest(self) -> Tuple[Line, ...]:
        return self.lines[self.preamble_lines:]

    def without_line_numbers(self) -> str:
        """The TU as its object depends on it where line numbers are read from a table: the lines, and a mark
        naming the file wherever it changes (``__FILE__``), but no numbers and no mark where lines merely jump."""
        out, current = [self.include_line()], None
        for text, (path, _) in self.rest:
            if path != current:
                out.append(f'#line 1 "{path}"\n')
                current = path
            out.append(text + "\n")
        return "".join(out)

    def each_line_marked(self, step: int) -> str:
        """The TU with a mark before every line, line i's number moved by ``step * (i + 1)``: where a preprocessed
        number differs from the TU's own by such a multiple, it is the line number of line i."""
        out = [self.include_line()]
        continued = False
        for i, (text, (path, line)) in enumerate(self.rest):
            if not continued:  # a mark inside a directive continued with a backslash would be part of it
                out.append(f'#line {line + step * (i + 1)} "{quote(path)}"\n')
            out.append(text + "\n")
            continued = text.endswith("\\")
        return "".join(out)

    def line_numbers(self) -> List[int]:
        """The line each line after the preamble stands for."""
        return [line for _, (_, line) in self.rest]

    @property
    def text(self) -> str:
        return self.include_line() + self.rest_text()

    @property
    def whole(self) -> str:
        """The TU with the preamble written in: what compiles without the preamble's header."""
        return marked(self.lines, self.prefix)



def host_text(model: Model, flat: Flat) -> HostTU:
    dropped = _emptied_blocks(model)
    edits: List[Edit] = [Edit(*_line_span(model, s, e), "") for s, e in dropped]
    aliases = {n for it in model.items if it.node.type == "namespace_alias_definition" for n in it.names}
    for it in model.items:
        if any(s <= it.start < e for s, e in dropped):
            continue
        if it.outside:
            edits += _taken_out(model, it, "")
        elif it.kind in ("kernel", "kernel_decl"):
            edits += _kernel_declaration(model, it)
        elif it.kind == "device_fn" and it.host_used and it.constexpr:
            edits += _strip_members(model, it.node)  # host code may call it (relaxed constexpr): it stays whole
        elif it.kind == "device_fn" and it.host_used:
            edits += _declaration(model, it)
        elif it.kind == "kernel_instance" or it.kind in ("device_fn", "device_var") and not it.host_used:
            edits += _taken_out(model, it, "")
        elif it.kind == "device_var":
            edits += _extern_variable(model, it)
        elif it.kind in ("hd_fn", "decl", "other", "using"):
            edits += _namespace_named(model, it, aliases) + _strip_members(model, it.node)
    left_out = _device_library_includes(model)
    edits += [Edit(it.start, it.end, "\n" * model.src.count(b"\n", it.start, it.end)) for it in left_out]
    for ns in model.anon_namespaces:
        body = ns.child_by_field_name("body")
        if not any(s <= ns.start_byte < e for s, e in dropped):
            edits.append(Edit(ns.start_byte, body.start_byte + 1, anon_opener(model)))
    edits += _launch_edits(model)
    lines = rewrite(model.src, edits, flat)
    droppable = _blank_or_comment_lines(model, flat)
    lines = [ln for ln in lines if not (ln[1] in droppable and (not ln[0].strip() or ln[0] == droppable[ln[1]]))]
    return HostTU(_prefix(model), tuple(lines), _leading_includes(lines),
                  tuple(model.text(it.node.child_by_field_name("path")) for it in left_out))


def _blank_or_comment_lines(model: Model, flat: Flat) -> dict:
    """origin -> text of each line of the file that holds nothing but blanks and comments, outside any literal:
    the host TU leaves them out, so that a comment or a blank line around device code is no host edit."""
    src = model.src
    comment = bytearray(len(src))
    literal = bytearray(len(src))
    for n in ts.walk(model.masked.tree.root_node):
        if n.type == "comment":
            comment[n.start_byte:n.end_byte] = b"\1" * (n.end_byte - n.start_byte)
        elif n.type in ("raw_string_literal", "string_literal", "char_literal", "preproc_arg"):
            literal[n.start_byte:n.end_byte] = b"\1" * (n.end_byte - n.start_byte)
    out, pos = {}, 0
    for i, raw in enumerate(src.split(b"\n")):
        end = pos + len(raw)
        if not any(literal[pos:end]) and all(comment[k] or raw[k - pos:k - pos + 1].isspace()
                                            for k in range(pos, end)):
            out[flat.where(i)] = raw.decode("utf-8", "surrogateescape")
        pos = end + 1
    return out


def _emptied_blocks(model: Model) -> List[Tuple[int, int]]:
    """Byte spans of the namespace and ``extern "C"`` blocks that hold nothing the host TU keeps (device functions
    and variables only): left out whole, so that a new block around a new helper is no host edit. The first
    block of each namespace stays (it declares the namespace, which a using-directive may name)."""
    kept = [it for it in model.items if not (it.kind in ("device_fn", "device_var") and not it.host_used)]
    spans: List[Tuple[int, int]] = []
    seen = set()
    for n in ts.walk(model.masked.tree.root_node):
        if n.type not in ("namespace_definition", "linkage_specification") or \
                any(s <= n.start_byte < e for s, e in spans):
            continue
        body = n.child_by_field_name("body")
        if body is None or body.type != "declaration_list":
            continue
        name = model.text(n.child_by_field_name("name")) if n.type == "namespace_definition" and \
            n.child_by_field_name("name") is not None else None
        first = n.type == "namespace_definition" and (_namespace_path(model, n) not in seen)
        if n.type == "namespace_definition":
            seen.add(_namespace_path(model, n))
        holds = [it for it in model.items if n.start_byte <= it.start < n.end_byte]
        if first or name is None and n.type == "namespace_definition" or not holds or \
                any(it in kept for it in holds) or directive_spans(n, model.src):
            continue
        spans.append((n.start_byte, n.end_byte))
    return spans


def _namespace_path(model: Model, n) -> Tuple[str, ...]:
    path = []
    while n is not None:
        if n.type == "namespace_definition":
            name = n.child_by_field_name("name")
            path.append(model.text(name) if name is not None else "")
        n = n.parent
    return tuple(reversed(path))


def _prefix(model: Model) -> str:
    """What nvcc adds before the file (``-include cuda_runtime.h``), and what torch's headers include only
    under nvcc (cuda.h in Dispatch.h, cuda_fp16.h and cuda_bf16.h in Half.h/BFloat16.h): host code using them
    (``CUDA_VERSION``, ``__float2half``) sees what it saw there."""
    torch = "#include <cuda.h>\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" if model.torch_includes else ""
    return "#include <cuda_runtime.h>\n" + torch + PUSH_CONFIGURATION + SYMBOL_API + \
        (RESTRICT_PTR_TRAITS if b"RestrictPtrTraits" in model.src else "")


def _leading_includes(lines: List[Line]) -> int:
    """How many of the TU's first lines are ``#include <...>`` lines (or blank, or comments) ending with the
    last such include, when one of them includes torch: no #define or #if before or between them changes
    what they mean, so they can be one precompiled header."""
    count, torch = 0, False
    for i, (text, _) in enumerate(lines):
        stripped = text.strip()
        if not stripped or stripped.startswith("//") or (stripped.startswith("/*") and stripped.endswith("*/")):
            continue
        words = stripped.split(None, 1)
        if words[0] != "#include" or len(words) < 2 or not words[1].startswith("<"):
            break
        torch |= words[1][1:].startswith(TORCH_INCLUDES)
        count = i + 1
    return count if torch else 0


def _line_span(model: Model, start: int, end: int) -> Tuple[int, int]:
    """``start``..``end`` widened to whole lines where only blanks share them (so taking it out leaves no line)."""
    src = model.src
    line_start = src.rfind(b"\n", 0, start) + 1
    if not src[line_start:start].strip():
        start = line_start
    line_end = src.find(b"\n", end)
    line_end = len(src) if line_end < 0 else line_end + 1
    rest = src[end:line_end].strip()
    if not rest or rest.startswith(b"//"):  # a comment after a closing brace goes with it
        end = line_end
    return start, end


def _taken_out(model: Model, it: Item, first: str, head_end: Optional[int] = None) -> List[Edit]:
    """Edits that take out ``it`` from ``head_end`` (its start by default) to its end but for its directive
    lines, writing ``first`` where the taken-out text began."""
    start, end = _line_span(model, it.start, it.end)
    if head_end is not None:
        start = head_end
    keep = [_line_span(model, s, e) for s, e in directive_spans(it.node, model.src) if s >= start]
    edits, pos, text = [], start, first
    for s, e in keep:
        if s < pos:
            continue
        edits.append(Edit(pos, s, text))
        text, pos = "", e
    edits.append(Edit(pos, end, text))
    return edits


def _declaration(model: Model, it: Item) -> List[Edit]:
    """A device function's definition becomes its declaration (its own text up to the body), which host code may
    name in ``decltype`` or ``sizeof`` as it could under nvcc."""
    body = it.fn.child_by_field_name("body")
    if body is None or it.fn.type != "function_definition":
        return []
    return _taken_out(model, it, ";\n", head_end=body.start_byte)


def _kernel_declaration(model: Model, it: Item) -> List[Edit]:
    """A kernel's definition becomes the declaration of its host-side stub: its own text up to the body, less
    launch bounds and what would keep the stub from being found in the other TU (``static``, ``inline``)."""
    edits: List[Edit] = []
    for n in ts.walk(it.node):
        if n.type == "launch_bounds" or (n.type in _DROPPED_SPECIFIERS and n.parent is not None
                                         and n.parent.type in ("storage_class_specifier", "function_definition",
                                                               "declaration")):
            edits.append(Edit(n.start_byte, n.end_byte, " " * (n.end_byte - n.start_byte)))
        elif n.type in ("compound_statement",):
            break
    for s, e, quals in model.masked.qualifiers:
        if it.start <= s < it.fn.child_by_field_name("declarator").start_byte and \
                quals & set(_DROPPED_SPECIFIERS):
            edits.append(Edit(s, e, " " * (e - s)))
    body = it.fn.child_by_field_name("body")
    if body is None:
        return edits
    return edits + _taken_out(model, it, ";\n", head_end=body.start_byte)


def _extern_variable(model: Model, var: Item) -> List[Edit]:
    """A device variable host code names: declared ``extern`` with its own type (``decltype``, ``sizeof`` and
    ``std::extent`` see what they saw under nvcc), bound at link time to the device TU's host shadow, whose
    address is the one the CUDA runtime registered for it."""
    if var.constexpr:
        return []  # host code reads its value: the declaration stays a definition
    fn = var.fn
    spec = []
    for k in fn.children:
        if k.type in ("init_declarator", ";") or k in fn.children_by_field_name("declarator"):
            continue
        t = model.text(k)
        if t in ("static", "extern", "__device__", "__constant__", "inline") or k.type == "attribute_specifier":
            continue
        spec.append(t)
    declarators = []
    for d in fn.children_by_field_name("declarator"):
        inner = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
        if inner.type == "array_declarator" and inner.child_by_field_name("size") is None:
            raise Refuse(f"device array {model.text(inner)} of unstated size used in host code", var.line0 + 1)
        declarators.append(model.text(inner))
    text = f"extern {' '.join(spec)} {', '.join(declarators)};"
    return _taken_out(model, var, " ".join(text.split("\n")) + "\n")


#: headers of device code alone that g++ cannot compile (they use threadIdx), whose API host code cannot call in a
#: split file (cub's is refused there, ``model.HOST_FORBIDDEN``; cooperative groups' runs on the device only); the
#: prefixes of the macros they and what they include define
DEVICE_LIBRARIES = ("<cub/", "<cooperative_groups/")
_THEIR_MACROS = ("CUB_", "_CUB", "THRUST_", "_THRUST", "CCCL_", "_CCCL", "LIBCUDACXX", "_LIBCUDACXX", "CUDA_CUB",
                 "_CG_", "CG_")


def _device_library_includes(model: Model) -> List[Item]:
    """The host TU leaves out an include of cub or of cooperative groups' extensions (``reduce.h``) where host code
    names none of the macros they define: nvcc's host pass compiled their device code as g++ cannot, and host
    code used nothing they declare (or fails to compile, which builds the file as written)."""
    found = [it for it in model.items if it.kind == "include" and
             model.text(it.node.child_by_field_name("path")).startswith(DEVICE_LIBRARIES)]
    if not found:
        return []
    for it in model.items:
        if it.kind not in DEVICE_KINDS and it.kind != "include":
            if any(name.startswith(_THEIR_MACROS) for name, _ in ts.identifiers(it.node, model.src)):
                return []
    return found


def _namespace_named(model: Model, it: Item, aliases: set) -> List[Edit]:
    """``using namespace nvcuda;`` or ``namespace cg = cooperative_groups;`` at file scope names a namespace that
    CUDA's headers declare only under nvcc: g++ is told it exists, empty (which changes no lookup), on the same
    line, so the host TU compiles where the file's host pass did."""
    node = it.node
    directive = node.type == "using_declaration" and any(k.type == "namespace" for k in node.children)
    if not (directive or node.type == "namespace_alias_definition") or any(s.name for s in it.scope) or \
            not node.named_children:
        return []
    target = node.named_children[-1]
    path = []
    for leaf in ts.walk(target):
        if leaf.child_count == 0 and leaf.type in ("namespace_identifier", "identifier"):
            path.append(model.text(leaf))
        elif leaf.child_count == 0 and leaf.type != "::":
            return []
    if not path or path[0] in aliases:  # the file's own alias: declaring a namespace of that name would not compile
        return []
    opened = "".join(f"namespace {name} {{ " for name in path) + "}" * len(path) + " "
    return [Edit(node.start_byte, node.start_byte, opened)]


def _strip_members(model: Model, node) -> List[Edit]:
    """In host code, the bodies of device-only member functions dropped (g++ cannot compile device intrinsics;
    nvcc never ran them on the host)."""
    edits: List[Edit] = []
    skip_until = -1
    for n in ts.walk(node):
        if n.start_byte < skip_until:
            continue
        if n.type == "function_definition" and n != node and _device_only(model, n):
            body = n.child_by_field_name("body")
            edits.append(Edit(body.start_byte, n.end_byte, ";"))
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
    """``k<<<g, b, s, st>>>(args)`` as nvcc lowers it: ``(__cudaPushCallConfiguration(g, b, s, st)) ? (void)0 :
    k(args)``, so the configuration is evaluated before the arguments, as there; where the grammar sees the launch,
    and in a macro's body (``model.MacroLaunch``)."""
    launches = []
    for launch in model.launches:
        config = next(k for k in launch.call.children if k.type == "kernel_call_syntax")
        inner = model.src[config.children[0].end_byte:config.children[-1].start_byte].decode("utf-8",
                                                                                            "surrogateescape")
        values = len([k for k in config.named_children if k.type != "comment"])
        launches.append((launch.callee.start_byte, (config.start_byte, config.end_byte), inner, values))
    launches += [(m.callee, m.config, m.inner, m.values) for m in model.macro_launches]
    edits = []
    for start, config, inner, values in launches:
        line0 = model.src.count(b"\n", 0, start)
        if not 2 <= values <= 4:
            raise Refuse("a launch configuration without 2 to 4 values", line0 + 1)
        edits.append(Edit(start, start, f"(__cudaPushCallConfiguration({inner})) ? (void)0 : ", line0=line0))
        edits.append(Edit(*config, ""))
    return edits
