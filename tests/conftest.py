"""Shared test setup: an isolated kernelkit cache for the session, and the `gpu` marker's skip."""
import os
import tempfile

# Before kernelkit is imported anywhere: keep tests out of the user's cache, but share one cache across
# the session so compiled objects (the torch-facing binding TUs above all) are reused between tests.
if "KERNELKIT_TEST_KEEP_CACHE" not in os.environ:
    os.environ["KERNELKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kk-test-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
