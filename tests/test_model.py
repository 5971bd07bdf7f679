"""The supernet and the derived model: init gain, one-hot equivalence, parameter partition, cost."""

import pytest
import torch

from autoln.oneshot.architect import Architect, weight_step
from autoln.config import ModelConfig, SearchConfig
from autoln.models.genotype import baseline
from autoln.models.model import build_derived
from autoln.space.placements import deepnorm_constants
from autoln.models.supernet import Supernet, site_names
from autoln.engine.training import weight_optimizer

VOCAB = 23


def _derived(cfg, placements, seed=0):
    torch.manual_seed(seed)
    return build_derived(cfg, VOCAB, placements)


def test_deepnorm_init_gain_on_exactly_four_matrices(tiny_model_cfg):
    """DeepNorm's derived init is unchanged by GPT-2's residual scaling: ``b`` times plain xavier
    on v, o, fc1, fc2 (torchscale), every other weight the same draw."""
    n = tiny_model_cfg.n_layers
    _, b = deepnorm_constants(n)
    plain = _derived(ModelConfig(**{**tiny_model_cfg.__dict__, "residual_init": "unscaled"}), [("pre", "pre")] * n)
    for residual_init in ("scaled", "unscaled"):
        deep = _derived(ModelConfig(**{**tiny_model_cfg.__dict__, "residual_init": residual_init}), [("deepnorm", "deepnorm")] * n)
        scaled = {f"blocks.{i}.{m}.weight" for i in range(n) for m in ("attn.v_proj", "attn.o_proj", "ffn.fc1", "ffn.fc2")}
        pre_params, deep_params = dict(plain.named_parameters()), dict(deep.named_parameters())
        common = [k for k in pre_params if k in deep_params]
        assert len(scaled) == 4 * n and scaled <= set(common)
        for name in common:
            if name in scaled:
                ratio = deep_params[name].detach().std() / pre_params[name].detach().std()
                assert ratio.item() == pytest.approx(b, rel=1e-6), name
                torch.testing.assert_close(deep_params[name], b * pre_params[name])
            else:
                assert torch.equal(deep_params[name], pre_params[name]), name


def test_init_gain_follows_each_sublayer(tiny_model_cfg):
    """Per site: DeepNorm's ``b`` on v/o/fc1/fc2, every other placement GPT-2's ``1/sqrt(2N)`` on
    o_proj and fc2 only, against the same draws at plain xavier."""
    n = tiny_model_cfg.n_layers
    _, b = deepnorm_constants(n)
    s = (2 * n) ** -0.5
    mixed = [("pre", "deepnorm"), ("deepnorm", "post"), ("post", "pre")]
    ref = _derived(ModelConfig(**{**tiny_model_cfg.__dict__, "residual_init": "unscaled"}), [("pre", "pre")] * n)
    m = _derived(tiny_model_cfg, mixed)
    for i, (attn, ffn) in enumerate(mixed):
        for branch, place, names in (("attn", attn, ("v_proj", "o_proj", "q_proj", "k_proj")), ("ffn", ffn, ("fc1", "fc2"))):
            for w in names:
                got = getattr(getattr(m.blocks[i], branch), w).weight
                want = getattr(getattr(ref.blocks[i], branch), w).weight
                if place == "deepnorm":
                    gain = b if w not in ("q_proj", "k_proj") else 1.0
                else:
                    gain = s if w in ("o_proj", "fc2") else 1.0
                torch.testing.assert_close(got, gain * want)


@pytest.mark.parametrize("n_layers", [6, 24])
def test_residual_init_std_follows_gpt2_formula(n_layers):
    """At init the output projections' std is xavier's ``sqrt(2 / (fan_in + fan_out))`` times
    ``1/sqrt(2N)`` (GPT-2), in the derived model and at every supernet site; the value and
    first FFN layer keep xavier's std."""
    cfg = ModelConfig(n_layers=n_layers, d_model=96, n_heads=4, d_ff=384, context=8)
    d, f = cfg.d_model, cfg.d_ff
    s = (2 * n_layers) ** -0.5
    assert s == pytest.approx({6: 0.288675, 24: 0.144338}[n_layers], rel=1e-5)
    want = {"attn.o_proj": s * (2 / (2 * d)) ** 0.5, "ffn.fc2": s * (2 / (d + f)) ** 0.5,
            "attn.v_proj": (2 / (2 * d)) ** 0.5, "ffn.fc1": (2 / (d + f)) ** 0.5}
    for model in (_derived(cfg, [("post", "pre")] * n_layers), Supernet(cfg, VOCAB)):
        for name, std in want.items():
            got = torch.cat([model.get_submodule(f"blocks.{i}.{name}").weight.flatten() for i in range(n_layers)]).std()
            assert got.item() == pytest.approx(std, rel=0.02), name


def _one_hot_supernet(cfg, rows, vocab=VOCAB):
    """A supernet whose alphas are one-hot (logits +-1e4) on ``rows``, one candidate index per site."""
    torch.manual_seed(0)
    net = Supernet(cfg, vocab)
    with torch.no_grad():
        net.alphas.fill_(-1e4)
        for i, k in enumerate(rows):
            net.alphas[i, k] = 1e4
    return net


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
@pytest.mark.parametrize("choice", ["pre", "post", "deepnorm", "mixed"])
def test_one_hot_supernet_equals_derived_model(tiny_model_cfg, granularity, choice):
    cfg = ModelConfig(**{**tiny_model_cfg.__dict__, "granularity": granularity})
    cands = cfg.candidates
    n_sites = len(site_names(cfg.n_layers, granularity))
    if choice == "mixed":
        rows = [(i * 2 + 1) % 3 for i in range(n_sites)]
    else:
        rows = [cands.index(choice)] * n_sites
    net = _one_hot_supernet(cfg, rows)
    names = [cands[k] for k in rows]
    per_block = [(names[i], names[i]) for i in range(cfg.n_layers)] if granularity == "layer" else \
        [(names[2 * i], names[2 * i + 1]) for i in range(cfg.n_layers)]
    # randomise the norms' affine parameters so every candidate's own norms matter
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    net.init_output_bias(torch.log_softmax(torch.randn(VOCAB), 0))  # the LM head's bias is shared too
    torch.manual_seed(0)
    derived = build_derived(cfg, VOCAB, per_block)
    if choice != "deepnorm":  # at init, before any weight is copied: the same start as the supernet's sites
        torch.testing.assert_close(derived.blocks[0].ffn.fc2.weight, net.blocks[0].ffn.fc2.weight, rtol=0, atol=0)
    missing, unexpected = derived.load_state_dict(net.state_dict(), strict=False)
    assert missing == []
    assert "alphas" in unexpected
    assert torch.equal(net.mixing_weights().amax(-1), torch.ones(cfg.n_layers, 2))
    idx = torch.randint(0, VOCAB, (3, cfg.context))
    torch.testing.assert_close(net(idx)[0], derived(idx)[0], rtol=0, atol=1e-5)


def test_parameters_partition_and_alphas_in_state_dict(tiny_model_cfg):
    net = Supernet(tiny_model_cfg, VOCAB)
    arch = {id(p) for p in net.arch_parameters()}
    weights = {id(p) for p in net.weight_parameters()}
    every = {id(p) for p in net.parameters()}
    assert arch and weights and not arch & weights and arch | weights == every
    assert net.alphas.shape == (tiny_model_cfg.n_layers, 3)
    assert torch.equal(net.state_dict()["alphas"], net.alphas.detach())
    assert net.double().alphas.dtype == torch.float64
    sub = Supernet(ModelConfig(**{**tiny_model_cfg.__dict__, "granularity": "sublayer"}), VOCAB)
    assert sub.alphas.shape == (2 * tiny_model_cfg.n_layers, 3)
    assert site_names(2, "sublayer") == ["block0.attn", "block0.ffn", "block1.attn", "block1.ffn"]


def test_alpha_step_changes_only_alphas_and_weight_step_only_weights(tiny_model_cfg):
    sc = SearchConfig(arch_lr=0.05, lr=0.05, warmup_steps=0)
    net = Supernet(tiny_model_cfg, VOCAB, arch_init_std=1e-3)
    opt, sched = weight_optimizer(net.named_weight_parameters(), sc)
    architect = Architect(net, sc)
    x = torch.randint(0, VOCAB, (4, tiny_model_cfg.context))
    y = torch.randint(0, VOCAB, (4, tiny_model_cfg.context))

    def snapshot():
        return {k: v.clone() for k, v in net.state_dict().items()}

    before = snapshot()
    architect.step((x, y), (x, y), xi=0.05, step=1)
    after = snapshot()
    assert not torch.equal(before["alphas"], after["alphas"])
    assert all(torch.equal(before[k], after[k]) for k in before if k != "alphas")
    weight_step(net, opt, sched, x, y, grad_clip=1.0)
    final = snapshot()
    assert torch.equal(after["alphas"], final["alphas"])
    changed = [k for k in after if k != "alphas" and not torch.equal(after[k], final[k])]
    assert "blocks.0.attn.q_proj.weight" in changed and "tok_emb.weight" in changed


def test_supernet_calls_each_branch_twice_not_once_per_candidate(tiny_model_cfg):
    net = Supernet(tiny_model_cfg, VOCAB)
    calls = []
    for block in net.blocks:
        for branch in (block.attn, block.ffn):
            branch.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape[0]))
    net(torch.randint(0, VOCAB, (5, tiny_model_cfg.context)))
    assert calls == [5] * (4 * tiny_model_cfg.n_layers)  # two distinct inputs (x, LN(x)) per site, not three
    derived = build_derived(tiny_model_cfg, VOCAB, [("pre", "post")] * tiny_model_cfg.n_layers)
    calls.clear()
    for block in derived.blocks:
        for branch in (block.attn, block.ffn):
            branch.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape[0]))
    derived(torch.randint(0, VOCAB, (5, tiny_model_cfg.context)))
    assert calls == [5] * (2 * tiny_model_cfg.n_layers)


def test_final_norm_and_tied_head(tiny_model_cfg):
    m = build_derived(tiny_model_cfg, VOCAB, baseline("all-post", tiny_model_cfg, VOCAB).block_placements())
    assert m.lm_head.weight is m.tok_emb.weight
    assert isinstance(m.norm_f, torch.nn.LayerNorm)
    logits, loss = m(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    assert logits.shape == (2, 4, VOCAB) and loss.ndim == 0


WIDE = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]


def _assert_one_hot_equals_derived(cfg, rows):
    net = _one_hot_supernet(cfg, rows)
    cands = net.candidates
    names = [cands[k] for k in rows]
    per_block = [(names[i], names[i]) for i in range(cfg.n_layers)] if cfg.granularity == "layer" else \
        [(names[2 * i], names[2 * i + 1]) for i in range(cfg.n_layers)]
    with torch.no_grad():  # every norm's parameters (gains, biases, DyT's c) away from their init
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    derived = build_derived(cfg, VOCAB, per_block)
    missing, _ = derived.load_state_dict(net.state_dict(), strict=False)
    assert missing == []
    idx = torch.randint(0, VOCAB, (3, cfg.context))
    torch.testing.assert_close(net(idx)[0], derived(idx)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "dyt"])
@pytest.mark.parametrize("choice", WIDE + ["mixed"])
def test_one_hot_supernet_equals_derived_model_for_every_candidate_and_norm(tiny_model_cfg, norm, choice):
    cfg = ModelConfig(**{**tiny_model_cfg.__dict__, "candidates": WIDE, "norm": norm, "granularity": "sublayer"})
    n_sites = 2 * cfg.n_layers
    rows = [(3 * i + 1) % len(WIDE) for i in range(n_sites)] if choice == "mixed" else [WIDE.index(choice)] * n_sites
    _assert_one_hot_equals_derived(cfg, rows)


def test_one_hot_equivalence_with_both_gain_forms(tiny_model_cfg):
    cfg = ModelConfig(**{**tiny_model_cfg.__dict__, "candidates": ["pre", "peri", "post"], "affine": "search",
                         "granularity": "sublayer"})
    assert Supernet(cfg, VOCAB).candidates == ["pre", "pre:fixed", "peri", "peri:fixed", "post", "post:fixed"]
    _assert_one_hot_equals_derived(cfg, [0, 1, 2, 3, 4, 5])


def _branch_calls(model, n_rows=5):
    calls = []
    for block in model.blocks:
        for branch in (block.attn, block.ffn):
            branch.register_forward_hook(lambda mod, inp, out: calls.append(1))
    model(torch.randint(0, VOCAB, (n_rows, model.cfg.context)))
    return len(calls) // (2 * model.cfg.n_layers)


def test_branch_calls_per_site_are_the_distinct_inputs(tiny_model_cfg):
    def supernet(**kw):
        return Supernet(ModelConfig(**{**tiny_model_cfg.__dict__, **kw}), VOCAB)

    # x (post, deepnorm, outnorm, none), LN_in(x) shared by pre and peri, LN(x)/sqrt(l) for lns
    assert _branch_calls(supernet(candidates=WIDE)) == 3
    assert _branch_calls(supernet(candidates=["pre", "peri"])) == 1
    assert _branch_calls(supernet(candidates=["post", "outnorm", "none"])) == 1
    # both gain forms: x once; LN_in(x) once per form; lns once per form
    assert _branch_calls(supernet(candidates=WIDE, affine="search")) == 5
    site = supernet(candidates=WIDE, affine="search").blocks[0].attn_site
    assert site.placements["pre"].norm is site.placements["peri"].norm
    assert site.placements["pre:fixed"].norm is site.placements["peri:fixed"].norm
    assert site.placements["pre"].norm is not site.placements["pre:fixed"].norm


def test_fixed_gains_leave_no_trainable_norm_gain_or_bias(tiny_model_cfg):
    cfg = ModelConfig(**{**tiny_model_cfg.__dict__, "candidates": WIDE, "affine": "fixed"})
    net = Supernet(cfg, VOCAB)
    assert net.candidates == [c + ":fixed" for c in WIDE[:-1]] + ["none"]
    norm_params = [n for n, _ in net.named_parameters() if "norm" in n]
    assert norm_params == []  # per-site norms and the final norm
    dyt = Supernet(ModelConfig(**{**cfg.__dict__, "norm": "dyt"}), VOCAB)
    assert {n.rsplit(".", 1)[-1] for n, _ in dyt.named_parameters() if "norm" in n} == {"alpha"}  # DyT's scalar c stays


def test_searched_gain_forms_give_a_genotype_whose_model_has_exactly_that_mix(tiny_model_cfg):
    import numpy as np

    from autoln.models.genotype import Genotype, from_probabilities

    cfg = ModelConfig(**{**tiny_model_cfg.__dict__, "candidates": ["pre", "post"], "affine": "search"})
    cands = cfg.searched_candidates()
    assert cands == ["pre", "pre:fixed", "post", "post:fixed"]
    choices = [1, 0, 3]  # block0 pre:fixed, block1 pre, block2 post:fixed
    g = from_probabilities(np.full((3, 4), 0.25), cfg, VOCAB, choices=choices)
    g = Genotype.from_dict(g.to_dict())  # through JSON's form
    assert g.placements == ["pre:fixed", "pre", "post:fixed"] and g.candidates == cands
    model = build_derived(g.model_config(cfg), VOCAB, g.block_placements())
    has_gain = [[site.placements[n].norm.weight is not None for n in site.placements]
                for b in model.blocks for site in (b.attn_site, b.ffn_site)]
    assert has_gain == [[False], [False], [True], [True], [False], [False]]
    assert model.norm_f.weight is not None  # the final norm is fixed only with model.affine: fixed


def test_retrain_builds_the_searched_gain_forms(tmp_path, monkeypatch, cache_dir):
    import numpy as np

    from autoln.config import load_config
    from autoln.models.genotype import from_probabilities
    from autoln.retrain.run_retrain import run_retrain

    from .conftest import ROOT

    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"), [
        "model.candidates=[pre, peri]", "model.affine=search", "retrain.steps=2", "retrain.warmup_steps=1", "retrain.eval_every=2",
        "retrain.final_eval_windows=2", "retrain.eval_windows=2", "logging.progress=false", "logging.tensorboard=false"])
    g = from_probabilities(np.full((2, 4), 0.25), cfg.model, 256, choices=[3, 0])  # peri:fixed, pre
    g.save(tmp_path / "g.json")
    model = run_retrain(cfg, str(tmp_path / "g.json"), tmp_path / "r").model
    sites = [(b.attn_site, b.ffn_site) for b in model.blocks]
    assert [list(a.placements) for a, _ in sites] == [["peri:fixed"], ["pre"]]
    assert sites[0][0].placements["peri:fixed"].norm_out.weight is None
    assert sites[1][1].placements["pre"].norm.weight.requires_grad
