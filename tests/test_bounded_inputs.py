"""A user's file fields reach a run's outputs and error messages bounded (issue 36).

The genotype's free-form ``provenance`` is copied into a retrain's ``metrics.json`` and
``checkpoint.pt`` (and a comparison's reused runs, a consensus genotype) at most
``PROVENANCE_LIMIT`` characters, saying what was cut; config strings and the resolved config are
bounded on read (every run copies its config); every error quotes a file's value bounded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoln import cli
from autoln.config import ModelConfig, load_config
from autoln.core.errors import ConfigError, GenotypeError
from autoln.models.genotype import Genotype, baseline

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
TEN_MB = 10 * 2**20  # 10,485,760 characters
ONE_MB = 2**20  # 1,048,576 characters: for YAML, which PyYAML reads at about 1 MB/s
TINY_MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_ff=128, context=32)  # configs/tiny.yaml's


def genotype_dict(**provenance) -> dict:
    """tiny.yaml's all-pre genotype (bytes: vocabulary 256) with ``provenance``."""
    g = baseline("all-pre", TINY_MODEL, 256)
    g.provenance = provenance
    return g.to_dict()


def write_genotype(path: Path, obj: dict) -> str:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    text = tmp_path_factory.mktemp("corpus") / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    return text


def short_retrain(genotype: str, corpus: Path, out: Path, cache: Path) -> int:
    return cli.retrain_main(["--genotype", genotype, "--config", TINY, "--out", str(out),
                             "--set", f"data.corpus={corpus}", "--set", f"data.cache_dir={cache}",
                             "--set", "retrain.steps=2", "--set", "retrain.warmup_steps=0", "--set", "retrain.eval_every=1",
                             "--set", "retrain.eval_windows=2", "--set", "retrain.final_eval_windows=2",
                             "--set", "logging.tensorboard=false", "--set", "logging.progress=false"])


# --- the reported case: a 10 MB provenance and a retrain's outputs -------------------------------


def test_a_10_mb_provenance_leaves_metrics_and_checkpoint_small_and_says_what_was_cut(tmp_path, corpus, capsys):
    """The bug report: a genotype whose provenance holds 10 MB made metrics.json 10.5 MB and
    checkpoint.pt 10 MB larger. Now each grows by less than 100 KB over the same retrain of a
    genotype with a small provenance; the copy keeps the small fields and the note's first 4,096
    characters, and says (in provenance_cut and on stderr) what was cut."""
    from autoln.api import load_derived

    small = write_genotype(tmp_path / "small.json", genotype_dict(data={"corpus": "x"}))
    big = write_genotype(tmp_path / "big.json", genotype_dict(note="n" * TEN_MB, data={"corpus": "x"}))
    assert short_retrain(small, corpus, tmp_path / "r_small", tmp_path / "cache") == 0
    capsys.readouterr()
    assert short_retrain(big, corpus, tmp_path / "r_big", tmp_path / "cache") == 0
    err = capsys.readouterr().err
    for name in ("metrics.json", "checkpoint.pt"):
        added = (tmp_path / "r_big" / name).stat().st_size - (tmp_path / "r_small" / name).stat().st_size
        assert 0 < added < 100_000, (name, added)
    copied = json.loads((tmp_path / "r_big" / "metrics.json").read_text())["genotype_file"]["provenance"]
    assert copied["note"] == "n" * 4096 and copied["data"] == {"corpus": "x"}
    assert copied["provenance_cut"] == (
        f"the provenance of {big} is 10,485,811 characters of JSON, more than the 65,536 a copy keeps: "
        f"field 'note' (10,485,760 characters) cut to its first 4,096; the whole provenance is in {big}")
    notes = [line for line in err.splitlines() if line.startswith(f"note: {big}: field 'provenance'")]
    assert len(notes) == 1 and "10,485,811 characters of JSON" in notes[0] and "cut to its first 4,096" in notes[0]
    assert len(notes[0]) < 600
    # the checkpoint's copy is still a valid genotype: the finished run loads
    assert len(load_derived(tmp_path / "r_big").blocks) == 2
    assert json.loads(Path(big).read_text())["provenance"]["note"] == "n" * TEN_MB  # the file itself is untouched


# --- bounded_provenance: the other shapes of a large provenance ---------------------------------


def test_a_small_provenance_is_copied_whole_and_unchanged():
    from autoln.models.genotype import bounded_provenance

    prov = {"config": {"a": 1}, "data": {"fingerprint_sha256": "f" * 64}}
    kept, note = bounded_provenance(prov, "g.json")
    assert kept is prov and note is None


def test_many_small_extra_keys_are_cut_to_the_limit_and_counted():
    from autoln.models.genotype import PROVENANCE_LIMIT, bounded_provenance

    prov = {"data": {"corpus": "c"}, **{f"k{i}": i for i in range(100_000)}}
    kept, note = bounded_provenance(prov, "g.json")
    assert len(json.dumps(kept, indent=2)) <= PROVENANCE_LIMIT
    assert kept["data"] == {"corpus": "c"} and "k0" in kept and "k99999" not in kept
    left = 100_001 - (len(kept) - 1)  # provenance_cut aside
    assert f"{left - 5:,} more fields" in kept["provenance_cut"] and kept["provenance_cut"].count("field 'k") == 5
    assert note.startswith("g.json: field 'provenance' is ") and len(note) < 600


def test_a_huge_field_name_and_a_huge_object_are_left_out_with_bounded_names():
    from autoln.models.genotype import bounded_provenance

    prov = {"k" * TEN_MB: 1, "config": {"x": "y" * 100_000}, "seed": 3}
    kept, note = bounded_provenance(prov, "g.json")
    assert set(kept) == {"seed", "provenance_cut"}
    assert "(10,485,760 characters)" in kept["provenance_cut"] and "field 'config' (100," in kept["provenance_cut"]
    assert len(kept["provenance_cut"]) < 1000 and len(note) < 600


def test_a_comparison_reusing_a_run_copies_the_genotype_bounded(tmp_path):
    """compare.reuse_same_placements writes the entry's own genotype into the reused record."""
    from autoln.retrain.compare import Entry, reuse_same_placements

    big = write_genotype(tmp_path / "big.json", genotype_dict(note="n" * TEN_MB))
    source = tmp_path / "cmp" / "all-pre" / "seed0" / "metrics.json"
    source.parent.mkdir(parents=True)
    source.write_text(json.dumps({"placements": "pre pre", "valid": {"loss": 1.0}, "test": {"loss": 1.0}}))
    run_dir = tmp_path / "cmp" / "big" / "seed0"
    run_dir.mkdir(parents=True)
    reuse_same_placements(source, Entry("big", big), run_dir)
    assert (run_dir / "metrics.json").stat().st_size < 20_000
    record = json.loads((run_dir / "metrics.json").read_text())
    assert "field 'note' (10,485,760 characters) cut to its first 4,096" in record["genotype_file"]["provenance"]["provenance_cut"]


def test_a_consensus_copies_the_first_seeds_provenance_bounded(tmp_path):
    from autoln.oneshot.consensus import consensus_genotype, vote

    g = Genotype.from_dict(genotype_dict(config={"huge": "c" * TEN_MB}, data={"corpus": "x"}, packages={"torch": "2"}))
    c = vote([g, g])
    out = consensus_genotype(c, [g, g], [0, 1], [tmp_path / "seed0", tmp_path / "seed1"])
    assert out.provenance["config"] is None and out.provenance["data"] == {"corpus": "x"}
    assert len(json.dumps(out.to_dict())) < 20_000


# --- genotype files: error messages quote values bounded ---------------------------------------


def _with(**changes) -> dict:
    obj = genotype_dict()
    for key, value in changes.items():
        if key.startswith("model_"):
            obj["model"][key[6:]] = value
        else:
            obj[key] = value
    return obj


HUGE = "z" * TEN_MB
GENOTYPE_CASES = {
    "a huge placement name": (_with(placements=[HUGE, "pre"]), "placements[0]"),
    "a huge unknown field name": ({**genotype_dict(), HUGE: 1}, "unknown field"),
    "a huge unknown model key": (_with(**{"model_" + HUGE: 1}), "unknown field"),
    "a huge format": (_with(format=HUGE), "format"),
    "a huge candidate": (_with(candidates=[HUGE]), "unknown candidate"),
    "a million duplicate candidates": (_with(candidates=["pre"] * 1_000_000), "duplicate names in"),
    "a huge granularity": (_with(granularity=HUGE), "granularity"),
    "a huge norm": (_with(model_norm=HUGE), "model.norm"),
    "a huge affine": (_with(model_affine=HUGE), "model.affine"),
    "a huge d_model": (_with(model_d_model=HUGE), "model.d_model"),
}


@pytest.mark.parametrize("case", sorted(GENOTYPE_CASES))
def test_a_genotype_error_quotes_a_huge_value_bounded(case):
    obj, field = GENOTYPE_CASES[case]
    with pytest.raises(GenotypeError) as info:
        Genotype.from_dict(obj, source="g.json")
    message = str(info.value)
    assert message.startswith("g.json: field '" if case != "a huge format" else "g.json: not an autoln genotype (field 'format'")
    assert field in message and len(message) < 1000 and ("characters)" in message or "items)" in message)


def test_a_genotype_file_with_a_huge_placement_is_one_short_error_line(tmp_path, corpus, capsys):
    path = write_genotype(tmp_path / "g.json", _with(placements=[HUGE, "pre"]))
    assert cli.retrain_main(["--genotype", path, "--config", TINY, "--out", str(tmp_path / "r"), "--set", f"data.corpus={corpus}",
                             "--set", f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 1000
    assert err.startswith(f"error: {path}: field 'placements[0]': expected one of the candidates ['pre'], got 'zzz")
    assert "... (10,485,760 characters)" in err and not (tmp_path / "r" / "metrics.json").exists()


def test_a_genotype_integer_beyond_pythons_digit_limit_is_a_genotype_error(tmp_path):
    text = json.dumps(genotype_dict()).replace('"n_layers": 2', '"n_layers": ' + "9" * 5000)
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(GenotypeError, match=r"is not valid JSON: Exceeds the limit \(4300 digits\)") as info:
        Genotype.load(path)
    assert len(str(info.value)) < 500


# --- site genotypes (autoln.api) ---------------------------------------------------------------


def test_a_site_genotype_error_quotes_a_huge_value_bounded():
    from autoln.api import SITE_FORMAT, SiteGenotype

    base = {"format": SITE_FORMAT, "version": 1, "candidates": ["pre", "post"], "sites": {"b0": "pre"},
            "probabilities": {"b0": [0.5, 0.5]}}
    cases = [({**base, "candidates": [HUGE]}, "field 'candidates'"),
             ({**base, "sites": {"b0": HUGE}}, "field 'sites.b0'"),
             ({**base, "sites": {HUGE: "deepnorm"}, "probabilities": {HUGE: [0.5, 0.5]}}, "field 'sites.zzz"),
             ({**base, "sites": {HUGE: "pre"}, "probabilities": {HUGE: [0.5] * 1_000_000}}, "field 'probabilities.zzz")]
    for obj, field in cases:
        with pytest.raises(GenotypeError) as info:
            SiteGenotype.from_dict(obj, source="s.json")
        message = str(info.value)
        assert message.startswith("s.json: ") and field in message and len(message) < 1000, message[:300]
    assert SiteGenotype.from_dict(base).sites == {"b0": "pre"}


# --- configs: strings bounded on read, the resolved config bounded, errors bounded --------------


def test_a_config_string_of_1_mb_is_refused_on_read_before_any_run_folder(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  corpus: {'x' * ONE_MB}\n")
    assert cli.retrain_main(["--genotype", "all-pre", "--config", str(config), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 500
    assert err.startswith(f"error: 'data.corpus' ({config}) is 'xxxx") and "... (1,048,576 characters): a string of at most " \
        "4,096 characters is expected (a path, a URL or a name)" in err
    assert not (tmp_path / "r").exists()


def test_a_config_string_at_the_limit_is_accepted(tmp_path):
    from autoln.config import MAX_STRING

    cfg = load_config(None, [f"data.cache_dir={'d' * MAX_STRING}"])
    assert len(cfg.data.cache_dir) == MAX_STRING


def test_a_huge_tune_space_list_is_refused_naming_the_key(tmp_path):
    config = tmp_path / "c.yaml"
    choices = ", ".join(str(i) for i in range(20_000))
    config.write_text(f"tune:\n  space:\n    search.order: {{categorical: [{choices}]}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    message = str(info.value)
    assert message.startswith(f"the config ({config}) is ") and "more than the 65,536 a run copies into its outputs" in message
    assert "the largest key is tune.space" in message and len(message) < 400


@pytest.mark.parametrize("setting, key", [
    (f"model.norm={'z' * ONE_MB}", "'model.norm' (--set) is 'zzz"),
    (f"model.norm={'z' * 4000}", "model.norm must be one of ['layernorm', 'rmsnorm', 'dyt'], got 'zzz"),
    (f"model.d_model={'z' * ONE_MB}", "'model.d_model' (--set) must be an integer"),
    (f"model.{'z' * ONE_MB}=1", "unknown key 'model.zzz"),
    (f"{'z' * ONE_MB}.x=1", "unknown section 'zzz"),
    (f"model.candidates=[{', '.join(['pre'] * 20_000)}]", "model.candidates has duplicates"),
    (f"tune.storage={'s' * 4000}", "tune.storage must be null"),
])
def test_a_config_error_quotes_a_huge_value_bounded(setting, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [setting])
    message = str(info.value)
    assert key in message and len(message) < 1000, message[:300]


def test_a_config_integer_beyond_pythons_digit_limit_is_a_config_error(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  d_model: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML: Exceeds the limit \(4300 digits\)"):
        load_config(config)
    with pytest.raises(ConfigError, match=r"'model.d_model' \(--set\) must be an integer, got '9999"):
        load_config(None, ["model.d_model=" + "9" * 5000])


def test_quoted_is_repr_for_short_values_and_bounded_for_long_ones():
    from autoln.core.errors import quoted

    assert [quoted(v) for v in ("sandwich", ["pre", "post"], {"a": 1}, 3, None)] == \
        ["'sandwich'", "['pre', 'post']", "{'a': 1}", "3", "None"]
    assert quoted("x" * TEN_MB) == repr("x" * 240) + "... (10,485,760 characters)"
    assert quoted(list(range(1_000_000))).endswith(", ...] (1,000,000 items)") and len(quoted(list(range(1_000_000)))) < 300
