"""Each candidate's output scale and share of the supernet's mixture (issue 44, part 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoln.config import ModelConfig, load_config
from autoln.models.site import Site, candidate_scales, output_scales
from autoln.oneshot.run_search import run_search
from autoln.models.supernet import Supernet

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


def test_output_scales_are_rms_and_weighted_shares():
    a, b = torch.full((2, 3, 4), 0.5), torch.full((2, 3, 4), -2.0)
    s = output_scales(["pre", "post"], [a, b], torch.tensor([0.8, 0.2]))
    assert s["rms"] == {"pre": 0.5, "post": 2.0}
    assert s["share"] == pytest.approx({"pre": 0.4 / 0.8, "post": 0.4 / 0.8})  # 0.8 * 0.5 against 0.2 * 2.0


def test_candidate_scales_see_the_normed_candidates_outweigh_a_small_stream():
    torch.manual_seed(0)
    site = Site(["pre", "post"], d_model=16, n_layers=2)
    x = 0.03 * torch.randn(4, 5, 16)  # a stream at nanoGPT's start: RMS 0.03
    branch = torch.nn.Linear(16, 16)
    with torch.no_grad():
        branch.weight.mul_(0.01)
        branch.bias.zero_()
    holder = torch.nn.ModuleDict({"site": site, "branch": branch})
    scales = candidate_scales(holder, x, lambda x: site(x, branch, torch.tensor([0.5, 0.5])))
    s = scales["site"]
    with torch.no_grad():
        fx = branch(x)
        post = torch.nn.functional.layer_norm(x + fx, (16,))  # Post-LN's output at gain 1, bias 0: RMS just below 1 (eps)
        pre = x + branch(torch.nn.functional.layer_norm(x, (16,)))
    assert s["rms"]["post"] == pytest.approx(float(post.pow(2).mean().sqrt()), rel=1e-5)
    assert s["rms"]["pre"] == pytest.approx(float(pre.pow(2).mean().sqrt()), rel=1e-5)
    assert s["share"]["post"] > 0.95 and site.probe is None  # cleared after the pass


def test_a_search_logs_the_scales_to_tensorboard_and_its_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = tmp_path / "t.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, [f"data.corpus={text}", f"data.cache_dir={tmp_path / 'c'}", "search.steps=20", "search.eval_every=10",
                             "search.arch_warmup_steps=4", "logging.progress=false", "race.enabled=false"])
    result = run_search(cfg, tmp_path / "s")
    scales = result.genotype.provenance["metrics"]["candidate_scales"]
    assert [e["step"] for e in scales] == [10, 20]
    assert set(scales[-1]["sites"]) == {f"blocks.{i}.{s}_site" for i in range(2) for s in ("attn", "ffn")}
    for site in scales[-1]["sites"].values():
        assert sum(site["share"].values()) == pytest.approx(1.0) and set(site["rms"]) == {"pre", "post", "deepnorm"}
    acc = EventAccumulator(str(tmp_path / "s"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"alpha/block0/post", "scale/block0.attn/post", "share/block1.ffn/pre"} <= tags  # one way to name block 0
    assert not [t for t in tags if "blocks." in t or "_site" in t]


def test_scales_do_not_change_the_supernet_s_output():
    torch.manual_seed(0)
    net = Supernet(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8), vocab_size=11).eval()
    x = torch.randint(0, 11, (2, 8))
    before = net(x)[0]
    candidate_scales(net, x, lambda x: net(x))
    assert torch.equal(net(x)[0], before)


# --- the "one scale" mixing (search.candidate_scale: common) -------------------------------------


def test_common_scale_brings_each_candidate_to_the_weighted_rms():
    from autoln.models.site import common_scale_mix

    a, b = torch.full((1, 2, 4), 0.03), torch.full((1, 2, 4), 1.0)  # a raw stream and a normalised one
    w = torch.tensor([0.25, 0.75])
    common = 0.25 * 0.03 + 0.75 * 1.0  # the weighted RMS, per token
    assert torch.allclose(common_scale_mix([a, b], w), torch.full((1, 2, 4), common))  # both at it: the mixture too
    one_hot = common_scale_mix([a, b], torch.tensor([1.0, 0.0]))
    assert torch.equal(one_hot, a)  # one-hot: the chosen output itself


@pytest.mark.parametrize("choice", ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none", "mixed"])
def test_one_hot_common_scale_supernet_equals_the_derived_model(choice):
    from autoln.models.model import build_derived

    wide = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8, candidates=wide, granularity="sublayer")
    torch.manual_seed(0)
    net = Supernet(cfg, 11, candidate_scale="common")
    rows = [(3 * i + 1) % 7 for i in range(4)] if choice == "mixed" else [wide.index(choice)] * 4
    with torch.no_grad():
        net.alphas.fill_(-1e4)
        for i, k in enumerate(rows):
            net.alphas[i, k] = 1e4
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    names = [wide[k] for k in rows]
    derived = build_derived(cfg, 11, [(names[2 * i], names[2 * i + 1]) for i in range(2)])
    assert derived.load_state_dict(net.state_dict(), strict=False).missing_keys == []
    idx = torch.randint(0, 11, (3, 8))
    torch.testing.assert_close(net(idx)[0], derived(idx)[0], rtol=0, atol=1e-5)


def test_common_scale_is_a_search_setting_of_both_supernets(tmp_path):
    import sys

    from autoln.config import CANDIDATE_SCALES
    from autoln.models.site import CANDIDATE_SCALES as SITE_SCALES

    assert CANDIDATE_SCALES == SITE_SCALES
    net = Supernet(ModelConfig(n_layers=1, d_model=8, n_heads=1, d_ff=16, context=4), 5, candidate_scale="common")
    assert {m.candidate_scale for m in net.modules() if isinstance(m, Site)} == {"common"}
    sys.path.insert(0, str(ROOT / "examples"))
    from gpt import GPT, GPTConfig

    import autoln

    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=5, norm_candidates=("pre", "post")))
    batches = [(torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 4))) for _ in range(4)]
    cfg = autoln.SearchConfig(steps=4, arch_warmup_steps=1, warmup_steps=0, eval_every=4, candidate_scale="common",
                              selection="argmax", monitor_windows=0)
    out = autoln.search(model, batches, cfg=cfg, progress=False, shortlist=0)
    assert {m.candidate_scale for m in out.model.modules() if isinstance(m, Site)} == {"common"}


# --- split by stream (issue 44, part 3b) --------------------------------------------------------


def test_stream_groups_split_the_seven_candidates_as_the_issue_names_them():
    from autoln.space.placements import stream_groups

    seven = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]
    assert stream_groups(seven) == {"unnormalised": ["pre", "peri", "outnorm", "lns", "none"], "normalised": ["post", "deepnorm"]}
    assert stream_groups(["pre:fixed", "peri"]) == {"unnormalised": ["pre:fixed", "peri"]}  # an empty group is left out
    assert stream_groups(["deepnorm:fixed", "pre"]) == {"unnormalised": ["pre"], "normalised": ["deepnorm:fixed"]}
    with pytest.raises(KeyError):
        stream_groups(["pre", "bogus"])


@pytest.mark.parametrize("name", ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"])
def test_a_placement_normalises_the_stream_exactly_when_its_output_is_a_norm_s(name):
    from autoln.space.placements import PLACEMENTS, build_placement

    torch.manual_seed(0)
    placement = build_placement(name, 16, 4, "layernorm", layer=2)
    x, fx = 5.0 * torch.randn(3, 4, 16), torch.randn(3, 4, 16)  # a stream of RMS 5 and a branch of RMS 1
    rms = placement.output(x, fx).pow(2).mean(-1).sqrt()  # per token
    if PLACEMENTS[name].normalises_stream:  # a LayerNorm's output at gain 1, bias 0: RMS 1 up to eps
        torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-4)
    else:  # the stream itself plus a branch of RMS at most about 1
        assert bool((rms > 3.5).all())


@pytest.mark.parametrize("stream", ["unnormalised", "normalised"])
def test_one_hot_sub_supernet_of_each_stream_equals_the_derived_model(stream):
    from autoln.models.model import build_derived
    from autoln.space.placements import stream_groups

    group = stream_groups(["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"])[stream]
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8, candidates=group, granularity="sublayer")
    choices = [[k] * 4 for k in range(len(group))] + [[(3 * i + 1) % len(group) for i in range(4)]]  # each, then a mix
    for row in choices:
        torch.manual_seed(0)
        net = Supernet(cfg, 11)
        with torch.no_grad():
            net.alphas.fill_(-1e4)
            for i, k in enumerate(row):
                net.alphas[i, k] = 1e4
            for n, p in net.named_parameters():
                if "norm" in n:
                    p.add_(0.1 * torch.randn_like(p))
        names = [group[k] for k in row]
        derived = build_derived(cfg, 11, [(names[2 * i], names[2 * i + 1]) for i in range(2)])
        assert derived.load_state_dict(net.state_dict(), strict=False).missing_keys == []
        idx = torch.randint(0, 11, (3, 8))
        torch.testing.assert_close(net(idx)[0], derived(idx)[0], rtol=0, atol=1e-5)
