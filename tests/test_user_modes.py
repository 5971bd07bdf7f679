"""A user's train/eval modes are theirs (Lightning-AI/pytorch-lightning#2551, quark0/darts#85):
``autoln.search`` gives a model back in the modes it found, and trains around a module the user
froze in eval mode (a BatchNorm whose running statistics must not move); so do the evaluations
and diagnostics it runs on the way (evaluate_batches, the collapse monitor's Hessian, the
candidates' scales) and ``compare_genotypes``' default loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autoln
from autoln.engine.training import evaluate_batches
from autoln.models.site import candidate_scales
from autoln.oneshot.monitor import alpha_hessian

D, VOCAB = 8, 11
CANDS = ("pre", "post", "deepnorm")


class Block(nn.Module):
    def __init__(self, layer: int) -> None:
        super().__init__()
        self.attn, self.ffn = nn.Sequential(nn.Linear(D, D), nn.Dropout(0.5)), nn.Linear(D, D)
        self.attn_site, self.ffn_site = autoln.Site(CANDS, D, 2, layer=layer), autoln.Site(CANDS, D, 2, layer=layer)

    def forward(self, x):
        return self.ffn_site(self.attn_site(x, self.attn), self.ffn)


class Frozen(nn.Module):
    """A small LM with dropout in its branches and a BatchNorm over its embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.bn, self.head = nn.Embedding(VOCAB, D), nn.BatchNorm1d(D), nn.Linear(D, VOCAB)
        self.blocks = nn.ModuleList(Block(i + 1) for i in range(2))

    def forward(self, x, y=None):
        h = self.bn(self.emb(x).transpose(1, 2)).transpose(1, 2)
        for b in self.blocks:
            h = b(h)
        logits = self.head(h)
        return logits, None if y is None else F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def _frozen() -> Frozen:
    torch.manual_seed(0)
    model = Frozen()
    model.bn.eval()  # frozen on purpose: its running statistics stay as they are
    return model


def _batches(n: int = 6) -> list:
    g = torch.Generator().manual_seed(0)
    return [(x, torch.roll(x, -1, 1)) for x in (3 * torch.randint(0, VOCAB // 3, (4, 6), generator=g) + 1 for _ in range(n))]


CFG = autoln.SearchConfig(steps=6, arch_warmup_steps=1, warmup_steps=0, eval_every=3, selection="argmax", monitor_windows=2)


def _modes(model: nn.Module) -> dict:
    return {n: m.training for n, m in model.named_modules()}


def test_search_keeps_a_frozen_batchnorm_frozen_and_gives_every_mode_back():
    model = _frozen()
    modes, stats = _modes(model), model.bn.running_mean.clone()
    assert modes[""] and not modes["bn"]
    autoln.search(model, _batches(), cfg=CFG, progress=False, shortlist=0, valid_batches=_batches(2),
                  selection_batches=_batches(2))
    assert torch.equal(model.bn.running_mean, stats) and int(model.bn.num_batches_tracked) == 0
    assert _modes(model) == modes


def test_a_model_given_in_eval_mode_comes_back_in_eval_mode():
    model = _frozen().eval()
    autoln.search(model, _batches(), cfg=CFG, progress=False, shortlist=0)
    assert not any(_modes(model).values())
    assert int(model.bn.num_batches_tracked) == 11  # 6 weight and 5 alpha steps in train mode: nothing frozen in an eval model


@pytest.mark.parametrize("run", [
    lambda net, x, y: evaluate_batches(net, [(x, y)], torch.device("cpu")),
    lambda net, x, y: alpha_hessian(net, x, y),
    lambda net, x, y: candidate_scales(net, x, lambda x: net(x)),
], ids=["evaluate_batches", "alpha_hessian", "candidate_scales"])
def test_evaluations_and_diagnostics_restore_each_module_s_own_mode(run):
    net = autoln.SearchModel(_frozen())
    modes = _modes(net)
    x, y = _batches(1)[0]
    assert run(net, x, y) is not None
    assert _modes(net) == modes


def test_compare_s_default_loop_trains_around_what_build_froze():
    seen = []

    def evaluate(model):
        seen.append((model.bn.training, model.training, int(model.bn.num_batches_tracked), model.bn.running_mean.abs().sum().item()))
        return 1.0

    autoln.compare_genotypes(_frozen, None, baselines=["pre"], seeds=1, train_batches=_batches(), evaluate=evaluate,
                             cfg=autoln.config.RetrainConfig(steps=4, warmup_steps=0), progress=False)
    assert seen[-1] == (False, True, 0, 0.0)  # the trial call and the trained model: the BatchNorm never moved
