"""The standard battery over every card on the search path (built-in, and the user's via KERNELKIT_PATH):
values against the reference, gradients, statistics for random ops, and the op contract (opcheck,
torch.compile, CUDA graphs, current stream), then a one-size bench. Per-card test files keep only what
is specific to their op; tests/test_wrong_twins.py holds each card's known-wrong versions (its WRONG) to a
failure of the same check."""
import pytest
import torch

import kernelkit

CARDS = sorted(kernelkit.cards())


def spec_of(name):
    spec = kernelkit.cards()[name].spec
    if spec is None:
        pytest.skip(f"card {name} has no spec: nothing to check")
    return spec


def battery(name, device):
    res = kernelkit.check(name, device=device, trials=2)
    assert res.ok, res.message()
    kinds = {c.kind for c in res.cases}
    assert kinds & {"values", "stats"}, kinds
    spec = spec_of(name)
    smallest = min((tuple(s) for s in spec.bench_sizes), key=lambda s: torch.Size(s).numel())
    timed = kernelkit.bench(name, device=device, sizes=[smallest], compile=False, budget_ms=2, warmup_ms=1,
                            host_overhead=False, floor=False)
    row = timed.get("kernelkit", smallest)
    assert row is not None and not row.get("error") and row["median_us"] > 0, timed


@pytest.mark.parametrize("name", CARDS)
def test_card_on_cpu(name):
    if "cpu" not in spec_of(name).devices:
        pytest.skip(f"card {name} has no CPU implementation")
    battery(name, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", CARDS)
def test_card_on_cuda(name):
    if "cuda" not in spec_of(name).devices:
        pytest.skip(f"card {name} has no CUDA implementation")
    battery(name, "cuda")
