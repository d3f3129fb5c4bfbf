"""The split's differential corpus (fixtures/split_corpus: torch-style extensions in the shapes real repositories
use, each with a scripted list of the edits people make) at the text level, without a compiler: every step
applies, every file gets the decision it is known to get, and every edit inside device code (a constant, added
lines, a local, a new __device__ helper, a compile error and its fix) leaves the host TU the same but for its
line numbers, so it compiles device code only. The GPU differential against torch's own builds of every step is
benchmarks/split_corpus.py (tests/test_split_gpu.py runs it on part of the corpus)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernelkit.jit import sources
from kernelkit.jit.fast import torch_headers
from kernelkit.jit.fast.split import Split, Unsplittable, local_headers, split_source

ROOT = Path(__file__).parent / "fixtures" / "split_corpus"
sys.path.insert(0, str(ROOT))
from corpus import KINDS, cases, texts_after  # noqa: E402

CASES = cases(ROOT)
#: files built as written, and why (every other torch-including .cu of the corpus is split)
AS_WRITTEN = {
    "counter_macro/counter.cu": "__COUNTER__",
    "device_lambda_ext/lambda.cu": "",  # a __device__ lambda (the grammar cannot read it)
    "include_guard_xmacro/xmacro.cu": "the parser could not read",  # an X-macro header expands to declarations
    "isystem_cudacc/sys_scale.cu": "__CUDACC__ tested outside device code",  # g++ would take the other branch
    "thrust_cub_host/thrust_cub.cu": "thrust called from host code",
    "xmacro_kernels_launch/macro_kernels.cu": "the parser could not read",
}
#: edits that touch device code only: the host TU must stay the same but for its line numbers
DEVICE_EDITS = ("constant", "add_line", "remove_line", "add_local", "add_helper", "break", "fix")
#: (case, step) whose edit host code sees, however device-like its kind, and why
HOST_VISIBLE = {
    ("define_in_kernel", 0): "a #define in a kernel body, which host code after it uses",
    ("functor_enum_default", 0): "a kernel parameter's default argument, which the host's launch uses",
    ("host_device_constexpr", 0): "a __host__ __device__ function, compiled for the host too",
    ("host_device_constexpr", 3): "a new __host__ __device__ helper that host code calls",
}


def _include_dirs(case):
    flags = [*case.load.get("extra_cuda_cflags", []), *[f"-I{p}" for p in case.load.get("extra_include_paths", [])]]
    search = sources.include_search(flags, True)
    return [*search.quote, *search.angle]


def _split(folder: Path, rel: str, text: str, case):
    path = folder / rel
    dirs = _include_dirs(case)
    _, uses_torch = sources.scan_includes(text, path.parent, dirs, kind="cu")
    if not uses_torch:
        return None
    return split_source(text, str(path), local_headers(dirs), torch_headers.heavy)


def _cu_files(case):
    return [s for s in case.sources if s.endswith(".cu")]


def test_the_corpus_is_large_and_covers_every_edit_kind():
    files = sum(len(c.sources) for c in CASES.values()) + len(list((ROOT.parent / "torch_cu").glob("*.cu")))
    assert len(CASES) >= 45 and files >= 50
    kinds = {s.kind for c in CASES.values() for s in c.steps}
    assert kinds >= set(KINDS) - {"remove_line"}, set(KINDS) - kinds


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_step_applies_and_says_what_it_expects(name):
    case = CASES[name]
    assert case.construct and case.steps and case.run is not None
    for i, step in enumerate(case.steps):
        texts = texts_after(ROOT / name, case, i)
        if step.expect == "error":
            assert step.error_file in texts and 0 < step.error_line <= len(texts[step.error_file].splitlines())
    assert case.steps[-1].kind == "revert" or all(s.kind != "revert" for s in case.steps)


@pytest.mark.parametrize("name", sorted(CASES))
def test_decisions(name):
    case = CASES[name]
    for rel in _cu_files(case):
        result = _split(ROOT / name, rel, (ROOT / name / rel).read_text(), case)
        if result is None:
            continue  # includes no torch (a torch-free .cu of a .cu + .cpp pair, framework.h's #ifndef __CUDACC__)
        key = f"{name}/{rel}"
        if key in AS_WRITTEN:
            assert isinstance(result, Unsplittable) and AS_WRITTEN[key] in result.reason, (key, result)
        else:
            assert isinstance(result, Split), (key, result)


def _host_without_numbers(result) -> str:
    return result.host.without_line_numbers()


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_code_edits_keep_the_host_tu_but_for_its_line_numbers(name):
    case = CASES[name]
    checked = 0
    for i, step in enumerate(case.steps):
        if step.kind not in DEVICE_EDITS or (name, i) in HOST_VISIBLE:
            continue
        before, after = texts_after(ROOT / name, case, i - 1), texts_after(ROOT / name, case, i)
        edited = {f for f, _, _ in step.edits}
        for rel in _cu_files(case):
            a, b = _split(ROOT / name, rel, before[rel], case), _split(ROOT / name, rel, after[rel], case)
            if not isinstance(a, Split) or not isinstance(b, Split) or not (edited & ({rel} | set(_local(a, name)))):
                continue
            assert _host_without_numbers(a) == _host_without_numbers(b), f"{name} step {i} ({step.kind}): {rel}"
            checked += 1
    if any(isinstance(_split(ROOT / name, r, (ROOT / name / r).read_text(), case), Split) for r in _cu_files(case)):
        assert checked or not any(s.kind in DEVICE_EDITS for s in case.steps)


def _local(result, name):
    """The case's headers a split wrote into its TUs, relative to the case folder."""
    folder = (ROOT / name).resolve()
    return [str(Path(h).relative_to(folder)) for h in result.headers if Path(h).is_relative_to(folder)]


def test_torch_steps_built_apart_each_write_their_sources_into_a_folder_of_their_own(tmp_path, monkeypatch):
    """benchmarks/split_corpus.py --torch-apart: torch_build.py writes a step's texts into its build directory's
    parent (src/); steps built side by side must not share it, or one step compiles another's text."""
    import importlib.util
    import threading

    spec = importlib.util.spec_from_file_location("kk_split_corpus_bench",
                                                  Path(__file__).parents[1] / "benchmarks" / "split_corpus.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = {}

    def fake_run_torch(root, name, out, steps, build, slots):
        seen[steps[0]] = build.parent / "src"  # where torch_build.py would write this step's texts
        return {steps[0]: {"built": True}}

    monkeypatch.setattr(bench, "_run_torch", fake_run_torch)
    rows = bench._run_torch_apart(ROOT, "launch_forms", tmp_path, [-1, 0, 1, 2], tmp_path / "torch_build" / "c",
                                  threading.BoundedSemaphore(4))
    assert sorted(rows) == [-1, 0, 1, 2]
    assert len(set(seen.values())) == 4, seen
