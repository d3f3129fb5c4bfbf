"""A kernel's parameter and template parameter lists, rewritten for its launcher: the same declarations (so
arguments convert at the call site exactly as for ``<<<>>>``), every parameter named, and how to forward them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import tree as ts
from .errors import Refuse
from .model import Item, Model, declarator_name

HIDDEN = '__attribute__((visibility("hidden")))'
CONFIG_DECL = "dim3, dim3, size_t, cudaStream_t"
CONFIG_DEF = "dim3 kk_grid, dim3 kk_block, size_t kk_shmem, cudaStream_t kk_stream"


@dataclass
class Signature:
    host_params: str  # for the host TU's declaration: defaults kept
    device_params: str  # for the device TU's definition: defaults dropped
    forward: str  # the arguments the launcher passes on
    template: str  # "template <...> " or ""
    template_args: str  # "<T, N, Ts...>" or ""


def signature(model: Model, kernel: Item) -> Signature:
    decl = kernel.fn.child_by_field_name("declarator")
    plist = decl.child_by_field_name("parameters")
    host, device, fwd = [], [], []
    params = [p for p in plist.named_children if p.type != "comment"]
    if len(params) == 1 and model.text(params[0]).strip() == "void":
        params = []
    for i, p in enumerate(params):
        h, d, f = _param(model, p, i)
        host.append(h)
        device.append(d)
        fwd.append(f)
    template, targs = "", ""
    if kernel.tparams is not None:
        template = f"template {model.text(kernel.tparams)} "
        targs = "<" + ", ".join(_template_arg(model, p) for p in kernel.tparams.named_children
                                if p.type != "comment") + ">"
    return Signature(", ".join(host), ", ".join(device), ", ".join(fwd), template, targs)


def _clean(model: Model, node, start: int, end: int) -> str:
    """The text of node[start:end] without __grid_constant__ (meaningful on a kernel's parameter only)."""
    src = model.src
    out, pos = [], start
    for leaf in ts.leaves(node):
        if ts.text(leaf, src) == "__grid_constant__" and start <= leaf.start_byte < end:
            out.append(src[pos:leaf.start_byte])
            pos = leaf.end_byte
    out.append(src[pos:end])
    return b"".join(out).decode("utf-8", "surrogateescape")


def _param(model: Model, p, i: int):
    line = ts.line(p)
    if p.type not in ("parameter_declaration", "optional_parameter_declaration", "variadic_parameter_declaration"):
        raise Refuse("a kernel parameter the split does not handle", line)
    d = p.child_by_field_name("declarator")
    name = declarator_name(model, d) if d is not None else None
    end = p.end_byte
    default = p.child_by_field_name("default_value")
    if default is not None:
        eq = next(k for k in p.children if k.type == "=")
        end = eq.start_byte
    text_host = _clean(model, p, p.start_byte, p.end_byte)
    text_dev = _clean(model, p, p.start_byte, end).rstrip()
    variadic = p.type == "variadic_parameter_declaration" or any(k.type == "..." for k in p.children)
    if name is None:
        if d is not None and d.type not in ("abstract_pointer_declarator", "abstract_reference_declarator"):
            raise Refuse("an unnamed kernel parameter with a declarator the split cannot name", line)
        if default is not None:
            raise Refuse("an unnamed kernel parameter with a default", line)
        name = f"kk_p{i}"
        text_host, text_dev = f"{text_host} {name}", f"{text_dev} {name}"
    return text_host, text_dev, f"{name}..." if variadic else name


def _template_arg(model: Model, p) -> str:
    name: Optional[str] = None
    for k in p.named_children:
        if k.type in ("type_identifier", "identifier"):
            name = model.text(k)
            break
        if k.type not in ("template_parameter_list",):
            n = declarator_name(model, k) if k.type.endswith("declarator") or k.type == "identifier" else None
            if n:
                name = n
                break
    if name is None:
        raise Refuse("an unnamed or unreadable template parameter of a kernel", ts.line(p))
    variadic = any(k.type == "..." for k in ts.walk(p))
    return f"{name}..." if variadic else name


def host_declaration(model: Model, kernel: Item, sig: Signature) -> str:
    params = f"{CONFIG_DECL}, {sig.host_params}" if sig.host_params else CONFIG_DECL
    return f"{sig.template}{HIDDEN} void {model.launcher(kernel.names[0])}({params});"


def device_definition(model: Model, kernel: Item, sig: Signature) -> str:
    params = f"{CONFIG_DEF}, {sig.device_params}" if sig.device_params else CONFIG_DEF
    name = kernel.names[0]
    # one line: the #line mark before it makes a diagnostic in it cite the kernel's definition
    return (f"{sig.template}{HIDDEN} void {model.launcher(name)}({params}) {{ "
            f"{name}{sig.template_args}<<<kk_grid, kk_block, kk_shmem, kk_stream>>>({sig.forward}); }}")


def variable_reference(model: Model, var: Item, name: str, symbol: str, init: Optional[str]) -> str:
    """A reference to a device variable's host shadow, named ``symbol`` for the linker: its declaration in the
    host TU (``init`` None), or its definition in the device TU (bound to the variable)."""
    fn = var.fn
    spec = []
    for k in fn.children:
        if k.type in ("init_declarator", ";") or k in fn.children_by_field_name("declarator"):
            continue
        t = model.text(k)
        if t in ("static", "extern", "__device__", "__constant__", "inline") or \
                (k.type == "type_qualifier" and t in ("__constant__", "__device__")):
            continue
        spec.append(t)
    for d in fn.children_by_field_name("declarator"):
        inner = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
        if declarator_name(model, inner) != name:
            continue
        ident = _find_identifier(model, inner, name)
        src = model.src
        ref = (src[inner.start_byte:ident.start_byte] + f"(&{symbol if init else name})".encode()
               + src[ident.end_byte:inner.end_byte]).decode("utf-8", "surrogateescape")
        if init is None:
            return f"extern {' '.join(spec)} {ref} __asm__(\"{symbol}\");"
        return f'extern "C" {{ {HIDDEN} {" ".join(spec)} {ref} = {init}; }}'
    raise Refuse(f"the declaration of device variable {name} could not be read", var.line0 + 1)


def _find_identifier(model: Model, node, name: str):
    for n in ts.walk(node):
        if n.type == "identifier" and model.text(n) == name:
            return n
    raise Refuse(f"the declaration of device variable {name} could not be read", ts.line(node))
