"""Shared test setup: one temporary directory for the whole run (removed when it passes), an isolated kernelkit
cache per process, and the `gpu` marker's skip."""
import os
import shutil
import sys
import tempfile

# Everything the run writes to the temporary directory (the kernelkit caches, pytest's tmp_path, nvcc's tmpxft
# files, torch.compile's cache, build logs) goes into one directory: pytest-xdist's workers inherit it from the
# run's first process, which removes it at the end (keeps it when a test failed, and says where).
if "KK_TEST_RUN_TMPDIR" not in os.environ:
    os.environ["KK_TEST_RUN_TMPDIR"] = tempfile.mkdtemp(prefix="kk-tests-")
    os.environ["TMPDIR"] = os.environ["KK_TEST_RUN_TMPDIR"]
    tempfile.tempdir = None  # read TMPDIR again
    _OWNS_TMPDIR = True
else:
    _OWNS_TMPDIR = False
# Before kernelkit is imported anywhere: keep tests out of the user's cache, but share one cache across
# the session so compiled objects (the torch-facing binding TUs above all) are reused between tests.
if "KERNELKIT_TEST_KEEP_CACHE" not in os.environ:
    os.environ["KERNELKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kk-test-cache-")
# The precompiled binding header (~450 MB, ~25 s of CPU) is exercised by its own test; elsewhere it would
# only make every fresh test cache build one in the background.
os.environ.setdefault("KERNELKIT_PCH", "0")
# Dtype shards change how many compiles a build counts by the machine's cores: tests that count compiles see
# one TU per file everywhere; tests/test_shards.py turns shards on and proves them equal to the whole file.
os.environ.setdefault("KERNELKIT_DTYPE_SHARDS", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_GPU = torch.cuda.is_available()


def _cuda_build_problem():
    """Why CUDA code cannot be compiled for this torch here (None if it can)."""
    from kernelkit.jit import toolchain

    try:
        toolchain.check_cuda_match("CUDA tests")
        toolchain.nvcc()
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip
        return str(e)
    return None


def pytest_sessionfinish(session, exitstatus):
    """The run's first process removes the run's temporary directory, or says where it is kept."""
    if not _OWNS_TMPDIR or hasattr(session.config, "workerinput"):
        return
    run_dir = os.environ["KK_TEST_RUN_TMPDIR"]
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"\nthe run's temporary files are kept for a look in {run_dir} (remove it when done)", file=sys.stderr)


def pytest_collection_modifyitems(config, items):
    from kernelkit import settings

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    problem = _cuda_build_problem()
    no_nvcc = pytest.mark.skip(reason=f"cannot compile CUDA here: {problem}")
    # KERNELKIT_FAST=0 runs the suite on the core alone: a test that proves a fast path has nothing to prove
    no_fast = pytest.mark.skip(reason="KERNELKIT_FAST=0: every fast path is off in this run")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(no_gpu)
        elif "cuda_build" in item.keywords and problem:
            item.add_marker(no_nvcc)
        elif item.get_closest_marker("fast_path") is not None and not settings.FAST.get():
            item.add_marker(no_fast)


@pytest.fixture
def big_gpu_memory(tmp_path_factory):
    """For tests that need tens of GB of GPU memory: runs them one at a time across pytest-xdist workers
    (a file lock in the run's shared temp root) and yields ``need(nbytes)``, which skips the test when
    the GPU has less free. Each such test returns its cached blocks to the GPU when done."""
    import filelock

    root = tmp_path_factory.getbasetemp().parent  # shared by every worker of this run
    with filelock.FileLock(str(root / "kernelkit-big-gpu-memory.lock")):
        torch.cuda.empty_cache()

        def need(nbytes: int) -> None:
            free, _ = torch.cuda.mem_get_info()
            if free < nbytes:
                pytest.skip(f"needs {nbytes / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")

        try:
            yield need
        finally:
            import gc

            gc.collect()
            torch.cuda.empty_cache()
