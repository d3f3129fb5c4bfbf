"""Every built-in card compiles for the GPUs users have besides the H100: Colab's T4 (sm_75) and the A100
(sm_80). Compile and link only (no GPU needed); a card with a Hopper-only fast path must keep a path that
builds for these. CI cost (2 cores): the device code of each card for two more archs, bindings cached."""
import pytest

import kernelkit
from kernelkit.jit.cards import all_cards, builtin_dir

pytestmark = pytest.mark.cuda_build

CARDS = sorted(n for n, c in all_cards(builtin_dir()).items() if c.has_cuda)


def test_the_built_in_cards_have_cuda_code():
    assert len(CARDS) >= 5, CARDS


@pytest.mark.parametrize("name", CARDS)
def test_card_compiles_for_turing_and_ampere(name):
    info = kernelkit.load(name, kernels_dir=builtin_dir(), arch="7.5;8.0", load=False)
    assert info.path.is_file() and info.path.stat().st_size > 0
