"""QK-norm (autoln.space.qk, autoln.models.qk_norm): the norm on queries and keys as a searched
choice beside the placements. One-hot supernet = derived model; the derived nanoGPT with ``qk`` =
a hand-written nanoGPT with QK-norm, loss for loss; genotypes round-trip and old files load as
``none``; the open models' named placements; the QK-norm's own alphas get the exact bilevel
gradient."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import autoln
from autoln.config import ModelConfig, SearchConfig
from autoln.core.errors import GenotypeError
from autoln.models.genotype import Genotype, baseline, from_probabilities, is_baseline
from autoln.models.model import build_derived
from autoln.models.supernet import Supernet
from autoln.oneshot.architect import Architect
from autoln.race.run_race import named_specs

from .test_model import _one_hot_supernet
from .test_nanogpt_diff import SIZE, _train_losses, nanogpt, patched  # noqa: F401 (fixtures)

VOCAB = 40
QK = ["none", "qk", "qk-all"]


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(n_layers=3, d_model=16, n_heads=2, d_ff=32, context=8, qk_norm=QK), **kw})


def _one_hot(cfg: ModelConfig, sites: list[int], qk: list[int]) -> Supernet:
    net = _one_hot_supernet(cfg, sites, VOCAB)
    with torch.no_grad():
        for name, p in net.named_parameters():  # every norm (the QK-norms' too) away from its start
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    net.qk_fixed = qk
    return net


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("qk", [[0, 0, 0], [1, 1, 1], [2, 2, 2], [1, 2, 0]])
def test_one_hot_supernet_with_qk_norm_equals_the_derived_model(norm, qk):
    cfg = _cfg(norm=norm, candidates=["pre", "post", "peri"])
    sites = [0, 1, 2]
    net = _one_hot(cfg, sites, qk)
    derived = build_derived(cfg, VOCAB, [(cfg.candidates[k],) * 2 for k in sites], [QK[q] for q in qk])
    missing, unexpected = derived.load_state_dict(net.state_dict(), strict=False)
    assert missing == [] and {"alphas", "qk_alphas"} <= set(unexpected)
    idx = torch.randint(0, VOCAB, (3, cfg.context))
    assert torch.equal(net(idx)[0], derived(idx)[0])  # exactly: weight 0 times a finite output adds nothing


def test_none_everywhere_is_the_model_without_qk_norm_key_for_key():
    cfg = _cfg(qk_norm=["none"])
    torch.manual_seed(0)
    plain = build_derived(cfg, VOCAB, [("pre", "pre")] * 3)
    torch.manual_seed(0)
    nones = build_derived(cfg, VOCAB, [("pre", "pre")] * 3, ["none"] * 3)
    assert list(plain.state_dict()) == list(nones.state_dict())
    assert not any("qk" in k for k in plain.state_dict())
    idx = torch.randint(0, VOCAB, (2, cfg.context))
    assert torch.equal(plain(idx)[0], nones(idx)[0])


def test_per_head_and_across_heads_normalise_what_they_say():
    torch.manual_seed(0)
    q, k = torch.randn(2, 5, 12) * 3 + 1, torch.randn(2, 5, 12)
    per_head, _ = autoln.QKNorm(["qk"], 12, 3, bias=False)(q, k)
    heads = per_head.view(2, 5, 3, 4)
    torch.testing.assert_close(heads.mean(-1), torch.zeros(2, 5, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(heads.var(-1, unbiased=False), torch.ones(2, 5, 3), atol=1e-3, rtol=0)
    across, _ = autoln.QKNorm(["qk-all"], 12, 3, bias=False)(q, k)
    torch.testing.assert_close(across.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    assert not torch.allclose(across.view(2, 5, 3, 4).mean(-1), torch.zeros(2, 5, 3), atol=1e-2)  # heads not each centred
    same, _ = autoln.QKNorm(["none"], 12, 3)(q, k)
    assert same is q


def test_mixed_qk_norm_is_the_weighted_sum_of_its_candidates():
    torch.manual_seed(0)
    m = autoln.QKNorm(QK, 8, 2)
    q, k = torch.randn(3, 8), torch.randn(3, 8)
    w = torch.tensor([0.2, 0.5, 0.3])
    mq, mk = m(q, k, w)
    parts = [m.one(c, q, k) for c in QK]
    torch.testing.assert_close(mq, sum(wi * p[0] for wi, p in zip(w, parts)))
    torch.testing.assert_close(mk, sum(wi * p[1] for wi, p in zip(w, parts)))


def test_a_supernet_forward_mixes_its_qk_norms_with_weights_computed_once_and_clears_them():
    """``forward`` enters ``hidden_states``: the QK weights are computed once per forward pass, every
    searched QK-norm mixes by its row, and none keeps a row after the pass."""
    torch.manual_seed(0)
    net = Supernet(_cfg(candidates=["pre", "post"]), VOCAB)
    calls, qk_weights = [], net.qk_weights
    net.qk_weights = lambda: calls.append(1) or qk_weights()
    seen = {i: [] for i in range(3)}
    hooks = [m.register_forward_pre_hook(lambda mod, args, i=i: seen[i].append(mod.mix)) for i, m in enumerate(net._qk_modules)]
    net(torch.randint(0, VOCAB, (2, 8)))
    assert len(calls) == 1
    for i, want in enumerate(qk_weights()):  # each attention runs twice (the normed and the raw input), with its row
        assert len(seen[i]) == 2
        for row in seen[i]:
            torch.testing.assert_close(row, want)
    assert all(m.mix is None for m in net._qk_modules)
    net.hidden_states(torch.randint(0, VOCAB, (2, 8)))
    assert len(calls) == 2
    for h in hooks:
        h.remove()


@pytest.mark.parametrize("args, want", [
    ((["qk", "bad"], 8, 2), "autoln.QKNorm: candidates: 'bad' is not a QK-norm candidate"),
    ((["qk", "qk"], 8, 2), "autoln.QKNorm: candidates: a candidate given twice"),
    ((["qk"], 8, 3), "autoln.QKNorm: d_model (8) must be a positive multiple of n_heads (3)"),
])
def test_qk_norm_refuses_bad_arguments_in_one_line(args, want):
    with pytest.raises(ValueError, match=want.replace("(", r"\(").replace(")", r"\)")):
        autoln.QKNorm(*args)


def test_qk_norm_refuses_heads_already_split_and_missing_weights():
    m = autoln.QKNorm(["none", "qk"], 8, 2)
    with pytest.raises(ValueError, match="has last dimension 4, expected d_model=8"):
        m(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="needs mixing weights"):
        m(torch.randn(1, 3, 8), torch.randn(1, 3, 8))


def test_model_qk_norm_config_is_checked():
    from autoln.core.errors import ConfigError

    with pytest.raises(ConfigError, match="model.qk_norm: 'qkv' is not a QK-norm candidate"):
        _cfg(qk_norm=["none", "qkv"]).validate()
    with pytest.raises(ConfigError, match="model.qk_norm: expected at least one"):
        _cfg(qk_norm=[]).validate()


# --- the bilevel gradient reaches the QK-norm's own alphas -----------------------------------------


def _exact(net: Supernet, batch_w, batch_a, xi: float):
    """d/d(alphas, qk_alphas) of L_alpha(w - xi grad_w L_w(w, alphas)) by double backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = [n for n, _ in net.named_weight_parameters()]
    w = {n: p.detach().clone().requires_grad_(True) for n, p in net.named_weight_parameters()}
    a = net.alphas.detach().clone().requires_grad_(True)
    q = net.qk_alphas.detach().clone().requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH):  # double backward through attention
        loss_w = functional_call(net, {**w, "alphas": a, "qk_alphas": q}, batch_w)[1]
        grads = torch.autograd.grad(loss_w, [w[n] for n in names], create_graph=True)
        w1 = {n: w[n] - xi * g for n, g in zip(names, grads)}
        loss_a = functional_call(net, {**w1, "alphas": a, "qk_alphas": q}, batch_a)[1]
        return torch.autograd.grad(loss_a, [a, q])


def test_second_order_gradient_of_both_alpha_sets_matches_autograd_through_the_step():
    torch.manual_seed(0)
    net = Supernet(_cfg(n_layers=2, d_model=8, d_ff=16, context=6), VOCAB, arch_init_std=0.5).double()

    def batch(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, VOCAB, (4, 6), generator=g)
        return x, torch.roll(x, -1, 1)

    bw, ba, xi = batch(1), batch(2), 0.5
    _, got = Architect(net, SearchConfig(order=2)).gradient(bw, ba, xi, step=1)
    for g, e in zip(got, _exact(net, bw, ba, xi)):
        cos = F.cosine_similarity(g.flatten(), e.flatten(), dim=0).item()
        assert cos >= 0.99 and ((g - e).norm() / e.norm()).item() <= 0.05, cos
    assert got[1].shape == (2, 3) and got[1].abs().sum() > 0


def test_an_alpha_step_moves_the_qk_alphas_and_a_weight_step_does_not():
    from autoln.oneshot.architect import weight_step
    from autoln.engine.training import weight_optimizer

    torch.manual_seed(0)
    net = Supernet(_cfg(), VOCAB)
    x = torch.randint(0, VOCAB, (4, 8))
    batch = (x, torch.roll(x, -1, 1))
    sc = SearchConfig(arch_lr=0.1)
    before = net.qk_alphas.detach().clone()
    opt, sched = weight_optimizer(net.named_weight_parameters(), sc)
    weight_step(net, opt, sched, *batch, grad_clip=1.0)
    assert torch.equal(net.qk_alphas, before) and net.qk_alphas.grad is None
    Architect(net, sc).step(batch, batch, 0.1, 1)
    assert not torch.equal(net.qk_alphas, before)


# --- genotypes --------------------------------------------------------------------------------------


def test_genotype_with_qk_norm_round_trips_and_says_so(tmp_path):
    cfg = _cfg()
    probs = torch.softmax(torch.randn(3, 3), -1).numpy()
    qk_probs = torch.softmax(torch.randn(3, 3), -1).numpy()
    g = from_probabilities(probs, cfg, VOCAB, {"seed": 1}, None, ["qk", "none", "qk-all"], qk_probs)
    assert g.qk_choices() == ["qk", "none", "qk-all"] and g.has_qk()
    assert g.describe().endswith(" | qk none qk-all")
    back = Genotype.load(g.save(tmp_path / "g.json"))
    assert back == g and back.to_dict() == json.loads((tmp_path / "g.json").read_text())
    assert back.qk_norm["candidates"] == QK and math.isclose(sum(back.qk_norm["probabilities"][1]), 1.0)


def test_a_genotype_without_the_field_loads_as_none_everywhere(tmp_path):
    g = from_probabilities(torch.softmax(torch.randn(3, 3), -1).numpy(), _cfg(qk_norm=["none"]), VOCAB)
    obj = g.to_dict()
    assert "qk_norm" not in obj  # written as before the field existed
    path = tmp_path / "old.json"
    path.write_text(json.dumps(obj))
    old = Genotype.load(path)
    assert old.qk_choices() == ["none"] * 3 and not old.has_qk() and " | " not in old.describe()
    model = build_derived(old.model_config(ModelConfig()), VOCAB, old.block_placements(), old.qk_choices())
    assert not any("qk" in k for k in model.state_dict())


@pytest.mark.parametrize("field, value, want", [
    ("qk_norm", {"candidates": ["qk"]}, "field 'qk_norm': expected an object with exactly the keys"),
    ("qk_norm", {"candidates": ["qkv"], "choices": ["qkv"] * 3, "probabilities": [[1.0]] * 3}, "field 'qk_norm.candidates'"),
    ("qk_norm", {"candidates": ["none", "qk"], "choices": ["qk"] * 2, "probabilities": [[0, 1]] * 2}, "field 'qk_norm.choices'"),
    ("qk_norm", {"candidates": ["none", "qk"], "choices": ["qk", "qk", "pre"], "probabilities": [[0, 1]] * 3},
     "field 'qk_norm.choices[2]'"),
    ("qk_norm", {"candidates": ["none", "qk"], "choices": ["qk"] * 3, "probabilities": [[0.5, 0.6]] * 3},
     "field 'qk_norm.probabilities[0]': probabilities sum to 1.100000"),
])
def test_a_bad_qk_norm_field_is_refused_naming_it(field, value, want):
    obj = baseline("all-pre", _cfg(), VOCAB).to_dict()
    obj[field] = value
    with pytest.raises(GenotypeError, match=want.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        Genotype.from_dict(obj, "g.json")


@pytest.mark.parametrize("name, placement, qk", [("olmo2", "outnorm", "qk-all"), ("gemma3", "peri", "qk"), ("qwen3", "pre", "qk")])
def test_the_open_models_named_placements(name, placement, qk):
    g = baseline(name, _cfg(), VOCAB)
    assert is_baseline(name) and g.block_placements() == [(placement, placement)] * 3 and g.qk_choices() == [qk] * 3
    assert g.provenance == {"baseline": name}


def test_olmo2_takes_per_head_qk_norm_where_only_that_is_searched_and_plain_names_take_none():
    assert baseline("olmo2", _cfg(qk_norm=["none", "qk"]), VOCAB).qk_choices() == ["qk"] * 3
    assert baseline("all-pre", _cfg(), VOCAB).qk_norm is None
    assert baseline("mix-ln", _cfg(qk_norm=["qk"]), VOCAB).qk_choices() == ["qk"] * 3  # a model whose QK-norm is fixed


def test_the_race_enters_the_open_models_only_where_their_parts_are_candidates():
    seven = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]
    assert named_specs(seven)[-3:] != ["olmo2", "gemma3", "qwen3"]  # no QK-norm searched: none of them
    assert named_specs(seven, QK)[-3:] == ["olmo2", "gemma3", "qwen3"]
    assert named_specs(["pre", "post", "deepnorm"], ["none", "qk"])[-1:] == ["qwen3"]


# --- a user's model: nanoGPT with the diff ------------------------------------------------------------


class HandQKAttention(nn.Module):
    """nanoGPT's CausalSelfAttention with QK-norm written by hand (no autoln): LayerNorm over each
    head's channels on q and k after the split, as Gemma 3 and Qwen 3 place it."""

    def __init__(self, base):
        super().__init__()
        self.base = base
        hs = base.n_embd // base.n_head
        self.q_ln = nn.LayerNorm(hs, bias=False)
        self.k_ln = nn.LayerNorm(hs, bias=False)

    def forward(self, x):
        b = self.base
        B, T, C = x.size()
        q, k, v = b.c_attn(x).split(b.n_embd, dim=2)
        k = self.k_ln(k.view(B, T, b.n_head, C // b.n_head)).transpose(1, 2)
        q = self.q_ln(q.view(B, T, b.n_head, C // b.n_head)).transpose(1, 2)
        v = v.view(B, T, b.n_head, C // b.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=True)
        return b.resid_dropout(b.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def test_nanogpt_with_qk_is_a_hand_written_nanogpt_with_qk_norm_loss_for_loss(patched, nanogpt):  # noqa: F811
    got, n_got = _train_losses(patched, 0, bias=False, norm_candidates=("pre",), qk_candidates=("qk",))
    want, n_want = _train_losses(nanogpt, 0, attention=HandQKAttention, bias=False)
    assert n_got == n_want
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-6, atol=1e-6)
    plain, _ = _train_losses(nanogpt, 0, bias=False)
    assert abs(plain[-1] - got[-1]) > 1e-4  # QK-norm changes the model: the comparison can fail


def test_a_searched_nanogpt_qk_norm_derives_to_the_one_hot_supernet_and_round_trips(patched, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    cfg = dict(**SIZE, bias=False, norm_candidates=("pre", "post"), qk_candidates=("none", "qk", "qk-all"))
    model = patched.GPT(patched.GPTConfig(**cfg))
    g = torch.Generator().manual_seed(1)
    data = [(x, torch.roll(x, -1, 1)) for x in (torch.randint(0, 48, (4, 16), generator=g) for _ in range(8))]
    sc = autoln.SearchConfig(steps=4, warmup_steps=1, arch_warmup_steps=1, eval_every=2, eval_windows=4, selection_windows=4,
                             selection="argmax")
    outcome = autoln.search(model, data, steps=4, cfg=sc, progress=False)
    genotype = outcome.genotype
    assert list(genotype.qk) == [f"transformer.h.{i}.attn.qk_norm" for i in range(3)] and genotype.qk_candidates == list(cfg["qk_candidates"])
    back = autoln.SiteGenotype.load(genotype.save(tmp_path / "g.json"))
    assert back == genotype
    # the searched model, one-hot on the genotype, computes what its derived model computes
    sm = outcome.model
    x, y = data[0]
    with torch.no_grad():
        sm.eval()
        sm.qk_fixed = [sm.qk_candidates.index(genotype.qk[n]) for n in sm.qk_site_names]
        rows = sm.expand(list(range(len(sm.site_names))))
        sm.projected = {r: sm.candidates.index(genotype.sites[n]) for n, r in zip(sm.module_sites, rows)}
        want = sm(x, y)[1]
        derived = autoln.derive(sm, genotype, init=False)
        got = derived(x, y)[1]
    assert torch.equal(got, want)
    for i in range(3):
        assert derived.transformer.h[i].attn.qk_norm.candidates == [genotype.qk[f"transformer.h.{i}.attn.qk_norm"]]


def test_an_old_site_genotype_without_qk_loads_with_none_and_derives_a_model_without_searched_qk(patched, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    model = patched.GPT(patched.GPTConfig(**SIZE, bias=False, norm_candidates=("pre", "post")))
    sites = {f"transformer.h.{i}.{s}_site": "pre" for i in range(3) for s in ("attn", "mlp")}
    obj = {"format": "autoln.site-genotype", "version": 1, "candidates": ["pre", "post"], "sites": sites,
           "probabilities": {n: [1.0, 0.0] for n in sites}, "provenance": {}}
    (tmp_path / "old.json").write_text(json.dumps(obj))
    old = autoln.SiteGenotype.load(tmp_path / "old.json")
    assert old.qk == {} and " | " not in old.describe()
    autoln.derive(model, old)
    searched = patched.GPT(patched.GPTConfig(**SIZE, bias=False, norm_candidates=("pre", "post"), qk_candidates=("none", "qk")))
    with pytest.raises(GenotypeError, match="searched QK-norms .* have no choice in the genotype"):
        autoln.derive(searched, old)


def test_the_consensus_of_seeds_takes_each_block_s_qk_choice_of_most_seeds():
    from autoln.oneshot.consensus import qk_consensus

    cfg = _cfg()
    probs = torch.softmax(torch.randn(3, 3), -1).numpy()
    a = from_probabilities(probs, cfg, VOCAB, {}, None, ["qk", "qk", "none"])
    b = from_probabilities(probs, cfg, VOCAB, {}, None, ["qk", "qk-all", "qk-all"])
    c = from_probabilities(probs, cfg, VOCAB, {}, None, ["none", "qk-all", "qk-all"])
    assert qk_consensus([a, b, c])["choices"] == ["qk", "qk-all", "qk-all"]
    plain = from_probabilities(probs, _cfg(qk_norm=["none"]), VOCAB)
    assert qk_consensus([plain, plain]) is None
    assert qk_consensus([a, plain, plain])["choices"] == ["none"] * 3  # none at every block, by two seeds of three, recorded


def test_a_searched_qk_norm_without_a_searched_site_is_refused_in_one_line(patched):  # noqa: F811
    model = patched.GPT(patched.GPTConfig(**SIZE, bias=False, norm_candidates=("pre",), qk_candidates=("none", "qk")))
    with pytest.raises(ValueError, match="QK-norm is searched beside the placements, so give the sites two or more"):
        autoln.SearchModel(model)


def test_search_py_with_qk_norm_searched_writes_the_read_off_s_choice_and_its_retrain_builds_it(tmp_path):
    from autoln.config import load_config
    from autoln.oneshot.run_search import run_search

    from .conftest import ROOT

    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        "logging.progress=false", "logging.tensorboard=false", "race.enabled=false", "search.steps=20",
        "search.arch_warmup_steps=5", "search.arch_lr=0.3", "model.qk_norm=[none,qk,qk-all]", f"data.cache_dir={tmp_path / 'c'}"])
    result = run_search(cfg, tmp_path / "s")
    model = result.model
    assert model.qk_alphas is not None and model.qk_fixed is not None  # read off first, one-hot during the sites' read-off
    assert model.qk_choices() == [QK[i] for i in model.qk_alphas.detach().argmax(-1).tolist()]
    g = Genotype.load(tmp_path / "s" / "genotype.json")
    assert g.qk_choices() == model.qk_choices()
    if g.qk_norm is not None:  # the probabilities are the QK-norm's own, softmaxed
        torch.testing.assert_close(torch.tensor(g.qk_norm["probabilities"], dtype=torch.float64),
                                   torch.softmax(model.qk_alphas.detach().double() / model.tau, -1), rtol=1e-5, atol=1e-6)
    derived = build_derived(g.model_config(cfg.model), g.model["vocab_size"], g.block_placements(), g.qk_choices())
    for block, choice in zip(derived.blocks, g.qk_choices()):
        assert (block.attn.qk_norm is None) == (choice == "none")
        assert choice == "none" or block.attn.qk_norm.candidates == [choice]


def qk_race_model(patched, placement: str, site_probabilities: list[float]):
    """``(build, searched)``: a 3-block nanoGPT over ``pre``/``post`` with QK-norm ``none``/``qk``
    searched, and a searched genotype with ``placement`` at every site (each with
    ``site_probabilities``) and QK-norm ``qk`` in every block."""
    import contextlib
    import io

    cfg = dict(**SIZE, bias=False, norm_candidates=("pre", "post"), qk_candidates=("none", "qk"))

    def build():
        with contextlib.redirect_stdout(io.StringIO()):
            return patched.GPT(patched.GPTConfig(**cfg))

    qk_names = [f"transformer.h.{i}.attn.qk_norm" for i in range(3)]
    sites = {f"transformer.h.{i}.{s}_site": placement for i in range(3) for s in ("attn", "mlp")}
    return build, autoln.SiteGenotype(["pre", "post"], sites, {n: list(site_probabilities) for n in sites}, {},
                                      {n: "qk" for n in qk_names}, ["none", "qk"], {n: [0.0, 1.0] for n in qk_names})


def test_the_api_race_s_answer_keeps_its_qk_norm_choice_and_derives(patched, tmp_path):  # noqa: F811
    build, searched = qk_race_model(patched, "post", [0.0, 1.0])

    def evaluate(model):  # rigged: Post-LN with QK-norm everywhere is a whole unit better (qwen3, Pre-LN's, is not), plus seed noise
        qk = all(m.candidates == ["qk"] for m in model.modules() if isinstance(m, autoln.QKNorm))
        post = all(list(m.placements) == ["post"] for m in model.modules() if isinstance(m, autoln.Site))
        return (1.0 if qk and post else 2.0) + 0.05 * float(torch.rand(()))

    race = autoln.race_genotypes(build, searched, train=lambda model, seed, steps: None, evaluate=evaluate, steps=9,
                                 own="pre", progress=False)
    assert race.verdict.outcome == "searched-wins", race.record["verdict"]["line"]
    assert race.genotype.qk == searched.qk and race.genotype.qk_candidates == ["none", "qk"]
    back = autoln.SiteGenotype.load(race.genotype.save(tmp_path / "g.json"))
    model = autoln.derive(build(), back)
    assert [m.candidates for m in model.modules() if isinstance(m, autoln.QKNorm)] == [["qk"]] * 3


def test_markdown_tables_escape_the_bar_of_a_qk_genotype():
    from autoln.retrain.compare import md_cell

    assert md_cell("outnorm outnorm | qk-all qk-all") == "outnorm outnorm \\| qk-all qk-all"


def test_a_searched_qk_norm_that_chose_none_everywhere_is_still_recorded():
    qk_probs = torch.softmax(torch.randn(3, 3), -1).numpy()
    g = from_probabilities(torch.softmax(torch.randn(3, 3), -1).numpy(), _cfg(), VOCAB, {}, None, ["none"] * 3, qk_probs)
    assert g.qk_norm is not None and g.qk_norm["choices"] == ["none"] * 3 and not g.has_qk()
    assert g.model_config(ModelConfig()).qk_norm == QK  # a retrain's config.yaml records the genotype's QK-norm


@pytest.mark.parametrize("args, kwargs, want", [
    ((["qk"], -32, 2), {}, "autoln.QKNorm: d_model: expected a positive integer, got -32"),
    ((["qk"], 8, True), {}, "autoln.QKNorm: n_heads: expected a positive integer, got True"),
    ((["qk"], 8, 2), {"bias": "no"}, "autoln.QKNorm: bias: expected True or False, got 'no'"),
])
def test_qk_norm_refuses_careless_sizes(args, kwargs, want):
    with pytest.raises(ValueError, match=want.replace("(", r"\(").replace(")", r"\)")):
        autoln.QKNorm(*args, **kwargs)


def test_qk_norm_refuses_careless_tensors_and_weights():
    m = autoln.QKNorm(QK, 8, 2)
    q = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weights: expected one per candidate, shape \(3,\), got \(2,\)"):
        m(q, q, torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="q: expected a tensor"):
        m(None, q, torch.ones(3) / 3)
    with pytest.raises(ValueError, match="k: expected a tensor .* got a 0-d tensor"):
        m(q, torch.tensor(1.0), torch.ones(3) / 3)


def test_a_huge_integer_in_a_qk_probability_is_one_line_not_a_traceback():
    obj = baseline("olmo2", _cfg(), VOCAB).to_dict()
    obj["qk_norm"]["probabilities"][0] = [10 ** 400]
    with pytest.raises(GenotypeError, match=r"field 'qk_norm\.probabilities\[0\]'"):
        Genotype.from_dict(json.loads(json.dumps(obj)), "g.json")


@pytest.mark.parametrize("qk, want", [
    ({"candidates": ["none", "qk"], "choices": {"a.qk_norm": "qkv"}, "probabilities": {}},
     "field 'qk_norm.choices.a.qk_norm': expected one of ['none', 'qk'], got 'qkv'"),
    ({"candidates": ["none", "qk", "qk"], "choices": {"a.qk_norm": "qk"}, "probabilities": {}},
     "field 'qk_norm.candidates': a name given twice"),
])
def test_a_site_genotype_s_bad_qk_field_names_the_module_and_value(qk, want):
    obj = {"format": "autoln.site-genotype", "version": 1, "candidates": ["pre", "post"], "sites": {"a": "pre"},
           "probabilities": {"a": [1.0, 0.0]}, "provenance": {}, "qk_norm": qk}
    with pytest.raises(GenotypeError, match=want.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        autoln.SiteGenotype.from_dict(obj, "g.json")


def test_named_placements_without_qk_norm_take_the_first_candidate_where_none_is_not_one():
    assert baseline("all-pre", _cfg(qk_norm=["qk", "qk-all"]), VOCAB).qk_choices() == ["qk"] * 3
    assert baseline("all-pre", _cfg(qk_norm=["none", "qk"]), VOCAB).qk_norm is None


def test_compare_s_default_baselines_add_the_open_models_for_a_genotype_with_qk_norm(tmp_path):
    from autoln.cli.retrain_command import _any_qk

    qk = baseline("olmo2", _cfg(), VOCAB).save(tmp_path / "qk.json")
    plain = baseline("all-pre", _cfg(), VOCAB).save(tmp_path / "plain.json")
    assert _any_qk([str(plain), str(qk)]) and not _any_qk([str(plain), "all-pre", str(tmp_path / "missing.json")])


@pytest.mark.parametrize("proposer", ["local", "tpe"])
def test_the_api_race_s_proposals_take_the_searched_qk_norm(patched, proposer):  # noqa: F811
    """With proposal rounds, a race on a QK-norm search proposes placements and gives each
    proposal the searched genotype's QK-norm (as search.py's proposals take the read-off's), and
    reads the pool's genotypes, ``| qk ...`` written after their placements, without error (a
    proposer once took that part for placements and stopped the race)."""
    from autoln.race.rule import RaceRule

    build, searched = qk_race_model(patched, "pre", [0.5, 0.5])

    def evaluate(model):  # rigged: Post-LN at the first site, with QK-norm, is a unit better
        qk = all(m.candidates == ["qk"] for m in model.modules() if isinstance(m, autoln.QKNorm))
        first = next(m for m in model.modules() if isinstance(m, autoln.Site))
        return (1.0 if qk and list(first.placements) == ["post"] else 2.0) + 0.01 * float(torch.rand(()))

    race = autoln.race_genotypes(build, searched, train=lambda model, seed, steps: None, evaluate=evaluate, steps=9, own="pre",
                                 progress=False, rule=RaceRule(proposer=proposer, budget=4, proposals=3))
    proposed = [e for e in race.record["pool"] if e["origin"].startswith(f"proposed by {proposer}")]
    assert proposed and all(e["placements"].endswith(" | qk qk qk") for e in proposed)
    assert race.genotype.qk == searched.qk


def test_a_proposer_s_space_reads_placements_before_the_qk_bar_and_writes_its_tail():
    """``Space.encode`` reads a genotype's placements before `` | ``; ``decode`` writes ``tail``
    after them, so every proposal of a QK-norm race carries the race's QK-norm choices."""
    from autoln.race.propose import Space, make_proposer

    space = Space(("pre", "post"), 3, None, 1, "qk none qk")
    assert space.encode("post pre post | qk qk qk") == space.encode("post pre post") == (1, 0, 1)
    assert space.decode((1, 0, 1)) == "post pre post | qk none qk" and Space(("pre", "post"), 3).decode((1, 0, 1)) == "post pre post"
    seen = [("pre pre pre", 9, 2.0), ("post pre pre | qk qk qk", 9, 1.0), ("pre post pre | qk none qk", 9, 1.5)]
    out = make_proposer("local", space, 0)(1, 3, seen, frozenset(p for p, _, _ in seen))
    assert len(out) == 3 and all(g.endswith(" | qk none qk") for g in out)
    assert all(sum(a != b for a, b in zip(g.split(" | ")[0].split(), "post pre pre".split())) == 1 for g in out)  # around the leader
