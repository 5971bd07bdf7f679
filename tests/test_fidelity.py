"""The search judged against its space: sampling, one-hot scoring by the supernet, Kendall's tau,
and the ground-truth and random-search commands on the tiny config."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from autoln.config import ModelConfig
from autoln.data import eval_starts
from autoln.oneshot.fidelity import kendall_tau, one_hot_mixing, sample_genotypes, score_genotypes
from autoln.models.model import build_derived
from autoln.models.supernet import Supernet
from autoln.engine.training import evaluate

from .conftest import ROOT, experiment_script

VOCAB = 23


def test_kendall_tau_on_hand_counted_pairs():
    # one discordant pair of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6, abs=1e-12)
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0, abs=1e-12)
    # a tie in x: C = 5, D = 0, one pair tied in x only: tau-b = 5 / sqrt(6 * 5)
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30), abs=1e-12)


@pytest.mark.parametrize("x, y, match", [
    ([1, 2, 3], [1, 2], "one length"),
    ([1], [1], "two pairs"),
    ([1, 2, float("nan")], [1, 2, 3], "finite"),
    ([1, 1, 1], [1, 2, 3], "constant"),
])
def test_kendall_tau_refuses_what_it_cannot_rank(x, y, match):
    with pytest.raises(ValueError, match=match):
        kendall_tau(x, y)


def test_sample_is_distinct_reproducible_and_grows_as_a_prefix():
    cands = ["pre", "post", "deepnorm"]
    every = sample_genotypes(9, 2, cands, seed=3)
    assert sorted(map(tuple, every)) == sorted((a, b) for a in cands for b in cands)  # the whole space, once each
    assert sample_genotypes(4, 2, cands, seed=3) == every[:4]
    assert sample_genotypes(5, 6, cands, seed=0) == sample_genotypes(5, 6, cands, seed=0)
    assert sample_genotypes(5, 6, cands, seed=0) != sample_genotypes(5, 6, cands, seed=1)
    rest = sample_genotypes(7, 2, cands, seed=3, exclude=every[:2])
    assert not {tuple(g) for g in rest} & {tuple(g) for g in every[:2]} and len({tuple(g) for g in rest}) == 7
    with pytest.raises(ValueError, match="holds 9 more"):
        sample_genotypes(10, 2, cands, seed=0)
    with pytest.raises(ValueError, match="two candidates"):
        sample_genotypes(1, 2, ["pre"], seed=0)


def test_sample_is_uniform_over_the_space():
    """The first draw over 2700 seeds: each of the 9 genotypes of 3^2 about 300 times (binomial
    std 15.7; 5 std bounds)."""
    counts = Counter(tuple(sample_genotypes(1, 2, ["a", "b", "c"], seed=s)[0]) for s in range(2700))
    assert len(counts) == 9 and all(221 < c < 379 for c in counts.values()), counts


def test_one_hot_score_is_the_derived_models_loss(tiny_model_cfg):
    """The supernet's score of a genotype equals the loss of its derived model with the same
    weights, for every candidate at every block and a mixed genotype; alphas play no part."""
    torch.manual_seed(0)
    net = Supernet(tiny_model_cfg, VOCAB)
    with torch.no_grad():
        net.alphas.normal_(0, 3.0)
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    tokens = np.random.default_rng(0).integers(0, VOCAB, 400)
    starts = eval_starts(len(tokens), tiny_model_cfg.context, 12)
    n = tiny_model_cfg.n_layers
    genotypes = [[(c, c)] * n for c in ("pre", "post", "deepnorm")] + [[("post", "post"), ("pre", "pre"), ("deepnorm", "deepnorm")]]
    scores = score_genotypes(net, genotypes, tokens, starts, batch_size=5)
    for g, score in zip(genotypes, scores):
        derived = build_derived(tiny_model_cfg, VOCAB, g)
        derived.load_state_dict(net.state_dict(), strict=False)
        want = evaluate(derived, tokens, starts, tiny_model_cfg.context, 5, torch.device("cpu"))
        assert score == pytest.approx(want, abs=1e-6)
    assert len(set(np.round(scores, 6))) == len(genotypes)  # the genotypes score differently
    mix = one_hot_mixing(net, genotypes[-1])
    assert mix.shape == (n, 2, 3) and torch.equal(mix.sum(-1), torch.ones(n, 2))
    assert mix[0, 0].tolist() == [0.0, 1.0, 0.0] and mix[2, 1].tolist() == [0.0, 0.0, 1.0]


def test_one_hot_mixing_refuses_what_the_supernet_cannot_hold(tiny_model_cfg):
    net = Supernet(tiny_model_cfg, VOCAB)
    with pytest.raises(ValueError, match="'peri' is not a candidate"):
        one_hot_mixing(net, [("peri", "peri")] * tiny_model_cfg.n_layers)
    with pytest.raises(ValueError, match="2 blocks given for a supernet of 3"):
        one_hot_mixing(net, [("pre", "pre")] * 2)
    with pytest.raises(ValueError, match="one alpha row per block"):
        one_hot_mixing(net, [("pre", "post")] * tiny_model_cfg.n_layers)
    sub = Supernet(ModelConfig(**{**tiny_model_cfg.__dict__, "granularity": "sublayer"}), VOCAB)
    assert one_hot_mixing(sub, [("pre", "post")] * tiny_model_cfg.n_layers)[0].argmax(-1).tolist() == [0, 1]


def test_percentile_and_rungs():
    gt, rs = experiment_script("truth/ground_truth"), experiment_script("race/random_search")
    assert gt.percentile(2.0, [1.0, 3.0, 4.0, 2.0]) == pytest.approx(62.5)  # 2 worse, 1 tie
    assert gt.percentile(0.5, [1.0, 2.0]) == 100.0 and gt.percentile(9.0, [1.0, 2.0]) == 0.0
    assert rs.rung_steps(100, 3, 1000) == [100, 300]
    assert rs.rung_steps(100, 2, 1000) == [100, 200, 400]
    assert rs.rung_steps(500, 3, 400) == [500]


def test_the_best_sampled_genotype_is_the_lowest_mean_over_seeds():
    # the deep setting's top rows (docs/results.md: seed 0, then 3-seed means): g06 leads at seed 0, g16 over 3 seeds
    best_sampled = experiment_script("truth/ground_truth").best_sampled
    top = [{"label": "g06", "seed0": 2.505, "mean": 2.532}, {"label": "g16", "seed0": 2.510, "mean": 2.523},
           {"label": "g08", "seed0": 2.516, "mean": 2.536}, {"label": "g01", "seed0": 2.528, "mean": None}]
    assert best_sampled(top)["label"] == "g16"
    assert best_sampled([{"label": "a", "seed0": 2.6, "mean": None}, {"label": "b", "seed0": 2.5, "mean": None}])["label"] == "b"
    assert best_sampled([]) is None


@pytest.mark.parametrize("extra, message", [
    (["--baselines", "all-pre,nope"], "--baselines: unknown ['nope']"),
    (["--samples", "shallow=10"], "--samples shallow=10: the shallow setting's space holds 9 genotypes (3 candidates, 2 blocks)"),
])
def test_ground_truth_refuses_bad_input_before_any_search(tmp_path, extra, message, capsys):
    out = tmp_path / "gt"
    assert experiment_script("truth/ground_truth").main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--settings", "shallow", "--top", "1",
                                          "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("name", ["common/validate", "truth/ground_truth", "race/random_search", "stability/stability",
                                  "fidelity/read_off"])
def test_a_bad_workers_count_is_refused_before_any_run(name, capsys):
    """--workers 0 is refused by the parser (one line, exit 2), not after hours of searching."""
    with pytest.raises(SystemExit) as stop:
        experiment_script(name).main(["--workers", "0", "--out", "/nonexistent/never"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--workers: expected a positive integer, got '0'" in err and "Traceback" not in err


@pytest.mark.slow
def test_ground_truth_and_random_search_commands_on_the_tiny_config(tmp_path, cache_dir, monkeypatch, capsys):
    """Both commands end to end on the tiny config, sharing one folder: the search is run once;
    every sample and baseline at seed 0, the top one and the searched at 2 seeds; tau over
    the sample; the random search's best at 2 seeds; a re-run reuses everything."""
    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    corpus = tmp_path / "text.txt"
    corpus.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")  # small: the runs' set-up is quick
    out = tmp_path / "gt"
    common = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--settings", "shallow", "--seeds", "2", "--out", str(out),
              "--set", f"data.corpus={corpus}"]
    for key in ("search.steps=8", "search.eval_every=4", "search.arch_warmup_steps=2", "search.selection_tune_steps=1",
                "retrain.steps=6", "retrain.eval_every=3", "retrain.final_eval_windows=4", "logging.tensorboard=false"):
        common += ["--set", key]
    gt, rs = experiment_script("truth/ground_truth"), experiment_script("race/random_search")
    real = rs.short_retrain

    def costed(cfg, spec, folder):  # each short retrain costs 0.125 s per step: the budget buys the same runs on any machine
        return {**real(cfg, spec, folder), "wall_time_s": 0.125 * cfg.retrain.steps}
    monkeypatch.setattr(rs, "short_retrain", costed)
    assert rs.main([*common, "--min-steps", "1", "--eta", "2", "--budget-s", "1.0", "--rank-windows", "4"]) == 0
    result = json.loads((out / "shallow" / "random_search" / "result.json").read_text())
    # each rung's share is 0.5 s: 4 retrains of 1 step at rung 0, then its best 2 at 2 steps (0.25 s each)
    assert result["rungs"] == [1, 2] and [len(h) for h in result["history"]] == [4, 2] and result["evaluated"] == 6
    assert result["spent_s"] == 1.0 and len(result["valid"]) == 2
    assert result["placements"] in [r["placements"] for r in result["history"][-1]]
    assert gt.main([*common, "--samples", "shallow=4", "--top", "1", "--baselines", "all-pre,all-post", "--score-windows", "8"]) == 0
    r = json.loads((out / "ground_truth.json").read_text())[0]
    assert json.loads((out / "shallow" / "ground_truth.json").read_text()) == r  # kept per setting, for read_off and later calls
    seed0 = r["fidelity"]["retrained_seed0"]
    assert len(seed0) == 4 and len(r["fidelity"]["supernet_loss"]) == 4 and -1.0 <= r["fidelity"]["kendall_tau"] <= 1.0
    assert r["quantiles"]["q0"] == min(seed0) and r["quantiles"]["q100"] == max(seed0)
    assert len(r["searched"]["valid"]) == 2 and len(r["top"]) == 1 and len(r["top"][0]["valid"]) == 2
    assert r["top"][0]["seed0"] == min(seed0)
    assert [b["label"] for b in r["baselines"]] == ["all-pre", "all-post"]
    assert r["random_search"]["valid"] == result["valid"]
    metrics = json.loads((out / "shallow" / "compare" / "g00" / "seed0" / "metrics.json").read_text())
    assert metrics["placements"] == " ".join(json.loads((out / "shallow" / "sample" / "g00.json").read_text())["placements"])
    stamp = (out / "shallow" / "compare" / "g00" / "seed0" / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()
    assert gt.main([*common, "--samples", "shallow=4", "--top", "1", "--baselines", "all-pre,all-post", "--score-windows", "8"]) == 0
    assert (out / "shallow" / "compare" / "g00" / "seed0" / "metrics.json").stat().st_mtime_ns == stamp  # reused
    said = capsys.readouterr().out
    assert "| random search |" in said
    want = gt.verdict(r["searched"]["valid"], result["valid"]).replace("loses", "loses to", 1)
    assert f"lies at the **{r['searched']['percentile_mean']:.0f}th** percentile" in said and f"against random search it **{want}** it" in said


def test_a_search_read_off_by_genotype_scores(tmp_path, cache_dir):
    """``search.selection=score`` on the tiny config: every one of the 3^2 genotypes scored
    one-hot on the selection windows, the lowest exported, its score the supernet's loss."""
    from autoln.config import load_config
    from autoln.data import WindowSampler, arch_split, load_corpus
    from autoln.models.genotype import Genotype
    from autoln.oneshot.run_search import run_search

    corpus_file = tmp_path / "text.txt"
    corpus_file.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        f"data.corpus={corpus_file}", f"data.cache_dir={cache_dir}", "search.steps=6", "search.arch_warmup_steps=2",
        "search.eval_every=6", "search.selection=score", "logging.progress=false", "logging.tensorboard=false"])
    result = run_search(cfg, tmp_path / "s")
    sel = Genotype.load(tmp_path / "s" / "genotype.json").provenance["selection"]
    assert sel["method"] == "score" and sel["search"] == "exhaustive" and sel["evaluated"] == 9
    assert sel["top"][0]["placements"] == result.genotype.describe() and sel["loss"] == sel["top"][0]["loss"]
    assert [t["loss"] for t in sel["top"]] == sorted(t["loss"] for t in sel["top"])
    corpus = load_corpus(cfg.data)
    train, mc, sc = corpus.splits["train"], cfg.model, cfg.search
    _, a_chunks = arch_split(len(train), mc.context, cfg.data.chunk_tokens, cfg.data.arch_fraction, sc.seed)
    starts = WindowSampler(train, a_chunks, mc.context, sc.selection_windows, seed=[sc.seed, 5]).sample_starts()
    placements = [[(p, p) for p in t["placements"].split()] for t in sel["top"][:3]]
    again = score_genotypes(result.model, placements, train, starts, sc.batch_size)
    np.testing.assert_allclose(again, [t["loss"] for t in sel["top"][:3]], atol=2e-6)


@pytest.mark.slow
def test_stability_command_on_the_tiny_config(tmp_path, cache_dir, monkeypatch):
    """Two search seeds, their consensus and each distinct genotype retrained at 2 seeds; a seed
    whose genotype is the consensus is stable; the vote's agreement is reported beside it."""
    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    corpus = tmp_path / "text.txt"
    corpus.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    out = tmp_path / "st"
    args = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--settings", "shallow", "--seeds", "2", "--retrain-seeds", "2",
            "--out", str(out), "--set", f"data.corpus={corpus}"]
    for key in ("search.steps=6", "search.eval_every=3", "search.arch_warmup_steps=2", "search.selection_tune_steps=1",
                "retrain.steps=4", "retrain.warmup_steps=1", "retrain.eval_every=2", "retrain.final_eval_windows=4", "logging.tensorboard=false"):
        args += ["--set", key]
    assert experiment_script("stability/stability").main(args) == 0
    r = json.loads((out / "stability.json").read_text())[0]
    consensus = json.loads((out / "shallow" / "seeds" / "genotype.json").read_text())
    assert r["consensus"]["placements"] == " ".join(consensus["placements"]) and len(r["consensus"]["valid"]) == 2
    assert [row["seed"] for row in r["seeds"]] == [0, 1] and r["agreement"] == consensus["provenance"]["consensus"]["agreement"]
    for row in r["seeds"]:
        assert len(row["valid"]) == 2
        if row["placements"] == r["consensus"]["placements"]:
            assert row["stable"] and row["valid"] == r["consensus"]["valid"]
    assert r["stability"] == sum(row["stable"] for row in r["seeds"]) / 2
    assert "Stability: **" in (out / "stability.md").read_text()

    # validate's own search of the setting (same config, same seed) becomes the first seed's
    # search: copied, not run again; a search made with other settings is not copied
    import shutil

    stability = experiment_script("stability/stability")
    seeds = out / "shallow" / "seeds"
    shutil.copytree(seeds / "seed0", out / "shallow" / "search")
    shutil.rmtree(seeds / "seed0")
    (seeds / "genotype.json").unlink()
    events = sorted(p.name for p in (out / "shallow" / "search").iterdir())
    overrides = [a for k, a in zip(args, args[1:]) if k == "--set"] + ["logging.progress=false"]
    other = stability.setting_config("shallow", overrides + ["search.steps=8"], args[1])
    assert not stability.reuse_validate_search(other, "shallow", out) and not (seeds / "seed0").exists()
    assert stability.main(args) == 0
    assert sorted(p.name for p in (seeds / "seed0").iterdir()) == events
    assert (seeds / "seed0" / "genotype.json").read_bytes() == (out / "shallow" / "search" / "genotype.json").read_bytes()
    assert json.loads((out / "stability.json").read_text())[0]["seeds"] == r["seeds"]
    # seed 0's genotype is validate's searched one: retrained under validate's label ("search"), whose runs validate reuses
    assert (out / "shallow" / "compare" / "search" / "seed1" / "metrics.json").exists()


def _read_off_rows(shallow: dict, deep: dict, taus=(0.6, 0.6)) -> list[dict]:
    """Hand-built results of read_off.run_setting: per setting, read-off -> valid values."""
    rd = experiment_script("fidelity/read_off")
    out = []
    for name, values, tau in (("shallow", shallow, taus[0]), ("deep", deep, taus[1])):
        rows = {r: {"valid": v, "mean": sum(v) / len(v) if v else None} for r, v in values.items()}
        for r in rd.READ_OFFS[1:]:
            rows[r]["vs_perturbation"] = rd.against(rows[r]["valid"], rows["perturbation"]["valid"])
        out.append({"setting": name, "rows": rows, "kendall_tau": tau})
    return out


def test_the_read_off_rule_fixed_before_the_results():
    """A read-off replaces perturbation only if it beats it by more than one std in shallow or
    deep and loses by more than one in neither; score only with tau >= 0.5 in both; among
    several, the lowest mean; without both settings nothing is decided."""
    rd = experiment_script("fidelity/read_off")
    base = [2.50, 2.52, 2.51]  # std 0.010
    same = {"score": base, "argmax": base, "fixed-alpha": base}
    assert rd.decide(_read_off_rows({"perturbation": base, **same}, {"perturbation": base, **same}))[0] == "perturbation"
    # argmax beats in shallow, matches in deep: it qualifies
    shallow = {"perturbation": base, "score": base, "argmax": [2.40, 2.41, 2.40], "fixed-alpha": base}
    assert rd.decide(_read_off_rows(shallow, {"perturbation": base, **same}))[0] == "argmax"
    # ... but not when it loses in deep by more than one std
    deep = {"perturbation": base, "score": base, "argmax": [2.60, 2.61, 2.60], "fixed-alpha": base}
    choice, reason = rd.decide(_read_off_rows(shallow, deep))
    assert choice == "perturbation" and "argmax: beats in shallow, loses in deep" in reason
    # score beats in both, and argmax too by less: score has the lower mean, if tau allows it
    both = {"perturbation": base, "score": [2.30, 2.31, 2.30], "argmax": [2.40, 2.41, 2.40], "fixed-alpha": base}
    assert rd.decide(_read_off_rows(both, both))[0] == "score"
    choice, reason = rd.decide(_read_off_rows(both, both, taus=(0.6, 0.49)))
    assert choice == "argmax" and "score: not eligible" in reason
    choice, reason = rd.decide(_read_off_rows(both, both, taus=(0.6, None)))  # tau not measured: undecided
    assert choice == "perturbation" and reason.startswith("undecided") and "Kendall's tau" in reason
    choice, reason = rd.decide(_read_off_rows(both, both)[:1])
    assert choice == "perturbation" and reason.startswith("undecided")
    two = {r: v[:2] for r, v in both.items()}  # 2 seeds: the rule asks for 3
    choice, reason = rd.decide(_read_off_rows(two, both))
    assert choice == "perturbation" and "3 finished seeds" in reason
    # every seed of the default diverged in shallow: a read-off that trains beats it
    dead = {"perturbation": [], "score": base, "argmax": base, "fixed-alpha": base}
    rows = _read_off_rows(dead, {"perturbation": base, **same})
    assert rows[0]["rows"]["argmax"]["vs_perturbation"] == "beats (every seed of perturbation diverged)"
    assert rd.decide(rows, min_seeds=0)[0] == "score"  # all three beat it equally: the first of the lowest mean


@pytest.mark.slow
def test_read_off_command_on_the_tiny_config(tmp_path, cache_dir, monkeypatch, capsys):
    """The four read-offs of one setting on the tiny config: score and argmax re-read the
    default search's supernet, fixed-alpha searches with search.arch_lr=0, each retrained at 2
    seeds in the shared comparison folder; one setting leaves the rule undecided."""
    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    corpus = tmp_path / "text.txt"
    corpus.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    out = tmp_path / "ro"
    args = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--settings", "shallow", "--seeds", "2", "--out", str(out),
            "--set", f"data.corpus={corpus}"]
    for key in ("search.steps=6", "search.eval_every=3", "search.arch_warmup_steps=2", "search.selection_tune_steps=1",
                "retrain.steps=4", "retrain.warmup_steps=1", "retrain.eval_every=2", "retrain.final_eval_windows=4",
                "logging.tensorboard=false"):
        args += ["--set", key]
    assert experiment_script("fidelity/read_off").main(args) == 0
    report = json.loads((out / "read_off.json").read_text())
    assert report["choice"] == "perturbation" and report["reason"].startswith("undecided")
    rows = report["settings"][0]["rows"]
    assert list(rows) == ["perturbation", "score", "argmax", "fixed-alpha"] and all(len(r["valid"]) == 2 for r in rows.values())
    searched = json.loads((out / "shallow" / "search" / "genotype.json").read_text())
    assert rows["perturbation"]["placements"] == " ".join(searched["placements"])
    fixed = json.loads((out / "shallow" / "read_off" / "fixed-alpha" / "genotype.json").read_text())
    assert fixed["provenance"]["config"]["search"]["arch_lr"] == 0.0
    assert json.loads((out / "shallow" / "read_off" / "score" / "genotype.json").read_text())["provenance"]["config"]["search"]["selection"] == "score"
    for label in ("search", "score", "argmax", "fixed-alpha"):
        assert (out / "shallow" / "compare" / label / "seed1" / "metrics.json").exists()
    assert report["settings"][0]["kendall_tau"] is None  # no ground truth yet
    # the setting's tau comes from its own ground_truth.json; the deep setting, from a call of its own, adds up
    (out / "shallow" / "ground_truth.json").write_text(json.dumps({"setting": "shallow", "fidelity": {"kendall_tau": 0.7}}))
    deep = {**report["settings"][0], "setting": "deep", "kendall_tau": 0.6, "command": "python experiments/fidelity/read_off.py --settings deep"}
    (out / "deep").mkdir()
    (out / "deep" / "read_off.json").write_text(json.dumps(deep))
    assert experiment_script("fidelity/read_off").main(args) == 0
    report = json.loads((out / "read_off.json").read_text())
    assert [(s["setting"], s["kendall_tau"]) for s in report["settings"]] == [("shallow", 0.7), ("deep", 0.6)]
    assert report["reason"].startswith("undecided: the rule needs 3 finished seeds")  # both settings now; 2 seeds each
    # a read-off is reused only for the search it was read off: after a new search, it is redone
    rd, search, argmax = experiment_script("fidelity/read_off"), out / "shallow" / "search", out / "shallow" / "read_off" / "argmax"
    stamp = (argmax / "genotype.json").stat().st_mtime_ns
    rd.reselect(search, argmax, "argmax")
    assert (argmax / "genotype.json").stat().st_mtime_ns == stamp
    (search / "genotype.json").write_text((search / "genotype.json").read_text() + "\n")
    capsys.readouterr()
    rd.reselect(search, argmax, "argmax")
    assert "was read off another search" in capsys.readouterr().err and (argmax / "genotype.json").stat().st_mtime_ns != stamp
