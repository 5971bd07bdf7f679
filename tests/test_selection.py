"""Perturbation-based selection (DARTS-PT, Wang et al. 2021) on a hand-built supernet, and the
supernet's projected and perturbed mixing weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autoln.config import ModelConfig
from autoln.models.genotype import from_probabilities
from autoln.oneshot.selection import clear_winner, loss_rises, perturbation_select
from autoln.models.supernet import Supernet

VOCAB = 11


def test_drop_zeroes_one_weight_without_renormalising_and_projection_is_one_hot(tiny_model_cfg):
    net = Supernet(tiny_model_cfg, VOCAB, arch_init_std=0.5)
    w = net.site_weights().detach()
    dropped = net.mixing_weights(drop=(1, 2)).detach()
    assert dropped[1, 0, 2] == 0 and dropped[1, 1, 2] == 0
    torch.testing.assert_close(dropped[1, :, :2], w[1, :2].expand(2, 2))  # the others keep their weights
    torch.testing.assert_close(dropped[0], w[0].expand(2, 3))
    net.projected = {0: 1}
    proj = net.mixing_weights().detach()
    assert torch.equal(proj[0], torch.tensor([[0.0, 1.0, 0.0]] * 2))
    torch.testing.assert_close(proj[2], w[2].expand(2, 3))
    assert net.mixing_weights(drop=(0, 1)).detach()[0].abs().sum() == 0  # removing the kept one empties the site


def _hand_built():
    """One block of pre/post/deepnorm, one site per sublayer. Post-LN's and DeepNorm's norms have gain and bias 0, so
    they add nothing at any weight, yet Post-LN's alpha is the largest and Pre-LN's the smallest;
    the loss is the distance of the residual stream to the all-Pre-LN supernet's, so only
    removing Pre-LN hurts (the stream then drops to 0)."""
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, context=8, granularity="sublayer")
    net = Supernet(cfg, VOCAB)
    with torch.no_grad():
        net.alphas.copy_(torch.tensor([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0]]))
        for block in net.blocks:
            for site in (block.attn_site, block.ffn_site):
                for name in ("post", "deepnorm"):
                    site.placements[name].norm.weight.zero_()
                    site.placements[name].norm.bias.zero_()
    net.eval()
    idx = torch.randint(0, VOCAB, (4, cfg.context))
    one_hot_pre = torch.zeros(1, 2, 3)
    one_hot_pre[..., 0] = 1.0
    with torch.no_grad():
        teacher = net.hidden_states(idx, mix=one_hot_pre)[-1]

    @torch.no_grad()
    def loss(mix):
        return float(F.mse_loss(net.hidden_states(idx, mix=mix)[-1], teacher))
    return net, loss


def test_perturbation_picks_the_candidate_whose_removal_hurts_most_not_the_largest_alpha():
    net, loss = _hand_built()
    assert [net.candidates[i] for i in net.alphas.argmax(-1).tolist()] == ["post", "post"]  # what argmax would say
    base, rises = loss_rises(net, 0, loss)
    assert rises[1] == pytest.approx(0.0, abs=1e-9) and rises[2] == pytest.approx(0.0, abs=1e-9)  # they add nothing
    assert rises[0] > 1e-3 and base > 0
    tuned = []
    sel = perturbation_select(net, loss, lambda: tuned.append(dict(net.projected)), order=[1, 0])
    assert sel.choices == [0, 0] and [net.candidates[c] for c in sel.choices] == ["pre", "pre"]
    assert sel.order == [1, 0] and tuned == [{1: 0}]  # one fine-tune, after the first decision
    assert net.projected == {0: 0, 1: 0}
    assert sel.loss_rises.shape == (2, 3) and np.argmax(sel.loss_rises, 1).tolist() == [0, 0]
    assert sel.base_losses[0] < sel.base_losses[1]  # site 1 projected to Pre-LN first: closer to the teacher
    assert loss(net.mixing_weights()) == pytest.approx(0.0, abs=1e-10)  # all one-hot Pre-LN = the teacher
    g = from_probabilities(net.probabilities(), net.cfg, VOCAB, choices=sel.choices)
    assert g.placements == [{"attn": "pre", "ffn": "pre"}] and g.site_probabilities()[0].argmax() == 1


def test_order_must_be_a_permutation():
    net, loss = _hand_built()
    with pytest.raises(ValueError, match="permutation"):
        perturbation_select(net, loss, lambda: None, order=[0, 0])


def test_clear_winner_rule():
    assert clear_winner([0.5, 0.35, 0.15])  # lead 0.15
    assert not clear_winner([0.45, 0.31, 0.24])
    assert not clear_winner([0.5, 0.45, 0.05])  # top >= 0.5, but no clear lead


def _separable_loss(cost: torch.Tensor):
    """``loss(mix)``: the sum over sites of ``cost[site, chosen candidate]`` (mix ``(n_layers, 2, K)``
    one-hot), so the best genotype is each site's cheapest candidate."""
    def loss(mix: torch.Tensor) -> float:
        rows = mix[:, 0] if cost.shape[0] == mix.shape[0] else mix.reshape(-1, mix.shape[-1])  # layer: a row per block
        return float((rows * cost).sum())
    return loss


def test_score_selection_is_exhaustive_on_a_small_space(tiny_model_cfg):
    from autoln.oneshot.selection import score_select

    net = Supernet(tiny_model_cfg, 23)
    cost = torch.tensor([[3.0, 1.0, 2.0], [0.5, 2.0, 1.0], [2.0, 2.0, 0.1]])  # best: post pre deepnorm
    seen = []
    result = score_select(net, _separable_loss(cost), seed=0, progress=seen.append)
    assert result.method == "exhaustive" and result.evaluated == 27 and seen == list(range(1, 28))
    assert result.choices == [1, 0, 2] and result.loss == pytest.approx(1.6)
    assert [g for g, _ in result.top[:2]] == [[1, 0, 2], [1, 2, 2]] and result.top[1][1] == pytest.approx(2.1)  # 1 + 1 + 0.1
    assert net.projected == {0: 1, 1: 0, 2: 2}  # left one-hot at the answer


def test_score_selection_evolves_on_a_large_space(tiny_model_cfg):
    """3^8 = 6561 genotypes (sublayer sites of 4 blocks) > 4096: SPOS's evolution, 50 x 20 at
    most, finds the optimum of a separable loss and is reproducible."""
    from autoln.config import ModelConfig
    from autoln.oneshot.selection import score_select

    cfg = ModelConfig(**{**tiny_model_cfg.__dict__, "n_layers": 4, "granularity": "sublayer"})
    net = Supernet(cfg, 23)
    cost = torch.tensor(np.random.default_rng(0).uniform(0, 1, (8, 3)), dtype=torch.float32)
    result = score_select(net, _separable_loss(cost), seed=0)
    assert result.method == "evolution" and 50 < result.evaluated <= 1000
    assert result.choices == cost.argmin(-1).tolist()
    assert score_select(net, _separable_loss(cost), seed=0).evaluated == result.evaluated
    with pytest.raises(ValueError, match="population >= 2"):
        score_select(net, _separable_loss(cost), seed=0, population=1)


def test_sigmoid_weights_below_float32_give_finite_probabilities_and_a_loadable_genotype(tiny_model_cfg, tmp_path):
    """Alphas near -120 under sigmoid mixing: each weight underflows float32, yet the
    probabilities are sigmoid(a) / sum sigmoid(a) = softmax(a) there, finite, and the genotype
    written from them loads. A genotype that its loader would refuse is never written."""
    from autoln.core.errors import GenotypeError
    from autoln.models.genotype import Genotype

    net = Supernet(tiny_model_cfg, VOCAB, mixing="sigmoid")
    with torch.no_grad():
        net.alphas.copy_(torch.tensor([[-120.0, -110.0, -130.0], [0.0, 2.0, -1.0], [-1000.0, -1000.0, -999.0]]))
    assert float(net.site_weights().detach()[0].sum()) == 0.0  # the weights themselves underflow
    probs = net.probabilities()
    np.testing.assert_allclose(probs[0], torch.softmax(torch.tensor([-120.0, -110.0, -130.0], dtype=torch.float64), 0), rtol=1e-9)
    s = torch.sigmoid(torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64))
    np.testing.assert_allclose(probs[1], (s / s.sum()).numpy(), rtol=1e-12)
    np.testing.assert_allclose(probs[2], torch.softmax(torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), 0), rtol=1e-9)
    g = from_probabilities(probs, tiny_model_cfg, VOCAB)
    assert Genotype.load(g.save(tmp_path / "g.json")).placements == ["post", "post", "deepnorm"]
    bad = from_probabilities(probs, tiny_model_cfg, VOCAB)
    bad.probabilities[0] = [float("nan")] * 3
    with pytest.raises(GenotypeError, match="probabilities\\[0\\]"):
        bad.save(tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
