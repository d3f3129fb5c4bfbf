"""Planning: what to compile and how, for a card, a kernelkit inline cell, or torch-style extension sources.

A plan is a :class:`units.Target` (translation units with their content keys, link flags, and the names
the user knows the files by). Planning runs no compiler, so a warm load costs hashing only; the one thing
it writes is generated source text, into the content-addressed ``src/`` cache (written once per content).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import KernelkitError
from . import fast, remote, syntax, toolchain
from .cache import source_bytes, write_source
from .cards import Card
from .sources import INCLUDE, sha256_bytes
from .units import Target, Unit, link_flags, plan_unit, target_key

Functions = Union[None, str, Sequence[str], Mapping[str, str]]


def display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def function_map(functions: Functions) -> Dict[str, str]:
    """torch's ``functions=``: a name, a list of names, or a dict name -> docstring."""
    if functions is None:
        return {}
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, Mapping):
        funcs = dict(functions)
    elif isinstance(functions, (list, tuple)):
        funcs = {f: f for f in functions}
    else:
        raise ValueError(f"functions: expected a str, a list of names or a dict name -> docstring, got "
                         f"{type(functions).__name__}")
    for f, doc in funcs.items():
        if not isinstance(f, str) or not f.isidentifier():
            raise ValueError(f"functions: {f!r} is not a C++ identifier")
        if not isinstance(doc, str):
            raise ValueError(f"functions: the docstring of {f!r} must be a str, got {type(doc).__name__}")
    return funcs


def make_target(name: str, units: List[Unit], with_cuda: bool, pymodule: Optional[str],
                extra_ldflags: Sequence[str], texts: Dict[str, List[str]], *, torch_python: bool = False,
                standalone: bool = False) -> Target:
    ldflags = link_flags(with_cuda, bool(pymodule) or torch_python, extra_ldflags, standalone=standalone)
    shown = {str(u.path): u.display for u in units}
    for u in units:
        shown.update({str(d): display(d) for d in u.deps})
    return Target(name, units, ldflags, target_key(name, units, ldflags), with_cuda, pymodule,
                         shown, texts, standalone=standalone)


def pch_defines(with_cuda: bool) -> List[str]:
    """The macros the generated binding text defines before <kernelkit/binding.h> (a PCH must see the same)."""
    return ["KERNELKIT_BINDING=1"] + (["KERNELKIT_WITH_CUDA=1"] if with_cuda else [])


def cpp_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# ------------------------------------------------------------------------------------------------ cards
def plan_card(card: Card, arch, extra_cflags, extra_cuda_cflags, extra_ldflags,
              extra_include_paths, dtype_shards: bool = True) -> Target:
    """``dtype_shards=False``: each .cu as one TU wherever this machine would shard it (an ahead-of-time build,
    which no edit follows)."""
    remote.supply_toolchain_facts()
    spec = card.spec
    cflags = list(getattr(spec, "extra_cflags", ()) or ()) + extra_cflags
    cuflags = list(getattr(spec, "extra_cuda_cflags", ()) or ()) + extra_cuda_cflags
    sources = card.sources()
    nvrtc = card.nvrtc_sources()  # compiled apart (jit.api, instant.card_kernels): not in this build's key
    has_cu = any(s.suffix == ".cu" for s in sources)
    with_cuda = has_cu or bool(nvrtc)
    if with_cuda:
        toolchain.check_cuda_match(f"card {card.name}")
    archs = toolchain.arch_list(arch) if has_cu else []
    include_dirs = [card.dir, INCLUDE] + [Path(p).resolve() for p in extra_include_paths]
    units, texts = [], {}
    for src in sources:
        if not src.is_file():
            raise KernelkitError(f"card {card.name}: source {src} does not exist")
        text = src.read_text()
        kind = "cu" if src.suffix == ".cu" else "cpp"
        units += _card_units(kind, src, text, include_dirs, cuflags if kind == "cu" else cflags, archs, dtype_shards)
        texts[display(src)] = text.splitlines()
    header = card.header()
    if header is None and nvrtc:
        raise KernelkitError(f"card {card.name}: nvrtc_sources are launched from the binding, but there is no "
                             f"header {card.dir / (card.name + '.h')} (or Spec.header) to hold it")
    if header is not None:
        text = "".join([
            "#define KERNELKIT_BINDING 1\n",
            "#define KERNELKIT_WITH_CUDA 1\n" if with_cuda else "",
            "#include <kernelkit/binding.h>\n",
            "#include <kernelkit/kernels.h>\n" if nvrtc else "",  # its entry point receives the kernels
            f'#include "{header.name}"\n',
        ])
        path = write_source(text, f"{card.name}_binding.cpp")
        units.append(plan_unit("cpp", path, text, include_dirs, cflags, archs,
                                      f"{display(header)} (binding)", optimize="-O2",
                                      pch_defines=pch_defines(with_cuda)))
    return make_target(card.name, units, with_cuda, None, list(extra_ldflags), texts)


def _card_units(kind: str, src: Path, text: str, include_dirs, flags, archs, dtype_shards: bool) -> List[Unit]:
    """The TU of a card's source, or its dtype shards (jit.shards) where it can be and sharding pays here."""
    whole = plan_unit(kind, src, text, include_dirs, flags, archs, display(src))
    return fast.expand(whole, text) if dtype_shards else [whole]


# ------------------------------------------------------------------------------- kernelkit inline cells


def plan_inline(name: str, cuda: Optional[str], cpp: Optional[str], funcs: Dict[str, str], arch, cflags,
                cuflags, ldflags, include_paths, gil_not_used: bool = False) -> Target:
    """kernelkit's own inline form: ``cuda`` is device code compiled alone (fast to rebuild when it keeps
    torch out), ``cpp`` the binding with ``KERNELKIT_LIBRARY`` or ``functions`` bound by pybind11."""
    remote.supply_toolchain_facts()
    include_dirs = [INCLUDE] + [Path(p).resolve() for p in include_paths]
    with_cuda = bool(cuda)
    if with_cuda:
        toolchain.check_cuda_match(name)
    archs = toolchain.arch_list(arch) if with_cuda else []
    units, texts = [], {}
    if cuda:
        text = cuda
        if syntax.mentions_torch(cuda) and not syntax.includes_torch(cuda):
            # torch-style cell (as torch's load_inline accepts): give it torch's types, keep line numbers
            text = f'#include <torch/types.h>\n#line 1 "{name}.cu"\n' + cuda
        elif syntax.includes_torch(cuda):  # split by torch_cu, which cites it by this name: its host TU (#line
            text = f'#line 1 "{name}.cu"\n' + cuda  # marks, launcher names) outlives a kernel edit
        path = write_source(text, f"{name}.cu")
        # a cell whose device part uses torch: its kernels still rebuild alone
        units.append(fast.claim(plan_unit("cu", path, text, include_dirs, cuflags, archs, f"{name}.cu")))
        texts[f"{name}.cu"] = cuda.splitlines()
    pymodule = None
    if cpp or funcs:
        head = "#define KERNELKIT_BINDING 1\n" + ("#define KERNELKIT_WITH_CUDA 1\n" if with_cuda else "")
        if funcs:
            head += "#include <torch/extension.h>\n"
        head += "#include <kernelkit/binding.h>\n"
        body = f'#line 1 "{name}.cpp"\n' + (cpp or "") + "\n"
        tail = ""
        if funcs:
            pymodule = "kk_py_" + sha256_bytes(head.encode(), body.encode(), repr(sorted(funcs.items())).encode())[:16]
            defs = "".join(f'  m.def("{f}", &{f}, {cpp_string(doc)});\n' for f, doc in funcs.items())
            option = ", pybind11::mod_gil_not_used()" if gil_not_used else ""
            tail = f'#line 1 "{name}_bindings.cpp"\nPYBIND11_MODULE({pymodule}, m{option}) {{\n{defs}}}\n'
            texts[f"{name}_bindings.cpp"] = tail.splitlines()[1:]
        text = head + body + tail
        path = write_source(text, f"{name}_binding.cpp")
        units.append(plan_unit("cpp", path, text, include_dirs, cflags, archs, f"{name}.cpp", optimize="-O2",
                                      pch_defines=None if funcs else pch_defines(with_cuda)))
        texts[f"{name}.cpp"] = (cpp or "").splitlines()
    return make_target(name, units, with_cuda, pymodule, ldflags, texts)


# ---------------------------------------------------------------------- torch.utils.cpp_extension style
CUDA_SUFFIXES = (".cu", ".cuh")
_ARCH_FLAGS = ("-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code")


def _torch_style_flags(name: str, kind: str, with_cuda: bool, user: Sequence[str], archs: Sequence[str],
                       standalone: bool) -> List[str]:
    """What torch's JIT build passes (cpp_extension._write_ninja_file_to_build_library), less the include
    dirs plan_unit adds: the extension's name and API defines, torch's and Python's headers as system
    headers, torch's nvcc defines, the arch list; no -O unless the user asks, as in torch."""
    defines = [] if standalone else [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    system = toolchain.torch_include_paths(with_cuda) + [toolchain.python_include()]
    isystem = [f for p in system for f in ("-isystem", p)]
    abi = [f"-D_GLIBCXX_USE_CXX11_ABI={toolchain.cxx11_abi()}", *toolchain.pybind_abi_flags()]
    std = [] if any(f.startswith("-std") for f in user) else [toolchain.cxx_standard_flag()]
    if kind == "cpp":
        return [*defines, *isystem, *abi, "-fPIC", *std, *user]
    arch = [] if any(f.split("=")[0] in _ARCH_FLAGS for f in user) else toolchain.gencode_flags(archs)
    return [*defines, *isystem, abi[0], *toolchain.torch_nvcc_flags(), *arch, "-Xcompiler", "-fPIC", *std, *user]


def plan_extension(name: str, sources: Sequence[Path], *, arch=None, extra_cflags=(), extra_cuda_cflags=(),
                   extra_ldflags=(), extra_include_paths=(), with_cuda: Optional[bool] = None,
                   is_python_module: bool = True, is_standalone: bool = False,
                   displays: Optional[Dict[Path, str]] = None,
                   texts: Optional[Dict[str, List[str]]] = None, use_record: bool = False) -> Target:
    """torch.utils.cpp_extension.load's build: each source its own cached unit, compiled with the flags
    torch would use, linked the way torch links (torch_python too, unless standalone). ``use_record``: return
    the target recorded for this very call when nothing it read has changed (a :class:`fast.recall.Recalled`, which
    can open a cached build but not build one), and record a full plan for the next process."""
    if not name.isidentifier():
        raise ValueError(f"name: expected a Python identifier (it names the extension module), got {name!r}")
    remote.supply_toolchain_facts()  # a fresh machine of the team's image plans without working them out
    has_cuda_files = any(s.suffix in CUDA_SUFFIXES for s in sources)
    with_cuda = _with_cuda(with_cuda, sources, has_cuda_files)
    if with_cuda:
        toolchain.check_cuda_match(name)
    archs = toolchain.arch_list(arch) if has_cuda_files else []
    include_dirs = [Path(p).resolve() for p in extra_include_paths]
    kinds = {"cu" if s.suffix in CUDA_SUFFIXES else "cpp" for s in sources}
    flags_by_kind = {k: _torch_style_flags(name, k, with_cuda, list(extra_cuda_cflags if k == "cu" else extra_cflags),
                                           archs, is_standalone) for k in sorted(kinds)}
    if use_record:
        ldflags = link_flags(with_cuda, not is_standalone, list(extra_ldflags), standalone=is_standalone)
        call = fast.recall_key(name, sources, {k: [f"-I{d}" for d in include_dirs] + f for k, f in flags_by_kind.items()},
                               ldflags, name if is_python_module else None, is_standalone)
        recalled = fast.recall_plan(call)
        if recalled is not None:
            return recalled
        started = time.time()
    for src in sources:  # only now: a record holds the identities of files that existed, so a missing one misses it
        if not os.path.isfile(src):
            raise FileNotFoundError(f"sources: {src} does not exist")
    units, shown_texts = _extension_units(sources, flags_by_kind, include_dirs, archs, displays, texts)
    if is_python_module and not is_standalone:
        _require_module_init(name, units)
    target = make_target(name, units, with_cuda, name if is_python_module else None, list(extra_ldflags),
                         shown_texts, torch_python=not is_standalone, standalone=is_standalone)
    if use_record:
        fast.remember_plan(call, target, started)
    return target


def _with_cuda(with_cuda: Optional[bool], sources: Sequence[Path], has_cuda_files: bool) -> bool:
    """``with_cuda`` as torch reads it: by default, whether a source is a CUDA file; False with one is refused."""
    if with_cuda is None:
        return has_cuda_files
    if not with_cuda and has_cuda_files:
        cu = next(s for s in sources if s.suffix in CUDA_SUFFIXES)
        raise ValueError(f"with_cuda=False, but sources include the CUDA file {cu.name}: drop with_cuda or the file")
    return with_cuda


def _extension_units(sources: Sequence[Path], flags_by_kind: Dict[str, List[str]], include_dirs: List[Path],
                     archs: List[str], displays: Optional[Dict[Path, str]], texts: Optional[Dict[str, List[str]]]
                     ) -> Tuple[List[Unit], Dict[str, List[str]]]:
    """Each source its own unit, and the lines of each source as errors show it (``texts`` first)."""
    units, shown_texts = [], dict(texts or {})
    for src in sources:
        kind = "cu" if src.suffix in CUDA_SUFFIXES else "cpp"
        shown = (displays or {}).get(src) or display(src)
        text = src.read_text(errors="replace")
        # a .cu that includes torch is the split's, where it can be
        units.append(fast.claim(plan_unit(kind, src, text, include_dirs, flags_by_kind[kind], archs, shown,
                                          optimize=None, torch_style=True)))
        shown_texts.setdefault(shown, text.splitlines())
    return units, shown_texts


def _require_module_init(name: str, units: Sequence[Unit]) -> None:
    """A Python module needs an init function: say so now rather than after minutes of compiling."""
    files = [u.path for u in units] + [d for u in units for d in u.deps]
    texts = [source_bytes(f) for f in files]
    if not any(b"PYBIND11_MODULE" in t or b"PyInit_" in t for t in texts):
        raise KernelkitError(
            f"{name}: the sources define no PYBIND11_MODULE(TORCH_EXTENSION_NAME, m), so there would be no Python "
            "module to import. Bind functions with functions=[...] (load_inline) or a PYBIND11_MODULE block, or "
            "pass is_python_module=False for code that registers ops with TORCH_LIBRARY.")


def refuse_device_code(text: str, what: str, instead: str = "cuda_sources= (positional order: name, "
                       "cpp_sources, cuda_sources, functions)") -> None:
    """A .cpp goes to the C++ compiler, which cannot compile kernels: say so before a minute of compiling."""
    token = syntax.first_cuda_token(text, ("__global__", "<<<"))
    if token:
        raise ValueError(f"{what} holds device code ({token!r}); C++ sources go to the C++ compiler, "
                         f"which cannot compile CUDA: pass this code as {instead}")


def _joined(sources: Union[None, str, Sequence[str]], what: str) -> List[str]:
    if sources is None:
        return []
    if isinstance(sources, str):
        return [sources]
    out = list(sources)
    if not all(isinstance(s, str) for s in out):
        raise TypeError(f"{what}: expected source code as a str or a list of str, got {sources!r:.80}")
    return out


def torch_build_directory(name: str, build_directory=None) -> str:
    """Where torch's load_inline would write ``name``'s sources (its build directory, not created here)."""
    if build_directory is not None:
        return os.path.abspath(os.fspath(build_directory))
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        import torch
        from torch.utils import cpp_extension

        accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(cpp_extension.get_default_build_root(), f"{python}_{accelerator}")
    return os.path.join(root, name)


def _named_as(path: str) -> str:
    """A first line that makes the compiler name the file ``path`` (and count its next line as line 1)."""
    return '#line 1 "' + path.replace("\\", "\\\\").replace('"', '\\"') + '"\n'


def plan_torch_inline(name: str, cpp_sources, cuda_sources, functions: Functions, *,
                      with_pytorch_error_handling: bool = True, no_implicit_headers: bool = False,
                      gil_not_used: bool = False, implicit_main: bool = True, build_directory=None,
                      **ext) -> Target:
    """torch.utils.cpp_extension.load_inline's sources, written as torch writes them (``main.cpp`` with
    ``<torch/extension.h>`` and the generated PYBIND11_MODULE, ``cuda.cu`` with torch's three includes), line
    for line, so ``__LINE__`` and the compiler's messages count as under torch; a first ``#line`` mark names the
    file as torch's build directory would hold it, so ``__FILE__`` is torch's too. ``implicit_main=False`` leaves
    out a ``main.cpp`` that would hold nothing but the include (kernelkit's inline form); ``gil_not_used``
    declares the generated module safe without the GIL, as torch 2.15's does."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected a Python identifier (it names the extension module), got {name!r}")
    cpp = _joined(cpp_sources, "cpp_sources")
    cuda = _joined(cuda_sources, "cuda_sources")
    funcs = function_map(functions)
    for i, text in enumerate(cpp):
        refuse_device_code(text, "cpp_sources" + (f"[{i}]" if len(cpp) > 1 else ""))
    folder = torch_build_directory(name, build_directory)
    cpp_name, cu_name = f"{name}/main.cpp", f"{name}/cuda.cu"
    main_lines = ([] if no_implicit_headers else ["#include <torch/extension.h>"]) + cpp
    if funcs:
        wrap = "torch::wrap_pybind_function({})" if with_pytorch_error_handling else "{}"
        option = ", pybind11::mod_gil_not_used()" if gil_not_used else ""
        main_lines += [f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m{option}) {{"]
        main_lines += [f'm.def("{f}", {wrap.format(f)}, {cpp_string(doc)});' for f, doc in funcs.items()] + ["}"]
    paths, displays, texts = [], {}, {}
    if cpp or funcs or implicit_main:
        main = "\n".join(main_lines)
        paths.append(write_source(_named_as(os.path.join(folder, "main.cpp")) + main, "main.cpp"))
        displays[paths[0]] = displays[Path(folder, "main.cpp")] = cpp_name
        texts[cpp_name] = main.splitlines()
    if cuda:
        head = [] if no_implicit_headers else ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
        text = "\n".join(head + cuda)
        path = write_source(_named_as(os.path.join(folder, "cuda.cu")) + text, "cuda.cu")
        paths.append(path)
        displays[path] = displays[Path(folder, "cuda.cu")] = cu_name
        texts[cu_name] = text.splitlines()
    target = plan_extension(name, paths, displays=displays, texts=texts, **ext)
    target.display.update({str(k): v for k, v in displays.items()})  # the names the compiler cites, too
    return target
