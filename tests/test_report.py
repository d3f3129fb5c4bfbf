"""kernelkit.report's sweep plots: speedups on a log axis, floors on the time plot only, lines joined in
size order, titles that say what was measured where."""
import pytest

from kernelkit.harness import report

SIZES = [4096, 64, 1 << 20, 512, 1 << 16]  # sweep order, as a card's bench_sizes may list them
TITLE = report.sweep_title("conv1d_gn_mish", "cuda", "NVIDIA H100 80GB HBM3", "float32")


def floor_us(x: int) -> float:
    return x / 1.2e3  # bytes over a made-up bandwidth: latency-bound small sizes, bandwidth-bound large ones


def point(x: int, us: float) -> dict:
    return {"x": x, "median_us": us, "p20_us": us * 0.9, "p80_us": us * 1.1, "pct_bw": 100.0 * floor_us(x) / us}


def fake_series():
    """kernelkit 2-3x faster than eager and 1.5x faster than torch.compile, a floor far below all three."""
    def curve(scale):
        return [point(x, scale * (5 + x / 1e3)) for x in SIZES]

    return {"kernelkit": curve(1.0), "eager": curve(2.5), "torch.compile": curve(1.5),
            "floor": [{"x": x, "median_us": floor_us(x), "pct_bw": 100.0} for x in SIZES],
            "copy": [point(x, 0.8 * (5 + x / 1e3)) for x in SIZES]}


@pytest.fixture
def figures():
    figs = report.sweep_figures(fake_series(), "bytes moved", TITLE)
    yield {name: fig.axes[0] for name, fig in figs.items()}
    plt = report._pyplot()
    for fig in figs.values():
        plt.close(fig)


def labels(ax):
    return [line.get_label() for line in ax.get_lines()]


def test_three_figures_with_titles_naming_op_gpu_and_dtype(figures):
    assert list(figures) == ["time", "speedup", "bandwidth"]
    for ax in figures.values():
        title = ax.get_title()
        assert "conv1d_gn_mish" in title and "NVIDIA H100 80GB HBM3" in title and "float32" in title


def test_cpu_title_says_cpu():
    title = report.sweep_title("sigmoid", "cpu", "x86_64 (2 threads)", "bfloat16")
    assert "CPU" in title and "x86_64" in title and "bfloat16" in title


def test_every_line_is_joined_in_size_order(figures):
    for ax in figures.values():
        for line in ax.get_lines():
            xs = list(line.get_xdata())
            if len(xs) > 2:  # not an axhline
                assert xs == sorted(xs), (ax.get_title(), line.get_label())


def test_speedup_is_ours_against_each_rival_on_a_log_axis(figures):
    ax = figures["speedup"]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    assert labels(ax) == ["vs eager", "vs torch.compile", "1× (as fast)"]
    eager, compiled, one = ax.get_lines()
    assert list(one.get_ydata()) == [1.0, 1.0]
    assert all(y == pytest.approx(2.5) for y in eager.get_ydata())
    assert all(y == pytest.approx(1.5) for y in compiled.get_ydata())
    ymin, ymax = ax.get_ylim()
    assert ymin < 1.0 < 2.5 < ymax  # the 1x line and every point are in view


def test_floors_only_on_the_time_plot(figures):
    floor_labels = {style["label"] for style in report.FLOORS.values()}
    time_labels = labels(figures["time"])
    assert floor_labels <= set(time_labels)
    floor = figures["time"].get_lines()[time_labels.index(report.FLOORS["floor"]["label"])]
    assert list(floor.get_xdata()) == sorted(SIZES)
    assert figures["time"].get_yscale() == "log"
    for name in ("speedup", "bandwidth"):
        assert not floor_labels & set(labels(figures[name])), name
        assert not any("floor" in lab or "copy" in lab for lab in labels(figures[name])), name


def test_one_contender_draws_no_speedup_and_errors_are_left_out():
    series = {"kernelkit": [point(x, 10.0) for x in SIZES] + [{"x": 8, "median_us": None}]}
    figs = report.sweep_figures(series, "elements", TITLE)
    try:
        assert list(figs) == ["time", "bandwidth"]
        (line,) = figs["time"].axes[0].get_lines()
        assert len(line.get_xdata()) == len(SIZES)
    finally:
        for fig in figs.values():
            report._pyplot().close(fig)


def test_plot_sweep_writes_pngs(tmp_path):
    paths = report.plot_sweep(fake_series(), "bytes moved", TITLE, tmp_path, "conv")
    assert [p.name for p in paths] == ["conv_time.png", "conv_speedup.png", "conv_bandwidth.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_plot_sweeps_in_subprocesses_match_in_process(tmp_path):
    jobs = {"a": (fake_series(), "bytes moved", TITLE), "b": (fake_series(), "elements", TITLE),
            "broken": ({"kernelkit": [{"x": 1, "median_us": "not a number"}]}, "x", TITLE)}
    drawn = report.plot_sweeps(jobs, tmp_path / "sub", processes=2)
    inline = report.plot_sweeps({k: v for k, v in jobs.items() if k != "broken"}, tmp_path / "inline")
    assert sorted(p.name for p in drawn["a"]) == sorted(p.name for p in inline["a"]) == \
        ["a_bandwidth.png", "a_speedup.png", "a_time.png"]
    assert all(p.is_file() and p.stat().st_size > 1000 for p in drawn["a"] + drawn["b"])
    assert isinstance(drawn["broken"], str) and "Error" in drawn["broken"]  # the error's text, not a lost report


def test_speedup_intervals_and_cpu_caveats_are_drawn():
    """The paired ratios' 95% intervals shade each speedup line (the CSV has them, the plot shows them); a CPU
    sweep's time and bandwidth plots say on the figure what its floor means."""
    series = fake_series()
    for p in series["eager"]:
        p.update(ratio=2.5, ratio_lo=2.3, ratio_hi=2.8)
    cpu_title = report.sweep_title("sigmoid", "cpu", "x86_64 (2 threads)", "float32")
    figs = report.sweep_figures(series, "bytes moved", cpu_title)
    try:
        speedup = figs["speedup"].axes[0]
        [band] = speedup.collections  # eager's interval only: torch.compile's points carry none
        lo, hi = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
        assert (lo, hi) == (pytest.approx(2.3), pytest.approx(2.8))
        for name in ("time", "bandwidth"):
            assert any("DRAM copy" in t.get_text() for t in figs[name].axes[0].texts)
        assert not figs["speedup"].axes[0].texts
    finally:
        for fig in figs.values():
            report._pyplot().close(fig)
    gpu = report.sweep_figures(fake_series(), "bytes moved", TITLE)
    assert not any(ax.texts for fig in gpu.values() for ax in fig.axes)
    for fig in gpu.values():
        report._pyplot().close(fig)
