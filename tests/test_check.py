"""kernelkit.check catches the seed's bug classes, with messages that say where (index) or why (statistic).

The broken ops are the cards' own known-wrong twins (``WRONG`` in kernels/<op>.py, pure PyTorch), checked in
place of the op under the card's spec; each card's reference passes under the same spec, so a failure here is
the harness telling the two apart, not the harness failing everything. tests/test_wrong_twins.py holds every
twin to a failure; the tests here check what the failures say.
"""
import dataclasses

import pytest
import torch

import kernelkit
from kernelkit import CheckError, check
from kernelkit.cardkit import elementwise_inputs
from kernelkit.frontends import cli

FIXTURE_CARDS = __import__("pathlib").Path(__file__).parent / "fixtures" / "cards"
CARDS = kernelkit.cards()
ADD, MUL, SIG, SAMPLE = (CARDS[n].spec for n in ("vector_add", "elementwise_mul", "sigmoid", "sample_normal"))
ADD_WRONG, MUL_WRONG, SIG_WRONG, SAMPLE_WRONG = (CARDS[n].module().WRONG for n in
                                                 ("vector_add", "elementwise_mul", "sigmoid", "sample_normal"))
F32_64 = [torch.float32, torch.float64]


def messages(result) -> str:
    return "\n".join(m for c in result.failures for m in c.messages)


@pytest.mark.parametrize("spec", [ADD, MUL, SAMPLE], ids=lambda s: s.name)
def test_references_pass_with_every_kind_of_case(spec):
    res = check(spec.reference, spec=spec, dtypes=[torch.float32])
    assert res.ok, res.message()
    assert res.status == "ok" and res.compared > 0
    kinds = {c.kind for c in res.cases}
    assert kinds >= ({"stats", "seeding"} if spec.random else {"values"})
    if spec.grad_inputs:
        assert {"gradcheck", "backward"} <= kinds


def test_off_by_one_that_skips_the_last_element():
    res = check(ADD_WRONG["skip_last"], spec=ADD, dtypes=F32_64, gradcheck=False)
    assert not res.ok
    text = messages(res)
    assert "at index (6,)" in text and "at index (1022,)" in text and "at index (32, 64)" in text
    for case in res.failures:  # each failure is exactly the last element, and only it
        assert [m.index for m in case.mismatches] == [tuple(s - 1 for s in case.shape)]
    assert all(c.ok for c in res.cases if c.shape == (0,))
    with pytest.raises(CheckError, match=r"index \(1022,\)"):
        res.raise_for_status()
    with pytest.raises(CheckError):
        check(ADD_WRONG["skip_last"], spec=ADD, dtypes=F32_64, gradcheck=False, raise_on_fail=True)


def test_write_past_the_end_of_out():
    """The seed's `i <= N`: every value is right, only the guard band after `out` betrays it."""
    res = check(ADD_WRONG["write_past_end"], spec=ADD, dtypes=F32_64)
    assert not res.ok
    assert all("out=" in c.layout for c in res.failures)
    dense = [c for c in res.failures if c.layout == "contiguous out="]
    assert dense and all(len(c.messages) == 1 for c in dense)
    assert all("wrote outside the tensor's elements" in c.messages[0] and "element +0 past its end" in c.messages[0]
               for c in dense)


def test_write_into_the_gaps_of_a_strided_view():
    res = check(ADD_WRONG["assumes_contiguous"], spec=ADD, dtypes=F32_64)
    assert not res.ok
    assert all(c.ok for c in res.cases if c.layout.startswith("contiguous"))  # right on dense memory
    text = messages(res)
    assert "in a gap of the strided view" in text  # wrote between the elements of a strided out=
    assert "NaN/inf where the reference is finite" in text  # read the NaN guard between strided inputs


def test_modifying_an_input():
    res = check(ADD_WRONG["into_input"], spec=ADD, dtypes=F32_64, gradcheck=False)
    assert not res.ok
    assert "input 0: the op modified its input in place" in messages(res)


def test_out_buffer_is_poisoned():
    res = check(ADD_WRONG["ignores_out"], spec=ADD, dtypes=F32_64)
    assert not res.ok and all("out=" in c.layout for c in res.failures)
    assert "NaN/inf where the reference is finite" in messages(res)


def test_output_dtype_must_match_the_reference():
    res = check(MUL_WRONG["returns_float64"], spec=MUL, dtypes=F32_64, gradcheck=False)
    assert not res.ok
    assert all(c.dtype == torch.float32 for c in res.failures)
    assert "dtype torch.float64, expected torch.float32" in messages(res)


def test_half_inputs_returned_upcast():
    res = check(SIG_WRONG["returns_float32"], spec=SIG, gradcheck=False)
    assert {c.dtype for c in res.failures} == {torch.float16, torch.bfloat16}
    assert "dtype torch.float32, expected torch.float16" in messages(res)


def test_float64_computed_in_float32():
    res = check(SIG_WRONG["float64_via_float32"], spec=SIG, gradcheck=False)
    assert {c.dtype for c in res.failures} == {torch.float64}
    assert "rtol=1e-10" in messages(res)
    # the tolerance is the knob: loosened, the same op passes
    assert check(SIG_WRONG["float64_via_float32"], spec=SIG, gradcheck=False, rtol=1e-6, atol=1e-7).ok


def test_wrong_backward():
    res = check(MUL_WRONG["swapped_grads"], spec=MUL, dtypes=F32_64)
    kinds = {c.kind for c in res.failures}
    assert kinds == {"gradcheck", "backward"}
    text = messages(res)
    assert "gradcheck (float64" in text and "Jacobian mismatch" in text
    assert "grad of input 0" in text


def test_sampler_with_one_z_shared_across_rows():
    res = check(SAMPLE_WRONG["shared_z"], spec=SAMPLE, dtypes=[torch.float32])
    assert not res.ok
    text = messages(res)
    assert "correlation test: rows 0 and 1 are correlated, r = 1.000" in text
    assert "one z shared by every row" in text


def test_sampler_with_wrong_std():
    res = check(SAMPLE_WRONG["variance_not_std"], spec=SAMPLE, dtypes=[torch.float32])
    assert not res.ok
    assert "row variance test" in messages(res) and "x the target std" in messages(res)


def test_sampler_without_a_target_uses_two_sample_tests():
    spec = dataclasses.replace(SAMPLE, target=None, dtypes=(torch.float32,))
    assert check(spec.reference, spec=spec).ok
    assert "correlation test" in messages(check(SAMPLE_WRONG["shared_z"], spec=spec))


def test_random_op_must_follow_the_seed():
    assert "not reproducible" in messages(check(SAMPLE_WRONG["ignores_seed"], spec=SAMPLE, dtypes=[torch.float32]))
    assert "identical samples" in messages(check(SAMPLE_WRONG["offset_not_advanced"], spec=SAMPLE,
                                                 dtypes=[torch.float32]))


def test_inputs_are_fresh_seeded_and_strided():
    seen = []

    def spy(a, b, *, out=None):
        seen.append((a.clone(), a.is_contiguous(), out is not None))
        return ADD.reference(a, b, out=out)

    check(spy, spec=ADD, dtypes=[torch.float32], shapes=[(1023,)], trials=4, contract=False, gradcheck=False)
    values = [s[0] for s in seen]
    assert len(values) == 4 and all(bool(v.ne(0).all()) for v in values)
    assert all(not torch.equal(values[i], values[j]) for i in range(4) for j in range(i))
    assert [s[1] for s in seen] == [True, False, True, False]  # contiguous, strided, ...
    assert [s[2] for s in seen] == [False, True, True, False]  # any two trials: returned and out=
    again = []
    check(lambda a, b, *, out=None: again.append(a.clone()) or ADD.reference(a, b, out=out), spec=ADD,
          dtypes=[torch.float32], shapes=[(1023,)], trials=4, contract=False, gradcheck=False)
    assert all(torch.equal(x, y) for x, y in zip(values, again))  # same seed, same inputs


def test_fixed_inputs_and_plain_callables():
    a, b = torch.randn(100), torch.randn(100)
    res = check(torch.add, torch.add, inputs=(a, b))
    assert res.ok and {c.layout for c in res.cases} == {"contiguous", "strided"}
    with pytest.raises(TypeError, match="inputs"):
        check(torch.add, torch.add)


def test_noncontiguous_false_checks_contiguous_inputs_only():
    def contiguous_only(a, b):
        if not (a.is_contiguous() and b.is_contiguous()):
            raise ValueError("contiguous_only(): argument 'a' is not contiguous")
        return a + b

    a, b = torch.randn(100), torch.randn(100)
    assert not check(contiguous_only, torch.add, inputs=(a, b)).ok  # strided trials by default
    res = check(contiguous_only, torch.add, inputs=(a, b), noncontiguous=False)
    assert res.ok and {c.layout for c in res.cases} == {"contiguous"}


def test_a_case_memo_computes_inputs_and_references_once_and_stays_pristine():
    """autotune checks every configuration on the same cases: with one CaseMemo the reference runs once per
    case, an op that scribbles on its inputs cannot change what the next op is compared with, and a wrong op
    is still caught."""
    from kernelkit.harness.check import CaseMemo

    calls = []

    def reference(a, b):
        calls.append(a.shape)
        return a * b + 1

    def scribbles(a, b):
        out = a * b + 1
        a.zero_()
        return out

    memo, kw = CaseMemo(), dict(inputs=elementwise_inputs(2), shapes=[(33,), (7, 5)], dtypes=[torch.float32],
                                trials=4, contract=False)
    first = check(scribbles, reference, reuse=memo, **kw)
    assert not first.ok and "modified its input in place" in first.failures[0].messages[0]
    n = len(calls)
    assert n == 2 * 8 and len(memo.cases) == 8  # same dtype and float64, per case
    assert check(lambda a, b: a * b + 1, reference, reuse=memo, **kw).ok and len(calls) == n
    wrong = check(lambda a, b: a * b + 1.001, reference, reuse=memo, **kw)
    assert not wrong.ok and len(calls) == n
    assert check(lambda a, b: a * b + 1, reference, reuse=CaseMemo(limit_bytes=0), **kw).ok and len(calls) == 2 * n


def test_inputs_the_reference_rejects_must_be_rejected():
    def picky(a, b):
        if a.numel() == 7:
            raise ValueError("no sevens")
        return a + b

    lenient = lambda a, b: a + b  # noqa: E731
    assert check(picky, picky, inputs=elementwise_inputs(2), dtypes=[torch.float32]).ok
    res = check(lenient, picky, inputs=elementwise_inputs(2), dtypes=[torch.float32])
    assert {c.shape for c in res.failures} == {(7,)}
    assert "the reference raised ValueError (no sevens) but the op returned a value" in messages(res)


# ------------------------------------------------------------------------------------ no vacuous pass

@pytest.mark.parametrize("trials", [0, -1, 1.5, True])
def test_trials_below_one_are_refused(trials):
    with pytest.raises(ValueError, match=f"check: trials: expected an integer >= 1, got {trials!r}"):
        check(torch.sigmoid, torch.sigmoid, inputs=elementwise_inputs(1), trials=trials)


def test_empty_dtypes_and_shapes_are_refused():
    with pytest.raises(ValueError, match="check: dtypes: expected at least one, got an empty list$"):
        check(torch.sigmoid, torch.sigmoid, inputs=elementwise_inputs(1), dtypes=[])
    with pytest.raises(ValueError, match="check: shapes: expected at least one, got an empty list$"):
        check(torch.sigmoid, torch.sigmoid, inputs=elementwise_inputs(1), shapes=[])
    with pytest.raises(ValueError, match="check: dtypes: expected at least one"):  # given values: no default either
        check(torch.sigmoid, torch.sigmoid, inputs=(torch.randn(5),), dtypes=[])
    shapeless = dataclasses.replace(SIG, shapes=())
    with pytest.raises(ValueError, match=r"check: shapes: expected at least one, got an empty list \(the spec "
                                         r"'sigmoid' lists none\)$"):
        check(SIG.reference, spec=shapeless)
    cpu_less = dataclasses.replace(SIG, device_dtypes={"cpu": ()})
    with pytest.raises(ValueError, match=r"check: dtypes: .*\(the spec 'sigmoid' lists none for this device\)$"):
        check(SIG.reference, spec=cpu_less, device="cpu")


def test_only_empty_tensors_is_nothing_checked_not_ok():
    res = check(SIG.reference, spec=SIG, shapes=[(0,), (3, 0, 5)], gradcheck=False)
    assert not res.failures and res.compared == 0
    assert res.status == "nothing checked" and not res.ok
    assert "NOTHING CHECKED" in res.summary() and "no output value was compared" in res.message()
    assert res.to_dict()["status"] == "nothing checked" and res.to_dict()["ok"] is False
    with pytest.raises(CheckError, match="NOTHING CHECKED"):
        res.raise_for_status()
    mixed = check(SIG.reference, spec=SIG, shapes=[(0,), (7,)], dtypes=[torch.float32], gradcheck=False)
    assert mixed.ok and mixed.compared == 7 * 5  # one non-empty shape is enough: 5 trials of 7 values


def test_inputs_both_reject_everywhere_is_nothing_checked():
    def refuse(_x):
        raise ValueError("x: no")

    res = check(refuse, refuse, inputs=elementwise_inputs(1), dtypes=[torch.float32], shapes=[(4,)])
    assert res.status == "nothing checked" and not res.ok


def _rejecting(error):
    """An op that rejects 7-element inputs with ``error``, and adds one elsewhere."""
    def op(x):
        if x.numel() == 7:
            raise error
        return x + 1
    return op


@pytest.mark.parametrize("ref_error, op_error, verdict", [
    (ValueError("r"), ValueError("o"), "both rejected these inputs (ValueError)"),
    (RuntimeError("r"), RuntimeError("o"), "both rejected these inputs (RuntimeError)"),
    (ValueError("r"), TypeError("o"), "the reference rejected these inputs with ValueError (r) but the op raised "
                                      "TypeError (o): both must raise the same kind of argument error"),
    (RuntimeError("r"), NotImplementedError("o"), "but the op raised NotImplementedError"),
    (AttributeError("'Tensor' object has no attribute 'sigmoud'"), RuntimeError("o"),
     "the reference raised AttributeError ('Tensor' object has no attribute 'sigmoud'): not an argument error"),
    (NameError("sigmoud"), NameError("sigmoud"), "the reference raised NameError (sigmoud): not an argument error"),
])
def test_both_raised_passes_only_for_the_same_argument_error(ref_error, op_error, verdict):
    res = check(_rejecting(op_error), _rejecting(ref_error), inputs=elementwise_inputs(1), dtypes=[torch.float32],
                shapes=[(7,), (5,)], trials=1)
    rejected = [c for c in res.cases if c.shape == (7,)]
    assert any(verdict in m for c in rejected for m in c.messages), res.message()
    assert res.ok == verdict.startswith("both rejected")


def test_an_op_that_raises_where_the_reference_returns_is_marked_raised_and_a_wrong_value_is_not():
    res = check(_rejecting(MemoryError("launch: too many resources\nsecond line")), torch.neg,
                inputs=elementwise_inputs(1), dtypes=[torch.float32], shapes=[(7,), (5,)], trials=1)
    raised = [c for c in res.failures if c.shape == (7,)]
    wrong = [c for c in res.failures if c.shape == (5,)]
    assert [c.raised for c in raised] == ["MemoryError"] and raised[0].messages == [
        "the op raised MemoryError: launch: too many resources"], res.message()
    assert wrong and all(c.raised is None for c in wrong)


@pytest.mark.parametrize("inputs, hint", [
    ([(torch.randn(3), torch.randn(3)), (torch.randn(4), torch.randn(4))], "got list; several argument tuples"),
    (torch.randn(3), "got Tensor; one tensor argument x: inputs=\\(x,\\)"),
    ({"a": torch.randn(3)}, "got dict"),
])
def test_unsupported_inputs_forms_are_refused(inputs, hint):
    with pytest.raises(TypeError, match="check: inputs: expected a tuple of the op's positional arguments or a "
                                        "make_inputs.* callable, " + hint):
        check(torch.add, torch.add, inputs=inputs)


def test_check_command_refuses_zero_trials(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "sigmoid", "--trials", "0"])
    assert exit_.value.code == 2
    assert "--trials: expected an integer >= 1, got '0': fewer than one trial checks nothing" in capsys.readouterr().err


def test_repr_and_html():
    bad = check(ADD_WRONG["skip_last"], spec=ADD, dtypes=F32_64)
    text = repr(bad)
    assert "FAIL" in text and "max abs" in text and "index (6,)" in text
    html = bad._repr_html_()
    assert "<table>" in html and "FAIL" in html
    good = check(ADD.reference, spec=ADD, dtypes=F32_64)
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
    nowhere = kernelkit.Spec(name="nowhere", reference=torch.add, make_inputs=elementwise_inputs(2), op=torch.add,
                             devices=())
    with pytest.raises(KernelkitError, match="implemented for"):
        resolve(nowhere)


# --------------------------------------------------------------------------------------- the op contract
# Custom ops that compute the right values but break a promise a torch op makes; each has a correct twin.

def _twice(name, fake=lambda x: x.new_empty(x.shape), impl=lambda x: x * 2, backward=True):
    op = torch.library.custom_op(f"kk_test_check::{name}", mutates_args=())(impl)
    op.register_fake(fake)
    if backward:
        op.register_autograd(lambda _ctx, grad: grad * 2)
    return op


def _twice_impl(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _twice_refusing_grad(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice_ok = _twice("twice_ok", impl=_twice_impl)
twice_bad_fake = _twice("twice_bad_fake", fake=lambda x: x.new_empty(x.numel() + 1), impl=_twice_impl)
twice_no_backward = _twice("twice_no_backward", impl=_twice_impl, backward=False)
TWICE = kernelkit.Spec(name="twice", reference=lambda x: x * 2, make_inputs=elementwise_inputs(1), grad_inputs=(0,),
                       dtypes=(torch.float32, torch.float64), shapes=((7,), (33, 5)))
TWICE_NO_GRAD = dataclasses.replace(TWICE, grad_inputs=())


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
    res = check(ADD_WRONG["skip_last"], spec=ADD, device="cuda")
    assert not res.ok and "at index (1022,)" in messages(res)
    assert check(ADD.reference, spec=ADD, device="cuda").ok


@pytest.mark.gpu
def test_gpu_shared_z_sampler():
    assert "correlation test: rows" in messages(check(SAMPLE_WRONG["shared_z"], spec=SAMPLE, device="cuda"))
    assert check(SAMPLE.reference, spec=SAMPLE, device="cuda").ok


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_large_tensor_over_2_31_elements(big_gpu_memory):
    big_gpu_memory(40 << 30)
    res = check(torch.add, torch.add, inputs=elementwise_inputs(2), shapes=[(7,)], dtypes=[torch.float16], large=True,
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
