"""kernelkit.check catches the seed's bug classes, with messages that say where (index) or why (statistic).

Every broken op in fixtures/broken_ops.py has a correct twin that must pass under the same spec, so a
failure here is the harness telling the two apart, not the harness failing everything.
"""
import pytest
import torch

import kernelkit
from kernelkit import CheckError, check
from fixtures import broken_ops as B

FIXTURE_CARDS = __import__("pathlib").Path(__file__).parent / "fixtures" / "cards"


def messages(result) -> str:
    return "\n".join(m for c in result.failures for m in c.messages)


@pytest.mark.parametrize("op, spec", [(B.add_ok, B.ADD_SPEC), (B.mul_ok, B.MUL_SPEC), (B.sample_ok, B.SAMPLE_SPEC)])
def test_correct_ops_pass(op, spec):
    res = check(op, spec=spec)
    assert res.ok, res.message()
    kinds = {c.kind for c in res.cases}
    assert kinds >= ({"stats", "seeding"} if spec.random else {"values"})
    if spec.grad_inputs:
        assert {"gradcheck", "backward"} <= kinds


def test_off_by_one_that_skips_the_last_element():
    res = check(B.add_skip_last, spec=B.ADD_SPEC)
    assert not res.ok
    text = messages(res)
    assert "at index (6,)" in text and "at index (1022,)" in text and "at index (32, 64)" in text
    for case in res.failures:  # each failure is exactly the last element, and only it
        assert [m.index for m in case.mismatches] == [tuple(s - 1 for s in case.shape)]
    assert all(c.ok for c in res.cases if c.shape == (0,))
    with pytest.raises(CheckError, match=r"index \(1022,\)"):
        res.raise_for_status()
    with pytest.raises(CheckError):
        check(B.add_skip_last, spec=B.ADD_SPEC, raise_on_fail=True)


def test_write_past_the_end_of_out():
    """The seed's `i <= N`: every value is right, only the guard band after `out` betrays it."""
    res = check(B.add_write_past_end, spec=B.ADD_SPEC)
    assert not res.ok
    assert all("out=" in c.layout for c in res.failures)
    dense = [c for c in res.failures if c.layout == "contiguous out="]
    assert dense and all(len(c.messages) == 1 for c in dense)
    assert all("wrote outside the tensor's elements" in c.messages[0] and "element +0 past its end" in c.messages[0]
               for c in dense)


def test_write_into_the_gaps_of_a_strided_view():
    res = check(B.add_assumes_contiguous, spec=B.ADD_SPEC)
    assert not res.ok
    assert all(c.ok for c in res.cases if c.layout.startswith("contiguous"))  # right on dense memory
    text = messages(res)
    assert "in a gap of the strided view" in text  # wrote between the elements of a strided out=
    assert "NaN/inf where the reference is finite" in text  # read the NaN guard between strided inputs


def test_modifying_an_input():
    res = check(B.add_into_input, spec=B.ADD_SPEC)
    assert not res.ok
    assert "input 0: the op modified its input in place" in messages(res)


def test_out_buffer_is_poisoned():
    res = check(B.add_ignores_out, spec=B.ADD_SPEC)
    assert not res.ok and all("out=" in c.layout for c in res.failures)
    assert "NaN/inf where the reference is finite" in messages(res)


def test_output_dtype_must_match_the_reference():
    res = check(B.mul_returns_float64, spec=B.MUL_SPEC, gradcheck=False)
    assert not res.ok
    assert all(c.dtype == torch.float32 for c in res.failures)
    assert "dtype torch.float64, expected torch.float32" in messages(res)


def test_half_inputs_returned_upcast():
    res = check(B.sigmoid_upcast_half, torch.sigmoid, inputs=B.randn_args(1))
    assert {c.dtype for c in res.failures} == {torch.float16, torch.bfloat16}
    assert "dtype torch.float32, expected torch.float16" in messages(res)


def test_float64_computed_in_float32():
    res = check(B.sigmoid_via_float32, torch.sigmoid, inputs=B.randn_args(1))
    assert {c.dtype for c in res.failures} == {torch.float64}
    assert "rtol=1e-10" in messages(res)
    # the tolerance is the knob: loosened, the same op passes
    assert check(B.sigmoid_via_float32, torch.sigmoid, inputs=B.randn_args(1), rtol=1e-6, atol=1e-7).ok


def test_wrong_backward():
    res = check(B.mul_bad_backward, spec=B.MUL_SPEC)
    kinds = {c.kind for c in res.failures}
    assert kinds == {"gradcheck", "backward"}
    text = messages(res)
    assert "gradcheck (float64" in text and "Jacobian mismatch" in text
    assert "grad of input 0" in text


def test_sampler_with_one_z_shared_across_rows():
    res = check(B.sample_shared_z, spec=B.SAMPLE_SPEC)
    assert not res.ok
    text = messages(res)
    assert "correlation test: rows 0 and 1 are correlated, r = 1.000" in text
    assert "one z shared by every row" in text


def test_sampler_with_wrong_std():
    res = check(B.sample_wrong_std, spec=B.SAMPLE_SPEC)
    assert not res.ok
    assert "row variance test" in messages(res) and "x the target std" in messages(res)


def test_sampler_without_a_target_uses_two_sample_tests():
    spec = __import__("dataclasses").replace(B.SAMPLE_SPEC, target=None)
    assert check(B.sample_ok, spec=spec).ok
    assert "correlation test" in messages(check(B.sample_shared_z, spec=spec))


def test_random_op_must_follow_the_seed():
    def unseeded(mu, sigma, n):
        g = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
        return mu[:, None] + sigma[:, None] * torch.randn(mu.shape[0], n, generator=g)

    def frozen(mu, sigma, n):
        g = torch.Generator().manual_seed(0)
        return mu[:, None] + sigma[:, None] * torch.randn(mu.shape[0], n, generator=g)

    assert "not reproducible" in messages(check(unseeded, spec=B.SAMPLE_SPEC))
    assert "identical samples" in messages(check(frozen, spec=B.SAMPLE_SPEC))


def test_inputs_are_fresh_seeded_and_strided():
    seen = []

    def spy(a, b, *, out=None):
        seen.append((a.clone(), a.is_contiguous(), out is not None))
        return B.add_ok(a, b, out=out)

    check(spy, spec=B.ADD_SPEC, dtypes=[torch.float32], shapes=[(1023,)], trials=4, contract=False)
    values = [s[0] for s in seen]
    assert len(values) == 4 and all(bool(v.ne(0).all()) for v in values)
    assert all(not torch.equal(values[i], values[j]) for i in range(4) for j in range(i))
    assert [s[1] for s in seen] == [True, False, True, False]  # contiguous, strided, ...
    assert [s[2] for s in seen] == [False, False, True, True]  # returned, then out=
    again = []
    check(lambda a, b, *, out=None: again.append(a.clone()) or B.add_ok(a, b, out=out), spec=B.ADD_SPEC,
          dtypes=[torch.float32], shapes=[(1023,)], trials=4, contract=False)
    assert all(torch.equal(x, y) for x, y in zip(values, again))  # same seed, same inputs


def test_fixed_inputs_and_plain_callables():
    a, b = torch.randn(100), torch.randn(100)
    res = check(torch.add, torch.add, inputs=(a, b))
    assert res.ok and {c.layout for c in res.cases} == {"contiguous", "strided"}
    with pytest.raises(TypeError, match="inputs"):
        check(torch.add, torch.add)


def test_inputs_the_reference_rejects_must_be_rejected():
    def picky(a, b):
        if a.numel() == 7:
            raise ValueError("no sevens")
        return a + b

    lenient = lambda a, b: a + b  # noqa: E731
    assert check(picky, picky, inputs=B.randn_args(2), dtypes=[torch.float32]).ok
    res = check(lenient, picky, inputs=B.randn_args(2), dtypes=[torch.float32])
    assert {c.shape for c in res.failures} == {(7,)}
    assert "the reference raised ValueError (no sevens) but the op returned a value" in messages(res)


def test_repr_and_html():
    bad = check(B.add_skip_last, spec=B.ADD_SPEC)
    text = repr(bad)
    assert "FAIL" in text and "max abs" in text and "index (6,)" in text
    html = bad._repr_html_()
    assert "<table>" in html and "FAIL" in html
    good = check(B.add_ok, spec=B.ADD_SPEC)
    assert "ok" in repr(good) and "index" not in repr(good)
    assert good.to_dict()["ok"] is True


def test_compiled_cpp_card_with_an_off_by_one():
    """The same bug in a real compiled kernel (tests/fixtures/cards), through the loader."""
    res = check("kk_add_skip_last", kernels_dir=FIXTURE_CARDS)  # a card outside kernelkit: its op is lib.<name>
    assert not res.ok
    assert "at index (6,)" in messages(res) and "at index (1022,)" in messages(res)
    lib = kernelkit.load("kk_add_skip_last", kernels_dir=FIXTURE_CARDS)
    # its correct twin, same build, passes (it has no fake kernel: the contract is test_a_compiled_card_...)
    assert check(lib.kk_add_ok, spec=lib.spec, contract=False).ok


def test_one_resolver_for_card_names_specs_and_callables():
    from kernelkit.errors import KernelkitError
    from kernelkit.harness.target import resolve

    card = resolve("kk_add_skip_last", kernels_dir=FIXTURE_CARDS)  # not in kernelkit.ops: the library's op
    assert card.spec.name == "kk_add_skip_last" and str(card.op) == str(card.lib.kk_add_skip_last)
    assert str(resolve(card.spec, kernels_dir=FIXTURE_CARDS).op) == str(card.op)
    assert resolve(torch.add).op is torch.add and resolve(torch.add).spec is None
    assert resolve(torch.add, device="cpu").device == torch.device("cpu")
    with pytest.raises(TypeError, match="a card name, a kernelkit.Spec or a callable"):
        resolve(42)
    nowhere = kernelkit.Spec(name="nowhere", reference=torch.add, make_inputs=B.randn_args(2), op=torch.add,
                             devices=())
    with pytest.raises(KernelkitError, match="implemented for"):
        resolve(nowhere)


# --------------------------------------------------------------------------------------- the op contract
# Custom ops that compute the right values but break a promise a torch op makes; each has a correct twin.

def _twice(name, fake=lambda x: x.new_empty(x.shape), impl=lambda x: x * 2, backward=True):
    op = torch.library.custom_op(f"kk_test_check::{name}", mutates_args=())(impl)
    op.register_fake(fake)
    if backward:
        op.register_autograd(lambda ctx, grad: grad * 2)
    return op


def _twice_impl(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _twice_refusing_grad(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice_ok = _twice("twice_ok", impl=_twice_impl)
twice_bad_fake = _twice("twice_bad_fake", fake=lambda x: x.new_empty(x.numel() + 1), impl=_twice_impl)
twice_no_backward = _twice("twice_no_backward", impl=_twice_impl, backward=False)
TWICE = kernelkit.Spec(name="twice", reference=lambda x: x * 2, make_inputs=B.randn_args(1), grad_inputs=(0,),
                       dtypes=(torch.float32, torch.float64), shapes=((7,), (33, 5)))
TWICE_NO_GRAD = __import__("dataclasses").replace(TWICE, grad_inputs=())


def twice_validating(x):
    """The right op behind a wrapper that checks its input with a data-dependent branch: a graph break."""
    if torch.isnan(x).any():
        raise ValueError("twice: x has NaNs")
    return twice_ok(x)


def twice_refusing_grad(x):
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError("twice: not differentiable")
    return twice_no_backward(x)


def contract_failures(res) -> dict:
    return {c.layout: c.messages for c in res.failures if c.kind == "contract"}


def test_custom_op_twin_meets_the_contract():
    res = check(twice_ok, spec=TWICE)
    assert res.ok, res.message()
    held = {c.layout for c in res.cases if c.kind == "contract"}
    assert held == {"schema", "autograd registration", "fake kernel", "dispatch", "torch.compile fullgraph"}
    assert all(c.dtype == torch.float32 for c in res.cases if c.kind == "contract")  # once, first dtype
    assert not any(c.kind == "contract" for c in check(twice_ok, spec=TWICE, contract=False).cases)


def test_fake_kernel_with_the_wrong_shape():
    """The values are right (the fake kernel is never run in eager); opcheck compares it with the real one."""
    res = check(twice_bad_fake, spec=TWICE)
    assert all(c.ok for c in res.cases if c.kind != "contract")
    failed = contract_failures(res)
    assert "fake kernel" in failed, res.message()
    assert any(m.startswith("fake kernel: ") and "Shapes" in m for m in failed["fake kernel"])
    assert "fake kernel" in res.message()


def test_graph_break_in_the_op_fails_fullgraph_compile():
    res = check(twice_validating, spec=TWICE)
    assert all(c.ok for c in res.cases if c.kind != "contract")
    failed = contract_failures(res)
    assert list(failed) == ["torch.compile fullgraph"], res.message()
    assert failed["torch.compile fullgraph"][0].startswith("torch.compile fullgraph: ")


def test_an_op_without_backward_must_refuse_gradients():
    res = check(twice_no_backward, spec=TWICE_NO_GRAD)
    failed = contract_failures(res)
    assert list(failed) == ["no backward"], res.message()
    assert failed["no backward"][0].startswith("no backward: gradients are not refused")
    assert "no autograd formula" in failed["no backward"][0]
    assert check(twice_refusing_grad, spec=TWICE_NO_GRAD).ok  # its twin raises for inputs requiring grad
    assert check(twice_ok, spec=TWICE_NO_GRAD).ok  # a working backward the spec does not declare is no error


def test_a_compiled_card_without_fake_kernel():
    """A real C++ op (tests/fixtures/cards) registered without a fake kernel: eager values are right, but
    torch.compile and opcheck cannot trace it."""
    lib = kernelkit.load("kk_add_skip_last", kernels_dir=FIXTURE_CARDS)
    failed = contract_failures(check(lib.kk_add_ok, spec=lib.spec, dtypes=[torch.float32], trials=1))
    assert "no fake kernel is registered" in failed["fake kernel"][0]
    assert failed["torch.compile fullgraph"][0].startswith("torch.compile fullgraph: ")


# ------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_off_by_one_reads_poisoned_memory():
    res = check(B.add_skip_last, spec=B.ADD_SPEC, device="cuda")
    assert not res.ok and "at index (1022,)" in messages(res)
    assert check(B.add_ok, spec=B.ADD_SPEC, device="cuda").ok


@pytest.mark.gpu
def test_gpu_shared_z_sampler():
    assert "correlation test: rows" in messages(check(B.sample_shared_z, spec=B.SAMPLE_SPEC, device="cuda"))
    assert check(B.sample_ok, spec=B.SAMPLE_SPEC, device="cuda").ok


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_large_tensor_over_2_31_elements(big_gpu_memory):
    big_gpu_memory(40 << 30)
    res = check(torch.add, torch.add, inputs=B.randn_args(2), shapes=[(7,)], dtypes=[torch.float16], large=True,
                device="cuda", trials=1)
    assert res.ok, res.message()
    assert ((1 << 31) + 1,) in [c.shape for c in res.cases]


def _twice_on_default_stream(x: torch.Tensor) -> torch.Tensor:
    with torch.cuda.stream(torch.cuda.default_stream(x.device)):
        return x * 2


def _twice_syncing(x: torch.Tensor) -> torch.Tensor:
    if x.abs().max().item() > 1e30:  # a host read: not allowed while a CUDA graph is being captured
        raise ValueError("twice: x too large")
    return x * 2


twice_default_stream = _twice("twice_default_stream", impl=_twice_on_default_stream)
twice_syncing = _twice("twice_syncing", impl=_twice_syncing)


@pytest.mark.gpu
def test_gpu_custom_op_twin_meets_the_contract():
    res = check(twice_ok, spec=TWICE, device="cuda")
    assert res.ok, res.message()
    assert {"CUDA graph", "current stream"} <= {c.layout for c in res.cases if c.kind == "contract"}


@pytest.mark.gpu
def test_gpu_op_on_the_default_stream_fails_current_stream():
    res = check(twice_default_stream, spec=TWICE, device="cuda")
    assert all(c.ok for c in res.cases if c.kind != "contract")
    failed = contract_failures(res)
    assert "current stream" in failed, res.message()
    assert failed["current stream"][0].startswith("current stream: ")


@pytest.mark.gpu
def test_gpu_op_that_breaks_capture_fails_cuda_graph():
    res = check(twice_syncing, spec=TWICE, device="cuda")
    failed = contract_failures(res)
    assert "CUDA graph" in failed, res.message()
    assert failed["CUDA graph"][0].startswith("CUDA graph: capture failed")
    torch.randn(4, device="cuda")  # the failed capture left the default generator usable (not "capturing")
