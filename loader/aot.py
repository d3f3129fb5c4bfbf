"""Ahead-of-time builds of the cards with torch's ``CUDAExtension``/``BuildExtension``, for setuptools and
``python -m kernelkit.aot`` (finding them at run time is ``kernelkit.jit.prebuilt``).

Command line::

    python -m kernelkit.aot --out DIR [--arch 8.0,9.0] [--kernels-dir D] [--jit] [OP ...]

``--jit`` fills DIR from kernelkit's own JIT builds (reusing the local cache) instead of BuildExtension.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import KernelkitError
from .jit import build as _build
from .jit import fastcall, toolchain
from .jit.cards import all_cards, find
from .jit.plan import plan_card
from .jit.prebuilt import FORMAT, MANIFEST, key_ldflags, portable_fingerprint, source_key, split_flags, target_archs
from .jit.progress import say
from .jit.sources import sha256_file

# torch's BuildExtension puts its half-operator switches on every nvcc line; the JIT adds them only to a
# .cu that includes torch. Undo them for torch-free device code so both builds compile the same program.
_UNDO_TORCH_NVCC = [f"-U{f[2:]}" for f in ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                                            "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__")]

# ------------------------------------------------------------------------------------ building (AOT)
def plan(ops: Optional[Sequence[str]] = None, arch=None, kernels_dir=None) -> List[Tuple[object, object]]:
    """(card, target) for each card, planned exactly as ``kernelkit.load`` plans it; all cards and the
    fast call module (``"fastcall"``, card None) by default."""
    names = list(ops) if ops else sorted(all_cards(kernels_dir)) + [fastcall.AOT_NAME]
    out = []
    for name in names:
        if name == fastcall.AOT_NAME:  # kernelkit.ops' call path: prebuilt too, so no compiler is ever needed
            out.append((None, fastcall.target()))
            continue
        card = find(name, kernels_dir)
        out.append((card, plan_card(card, arch, [], [], [], [], dtype_shards=False)))
    return out


def _compile_args(kind: str, flags: Sequence[str], archs: Sequence[str]) -> Dict[str, List[str]]:
    """BuildExtension's per-compiler flags for units of one kind compiled with ``flags`` (the JIT's,
    without include paths) for ``archs``."""
    if kind == "cpp":
        return {"cxx": list(flags) + ["-g0"], "nvcc": []}  # -g0: setuptools adds Python's -g
    nvcc = list(flags)
    if not any(f in toolchain.torch_nvcc_flags() for f in nvcc):
        nvcc += _UNDO_TORCH_NVCC
    return {"cxx": [], "nvcc": nvcc + [x for a in archs for x in ("-gencode", f"arch=compute_{a.split('_', 1)[1]},code={a}")]}


def extension(target, prefix: str = ""):
    """A torch ``CUDAExtension`` (``CppExtension`` for a CPU card) compiling the same TUs as the JIT
    (the card's sources and the same generated binding TU) with the same flags where they matter, and
    the manifest to write next to it (``ext.kernelkit_manifest``). An extension has one flag set per
    compiler: units planned with other flags (a CPU card's -O3 device .cpp next to its -O2 binding) are
    compiled separately by :class:`BuildPrebuilt` (``ext.kernelkit_extra``) and linked in."""
    ce = toolchain.cpp_extension()
    archs = target_archs(target)
    incs: Dict[str, None] = {}
    groups: Dict[Tuple[str, Tuple[str, ...]], List[str]] = {}
    for u in reversed(target.units):  # the binding TU (planned last) sets the extension's C++ flags
        inc, _, flags = split_flags(u.flags)
        incs.update(dict.fromkeys(inc))
        groups.setdefault((u.kind, tuple(flags)), []).insert(0, str(u.path))
    main: Dict[str, Tuple[str, ...]] = {}
    for kind, flags in groups:
        main.setdefault(kind, flags)
    link = [f for f in key_ldflags(target.ldflags) if f != "-shared" and not f.startswith("-l")]
    manifest = _manifest(target, "torch.utils.cpp_extension.BuildExtension")
    entry = f"{target.name}-{manifest['source_key'][:16]}"
    compile_args = {"cxx": _compile_args("cpp", main.get("cpp", ()), archs)["cxx"],
                    "nvcc": _compile_args("cu", main["cu"], archs)["nvcc"] if "cu" in main else []}
    sources = [src for (kind, flags), srcs in groups.items() if main[kind] == flags for src in srcs]
    make = ce.CUDAExtension if target.with_cuda else ce.CppExtension
    ext = make(f"{prefix}{entry}.kk_{target.name}", sources, include_dirs=list(incs), extra_link_args=link,
               extra_compile_args=compile_args)
    if not target.pymodule:  # a C++ program (examples/cpp) loads cards without Python: no libtorch_python
        ext.libraries = [lib for lib in ext.libraries if lib != "torch_python"]
    ext.kernelkit_extra = [(srcs, _compile_args(kind, flags, archs))
                           for (kind, flags), srcs in groups.items() if main[kind] != flags]
    ext.kernelkit_manifest = manifest
    return ext


def _manifest(target, built_with: str) -> dict:
    return {"format": FORMAT, "name": target.name, "source_key": source_key(target),
            "archs": target_archs(target), "jit_key": target.key, "units": [u.display for u in target.units],
            "fingerprint": portable_fingerprint(), "built_with": built_with}


def _write_manifest(info: dict, so: Path, seconds: float) -> None:
    manifest = {**info, "so": so.name, "sha256": sha256_file(so), "created": time.time(),
                "build_seconds": round(seconds, 3)}
    (so.parent / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _build_ext_class():
    """BuildExtension that writes each library's manifest (its sha256 and source key) next to it."""
    ce = toolchain.cpp_extension()

    class BuildPrebuilt(ce.BuildExtension):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("no_python_abi_suffix", True)  # a plain kk_<op>.so, for C++ consumers too
            super().__init__(*args, **kwargs)

        def get_source_files(self):  # for egg_info/sdist: the generated binding TUs live in the cache
            return [s for s in super().get_source_files() if not os.path.isabs(s)]

        def build_extension(self, ext):
            t0 = time.perf_counter()
            say(f"AOT: building {ext.name} ...")
            for sources, args in getattr(ext, "kernelkit_extra", []):  # (self.compiler.compile is torch's here)
                ext.extra_objects = list(ext.extra_objects or []) + self.compiler.compile(
                    sources, output_dir=self.build_temp, include_dirs=ext.include_dirs, extra_postargs=args)
            super().build_extension(ext)
            info = getattr(ext, "kernelkit_manifest", None)
            if info is None:
                return
            so = Path(self.get_ext_fullpath(ext.name))
            seconds = time.perf_counter() - t0
            _write_manifest(info, so, seconds)
            say(f"AOT: {info['name']} built in {seconds:.1f} s -> {so.parent}")

    return BuildPrebuilt


def setup_kwargs(ops=None, arch=None, kernels_dir=None) -> dict:
    """What setup.py passes to ``setup()`` for ``KERNELKIT_AOT=1``: the extensions (installed under
    ``kernelkit/prebuilt/``) and the build command."""
    exts = [extension(t, prefix="kernelkit.prebuilt.") for _, t in plan(ops, arch, kernels_dir)]
    return {"ext_modules": exts, "cmdclass": {"build_ext": _build_ext_class()}}


def build_dir(out, ops=None, arch=None, kernels_dir=None, build_temp=None, verbose=False) -> List[Path]:
    """Build the cards into the prebuilt directory ``out`` (usable with KERNELKIT_PREBUILT_PATH);
    returns the built entries. The compilers' output (every ninja line, torch's header warnings) goes to
    ``<build_temp>/aot.log``, and to the terminal with ``verbose``; a failure shows its tail."""
    from setuptools import Distribution

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    exts = [extension(t) for _, t in plan(ops, arch, kernels_dir)]
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    dist = Distribution({"name": "kernelkit-prebuilt", "ext_modules": exts,
                         "cmdclass": {"build_ext": _build_ext_class()}})
    dist.script_name = "kernelkit-aot"
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(out)
    cmd.build_temp = str(build_temp or Path(tempfile.gettempdir()) / f"kernelkit-aot-{os.getuid()}")
    log = Path(cmd.build_temp) / "aot.log"
    with contextlib.nullcontext() if verbose else _stdout_to(log):
        dist.run_command("build_ext")
    if not verbose:
        say(f"AOT: the compilers' output is in {log} (--verbose: on the terminal)")
    return [out / e.name.split(".")[0] for e in exts]


@contextlib.contextmanager
def _stdout_to(log: Path):
    """File descriptor 1 into ``log`` (torch's BuildExtension runs ninja with its output on fd 1, always), the
    log's tail shown if the build fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    saved = os.dup(1)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
    try:
        yield
    except BaseException:  # fd 2 was never redirected: the tail goes there
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail) + f"\n(the whole compiler output: {log})", file=sys.stderr)
        raise
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def export_jit(out, ops=None, arch=None, kernels_dir=None) -> List[Path]:
    """Fill the prebuilt directory ``out`` from kernelkit's own JIT builds (built now, or reused from the
    cache): the cheap way to share a cache with a fleet read-only, at no extra compile."""
    import shutil

    out = Path(out).resolve()
    entries = []
    for _, target in plan(ops, arch, kernels_dir):
        so, _, seconds = _build.build(target)
        info = _manifest(target, "kernelkit JIT")
        entry = out / f"{target.name}-{info['source_key'][:16]}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=out))
        lib = tmp / f"kk_{target.name}.so"
        shutil.copyfile(so, lib)
        os.chmod(lib, 0o755)
        _write_manifest(info, lib, seconds)
        os.chmod(tmp, 0o755)
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
        entries.append(entry)
    return entries


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernelkit.aot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ops", nargs="*", help="card names, and 'fastcall' for kernelkit.ops' call path (default: all)")
    p.add_argument("--out", required=True, help="prebuilt directory to write (then set KERNELKIT_PREBUILT_PATH)")
    p.add_argument("--arch", help="CUDA archs, e.g. '8.0,9.0' (default: KERNELKIT_ARCH, TORCH_CUDA_ARCH_LIST, "
                                  "the current GPU, else 9.0)")
    p.add_argument("--kernels-dir", help="directory of cards (default: KERNELKIT_PATH + built-in)")
    p.add_argument("--build-temp", help="object directory (kept for incremental rebuilds)")
    p.add_argument("--jit", action="store_true", help="copy kernelkit's own JIT builds (reusing the cache) "
                                                     "instead of building with torch's BuildExtension")
    p.add_argument("--verbose", action="store_true", help="the compilers' output on the terminal (else in "
                                                         "<build-temp>/aot.log)")
    args = p.parse_args(argv)
    ops = args.ops or None
    try:
        if args.jit:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            entries = export_jit(args.out, ops, args.arch, args.kernels_dir)
        else:
            entries = build_dir(args.out, ops, args.arch, args.kernels_dir, args.build_temp, args.verbose)
        for entry in entries:
            print(entry)
    except KernelkitError as e:
        print(f"kernelkit.aot: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
