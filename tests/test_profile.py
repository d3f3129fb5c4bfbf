"""kernelkit.profile: ncu's CSV read into the numbers that say why (from fixtures recorded with ncu 2025.3.1 on an
H100), the parent side end to end with a stand-in ncu (permission error, a child's failure, no kernel, the
command line), the refusals (no ncu, a lambda), the roofline plot, `kernelkit profile`; on a GPU with ncu, the
real thing."""
import csv
import io
import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit.errors import KernelkitError
from kernelkit.frontends.cli import main
from kernelkit.inspect import profiling

NCU_FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
RAW = (NCU_FIXTURES / "vector_add_raw.csv").read_text()
DETAILS = (NCU_FIXTURES / "vector_add_details.csv").read_text()


# ------------------------------------------------------------------------------------------- parsing
def test_raw_page_gives_the_numbers_that_say_why():
    res = profiling.parse(RAW, "vector_add")
    assert len(res) == 1
    k = res[0]
    assert k.name.startswith("void elementwise_kernel<float, 2, 1, 512, 2, 0, AddOp<float>>(")
    assert k.short_name.startswith("elementwise_kernel<") and "(" not in k.short_name
    assert k.duration_us == pytest.approx(1031.712)
    assert (k.dram_pct, k.l2_pct, k.sm_pct, k.occupancy_pct, k.memory_pct) == (92.74, 84.61, 15.46, 70.50, 92.74)
    assert (k.registers, k.blocks, k.block_threads, k.sm_count) == (16, 262144, 512, 132)
    assert (k.grid, k.block) == ("(262144, 1, 1)", "(512, 1, 1)")
    assert (k.dram_bytes, k.dram_read_bytes, k.dram_write_bytes) == (3_207_443_456, 2_147_534_592, 1_059_908_864)
    # a + alpha * b: one FFMA per element of 2**28, two FLOPs each; no FP64/FP16 metric in this CSV
    assert k.flops == 2 * 268_435_456 and k.flops_by_precision == {"fp32": 2 * 268_435_456}
    assert k.intensity == pytest.approx(536_870_912 / 3_207_443_456)
    assert k.gbps == pytest.approx(3_207_443_456 / 1031.712e-6 / 1e9)
    assert k.gflops == pytest.approx(536_870_912 / 1031.712e-6 / 1e9)
    assert (k.limiter, k.reason, k.verdict) == ("memory", "DRAM 93% of peak", "memory (DRAM 93% of peak)")
    assert res.device == {"name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sm_count": 132, "clock_hz": 1.98e9,
                          "memory_clock_hz": 2.619e9, "memory_bus_bits": 5120}
    assert res.peak_flops == pytest.approx(132 * 1.98e9 * 128 * 2)  # 66.9 TFLOP/s, H100 SXM's FP32 figure
    assert res.peak_bandwidth == pytest.approx(2.619e9 * 2 * 5120 / 8)  # 3.35 TB/s, its HBM3 figure
    text = str(res)
    assert text.splitlines()[0].startswith("vector_add on NVIDIA H100 80GB HBM3 (sm_90): 1 kernel launch(es), 1.03 ms")
    for cell in ("1.03 ms", "93%", "85%", "15%", "70%", "262144 x 512", "3.21 GB", "0.167", "3109", "520",
                 "memory (DRAM 93% of peak)"):
        assert cell in text, cell
    assert "<table>" in res._repr_html_() and "memory (DRAM 93% of peak)" in res._repr_html_()
    assert res.raw == RAW and res["elementwise_kernel"] is k


def test_details_page_gives_the_same_numbers_and_ncus_advice():
    res = profiling.parse(DETAILS)
    k = res[0]
    assert k.duration_us == pytest.approx(1031.776)
    assert (k.dram_pct, k.l2_pct, k.sm_pct, k.occupancy_pct) == (92.74, 84.44, 15.46, 70.43)
    assert (k.registers, k.blocks, k.block_threads, k.sm_count) == (16, 262144, 512, 132)
    assert k.gbps == pytest.approx(3108.997, rel=1e-5)  # its DRAM "Memory Throughput", 3,108,997,053,624 byte/s
    assert k.flops is None and k.intensity is None  # the details page counts no FLOPs
    assert k.limiter == "memory"
    assert [a.split(":")[0] for a in k.advice] == ["INF SOLBottleneck", "OPT HighPipeUtilization",
                                                   "OPT AchievedOccupancy"]
    assert res.device["clock_hz"] == pytest.approx(1_992_741_035.84) and res.device["cc"] == "9.0"
    assert "ncu: " in str(res) and "SOLBottleneck" in str(res)


def test_a_metric_missing_from_the_csv_is_left_out():
    header, *rows = list(csv.reader(io.StringIO(RAW[RAW.index('"ID"'):])))
    keep = [i for i, h in enumerate(header) if not h.startswith(("sm__sass", "dram__bytes"))]
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows([[r[i] for i in keep] for r in [header, *rows]])
    k = profiling.parse(out.getvalue())[0]
    assert k.flops is None and k.dram_bytes is None and k.intensity is None and k.gbps is None
    assert k.duration_us == pytest.approx(1031.712) and k.limiter == "memory"
    assert "-" in str(profiling.parse(out.getvalue()))


def test_numbers_and_units():
    assert profiling._number("2,618,906,429.30") == pytest.approx(2_618_906_429.30)
    assert profiling._number("1.5", "Gbyte") == 1.5e9
    assert profiling._number("2.5", "usecond") == 2500.0 and profiling._number("3", "ms") == 3e6
    assert profiling._number("7", "Mbyte/s") == 7e6 and profiling._number("92.74", "%") == 92.74
    assert profiling._number("no data", "%") is None and profiling._number("", "") is None
    assert profiling._number(None) is None


def _kernel(**kw):
    base = dict(id=0, name="void k(float*)", duration_us=10.0, dram_pct=10.0, l2_pct=10.0, sm_pct=10.0,
                occupancy_pct=50.0, memory_pct=None, registers=32, grid="(1024, 1, 1)", block="(256, 1, 1)",
                blocks=1024, block_threads=256, sm_count=132, dram_bytes=None)
    return profiling.KernelProfile(**{**base, **kw})


def test_the_limiter_names_the_busiest_unit_or_latency():
    assert _kernel(sm_pct=85.0).verdict == "compute (SM 85% of peak)"
    assert _kernel(l2_pct=75.0, dram_pct=40.0).verdict == "L2 (L2 75% of peak)"
    assert _kernel(dram_pct=70.0, l2_pct=70.0).limiter == "memory"  # a tie goes to DRAM
    # a stream on an H200: its bytes cross L2 on their way to DRAM, so L2 shows a little busier
    assert _kernel(dram_pct=90.97, l2_pct=93.14).verdict == "memory (DRAM 91% of peak)"
    assert _kernel(dram_pct=70.0, l2_pct=90.0).limiter == "L2"  # far busier than DRAM: reuse in L2 is the limit
    small = _kernel(blocks=4)
    assert small.limiter == "latency" and "small grid: 4 blocks for 132 SMs" in small.reason
    assert "low occupancy: 12% achieved" in _kernel(occupancy_pct=12.0).reason
    assert _kernel().verdict == ("latency (neither memory nor compute above 60% of peak (small grid? low "
                                 "occupancy?))")
    assert _kernel(dram_pct=None, l2_pct=None, sm_pct=None).limiter == "unknown"


def test_roofline_plot_writes_a_png(tmp_path):
    res = profiling.parse(RAW, "vector_add")
    res.bandwidth = 3.0e12  # as measured on the H100 host
    fig = res.plot(tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:3] == ["measured copy bandwidth: 3000 GB/s", "DRAM peak: 3352 GB/s", "FP32 peak: 66.9 TFLOP/s"]
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    profiling.parse(DETAILS).plot(tmp_path / "no_flops.png")  # nothing to draw but the roofs: still a plot


def test_to_dict_is_json():
    d = json.loads(json.dumps(profiling.parse(RAW, "vector_add").to_dict()))
    assert d["kernels"][0]["limiter"] == "memory" and d["kernels"][0]["flops"] == 536_870_912
    assert d["device"]["fp32_peak_flops"] == pytest.approx(6.690816e13)


# ------------------------------------------------------------------------------------------- a stand-in ncu
def _fake_ncu(tmp_path, monkeypatch, body: str) -> Path:
    """KERNELKIT_NCU pointing at a Python script that records its command line and the spec, then runs ``body``
    (``spec`` is the child's spec); and a GPU index, so the parent side runs without a GPU."""
    script = tmp_path / "ncu"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""\
        import json, shutil, sys
        from pathlib import Path
        rec = Path({str(tmp_path)!r})
        (rec / "argv.json").write_text(json.dumps(sys.argv))
        spec = json.loads(Path(sys.argv[-1]).read_text())
        (rec / "spec.json").write_text(json.dumps(spec))
        if spec["inputs"]:
            shutil.copy(spec["inputs"], rec / "inputs.pt")
        """) + textwrap.dedent(body))
    script.chmod(0o755)
    monkeypatch.setenv("KERNELKIT_NCU", str(script))
    monkeypatch.setattr(profiling, "_gpu_index", lambda args, kwargs: 0)
    return script


def test_stand_in_ncu_csv_gives_a_result_and_the_right_command(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, f"""\
        Path(spec["result"]).write_text("{{}}")
        print("==PROF== Connected to process 1")
        sys.stdout.write(Path({str(NCU_FIXTURES / 'vector_add_raw.csv')!r}).read_text())
        """)
    a, b = torch.randn(100), torch.randn(100)
    started = time.perf_counter()
    res = kernelkit.profile(torch.ops.aten.add.Tensor, a, b, alpha=2)
    print(f"kernelkit.profile with a stand-in ncu: {time.perf_counter() - started:.2f} s")
    assert isinstance(res, profiling.ProfileResult) and res.op == "aten::add.Tensor"
    assert res[0].limiter == "memory" and res.seconds is not None and "==PROF== Connected" in res.raw
    argv = json.loads((tmp_path / "argv.json").read_text())
    joined = " ".join(argv)
    for part in ("--clock-control none", "--profile-from-start off", "--target-processes all", "--csv",
                 "--page raw", f"{sys.executable} -m kernelkit.inspect.profile_child"):
        assert part in joined, part
    metrics = argv[argv.index("--metrics") + 1].split(",")
    assert "gpu__time_duration.sum" in metrics and "sm__sass_thread_inst_executed_op_hfma_pred_on.sum" in metrics
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert spec["call"] == {"kind": "op", "ns": "aten", "name": "add", "overload": "Tensor"} and spec["preload"] == []
    sent = torch.load(tmp_path / "inputs.pt")
    assert torch.equal(sent["args"][0], a) and torch.equal(sent["args"][1], b) and sent["kwargs"] == {"alpha": 2}
    assert not Path(spec["result"]).parent.exists()  # the private directory is gone


def test_stand_in_ncu_without_permission_says_how_to_enable_counters(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, """\
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
              "Counters on the target device 0. For instructions on enabling permissions and to get more information "
              "see https://developer.nvidia.com/ERR_NVGPUCTRPERM")
        sys.exit(1)
        """)
    with pytest.raises(KernelkitError) as e:
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))
    msg = str(e.value)
    for part in ("ERR_NVGPUCTRPERM", "root", "NVreg_RestrictProfilingToAdminUsers=0", "--cap-add SYS_ADMIN",
                 "https://developer.nvidia.com/ERR_NVGPUCTRPERM"):
        assert part in msg, part
    assert "Traceback" not in msg


def test_a_failing_op_shows_its_error_and_the_output_tail(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, """\
        print("\\n".join(f"line {i}" for i in range(500)))
        Path(spec["result"]).write_text(json.dumps({"error": "RuntimeError: boom"}))
        sys.exit(1)
        """)
    with pytest.raises(KernelkitError, match="aten::add.Tensor failed in the profiling process: RuntimeError: boom"
                       ) as e:
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))
    assert "line 499" in str(e.value) and "line 100\n" not in str(e.value)  # the tail, bounded


def test_ncu_failing_before_the_child_ran_shows_its_output(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, """\
        print("==ERROR== Failed to find metric sm__nope")
        sys.exit(1)
        """)
    with pytest.raises(KernelkitError, match=r"(?s)ncu exited with code 1.*Failed to find metric sm__nope"):
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))


def test_no_kernel_profiled_asks_whether_the_op_ran_on_the_cpu(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, """\
        Path(spec["result"]).write_text("{}")
        print("==WARNING== No kernels were profiled.")
        """)
    with pytest.raises(KernelkitError, match="no kernel of aten::add.Tensor.*CPU.*tensor arguments are on cpu"):
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))


def test_ncu_not_found_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELKIT_NCU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(profiling, "NCU_DIRS", [str(tmp_path / "cuda" / "bin")])
    with pytest.raises(KernelkitError, match="ncu: not found in KERNELKIT_NCU.*on PATH.*export KERNELKIT_NCU="):
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))
    monkeypatch.setenv("KERNELKIT_NCU", str(tmp_path / "missing" / "ncu"))
    with pytest.raises(KernelkitError, match="KERNELKIT_NCU=.*missing/ncu is not an executable file"):
        profiling.find_ncu()
    found = tmp_path / "nsight-compute" / "2025.3.1"
    found.mkdir(parents=True)
    shutil.copy("/bin/true", found / "ncu")
    monkeypatch.delenv("KERNELKIT_NCU")
    monkeypatch.setattr(profiling, "NCU_DIRS", [str(tmp_path / "cuda" / "bin"), str(tmp_path / "nsight-compute" / "*")])
    assert profiling.find_ncu() == str(found / "ncu")


def test_ncu_is_looked_up_afresh_when_kernelkit_ncu_changes(tmp_path, monkeypatch):
    first, second = tmp_path / "a" / "ncu", tmp_path / "b" / "ncu"
    for exe in (first, second):
        exe.parent.mkdir()
        shutil.copy("/bin/true", exe)
    monkeypatch.setenv("KERNELKIT_NCU", str(first))
    assert profiling.find_ncu() == str(first)
    monkeypatch.setenv("KERNELKIT_NCU", str(second))
    assert profiling.find_ncu() == str(second)


def _local_function(x):
    return x


def test_what_the_child_cannot_find_by_name_is_refused_clearly(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, "sys.exit(3)\n")
    x = torch.ones(3)
    with pytest.raises(KernelkitError, match="must find it by name: pass a card name.*not a lambda"):
        kernelkit.profile(lambda t: t * 2, x)

    def inner(t):
        return t

    with pytest.raises(KernelkitError, match="not a function defined inside another function"):
        kernelkit.profile(inner, x)
    with pytest.raises(KernelkitError, match="got int"):
        kernelkit.profile(3, x)
    in_notebook = _local_function
    monkeypatch.setattr(in_notebook, "__module__", "__main__")
    with pytest.raises(profiling.ProfileError, match="defined in __main__ .a notebook or a script.*into a module"):
        kernelkit.profile(in_notebook, x)
    assert not (tmp_path / "argv.json").exists()  # refused before ncu ran


def test_an_importable_function_and_kernelkit_ops_are_sent_by_name(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, f"""\
        Path(spec["result"]).write_text("{{}}")
        sys.stdout.write(Path({str(NCU_FIXTURES / 'vector_add_raw.csv')!r}).read_text())
        """)
    x = torch.ones(3)
    assert kernelkit.profile(torch.nn.functional.relu, x).op == "torch.nn.functional.relu"
    assert json.loads((tmp_path / "spec.json").read_text())["call"] == {
        "kind": "function", "module": "torch.nn.functional", "path": "relu"}
    kernelkit.profile(torch.add, x, x)  # a builtin: found by its bare name
    assert json.loads((tmp_path / "spec.json").read_text())["call"]["path"] == "add"
    kernelkit.profile(kernelkit.ops.vector_add, x, x)
    assert json.loads((tmp_path / "spec.json").read_text())["call"] == {
        "kind": "function", "module": "kernelkit.ops", "path": "vector_add"}


def test_a_function_of_an_extension_kernelkit_loaded_is_imported_again_from_its_file(tmp_path, monkeypatch):
    import importlib.machinery
    import types

    from kernelkit.jit import registry

    _fake_ncu(tmp_path, monkeypatch, f"""\
        Path(spec["result"]).write_text("{{}}")
        sys.stdout.write(Path({str(NCU_FIXTURES / 'vector_add_raw.csv')!r}).read_text())
        """)
    module = types.ModuleType("my_ext")  # as load_inline(functions=...) returns it: not in sys.modules

    def scale(t):
        return t

    scale.__module__ = "my_ext_0123abcd"  # the import name its pybind11 functions carry
    module.__spec__ = importlib.machinery.ModuleSpec("my_ext_0123abcd", None)
    module.scale = scale
    monkeypatch.setitem(registry.EXTENSIONS, "somekey", (module, tmp_path / "my_ext.so"))
    res = kernelkit.profile(scale, torch.ones(3))
    assert res.op == "my_ext.scale"
    assert json.loads((tmp_path / "spec.json").read_text())["call"] == {
        "kind": "extension", "import_name": "my_ext_0123abcd", "path": str(tmp_path / "my_ext.so"), "attr": "scale"}


def test_the_cli_prints_the_table_json_and_plot(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_profile(card, kernels_dir=None, **inputs):
        seen.update(card=card, kernels_dir=kernels_dir, **inputs)
        return profiling.parse(RAW, card)

    monkeypatch.setattr(profiling, "profile", fake_profile)
    assert main(["profile", "vector_add", "--size", "2**28", "--plot", str(tmp_path / "r.png")]) == 0
    out = capsys.readouterr().out
    assert "memory (DRAM 93% of peak)" in out and f"wrote {tmp_path / 'r.png'}" in out
    assert seen == {"card": "vector_add", "kernels_dir": None, "size": (1 << 28,)} and (tmp_path / "r.png").is_file()
    assert main(["profile", "vector_add", "--json", "--dtype", "fp16"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"][0]["limiter"] == "memory"
    assert seen["dtype"] == "float16"  # a name: the CLI checks it before importing torch


def test_profile_help_works_without_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "kernelkit", "profile", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Nsight Compute" in proc.stdout and "--size" in proc.stdout and "--plot" in proc.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "kernelkit.frontends.cli" in imported and "torch" not in imported


def test_without_a_gpu_it_says_so(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    monkeypatch.setattr(profiling, "find_ncu", lambda: "/bin/true")
    with pytest.raises(KernelkitError, match="needs a CUDA GPU"):
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))


# ------------------------------------------------------------------------------------------- on a GPU
def _ncu_problem():
    try:
        profiling.find_ncu()
    except KernelkitError as e:
        return str(e)
    return None


needs_ncu = pytest.mark.skipif(_ncu_problem() is not None, reason=f"no ncu here: {_ncu_problem()}")


def _profile_or_skip(*args, **kwargs):
    """The result; a skip (after checking the message) where ncu may not read the counters."""
    started = time.perf_counter()
    try:
        res = kernelkit.profile(*args, **kwargs)
    except KernelkitError as e:
        if "ERR_NVGPUCTRPERM" not in str(e):
            raise
        assert "NVreg_RestrictProfilingToAdminUsers=0" in str(e)
        pytest.skip(f"counters not permitted here: {str(e)[:200]}")
    print(f"\nkernelkit.profile wall time: {time.perf_counter() - started:.2f} s\n{res}")
    return res


@pytest.fixture(scope="module")
def vector_add_profile():
    return _profile_or_skip("vector_add", size=1 << 28)


@pytest.mark.gpu
@needs_ncu
def test_vector_add_card_is_memory_bound(vector_add_profile):
    res = vector_add_profile
    assert "vector_add" in res.op and "268435456" in res.op and "float32" in res.op
    k = max(res, key=lambda k: k.duration_us)
    assert k.dram_pct >= 80 and k.limiter == "memory", str(res)
    assert k.dram_bytes == pytest.approx(3 * 4 * (1 << 28), rel=0.1)
    assert (1 << 28) <= k.flops <= (1 << 29)  # one FADD or FFMA per element
    assert res.bandwidth and res.peak_flops and res.peak_bandwidth and res.device["name"]


@pytest.mark.gpu
@needs_ncu
def test_roofline_png_of_a_real_profile(vector_add_profile, tmp_path):
    vector_add_profile.plot(tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.gpu
@needs_ncu
def test_kernelkit_op_with_explicit_tensors():
    a, b = torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda")
    res = _profile_or_skip(kernelkit.ops.vector_add, a, b, alpha=0.5)
    assert res.op == "kernelkit.ops.vector_add" and len(res) >= 1
    k = max(res, key=lambda k: k.duration_us)
    assert k.dram_read_bytes >= 0.9 * 2 * 4 * (1 << 24)  # both inputs come from DRAM (ncu flushes the caches)


@pytest.mark.gpu
@needs_ncu
def test_a_library_op_by_its_namespace():
    lib = kernelkit.load("vector_add")
    a = torch.randn(1 << 20, device="cuda")
    res = _profile_or_skip(lib.vector_add, a, a)
    assert res.op == f"{lib.ns}::vector_add" and len(res) >= 1


@pytest.mark.gpu
@needs_ncu
def test_an_op_on_the_cpu_profiles_no_kernel():
    with pytest.raises(KernelkitError, match="no kernel|ERR_NVGPUCTRPERM"):
        kernelkit.profile(torch.ops.aten.add.Tensor, torch.ones(3), torch.ones(3))
