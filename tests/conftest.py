"""Shared test setup: an isolated kernelkit cache for the session, and the `gpu` marker's skip."""
import os
import tempfile

# Before kernelkit is imported anywhere: keep tests out of the user's cache, but share one cache across
# the session so compiled objects (the torch-facing binding TUs above all) are reused between tests.
if "KERNELKIT_TEST_KEEP_CACHE" not in os.environ:
    os.environ["KERNELKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kk-test-cache-")
# The precompiled binding header (~450 MB, ~25 s of CPU) is exercised by its own test; elsewhere it would
# only make every fresh test cache build one in the background.
os.environ.setdefault("KERNELKIT_PCH", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_GPU = torch.cuda.is_available()


def _cuda_build_problem():
    """Why CUDA code cannot be compiled for this torch here (None if it can)."""
    from kernelkit import toolchain

    try:
        toolchain.check_cuda_match("CUDA tests")
        toolchain.nvcc()
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip
        return str(e)
    return None


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    problem = _cuda_build_problem()
    no_nvcc = pytest.mark.skip(reason=f"cannot compile CUDA here: {problem}")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(no_gpu)
        elif "cuda_build" in item.keywords and problem:
            item.add_marker(no_nvcc)
