"""Statistical checks for random ops: samples are judged against the target distribution, not by equality.

The output is viewed as rows of samples (``out.reshape(-1, out.shape[-1])``; for the sampler's ``(d, N)``
output, row i holds the N draws of dimension i). With the spec's ``target(args) -> (mean, std)`` each
element is standardised and tested, each family Bonferroni-corrected at ``ALPHA``: per-row mean (z-test),
per-row variance (chi-square), Kolmogorov-Smirnov against N(0, 1), correlation between rows and between
columns (Fisher z; one z shared across rows gives r = 1), and lag-1 correlation between neighbours.
Without a target, two-sample versions against the reference's sample: row means and variances (rows of
>= 32 samples), KS on all values, and correlation between rows. Inputs are seeded: verdicts reproduce.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np
import torch

ALPHA = 1e-5  # per test family; the bugs this hunts give p-values near 0
MIN_CORR_SAMPLES = 32  # fewer samples cannot tell r = 1 from chance at ALPHA
MAX_CORR_VECTORS = 64
_KS_SAMPLES = {torch.float16: 2000, torch.bfloat16: 2000}  # coarse dtypes: fewer, so rounding is not "significant"


def _norm_p(stat: torch.Tensor) -> torch.Tensor:
    """Two-sided normal p-values."""
    return torch.special.erfc(stat.abs() / math.sqrt(2.0))


def _worst(p: torch.Tensor) -> Tuple[int, float]:
    """Index of the smallest p and its Bonferroni-corrected value."""
    i = int(torch.argmin(p))
    return i, min(1.0, float(p[i]) * p.numel())


def _corr_pairs(vectors: torch.Tensor) -> Optional[Tuple[int, int, float, float]]:
    """Max |Pearson r| between the given vectors (rows): (i, j, r, Bonferroni p) via Fisher's z."""
    n_vec, n = vectors.shape
    if n_vec < 2 or n < MIN_CORR_SAMPLES:
        return None
    idx = torch.linspace(0, n_vec - 1, min(n_vec, MAX_CORR_VECTORS), device=vectors.device).round().long().unique()
    v = vectors[idx]
    v = v - v.mean(1, keepdim=True)
    norms = v.norm(dim=1, keepdim=True)
    v = v / torch.where(norms > 0, norms, torch.ones_like(norms))
    r = (v @ v.T).clamp(-1 + 1e-12, 1 - 1e-12)
    iu = torch.triu_indices(len(idx), len(idx), 1, device=r.device)
    rs = r[iu[0], iu[1]]
    k, p = _worst(_norm_p(torch.atanh(rs) * math.sqrt(max(n - 3, 1))))
    return int(idx[iu[0, k]]), int(idx[iu[1, k]]), float(rs[k]), p


def test_samples(case, out: torch.Tensor, args: tuple, spec, reference_out: torch.Tensor) -> None:
    """Run the tests on one random output; failures go to ``case.fail`` (with the statistic), the
    smallest corrected p-value to ``case.min_p``."""
    x = out.detach().double()
    nonfinite = int((~torch.isfinite(x)).sum())
    if nonfinite:
        return case.fail(f"{nonfinite} of {x.numel()} samples are NaN/inf")
    if x.numel() < 2:
        return
    rows = x.reshape(-1, x.shape[-1])
    found: List[Tuple[float, Optional[str]]] = []  # (corrected p, message if failing)

    def judge(p: float, message: str) -> None:
        found.append((p, message if p < ALPHA else None))

    if spec.target is not None:
        z = _against_target(case, rows, spec.target(args), x.shape, judge)
    else:
        z = _against_reference(rows, reference_out.detach().double().reshape(rows.shape), judge)
    n_rows, n = rows.shape
    sample = _subsample(z.reshape(-1), _KS_SAMPLES.get(out.dtype, 20000), case.seed)
    if spec.target is not None and sample.size >= 20:
        res = stats().kstest(sample, "norm")
        judge(float(res.pvalue), f"KS test: samples do not follow N(mean, std^2): D = {res.statistic:.4f} over "
                                 f"{sample.size} samples (p={res.pvalue:.2g})")
    # Between columns and lag-1 only with a target: standardised with estimated row moments the
    # estimation error is shared along a row and itself correlates the columns and the neighbours.
    pairs = [("rows", z, n)] + ([("columns", z.T, n_rows)] if spec.target is not None else [])
    for what, vectors, count in pairs:
        hit = _corr_pairs(vectors)
        if hit:
            a, b, r, p = hit
            judge(p, f"correlation test: {what} {a} and {b} are correlated, r = {r:.3f} over {count} samples "
                     f"(independent samples give |r| ~ {1 / math.sqrt(count):.3f}; p={p:.2g}) - samples are "
                     f"not independent across {what} (one z shared by every {what[:-1]}?)")
    if spec.target is not None and n >= 2 and n_rows * (n - 1) >= MIN_CORR_SAMPLES:
        sub = z[:4096]
        r = float(torch.corrcoef(torch.stack([sub[:, :-1].reshape(-1), sub[:, 1:].reshape(-1)]))[0, 1])
        m = sub.shape[0] * (n - 1)
        p = float(_norm_p(torch.tensor(_fisher(r) * math.sqrt(max(m - 3, 1)))))
        judge(p, f"lag-1 test: neighbouring samples are correlated, r = {r:.3f} over {m} pairs (p={p:.2g})")
    if found:
        case.min_p = min([p for p, _ in found] + ([case.min_p] if case.min_p is not None else []))
    for _, message in found:
        if message:
            case.fail(message)


def stats():
    from scipy import stats as scipy_stats  # imported on first use: it takes a second or two

    return scipy_stats


def _fisher(r: float) -> float:
    return math.atanh(max(min(r, 1 - 1e-12), -1 + 1e-12))


def _subsample(t: torch.Tensor, n_max: int, seed: int) -> np.ndarray:
    if t.numel() > n_max:
        pick = np.random.default_rng(seed % (1 << 32)).choice(t.numel(), n_max, replace=False)
        t = t[torch.as_tensor(pick, device=t.device)]
    return t.cpu().numpy()


def _against_target(case, rows: torch.Tensor, target, shape, judge) -> torch.Tensor:
    """Row mean (z-test) and variance (chi-square) tests against (mean, std); returns standardised rows."""
    mean, std = (torch.broadcast_to(torch.as_tensor(t, dtype=torch.float64, device=rows.device), shape)
                 .reshape(rows.shape) for t in target)
    fixed = std == 0  # a zero std means exactly the mean
    if bool(fixed.any()) and not torch.equal(rows[fixed], mean[fixed]):
        case.fail("elements whose target std is 0 differ from their mean")
    z = (rows - mean) / torch.where(fixed, torch.ones_like(std), std)
    n_rows, n = z.shape
    zm = z.mean(1) * math.sqrt(n)
    i, p = _worst(_norm_p(zm))
    judge(p, f"row mean test: row {i} has sample mean {float(rows[i].mean()):.5g} but the target mean is "
             f"{float(mean[i].mean()):.5g} ({float(zm[i]):+.1f} standard errors over {n} samples; "
             f"p={p:.2g}, Bonferroni over {n_rows} rows)")
    ss = (z * z).sum(1)
    cdf = torch.as_tensor(stats().chi2.cdf(ss.cpu().numpy(), n))
    i, p = _worst((2 * torch.minimum(cdf, 1 - cdf)).clamp(max=1.0))
    judge(p, f"row variance test: row {i}'s sample std is {math.sqrt(float(ss[i]) / n):.4f}x the target std "
             f"over {n} samples (chi-square p={p:.2g}, Bonferroni over {n_rows} rows)")
    return z


def _against_reference(rows: torch.Tensor, ref: torch.Tensor, judge) -> torch.Tensor:
    """Two-sample tests against the reference's sample (same inputs): row means and variances (normal
    approximations, rows of >= 32 samples) and a KS test on all values. Returns rows standardised by
    their own moments."""
    n_rows, n = rows.shape
    if n >= MIN_CORR_SAMPLES:
        mx, mr, vx, vr = rows.mean(1), ref.mean(1), rows.var(1), ref.var(1)
        zm = (mx - mr) / ((vx + vr) / n).sqrt().clamp_min(1e-300)
        i, p = _worst(_norm_p(zm))
        judge(p, f"row mean test: row {i} has sample mean {float(mx[i]):.5g} but the reference's sample has "
                 f"{float(mr[i]):.5g} ({float(zm[i]):+.1f} standard errors over {n} samples; p={p:.2g})")
        zv = torch.log(vx.clamp_min(1e-300) / vr.clamp_min(1e-300)) / math.sqrt(4 / (n - 1))
        i, p = _worst(_norm_p(zv))
        judge(p, f"row variance test: row {i}'s sample std is {math.sqrt(float(vx[i] / vr[i])):.4f}x the "
                 f"reference sample's over {n} samples (p={p:.2g})")
    a, b = (_subsample(t.reshape(-1), 20000, 0) for t in (rows, ref))
    if a.size >= 20:
        res = stats().ks_2samp(a, b)
        judge(float(res.pvalue), f"KS test: samples do not follow the reference's: D = {res.statistic:.4f} over "
                                 f"{a.size} samples (p={res.pvalue:.2g})")
    sd = rows.std(1, keepdim=True) if n >= 2 else torch.ones_like(rows[:, :1])
    return (rows - rows.mean(1, keepdim=True)) / torch.where(sd > 0, sd, torch.ones_like(sd))
