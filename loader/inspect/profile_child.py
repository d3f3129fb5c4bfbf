"""The process ``kernelkit.profile`` runs under Nsight Compute: ``python -m kernelkit.inspect.profile_child SPEC``.

SPEC (JSON, written by :mod:`.profiling`) names the op, the libraries to load first, the GPU and the file of
the arguments. The op is called once to warm up (lazy module loading, first-call work), then once between
``cudaProfilerStart`` and ``cudaProfilerStop``: ncu runs with ``--profile-from-start off``, so only that call's
kernels are profiled. What was run, or the error, is written to the spec's result file.
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Tuple


def _preload(entries) -> None:
    """Load the builds the op lives in, so its namespace exists in this process."""
    import torch

    from kernelkit import loading
    from kernelkit.jit.library import Library

    for entry in entries:
        if entry["kind"] == "card":
            options = dict(entry["options"])
            lib = loading.load(options.pop("name"), **options)
            if lib.key != entry["key"]:
                raise RuntimeError(f"card {lib.name} changed since the profiling process's parent loaded it (build "
                                   f"{entry['key'][:12]}, now {lib.key[:12]}): reload it there (kernelkit.refresh()) "
                                   "and profile again")
        elif entry["kind"] == "library":
            Library(entry["name"], entry["key"], Path(entry["path"]), pymodule=None, cached=True, build_seconds=0.0)
        elif entry["kind"] == "torch_library":
            torch.ops.load_library(entry["path"])


def _card(call: dict, given: dict, device) -> Tuple[Callable, tuple, str]:
    """A card's op, and its inputs: the ones given, else made by its spec at ``size``/``dtype``."""
    import torch

    from kernelkit.harness import target

    lib = target.load(call["card"], call["kernels_dir"])
    spec = lib.spec
    op = target.card_op(spec, lib)
    if given["args"]:
        return op, tuple(given["args"]), spec.name
    shape = tuple(call["size"] or spec.bench_sizes[-1])
    cuda_dtypes = spec.dtypes_for("cuda")
    dtype = getattr(torch, call["dtype"]) if call["dtype"] else (
        spec.bench_dtype if spec.bench_dtype in cuda_dtypes else cuda_dtypes[0])
    gen = torch.Generator(device=device).manual_seed(0)
    args = tuple(spec.make_inputs(shape, dtype=dtype, device=device, generator=gen))
    shown = "x".join(map(str, shape))
    return op, args, f"{spec.name} ({shown}, {str(dtype).replace('torch.', '')})"


def _torch_op(call: dict):
    import torch

    try:
        packet = getattr(getattr(torch.ops, call["ns"]), call["name"])
    except (AttributeError, RuntimeError):
        try:  # a namespace a Python package registers on import (torchvision, ...)
            importlib.import_module(call["ns"])
            packet = getattr(getattr(torch.ops, call["ns"]), call["name"])
        except (ImportError, AttributeError, RuntimeError):
            raise RuntimeError(f"the op {call['ns']}::{call['name']} does not exist in a fresh process: pass a "
                               "function, defined at the top level of a module, that imports what defines it and "
                               "calls it") from None
    return getattr(packet, call["overload"]) if call["overload"] else packet


def _function(call: dict):
    found: Any = importlib.import_module(call["module"])
    for part in call["path"].split("."):
        found = getattr(found, part)
    return found


def _extension(call: dict):
    from kernelkit.jit.library import import_extension

    return getattr(import_extension(call["import_name"], call["path"]), call["attr"])


def _prepare(spec: dict) -> Tuple[Callable, tuple, dict, str]:
    """(op, args, kwargs, label) as the spec says."""
    import torch

    for p in spec["sys_path"]:  # where the parent found the op's module
        if p not in sys.path:
            sys.path.append(p)
    torch.cuda.set_device(spec["device"])
    device = torch.device("cuda", spec["device"])
    given: Dict[str, Any] = {"args": [], "kwargs": {}}
    if spec["inputs"]:
        given = torch.load(spec["inputs"], weights_only=False)  # our own file, written by the parent
    _preload(spec["preload"])
    call = spec["call"]
    if call["kind"] == "card":
        op, args, label = _card(call, given, device)
        return op, args, given["kwargs"], label
    op = {"op": _torch_op, "function": _function, "extension": _extension}[call["kind"]](call)
    return op, tuple(given["args"]), given["kwargs"], ""


def main(argv) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    result: Dict[str, Any] = {}
    try:
        import torch

        op, args, kwargs, result["label"] = _prepare(spec)
        op(*args, **kwargs)  # warm-up: module loading, autotuning, allocations happen outside the profiled call
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        op(*args, **kwargs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    except Exception as e:  # noqa: BLE001 - whatever the op raises is the parent's message
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {e}"
    Path(spec["result"]).write_text(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
