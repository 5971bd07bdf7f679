"""Config loading: defaults, files, --set overrides, errors naming the key."""

from pathlib import Path

import pytest

from autoln.config import Config, load_config
from autoln.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_shipped_default_configs_equal_builtin_defaults():
    defaults = Config()
    for name in ("search.yaml", "retrain.yaml"):
        assert load_config(CONFIGS / name) == defaults, name
    tune = load_config(CONFIGS / "tune.yaml")  # spells out the tune section, shortens the searches
    assert tune.tune == defaults.tune and tune.search.steps == 200 and tune.model == defaults.model


@pytest.mark.parametrize("name", ["tiny.yaml", "gpu.yaml", "search.yaml", "retrain.yaml", "tune.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.model.d_model % cfg.model.n_heads == 0


def test_overrides_and_types(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("search:\n  arch_lr: 3e-4\n  steps: 7\nmodel:\n  candidates: [pre, post]\n")
    cfg = load_config(f, ["search.steps=9", "search.arch_warmup_steps=2", "model.granularity=sublayer", "search.betas=[0.8, 0.9]", "data.cache_dir=null"])
    assert cfg.search.steps == 9 and cfg.search.arch_lr == 3e-4
    assert cfg.model.candidates == ["pre", "post"] and cfg.model.granularity == "sublayer"
    assert cfg.search.betas == (0.8, 0.9) and cfg.data.cache_dir is None
    assert load_config(None, []).to_dict() == Config().to_dict()
    assert "granularity: sublayer" in cfg.to_yaml()


@pytest.mark.parametrize("overrides, key", [
    (["model.widht=3"], "model.widht"),
    (["modle.d_model=3"], "modle"),
    (["search.steps=ten"], "search.steps"),
    (["search.steps=2.5"], "search.steps"),
    (["logging.progress=3"], "logging.progress"),
    (["model.d_model=0"], "model.d_model"),
    (["model.n_heads=5"], "model.d_model"),
    (["model.candidates=[pre, sandwichx]"], "model.candidates"),
    (["data.tokenizer=bpe"], "data.tokenizer"),
    (["search.lr=-1"], "search.lr"),
    (["search.steps"], "section.key=value"),
    (["data.arch_fraction=1.0"], "data.arch_fraction"),
    (["search.seed=-5"], "search.seed"),
    (["retrain.seed=99999999999999999999"], "retrain.seed"),
    (["search.betas=[0.9]"], "search.betas' .* must be a list of 2 numbers"),
    (["model.candidates=pre"], "model.candidates' .* must be a list of strings"),
])
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace("search.betas'", r"search\.betas'").replace("model.candidates'", r"model\.candidates'")):
        load_config(None, overrides)


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  layers: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert "model.layers" in str(err.value) and str(f) in str(err.value)
    f.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(f)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    f.write_bytes(b"\xff\xfemodel: 1")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(f)
    f.write_text("model:\n  n_layers: 2\n d_model: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert "not valid YAML at line 3" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, message", [
    # alphas frozen for the whole search: the genotype would be their random start
    (["search.steps=100", "search.arch_warmup_steps=100"], r"search.arch_warmup_steps \(100\) must be below search.steps \(100\)"),
    (["search.steps=50"], r"search.arch_warmup_steps \(100\) must be below search.steps \(50\)"),
    # Fair DARTS' zero-one loss acts on sigmoid(alpha): only sigmoid mixing uses those weights
    (["search.zero_one_weight=10"], r"search.zero_one_weight \(10.0\) needs search.mixing=sigmoid"),
    # R-DARTS needs 7 evaluations, 5 of them from 40 % of the steps on: 500 steps, every 100 -> 5 evaluations
    (["search.early_stop=hessian"], r"search.early_stop=hessian cannot stop with search.steps=500 and search.eval_every=100"),
])
def test_settings_that_cannot_do_what_they_say_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_settings_at_the_edge_of_those_rules_are_accepted():
    assert load_config(None, ["search.steps=101"]).search.arch_warmup_steps == 100
    load_config(None, ["search.zero_one_weight=10", "search.mixing=sigmoid", "search.tau_end=1.0"])
    # 500 steps every 50: 10 evaluations, 7 from step 200 on
    load_config(None, ["search.early_stop=hessian", "search.eval_every=50"])


def test_r_darts_needs_in_the_config_match_the_monitor():
    from autoln import config, monitor

    assert config.R_DARTS_MIN_EVALUATIONS == monitor.WINDOW + monitor.DELTA
    assert (config.R_DARTS_LAG, config.R_DARTS_START_FRACTION) == (monitor.LAG, monitor.START_FRACTION)


def test_configs_recorded_before_a_key_existed_compare_equal():
    from autoln.checkpoint import config_differences
    from autoln.config import with_defaults

    old = Config().to_dict()
    del old["model"]["affine"]  # a checkpoint or provenance written before model.affine existed
    assert config_differences(with_defaults(old), Config().to_dict()) == []
    assert with_defaults(old)["model"]["affine"] == "learnable"
    changed = {**old, "model": {**old["model"], "d_model": 64}}
    assert config_differences(with_defaults(changed), Config().to_dict()) == ["model.d_model (checkpoint 64, now 96)"]


@pytest.mark.parametrize("overrides, message", [
    (["model.candidates=[pre, none:fixed]"], "model.candidates"),
    (["model.affine=frozen"], "model.affine"),
    (["model.norm=batchnorm"], "model.norm"),
])
def test_new_search_space_keys_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
