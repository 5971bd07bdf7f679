"""Single-path training of the shared weights (issue 34's fair training: FairNAS, Chu et al.
2021; SPOS, Guo et al. 2020): FairNAS's paths use every candidate of every site exactly once;
each path is a one-hot supernet, so a fair step's gradient is the mean of its derived models'
gradients (the one-hot equivalence, per path); and both modes run search.py end to end."""

from __future__ import annotations

import json

import pytest
import torch

from autoln.oneshot.architect import WEIGHT_STEPS, fair_step, single_paths, spos_step
from autoln.core.errors import ConfigError
from autoln.config import ModelConfig, SearchConfig, load_config
from autoln.models.model import build_derived
from autoln.models.supernet import Supernet
from autoln.engine.training import seed_everything, weight_optimizer

from .conftest import ROOT

VOCAB = 11
SEVEN = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]


def tiny(granularity: str = "layer") -> Supernet:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, context=6, candidates=SEVEN, granularity=granularity)
    net = Supernet(cfg, VOCAB, arch_init_std=0.5).double()
    with torch.no_grad():  # every candidate's own norm gains matter
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return net


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
def test_fairnas_paths_use_every_candidate_of_every_site_exactly_once(granularity):
    net = tiny(granularity)
    net.projected = {1: 4}
    paths = single_paths(net, strict=True)
    assert len(paths) == 7
    per_site = torch.stack([p.reshape(-1, 7) if granularity == "sublayer" else p[:, 0] for p in paths])  # (K, n_sites, K)
    assert torch.equal(per_site.sum(-1), torch.ones_like(per_site.sum(-1)))  # each path one-hot at each site
    free = [s for s in range(per_site.shape[1]) if s != 1]
    assert torch.equal(per_site[:, free].sum(0), torch.ones(len(free), 7, dtype=per_site.dtype))  # each candidate once
    assert torch.equal(per_site[:, 1].argmax(-1), torch.full((7,), 4))  # a decided site keeps its candidate
    assert len(single_paths(net, strict=False)) == 1


def test_a_fair_step_s_gradient_is_the_mean_of_its_derived_models_gradients():
    net = tiny()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (4, 6), generator=g)
    y = torch.roll(x, -1, 1)
    opt, sched = weight_optimizer(net.named_weight_parameters(), SearchConfig(steps=10, lr=0.0, warmup_steps=0))
    torch.manual_seed(5)
    paths = single_paths(net, strict=True)
    torch.manual_seed(5)
    loss, _ = fair_step(net, opt, sched, x, y, grad_clip=0.0)  # lr 0: the weights stay, the gradients are kept
    expected = {id(p): torch.zeros_like(p) for _, p in net.named_weight_parameters()}
    by_name = net.state_dict(keep_vars=True)  # every name of a shared tensor (pre's and peri's one input norm)
    losses = []
    for mix in paths:
        names = [SEVEN[int(k)] for k in mix[:, 0].argmax(-1)]
        derived = build_derived(net.cfg, VOCAB, [(n, n) for n in names]).double()
        derived.load_state_dict(net.state_dict(), strict=False)  # the derived model's weights are the supernet's
        _, dl = derived(x, y)
        dl.backward()
        losses.append(float(dl.detach()))
        for n, p in derived.named_parameters():
            if p.grad is not None:
                expected[id(by_name[n])] += p.grad / len(paths)
    assert loss == pytest.approx(sum(losses) / len(losses), rel=1e-6)  # the loss is fp32 (cross-entropy of fp32 logits)
    for n, p in net.named_weight_parameters():
        want = expected[id(p)]
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=n)


def test_weight_mode_registry_and_config():
    assert WEIGHT_STEPS["fair"] is fair_step and WEIGHT_STEPS["spos"] is spos_step
    with pytest.raises(ConfigError, match="search.weight_mode"):
        load_config(None, ["search.weight_mode=fairnas"])


@pytest.mark.parametrize("mode", ["fair", "spos"])
def test_search_py_trains_single_path_and_reads_off_by_score(tmp_path, mode):
    from autoln.oneshot.run_search import run_search

    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"), ["logging.progress=false", "logging.tensorboard=false",
                                                            f"search.weight_mode={mode}", "search.arch_lr=0", "search.selection=score",
                                                            "search.steps=20", "search.arch_warmup_steps=5"])
    result = run_search(cfg, tmp_path / mode)
    saved = json.loads((tmp_path / mode / "genotype.json").read_text())
    assert saved["provenance"]["config"]["search"]["weight_mode"] == mode
    assert saved["provenance"]["selection"]["search"] == "exhaustive" and len(result.genotype.placements) == 2
    seed_everything(cfg.search.seed)
    start = Supernet(cfg.model, 256, cfg.search.arch_init_std, cfg.search.tau_start)  # the search's own start
    assert torch.equal(result.model.alphas.detach(), start.alphas.detach())  # arch_lr 0: the alphas never move
    assert not torch.equal(result.model.blocks[0].ffn.fc1.weight.detach(), start.blocks[0].ffn.fc1.weight.detach())  # the weights do
