"""Rendering shared by check, bench and run: number formatting, text/Markdown/HTML tables, PNG plots."""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def fmt_num(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.{digits}e}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits + 1}g}"


def fmt_us(us: Optional[float]) -> str:
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "-"
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def fmt_spread(lo: float, hi: float, like: float) -> str:
    """p20-p80 in the unit ``fmt_us`` picks for ``like``, e.g. "1.2-1.4"."""
    scale = 1e6 if like >= 1e6 else 1e3 if like >= 1e3 else 1.0
    return f"{lo / scale:.3g}-{hi / scale:.3g}"


def fmt_shape(shape) -> str:
    return "x".join(str(s) for s in shape) if len(shape) else "scalar"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    esc = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


_STATUS_COLOURS = {"ok": "#070", "FAIL": "#b00", "ERROR": "#b00"}


def html_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "", details: str = "") -> str:
    def cell(c) -> str:
        colour = _STATUS_COLOURS.get(str(c).split(" ")[0])
        style = f" style='color:{colour};font-weight:bold'" if colour else ""
        return f"<td{style}>{html.escape(str(c))}</td>"

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(c) for c in r) + "</tr>" for r in rows)
    out = f"<div><b>{html.escape(title)}</b>" if title else "<div>"
    out += f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if details:
        out += f"<pre>{html.escape(details)}</pre>"
    return out + "</div>"


# ---------------------------------------------------------------------------------------------- plots

#: lines that bound a sweep from below rather than compete in it: drawn on the time plot only
FLOORS = {"floor": dict(color="k", linestyle="--", label="floor (bytes moved / measured bandwidth)"),
          "copy": dict(color="0.45", linestyle=":", label="copy of the same bytes")}


def sweep_title(op: str, device: str, device_name: str, dtype: str) -> str:
    """"sigmoid, float32 on NVIDIA H100 80GB HBM3" (or "... on CPU: x86_64 (16 threads)")."""
    where = device_name if device.startswith("cuda") else f"CPU: {device_name}"
    return f"{op}, {dtype} on {where}"


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _timed(series: Dict[str, List[dict]]) -> Dict[str, List[dict]]:
    """The timed points of each contender, sorted by x so that a line joins neighbouring sizes."""
    out = {}
    for name, points in series.items():
        points = sorted((p for p in points if p.get("median_us")), key=lambda p: p["x"])
        if points:
            out[name] = points
    return out


def _draw_time(ax, timed: Dict[str, List[dict]]) -> None:
    for name, pts in timed.items():
        xs = [p["x"] for p in pts]
        if name in FLOORS:
            ax.plot(xs, [p["median_us"] for p in pts], **FLOORS[name])
            continue
        (line,) = ax.plot(xs, [p["median_us"] for p in pts], marker="o", markersize=3, label=name)
        if all(p.get("p20_us") for p in pts):
            ax.fill_between(xs, [p["p20_us"] for p in pts], [p["p80_us"] for p in pts], color=line.get_color(),
                            alpha=0.2, linewidth=0)
    ax.set_yscale("log")
    fastest = min((p["median_us"] for k, pts in timed.items() if k not in FLOORS for p in pts), default=None)
    if fastest is not None and ax.get_ylim()[0] < fastest / 10:  # a floor far below would flatten the contenders
        ax.set_ylim(bottom=fastest / 10)


def _draw_speedup(ax, timed: Dict[str, List[dict]], ours: str) -> None:
    import matplotlib.ticker as ticker

    mine = {p["x"]: p["median_us"] for p in timed[ours]}
    # the paired ratios' 95% intervals (each contender's time over the first contender's, round by round)
    paired = ours == next(k for k in timed if k not in FLOORS)
    ratios = [1.0]
    caveats: List[str] = []
    for name, pts in timed.items():
        if name == ours or name in FLOORS:
            continue
        pts = [p for p in pts if p["x"] in mine]
        ys = [p["median_us"] / mine[p["x"]] for p in pts]
        faint = dict(linestyle=":", alpha=0.5) if paired and pts and all(p.get("unreliable") for p in pts) else {}
        (line,) = ax.plot([p["x"] for p in pts], ys, marker="o", markersize=3, label=f"vs {name}", **faint)
        spans = [(p.get("ratio_lo"), p.get("ratio_hi")) for p in pts]
        if paired and pts and all(lo is not None and hi is not None for lo, hi in spans):
            solid = [(p["x"], lo, hi) for p, (lo, hi) in zip(pts, spans) if not p.get("unreliable")]
            ax.fill_between([x for x, _, _ in solid], [lo for _, lo, _ in solid], [hi for _, _, hi in solid],
                            color=line.get_color(), alpha=0.2, linewidth=0)
            ratios += [v for _, lo, hi in solid for v in (lo, hi) if v > 0]
        doubtful = [(p["x"], y) for p, y in zip(pts, ys) if p.get("unreliable")] if paired else []
        if doubtful:  # no interval: a rerun could find the ratio anywhere
            ax.plot(*zip(*doubtful), linestyle="none", marker="o", markersize=9, markerfacecolor="white",
                    markeredgecolor="#b00")
            caveats.append(next(p["unreliable"] for p in pts if p.get("unreliable")))
        ratios += ys
    if caveats:
        ax.annotate(f"red rings: unreliable, no interval ({caveats[0]}); rerun on an idle machine", (0.01, 0.02),
                    xycoords="axes fraction", fontsize=7, color="#b00", va="bottom",
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
    ax.axhline(1.0, color="k", linewidth=0.9, label="1× (as fast)")
    ax.set_yscale("log")
    # within a decade, 1-2-5 ticks would leave one or two labels on the axis
    subs = (1.0, 2.0, 5.0) if max(ratios) / min(ratios) > 10 else (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0)
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _draw_bandwidth(ax, timed: Dict[str, List[dict]]) -> None:
    for name, pts in timed.items():
        pts = [p for p in pts if p.get("pct_bw") is not None]
        if pts and name not in FLOORS:
            ax.plot([p["x"] for p in pts], [p["pct_bw"] for p in pts], marker="o", markersize=3, label=name)
    ax.axhline(100.0, color="k", linestyle="--", linewidth=0.8, label="measured bandwidth")


def sweep_figures(series: Dict[str, List[dict]], xlabel: str, title: str, ours: Optional[str] = None) -> Dict[str, object]:
    """matplotlib figures of a size sweep, by name: "time" (every contender, the floors as lines),
    "speedup" (``ours``, default the first contender, against each other contender, log scale) and
    "bandwidth" (% of the measured bandwidth). ``series`` maps contender -> points ``{x, median_us,
    p20_us, p80_us, pct_bw}`` (and the paired ``ratio_lo``, ``ratio_hi``, ``unreliable`` of bench's rows: an
    unreliable ratio is a red ring without an interval); "floor" and "copy" are floors (``FLOORS``)."""
    plt = _pyplot()
    timed = _timed(series)
    ours = ours or next((k for k in timed if k not in FLOORS), None)
    rivals = [k for k in timed if k != ours and k not in FLOORS]
    panels = {"time": ("median time (µs)", lambda ax: _draw_time(ax, timed))}
    if ours in timed and rivals:
        panels["speedup"] = (f"{ours} speedup (×, log scale)", lambda ax: _draw_speedup(ax, timed, ours))
    if any(p.get("pct_bw") is not None for k, pts in timed.items() if k not in FLOORS for p in pts):
        panels["bandwidth"] = ("% of measured device bandwidth", lambda ax: _draw_bandwidth(ax, timed))
    figures = {}
    for name, (ylabel, draw) in panels.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        draw(ax)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {name}")
        ax.grid(True, which="both", alpha=0.3)
        if "on CPU:" in title and name != "speedup":  # said on the figure too: plots travel without the text
            ax.annotate("CPU, host timer: the floor is a DRAM copy's bandwidth; cache-resident sizes beat it",
                        (0.01, 0.01), xycoords="axes fraction", fontsize=7, color="0.35")
        ax.legend(fontsize=8)
        fig.tight_layout()
        figures[name] = fig
    return figures


def plot_sweep(series: Dict[str, List[dict]], xlabel: str, title: str, out_dir, stem: str,
               ours: Optional[str] = None) -> List[Path]:
    """Write :func:`sweep_figures` as ``<stem>_time.png``, ``<stem>_speedup.png`` and
    ``<stem>_bandwidth.png`` (those drawn) into ``out_dir``; return their paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in sweep_figures(series, xlabel, title, ours).items():
        path = out_dir / f"{stem}_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_sweeps(jobs: Dict[str, tuple], out_dir, processes: int = 1) -> Dict[str, object]:
    """:func:`plot_sweep` for each ``stem -> (series, xlabel, title)``: the paths, or the error's text.
    With ``processes`` > 1 the figures are drawn in that many Python subprocesses (matplotlib takes about a
    second per card; plain subprocesses, not multiprocessing, so a user's script is never re-imported)."""
    import json
    import subprocess
    import sys

    if processes <= 1 or len(jobs) <= 1:
        drawn: Dict[str, object] = {}
        for stem, (series, xlabel, title) in jobs.items():
            try:
                drawn[stem] = plot_sweep(series, xlabel, title, out_dir, stem)
            except Exception as e:  # noqa: BLE001 - one card's plot must not lose the others'
                drawn[stem] = f"{type(e).__name__}: {e}"
        return drawn
    stems = list(jobs)
    chunks = [stems[i::processes] for i in range(min(processes, len(stems)))]
    procs = []
    for chunk in chunks:
        proc = subprocess.Popen([sys.executable, "-c", "from kernelkit.harness.report import _plot_main; _plot_main()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append((chunk, proc, json.dumps({"out_dir": str(out_dir), "jobs": {s: jobs[s] for s in chunk}})))
    drawn = {}
    for chunk, proc, request in procs:
        out, err = proc.communicate(request)
        try:
            answer = json.loads(out)
        except ValueError:
            answer = {s: f"the plotting process failed: {(err.strip().splitlines() or ['no output'])[-1]}" for s in chunk}
        drawn.update({s: [Path(p) for p in v] if isinstance(v, list) else v for s, v in answer.items()})
    return drawn


def _plot_main() -> None:
    """The subprocess side of :func:`plot_sweeps`: a JSON request on stdin, the answer on stdout."""
    import json
    import sys

    request = json.load(sys.stdin)
    drawn = plot_sweeps({s: tuple(job) for s, job in request["jobs"].items()}, request["out_dir"])
    json.dump({s: [str(p) for p in v] if isinstance(v, list) else v for s, v in drawn.items()}, sys.stdout)
