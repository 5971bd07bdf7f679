"""The model start (docs/design.md §9: a fair start for every placement): the LM head's bias starts at the
training split's log unigram frequencies, for every placement alike."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from autoln.config import ModelConfig, load_config
from autoln.data import Corpus, load_corpus
from autoln.models.model import build_derived
from autoln.space.placements import deepnorm_constants
from autoln.retrain.run_retrain import run_retrain

from .conftest import ROOT


def _corpus(train: list[int], vocab: int) -> Corpus:
    arr = np.array(train, dtype=np.int64)
    return Corpus("hand", "bytes", "0" * 64, vocab, None, {"train": arr, "valid": arr, "test": arr}, {})


def test_unigram_log_probs_are_add_one_smoothed_train_frequencies():
    lp = _corpus([0, 0, 0, 1, 2, 2], vocab=4).unigram_log_probs()
    # counts 3, 1, 2, 0 over 6 tokens; add-one: (c + 1) / (6 + 4)
    np.testing.assert_allclose(lp, np.log([0.4, 0.2, 0.3, 0.1]), rtol=0, atol=1e-12)
    assert np.exp(lp).sum() == pytest.approx(1.0)


def test_output_bias_changes_no_other_weight_and_keeps_deepnorm_init(tiny_model_cfg):
    cfgs = {ob: ModelConfig(**{**tiny_model_cfg.__dict__, "output_bias": ob}) for ob in ("none", "unigram")}
    prior = torch.log_softmax(torch.randn(23), 0)
    models = {}
    for ob, cfg in cfgs.items():
        torch.manual_seed(0)
        models[ob] = build_derived(cfg, 23, [("deepnorm", "deepnorm")] * cfg.n_layers).init_output_bias(prior)
    with_bias, without = dict(models["unigram"].named_parameters()), dict(models["none"].named_parameters())
    assert set(with_bias) - set(without) == {"lm_head.bias"}
    for name, p in without.items():
        assert torch.equal(p, with_bias[name]), name  # same draws: the bias takes no random numbers
    assert torch.equal(with_bias["lm_head.bias"], prior)
    # DeepNorm's init gain b = (8N)^(-1/4) is untouched: v/o/fc1/fc2 are b x the Pre-LN model's
    torch.manual_seed(0)
    plain = ModelConfig(**{**cfgs["unigram"].__dict__, "residual_init": "unscaled"})  # b times plain xavier
    pre = build_derived(plain, 23, [("pre", "pre")] * tiny_model_cfg.n_layers)
    _, b = deepnorm_constants(tiny_model_cfg.n_layers)
    torch.testing.assert_close(with_bias["blocks.0.ffn.fc2.weight"], b * pre.blocks[0].ffn.fc2.weight)
    # at init the logits are the prior plus LN(x) @ E^T, whose entries are O(0.02 * sqrt(d))
    logits, _ = models["unigram"](torch.zeros(1, 4, dtype=torch.long))
    assert (logits - prior).abs().max() < 0.5


def test_bad_prior_is_refused(tiny_model_cfg):
    m = build_derived(tiny_model_cfg, 23, [("pre", "pre")] * tiny_model_cfg.n_layers)
    with pytest.raises(ValueError, match="23 finite log-probabilities"):
        m.init_output_bias(np.zeros(22))
    with pytest.raises(ValueError, match="finite"):
        m.init_output_bias(np.full(23, -np.inf))


def test_post_ln_leaves_the_unigram_plateau_only_with_the_fix(tmp_path, cache_dir):
    """6 Post-LN blocks of width 32 on the stdlib corpus, 100 steps: with no output bias the
    model is still above the unigram plateau (the cross-entropy of the valid split under the
    training split's smoothed byte frequencies); started at the unigram it is well below. (At
    the plain xavier start the fix was measured on: GPT-2's residual scaling is a second fix.)"""
    sets = ["model.n_layers=6", "model.residual_init=unscaled", "retrain.steps=100", "retrain.eval_every=100", "logging.progress=false",
            "logging.tensorboard=false", f"data.cache_dir={cache_dir}"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", sets)
    corpus = load_corpus(cfg.data)
    valid = np.asarray(corpus.splits["valid"])
    plateau = float(-corpus.unigram_log_probs()[valid].mean())
    assert plateau / math.log(2) == pytest.approx(4.62, abs=0.15)  # bits per byte of the unigram model (stdlib varies a little by Python version)
    losses = {}
    for ob in ("none", "unigram"):
        cfg = load_config(ROOT / "configs" / "tiny.yaml", [*sets, f"model.output_bias={ob}"])
        losses[ob] = run_retrain(cfg, "all-post", tmp_path / ob).valid["loss"]
    assert losses["none"] > plateau  # stalled at the plateau
    assert losses["unigram"] < plateau - 0.2


def test_unigram_plateau_is_the_cross_entropy_of_the_frequencies():
    c = _corpus([0, 0, 0, 1, 2, 2], vocab=4)
    # -(3 log 0.4 + log 0.2 + 2 log 0.3) / 6
    assert c.unigram_plateau("train") == pytest.approx(-(3 * math.log(0.4) + math.log(0.2) + 2 * math.log(0.3)) / 6, abs=1e-12)


def test_a_search_that_learnt_nothing_says_so(tmp_path, monkeypatch, capsys, cache_dir):
    from autoln.models.genotype import Genotype
    from autoln.oneshot.run_search import run_search

    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    common = ["search.steps=6", "search.arch_warmup_steps=2", "search.eval_every=6", "search.eval_windows=4",
              "search.selection=argmax", "logging.progress=false", "logging.tensorboard=false"]
    # a learning rate of 1e-9: the supernet stays at its start, the unigram distribution
    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"), [*common, "search.lr=1e-9"])
    run_search(cfg, tmp_path / "a")
    metrics = Genotype.load(tmp_path / "a" / "genotype.json").provenance["metrics"]
    assert metrics["at_unigram_plateau"] is True and "at the unigram plateau" in capsys.readouterr().err
    assert metrics["unigram_plateau"]["loss"] == pytest.approx(load_corpus(cfg.data).unigram_plateau("valid"), rel=1e-12)
    assert metrics["supernet_valid"]["loss"] > metrics["unigram_plateau"]["loss"] - 0.1
