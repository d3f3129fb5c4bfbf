"""Diffusion Policy inference benchmark: kernelkit's ddpm_step / conv1d_gn_mish against eager PyTorch and
torch.compile, per op over the U-Net's shapes and end to end (100-step denoise loop, batch 1 and 64).

    PYTHONPATH=examples python -m diffusion_policy.bench --json diffusion_bench.json

End-to-end contenders (median time per denoise loop, CUDA events, after warm-up):
  eager                 pure PyTorch U-Net + table DDPM step, Python loop (no host sync)
  torch.compile         the same step under torch.compile(mode="reduce-overhead") (CUDA graphs), Python loop
  pytorch+graph         the pure-PyTorch loop captured as one CUDA graph (a reference point)
  kernelkit             fused Conv1dBlocks (+FiLM/residual epilogue; larger weights stored channels-last
                        by use_kernelkit) and fused DDPM step, Python loop
  kernelkit+graph       the kernelkit loop captured as one CUDA graph
  kernelkit+compile     the kernelkit step under torch.compile(mode="reduce-overhead"), like torch.compile's
Per op, "kernelkit" gets a (Cout, Cin, K)-contiguous weight, "kernelkit-model" the weight as use_kernelkit
stores it (surgery.preferred_weight_layout: channels-last from the card's layout threshold) and
"kernelkit-fused" the split kernel forced. Per-op timings (kernelkit.harness.timing.time_together: device time,
contenders in turn, paired ratio to torch.compile with a 95% interval) flush L2 before each convolution
(the U-Net's 263 MB of weights never stay in L2 in a real loop), not before the DDPM step (its
coefficient table does).
TF32 settings are PyTorch's defaults unless --no-tf32. Goals (reported, not asserted): kernelkit+graph
>= 3x eager and >= 1.3x torch.compile at batch 1.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from kernelkit.harness.timing import paired_ratio, time_together
from kernelkit.kernels.conv1d_gn_mish import conv1d_gn_mish as conv_kk
from kernelkit.reference.conv1d_gn_mish import UNET_CONV_SHAPES
from kernelkit.reference.conv1d_gn_mish import conv1d_gn_mish as conv_ref
from kernelkit.reference.ddpm_step import ddpm_step as step_ref

from . import denoise, surgery, unet
from .surgery import kernelkit_step

HORIZON, ACTION_DIM, OBS_DIM = 16, 2, 40
_FLUSH = None


def loop_time_us(fn, reps: int, warmup: int = 2) -> dict:
    """Median/min span of ``reps`` whole denoise loops between two CUDA events (one pair per loop). Unlike
    the per-op timer (kernelkit.bench, which queues a spin so that only device time is timed), the span
    includes the device waiting for the host's launches: what a caller of an eager loop waits for."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) * 1e3)
    return {"median_us": statistics.median(samples), "min_us": min(samples), "reps": reps}


def time_ops(row: dict, contenders: dict, args, flush: bool) -> None:
    """Device time per call of each contender, timed in turn (kernelkit.harness.timing.time_together: L2 flushed
    or not, shuffled rounds), into ``row``; plus kernelkit's paired ratio to torch.compile with its 95%
    interval."""
    res = time_together(contenders, "cuda", budget_ms=args.op_budget_ms, min_reps=args.op_reps, flush=flush)
    for name, t in res.items():
        if isinstance(t, Exception):
            raise t
        row[name] = t.median_us
    if "torch.compile" in res:
        for name, key in (("kernelkit", "vs_compile_paired"), ("kernelkit-model", "model_vs_compile_paired")):
            if name in res:
                r = paired_ratio(res[name].samples_us, res["torch.compile"].samples_us)
                row[key] = [r.median, r.lo, r.hi]


def fmt_us(us):
    if us is None:
        return "-"
    return f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.1f} us"


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def bench_ops(args, log) -> list:
    rows = []
    try:
        import torch._dynamo.config as cfg
        setattr(cfg, "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit", 256)
    except ImportError:
        pass
    conv_c = _compiled(conv_ref) if args.op_compile else None
    g = torch.Generator(device="cuda").manual_seed(0)
    for batch in args.batches:
        for cin, cout, length in UNET_CONV_SHAPES:
            bound = 1 / (cin * 5) ** 0.5
            x = torch.randn(batch, cin, length, device="cuda", generator=g)
            w = torch.randn(cout, cin, 5, device="cuda", generator=g) * bound
            b = torch.randn(cout, device="cuda", generator=g) * bound
            gamma, beta = 1 + 0.1 * torch.randn(cout, device="cuda", generator=g), 0.1 * torch.randn(cout, device="cuda", generator=g)
            a = (x, w, b, gamma, beta, 8)
            a_model = (x, surgery.preferred_weight_layout(w)) + a[2:]  # the weight as use_kernelkit stores it
            contenders = {"kernelkit": lambda: conv_kk(*a),
                          "kernelkit-model": lambda: conv_kk(*a_model),
                          "kernelkit-fused": lambda: conv_kk(*a, impl="fused")}
            contenders["eager"] = lambda: conv_ref(*a)
            if conv_c is not None:
                contenders["torch.compile"] = lambda: conv_c(*a)
            row = {"op": "conv1d_gn_mish", "shape": f"B={batch} {cin}->{cout} L={length}",
                   "weight_mb": w.numel() * 4 / 1e6}
            time_ops(row, contenders, args, flush=True)
            row["floor_us"] = (w.numel() + x.numel() + batch * cout * length) * 4 / (args.bandwidth_tbs * 1e12) * 1e6
            rows.append(row)
            log(f"  {row['shape']}: " + ", ".join(f"{k} {fmt_us(row[k])}" for k in contenders))
    # the DDPM step at the loop's shapes
    sched = denoise.DenoiseSchedule(100, device="cuda")
    step_c = _compiled(step_ref) if args.op_compile else None
    for batch in args.batches:
        eps, x, z = (torch.randn(batch, HORIZON, ACTION_DIM, device="cuda", generator=g) for _ in range(3))
        t = sched.timesteps[50]
        contenders = {"kernelkit": lambda: kernelkit_step(eps, t, x, sched.coeffs, z),
                      "kernelkit-philox": lambda: kernelkit_step(eps, t, x, sched.coeffs),
                      "eager": lambda: step_ref(eps, t, x, sched.coeffs, z)}
        if step_c is not None:
            contenders["torch.compile"] = lambda: step_c(eps, t, x, sched.coeffs, z)
        row = {"op": "ddpm_step", "shape": f"B={batch} {HORIZON}x{ACTION_DIM}"}
        time_ops(row, contenders, args, flush=False)  # the table stays in L2 in a loop
        rows.append(row)
        log(f"  ddpm_step {row['shape']}: " + ", ".join(f"{k} {fmt_us(row[k])}" for k in contenders))
    return rows


def bench_e2e(args, log) -> list:
    ref_model = unet.make_unet(seed=0, device="cuda")
    kk_model = surgery.use_kernelkit(unet.make_unet(seed=0, device="cuda"))
    sched = denoise.DenoiseSchedule(args.steps, device="cuda")
    rows = []
    for batch in args.batches:
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randn(batch, HORIZON, ACTION_DIM, device="cuda", generator=g)
        obs = torch.randn(batch, OBS_DIM, device="cuda", generator=g)
        noise = torch.randn(args.steps, batch, HORIZON, ACTION_DIM, device="cuda", generator=g)
        row = {"batch": batch, "steps": args.steps}
        outputs = {}
        reps = args.e2e_reps
        with torch.no_grad():
            loops = {
                "eager": lambda: denoise.denoise(ref_model, sched, x, obs, noise, step_ref),
                "kernelkit": lambda: denoise.denoise(kk_model, sched, x, obs, noise, kernelkit_step),
            }
            if args.compile:
                def compiled_loop(model, step_fn):
                    step = torch.compile(functools.partial(denoise.denoise_step, model, sched.coeffs, step_fn=step_fn),
                                         mode="reduce-overhead", dynamic=False)

                    def loop():
                        xx = x
                        for i in range(len(sched)):
                            torch.compiler.cudagraph_mark_step_begin()
                            xx = step(xx, sched.timesteps[i], obs, noise[i]).clone()
                        return xx
                    return loop

                loops["torch.compile"] = compiled_loop(ref_model, step_ref)
                # the kernelkit model under torch.compile: its ops are opaque to Inductor, which fuses the rest
                loops["kernelkit+compile"] = compiled_loop(kk_model, kernelkit_step)
            t0 = time.perf_counter()
            loops["pytorch+graph"] = denoise.CUDAGraphDenoiser(ref_model, sched, x, obs, noise, step_ref)
            loops["kernelkit+graph"] = denoise.CUDAGraphDenoiser(kk_model, sched, x, obs, noise, kernelkit_step)
            log(f"  batch {batch}: captured both graphs in {time.perf_counter() - t0:.1f} s")
            for name, fn in loops.items():
                t0 = time.perf_counter()
                outputs[name] = fn().clone()  # first call: compiles / loads
                warm_s = time.perf_counter() - t0
                row[name] = loop_time_us(fn, reps, warmup=1)["median_us"]
                log(f"  batch {batch} {name}: {fmt_us(row[name])} per loop (first call {warm_s:.1f} s)")
        ref_out = outputs["eager"]
        row["max_abs_diff_vs_eager"] = {k: float((v - ref_out).abs().max()) for k, v in outputs.items()}
        for k in loops:
            row[f"speedup_{k}"] = row["eager"] / row[k]
        rows.append(row)
    return rows


def markdown(op_rows, e2e_rows) -> str:
    out = []
    if op_rows:
        names = ["kernelkit", "kernelkit-model", "kernelkit-fused", "kernelkit-philox", "eager", "torch.compile"]
        names = [n for n in names if any(n in r for r in op_rows)]
        out += ["| op | shape | " + " | ".join(names) + " | floor | vs eager | vs compile (paired, 95% CI) "
                "| kernelkit-model vs compile |", "|---|---|" + "---|" * (len(names) + 4)]
        for r in op_rows:
            kk = r["kernelkit"]
            vs = lambda k: f"{r[k] / kk:.2f}x" if r.get(k) else "-"  # noqa: E731
            paired = [r.get(k) for k in ("vs_compile_paired", "model_vs_compile_paired")]
            vc = [f"{pr[0]:.2f}x ({pr[1]:.2f}-{pr[2]:.2f})" if pr else "-" for pr in paired]
            out.append(f"| {r['op']} | {r['shape']} | " + " | ".join(fmt_us(r.get(n)) for n in names)
                       + f" | {fmt_us(r.get('floor_us'))} | {vs('eager')} | {vc[0]} | {vc[1]} |")
        out.append("")
    if e2e_rows:
        names = [k for k in ("eager", "torch.compile", "pytorch+graph", "kernelkit", "kernelkit+graph",
                             "kernelkit+compile") if k in e2e_rows[0]]
        out += ["| batch | " + " | ".join(names) + " | kernelkit+graph vs eager | vs torch.compile |",
                "|---|" + "---|" * (len(names) + 2)]
        for r in e2e_rows:
            kg = r["kernelkit+graph"]
            vc = f"{r['torch.compile'] / kg:.2f}x" if "torch.compile" in r else "-"
            out.append(f"| {r['batch']} | " + " | ".join(fmt_us(r[n]) for n in names) + f" | {r['eager'] / kg:.2f}x | {vc} |")
        out.append(f"\n(time per {e2e_rows[0]['steps']}-step denoise loop; max |diff| vs eager: "
                   + "; ".join(f"B={r['batch']}: " + ", ".join(f"{k} {v:.1e}" for k, v in r["max_abs_diff_vs_eager"].items()
                                                                 if k != "eager") for r in e2e_rows) + ")")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--op-reps", type=int, default=20, help="at least this many timed calls per op contender")
    p.add_argument("--op-budget-ms", type=float, default=40.0, help="timed device time per op contender")
    p.add_argument("--e2e-reps", type=int, default=5)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile end to end")
    p.add_argument("--no-op-compile", dest="op_compile", action="store_false", help="skip torch.compile per op")
    p.add_argument("--skip-ops", action="store_true")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--no-tf32", action="store_true", help="full-float32 cuDNN convolutions for every contender")
    p.add_argument("--bandwidth-tbs", type=float, default=3.0, help="device bandwidth for the per-op floor (TB/s)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("diffusion_policy.bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    log(f"{torch.cuda.get_device_name()} torch {torch.__version__} cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    op_rows = [] if args.skip_ops else bench_ops(args, log)
    e2e_rows = [] if args.skip_e2e else bench_e2e(args, log)
    table = markdown(op_rows, e2e_rows)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "ops": op_rows, "end_to_end": e2e_rows,
            "markdown": table, "seconds": time.perf_counter() - t0}, indent=2))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
