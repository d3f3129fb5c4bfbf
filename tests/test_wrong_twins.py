"""Every card carries its known-wrong versions (``WRONG = {name: fn}`` in its Python file, each a real kernel
bug in pure PyTorch): kernelkit.check, run with each one in place of the op against the card's reference,
inputs and shapes, must reject every one, and pass the reference itself under the same settings (so a
rejection is the checker telling the two apart, not the checker failing everything). On the CPU, no card built."""
import math

import pytest

import kernelkit
from kernelkit.errors import KernelkitError

CARDS = kernelkit.cards()
BUILTIN = sorted(n for n, c in CARDS.items() if c.dir == CARDS["vector_add"].dir)
MAX_NUMEL = 1 << 16  # the spec's shapes up to this product: every bug shows on them, the big ones only cost time


def wrong(name):
    """The card's WRONG (empty when its Python file has none or does not import)."""
    try:
        module = CARDS[name].module()
    except KernelkitError:
        return {}
    return dict(getattr(module, "WRONG", None) or {})


def run(name, op):
    spec = CARDS[name].spec
    shapes = [s for s in spec.shapes if math.prod(s) <= MAX_NUMEL] or [min(spec.shapes, key=math.prod)]
    # 4 trials: contiguous and strided inputs, each with a returned and (where the spec has out_arg) an out= result
    return kernelkit.check(op, spec=spec, device="cpu", shapes=shapes, trials=4, contract=False)


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_card_carries_wrong_twins(name):
    twins = wrong(name)
    assert twins, f"kernels/{name}.py defines no WRONG: list the bugs its check must catch"
    assert all(callable(fn) for fn in twins.values())


@pytest.mark.parametrize("name", sorted(n for n in CARDS if wrong(n)))
def test_the_reference_passes_where_the_twins_fail(name):
    res = run(name, CARDS[name].spec.reference)
    assert res.ok, res.message()


@pytest.mark.parametrize("name, bug", [(n, b) for n in sorted(CARDS) for b in wrong(n)])
def test_check_rejects_each_wrong_twin(name, bug):
    res = run(name, wrong(name)[bug])
    assert res.status == "FAIL", f"{name}: WRONG[{bug!r}] passed kernelkit.check:\n{res.message()}"
