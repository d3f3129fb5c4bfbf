"""kernelkit.ops resolves ops by card name with automatic binding; kernelkit.cardkit's spec helpers."""
import pickle
from pathlib import Path

import pytest
import torch

import kernelkit
from kernelkit import cardkit, ops
from kernelkit.jit import registry


def test_unknown_op_names_the_search_path():
    with pytest.raises(AttributeError, match="no op 'no_such_card_xyz'.*search path"):
        _ = ops.no_such_card_xyz
    assert not hasattr(ops, "_private_thing")


def test_candidates_are_the_name_then_its_prefixes():
    assert ops._candidates("sigmoid_backward") == ["sigmoid_backward", "sigmoid"]
    assert ops._candidates("a_b_c") == ["a_b_c", "a_b", "a"]


def test_written_wrappers_win():
    """A card's own Python function (kernels/vector_add.py's vector_add), found by name as kernelkit.ops.<op>."""
    assert ops.vector_add.__module__ == "kernelkit.ops" and "alpha" in ops.vector_add.__doc__
    card_fn = kernelkit.cards()["vector_add"].module().vector_add
    assert ops.vector_add.__code__ is card_fn.__code__ and ops.vector_add.__kwdefaults__ == {"alpha": 1, "out": None}
    assert "vector_add" not in ops.__all__ and "def vector_add" not in Path(ops.__file__).read_text()


def test_a_users_card_function_is_its_op(tmp_path, monkeypatch):
    """The same mechanism for a card on KERNELKIT_PATH: its Python function named like the op is
    kernelkit.ops.<op> (here a pure-Python one: nothing is built), picklable by that name."""
    (tmp_path / "kk_user_wrap.cpp").write_text("// the card's binding (not built by this test)\n")
    (tmp_path / "kk_user_wrap.py").write_text('def kk_user_wrap(x, *, scale=2):\n    """x times scale."""\n'
                                              "    return x * scale\n")
    monkeypatch.setenv("KERNELKIT_PATH", str(tmp_path))
    try:
        fn = ops.kk_user_wrap
        assert fn(3) == 6 and fn(3, scale=3) == 9 and fn.__doc__ == "x times scale."
        assert fn.__module__ == "kernelkit.ops" and fn.__name__ == "kk_user_wrap"
        assert pickle.loads(pickle.dumps(fn)) is fn
    finally:
        vars(ops).pop("kk_user_wrap", None)


@pytest.mark.cuda_build
def test_every_op_of_a_card_is_bound_without_setup_code():
    x = torch.randn(9, dtype=torch.float64)
    y = ops.sigmoid(x)  # loads the card; its spec's setup() calls no binding function
    lib = kernelkit.library("sigmoid")
    assert set(registry.CURRENT["sigmoid"]) == {"sigmoid", "sigmoid_backward"} == set(lib.op_names())
    assert ops.sigmoid_backward.__name__ == "sigmoid_backward"  # found through its card, "sigmoid"
    torch.testing.assert_close(ops.sigmoid_backward(x, y), x * y * (1 - y))


def test_randn_is_seeded_on_the_generators_device():
    a = cardkit.randn((5, 3), torch.float16, "cpu", torch.Generator().manual_seed(3), scale=2.0, shift=1.0)
    b = cardkit.randn((5, 3), torch.float16, "cpu", torch.Generator().manual_seed(3), scale=2.0, shift=1.0)
    assert a.dtype == torch.float16 and a.shape == (5, 3) and torch.equal(a, b)
    c = cardkit.randn(1000, torch.float64, generator=torch.Generator().manual_seed(4))
    assert c.dtype == torch.float64 and 0.8 < c.std() < 1.2 and (c != 0).all()
    u = cardkit.uniform(1000, 0.5, 1.5, generator=torch.Generator().manual_seed(5))
    assert 0.5 <= u.min() and u.max() < 1.5


@pytest.mark.gpu
def test_randn_cpu_generator_seeds_cuda_inputs():
    g = lambda: torch.Generator().manual_seed(6)  # noqa: E731
    x = cardkit.randn(100, device="cuda", generator=g())
    assert x.is_cuda and torch.equal(x.cpu(), cardkit.randn(100, generator=g()))


def test_elementwise_inputs():
    make = cardkit.elementwise_inputs(2, scale=3.0)
    a, b = make((4, 7), dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    assert a.shape == b.shape == (4, 7) and a.dtype == torch.bfloat16 and not torch.equal(a, b)
    with pytest.raises(ValueError, match="count"):
        cardkit.elementwise_inputs(0)


def test_default_bytes_moved():
    a, b = torch.empty(10), torch.empty(3, dtype=torch.float64)
    assert cardkit.default_bytes_moved((a, b, 2.0), torch.empty(10)) == 40 + 24 + 40
    assert cardkit.default_bytes_moved((a,), (a, b)) == 40 + 40 + 24


def test_fake_helpers_mirror_the_cpp_messages():
    x = torch.empty(2, 3, device="meta")
    assert cardkit.fake_unary("op", x).shape == (2, 3)
    assert cardkit.fake_binary("op", x, "a", torch.empty(3, device="meta"), "b").shape == (2, 3)
    with pytest.raises(RuntimeError, match="op: x must be a float32, float64, float16 or bfloat16 tensor"):
        cardkit.fake_unary("op", torch.empty(2, dtype=torch.int64, device="meta"))
    with pytest.raises(RuntimeError, match="op: a and b must have the same dtype"):
        cardkit.fake_binary("op", x, "a", x.double(), "b")
    with pytest.raises(RuntimeError, match=r"op: shapes of a \(2, 3\) and b \(4,\) cannot be broadcast"):
        cardkit.fake_binary("op", x, "a", torch.empty(4, device="meta"), "b")


def test_wrong_twins_build_the_named_bugs():
    twins = cardkit.wrong_twins(torch.neg, "skip_last", "skip_tail", "into_input")
    assert sorted(twins) == ["into_input", "skip_last", "skip_tail"]
    assert set(cardkit.wrong_twins(torch.neg)) == set(cardkit.GENERIC_BUGS)
    x = torch.arange(1.0, 8.0)
    out = torch.full((7,), float("nan"))
    assert twins["skip_last"](x, out=out) is out
    assert torch.equal(out[:6], -x[:6]) and out[6].isnan()
    out.fill_(float("nan"))
    twins["skip_tail"](x, out=out)  # vectors of 4: the 3-element tail is never written
    assert torch.equal(out[:4], -x[:4]) and out[4:].isnan().all()
    y = x.clone()
    twins["into_input"](y)
    assert torch.equal(y, -x)
    with pytest.raises(ValueError, match="wrong_twins: bugs: expected names from skip_last, .*, got 'skip_first'"):
        cardkit.wrong_twins(torch.neg, "skip_first")
