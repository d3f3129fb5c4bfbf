"""torch-style extensions: ``load(name, sources, ...)`` and ``load_inline(name, cpp_sources, ...)`` with
torch.utils.cpp_extension's arguments and results, each source its own cached unit."""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Dict, List

from .. import settings
from ..jit import fast, plan
from ..jit.distributed import joining
from ..jit.sources import resolved
from . import arguments
from .opening import open_extension


def source_paths(sources) -> List[Path]:
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not items:
        raise ValueError("sources: expected at least one source file")
    for s in items:
        if not isinstance(s, (str, os.PathLike)):
            raise TypeError(f"sources: expected file paths, got {s!r:.80}")
    return resolved(os.path.expanduser(s) for s in items)  # plan_extension says which ones do not exist


def load(name: str, args: Dict[str, Any]):
    python_module = arguments.option(args, "is_python_module", True)
    group, do_load = args.get("group"), arguments.option(args, "load", True)
    if group is not None:  # a rank whose planning fails still joins the exchange, so the others raise too
        with joining(group, str(name)):
            target = plan.plan_extension(str(name), _checked_paths(args), **_options(args, python_module))
        return open_extension(target, python_module, args.get("build_directory"), do_load, group)
    make_plan = functools.partial(plan.plan_extension, str(name), _checked_paths(args), **_options(args, python_module))
    return _recalled_or_planned(make_plan, python_module, args.get("build_directory"), do_load)


def _recalled_or_planned(make_plan, python_module: bool, build_directory, do_load: bool):
    """The cached library of the plan recorded for this call when nothing it read has changed, else the full
    plan's build (which records the plan for the next process). KERNELKIT_FAST=off: always the full plan."""
    target = make_plan(use_record=settings.fast_path("records"))
    if fast.recalled(target):
        result = open_extension(target, python_module, build_directory, do_load, cached_only=True)
        if result is not None:
            return result
        target = make_plan()  # its build is gone: plan it to build it
    return open_extension(target, python_module, build_directory, do_load)


def _checked_paths(args: Dict[str, Any]) -> List[Path]:
    if arguments.option(args, "is_python_module", True) and args.get("is_standalone"):
        raise ValueError("is_python_module and is_standalone are mutually exclusive (pass "
                         "is_python_module=False with is_standalone=True)")
    return source_paths(args["sources"])


def _options(args: Dict[str, Any], python_module: bool) -> Dict[str, Any]:
    return dict(arch=args.get("arch"), with_cuda=args.get("with_cuda"), is_python_module=python_module,
                is_standalone=bool(args.get("is_standalone")), **arguments.build_flags(args))


def load_inline(name: str, args: Dict[str, Any]):
    if args.get("cpp_sources") is None:
        raise TypeError("load_inline() needs source code: cpp_sources (torch's form: name, cpp_sources, "
                        "cuda_sources, ...) or kernelkit's cuda=/cpp= keywords")
    python_module, group = arguments.option(args, "is_python_module", True), args.get("group")
    make_plan = functools.partial(
        plan.plan_torch_inline, name, args.get("cpp_sources"), args.get("cuda_sources"), args.get("functions"),
        with_pytorch_error_handling=arguments.option(args, "with_pytorch_error_handling", True),
        no_implicit_headers=bool(args.get("no_implicit_headers")), gil_not_used=bool(args.get("gil_not_used")),
        arch=args.get("arch"), with_cuda=args.get("with_cuda"), is_python_module=python_module,
        **arguments.build_flags(args))
    if group is not None:
        with joining(group, str(name)):
            target = make_plan()
        return open_extension(target, python_module, args.get("build_directory"), True, group)
    return _recalled_or_planned(make_plan, python_module, args.get("build_directory"), True)
