"""compare() against first principles: counts, max errors and first mismatches, across chunk boundaries."""
import math

import pytest
import torch

from kernelkit.harness import compare as cmp
from kernelkit.harness.results import Case

INF, NAN = math.inf, math.nan


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    """torch.isclose's documented rule with equal_nan: equal (infinities too), both NaN, or a finite
    |a - b| <= atol + rtol * |b|."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    d = abs(a - b) if math.isfinite(a) and math.isfinite(b) else INF
    return math.isfinite(d) and d <= atol + rtol * abs(b)


def _expected(got, exp, exp64, rtol, atol):
    g, e = [float(v) for v in got.double().tolist()], [float(v) for v in exp.double().tolist()]
    e6 = [float(v) for v in exp64.double().tolist()] if exp64 is not None else None
    bad = [i for i in range(len(g)) if not _close(g[i], e[i], rtol, atol) and not (e6 and _close(g[i], e6[i], rtol, atol))]

    def errors(ref):
        pairs = [(abs(a - b), abs(b)) for a, b in zip(g, ref) if math.isfinite(a) and math.isfinite(b)]
        rel = [d / r for d, r in pairs if r > max(atol, 1e-30)]
        return (max(d for d, _ in pairs) if pairs else None), (max(rel) if rel else None)

    nonfinite = sum(1 for i in bad if not math.isfinite(g[i]) and math.isfinite(e[i]))
    return bad, errors(e), errors(e6) if e6 else (None, None), nonfinite


def _case():
    return Case("values", torch.float32, (0,), "contiguous", 0, 0)


@pytest.mark.parametrize("chunk", [7, 1 << 24])
@pytest.mark.parametrize("with64", [True, False])
def test_counts_errors_and_first_mismatches_follow_isclose(monkeypatch, chunk, with64):
    monkeypatch.setattr(cmp, "CHUNK", chunk)
    gen = torch.Generator().manual_seed(5)
    exp64 = torch.randn(50, generator=gen, dtype=torch.float64) * 3
    exp = exp64.float()
    got = exp + torch.randn(50, generator=gen) * 1e-7
    specials = {3: (NAN, 1.0), 4: (NAN, NAN), 9: (INF, INF), 10: (INF, -INF), 11: (2.0, INF), 17: (1e30, 1.0),
                20: (0.0, 1e-9), 31: (-INF, 5.0), 44: (1.5, 1.0), 45: (NAN, 2.0)}
    for i, (gv, ev) in specials.items():
        got[i], exp[i], exp64[i] = gv, ev, ev
    exp64[20] = 0.0  # close to the float64 reference only
    rtol, atol = 1e-5, 1e-8
    case = _case()
    cmp.compare(case, "output", got, exp, exp64 if with64 else None, rtol, atol, limit=3)
    bad, (abs32, rel32), (abs64, rel64), nonfinite = _expected(got, exp, exp64 if with64 else None, rtol, atol)
    assert not case.ok and len(bad) >= 5
    text = case.messages[-1]
    assert f"{len(bad)} of 50 elements differ" in text and f"; {nonfinite} NaN/inf where the reference is finite" in text
    assert [m.index for m in case.mismatches] == [(i,) for i in bad[:3]]
    assert case.max_abs == pytest.approx(abs32) and case.max_rel == pytest.approx(rel32)
    assert (case.max_abs64, case.max_rel64) == ((pytest.approx(abs64), pytest.approx(rel64)) if with64 else (None, None))


def test_a_close_output_passes_and_records_its_errors_and_a_nonfinite_only_output_records_none():
    exp = torch.linspace(-2, 2, 11, dtype=torch.float64)
    got = exp + 1e-9
    case = _case()
    cmp.compare(case, "output", got.float(), exp.float(), exp, 1e-4, 1e-6)
    assert case.ok and not case.mismatches and 0 < case.max_abs < 1e-6 and case.max_abs64 < 1e-6
    nan = torch.full((4,), NAN)
    case = _case()
    cmp.compare(case, "output", nan, nan.clone(), None, 1e-4, 1e-6)
    assert case.ok and (case.max_abs, case.max_rel) == (None, None)  # NaN == NaN passes; no finite element
    tiny = torch.tensor([0.0, 1e-7, -5e-7])
    case = _case()
    cmp.compare(case, "output", tiny * 2, tiny, None, 1e-4, 1e-6)
    assert case.ok and case.max_abs == pytest.approx(5e-7) and case.max_rel is None  # no reference element above atol


def test_integers_are_compared_exactly():
    exp = torch.arange(20)
    got = exp.clone()
    got[[2, 13]] += 1
    case = _case()
    cmp.compare(case, "output", got, exp, None, 0, 0)
    assert "2 of 20 elements differ (exact)" in case.messages[-1]
    assert [m.index for m in case.mismatches] == [(2,), (13,)]
