"""The public API on nanoGPT's model changed as the README shows (examples/gpt.py): one-hot equivalence of its
searched sites with its derived model, derive's DeepNorm init, the site genotype file, the
example end to end, and load_derived against a retrain's own valid loss."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys

import pytest
import torch

import autoln
from autoln.core.errors import GenotypeError, OutputError

from .conftest import ROOT

CANDIDATES = ("pre", "post", "deepnorm")


def _example(name: str):
    path = ROOT / "examples" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.fixture(scope="module")
def gpt():
    return _example("gpt")


def _tiny(gpt, candidates=CANDIDATES):
    torch.manual_seed(0)
    return gpt.GPT(gpt.GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=32, norm_candidates=candidates))


def _genotype(model, placement: str) -> autoln.SiteGenotype:
    sites = autoln.SearchModel(model).site_names
    return autoln.SiteGenotype(list(CANDIDATES), {s: placement for s in sites}, {s: [1 / 3] * 3 for s in sites})


def test_the_public_names_are_importable_from_autoln():
    import autoln.retrain.compare  # noqa: F401 - a submodule named like a public name would now shadow it

    for name in ("Site", "SearchModel", "search", "derive", "SiteGenotype", "load_derived", "SearchConfig",
                 "deepnorm_weights", "compare_genotypes", "Comparison"):
        assert getattr(autoln, name).__doc__ and not isinstance(getattr(autoln, name), type(autoln)), name
        assert not (ROOT / "autoln" / f"{name}.py").exists(), name
    with pytest.raises(AttributeError):
        autoln.nothing_here  # noqa: B018


@pytest.mark.parametrize("placement", [*CANDIDATES, "mixed"])
def test_a_one_hot_searched_site_equals_its_derived_placement_on_the_example_model(gpt, placement):
    model = _tiny(gpt)
    with torch.no_grad():  # every candidate's own norms matter
        for name, p in model.named_parameters():
            if "placements" in name:
                p.add_(0.1 * torch.randn_like(p))
    net = autoln.SearchModel(model)
    assert net.site_names[:2] == ["transformer.h.0.attn_site", "transformer.h.0.mlp_site"] and len(net.site_names) == 6
    names = [CANDIDATES[i % 3] for i in range(6)] if placement == "mixed" else [placement] * 6
    mix = torch.zeros(6, 3)
    for i, n in enumerate(names):
        mix[i, CANDIDATES.index(n)] = 1.0
    x, y = torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16))
    net.eval()
    with torch.no_grad():
        logits, loss = net(x, y, mix=mix)
    genotype = autoln.SiteGenotype(list(CANDIDATES), dict(zip(net.site_names, names)), {s: [1 / 3] * 3 for s in net.site_names})
    derived = autoln.derive(copy.deepcopy(model), genotype, init=False).eval()
    with torch.no_grad():
        want_logits, want_loss = derived(x, y)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-5)
    assert float(loss) == pytest.approx(float(want_loss), abs=1e-6)
    assert all(len(s.placements) == 1 for s in derived.modules() if isinstance(s, autoln.Site))


def test_derive_applies_deepnorm_s_gain_to_the_named_weights_only(gpt):
    fresh, plain = _tiny(gpt), _tiny(gpt)
    g = _genotype(fresh, "deepnorm")
    named = {}
    autoln.derive(fresh, g, deepnorm_weights=lambda site: named.setdefault(site, autoln.deepnorm_weights(fresh, site)))
    assert list(named) == list(g.sites)  # asked once per DeepNorm site
    from autoln.space.placements import deepnorm_constants

    _, b = deepnorm_constants(3)
    for i in range(3):
        f, p = fresh.transformer.h[i], plain.transformer.h[i]
        torch.testing.assert_close(f.attn.c_attn.weight[64:], b * p.attn.c_attn.weight[64:])  # the value third
        torch.testing.assert_close(f.attn.c_attn.weight[:64], p.attn.c_attn.weight[:64])      # query and key untouched
        for a, c in ((f.attn.c_proj, p.attn.c_proj), (f.mlp.c_fc, p.mlp.c_fc), (f.mlp.c_proj, p.mlp.c_proj)):
            torch.testing.assert_close(a.weight, b * c.weight)
    pre = _tiny(gpt)
    autoln.derive(pre, _genotype(pre, "pre"))  # no DeepNorm site: no weights to name
    assert torch.equal(pre.transformer.h[0].mlp.c_fc.weight, plain.transformer.h[0].mlp.c_fc.weight)


def test_derive_and_the_site_genotype_refuse_what_does_not_fit(gpt, tmp_path):
    model = _tiny(gpt)
    g = _genotype(model, "post")
    path = g.save(tmp_path / "g.json")
    assert autoln.SiteGenotype.load(path) == g
    wrong = copy.deepcopy(g)
    wrong.sites["transformer.h.9.attn_site"] = "pre"
    wrong.probabilities["transformer.h.9.attn_site"] = [1.0, 0.0, 0.0]
    with pytest.raises(GenotypeError, match="sites the model lacks"):
        autoln.derive(model, wrong)
    short = autoln.SiteGenotype(list(CANDIDATES), {"transformer.h.0.attn_site": "pre"}, {"transformer.h.0.attn_site": [1, 0, 0]})
    with pytest.raises(GenotypeError, match="have no placement in the genotype"):
        autoln.derive(model, short)
    obj = json.loads(path.read_text())
    obj["sites"]["transformer.h.0.attn_site"] = "peri"
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    with pytest.raises(GenotypeError, match=r"bad.json: field 'sites.transformer.h.0.attn_site': expected one of the candidates"):
        autoln.SiteGenotype.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="needs mixing weights"):
        model(torch.zeros(1, 4, dtype=torch.long))  # a searched site outside SearchModel
    with pytest.raises(ValueError, match="no autoln.Site with two or more candidates"):
        autoln.SearchModel(_tiny(gpt, ("pre",)))


def test_the_example_names_a_missing_data_file_as_missing(tmp_path, capsys):
    search_gpt = _example("search_gpt")
    with pytest.raises(SystemExit) as stop:
        search_gpt.main(["--data", str(tmp_path / "input.txt"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"--data {tmp_path / 'input.txt'}: no such file or folder" in err
    assert "UTF-8" not in err and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_example_searches_and_races_at_tiny_size(tmp_path, capsys):
    search_gpt = _example("search_gpt")
    args = ["--search-steps", "12", "--retrain-steps", "9", "--n-layer", "2", "--n-embd", "32",
            "--block-size", "32", "--batch-size", "4", "--out", str(tmp_path)]
    assert search_gpt.main(args) == 0
    g = autoln.SiteGenotype.load(tmp_path / "supernet_genotype.json")
    assert list(g.sites) == [f"transformer.h.{i}.{s}_site" for i in range(2) for s in ("attn", "mlp")]
    assert g.provenance["selection"] == "perturbation" and set(g.provenance["loss_rises"]) == set(g.sites)
    assert len(g.provenance["shortlist"]) == 3  # the race's pool besides the read-off and the argmax
    said = capsys.readouterr()
    answer = autoln.SiteGenotype.load(tmp_path / "genotype.json")
    record = json.loads((tmp_path / "race.json").read_text())
    assert (said.out + said.err).count(record["verdict"]["line"]) == 1  # the verdict once, not twice
    assert f"(the answer: {record['verdict']['answer']}, {answer.describe()})" in said.out
    assert answer.provenance["race"]["answer"] == record["verdict"]["answer"]
    assert "all-pre" in record["rungs"][-1]["entries"]  # the model's own placement is always a finalist
    assert {j["steps"] for j in record["jobs"]} <= {1, 3, 9}
    final = record["rungs"][-1]  # seed by seed: all 3 seeds, or fewer when the final stopped early (and the verdict says so)
    ran = {j["seed"] - record["seed"] for j in record["jobs"] if j["steps"] == 9 and j["entry"] in final["entries"]}
    assert ran == set(range(final["seeds"])) and 1 <= final["seeds"] <= 3
    assert (final["seeds"] < 3) == ("so the final stopped there" in record["verdict"]["line"])


def test_load_derived_gives_the_retrain_s_own_valid_loss(tmp_path):
    from autoln.config import load_config
    from autoln.data import eval_starts, load_corpus
    from autoln.retrain.run_retrain import run_retrain
    from autoln.engine.training import evaluate

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(ROOT / "configs" / "tiny.yaml", ["retrain.steps=6", "retrain.eval_every=3", "retrain.final_eval_windows=8",
                                                       "logging.progress=false", "logging.tensorboard=false",
                                                       f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"])
    result = run_retrain(cfg, "mix-ln", tmp_path / "run")
    model = autoln.load_derived(tmp_path / "run")
    assert isinstance(model, torch.nn.Module) and not model.training
    valid = load_corpus(cfg.data).splits["valid"]
    loss = evaluate(model, valid, eval_starts(len(valid), cfg.model.context, 8), cfg.model.context, cfg.retrain.batch_size,
                    torch.device("cpu"))
    assert loss == result.valid["loss"]
    # one protocol for the valid split: the curve's last point is the final number, with its
    # standard error over windows beside it (std of the per-window losses / sqrt(windows))
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["history"][-1] == {"step": 6, **m["valid"]} and m["valid"]["windows"] == 8
    starts = eval_starts(len(valid), cfg.model.context, 8)
    per_window = [evaluate(model, valid, starts[i:i + 1], cfg.model.context, 1, torch.device("cpu")) for i in range(8)]
    se = float(torch.tensor(per_window, dtype=torch.float64).std() / 8 ** 0.5)
    assert m["valid"]["loss_stderr"] == pytest.approx(se, rel=1e-4)
    assert m["valid"]["bits_per_byte_stderr"] == pytest.approx(se / math.log(2), rel=1e-4)
    with pytest.raises(OutputError, match="no finished retrain"):
        autoln.load_derived(tmp_path)
