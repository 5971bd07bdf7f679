"""The public API misused as public bug reports did (issue 45, kinds 1-4): each mistake gets one
line that names the argument and what was expected, before any work is lost, and a wrapped
model's genotype fits the plain model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autoln
from autoln.core.errors import ConfigError, GenotypeError

from .conftest import ROOT
from .test_nanogpt_diff import EXAMPLE, load

D, VOCAB = 8, 11


class Block(nn.Module):
    def __init__(self, cands, n_layers: int, layer: int, spare: bool = False, branch=None) -> None:
        super().__init__()
        self.attn, self.ffn = branch or nn.Linear(D, D), nn.Linear(D, D)
        self.attn_site = autoln.Site(cands, D, n_layers, layer=layer)
        self.ffn_site = autoln.Site(cands, D, n_layers, layer=layer)
        if spare:  # built, never called in forward
            self.spare_site = autoln.Site(cands, D, n_layers, layer=layer)

    def forward(self, x):
        return self.ffn_site(self.attn_site(x, self.attn), self.ffn)


class Tiny(nn.Module):
    """A minimal LM with searched sites; ``layers``: each block's ``layer`` (default 1..n)."""

    def __init__(self, blocks: int = 2, n_layers: int | None = None, layers=None, cands=("pre", "post", "lns"), spare=False,
                 branch=None) -> None:
        super().__init__()
        n_layers = n_layers or blocks
        layers = layers or list(range(1, blocks + 1))
        self.emb, self.head = nn.Embedding(VOCAB, D), nn.Linear(D, VOCAB)
        self.blocks = nn.ModuleList(Block(cands, n_layers, layers[i], spare and i == 0, branch) for i in range(blocks))

    def forward(self, x, y=None):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        logits = self.head(h)
        return logits, None if y is None else F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-1)


def _batches(n: int = 8) -> list:
    g = torch.Generator().manual_seed(0)
    return [(x, torch.roll(x, -1, 1)) for x in (torch.randint(0, VOCAB, (2, 6), generator=g) for _ in range(n))]


CFG = autoln.SearchConfig(steps=4, arch_warmup_steps=1, warmup_steps=0, eval_every=4, selection="argmax", monitor_windows=0)


def _search(model, **kw):
    return autoln.search(model, _batches(), cfg=CFG, progress=False, shortlist=0, **kw)


def _site_genotype(model, placement: str = "pre") -> autoln.SiteGenotype:
    sm = autoln.SearchModel(model)
    k = sm.candidates.index(placement)
    return autoln.SiteGenotype(sm.candidates, {s: placement for s in sm.site_names},
                               {s: [float(i == k) for i in range(len(sm.candidates))] for s in sm.site_names})


# --- kind 1: misuse answered by a bare traceback ------------------------------------------------


@pytest.mark.parametrize("cands, words", [
    (("pre", "bogus"), "candidates: 'bogus' is not a placement"),
    (("pre", "psot"), r"did you mean 'post'\?"),
    (None, "candidates: expected a list of placement names"),
    (("pre", "pre", "post"), "'pre' given twice"),  # kind 2: no longer dropped without a word
])
def test_site_refuses_bad_candidates_naming_them(cands, words):
    with pytest.raises(ValueError, match=words):
        autoln.Site(cands, D, 2)


def test_site_refuses_an_unknown_norm():
    with pytest.raises(ValueError, match=r"norm: expected one of \['layernorm', 'rmsnorm', 'dyt'\], got 'layrnorm'"):
        autoln.Site(("pre", "post"), D, 2, norm="layrnorm")


def test_derive_refuses_what_is_no_site_genotype(tmp_path):
    from autoln.config import ModelConfig
    from autoln.models.genotype import baseline

    with pytest.raises(GenotypeError, match=r"derive: genotype: .*got 'pre', which is no file; 'pre' is a placement: .*"
                                            r"baselines=\['pre'\]"):
        autoln.derive(Tiny(), "pre")
    own = baseline("all-pre", ModelConfig(), 256)  # search.py's genotype of autoln's own model
    with pytest.raises(GenotypeError, match="this is search.py's genotype of autoln's own model .*retrain.py --genotype"):
        autoln.derive(Tiny(), own)
    with pytest.raises(ValueError, match="derive: model: expected the model"):
        autoln.derive(_site_genotype(Tiny()), Tiny())
    path = _site_genotype(Tiny(), "post").save(tmp_path / "g.json")  # its file serves for it
    model = autoln.derive(Tiny(), str(path))
    assert [list(m.placements) for m in model.modules() if isinstance(m, autoln.Site)] == [["post"]] * 4


def test_search_refuses_a_dict_as_cfg_and_a_non_model():
    with pytest.raises(ConfigError, match=r"cfg: expected an autoln.SearchConfig.*got a dict: autoln.SearchConfig\(\*\*cfg\)"):
        autoln.search(Tiny(), _batches(), cfg={"steps": 2})
    with pytest.raises(ValueError, match="search: model: expected your model"):
        autoln.search("model.pt", _batches())
    with pytest.raises(ValueError, match="loss_fn: expected a function"):
        autoln.search(Tiny(), _batches(), loss_fn="cross_entropy")


def test_the_two_genotype_formats_say_which_is_which_and_what_to_do(tmp_path):
    from autoln.config import ModelConfig
    from autoln.models.genotype import Genotype, baseline

    site = _site_genotype(Tiny()).save(tmp_path / "site.json")
    with pytest.raises(GenotypeError, match="a genotype of autoln.search for a model of your own .*autoln.derive"):
        Genotype.load(site)  # what retrain.py --genotype reads
    own = baseline("all-pre", ModelConfig(), 256).save(tmp_path / "own.json")
    with pytest.raises(GenotypeError, match="this is search.py's genotype of autoln's own model .*python retrain.py --genotype"):
        autoln.SiteGenotype.load(own)


def test_retrain_py_names_a_site_genotype_for_what_it_is(tmp_path, capsys):
    from autoln import cli

    site = _site_genotype(Tiny()).save(tmp_path / "site.json")
    text = tmp_path / "t.txt"
    text.write_text("hello world, this is a line\n" * 400, encoding="utf-8")
    code = cli.retrain_main(["--genotype", str(site), "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "r"),
                             "--set", f"data.corpus={text}", "--set", f"data.cache_dir={tmp_path / 'c'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "a genotype of autoln.search for a model of your own" in err and "Traceback" not in err


def test_a_branch_that_returns_a_tuple_is_named_with_its_site():
    class HFAttention(nn.Linear):
        def forward(self, x):
            return super().forward(x), None  # (out, attn_weights)

    model = Tiny(branch=HFAttention(D, D))
    sm = autoln.SearchModel(model)
    with pytest.raises(TypeError, match=r"autoln.Site 'blocks.0.attn_site': its branch HFAttention returned a tuple of 2, "
                                        r"expected one tensor shaped as its input \(2, 6, 8\).*lambda h: attn\(h\)\[0\]"):
        sm(*_batches(1)[0])
    derived = autoln.derive(Tiny(branch=HFAttention(D, D)), _site_genotype(Tiny()))  # the derived model: the same line
    with pytest.raises(TypeError, match="autoln.Site 'blocks.0.attn_site': its branch HFAttention returned a tuple"):
        derived(_batches(1)[0][0])

    class Wide(nn.Linear):
        pass

    with pytest.raises(TypeError, match=r"its branch Wide returned shape \(2, 6, 4\), expected one tensor shaped as its input"):
        autoln.SearchModel(Tiny(branch=Wide(D, 4)))(*_batches(1)[0])


def test_compare_genotypes_refuses_misuse_in_one_line_before_any_training(tmp_path):
    from autoln.config import ModelConfig
    from autoln.models.genotype import baseline

    trained = []
    kw = dict(train=lambda m, s: trained.append(s), evaluate=lambda m: 1.0, progress=False)
    good = _site_genotype(Tiny())
    for bad, error, words in (
            (dict(genotypes=good, seeds=2.0), ValueError, r"seeds: expected a positive count \(e.g. 3\).*got 2.0"),
            (dict(genotypes=good, baselines="pre"), ValueError, r"baselines: expected a list of names, e.g. \['pre'\]"),
            (dict(genotypes=good, baselines=["pre", "pre"]), ValueError, r"baselines: \['pre'\] given twice"),
            (dict(genotypes=baseline("all-pre", ModelConfig(), 256)), GenotypeError, "search.py's genotype"),
            (dict(genotypes={"a": good, "b": "missing.json"}), GenotypeError, r"genotypes\['b'\]: .*'missing.json', which is no file"),
            (dict(genotypes=good, cfg={"steps": 5}), ValueError, "cfg: expected an autoln.config.RetrainConfig")):
        with pytest.raises(error, match=words):
            autoln.compare_genotypes(Tiny, **bad, **kw)
    with pytest.raises(ValueError, match="build: expected a function that returns a fresh model.*got a Tiny model"):
        autoln.compare_genotypes(Tiny(), good, **kw)
    assert trained == []
    path = good.save(tmp_path / "g.json")  # a genotype file is taken as the genotype
    result = autoln.compare_genotypes(Tiny, str(path), baselines=["post"], seeds=1, **kw)
    assert sorted(r.name for r in result.rows) == ["all-post", "searched"] and trained == [0, 0]


def test_race_genotypes_refuses_a_model_as_builder_and_a_string_genotype():
    kw = dict(train=lambda m, s, n: None, evaluate=lambda m: 1.0, steps=9, progress=False)
    with pytest.raises(ValueError, match="race_genotypes: build: expected a function"):
        autoln.race_genotypes(Tiny(), _site_genotype(Tiny()), **kw)
    with pytest.raises(GenotypeError, match="race_genotypes: searched: .*'pre', which is no file"):
        autoln.race_genotypes(Tiny, "pre", **kw)


# --- kind 2: misuse accepted silently -------------------------------------------------------------


def test_every_site_at_layer_one_is_noted_where_the_search_answers():
    model = Tiny(blocks=4, layers=[1, 1, 1, 1])
    out = _search(model)
    assert any("every one of the 8 sites is at layer=1 of n_layers=4" in n and "layer=i + 1" in n for n in out.notes)
    assert not [n for n in _search(Tiny(blocks=4)).notes if "layer" in n]  # layers 1..4: nothing to note


def test_n_layers_beyond_the_sites_is_noted_and_disagreeing_depths_refused():
    notes = _search(Tiny(blocks=2, n_layers=12)).notes
    assert any("the sites reach layer 2 but n_layers=12" in n and "pass n_layers=2" in n for n in notes)

    class Mixed(Tiny):
        def __init__(self):
            super().__init__(blocks=2)
            self.blocks[1].ffn_site = autoln.Site(("pre", "post", "lns"), D, 3, layer=2)

    with pytest.raises(ValueError, match=r"the sites disagree on n_layers \(\[2, 3\]\)"):
        autoln.SearchModel(Mixed())


def test_a_site_never_called_is_said_to_take_no_part_in_the_loss(capsys):
    out = _search(Tiny(spare=True))
    line = next(n for n in out.notes if "never calls" in n)
    assert "['blocks.0.spare_site']" in line and "no part in the loss" in line
    assert "never calls the site(s) ['blocks.0.spare_site']" in capsys.readouterr().err  # said at the first step too
    assert not [n for n in _search(Tiny()).notes if "never calls" in n]


# --- kind 3: finished work lost to a check that could come first ---------------------------------


def test_compare_checks_every_genotype_and_evaluate_before_the_first_training():
    trained = []
    good = _site_genotype(Tiny())
    misfit = autoln.SiteGenotype(list(good.candidates), {"foo": "pre"}, {"foo": [1.0, 0.0, 0.0]})
    with pytest.raises(GenotypeError, match="compare_genotypes: late: the genotype names sites the model lacks"):
        autoln.compare_genotypes(Tiny, {"good": good, "late": misfit}, train=lambda m, s: trained.append(s),
                                 evaluate=lambda m: 1.0, progress=False)
    with pytest.raises(ValueError, match=r"a trial call on an untrained model, before any training\): evaluate returned None"):
        autoln.compare_genotypes(Tiny, good, train=lambda m, s: trained.append(s), evaluate=lambda m: None, progress=False)
    assert trained == []


# --- kind 6: NaN and skipped updates reported where they happen ----------------------------------


def _padding(n: int = 8) -> list:
    """D_alpha batches whose every target is nanoGPT's ignored -1."""
    return [(x, torch.full_like(x, -1)) for x, _ in _batches(n)]


def test_a_batch_without_a_target_to_score_is_named_as_the_cause():
    from autoln.core.errors import DivergenceError

    with pytest.raises(DivergenceError, match=r"L_alpha \(or its gradient\)=nan.*The cause is the batch, not the learning rate: "
                                              r"the D_alpha batch has no target to score \(all 12 targets are negative"):
        _search(Tiny(), arch_batches=_padding())
    from dataclasses import replace

    with pytest.raises(DivergenceError, match="Try a new run with a lower search.lr"):  # a real divergence keeps its remedy
        autoln.search(Tiny(), _batches(), cfg=replace(CFG, lr=1e30), progress=False, shortlist=0)


def test_skipped_updates_are_in_the_outcome_its_notes_and_stderr(capsys):
    from dataclasses import replace

    out = autoln.search(Tiny(), _batches(), arch_batches=_padding(), cfg=replace(CFG, on_divergence="skip_batch"),
                        progress=False, shortlist=0)
    line = "3 of 4 updates were skipped (NaN/inf loss or gradient, on_divergence=skip_batch); the run diverged"
    assert any(line in n for n in out.notes) and line in capsys.readouterr().err
    assert out.genotype.provenance["skipped_batches"] == 3  # the alpha steps of steps 2-4
    assert not [n for n in _search(Tiny()).notes if "skipped" in n]


def test_evaluation_counts_the_scored_targets_and_skips_a_batch_with_none():
    from autoln.engine.training import evaluate_batches

    torch.manual_seed(0)
    model = autoln.derive(Tiny(), _site_genotype(Tiny(), "pre"))
    (x1, y1), (x2, y2) = _batches(2)
    y1 = y1.clone()
    y1[0] = -1  # half of the first batch ignored
    with torch.no_grad():
        l1, l2 = float(model(x1, y1)[1]), float(model(x2, y2)[1])
    mean = evaluate_batches(model, [(x1, y1), (x2, y2), (x2, torch.full_like(y2, -1))], torch.device("cpu"))
    assert mean == pytest.approx((6 * l1 + 12 * l2) / 18, rel=1e-6)


# --- kind 4: a wrapped model ----------------------------------------------------------------------


class Wrapper(nn.Module):
    """A DDP-style wrapper of one's own: every module name gains ``module.``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


def test_a_genotype_searched_under_ddp_names_the_sites_as_the_plain_model_does(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        out = _search(DistributedDataParallel(Tiny()))
    finally:
        dist.destroy_process_group()
    assert list(out.genotype.sites) == [f"blocks.{i}.{s}_site" for i in range(2) for s in ("attn", "ffn")]
    plain = autoln.derive(Tiny(), out.genotype)  # the README's derive(GPT(...), genotype) after the search
    assert [list(m.placements) for m in plain.modules() if isinstance(m, autoln.Site)] == \
        [[p] for p in out.genotype.sites.values()]


def test_derive_matches_site_names_across_a_wrapper_of_ones_own():
    g = _site_genotype(Tiny(), "post")
    assert list(autoln.SearchModel(Wrapper(Tiny())).site_names)[0] == "module.blocks.0.attn_site"
    wrapped = autoln.derive(Wrapper(Tiny()), g)  # plain names onto a wrapped model
    prefixed = autoln.SiteGenotype(g.candidates, {f"module.{k}": v for k, v in g.sites.items()},
                                   {f"module.{k}": v for k, v in g.probabilities.items()})
    plain = autoln.derive(Tiny(), prefixed)  # a wrapper's names onto the plain model
    for model in (wrapped, plain):
        assert all(list(m.placements) == ["post"] for m in model.modules() if isinstance(m, autoln.Site))
    with pytest.raises(GenotypeError, match="names sites the model lacks"):
        autoln.derive(Tiny(), autoln.SiteGenotype(g.candidates, {"x.blocks.9.attn_site": "pre"}, {"x.blocks.9.attn_site": [1, 0, 0]}))


def test_a_compiled_model_names_its_sites_without_orig_mod():
    gpt = load(EXAMPLE, "example_gpt_misuse")
    model = gpt.GPT(gpt.GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=1, n_embd=8, norm_candidates=("pre", "post")))
    assert autoln.SearchModel(torch.compile(model)).site_names == autoln.SearchModel(model).site_names \
        == ["transformer.h.0.attn_site", "transformer.h.0.mlp_site"]
