"""Helpers shared by tests/test_ops_*.py: devices, dtypes, tolerances, non-contiguous views, statistics."""
from __future__ import annotations

import math

import pytest
import torch

import kernelkit

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.gpu))


def lib(card: str):
    return kernelkit.library(card)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, spec=None, dtype=None):
    dtype = dtype or expected.dtype
    rtol, atol = spec.tolerance(dtype) if spec is not None else kernelkit.harness.spec.DEFAULT_TOLERANCES[dtype]
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert not actual.isnan().any() or expected.isnan().any(), "NaN in result"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view holding t's values (every other element of a bigger buffer)."""
    buf = torch.full((*t.shape, 2), float("nan"), dtype=t.dtype, device=t.device)
    v = buf[..., 1]
    v.copy_(t)
    assert not v.is_contiguous() or t.numel() <= 1
    return v


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data pointer is not 16-byte aligned (forces the scalar path)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v


# ---- statistics for samplers ----------------------------------------------------------------------


def check_normal_rows(x: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor, z_bound: float = 5.5):
    """Per-row sample mean and std against N(mu_i, sigma_i^2): asserts |z-scores| < z_bound."""
    x, mu, sigma = x.double().cpu(), mu.double().cpu(), sigma.double().cpu()
    n = x.shape[1]
    mean, std = x.mean(1), x.std(1)
    z_mean = (mean - mu) / (sigma / math.sqrt(n))
    assert z_mean.abs().max() < z_bound, f"row means off: max |z| = {z_mean.abs().max():.2f}"
    z_std = (std / sigma - 1) * math.sqrt(2 * (n - 1))  # sd of s/sigma is ~1/sqrt(2(n-1))
    assert z_std.abs().max() < z_bound, f"row stds off: max |z| = {z_std.abs().max():.2f}"


def ks_pvalue(x: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> float:
    """Kolmogorov-Smirnov p-value of the standardised samples against N(0, 1)."""
    from scipy import stats

    z = ((x.double().cpu() - mu.double().cpu()[:, None]) / sigma.double().cpu()[:, None]).flatten().numpy()
    return float(stats.kstest(z, "norm").pvalue)


def max_cross_correlation(z: torch.Tensor) -> float:
    """Largest |Pearson correlation| between two different rows of z (d, n)."""
    c = torch.corrcoef(z.double().cpu())
    c.fill_diagonal_(0)
    return float(c.abs().max())


def check_independent_rows(x: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor, z_bound: float = 6.0):
    """Rows of standardised samples must be uncorrelated: each off-diagonal correlation is ~N(0, 1/n)."""
    z = (x.double().cpu() - mu.double().cpu()[:, None]) / sigma.double().cpu()[:, None]
    n = z.shape[1]
    r = max_cross_correlation(z)
    assert r < z_bound / math.sqrt(n), f"rows are correlated: max |corr| = {r:.4f} (n = {n})"
    rc = max_cross_correlation(z[:, : min(64, n)].T.contiguous())  # columns too (needs d >> 1)
    assert rc < z_bound / math.sqrt(z.shape[0]), f"columns are correlated: max |corr| = {rc:.4f}"
