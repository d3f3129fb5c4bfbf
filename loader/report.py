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

def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(series: Dict[str, List[dict]], xlabel: str, title: str, out_dir, stem: str,
               baseline: str = "eager") -> List[Path]:
    """PNG plots of a size sweep. ``series`` maps contender -> points ``{x, median_us, p20_us, p80_us,
    pct_bw}`` (the "floor" contender is drawn dashed). Writes ``<stem>_time.png``, ``<stem>_speedup.png``
    (vs ``baseline``) and ``<stem>_bandwidth.png``; returns their paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    timed = {k: [p for p in v if p.get("median_us")] for k, v in series.items()}
    timed = {k: v for k, v in timed.items() if v}

    def figure(name: str, ylabel: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        draw(ax)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    def draw_time(ax) -> None:
        for name, pts in timed.items():
            xs = [p["x"] for p in pts]
            style = dict(linestyle="--", color="k") if name == "floor" else dict(marker="o", markersize=3)
            ax.plot(xs, [p["median_us"] for p in pts], label=name, **style)
            if name != "floor" and all(p.get("p20_us") for p in pts):
                ax.fill_between(xs, [p["p20_us"] for p in pts], [p["p80_us"] for p in pts], alpha=0.2)
        ax.set_yscale("log")

    def draw_speedup(ax) -> None:
        base = {p["x"]: p["median_us"] for p in timed.get(baseline, [])}
        for name, pts in timed.items():
            if name == baseline:
                continue
            pts = [p for p in pts if p["x"] in base]
            style = dict(linestyle="--", color="k") if name == "floor" else dict(marker="o", markersize=3)
            ax.plot([p["x"] for p in pts], [base[p["x"]] / p["median_us"] for p in pts], label=name, **style)
        ax.axhline(1.0, color="grey", linewidth=0.8)

    def draw_bw(ax) -> None:
        for name, pts in timed.items():
            pts = [p for p in pts if p.get("pct_bw") is not None and name != "floor"]
            if pts:
                ax.plot([p["x"] for p in pts], [p["pct_bw"] for p in pts], marker="o", markersize=3, label=name)
        ax.axhline(100.0, color="k", linestyle="--", linewidth=0.8, label="measured bandwidth")

    figure("time", "median time (µs)", draw_time)
    if baseline in timed and len(timed) > 1:
        figure("speedup", f"speedup vs {baseline} (×)", draw_speedup)
    if any(p.get("pct_bw") is not None for pts in timed.values() for p in pts):
        figure("bandwidth", "% of measured device bandwidth", draw_bw)
    return paths
