"""g++ flags for the host side of an nvcc compile: what nvcc would hand its host compiler for these flags."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

#: nvcc flags that only concern device code (their value, if any, is the next argument when not after '=')
_DEVICE_ONLY_WITH_VALUE = {"-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code",
                           "-Xptxas", "--ptxas-options", "-Xnvlink", "--nvlink-options", "-maxrregcount",
                           "--maxrregcount", "-t", "--threads", "-Xfatbin", "--fatbin-options",
                           "-diag-suppress", "--diag-suppress", "-ftz", "--ftz", "-prec-div", "--prec-div",
                           "-prec-sqrt", "--prec-sqrt", "-fmad", "--fmad", "--split-compile", "-split-compile",
                           "-diag-warn", "--diag-warn", "-diag-error", "--diag-error", "-x", "--x", "-Xcudafe"}
_DEVICE_ONLY = {"--use_fast_math", "-use_fast_math", "-lineinfo", "--generate-line-info", "--expt-relaxed-constexpr",
                "-expt-relaxed-constexpr", "--expt-extended-lambda", "-expt-extended-lambda", "--extended-lambda",
                "-extended-lambda", "-G", "--device-debug", "--resource-usage", "-res-usage", "--keep", "-keep",
                "--display-error-number", "-err-no", "--no-display-error-number", "-Wno-deprecated-gpu-targets",
                "--Wno-deprecated-gpu-targets", "--restrict", "-restrict", "--Wreorder", "-Wreorder",
                "--source-in-ptx", "-src-in-ptx", "--Ofast-compile=max", "-c", "--compile"}
_HOST_WITH_VALUE = {"-D", "-U", "-I", "-isystem", "-include", "--define-macro", "--undefine-macro",
                    "--include-path", "--system-include", "--pre-include"}
_LONG_TO_SHORT = {"--define-macro": "-D", "--undefine-macro": "-U", "--include-path": "-I",
                  "--system-include": "-isystem", "--pre-include": "-include"}


def host_flags(nvcc_flags: Sequence[str], cuda_home: Optional[str] = None) -> Optional[List[str]]:
    """None when a flag has no known host meaning (the caller then builds the file with nvcc as written)."""
    out: List[str] = []
    args = list(nvcc_flags)
    i = 0
    while i < len(args):
        f = args[i]
        key, eq, value = f.partition("=")
        if f in _DEVICE_ONLY or key in _DEVICE_ONLY or key in _DEVICE_ONLY_WITH_VALUE and eq:
            i += 1
        elif f in _DEVICE_ONLY_WITH_VALUE:
            i += 2
        elif key in ("-Xcompiler", "--compiler-options"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else None)
            if value is None:
                return None
            out += [v for v in value.split(",") if v]
            i += 1 if eq else 2
        elif f in _HOST_WITH_VALUE:
            if i + 1 >= len(args):
                return None
            out += [_LONG_TO_SHORT.get(f, f), args[i + 1]]
            i += 2
        elif key in _LONG_TO_SHORT and eq:
            out += [_LONG_TO_SHORT[key], value]
            i += 1
        elif f[:2] in ("-D", "-U", "-I") or f.startswith(("-std=", "-O", "-isystem", "-include")) or f in ("-g", "-w"):
            out.append(f)
            i += 1
        elif f in ("-std", "--std") and i + 1 < len(args):
            out.append(f"-std={args[i + 1]}")
            i += 2
        elif key == "--std" and eq:
            out.append(f"-std={value}")
            i += 1
        elif f in ("-m64", "--machine=64"):
            out.append("-m64")
            i += 1
        else:
            return None
    return _implicit(cuda_home) + out


def _implicit(cuda_home: Optional[str]) -> List[str]:
    """What nvcc adds to every host compile: the CUDA headers (cccl as system headers), -m64, -Wno-psabi."""
    home = cuda_home or _cuda_home()
    target = os.path.join(home, "targets", "x86_64-linux", "include")
    inc = target if os.path.isdir(target) else os.path.join(home, "include")
    out = [f"-I{inc}"]
    cccl = os.path.join(inc, "cccl")
    if os.path.isdir(cccl):
        out += ["-isystem", cccl]
    return out + ["-m64", "-Wno-psabi"]


def _cuda_home() -> str:
    from ... import toolchain  # torch-importing: only where a build is being planned

    home = toolchain.facts()["cuda_home"]
    if not home:
        home = os.path.dirname(os.path.dirname(toolchain.nvcc()))
    return str(home)
