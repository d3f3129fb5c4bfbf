"""kernelkit.inspect: compile reports read from cubins built for sm_90 (registers, spills, shared memory,
occupancy, the change against the previous build), the SASS view, the `kernelkit inspect` command, and
(on a GPU) device printf/assert captured into the script's output."""
import ctypes
import functools
import io
import os
import subprocess
import sys
import textwrap

import pytest

import kernelkit
from kernelkit import device_output
from kernelkit.errors import KernelkitError
from kernelkit.inspect import compile_report as reports
from kernelkit.inspect import occupancy as occ
from kernelkit.inspect import resources, tools

SIMPLE = textwrap.dedent("""\
    extern "C" __global__ void scale(const float* x, float* out, float a, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a * x[i];
    }
    """)
# 48 live values with a 32-register cap: ptxas must spill (it reports 412/716 bytes for sm_90 with nvcc 13)
SPILLING = textwrap.dedent("""\
    extern "C" __global__ void spilly(const float* x, float* out, int n) {
      float v[48];
    #pragma unroll
      for (int j = 0; j < 48; ++j) v[j] = x[j * n + threadIdx.x];
      float s = 0;
    #pragma unroll
      for (int r = 0; r < 4; ++r)
    #pragma unroll
        for (int j = 0; j < 48; ++j) s = s * v[(j + r) % 48] + v[47 - j];
      out[threadIdx.x] = s;
    }
    """)
# a local array indexed at run time lives on the stack without being a spill
LOCAL_ARRAY = textwrap.dedent("""\
    extern "C" __global__ void __launch_bounds__(128) table(const int* idx, float* out) {
      float t[64];
      for (int j = 0; j < 64; ++j) t[j] = j * 0.5f;
      __shared__ float sh[1000];
      sh[threadIdx.x] = t[idx[threadIdx.x] & 63];
      __syncthreads();
      out[threadIdx.x] = sh[999 - threadIdx.x];
    }
    """)


def _have_cuobjdump():
    try:
        return tools.find("cuobjdump")
    except KernelkitError as e:
        return str(e)


needs_cuobjdump = pytest.mark.skipif(not os.path.isabs(_have_cuobjdump()),
                                     reason=f"no cuobjdump here: {_have_cuobjdump()}")


# ----------------------------------------------------------------------------------------------- occupancy
@pytest.mark.parametrize("arch, regs, block, smem, blocks, warps, limiter", [
    ("9.0", 32, 256, 0, 8, 64, "warps"),  # 32 regs x 2048 threads = the whole register file
    ("9.0", 64, 256, 0, 4, 32, "registers"),  # 2048 regs/warp: 8 warps per 16K-register sub-partition
    ("9.0", 40, 256, 0, 6, 48, "registers"),  # 1280 regs/warp: 12 per sub-partition, 48 per SM, 6 blocks of 8
    ("sm_86", 32, 256, 0, 6, 48, "warps"),  # 48 warps per SM on GA10x
    ("sm_90", 10, 128, 48 * 1024, 4, 16, "shared memory"),  # (48 KB + 1 KB reserved) x 4 <= 228 KB
    ("sm_89", 16, 32, 0, 24, 24, "blocks"),  # 24 resident blocks at most on Ada
    ("7.5", 16, 1024, 0, 1, 32, "warps"),  # Turing: 32 warps per SM
    ("9.0", 255, 1024, 0, 0, 0, "registers"),  # 256 regs/thread (rounded) x 1024 threads > 64K per block
    ("9.0", 16, 256, 228 * 1024, 0, 0, "shared memory"),  # more than one block may have
])
def test_occupancy_by_hand(arch, regs, block, smem, blocks, warps, limiter):
    o = occ.occupancy(arch, regs, block, smem)
    assert (o.blocks_per_sm, o.warps_per_sm, o.limiter) == (blocks, warps, limiter)


def test_occupancy_rejects_unknown_arch_and_bad_block():
    with pytest.raises(KernelkitError, match="arch"):
        occ.occupancy("sm_61", 32, 256)
    with pytest.raises(KernelkitError, match="block_size"):
        occ.occupancy("9.0", 32, 0)
    with pytest.raises(KernelkitError, match="registers"):
        occ.occupancy("9.0", -1, 128)


def test_usage_parsing_leaves_out_the_reserved_shared_memory_of_sm90_cubins():
    text = ("Fatbin elf code:\n================\narch = sm_90\n\nResource usage:\n Function sh1:\n"
            "  REG:10 STACK:0 SHARED:5024 LOCAL:0 CONSTANT[0]:360 TEXTURE:0 SURFACE:0 SAMPLER:0\n"
            "Fatbin elf code:\n================\narch = sm_80\n\nResource usage:\n Function sh1:\n"
            "  REG:10 STACK:0 SHARED:4000 LOCAL:0 CONSTANT[0]:360 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
    got = [(k.arch, k.registers, k.shared) for k in resources.parse_usage(text)]
    assert got == [("sm_90", 10, 4000), ("sm_80", 10, 4000)]


def test_missing_tool_names_the_package(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(tools, "_wheel_bins", lambda: [])
    monkeypatch.setattr(tools.Path, "is_file", lambda self: False)
    tools.find.cache_clear()
    try:
        with pytest.raises(KernelkitError, match=r"kernelkit\[inspect\].*nvidia-cuda-cuobjdump"):
            tools.find("cuobjdump")
    finally:
        tools.find.cache_clear()


# ------------------------------------------------------------------------------ reports from real cubins
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    reports._HISTORY.clear()
    return tmp_path


@needs_cuobjdump
def test_report_of_simple_spilling_and_local_array_kernels(cache):
    simple = kernelkit.inspect.report(kernelkit.load_kernels(SIMPLE, "simple", arch="9.0"), block_size=256)
    row = simple["scale"]
    assert row.arch == "sm_90" and 6 <= row.registers <= 24
    assert (row.spills, row.stack, row.shared) == (0, 0, 0)
    assert row.occupancy.fraction == 1.0 and row.max_dynamic_shared == 227 * 1024

    spilling = kernelkit.load_kernels(SPILLING, "spilling", arch="9.0", options=["--maxrregcount=32"])
    row = kernelkit.inspect.report(spilling)["spilly"]
    assert row.registers <= 32
    assert row.spill_stores > 0 and row.spill_loads > 0 and row.stack >= row.spill_stores

    row = kernelkit.inspect.report(kernelkit.load_kernels(LOCAL_ARRAY, "local_array", arch="9.0"))["table"]
    assert row.stack >= 256 and row.spills == 0  # the array is on the stack, but not a spill
    assert row.shared == 4000  # as declared (the sm_90 cubin counts 1 KB more)


@needs_cuobjdump
def test_report_shows_the_change_against_the_previous_build(cache):
    kernelkit.inspect.report(kernelkit.load_kernels(SPILLING, "edited", arch="9.0"))
    rep = kernelkit.inspect.report(kernelkit.load_kernels(SPILLING, "edited", arch="9.0", options=["--maxrregcount=32"]))
    (line,) = rep.diff()
    assert line.startswith("spilly (sm_90): regs ") and "→ 32" in line and "spill stores 0 → " in line
    assert rep.changes == rep.diff()  # asking again compares with the same previous build
    assert "changed since the previous build" in str(rep) and "spilly" in rep._repr_html_()
    reports._HISTORY.clear()  # a new process: the comparison comes from the cache's reports/
    again = kernelkit.inspect.report(kernelkit.load_kernels(SPILLING, "edited", arch="9.0", options=["--maxrregcount=32"]))
    assert again.diff() == [line]


@needs_cuobjdump
def test_sass_view_and_its_diff(cache):
    mod = kernelkit.load_kernels(SIMPLE, "viewed", arch="9.0")
    sass = kernelkit.inspect.code(mod)
    assert "Function : scale" in sass and "FMUL" in sass and "STG" in sass
    kernelkit.load_kernels(SIMPLE.replace("a * x[i]", "a + x[i]"), "viewed", arch="9.0")
    diff = kernelkit.inspect.code(mod, diff=True)
    assert "-" in diff and any(line.startswith("+") and "FADD" in line for line in diff.splitlines())
    with pytest.raises(KernelkitError, match="no PTX"):
        kernelkit.inspect.code(mod, kind="ptx")
    with pytest.raises(KernelkitError, match="kind"):
        kernelkit.inspect.code(mod, kind="asm")


@needs_cuobjdump
@pytest.mark.cuda_build
def test_inspect_command_on_a_card(cache, capsys):
    from kernelkit.frontends import cli

    assert cli.main(["inspect", "vector_add", "--arch", "9.0", "--block-size", "128"]) == 0
    out = capsys.readouterr().out
    assert "occupancy @128" in out and "sm_90" in out
    assert cli.main(["inspect", "vector_add", "--arch", "9.0", "--sass"]) == 0
    assert "STG" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------- GPU
PRINTF_SCRIPT = textwrap.dedent("""\
    import torch, kernelkit
    mod = kernelkit.load_kernels('''
    extern "C" __global__ void hello(int n) { if (threadIdx.x < n) printf("from the device %d\\\\n", threadIdx.x); }
    ''', "hello")
    print("before")
    with kernelkit.inspect.capture():
        mod.hello[1, 2](2)
    print("after")
    """)

ASSERT_SCRIPT = textwrap.dedent("""\
    import torch, kernelkit
    mod = kernelkit.load_kernels('''
    extern "C" __global__ void check(int n) { assert(n > 0); }  // NVRTC's assert needs no header
    ''', "asserting")
    torch.zeros(1, device="cuda")
    try:
        with kernelkit.inspect.capture():
            mod.check[1, 1](0)
    except kernelkit.KernelkitError as e:
        print("ERROR:", e)
    """)


def _script(text, tmp_path):
    path = tmp_path / "script.py"
    path.write_text(text)
    env = {**os.environ, "KERNELKIT_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.gpu
def test_device_printf_is_in_order_with_python_prints(tmp_path):
    done = _script(PRINTF_SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines[0] == "before" and lines[-1] == "after"
    assert sorted(lines[1:-1]) == ["[hello[1, 2]] from the device 0", "[hello[1, 2]] from the device 1"]


@pytest.mark.gpu
def test_device_assert_is_reported_with_the_kernel(tmp_path):
    done = _script(ASSERT_SCRIPT, tmp_path)
    error = [line for line in done.stdout.splitlines() if line.startswith("ERROR:")]
    assert error, done.stdout + done.stderr
    assert "assert failed" in error[0] and "check" in error[0] and "restart" in error[0]


HELLO = 'extern "C" __global__ void hello(int n) { if (threadIdx.x < n) printf("from the device %d\\n", threadIdx.x); }'
ASSERTING = 'extern "C" __global__ void check(int n) { assert(n > 0); }'


@pytest.mark.gpu
def test_only_kernels_that_print_launch_through_the_labelling_wrapper(tmp_path, monkeypatch):
    import torch

    from kernelkit.instant import launcher

    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    quiet = kernelkit.load_kernels(SIMPLE, "quiet_entry")
    loud = kernelkit.load_kernels(HELLO, "loud_entry")
    raw = launcher.module().launch
    assert quiet._build.prepare("scale")[0] is raw  # nothing added to a kernel that does not print
    assert loud._build.prepare("hello")[0] is not raw
    assert loud._build.prepare("hello")[0].__name__ == "launch_labelled"
    x = torch.ones(4, device="cuda")
    quiet.scale[1, 4](x, x, 2.0, 4)
    loud.hello[1, 2](0)  # outside a capture: the plain launch
    torch.cuda.synchronize()
    assert x.tolist() == [2.0] * 4


@pytest.mark.gpu
def test_device_printf_is_labelled_before_the_next_python_print_in_a_notebook(tmp_path, monkeypatch):
    """Live (sys.stdout is not fd 1, as in Jupyter): each launch's lines reach the stream before the next print."""
    import torch

    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    mod = kernelkit.load_kernels(HELLO, "hello_live")
    mod.hello[1, 1](0)  # loads the launcher and the cubin outside the capture; prints nothing
    torch.cuda.synchronize()
    out = _streams(monkeypatch)
    with kernelkit.inspect.capture():
        mod.hello[1, 2](2)
        print("between")
        mod.hello[(1, 1), 1](1)
        print("after")
    lines = out.getvalue().splitlines()
    assert sorted(lines[:2]) == ["[hello[1, 2]] from the device 0", "[hello[1, 2]] from the device 1"]
    assert lines[2:] == ["between", "[hello[(1, 1), 1]] from the device 0", "after"]


@pytest.mark.gpu
@pytest.mark.parametrize("regs, block, smem", [(32, 256, 0), (40, 256, 0), (64, 96, 0), (10, 128, 48 * 1024)])
def test_occupancy_matches_the_driver(regs, block, smem, tmp_path, monkeypatch):
    """The formula against cuOccupancyMaxActiveBlocksPerMultiprocessor for a kernel of known resources."""
    import torch
    from cuda.bindings import driver

    monkeypatch.setenv("KERNELKIT_CACHE_DIR", str(tmp_path / "cache"))
    major, minor = torch.cuda.get_device_capability()
    src = ('extern "C" __global__ void k(float* o) { extern __shared__ float d[]; '
           'if (o) { d[threadIdx.x] = threadIdx.x; __syncthreads(); o[threadIdx.x] = d[0]; } }')
    mod = kernelkit.load_kernels(src, f"occ{regs}", options=[f"--maxrregcount={regs}"])
    row = kernelkit.inspect.report(mod)["k"]
    torch.zeros(1, device="cuda")
    err, cumod = driver.cuModuleLoadData(mod.cubin.read_bytes())
    assert err == driver.CUresult.CUDA_SUCCESS
    err, fn = driver.cuModuleGetFunction(cumod, b"k")
    driver.cuFuncSetAttribute(fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, block, smem)
    assert err == driver.CUresult.CUDA_SUCCESS
    assert occ.occupancy(f"{major}.{minor}", row.registers, block, row.shared, smem).blocks_per_sm == blocks


C_PRINTF_SCRIPT = textwrap.dedent("""\
    import ctypes, sys, kernelkit
    libc = ctypes.CDLL(None)
    print("before")
    with kernelkit.inspect.capture():
        libc.printf(b"from C\\n")
        print("inside")
        libc.fputs(b"to stderr\\n", ctypes.c_void_p.in_dll(libc, "stderr"))
    print("after")
    """)


def test_capture_orders_c_output_with_python_prints(tmp_path):
    """Without a GPU: C-level writes (as the driver's printf flush is) land between the Python prints, even
    with Python's stdout block-buffered into a pipe."""
    done = _script(C_PRINTF_SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["before", "from", "C", "inside", "after"]
    assert done.stderr.strip() == "to stderr"


# ------------------------------------------------------------------------------- launch brackets (no GPU)
BRACKET_SCRIPT = textwrap.dedent("""\
    import ctypes, kernelkit
    from kernelkit import device_output
    libc = ctypes.CDLL(None)
    print("before")
    with kernelkit.inspect.capture():
        libc.printf(b"outside\\n")
        with device_output.launch_bracket("k[1, 2]"):
            libc.printf(b"from k 0\\n")
            libc.printf(b"from k 1\\n")
        print("inside")
        libc.printf(b"outside again\\n")
    print("after")
    """)


def _streams(monkeypatch):
    """sys.stdout and sys.stderr as a notebook has them: Python objects that are not fds 1 and 2."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    return out


def test_bracketed_c_output_is_labelled_in_a_script(tmp_path):
    """A script: Python's prints share the pipe with C's output; only the bracket's lines are labelled."""
    done = _script(BRACKET_SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before", "outside", "[k[1, 2]] from k 0", "[k[1, 2]] from k 1", "inside",
                                        "outside again", "after"]
    assert "\x1f" not in done.stdout + done.stderr


def test_bracketed_c_output_reaches_a_notebook_before_the_next_print(monkeypatch):
    libc = ctypes.CDLL(None)
    out = _streams(monkeypatch)
    with kernelkit.inspect.capture() as cap:
        print("first")
        with device_output.launch_bracket("k[1, 2]"):
            libc.printf(b"from k\n")
            libc.printf(b"no newline")
        print("right after")  # written straight to the stream: the bracket must have waited for its lines
    assert out.getvalue().splitlines() == ["first", "[k[1, 2]] from k", "[k[1, 2]] no newline", "right after"]
    assert cap.text()[0] == "[k[1, 2]] from k\n[k[1, 2]] no newline\n"


def test_a_bracket_outside_a_capture_does_nothing(capfd):
    with device_output.launch_bracket("k[1, 1]"):
        print("plain")
    assert capfd.readouterr().out == "plain\n"


@functools.lru_cache(maxsize=None)
def _shouting_op():
    import torch

    libc = ctypes.CDLL(None)

    @torch.library.custom_op("kktest::shout", mutates_args=())
    def shout(x: torch.Tensor) -> torch.Tensor:
        libc.printf(b"shouting %d\n", ctypes.c_int(x.numel()))
        return x + 1

    return shout


def test_per_launch_labels_custom_ops_and_leaves_torch_ops_alone(monkeypatch):
    import torch

    shout = _shouting_op()
    labels = []
    begin = device_output.Capture.begin
    monkeypatch.setattr(device_output.Capture, "begin",
                        lambda self, label, stream=None: labels.append(label) or begin(self, label, stream))
    out = _streams(monkeypatch)
    with kernelkit.inspect.capture(per_launch=True):
        torch.add(torch.ones(2), 1)
        shout(torch.ones(3))
        print("after")
    assert labels == ["kktest::shout"]
    assert out.getvalue().splitlines() == ["[kktest::shout] shouting 3", "after"]
    with kernelkit.inspect.capture():  # per_launch off: the op's output is there, unlabelled
        shout(torch.ones(2))
    assert labels == ["kktest::shout"] and out.getvalue().splitlines()[-1] == "shouting 2"


def _bracketed(markers, label, inner):
    number = markers.open(label)
    return markers.marker(number, end=False).decode() + inner + markers.marker(number, end=True).decode()


def test_markers_cut_anywhere_by_pipe_reads_are_taken_out():
    want = "a\x1fb\n[k[1, 2]] x\n[k[1, 2]] y\nafter\n"  # a \x1f of the program's own stays
    size = len("a\x1fb\n" + _bracketed(device_output._Markers(), "k", "x\ny") + "after\n")
    for cut in range(size + 1):
        for cut2 in range(cut, size + 1):
            markers = device_output._Markers()
            text = "a\x1fb\n" + _bracketed(markers, "k[1, 2]", "x\ny") + "after\n"
            out, err = device_output._Sink(markers), device_output._Sink(markers)
            for chunk in (text[:cut], text[cut:cut2], text[cut2:]):
                out.write(chunk)
            err.write(text)
            out.finish()
            assert out.copy.getvalue() == want, (cut, cut2)
            assert markers.labels == {}  # both fds saw the end: the label is dropped


def test_an_unterminated_bracket_is_written_out_with_its_label():
    markers = device_output._Markers()
    stream = io.StringIO()
    sink = device_output._Sink(markers, stream)
    number = markers.open("k[1, 1]")
    start = markers.marker(number, end=False).decode()
    event = sink.expect(number)
    for chunk in ("before\n" + start[:5], start[5:] + "dang", "ling"):
        sink.write(chunk)
    sink.finish()
    assert stream.getvalue() == sink.copy.getvalue() == "before\n[k[1, 1]] dangling\n"
    assert event.is_set()  # nobody waits past the close


def test_wrapped_launch_is_labelled_with_the_kernel_and_its_configuration(monkeypatch):
    """The instant-kernel wrapper, with a stand-in for the launcher's launch: plain outside a capture,
    bracketed with ``expr[grid, block]`` inside one."""
    from kernelkit.instant.kernels import _labelled_launch

    libc = ctypes.CDLL(None)
    calls = []

    def launch(*args):
        calls.append(args)
        libc.printf(b"from the stand-in\n")
        libc.fflush(None)

    wrapped = _labelled_launch(launch, "axpy<float>")
    arguments = ("handle", "axpy<float>", b"pf", (None, None), ("x", "a"), (4, 1), 256, 0, None, (1, 2.0))
    wrapped(*arguments)
    out = _streams(monkeypatch)
    with kernelkit.inspect.capture():
        wrapped(*arguments)
    assert calls == [arguments, arguments]
    assert out.getvalue() == "[axpy<float>[(4, 1), 256]] from the stand-in\n"


@pytest.mark.cuda_build
def test_only_cubins_that_call_printf_or_assert_count_as_printing(cache):
    from kernelkit.instant.kernels import compile_kernels

    assert compile_kernels(HELLO, "hello_prints", arch="9.0").prints()
    assert compile_kernels(ASSERTING, "assert_prints", arch="9.0").prints()
    assert not compile_kernels(SIMPLE, "simple_prints", arch="9.0").prints()


def test_kernel_names_are_cut_only_where_they_stay_apart():
    """Template instantiations differ in their middle as often as at their ends: a cut that makes two rows read
    the same is not made."""
    from kernelkit.inspect.compile_report import _NAME_WIDTH, _shown

    head, tail = "kk::elementwise_kernel<" + "x" * _NAME_WIDTH, "y" * _NAME_WIDTH + ">"
    same_ends = [f"{head}, {k}, {tail}" for k in (1, 2)]
    other = "void kk::" + "z" * (3 * _NAME_WIDTH) + "(float*)"
    shown = _shown(same_ends + [other, "void small(int)"])
    assert shown[same_ends[0]] != shown[same_ends[1]] and "…" not in shown[same_ends[0]]
    assert "…" in shown[other] and len(shown[other]) == _NAME_WIDTH and shown["void small(int)"] == "small"
