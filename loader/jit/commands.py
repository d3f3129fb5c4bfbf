"""``compile_commands.json``: each translation unit kernelkit compiled, with the command it ran, for clangd.

The build core calls ``remember`` for each TU it compiles (a record under the object's key, so that ``kernelkit
ide`` finds the command of every TU of a cached library later) and ``after_build`` after each build, which keeps
the database of ``KERNELKIT_COMPILE_COMMANDS`` current: so the writing lives here, in the core, too. The database
keeps nvcc's commands as they ran; clang's driver does not know some of nvcc's options, so a ``.clangd`` next to
the database removes those and adds what nvcc implies (the GPU arch, the toolkit, CUDA 13's ``include/cccl``),
which clangd applies to every file under that directory.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from .. import replace_file, settings
from . import cache

log = logging.getLogger("kernelkit")

FORMAT = 1  # the record's layout
DATABASE = "compile_commands.json"
CLANGD = ".clangd"
MARK = "# written by kernelkit (kernelkit ide, KERNELKIT_COMPILE_COMMANDS): rewritten with the database"
#: nvcc's options that clang's driver does not know. Each is removed (its ``=value`` form too); a value given as the
#: next argument (``-gencode arch=...``, ``-Xcompiler -fPIC``) is left as a positional argument, which clangd drops,
#: or a flag clang knows.
NVCC_ONLY = (
    "-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code", "-Xcompiler",
    "--compiler-options", "-Xptxas", "--ptxas-options", "-Xnvlink", "--nvlink-options", "-Xcudafe",
    "--expt-relaxed-constexpr", "-expt-relaxed-constexpr", "--expt-extended-lambda", "-expt-extended-lambda",
    "--extended-lambda", "-extended-lambda", "-lineinfo", "--generate-line-info", "-use_fast_math",
    "--use_fast_math", "--ftz", "-ftz", "--prec-div", "-prec-div", "--prec-sqrt", "-prec-sqrt", "--fmad", "-fmad",
    "-rdc", "--relocatable-device-code", "-dc", "--device-c", "--keep", "--keep-dir", "--threads", "-split-compile",
    "--split-compile", "--Ofast-compile", "--diag-suppress", "-diag-suppress", "--default-stream",
    "-default-stream", "--display-error-number", "-forward-unknown-to-host-compiler", "-ccbin", "--compiler-bindir",
    "-maxrregcount", "--maxrregcount", "-res-usage", "--resource-usage", "--source-in-ptx", "-src-in-ptx",
)
_ARCH = re.compile(r"(?:code|arch)=(?:sm|compute)_(\w+)|^-?-(?:arch|gpu-architecture)=(?:sm|compute)_(\w+)")


# ------------------------------------------------------------------------------------------- records
def remember(unit, command: List[str], made: dict) -> None:
    """Keep the command the core runs on ``unit`` (a split .cu's: the one that builds it as written, whose flags
    its device TU compiles with)."""
    try:
        directory = os.getcwd()
    except OSError:  # the process's directory was removed: the command names absolute paths anyway
        directory = str(unit.path.parent)
    cache.write_record("commands", unit.key, {
        "format": FORMAT, "file": str(unit.path), "display": unit.display, "directory": directory,
        "arguments": list(command), "split": bool(made.get("split"))})


def entry(key: str) -> Optional[Dict[str, object]]:
    """The database entry of the TU whose object has ``key`` (None: no command recorded for it)."""
    record = cache.read_record("commands", key)
    if record.get("format") != FORMAT:
        return None
    return {"directory": record["directory"], "file": record["file"], "arguments": record["arguments"]}


def entries(keys: Iterable[str]) -> List[Dict[str, object]]:
    """The entries of the TUs with these object keys, one per file (a card's dtype shards are one file)."""
    found: Dict[str, Dict[str, object]] = {}
    for key in keys:
        e = entry(key)
        if e is not None:
            found.setdefault(str(e["file"]), e)
    return list(found.values())


def after_build(target) -> None:
    """Where KERNELKIT_COMPILE_COMMANDS names a directory, bring its database up to date with ``target``'s TUs."""
    where = settings.COMPILE_COMMANDS.get()
    if where is None:
        return
    try:
        write(Path(where), entries(u.key for u in target.units))
    except OSError as e:  # an editor's convenience never fails a build
        log.warning("kernelkit: could not write %s into %s (KERNELKIT_COMPILE_COMMANDS): %s", DATABASE, where, e)


# ------------------------------------------------------------------------------------------- the files
def write(out: Path, new: Sequence[Dict[str, object]]) -> List[str]:
    """Merge ``new`` into ``out``'s database (an entry for the same file is replaced; one whose file is gone is
    dropped) and rewrite the ``.clangd`` beside it. Returns notes for the user (a .clangd kernelkit did not write)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / DATABASE
    files = {str(e["file"]) for e in new}
    kept = [e for e in _read(path) if e.get("file") not in files and Path(str(e.get("file"))).exists()]
    merged = kept + list(new)
    replace_file.write(path, json.dumps(merged, indent=1) + "\n")
    os.chmod(path, 0o644)  # the user's project, not the cache: readable like their other files
    return _write_clangd(out, merged)


def _read(path: Path) -> List[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def _write_clangd(out: Path, merged: Sequence[Dict[str, object]]) -> List[str]:
    config = clangd_config(merged)
    path = out / CLANGD
    if config is None:
        return []
    if path.exists() and not path.read_text(errors="replace").startswith(MARK):
        return [f"{path} is not kernelkit's: left as it is. For nvcc's commands, clangd needs this in it:\n{config}"]
    replace_file.write(path, config)
    os.chmod(path, 0o644)
    return []


def clangd_config(merged: Sequence[Dict[str, object]]) -> Optional[str]:
    """The ``.clangd`` that lets clang's driver take the database's nvcc commands (None: it has none)."""
    nvcc = [list(map(str, e["arguments"])) for e in merged if _is_nvcc(e)]
    if not nvcc:
        return None
    remove = sorted({_pattern(a) for args in nvcc for a in args[1:] if _pattern(a)})
    add = [*_archs(nvcc)[:1], *_toolkit_flags(nvcc[0]), "-Wno-unknown-cuda-version",
           "-Wno-unused-command-line-argument"]
    return (f"{MARK}\nCompileFlags:\n  Remove: [{', '.join(map(_yaml, remove))}]\n"
            f"  Add: [{', '.join(map(_yaml, add))}]\n")


def _is_nvcc(e: Dict[str, object]) -> bool:
    return any(Path(str(a)).name == "nvcc" for a in list(e["arguments"])[:3])  # after a launcher (ccache) too


def _pattern(arg: str) -> Optional[str]:
    """The ``Remove`` entry that takes ``arg`` out, if it is one of nvcc's options clang lacks."""
    name, eq, _ = arg.partition("=")
    if name not in NVCC_ONLY:
        return None
    return f"{name}=*" if eq else name


def _archs(commands: Sequence[List[str]]) -> List[str]:
    """``--cuda-gpu-arch=sm_XX`` for the archs the commands build for, in their order."""
    found: List[str] = []
    for args in commands:
        for a in args:
            m = _ARCH.search(a)
            arch = m and (m.group(1) or m.group(2))
            if arch and f"--cuda-gpu-arch=sm_{arch}" not in found:
                found.append(f"--cuda-gpu-arch=sm_{arch}")
    return found


def _toolkit_flags(args: List[str]) -> List[str]:
    """Where nvcc's toolkit is, for clang (``--cuda-path``), and the include dir nvcc adds itself (CUDA 13's
    ``include/cccl``, where thrust and cub moved)."""
    nvcc = next(a for a in args if Path(a).name == "nvcc")
    root = Path(nvcc).resolve().parent.parent
    flags = [f"--cuda-path={root}"] if (root / "include" / "cuda.h").is_file() else []
    return flags + ([f"-isystem{root / 'include' / 'cccl'}"] if (root / "include" / "cccl").is_dir() else [])


def _yaml(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML string
