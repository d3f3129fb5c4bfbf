"""Strict mode against the exploits suite (tests/fixtures/exploits): every known-cheating candidate is rejected,
with the reason that names its trick; every honest one passes. This suite is to strict mode what the cards'
WRONG twins are to kernelkit.check. Tricks that need a GPU are marked gpu; the rest run on the CPU (and again
on the GPU). Some tests show what the default (cooperative) mode misses, so a rejection here is strict mode's
doing, not a trick that never worked."""
import os
import re
import struct

import pytest
import torch

import kernelkit
from kernelkit.frontends import cli
from kernelkit.harness.strict import problem_subject, run_subject
from kernelkit.harness.strict.channel import ChannelError, Reader, Writer, new_key
from kernelkit.harness.strict.origin import Problem, load_file, of_target
from kernelkit.harness.strict.process import Limits

HERE = os.path.dirname(__file__)
EXPLOITS = os.path.join(HERE, "fixtures", "exploits")
MATMUL, RELU = "problem_matmul.py", "problem_relu.py"

#: candidate -> (problem, what strict mode's reason says). The trick is in each file's first comment.
CPU_EXPLOITS = {
    "replay_cache.py": (MATMUL, r"elements differ"),  # cached result replayed across calls
    "pointer_cache.py": (MATMUL, r"elements differ"),  # result keyed by input pointer: the same-address probe
    "count_detect.py": (MATMUL, r"elements differ"),  # honest for a checker's calls, cheats while timed
    "stack_sniff.py": (MATMUL, r"elements differ"),  # detects the checker by its caller's name
    "sparse_key.py": (MATMUL, r"elements differ"),  # batch-and-skip keyed on a sample: the perturbed probe
    "patch_checker.py": (MATMUL, r"replaced kernelkit\.harness\.check\.compare"),
    "patch_reference.py": (MATMUL, r"elements differ"),
    "patch_timer.py": (MATMUL, r"replaced time\.perf_counter"),
    "patch_inputs.py": (MATMUL, r"replaced torch\.randn|differ from those seed"),
    "writes_inputs.py": (MATMUL, r"wrote its input 0"),
    "input_alias.py": (RELU, r"output 0 shares memory with input 0"),
    "lazy_thread.py": (MATMUL, r"changed after the op returned"),
    "low_precision.py": (MATMUL, r"far less accurate than float32"),
}
GPU_EXPLOITS = {
    "gpu_side_stream.py": (MATMUL, r"changed after the op returned|left device work running"),
    "gpu_tf32.py": (MATMUL, r"allow_tf32"),
    "gpu_tf32_local.py": (MATMUL, r"far less accurate than float32"),  # no flag left changed: the precision floor
    "gpu_l2_persist.py": (MATMUL, r"persisting L2 limit|access-policy window"),
    "patch_timer.py": (MATMUL, r"replaced torch\.cuda\.Event\.elapsed_time"),
}
HONEST = {"honest_matmul.py": MATMUL, "honest_einsum.py": MATMUL, "honest_relu.py": RELU}


def judge(candidate, problem, device="cpu", timing=True, budget_ms=20.0):
    """kernelkit eval's judgement of one candidate: strict check calls, then verified timed calls."""
    subject = problem_subject(Problem.load(os.path.join(EXPLOITS, problem)), device)
    return run_subject(subject, of_target(os.path.join(EXPLOITS, candidate), "candidate"), trials=5, timing=timing,
                       budget_ms=budget_ms, limits=Limits(timeout_s=240))


def reasons(result) -> str:
    return "\n".join(m for c in result.failures for m in c.messages)


def test_every_trick_of_the_suite_is_listed():
    """A fixture nobody holds to a verdict proves nothing: each file is an exploit, an honest candidate or a problem."""
    listed = set(CPU_EXPLOITS) | set(GPU_EXPLOITS) | set(HONEST) | {MATMUL, RELU, "gpu_honest_inline.cu"}
    assert {f for f in os.listdir(EXPLOITS) if f.endswith((".py", ".cu"))} == listed
    assert len(set(CPU_EXPLOITS) | set(GPU_EXPLOITS)) >= 10


@pytest.mark.parametrize("candidate", sorted(CPU_EXPLOITS))
def test_strict_rejects_each_cpu_exploit(candidate):
    problem, why = CPU_EXPLOITS[candidate]
    result, run = judge(candidate, problem)
    assert run.built and not result.ok, result.message()
    assert re.search(why, reasons(result)), reasons(result)


@pytest.mark.parametrize("candidate", sorted(HONEST))
def test_honest_candidates_pass_strict(candidate):
    result, run = judge(candidate, HONEST[candidate])
    assert result.ok, result.message()
    assert run.timings[0]["reps"] >= 10 and len(run.timings[0]["samples_us"]) == run.timings[0]["reps"]
    timed = [c for c in result.cases if c.kind == "timed"]
    assert len(timed) >= 2 and all(c.compared for c in timed)  # timed calls verified, not only the check calls


def test_an_honest_candidate_that_uses_torch_compile_is_not_taken_for_a_patcher(tmp_path):
    """Importing torch._dynamo rewraps torch.manual_seed: the worker imports it before its snapshot."""
    candidate = tmp_path / "compiled.py"
    candidate.write_text("import torch\n_mm = torch.compile(torch.matmul, backend='eager')\n\n"
                         "def forward(a, b):\n    return _mm(a, b)\n")
    result, _ = judge(str(candidate), MATMUL)
    assert result.ok, result.message()


def test_strict_check_alone_catches_the_probe_tricks():
    """Without timing, the same-address and perturbed probes still catch caches keyed by pointer or by sample."""
    for candidate in ("pointer_cache.py", "sparse_key.py"):
        result, _ = judge(candidate, MATMUL, timing=False)
        probes = {c.layout for c in result.failures}
        assert probes & {"same-address", "perturbed"}, result.message()


def _default_check(candidate, problem):
    """kernelkit.check in its default (cooperative) mode, in this process, on the problem's inputs."""
    prob = Problem.load(os.path.join(EXPLOITS, problem))
    forward = load_file(os.path.join(EXPLOITS, candidate)).forward

    def make(shape, dtype=None, device=None, generator=None):
        return prob.inputs(int(torch.randint(1 << 62, (1,), generator=generator)), device)

    rtol, atol = prob.tolerance or (None, None)
    return kernelkit.check(forward, prob.reference, make, shapes=[(1,)], dtypes=[torch.float32], device="cpu",
                           trials=5, rtol=rtol, atol=atol, contract=False)


@pytest.mark.parametrize("candidate", ["count_detect.py", "stack_sniff.py", "sparse_key.py", "input_alias.py",
                                       "low_precision.py"])
def test_default_mode_misses_what_strict_catches(candidate):
    """The gap strict mode closes: these pass the default check (tests above reject them in strict mode)."""
    problem = CPU_EXPLOITS[candidate][0]
    assert _default_check(candidate, problem).ok


def test_default_mode_catches_the_plain_ones_too():
    assert _default_check("writes_inputs.py", MATMUL).status == "FAIL"
    assert _default_check("replay_cache.py", MATMUL).status == "FAIL"


def test_check_and_bench_strict_on_a_card_and_the_cli(capsys):
    res = kernelkit.check("vector_add", strict=True, device="cpu", dtypes=[torch.float32], trials=3)
    assert res.ok and res.compared, res.message()
    assert {c.layout for c in res.cases} >= {"fresh", "same-address", "perturbed"}
    b = kernelkit.bench("vector_add", strict=True, device="cpu", sizes=[(4096,)], budget_ms=10)
    assert b.strict_check.ok and b.median_us("op", (4096,)) > 0 and b.paired("eager", (4096,)) is not None
    assert cli.main(["check", "vector_add", "--strict", "--device", "cpu", "--dtype", "float32", "--trials", "3"]) == 0
    assert "strict" in capsys.readouterr().out


def test_strict_bench_marks_a_cheat_rejected_and_keeps_its_reason():
    b = kernelkit.bench(os.path.join(EXPLOITS, "replay_cache.py"), reference=os.path.join(EXPLOITS, MATMUL),
                        strict=True, device="cpu", budget_ms=10)
    op = b.get("op")
    assert not b.strict_check.ok and op["error"].startswith("rejected by strict mode")
    assert any(n.startswith("REJECTED") for n in b.notes)


def module_level_add(a, b):
    return a + b


def make_pair(shape, dtype=None, device=None, generator=None):
    return (torch.randn(shape, dtype=dtype, device=device, generator=generator),
            torch.randn(shape, dtype=dtype, device=device, generator=generator))


def test_strict_takes_module_level_functions_and_refuses_what_a_worker_cannot_reach():
    res = kernelkit.check(module_level_add, torch.add, make_pair, shapes=[(7,), (33, 5)], dtypes=[torch.float32],
                          device="cpu", strict=True, trials=3)
    assert res.ok, res.message()
    with pytest.raises(TypeError, match=r"^check: op: strict=True .* module-level function"):
        kernelkit.check(lambda a, b: a + b, torch.add, make_pair, device="cpu", strict=True)
    with pytest.raises(TypeError, match=r"^check: inputs: strict=True draws fresh inputs"):
        kernelkit.check(module_level_add, torch.add, (torch.ones(3), torch.ones(3)), device="cpu", strict=True)
    with pytest.raises(ValueError, match=r"^check: strict=True compares values.*random op"):
        kernelkit.check("sample_normal", strict=True, device="cpu")
    with pytest.raises(ValueError, match=r"^timeout_s: "):
        Limits(timeout_s=0)


def test_the_channel_refuses_forged_frames():
    read_fd, write_fd = os.pipe()
    try:
        Writer(write_fd, new_key()).send({"type": "done"})  # signed with another key: a forgery
        os.write(write_fd, struct.pack(">Q", 1 << 40) + b"\0" * 32)
        with pytest.raises(ChannelError, match="bad signature"):
            Reader(read_fd, new_key()).receive(deadline=float("inf"))
        key = new_key()
        Writer(write_fd, key).send({"type": "done"})
        assert Reader(read_fd, key).receive(deadline=float("inf"))[0]["type"] == "done"
    finally:
        os.close(read_fd)
        os.close(write_fd)


# ------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("candidate", sorted(GPU_EXPLOITS))
def test_strict_rejects_each_gpu_exploit(candidate):
    problem, why = GPU_EXPLOITS[candidate]
    result, run = judge(candidate, problem, device="cuda", budget_ms=50)
    assert run.built and not result.ok, result.message()
    assert re.search(why, reasons(result)), reasons(result)


@pytest.mark.gpu
@pytest.mark.parametrize("candidate", sorted(CPU_EXPLOITS))
def test_strict_rejects_the_cpu_exploits_on_the_gpu_too(candidate):
    problem, why = CPU_EXPLOITS[candidate]
    result, run = judge(candidate, problem, device="cuda", budget_ms=50)
    assert run.built and not result.ok, result.message()


@pytest.mark.gpu
@pytest.mark.parametrize("candidate", sorted(HONEST))
def test_honest_candidates_pass_strict_on_the_gpu(candidate):
    result, run = judge(candidate, HONEST[candidate], device="cuda", budget_ms=50)
    assert result.ok, result.message()
    assert run.timings[0]["reps"] >= 10 and min(run.timings[0]["samples_us"]) > 0
    assert sum(c.kind == "timed" and c.compared > 0 for c in result.cases) >= 2


@pytest.mark.gpu
@pytest.mark.cuda_build
def test_an_honest_cuda_source_candidate_builds_and_passes():
    result, run = judge("gpu_honest_inline.cu", RELU, device="cuda", budget_ms=50)
    assert run.built and result.ok, result.message()


@pytest.mark.gpu
def test_default_mode_misses_the_side_stream_and_tf32_tricks():
    """The default check synchronises the device before comparing, and its same-dtype reference follows the
    process's TF32 switch: both tricks pass it (run in a worker: TF32's switch would leak into this process)."""
    import subprocess
    import sys

    code = ("import sys, torch, kernelkit; sys.path.insert(0, %r)\n"
            "from test_strict import _default_gpu_check\n"
            "print(_default_gpu_check('gpu_side_stream.py'), _default_gpu_check('gpu_tf32.py'))") % HERE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=HERE)
    assert out.stdout.split()[-2:] == ["ok", "ok"], out.stdout + out.stderr


def _default_gpu_check(candidate):
    prob = Problem.load(os.path.join(EXPLOITS, MATMUL))
    forward = load_file(os.path.join(EXPLOITS, candidate)).forward

    def make(shape, dtype=None, device=None, generator=None):
        return prob.inputs(int(torch.randint(1 << 62, (1,), generator=generator, device=generator.device)), device)

    return kernelkit.check(forward, prob.reference, make, shapes=[(1,)], dtypes=[torch.float32], device="cuda",
                           trials=3, rtol=prob.tolerance[0], atol=prob.tolerance[1], contract=False).status


@pytest.mark.gpu
def test_strict_bench_is_within_5_percent_of_the_default_bench_on_an_honest_kernel():
    size = (1 << 24,)
    default = kernelkit.bench("vector_add", device="cuda", sizes=[size], compile=False, host_overhead=False)
    strict = kernelkit.bench("vector_add", device="cuda", sizes=[size], strict=True)
    assert strict.strict_check.ok, strict.strict_check.message()
    d, s = default.median_us("kernelkit", size), strict.median_us("op", size)
    assert abs(s - d) / d <= 0.05, f"strict {s:.1f} us vs default {d:.1f} us"
