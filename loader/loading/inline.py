"""``load_inline(name, cuda=..., cpp=...)``: kernelkit's inline form, returning a :class:`Library`.

One behaviour per source, whatever the keywords: code written for torch's loader (a ``PYBIND11_MODULE`` or
``TORCH_LIBRARY`` block of its own) is built and linked the torch way, as ``cpp_sources``/``cuda_sources``
would be; kernelkit's own shapes (``KERNELKIT_LIBRARY``, ``functions=``) are built kernelkit's way."""
from __future__ import annotations

from typing import Any, Dict

from ..jit import plan, syntax
from ..jit.distributed import joining
from . import arguments
from .opening import open_library


def load(name: str, args: Dict[str, Any]):
    """The library of ``args`` (checked by :func:`arguments.check_inline`)."""
    cuda, cpp = args.get("cuda"), args.get("cpp")
    if cpp:
        plan.refuse_device_code(cpp, "cpp", instead="cuda=")
    flags = arguments.build_flags(args)
    with joining(args.get("group"), name):
        blocks = syntax.macro_blocks(f"{cpp or ''}\n{cuda or ''}", ["PYBIND11_MODULE", "TORCH_LIBRARY"])
        if blocks:
            python_module = bool(args.get("functions")) or any(b.macro == "PYBIND11_MODULE" for b in blocks)
            target = plan.plan_torch_inline(name, cpp or None, cuda or None, args.get("functions"),
                                            arch=args.get("arch"), implicit_main=False,
                                            gil_not_used=bool(args.get("gil_not_used")),
                                            is_python_module=python_module, **flags)
        else:
            target = plan.plan_inline(name, cuda, cpp, plan.function_map(args.get("functions")), args.get("arch"),
                                      flags["extra_cflags"], flags["extra_cuda_cflags"], flags["extra_ldflags"],
                                      flags["extra_include_paths"], gil_not_used=bool(args.get("gil_not_used")))
    return open_library(target, None, {}, True, args.get("group"))
