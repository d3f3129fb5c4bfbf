"""Re-fit conv1d_gn_mish's cost model (``kk::ConvCostModel`` in kernels/conv1d_gn_mish.h, which
``impl="auto"`` uses to choose between the split kernel and cuDNN) on the current GPU.

    PYTHONPATH=examples python -m diffusion_policy.refit_cost_model [--batches 1 4 16 64] [--json fit.json]

Times impl="fused" and impl="cudnn" (device time, L2 flushed before each call) over the U-Net's shapes that
``auto`` does not compute directly, at each batch, with the weight contiguous and channels-last; fits by
least squares (numpy)
  split kernel  t = split_fixed_us + MACs / (rate * 1e6), one rate per weight layout;
  cuDNN         t = fixed + us_per_mweight * W / 1e6, per layout (channels-last from cudnn_cl_small_filter
                weights on; below it the median is cudnn_cl_small_us),
and prints the fitted constants beside the build's current ones, how close each model's picks come to the
faster path, and the initializer of ``kConvCost`` to paste into the header. The two weight thresholds are
kept (they mark where cuDNN changes algorithm; the table shows whether they still hold).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Dict, List

import torch

FIELDS = ("split_fixed_us", "split_macs_per_ps", "split_macs_per_ps_cl", "cudnn_fixed_us", "cudnn_us_per_mweight",
          "cudnn_cl_fixed_us", "cudnn_cl_us_per_mweight", "cudnn_cl_small_us", "cudnn_cl_small_filter",
          "cudnn_cl_always_weights")
K = 5  # the U-Net's kernel size (the card's make_inputs draws weights with it)


@dataclasses.dataclass
class Case:
    batch: int
    cin: int
    cout: int
    length: int
    channels_last: bool
    fused_us: float
    cudnn_us: float

    @property
    def weights(self) -> int:
        return self.cout * self.cin * K

    @property
    def macs(self) -> float:
        return float(self.weights) * self.batch * self.length


def predict(cost: dict, case: Case) -> Dict[str, float]:
    """Predicted microseconds of both paths (mirrors conv_split_us / conv_cudnn_us of the header)."""
    rate = cost["split_macs_per_ps_cl" if case.channels_last else "split_macs_per_ps"]
    split = cost["split_fixed_us"] + case.macs / (rate * 1e6)
    mw = case.weights * 1e-6
    if not case.channels_last:
        cudnn = cost["cudnn_fixed_us"] + cost["cudnn_us_per_mweight"] * mw
    elif case.weights < cost["cudnn_cl_small_filter"]:
        cudnn = cost["cudnn_cl_small_us"]
    else:
        cudnn = cost["cudnn_cl_fixed_us"] + cost["cudnn_cl_us_per_mweight"] * mw
    if case.channels_last and case.weights >= cost["cudnn_cl_always_weights"]:
        cudnn = 0.0
    return {"fused": split, "cudnn": cudnn}


def pick_loss(cost: dict, cases: List[Case]) -> float:
    """Worst ratio of the picked path's measured time to the faster one's, over ``cases``."""
    worst = 1.0
    for c in cases:
        p = predict(cost, c)
        picked = c.cudnn_us if p["cudnn"] <= p["fused"] else c.fused_us
        worst = max(worst, picked / min(c.fused_us, c.cudnn_us))
    return worst


def fit(cases: List[Case], current: dict) -> dict:
    import numpy as np

    def lstsq(rows, y):
        return np.linalg.lstsq(np.asarray(rows, dtype=float), np.asarray(y, dtype=float), rcond=None)[0]

    new = dict(current)
    # split kernel: a shared fixed cost, one rate per layout
    a, inv_c, inv_cl = lstsq([[1.0, c.macs * (not c.channels_last), c.macs * c.channels_last] for c in cases],
                             [c.fused_us for c in cases])
    new["split_fixed_us"] = float(a)
    new["split_macs_per_ps"] = float(1.0 / (inv_c * 1e6))
    new["split_macs_per_ps_cl"] = float(1.0 / (inv_cl * 1e6))
    contiguous = [c for c in cases if not c.channels_last]
    new["cudnn_fixed_us"], new["cudnn_us_per_mweight"] = map(float, lstsq(
        [[1.0, c.weights * 1e-6] for c in contiguous], [c.cudnn_us for c in contiguous]))
    small = current["cudnn_cl_small_filter"]
    cl_large = [c for c in cases if c.channels_last and c.weights >= small]
    cl_small = [c.cudnn_us for c in cases if c.channels_last and c.weights < small]
    if cl_large:
        new["cudnn_cl_fixed_us"], new["cudnn_cl_us_per_mweight"] = map(float, lstsq(
            [[1.0, c.weights * 1e-6] for c in cl_large], [c.cudnn_us for c in cl_large]))
    if cl_small:
        new["cudnn_cl_small_us"] = float(np.median(cl_small))
    return new


def measure(batches, budget_ms: float, log) -> List[Case]:
    from kernelkit.harness.timing import time_together
    from kernelkit.kernels import conv1d_gn_mish as card
    from kernelkit.reference.conv1d_gn_mish import UNET_CONV_SHAPES

    direct_max_taps = card.config()["direct_max_taps"]
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    for batch in batches:
        for cin, cout, length in UNET_CONV_SHAPES:
            if cin * K <= direct_max_taps:  # auto computes these in one kernel: no choice to model
                continue
            x, w, bias, gamma, beta, groups = card.make_inputs((batch, cin, cout, length), device="cuda", generator=g)
            for channels_last in (False, True):
                wt = card.channels_last_weight(w) if channels_last else w
                args = (x, wt, bias, gamma, beta, groups)
                res = time_together({impl: (lambda impl=impl: card.conv1d_gn_mish(*args, impl=impl))
                                     for impl in ("fused", "cudnn")}, "cuda", budget_ms=budget_ms, flush=True)
                for t in res.values():
                    if isinstance(t, Exception):
                        raise t
                case = Case(batch, cin, cout, length, channels_last, res["fused"].median_us, res["cudnn"].median_us)
                cases.append(case)
                layout = "channels-last" if channels_last else "contiguous"
                log(f"B={batch:<4} {cin:>4}->{cout:<4} L={length:<3} {layout:13} fused {case.fused_us:8.1f} us  "
                    f"cudnn {case.cudnn_us:8.1f} us")
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--budget-ms", type=float, default=30.0, help="timed device time per path and case")
    p.add_argument("--json", type=Path, help="write the cases and both fits here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("refit_cost_model: needs a CUDA GPU (it times conv1d_gn_mish's paths on the current one)",
              file=sys.stderr)
        return 2
    from kernelkit.kernels import conv1d_gn_mish as card

    torch.backends.cudnn.allow_tf32 = False  # the float32 paths the model was fitted to

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    log(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    current = card.config()["cost"]
    cases = measure(args.batches, args.budget_ms, log)
    new = fit(cases, current)
    print(f"| field | current | re-fitted on {torch.cuda.get_device_name()} |\n|---|---|---|")
    for f in FIELDS:
        print(f"| {f} | {current[f]:.4g} | {new[f]:.4g} |")
    print(f"\nworst pick vs the faster path over {len(cases)} cases: current {pick_loss(current, cases):.2f}x, "
          f"re-fitted {pick_loss(new, cases):.2f}x")
    init = ", ".join(f"int64_t{{1}} << {int(new[f]).bit_length() - 1}" if f.endswith(("_filter", "_weights"))
                     else f"{new[f]:.3g}" for f in FIELDS)
    print(f"\nconstexpr ConvCostModel kConvCost{{{init}}};")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "cases": [dataclasses.asdict(c) for c in cases], "current": current,
                                         "refit": new}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
