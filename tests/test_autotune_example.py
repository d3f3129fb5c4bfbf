"""examples/autotune: every configuration of its two spaces compiles (NVRTC, sm_90, no GPU needed); on a GPU,
a tuning of each picks a configuration that gives the reference's results, and Triton's versions agree."""
import concurrent.futures
import sys
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.harness.tune import configurations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from autotune import softmax, transpose  # noqa: E402

OPS = [softmax, transpose]


@pytest.mark.parametrize("op", OPS, ids=lambda m: m.__name__.split(".")[-1])
def test_every_configuration_of_the_space_compiles(op):
    pytest.importorskip("cuda.bindings.nvrtc", reason="instant kernels need cuda-bindings")
    configs = configurations(op.SPACE, getattr(op, "constraint", None))
    assert len(configs) == {"autotune.softmax": 64, "autotune.transpose": 26}[op.__name__]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda c: op.make(c, arch="9.0"), configs))
    assert all(callable(fn) for fn in built)


@pytest.mark.gpu
@pytest.mark.parametrize("op, shape", [(softmax, (512, 3000)), (transpose, (1000, 777))],
                         ids=["softmax", "transpose"])
def test_gpu_tuning_picks_a_correct_configuration(tmp_path, monkeypatch, op, shape):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path))
    result = kernelkit.autotune(op.make, op.SPACE, constraint=getattr(op, "constraint", None),
                                reference=op.reference, inputs=op.inputs, shape=shape, name=op.__name__,
                                check_shapes=[shape, (37, shape[1] + 3), (9, 5)], source=op.SRC, device="cuda",
                                rtol=1e-4, atol=1e-6, budget_ms=5)
    assert not [c for c in result.candidates if c.status == "wrong"], result.table()
    # a configuration may ask for more registers than a block of its size can have: listed, never chosen
    assert all("too many resources" in c.reason for c in result.candidates if c.status == "failed"), result.table()
    (x,) = op.inputs((shape[0] - 5, shape[1] + 3), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    torch.testing.assert_close(op.make(result.best)(x), op.reference(x), rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "transpose"])
def test_gpu_tritons_versions_match_the_reference(name):
    pytest.importorskip("triton")
    from autotune import triton_kernels

    op = {"softmax": softmax, "transpose": transpose}[name]
    result = kernelkit.check(getattr(triton_kernels, name), op.reference, inputs=op.inputs,
                             shapes=[(300, 1000), (257, 129)], dtypes=[torch.float32], device="cuda", trials=2,
                             rtol=1e-3, atol=1e-6,  # Triton's tl.exp is an approximation (2.5e-4 seen on an H100)
                             contract=False)
    assert result.ok, result
