"""Genotype JSON: round trip, validation naming the field, baselines (docs/design.md §6)."""

import copy
import json

import numpy as np
import pytest

from autoln.config import ModelConfig
from autoln.core.errors import GenotypeError
from autoln.models.genotype import Genotype, baseline, from_probabilities


@pytest.fixture
def layer_genotype():
    cfg = ModelConfig(n_layers=3, d_model=16, n_heads=2, d_ff=32, context=8)
    probs = np.array([[0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])
    return from_probabilities(probs, cfg, 256, {"seed": 0})


def test_argmax_and_round_trip(tmp_path, layer_genotype):
    assert layer_genotype.placements == ["post", "pre", "deepnorm"]
    path = layer_genotype.save(tmp_path / "g.json")
    loaded = Genotype.load(path)
    assert loaded == layer_genotype
    assert loaded.block_placements() == [("post", "post"), ("pre", "pre"), ("deepnorm", "deepnorm")]
    assert json.loads(path.read_text())["format"] == "autoln.genotype"


def test_sublayer_round_trip(tmp_path):
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8, granularity="sublayer")
    probs = np.array([[0.9, 0.05, 0.05], [0.1, 0.1, 0.8], [0.2, 0.5, 0.3], [0.4, 0.3, 0.3]])
    g = from_probabilities(probs, cfg, 256)
    assert g.placements == [{"attn": "pre", "ffn": "deepnorm"}, {"attn": "post", "ffn": "pre"}]
    assert g.probabilities[1]["attn"] == pytest.approx([0.2, 0.5, 0.3])
    assert Genotype.load(g.save(tmp_path / "s.json")) == g
    assert g.block_placements() == [("pre", "deepnorm"), ("post", "pre")]


def _mutate(obj, path, value):
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value


@pytest.mark.parametrize("path, value, field", [
    (["placements", 1], "sandwich-xyz", "placements[1]"),
    (["candidates", 2], "bogus", "candidates"),
    (["placements"], ["pre", "pre"], "placements"),
    (["probabilities"], [[1, 0, 0]] * 4, "probabilities"),
    (["version"], 2, "version"),
    (["format"], "darts.genotype", "format"),
    (["probabilities", 0], [0.5, 0.4, 0.05], "probabilities[0]"),
    (["probabilities", 2], [1.2, -0.1, -0.1], "probabilities[2]"),
    (["probabilities", 2], [float("nan"), 0.5, 0.5], "probabilities[2]"),
    (["granularity"], "cell", "granularity"),
    (["model", "n_layers"], 4, "placements"),
    (["model", "d_model"], "16", "model.d_model"),
    (["model", "norm"], "batchnorm", "model.norm"),
    (["model", "norm"], ["layernorm"], "model.norm"),
    (["model", "vocab_size"], KeyError, "model.vocab_size"),
    (["provenance"], KeyError, "provenance"),
    (["placements"], KeyError, "placements"),
    (["extra"], 1, "extra"),
])
def test_malformed_genotype_names_the_field(tmp_path, layer_genotype, path, value, field):
    obj = copy.deepcopy(layer_genotype.to_dict())
    _mutate(obj, path, value)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(obj))
    with pytest.raises(GenotypeError) as err:
        Genotype.load(f)
    assert f"field '{field}'" in str(err.value) and str(f) in str(err.value)


@pytest.mark.parametrize("obj, what", [({"name": "resnet50", "layers": [1, 2]}, "no field 'format'"),
                                       ({"format": "darts.genotype", "normal": []}, "field 'format' is 'darts.genotype'")])
def test_another_tool_s_json_is_not_an_autoln_genotype(tmp_path, obj, what):
    f = tmp_path / "other.json"
    f.write_text(json.dumps(obj))
    with pytest.raises(GenotypeError) as err:
        Genotype.load(f)
    assert str(err.value) == (f"{f}: not an autoln genotype ({what}; expected format 'autoln.genotype', the genotype.json that "
                              "search.py writes, with fields ['format', 'version', 'candidates', 'granularity', 'placements', "
                              "'probabilities', 'model', 'provenance'])")


def test_not_json_and_not_an_object(tmp_path):
    f = tmp_path / "g.json"
    f.write_text('{"format": "autoln.genotype", "version": 1, ')
    with pytest.raises(GenotypeError, match="not valid JSON"):
        Genotype.load(f)
    f.write_text("[1, 2]")
    with pytest.raises(GenotypeError, match="expected a JSON object"):
        Genotype.load(f)
    with pytest.raises(GenotypeError, match="cannot read"):
        Genotype.load(tmp_path / "missing.json")


@pytest.mark.parametrize("n, n_post", [(4, 1), (6, 2), (12, 3), (2, 1), (1, 0)])
def test_mix_ln_baseline(n, n_post):
    g = baseline("mix-ln", ModelConfig(n_layers=n), 256)
    assert g.placements == ["post"] * n_post + ["pre"] * (n - n_post)
    assert g.candidates == sorted(set(g.placements), key=["pre", "post", "deepnorm"].index)
    Genotype.from_dict(g.to_dict())


@pytest.mark.parametrize("n, n_pre", [(6, 3), (12, 6), (5, 3), (2, 1), (1, 1)])
def test_pre_post_baseline(n, n_pre):
    """Pre-LN in the lower half (halves round up), Post-LN in the upper: mix-ln's opposite order."""
    g = baseline("pre-post", ModelConfig(n_layers=n), 256)
    assert g.placements == ["pre"] * n_pre + ["post"] * (n - n_pre)
    assert g.provenance == {"baseline": "pre-post"}
    Genotype.from_dict(g.to_dict())


def test_uniform_baselines_and_unknown_name():
    cfg = ModelConfig(n_layers=3)
    for name in ("pre", "post", "deepnorm"):
        g = baseline(f"all-{name}", cfg, 256)
        assert g.placements == [name] * 3 and g.probabilities == [[1.0]] * 3
    with pytest.raises(GenotypeError, match="unknown baseline"):
        baseline("all-sandwich", cfg, 256)


def test_baselines_of_every_candidate_and_gain_form():
    from autoln.config import ModelConfig
    from autoln.models.genotype import BASELINES, baseline, is_baseline

    assert {"all-peri", "all-outnorm", "all-lns", "all-none"} <= set(BASELINES)
    cfg = ModelConfig(n_layers=4)
    assert baseline("all-peri", cfg, 256).describe() == "peri peri peri peri"
    g = baseline("all-pre:fixed", cfg, 256)
    assert g.candidates == ["pre:fixed"] and g.describe() == "pre:fixed pre:fixed pre:fixed pre:fixed"
    assert is_baseline("all-lns:fixed") and not is_baseline("all-none:fixed") and not is_baseline("all-sandwich")


def test_a_hand_edited_genotype_with_a_key_twice_is_refused_naming_the_key(tmp_path):
    """A second ``"placements"`` pasted above the original: refused in one line, never read with
    the last one winning (both genotype formats, and every JSON record a run reads back)."""
    import json

    import pytest

    from autoln.api.site_genotype import SiteGenotype
    from autoln.core.errors import GenotypeError, OutputError
    from autoln.core.io import DuplicateKey, loads_strict, read_json
    from autoln.models.genotype import Genotype, baseline
    from autoln.config import ModelConfig

    g = baseline("all-pre", ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, context=8), 11)
    path = g.save(tmp_path / "g.json")
    text = path.read_text()
    assert text.count('"placements": [') == 1
    doubled = text.replace('"placements": [', '"placements": ["post", "post"],\n  "placements": [', 1)
    path.write_text(doubled)
    with pytest.raises(GenotypeError, match=r"g\.json: the key 'placements' appears twice in one object"):
        Genotype.load(path)
    site = tmp_path / "s.json"
    site.write_text('{"format": "autoln.site-genotype", "version": 1, "candidates": ["pre"], "sites": {"a": "pre"}, '
                    '"sites": {"a": "pre"}, "probabilities": {}, "provenance": {}}')
    with pytest.raises(GenotypeError, match="the key 'sites' appears twice"):
        SiteGenotype.load(site)
    race = tmp_path / "race.json"
    race.write_text('{"verdict": {"answer": "all-pre", "answer": "top1"}}')
    with pytest.raises(OutputError, match=r"race\.json: the key 'answer' appears twice"):
        read_json(race)
    assert read_json(tmp_path / "missing.json") is None and loads_strict('{"a": {"b": 1}, "b": 2}') == {"a": {"b": 1}, "b": 2}
    with pytest.raises(DuplicateKey):
        loads_strict(json.dumps({"a": 1})[:-1] + ', "a": 2}')
