"""Dtype shards (kernelkit.jit.fast.shards): a card's .cu compiled as four TUs, one per floating dtype, only where
the four linked together are the file compiled once. CI: which files shard and why not, the setting, and a
card built both ways (its CPU code in the sharded .cu gives the same bits; a kernel edit recompiles the four
shards' device code alone; the prebuilt source key is the same). GPU: every shardable built-in and scaffold
card gives the same bits on CUDA both ways, from the same SASS per kernel."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit import settings
from kernelkit.errors import KernelkitError
from kernelkit.frontends import scaffold
from kernelkit.jit import cards, keys, plan, prebuilt, running, toolchain, units
from kernelkit.jit.fast import shards
from kernelkit.jit.sources import INCLUDE

KERNELS = Path(kernelkit.__file__).resolve().parent.parent / "kernels"
SHARDED = ["sigmoid", "vector_add", "elementwise_mul", "ddpm_step", "sample_normal"]
KINDS = ["unary", "binary", "custom"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

HEAD = "#include <kernelkit/elementwise.cuh>\n"
CALL = "KK_UNARY_CUDA_LAUNCHER(kk::Op);\n"
OP = "namespace kk { template <typename A> struct Op { KK_MATH_FN A operator()(A x) const { return x; } }; }\n"


def _blocker(path: Path):
    text = path.read_text()
    deps, _, _ = keys.unit_inputs("cu", path, text, [f"-I{path.parent}", f"-I{INCLUDE}"])
    return shards.blocker(text, tuple(deps))


@pytest.mark.parametrize("name", SHARDED)
def test_the_builtin_cards_made_of_instantiation_macros_shard(name):
    assert _blocker(KERNELS / f"{name}.cu") is None


def test_a_card_with_its_own_kernels_and_variables_is_compiled_whole():
    assert _blocker(KERNELS / "conv1d_gn_mish.cu") is not None


@pytest.mark.parametrize("kind", KINDS)
def test_every_scaffold_kind_shards(tmp_path, kind):
    scaffold.new_card("sc_" + kind, tmp_path, kind)
    assert _blocker(tmp_path / f"sc_{kind}.cu") is None


@pytest.mark.parametrize("extra, reason", [
    ("__device__ int counter;\n", "device variable"),
    ("__constant__ float coef[4];\n", "device variable"),
    ("static __device__ float scratch;\n", "device variable"),
    ("int calls = 0;\n", "a variable"),
    ("static int calls;\n", "a variable"),
    ("float host_helper(float x) { return x; }\n", "not inline"),
    ("static float host_helper(float x) { return x; }\n", "not inline"),
    ("__global__ void plain(float* x) { x[0] = 1; }\n", "not inline"),
    ("template <typename T> __device__ T table;\n", "variable template"),
    ('extern "C" int c_entry(int);\n', "linkage specification"),
    ("#define HEADER <cstdio>\n#include HEADER\n", "#include"),
    ("SOME_REGISTRATION(kk::Op);\n", "not a call of a kernelkit"),
    ("#define KERNELKIT_DTYPE_SHARD 0\n", "names KERNELKIT_DTYPE_SHARD"),
    ("#if KERNELKIT_DTYPE_SHARD == 0\n#include \"extra.h\"\n#endif\n", "names KERNELKIT_DTYPE_SHARD"),
    ("#undef KK_HD\n", "defines KK_HD"),
    ("namespace kk { struct Holder { int x; } holder; }\n", "a variable"),
    ("int broken( {\n", "grammar"),
    ("#ifdef USE_SCRATCH\n__device__ float scratch;\n#endif\n", "device variable"),
    ("template <typename T> T twice(T x) { return x + x; }\ntemplate <> float twice<float>(float x) { return 2 * x; }\n",
     "explicit specialization"),
    ("namespace kk { namespace detail {\nint calls = 0;\n} }\n", "line 4: a variable"),  # the innermost line
    ("__device__ float not_inline(float x) { return x; }\n", "not inline"),
    ("#define KK_MATH_FN\nKK_MATH_FN float mine(float x) { return x; }\n", "defines KK_MATH_FN"),
])
def test_what_would_exist_once_per_shard_keeps_the_file_whole(extra, reason):
    why = shards.blocker(HEAD + OP + extra + CALL, ())
    assert why is not None and reason in why, why


@pytest.mark.parametrize("extra", [
    "#ifdef KERNELKIT_BINDING\nKERNELKIT_LIBRARY(m) { m.def(\"x\"); }\nint only_in_the_binding = 1;\n#endif\n",
    "#ifndef KERNELKIT_BINDING\nconstexpr int kN = 4;\n#else\nint only_in_the_binding = 1;\n#endif\n",
    "inline float host_helper(float x) { return x; }\nstruct Pod { int a; };\nenum class E { a, b };\n",
    "using U = float;\ntypedef double V;\nstatic_assert(sizeof(float) == 4, \"x\");\nfloat declared_elsewhere(float);\n",
    "namespace { template <typename T> __global__ void k(T* x) { x[0] = T(1); } }\n",
    "KK_HD float both(float x) { return x; }\n__device__ __forceinline__ float dev(float x) { return x; }\n",
    "KK_DEVICE float d(float x) { return x; }\n__inline__ int g() { return 1; }\n__forceinline__ int h() { return 1; }\n",
    "template <typename T> T twice(T x) { return x + x; }\ntemplate <> inline float twice<float>(float x) { return 2 * x; }\n",
])
def test_types_templates_inline_functions_and_binding_only_code_shard(extra):
    assert shards.blocker(HEAD + OP + extra + CALL, ()) is None


def test_a_file_without_an_instantiation_macro_is_not_worth_sharding():
    assert "no call" in shards.blocker(HEAD + OP, ())


def test_a_local_header_is_held_to_the_same_rules(tmp_path):
    header = tmp_path / "mine.h"
    header.write_text("#pragma once\n__device__ int counter;\n")
    why = shards.blocker(HEAD + '#include "mine.h"\n' + OP + CALL, (header,))
    assert why is not None and why.startswith("mine.h: line 2: a device variable"), why
    header.write_text("#pragma once\ntemplate <typename A> struct Twice { KK_MATH_FN A operator()(A x) const; };\n")
    assert shards.blocker(HEAD + '#include "mine.h"\n' + OP + CALL, (header,)) is None


def test_the_setting_and_the_cores_decide(monkeypatch):
    text = HEAD + OP + CALL
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv(settings.DTYPE_SHARDS.name, raising=False)
    assert shards.count("cu", False, text, [], [], "d") == 4
    assert shards.count("cpp", False, text, [], [], "d") == 1
    assert shards.count("cu", True, text, [], [], "d") == 1  # a torch-including .cu: torch_cu's paths
    assert shards.count("cu", False, text, [], ["-DKERNELKIT_DTYPE_SHARD=1"], "d") == 1
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "0")
    assert shards.count("cu", False, text, [], [], "d") == 1
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "auto")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert shards.count("cu", False, text, [], [], "d") == 1
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "4")
    assert shards.count("cu", False, text, [], [], "d") == 4
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "8")
    with pytest.raises(KernelkitError, match="KERNELKIT_DTYPE_SHARDS='8': expected one of auto, off"):
        shards.count("cu", False, text, [], [], "d")


# ----------------------------------------------------------------------------- built both ways (compiles)
def _plan(name: str, d: Path):
    return plan.plan_card(cards.find(name, d), "9.0", [], [], [], [])


@pytest.mark.cuda_build
def test_each_shard_is_the_unit_planned_with_its_define(tmp_path, monkeypatch):
    """Shards are derived from the whole file's plan (a warm load scans its includes once): each has the key and
    inputs a plan of the file with the shard's -D gives."""
    scaffold.new_card("sh_plan", tmp_path, "unary")
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "4")
    target = _plan("sh_plan", tmp_path)
    cu = tmp_path / "sh_plan.cu"
    for unit in (u for u in target.units if u.shard):
        planned = units.plan_unit("cu", cu, cu.read_text(), unit.local_dirs, [f"-D{shards.define(unit.shard[0])}"],
                                  toolchain.arch_list("9.0"), unit.display)
        assert (planned.key, planned.deps, planned.digest) == (unit.key, unit.deps, unit.digest)
    assert len({u.key for u in target.units}) == len(target.units)


@pytest.mark.cuda_build
def test_a_sharded_card_computes_the_same_bits_and_an_edit_rebuilds_device_code_only(tmp_path, monkeypatch):
    """The custom scaffold's .cu holds its CPU implementation too, so the CPU op runs sharded host code."""
    scaffold.new_card("sh_custom", tmp_path, "custom")
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "0")
    whole = _plan("sh_custom", tmp_path)
    kernelkit.load("sh_custom", kernels_dir=tmp_path)
    x = torch.randn(4097, dtype=torch.float64)
    expected = {dt: kernelkit.ops.sh_custom(x.to(dt)) for dt in DTYPES}
    monkeypatch.setenv(settings.DTYPE_SHARDS.name, "4")
    sharded = _plan("sh_custom", tmp_path)
    assert [u.shard for u in sharded.units if u.kind == "cu"] == [(i, 4) for i in range(4)]
    assert prebuilt.source_key(sharded) == prebuilt.source_key(whole)  # a wheel built either way serves both
    assert sharded.key != whole.key
    kernelkit.load("sh_custom", kernels_dir=tmp_path)
    for dt in DTYPES:
        assert torch.equal(kernelkit.ops.sh_custom(x.to(dt)), expected[dt]), dt
    cu = tmp_path / "sh_custom.cu"
    cu.write_text(cu.read_text().replace("out[i] = from_acc<T>(acc_t<T>(2) * to_acc(x[i]));  // EDIT: the kernel",
                                         "out[i] = from_acc<T>(acc_t<T>(3) * to_acc(x[i]));  // EDIT: the kernel"))
    before = dict(running.STATS)
    kernelkit.load("sh_custom", kernels_dir=tmp_path)
    counts = {k: running.STATS[k] - before[k] for k in ("compiles", "device_rebuilds")}
    assert counts == {"compiles": 4, "device_rebuilds": 4}  # nvcc --fatbin per shard; host objects reused
    for dt in DTYPES:  # the CPU op is host code: unchanged by a kernel edit
        assert torch.equal(kernelkit.ops.sh_custom(x.to(dt)), expected[dt]), dt


# ------------------------------------------------------------------------------------------------- GPU
def _sass(so: Path) -> dict:
    """Kernel name -> its SASS without addresses and column padding (which follow the module's longest line),
    over every fatbin of a library."""
    out = subprocess.run(["cuobjdump", "-sass", str(so)], capture_output=True, text=True, check=True).stdout
    kernels, name = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels.setdefault(name, [])
            continue
        if name and line.strip().startswith("/*"):
            kernels[name].append(" ".join(re.sub(r"/\*[0-9a-f]{4}\*/", "", line).split()))  # no address, no padding
    return {k: "\n".join(v) for k, v in kernels.items()}


def _gpu_card(name: str, tmp_path: Path) -> Path:
    if name in KINDS:
        scaffold.new_card(f"shg_{name}", tmp_path, name)
        return tmp_path
    for f in KERNELS.glob(f"{name}.*"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


@pytest.mark.gpu
@pytest.mark.parametrize("name", SHARDED + KINDS)
def test_on_the_gpu_shards_give_the_same_bits_from_the_same_sass(name, tmp_path, monkeypatch):
    if shutil.which("cuobjdump") is None:
        pytest.skip("needs cuobjdump")
    d = _gpu_card(name, tmp_path)
    card = f"shg_{name}" if name in KINDS else name
    spec = cards.find(card, d).spec
    out, sass = {}, {}
    for setting in ("0", "4"):
        monkeypatch.setenv(settings.DTYPE_SHARDS.name, setting)
        lib = kernelkit.load(card, kernels_dir=d)
        assert sum(u.shard is not None for u in _plan(card, d).units) == (4 if setting == "4" else 0)
        sass[setting] = _sass(Path(lib.path))
        shape = max(spec.shapes, key=lambda s: torch.Size(s).numel())
        for dt in DTYPES:
            gen = torch.Generator(device="cuda").manual_seed(7)
            inputs = spec.make_inputs(shape, dtype=dt, device="cuda", generator=gen)
            torch.manual_seed(11)  # sample_normal draws from torch's generator: the same state for both builds
            out[setting, dt] = getattr(kernelkit.ops, card)(*inputs)
        torch.cuda.synchronize()
    assert sass["4"] == sass["0"] and sass["0"]
    for dt in DTYPES:
        assert torch.equal(out["4", dt], out["0", dt]), dt
