"""``kernelkit run``, the main job: build every card, check it against its reference, benchmark it, and
write a report directory (summary.md, results.json, bench.csv, plots/*.png).

Without a CUDA GPU it says so, builds the CUDA cards all the same (their device code is compiled, not
run: "compile-only") and checks and times the cards' CPU implementations with the host timer, at 1 thread and
at torch's default, with the machine's load measured over each timing (a ratio from a busy machine is marked
unreliable, not printed as a verdict). Nothing is reported as measured on a GPU that was not.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

import torch

from .. import loading
from ..errors import KernelkitError
from ..jit import fastcall
from ..jit.cards import all_cards, find
from . import machine, report
from .bandwidth import device_bandwidth, device_name
from .bench import CPU_MAX_NUMEL, BenchResult, bench, fmt_ratio, label, write_csv
from .check import check
from .results import CheckResult
from .target import resolve

RUN_SIZES = 5  # run is the overview: each size costs a torch.compile of the reference; bench sweeps them all
RUN_BUDGET_MS = 50.0  # per contender and size; bench's default (100 ms) narrows the intervals further


@dataclasses.dataclass
class Options:
    check: bool = True
    bench: bool = True
    trials: int = 5
    sizes: Optional[Sequence[Tuple[int, ...]]] = None
    compile: Optional[bool] = None
    graph: bool = False
    budget_ms: Optional[float] = None
    arch: Optional[str] = None
    kernels_dir: Optional[str] = None
    quick: bool = False  # CI: 2 trials, the 3 smallest sizes, a short time budget
    copy_floor: bool = False  # also time a copy of the same bytes (bench(copy_floor=True))
    full: bool = False  # every bench size of each spec at bench's budget, not the RUN_SIZES overview


@dataclasses.dataclass
class CardRun:
    name: str
    mode: str = "-"
    build: str = "-"
    has_cuda: bool = False
    ok: bool = True
    errors: List[str] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    check: Optional[CheckResult] = None
    bench: Optional[BenchResult] = None
    target: Optional[tuple] = dataclasses.field(default=None, repr=False)  # (op, spec, device) once loaded

    def fail(self, what: str, message: str) -> None:
        self.ok = False
        self.errors.append(f"{what}: {message}")

    def to_dict(self) -> dict:
        return {"name": self.name, "mode": self.mode, "build": self.build, "has_cuda": self.has_cuda, "ok": self.ok,
                "errors": self.errors,
                "notes": self.notes, "check": self.check.to_dict() if self.check else None,
                "bench": self.bench.to_dict() if self.bench else None}


# ---------------------------------------------------------------------------------------------- the job

def environment(gpu: bool) -> Dict[str, Any]:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "host": platform.node(), "cpu": device_name(torch.device("cpu")), "gpu": None,
           "cpus": len(machine.cpu_ids()), "loadavg_start": machine.loadavg(),
           "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if gpu:
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}",
                   bandwidth_gb_s=round(device_bandwidth(torch.device("cuda", 0)) / 1e9, 1))
    return env


@dataclasses.dataclass
class Built:
    """How a card's build went in :func:`build_all`."""

    cached: bool = False
    seconds: float = 0.0
    error: Optional[str] = None

    @property
    def cell(self) -> str:
        return "FAIL" if self.error else "cached" if self.cached else f"built {self.seconds:.1f} s"


def _failure(e: BaseException) -> str:
    return str(e) if isinstance(e, KernelkitError) else f"{type(e).__name__}: {e}"


def _build_card(name: str, opts: Options) -> Built:
    """Put the card into the cache: ``kernelkit.load(..., load=False)``, which builds outside any
    process-wide lock, so cards build side by side."""
    info = loading.load(name, kernels_dir=opts.kernels_dir, arch=opts.arch, load=False)
    return Built(info.cached, info.build_seconds)


def builds_as_done(names: Sequence[str], opts: Options, say: Callable[[str], None]) -> Iterator[Tuple[str, Built]]:
    """Build the cards ``names`` at the same time, min(cards, CPUs) at once, and yield ``(name, Built)`` as
    each finishes (a card that cannot be planned first), so its check can start while the others compile.
    Builds are compiler processes, so threads suffice, and the cache's file locks keep concurrent builders
    of a shared object apart; each build's failure is kept as its card's. Planning (it imports the cards'
    specs) stays in this thread: the builds find them imported."""
    targets = []
    for name in names:
        if name == fastcall.AOT_NAME:  # kernelkit's own module, not a card: run_card builds it
            yield name, None
            continue
        try:
            find(name, opts.kernels_dir).spec  # noqa: B018 - imports the spec here, not in a build thread
            targets.append(name)
        except Exception as e:  # noqa: BLE001 - a card whose spec does not import is that card's failure
            yield name, Built(error=_failure(e))
    if not targets:
        return
    workers = max(1, min(len(targets), os.cpu_count() or 1))
    say(f"building {len(targets)} card(s), {workers} at a time")
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kernelkit-run-build")
    try:
        futures = {pool.submit(_build_card, name, opts): name for name in targets}
        for future in concurrent.futures.as_completed(futures):
            try:
                built = future.result()
            except Exception as e:  # noqa: BLE001 - one card's build error must not stop the others
                built = Built(error=_failure(e))
            yield futures[future], built
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on Ctrl-C, start no more builds


def build_all(names: Sequence[str], opts: Options, say: Callable[[str], None]) -> Dict[str, Built]:
    """:func:`builds_as_done`, all of them."""
    return dict(builds_as_done(names, opts, say))


def run_card(card, gpu: bool, opts: Options, say: Callable[[str], None], built: Optional[Built] = None) -> CardRun:
    """Load (after its build: ``built`` by :func:`builds_as_done`, else built now) and check one card where
    it can run here; :func:`bench_card` times it later."""
    cr = CardRun(card.name, has_cuda=card.has_cuda)
    try:
        spec = card.spec
    except Exception as e:  # noqa: BLE001 - a broken spec file is this card's failure, not the run's
        spec = None
        cr.fail("spec", f"{card.name}.py raised {type(e).__name__}: {e}")
    devices = tuple(spec.devices) if spec is not None else ()
    device = "cuda" if gpu and "cuda" in devices else "cpu" if "cpu" in devices else None
    if device == "cuda":
        cr.mode = "cuda"
    elif card.has_cuda and not gpu:
        cr.mode = "cpu + cuda compile-only" if device == "cpu" else "compile-only"
    else:
        cr.mode = device or "build-only"
    if spec is None and cr.ok:
        cr.notes.append("no spec (kernels/<op>.py): built only")
    if built is not None and built.error:
        cr.build = "FAIL"
        cr.fail("build", built.error)
        return cr
    t0 = time.perf_counter()
    try:
        lib = loading.load(card.name, kernels_dir=opts.kernels_dir, arch=opts.arch, load=device is not None)
    except KernelkitError as e:
        cr.build = "FAIL"
        cr.fail("build", str(e))
        return cr
    cr.build = built.cell if built is not None else "cached" if lib.cached else f"built {lib.build_seconds:.1f} s"
    say(f"{card.name}: build {cr.build} (load {time.perf_counter() - t0:.1f} s), mode {cr.mode}")
    if device is None:
        return cr
    cr.target = (resolve(spec, lib=lib, device=device).op, spec, device)
    if opts.check:
        try:
            cr.check = check(cr.target[0], spec=spec, device=device, trials=2 if opts.quick else opts.trials)
            if not cr.check.ok:
                cr.fail("check", cr.check.message())
            say(f"{card.name}: {cr.check.summary()}")
        except Exception as e:  # noqa: BLE001
            cr.fail("check", f"could not run: {type(e).__name__}: {e}")
    return cr


def sweep(sizes: Sequence[Tuple[int, ...]], most: int) -> List[Tuple[int, ...]]:
    """At most ``most`` of ``sizes``, spread evenly over the list and keeping both ends."""
    sizes = list(sizes)
    if len(sizes) <= most:
        return sizes
    picks = sorted({round(i * (len(sizes) - 1) / (most - 1)) for i in range(most)})
    return [sizes[i] for i in picks]


def bench_card(cr: CardRun, opts: Options, say: Callable[[str], None]) -> None:
    """Time a card :func:`run_card` loaded: ``RUN_SIZES`` sizes of its sweep unless ``opts.full``."""
    if cr.target is None:
        return
    op, spec, device = cr.target
    sizes = opts.sizes or (list(spec.bench_sizes)[:3] if opts.quick else
                           None if opts.full else sweep(spec.bench_sizes, RUN_SIZES))
    try:
        cr.bench = bench(op, spec=spec, device=device, sizes=sizes, compile=opts.compile, graph=opts.graph,
                         copy_floor=opts.copy_floor,
                         budget_ms=opts.budget_ms or (10.0 if opts.quick else None if opts.full else RUN_BUDGET_MS),
                         max_numel=None if device == "cuda" or opts.sizes else CPU_MAX_NUMEL,
                         progress=lambda m: say("  " + m))
        cr.notes += cr.bench.notes
        if sizes is not None and len(sizes) < len(spec.bench_sizes) and not opts.sizes:
            cr.notes.append(f"{len(sizes)} of the spec's {len(spec.bench_sizes)} bench sizes; "
                            f"`kernelkit bench {cr.name}` (or run --full) times them all")
    except Exception as e:  # noqa: BLE001
        cr.fail("bench", f"could not run: {type(e).__name__}: {e}")


def run(ops: Optional[Sequence[str]] = None, out_dir="kernelkit-report", opts: Optional[Options] = None,
        stream: Optional[TextIO] = None) -> Tuple[int, List[CardRun]]:
    """The main job: build the cards in parallel, then check and bench them one by one, in order. Returns
    (exit code, per-card results): non-zero when a build or check failed."""
    opts = opts or Options()
    stream = stream or sys.stdout
    t0 = time.perf_counter()

    def say(message: str) -> None:  # progress, with the elapsed time
        print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    gpu = torch.cuda.is_available()
    env = environment(gpu)
    print(headline(env), file=stream, flush=True)
    cards = all_cards(opts.kernels_dir)
    names = list(ops) if ops else sorted(cards)
    runs: Dict[str, CardRun] = {}
    for name in names:
        if name not in cards:
            runs[name] = CardRun(name, build="FAIL")
            runs[name].fail("card", f"no card named {name!r} (have: {', '.join(sorted(cards)) or 'none'})")
    # checks start as builds finish; timing waits until no compiler competes with it
    with contextlib.closing(builds_as_done([n for n in names if n in cards], opts, say)) as builds:
        for i, (name, built) in enumerate(builds, 1):
            say(f"[{i}/{len(cards.keys() & set(names))}] {name}")
            runs[name] = run_card(cards[name], gpu, opts, say, built)
    if opts.bench:
        for name in names:
            bench_card(runs[name], opts, say)
    results = [runs[name] for name in names]
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    env["loadavg_end"] = machine.loadavg()
    say("writing the report and its plots")
    out = write_report(Path(out_dir), env, results)
    say("report written")
    print(report.text_table(HEADERS, [summary_row(r) for r in results]), file=stream)
    for r in results:
        for e in r.errors:
            print(f"\n{r.name} {e}", file=stream)
    bad = [r.name for r in results if not r.ok]
    verdict = f"FAILED: {', '.join(bad)}" if bad else f"all {len(results)} cards ok"
    print(f"\n{verdict}; {env['wall_s']} s; report in {out}", file=stream, flush=True)
    return (1 if bad else 0), results


# ----------------------------------------------------------------------------------------------- report

HEADERS = ("op", "mode", "build", "check", "max rel err", "bench size", "kernelkit", "torch op", label("eager"),
           "torch.compile", "floor", "% bw", "speedup (95% CI)")


def headline(env: Dict[str, Any]) -> str:
    base = f"kernelkit run: torch {env['torch']} (CUDA {env['cuda']}), python {env['python']} on {env['host']}"
    if env["gpu"]:
        return base + f"\nGPU: {env['gpu']} (sm {env['capability']}), measured bandwidth {env['bandwidth_gb_s']} GB/s"
    start, end = (f"{v:.1f}" if v is not None else "?" for v in (env["loadavg_start"], env.get("loadavg_end")))
    load = f"{start} -> {end}" if "loadavg_end" in env else f"{start} at the start"
    return base + ("\nno CUDA GPU: CUDA cards are compiled but not run (compile-only); CPU implementations are "
                   "checked and timed on the CPU with a host timer, at 1 thread and at torch's default; "
                   f"{env['cpus']} CPUs, load average {load}")


def summary_row(r: CardRun) -> List[str]:
    c, b = r.check, r.bench
    if c is None:
        check_cell = "ERROR" if any(e.startswith("check") for e in r.errors) else "-"
        err = "-"
    else:
        check_cell = f"ok ({len(c.cases)})" if c.ok else f"FAIL {len(c.failures)}/{len(c.cases)}"
        rels = [x.max_rel64 if x.max_rel64 is not None else x.max_rel for x in c.cases if x.kind == "values"]
        rels = [v for v in rels if v is not None]
        ps = [x.min_p for x in c.cases if x.min_p is not None]
        err = report.fmt_num(max(rels)) if rels else f"min p {report.fmt_num(min(ps))}" if ps else "-"
    row = [r.name, r.mode, r.build, check_cell, err]
    if b is None or not b.sizes:
        return row + ["-"] * (len(HEADERS) - len(row))
    size = b.sizes[-1]
    med = lambda name: report.fmt_us(b.median_us(name, size))  # noqa: E731
    first = b.get("kernelkit", size) or {}
    return row + [report.fmt_shape(size), med("kernelkit"), f"{b.torch_op} {med(b.torch_op)}" if b.torch_op else "-",
                  med("eager"), med("torch.compile"), med("floor"),
                  f"{first['pct_bw']:.0f}%" if first.get("pct_bw") is not None else "-", speedup_cell(b, size)]


def speedup_cell(b: BenchResult, size) -> str:
    """kernelkit against the baseline, round by round: "0.03x (0.03-0.04) vs torch.sigmoid"; on a CPU at each
    thread count, and "unreliable (why)" in place of the interval where the machine was busy."""
    base = b.baseline
    if b.threads:
        return f"vs {label(base)}: " + "; ".join(f"{t} thread{'s' * (t > 1)} {fmt_ratio(b.paired(base, size, t))}"
                                                for t in b.threads)
    paired = b.paired(base, size)
    speedup = b.speedup("kernelkit", base, size)
    return f"{fmt_ratio(paired)} vs {label(base)}" if paired else f"{speedup:.2f}x vs {label(base)}" if speedup else "-"


def write_report(out: Path, env: Dict[str, Any], results: List[CardRun]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(results, out / "plots")  # first: a plot that fails adds a note to its card
    (out / "results.json").write_text(json.dumps({"environment": env, "cards": [r.to_dict() for r in results]},
                                                 indent=1, default=str))
    benches = [r.bench for r in results if r.bench is not None]
    if benches:
        write_csv(benches, out / "bench.csv")
    md = ["# kernelkit run", "", "```", headline(env), "```", "",
          f"- when: {env['when']}, wall time {env['wall_s']} s",
          "- result: " + ("all cards ok" if all(r.ok for r in results) else
                           "FAILED: " + ", ".join(r.name for r in results if not r.ok)), "",
          report.markdown_table(HEADERS, [summary_row(r) for r in results]), ""]
    for r in results:
        md += [f"## {r.name}", "", f"mode: {r.mode}; build: {r.build}", ""]
        md += [f"**{e.splitlines()[0]}**" + ("\n```\n" + "\n".join(e.splitlines()[1:]) + "\n```" if "\n" in e else "")
               for e in r.errors]
        if r.check is not None:
            md += ["", "### check", "", report.markdown_table(CheckResult.HEADERS, r.check.rows()), ""]
        if r.bench is not None:
            b = r.bench
            md += ["### bench", "", b.title(), "", report.markdown_table(b.headers(), b.table_rows()), ""]
            md += [f"![{p.stem}](plots/{p.name})" for p in plots.get(r.name, [])] + [""]
        md += [f"- note: {n}" for n in dict.fromkeys(r.notes)] + [""]
    (out / "summary.md").write_text("\n".join(md))
    return out


def _plots(results: List[CardRun], plot_dir: Path) -> Dict[str, List[Path]]:
    """Each benched card's plots, drawn side by side in subprocesses where the machine has cores to spare."""
    jobs = {r.name: r.bench.plot_args() for r in results
            if r.bench is not None and any(row.get("median_us") for row in r.bench.rows)}
    drawn = report.plot_sweeps(jobs, plot_dir, processes=min(len(jobs), (os.cpu_count() or 1) // 2))
    by_card = {r.name: r for r in results}
    for name, paths in drawn.items():
        if not isinstance(paths, list):  # a plotting problem must not lose the report
            by_card[name].notes.append(f"plots failed: {paths}")
    return {name: paths for name, paths in drawn.items() if isinstance(paths, list)}
