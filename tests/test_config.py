"""Config loading: defaults, files, --set overrides, errors naming the key."""

from pathlib import Path

import pytest

from autoln.config import Config, load_config
from autoln.core.errors import ConfigError

from .conftest import ROOT

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
    (["data.tokenizer=bpe2"], "data.tokenizer"),
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
    # Fair DARTS' zero-one loss acts on sigmoid(alpha): only sigmoid mixing uses those weights
    (["search.zero_one_weight=10"], r"search.zero_one_weight \(10.0\) needs search.mixing=sigmoid"),
    # R-DARTS needs 7 evaluations, 5 of them from 40 % of the steps on: 500 steps, every 100 -> 5 evaluations
    (["search.early_stop=hessian", "search.eval_every=100"], r"search.early_stop=hessian cannot stop with search.steps=500 and search.eval_every=100"),
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
    from autoln import config
    from autoln.oneshot import monitor

    assert config.R_DARTS_MIN_EVALUATIONS == monitor.WINDOW + monitor.DELTA
    assert (config.R_DARTS_LAG, config.R_DARTS_START_FRACTION) == (monitor.LAG, monitor.START_FRACTION)


def test_configs_recorded_before_a_key_existed_compare_equal():
    from autoln.engine.checkpoint import config_differences
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


# --- a documented option works with every other key at its default; what the user set and
# --- cannot act is refused; nothing is silently left out


@pytest.mark.parametrize("sets, check", [
    # sigmoid has no temperature: the default 1.0 -> 0.1 annealing is dropped, not refused
    (["search.mixing=sigmoid"], lambda c: c.search.tau_start == c.search.tau_end == 1.0),
    # a short search: the default warm-ups (50 weights, 100 alphas) fit the run
    (["search.steps=50"], lambda c: (c.search.warmup_steps, c.search.arch_warmup_steps) == (5, 10)),
    (["retrain.steps=30"], lambda c: c.retrain.warmup_steps == 3),
    # R-DARTS' early stop needs 7 evaluations; the default eval_every gives 5
    (["search.early_stop=hessian"], lambda c: c.search.eval_every == 25),
])
def test_an_option_alone_works_with_the_defaults(sets, check, capsys):
    assert check(load_config(None, sets))
    err = capsys.readouterr().err
    assert ("note:" in err) == (sets[0] != "search.mixing=sigmoid")


def test_a_file_s_values_equal_to_the_defaults_count_as_defaults(tmp_path):
    """A run's own config.yaml lists every key, its defaults too: reusing it with one new option
    works as that option alone would."""
    f = tmp_path / "config.yaml"
    f.write_text(Config().to_yaml())
    cfg = load_config(f, ["search.mixing=sigmoid", "search.steps=50"])
    assert cfg.search.tau_end == cfg.search.tau_start and cfg.search.arch_warmup_steps == 10


@pytest.mark.parametrize("path, sets, message", [
    (ROOT / "configs" / "tiny.yaml", ["retrain.steps=1"], "retrain.warmup_steps (5) must be below retrain.steps (1)"),
    (None, ["search.warmup_steps=80", "search.steps=60", "search.arch_warmup_steps=10"], "search.warmup_steps (80) must be below"),
    (None, ["search.mixing=sigmoid", "search.tau_end=0.5"], "sigmoid mixing has no temperature"),
    (None, ["search.selection=argmax", "search.selection_windows=8"], "search.selection_windows (--set) does nothing with search.selection=argmax"),
    (None, ["search.selection=score", "search.selection_tune_steps=5"], "search.selection_tune_steps (--set) does nothing"),
])
def test_what_the_user_set_and_cannot_act_is_refused(path, sets, message):
    with pytest.raises(ConfigError) as err:
        load_config(path, sets)
    assert message in str(err.value)


def test_fixed_affine_fixes_every_norm_of_a_named_baseline():
    """``model.affine=fixed`` is applied to named baselines: every site's norms and the final
    norm have no gain or bias, the genotype says ``:fixed``; ``none`` stays ``none``."""
    from autoln.models.genotype import baseline
    from autoln.models.model import build_derived

    mc = load_config(None, ["model.affine=fixed", "model.n_layers=4"]).model
    for name in ("all-pre", "mix-ln", "all-deepnorm", "all-peri", "all-none"):
        g = baseline(name, mc, 256)
        assert all(p.endswith(":fixed") or p == "none" for p in g.placements), g.placements
        model = build_derived(g.model_config(mc), 256, g.block_placements())
        assert not [n for n, _ in model.named_parameters() if "norm" in n], name
    assert baseline("mix-ln", mc, 256).describe() == "post:fixed pre:fixed pre:fixed pre:fixed"


def test_an_unknown_key_suggests_the_nearest_one():
    with pytest.raises(ConfigError, match=r"unknown key 'search.step' \(--set\); did you mean 'search.steps'\?"):
        load_config(None, ["search.step=10"])
    with pytest.raises(ConfigError, match=r"unknown section 'serch' \(--set\); did you mean 'search'\?"):
        load_config(None, ["serch.steps=10"])


# --- YAML numbers as a user's other tools read them (issue 45, kind 5) ---------------------------


def test_numbers_without_a_dot_read_as_numbers_in_every_section_and_list(tmp_path):
    from autoln.config import space_values

    path = tmp_path / "c.yaml"
    path.write_text("search:\n  lr: 1e-3\n  arch_lr: 3E-4\n  steps: 1e3\n  betas: [9e-1, 95e-2]\nretrain:\n  lr: .5e-2\n"
                    "tune:\n  space:\n    search.lr: {log-uniform: [1e-4, 3e-2]}\n    search.arch_warmup_steps: {int: [1e1, 1e2], step: 1e1}\n",
                    encoding="utf-8")
    cfg = load_config(path)
    assert (cfg.search.lr, cfg.search.arch_lr, cfg.search.steps, cfg.search.betas, cfg.retrain.lr) == \
        (1e-3, 3e-4, 1000, (0.9, 0.95), 0.005)
    assert isinstance(cfg.search.steps, int)
    assert space_values("search.lr", cfg.tune.space["search.lr"], cfg) == [1e-4, 3e-2]
    assert space_values("search.arch_warmup_steps", cfg.tune.space["search.arch_warmup_steps"], cfg) == [10, 100]
    assert all(type(v) is int for v in space_values("search.arch_warmup_steps", cfg.tune.space["search.arch_warmup_steps"], cfg))
    over = load_config(None, ["tune.space={search.lr: {log-uniform: [1e-4, 3e-2]}}", "tune.pruner=none", "search.lr=2E-4",
                              "search.betas=[5e-1, 999e-3]"])
    assert space_values("search.lr", over.tune.space["search.lr"], over) == [1e-4, 3e-2]
    assert (over.search.lr, over.search.betas) == (2e-4, (0.5, 0.999))


def test_yaml_12_numbers_leave_pyyaml_alone_and_refuse_what_is_no_number():
    import yaml

    from autoln.config import read_yaml

    assert read_yaml("[1e-4, 1_000, .inf, 1.5, e5, 1e, 1.2.3]") == [1e-4, 1000, float("inf"), 1.5, "e5", "1e", "1.2.3"]
    assert yaml.safe_load("1e-4") == "1e-4"  # PyYAML's own loader unchanged for other code
    with pytest.raises(ConfigError, match=r"'search.steps' \(--set\) must be an integer, got 1.5"):
        load_config(None, ["search.steps=1.5"])


def test_a_merge_key_is_read_as_yaml_reads_it_and_duplicates_are_still_refused(tmp_path):
    """``retrain: {<<: *opt, steps: 20}`` (omegaconf#470): the anchor's keys merged, the
    mapping's own keys winning, as ``yaml.safe_load`` reads it; a key twice still refused."""
    import pytest
    import yaml

    from autoln.config import load_config
    from autoln.core.errors import ConfigError

    text = "search: &opt\n  lr: 0.003\n  batch_size: 4\nretrain:\n  <<: *opt\n  steps: 20\n  batch_size: 6\n"
    assert yaml.safe_load(text)["retrain"] == {"lr": 0.003, "batch_size": 6, "steps": 20}
    path = tmp_path / "merge.yaml"
    path.write_text(text)
    cfg = load_config(str(path), [])
    assert (cfg.retrain.lr, cfg.retrain.batch_size, cfg.retrain.steps) == (0.003, 6, 20) and cfg.search.batch_size == 4
    path.write_text("retrain:\n  <<: {lr: 0.003}\n  steps: 20\n  steps: 30\n")
    with pytest.raises(ConfigError, match="duplicate key"):
        load_config(str(path), [])
