"""C++/CUDA source at the syntax level, through tree-sitter's CUDA grammar: the blocks a file defines with
registration macros (``PYBIND11_MODULE(name, m) {...}``, ``TORCH_LIBRARY(ns, m) {...}``), found where the
grammar sees a definition, not where the text merely mentions one (a comment, a string, a macro body)."""
from __future__ import annotations

import functools
from typing import Iterator, List, NamedTuple, Optional, Sequence


class MacroBlock(NamedTuple):
    macro: str  # e.g. "TORCH_LIBRARY"
    args: List[str]  # its arguments as written: ["myops", "m"]
    line: int  # 1-based


@functools.lru_cache(maxsize=None)
def parser():
    import tree_sitter
    import tree_sitter_cuda

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cuda.language()))


def parse(text: str):
    return parser().parse(text.encode("utf-8", "surrogateescape"))


def walk(node) -> Iterator:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def macro_blocks(text: str, macros: Sequence[str]) -> List[MacroBlock]:
    """Every ``MACRO(args) { ... }`` block of ``text`` whose macro is one of ``macros``, in file order, inside
    namespaces and preprocessor conditionals too (which branch is compiled is not decided here)."""
    wanted = set(macros)
    if not any(m in text for m in wanted):  # most files: no parse at all
        return []
    found = []
    for node in walk(parse(text).root_node):
        if node.type != "function_definition":
            continue
        declarator = node.child_by_field_name("declarator")
        if declarator is None or declarator.type != "function_declarator":
            continue
        callee = declarator.child_by_field_name("declarator")
        params = declarator.child_by_field_name("parameters")
        if callee is None or params is None or callee.text.decode() not in wanted:
            continue
        args = [c.text.decode(errors="replace") for c in params.named_children]
        found.append(MacroBlock(callee.text.decode(), args, node.start_point[0] + 1))
    return found


_TORCH_NAMESPACES = {"torch", "at", "c10"}


def mentions_torch(text: str) -> bool:
    """Whether code (not a comment or string) names something in torch's namespaces: ``torch::Tensor``,
    ``at::cuda::getCurrentCUDAStream()``, ``using namespace c10;``."""
    if "::" not in text and "using" not in text:
        return False
    for node in walk(parse(text).root_node):
        if node.type == "namespace_identifier" and node.text.decode() in _TORCH_NAMESPACES:
            parent = node.parent
            if parent is not None and parent.type == "qualified_identifier" \
                    and parent.child_by_field_name("scope") == node:
                return True
        elif node.type == "using_declaration" and any(c.type == "namespace" for c in node.children):
            if node.named_children and node.named_children[-1].text.decode() in _TORCH_NAMESPACES:
                return True
    return False


def includes_torch(text: str) -> bool:
    """Whether an ``#include`` of ``text`` names a header of torch's (``torch/``, ``ATen/``, ``c10/``), in any
    preprocessor branch."""
    if "include" not in text:
        return False
    for node in walk(parse(text).root_node):
        if node.type == "preproc_include":
            path = node.child_by_field_name("path")
            if path is not None and path.text.decode(errors="replace").strip('<>"').split("/")[0] in (
                    "torch", "ATen", "c10"):
                return True
    return False


def first_cuda_token(text: str, tokens: Sequence[str]) -> Optional[str]:
    """The first of ``tokens`` (CUDA-only keywords and ``<<<``: ``__global__``, ``__shared__``, ...) that the
    grammar sees in ``text`` as code rather than in a comment or string, or None."""
    wanted = set(tokens)
    if not any(t in text for t in wanted):
        return None
    for node in walk(parse(text).root_node):
        if node.child_count == 0 and node.type in wanted:
            return node.type
    return None
