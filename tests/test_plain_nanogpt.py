"""experiments/truth/plain_nanogpt.py, the independent check of a placement in nanoGPT's model:
its textbook Post-LN and hand-written QK-norm, on Karpathy's unchanged model.py, compute what
autoln's derived model of the same placement computes, once the weights are the same (so the
check is independent code, not a different model)."""

import contextlib
import io

import pytest
import torch

import autoln
from tests.conftest import experiment_script

from .test_nanogpt_diff import EXAMPLE, load

VOCAB = 65


def _qk_name(key: str) -> str:
    """The script's hand-written QK-norm key under ``autoln.QKNorm``'s name (other keys unchanged)."""
    return key.replace("attn.q_ln.", "attn.qk_norm.q_norms.qk.").replace("attn.k_ln.", "attn.qk_norm.k_norms.qk.")


@pytest.fixture(scope="module")
def plain():
    return experiment_script("truth/plain_nanogpt")


@pytest.mark.parametrize("placement, qk", [("post", False), ("pre", False), ("post", True), ("pre", True)])
def test_the_textbook_placement_equals_autoln_s_derived_model(plain, placement, qk):
    gpt = load(EXAMPLE, "gpt_plain_check")
    torch.manual_seed(0)
    mine = plain.build(placement, qk, VOCAB)
    with contextlib.redirect_stdout(io.StringIO()):
        derived = gpt.GPT(gpt.GPTConfig(**plain.SIZE, vocab_size=VOCAB, norm_candidates=(placement,),
                                        qk_candidates=("qk" if qk else "none",)))
    sd = {_qk_name(k): v for k, v in mine.state_dict().items()}  # the hand-written QK-norms' gains, under autoln.QKNorm's names
    for k in sd:
        if "qk_norm" in k:
            sd[k] = sd[k] + 0.1 * torch.randn_like(sd[k])  # away from one, so a gain left out shows
    mine.load_state_dict({k: sd[_qk_name(k)] for k in mine.state_dict()})
    state = autoln.map_state_dict(sd, derived, {"ln_1": "attn_site", "ln_2": "mlp_site"}, placement=placement)
    derived.load_state_dict(state)
    x = torch.randint(0, VOCAB, (2, plain.SIZE["block_size"]))
    mine.eval(), derived.eval()
    want, got = mine(x, x)[1], derived(x, x)[1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    other = plain.build("pre" if placement == "post" else "post", qk, VOCAB)
    other.load_state_dict(mine.state_dict())
    other.eval()
    assert abs(other(x, x)[1].item() - want.item()) > 1e-3  # the placement changes the loss: the check can fail
