"""Instant kernels: ``kernelkit.load_kernels(source)`` compiles kernel-only CUDA C++ with NVRTC and returns a
module whose attributes launch the kernels on torch tensors.

    mod = kernelkit.load_kernels(r'''
    extern "C" __global__ void scale(const float* x, float* out, float a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a * x[i];
    }''', name="scaling")
    mod.scale[(n + 255) // 256, 256](x, out, 2.0, n)

Loading again under the same name (an edited cell) updates that module in place, so code that holds it,
or a torch op that calls it, runs the new kernels. Launches go on torch's current stream of the tensors'
device and are captured by CUDA graphs like any other work on that stream.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import KernelkitError
from ..jit import nvrtc
from . import launcher
from .signature import Signature, bind, check_expressions

_SIZES = {"p": 8, "b": 1, "c": 1, "C": 1, "s": 2, "S": 2, "h": 2, "B": 2, "i": 4, "I": 4, "f": 4, "l": 8, "L": 8,
          "d": 8}
_MODULES: Dict[str, "KernelModule"] = {}  # name -> its module, updated in place by each load


class _Build:
    """One compiled program: its cubin, kernels and signatures; loaded onto the GPU on first launch."""

    def __init__(self, program: nvrtc.Program, compiled: nvrtc.Compiled, signatures: Dict[str, Signature],
                 symbols: Dict[str, str]):
        self.program = program
        self.compiled = compiled
        self.signatures = signatures
        self.symbols = symbols  # name expression -> symbol in the cubin
        self.ready: Dict[str, tuple] = {}  # name expression -> the launcher's leading arguments
        self._library = None
        self._handles: Optional[Dict[str, tuple]] = None
        self._prints: Optional[bool] = None

    def prepare(self, expr: str) -> tuple:
        """Load the cubin (once) and return ``expr``'s launch entry."""
        if expr not in self.signatures:
            known = ", ".join(sorted(self.signatures)) or "none"
            raise KernelkitError(f"{self.program.name}: no kernel {expr!r} in the current build (kernels: {known})")
        sig = self.signatures[expr]
        if not sig.declared:
            raise KernelkitError(f"{self.program.name}: kernel {expr!r} is in the compiled program, but its source shows "
                                 "no declaration of it (defined through a macro?), so kernelkit cannot pass arguments "
                                 "to it from Python; declare it as a plain __global__ function")
        bad = sig.unsupported()
        if bad:
            raise KernelkitError(f"{sig}: kernelkit cannot pass parameter(s) {', '.join(p.describe() for p in bad)} "
                                 "from Python (supported: pointers, bool, integers, float, double, half, bfloat16)")
        mod = self._load()
        handle = mod.get_kernel(self._library, self.symbols[expr])
        self._check_sizes(sig, mod.param_info(handle, torch.cuda.current_device()))
        launch = _labelled_launch(mod.launch, expr) if self.prints() else mod.launch
        entry = (launch, handle, sig.kernel, "".join(p.code for p in sig.params).encode(),
                 tuple(p.dtype for p in sig.params), tuple(p.name for p in sig.params))
        self.ready[expr] = entry
        return entry

    def prints(self) -> bool:
        """Whether the cubin calls device printf or assert (read once per build): only such kernels' launches
        are worth labelling."""
        if self._prints is None:
            data = self.compiled.cubin.read_bytes()
            self._prints = b"vprintf" in data or b"__assertfail" in data
        return self._prints

    def handles(self) -> Dict[str, Tuple[int, List[Tuple[int, str]]]]:
        """Every kernel's CUkernel handle (one serves every device) and its parameters as (size in bytes,
        declaration), the sizes as the cubin records them (0: not known). Loads the cubin, and each kernel on
        the current GPU, so that no first launch loads one inside a CUDA graph capture."""
        if self._handles is None:
            mod = self._load()
            device = torch.cuda.current_device()
            found = {}
            for expr, sig in self.signatures.items():
                handle = mod.get_kernel(self._library, self.symbols[expr])
                found[expr] = (handle, _parameters(sig, mod.param_info(handle, device)))
            self._handles = found
        return self._handles

    def _load(self):
        if self._library is None:
            if not torch.cuda.is_available():
                raise KernelkitError(f"{self.program.name}: compiled for sm_{self.program.arch}, but there is no CUDA "
                                     "device to launch on")
            have = "{}{}".format(*torch.cuda.get_device_capability())
            if have != self.program.arch.rstrip("af"):
                raise KernelkitError(f"{self.program.name}: compiled for sm_{self.program.arch}, but the current GPU is "
                                     f"sm_{have}; load it with arch=None (the current GPU) or arch='{have[:-1]}.{have[-1]}'")
            self._library = launcher.module().load_library(self.compiled.cubin.read_bytes())
        return launcher.module()

    @staticmethod
    def _check_sizes(sig: Signature, info) -> None:
        """The driver knows the parameters' sizes: a signature read differently from the source is caught here."""
        if info is None:  # a driver before 12.4
            return
        want = [_SIZES.get(p.code) for p in sig.params]
        got = [size for _, size in info]
        if want != got:
            raise KernelkitError(f"{sig}: kernelkit read {len(want)} parameter(s) of sizes {want} from the source, "
                                 f"but the compiled kernel has {len(got)} of sizes {got} (a macro or typedef in the "
                                 "signature?); declare the parameters with plain C types")


def _labelled_launch(launch, expr: str):
    """The launcher's ``launch`` for a kernel that prints: inside a capture, each launch runs in a bracket that
    labels its output ``[expr[grid, block]]`` (and synchronises its stream); outside one, the plain launch."""
    from .. import device_output  # only for kernels that print: a warm start imports nothing more

    def launch_labelled(handle, kernel, codes, dtypes, names, grid, block, shared_mem, stream, args):
        if not device_output.capturing():
            return launch(handle, kernel, codes, dtypes, names, grid, block, shared_mem, stream, args)
        with device_output.launch_bracket(f"{expr}[{grid}, {block}]", stream):
            return launch(handle, kernel, codes, dtypes, names, grid, block, shared_mem, stream, args)

    return launch_labelled


def _parameters(sig: Signature, info) -> List[Tuple[int, str]]:
    """(size, declaration) of each parameter: the driver's sizes (``info``), else the declared types' (a driver
    before 12.4); a parameter the source declares in a way kernelkit does not read is named by position."""
    if info is None:
        return [(_SIZES.get(p.code, 0), p.describe()) for p in sig.params]
    if len(info) != len(sig.params) or not sig.declared:
        return [(size, f"parameter {i + 1}") for i, (_, size) in enumerate(info)]
    return [(size, p.describe()) for (_, size), p in zip(info, sig.params)]


class Launch:
    """``kernel[grid, block(, shared_mem(, stream))]``: call it with the kernel's arguments."""
    __slots__ = ("_module", "_expr", "grid", "block", "shared_mem", "stream")

    def __init__(self, module: "KernelModule", expr: str, grid, block, shared_mem: int = 0, stream=None):
        self._module, self._expr = module, expr
        self.grid, self.block, self.shared_mem, self.stream = grid, block, shared_mem, stream

    def __call__(self, *args):
        build = self._module._build
        e = build.ready.get(self._expr) or build.prepare(self._expr)
        return e[0](e[1], e[2], e[3], e[4], e[5], self.grid, self.block, self.shared_mem, self.stream, args)


class Kernel:
    """One kernel of a :class:`KernelModule`, always its newest build."""

    def __init__(self, module: "KernelModule", expr: str):
        self._module, self._expr = module, expr
        self._launches: Dict[tuple, Launch] = {}

    @property
    def signature(self) -> Signature:
        return self._module._build.signatures[self._expr]

    def __getitem__(self, config) -> Launch:
        launch = self._launches.get(config)
        if launch is None:
            if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
                raise TypeError(f"{self._expr}[...]: expected [grid, block], [grid, block, shared_mem] or "
                                f"[grid, block, shared_mem, stream], got {config!r}")
            launch = Launch(self._module, self._expr, *config)
            if len(self._launches) < 64:  # configs are usually few; a sweep must not grow this without bound
                self._launches[config] = launch
        return launch

    def __call__(self, *args, grid, block, shared_mem: int = 0, stream=None):
        return Launch(self._module, self._expr, grid, block, shared_mem, stream)(*args)

    def __repr__(self) -> str:
        return f"<kernelkit kernel {self.signature}>"


class KernelModule:
    """What :func:`load_kernels` returns: the kernels of one named program as attributes (``mod.scale``)
    or by name expression (``mod["axpy<float>"]``)."""

    def __init__(self, name: str):
        self.name = name
        self._build: Optional[_Build] = None
        self._kernels: Dict[str, Kernel] = {}

    def _swap(self, build: _Build) -> None:
        self._build = build

    @property
    def kernels(self) -> Tuple[str, ...]:
        return tuple(sorted(self._build.signatures))

    @property
    def key(self) -> str:
        return self._build.program.key

    @property
    def arch(self) -> str:
        return f"sm_{self._build.program.arch}"

    @property
    def cached(self) -> bool:
        """Whether the current build came from the cache (no compile)."""
        return self._build.compiled.cached

    @property
    def cubin(self) -> Path:
        return self._build.compiled.cubin

    def __getitem__(self, expr: str) -> Kernel:
        if expr not in self._build.signatures:
            raise KeyError(f"{self.name}: no kernel {expr!r} (kernels: {', '.join(self.kernels) or 'none'}); a template "
                           "instantiation must be listed in name_expressions=")
        kernel = self._kernels.get(expr)
        if kernel is None:
            kernel = self._kernels[expr] = Kernel(self, expr)
        return kernel

    def __getattr__(self, name: str) -> Kernel:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(e.args[0]) from None

    def __dir__(self):
        return sorted(set(super().__dir__()) | {k for k in self.kernels if k.isidentifier()})

    def __repr__(self) -> str:
        sigs = ", ".join(str(s) for s in self._build.signatures.values())
        return f"<kernelkit instant kernels {self.name!r} ({self.arch}): {sigs}>"


def loaded_modules() -> Tuple[KernelModule, ...]:
    """Every instant-kernels module loaded in this process (its current build: ``module.key``)."""
    return tuple(m for m in _MODULES.values() if m._build is not None)


def _read(source: Union[str, os.PathLike], name: Optional[str]) -> Tuple[str, str, Path, str]:
    """(text, name shown in messages, directory for local includes, module name)."""
    is_path = isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                                  and source.endswith((".cu", ".cuh")) and Path(source).is_file())
    if is_path:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise KernelkitError(f"source: {path} does not exist")
        shown = nvrtc.shown(path)
        return path.read_text(), shown, path.parent, _checked_name(name or path.stem)
    if not isinstance(source, str) or not source.strip():
        raise KernelkitError("source: expected CUDA C++ text or the path of a .cu file")
    name = _checked_name(name or "kernels")
    return source, f"{name}.cu", Path.cwd(), name


def _checked_name(name) -> str:
    """A module name: letters, digits and ``_ . : -``, not starting with ``.`` or ``-`` (it names the module in
    messages and caches; a path in it must never reach the file system)."""
    if not isinstance(name, str) or not name or len(name) > 200 or name[0] in ".-" or not all(
            c.isascii() and (c.isalnum() or c in "_.:-") for c in name):
        raise KernelkitError(f"name: expected a module name of letters, digits and '_.:-' such as 'scaling' (not "
                             f"starting with '.' or '-'), got {name!r}")
    return name


def load_kernels(source: Union[str, os.PathLike], name: Optional[str] = None, *, options: Sequence[str] = (),
                 include_paths: Sequence[Union[str, os.PathLike]] = (), arch=None,
                 name_expressions: Sequence[str] = (), group=None) -> KernelModule:
    """Compile kernel-only CUDA C++ with NVRTC (in-process, cached by content) and return its kernels.

    ``source``: CUDA C++ text or a ``.cu`` path; local ``#include "..."`` headers are read (and keyed) with it.
    ``name``: the module's name (default: the file's stem, else ``"kernels"``); loading the same name again
    updates that module in place. ``options``: extra NVRTC options (``-DBLOCK=256``, ``--use_fast_math``).
    ``include_paths``: more directories for local headers. ``arch``: one arch (``"9.0"``); default the
    current GPU, which is needed unless an arch is given. ``name_expressions``: template instantiations to
    compile, e.g. ``["axpy<float>", "axpy<double>"]``, then ``mod["axpy<float>"]``. ``group``: a
    torch.distributed process group whose ranks all make this call: its rank 0 compiles (or finds the cubin),
    the others receive it and check it against their own key (README, "Multi-GPU and clusters").
    """
    return install(compile_kernels(source, name, options=options, include_paths=include_paths, arch=arch,
                                   name_expressions=name_expressions, group=group))


def compile_kernels(source: Union[str, os.PathLike], name: Optional[str] = None, *, options: Sequence[str] = (),
                    include_paths: Sequence[Union[str, os.PathLike]] = (), arch=None,
                    name_expressions: Sequence[str] = (), group=None) -> _Build:
    """:func:`load_kernels`' compile (same arguments, cache and errors), without publishing a module."""
    joining = contextlib.nullcontext()
    if group is not None:
        from ..jit import distributed

        joining = distributed.joining(group, name or "kernels")
    with joining:  # under group=, a rank whose planning fails still tells the others, so none waits for it
        text, shown, base, name = _read(source, name)
        exprs = [name_expressions] if isinstance(name_expressions, str) else list(name_expressions)
        program = nvrtc.plan(name, text, shown, base, [Path(p) for p in include_paths], options, arch, exprs)
        declared = [k for body in (text, *(h[2] for h in program.headers)) for k in nvrtc.scanned(body).kernels]
        try:
            check_expressions(declared, exprs)
        except ValueError as e:
            raise KernelkitError(f"{shown}: {e}") from None
    compiled = nvrtc.obtain(program) if group is None else distributed.obtain_program(program, group)
    try:
        signatures, symbols = bind(declared, compiled.entries, compiled.lowered)
    except ValueError as e:
        raise KernelkitError(f"{shown}: {e}") from None
    if not signatures:
        raise KernelkitError(f"{shown}: no __global__ function in the compiled program (templates need "
                             "name_expressions=; a kernel inside a disabled #if branch is not compiled)")
    return _Build(program, compiled, signatures, symbols)


def install(build: _Build) -> KernelModule:
    """Make ``build`` the current build of the module named as its program (created on first use)."""
    name = build.program.name
    module = _MODULES.get(name)
    if module is None:
        module = _MODULES[name] = KernelModule(name)
    module._swap(build)
    return module
