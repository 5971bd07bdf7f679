"""retrain.py --compare (equal budget, seeds, table and curves) and python -m autoln.diagnose,
through the real command line."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import statistics
import subprocess
import sys

import pytest

from autoln import cli
from autoln.cli import CONFIG_SECTIONS, DEFAULT_BASELINES
from autoln.config import Config
from autoln.models.genotype import BASELINES, Genotype

from .conftest import ROOT, experiment_script

TINY = str(ROOT / "configs" / "tiny.yaml")
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str, cache: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args, "--set", "logging.progress=false"], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env={**os.environ, "XDG_CACHE_HOME": cache})
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("compare-cache"))


def test_default_baselines_are_the_registry_and_help_lists_them_and_every_section(capsys):
    assert DEFAULT_BASELINES.split(",") == list(BASELINES)
    assert list(CONFIG_SECTIONS) == [f.name for f in dataclasses.fields(Config)]
    for main in (cli.search_main, cli.retrain_main):
        with pytest.raises(SystemExit):
            main(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert f"sections {', '.join(CONFIG_SECTIONS)})" in text
    assert " | ".join(BASELINES) in text  # retrain.py --help


def test_labels_are_unique_and_baselines_keep_their_names():
    from autoln.retrain.compare import labels_for

    assert labels_for(["runs/all-pre/genotype.json", "x/best_genotype.json", "y/x.json", "all-pre"]) == \
        ["all-pre-2", "x", "x-2", "all-pre"]


def test_genotypes_of_different_candidate_lists_compare_but_not_of_different_sizes(tmp_path):
    """Searches over 3 and over 7 candidates give derived models of one size: comparable. A width
    that differs is refused, naming the key."""
    from autoln.retrain.compare import comparison_config
    from autoln.config import ModelConfig
    from autoln.core.errors import GenotypeError
    from autoln.models.genotype import baseline

    narrow = baseline("all-post", ModelConfig(), 256)
    wide = Genotype.from_dict({**narrow.to_dict(), "candidates": ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"],
                               "probabilities": [[1 / 7] * 7] * 6, "placements": ["peri", "none", "lns", "post", "pre", "outnorm"]})
    other = Genotype.from_dict({**narrow.to_dict(), "model": {**narrow.to_dict()["model"], "d_model": 64}})
    for name, g in (("narrow", narrow), ("wide", wide), ("other", other)):
        g.save(tmp_path / f"{name}.json")
    cfg = comparison_config(Config(), [str(tmp_path / "wide.json"), str(tmp_path / "narrow.json")])
    assert cfg.model.d_model == 96 and len(cfg.model.candidates) == 7  # the first file's list is kept
    with pytest.raises(GenotypeError, match=r"different model sizes \(model.d_model: 64 vs 96\)"):
        comparison_config(Config(), [str(tmp_path / "narrow.json"), str(tmp_path / "other.json")])


def test_compare_tiny_two_seeds_writes_table_curves_and_reuses_runs(tmp_path, cache):
    out = tmp_path / "cmp"
    short = ["--set", "retrain.steps=20", "--set", "retrain.eval_every=10", "--set", "retrain.final_eval_windows=8",
             "--baselines", "all-pre,all-post,mix-ln"]  # the default list is every baseline (test above)
    proc = run(str(ROOT / "retrain.py"), "--compare", "--config", TINY, "--seeds", "2", *short, "--out", str(out), cache=cache)
    with open(out / "compare.csv", newline="") as fh:
        rows = {r["genotype"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"all-pre", "all-post", "mix-ln"}
    for name, row in rows.items():  # the table is the mean and std of the runs' own metrics
        vals = [json.loads((out / name / f"seed{i}" / "metrics.json").read_text()) for i in range(2)]
        assert [v["seed"] for v in vals] == [0, 1] and vals[0]["steps"] == vals[1]["steps"] == 20
        bpb = [v["valid"]["bits_per_byte"] for v in vals]
        assert row["valid_bits_per_byte"] == f"{statistics.mean(bpb):.4f} ± {statistics.stdev(bpb):.4f}"
        assert row["diverged"] == "0" and row["seeds"] == "2"
    assert rows["mix-ln"]["placements"] == "post pre"
    assert (out / "valid_curves.png").read_bytes()[:8] == PNG
    assert "| genotype | placements | seeds | valid_bits_per_byte |" in proc.stdout
    assert f"tensorboard --logdir {out}   # every run's curves" in proc.stdout  # the next: line
    stamp = (out / "all-pre" / "seed0" / "metrics.json").stat().st_mtime_ns
    again = run(str(ROOT / "retrain.py"), "--compare", "--config", TINY, "--seeds", "2", *short, "--out", str(out), cache=cache)
    assert "finished runs are reused" in again.stderr and "[compare]" not in again.stderr
    assert (out / "all-pre" / "seed0" / "metrics.json").stat().st_mtime_ns == stamp
    # another baseline joins the same folder: only its runs are new
    more = run(str(ROOT / "retrain.py"), "--compare", "--config", TINY, "--seeds", "2", *short[:-2], "--baselines", "all-pre,all-pre:fixed",
               "--out", str(out), cache=cache)
    assert more.stderr.count("[compare]") == 2 and "[compare] all-pre:fixed seed 0" in more.stderr
    assert (out / "all-pre" / "seed0" / "metrics.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "all-pre:fixed" / "seed1" / "metrics.json").read_text())["placements"] == "pre:fixed pre:fixed"


def test_compare_counts_diverged_runs_and_refuses_bad_arguments(tmp_path, cache):
    out = tmp_path / "div"
    run(str(ROOT / "retrain.py"), "--compare", "--config", TINY, "--baselines", "all-post", "--seeds", "2",
        "--set", "retrain.lr=1000", "--set", "retrain.steps=20", "--out", str(out), cache=cache)
    with open(out / "compare.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["diverged"] == "2" and row["valid_bits_per_byte"] == "-"
    assert "retrain diverged at step" in (out / "all-post" / "seed0" / "diverged.txt").read_text()
    other = run(str(ROOT / "retrain.py"), "--compare", "--config", TINY, "--baselines", "all-post", "--seeds", "2",
                "--set", "retrain.lr=1000", "--set", "retrain.steps=30", "--out", str(out), cache=cache, check=False)
    assert other.returncode == 2 and "made with other settings (retrain.steps (20 -> 30))" in other.stderr
    for args, message in [(("--compare", "--baselines", "all-nope"), "--baselines: unknown ['all-nope']"),
                          (("--compare", "--seeds", "0"), "--seeds must be a positive integer"),
                          (("--compare", "--baselines", ""), "needs at least one --genotype or baseline"),
                          (("--seeds", "2", "--genotype", "all-pre"), "--baselines, --seeds and --workers need --compare"),
                          (("--compare", "--workers", "0"), "--workers must be a positive integer, got 0"),
                          (("--genotype", "all-pre", "--genotype", "all-post"), "exactly one --genotype")]:
        bad = run(str(ROOT / "retrain.py"), *args, "--config", TINY, "--out", str(tmp_path / "bad"), cache=cache, check=False)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)


def test_diagnose_command_prints_tables_and_writes_pngs(tmp_path, cache):
    out = tmp_path / "diag"
    proc = run("-m", "autoln.diagnose", "--genotype", "all-post", "--config", TINY, "--steps", "20", "--out", str(out), cache=cache)
    d = json.loads((out / "diagnostics.json").read_text())
    assert d["placements"] == "post post" and len(d["init"]["grad_norm_ffn_out"]) == 2
    assert len(d["init"]["residual_norm"]) == 3 and d["init"]["residual_norm"][1] == pytest.approx(32 ** 0.5, rel=1e-3)
    assert len(d["update_size"]) == 20 and 0 < d["update_size"][0] < d["update_size"][-1]
    for name in ("grad_norms", "residual_norms", "angular_distance", "update_size"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG
    assert "| block | grad norm attn out | grad norm FFN fc2 | residual norm after | angular distance (arccos/pi) |" in proc.stdout
    again = run("-m", "autoln.diagnose", "--genotype", "all-post", "--config", TINY, "--out", str(out), cache=cache, check=False)
    assert again.returncode == 2 and "already holds a finished run (diagnostics.json)" in again.stderr


def test_reproduction_script_part_a_writes_its_report(tmp_path, cache):
    out = tmp_path / "repro"
    run(str(ROOT / "experiments" / "papers" / "reproduce_papers.py"), "--config", TINY, "--parts", "a", "--grad-seeds", "2",
        "--out", str(out), cache=cache)
    report = (out / "report.md").read_text()
    assert "### (a) Gradient norm at initialisation (Xiong et al. 2020, Fig. 3):" in report and "| post-LN |" in report
    numbers = json.loads((out / "report.json").read_text())["a"]
    assert len(numbers["grad_norm_ffn_out"]["post"]) == 12 and numbers["verdict"] in ("reproduced", "not reproduced")
    assert (out / "a_grad_norms.png").read_bytes()[:8] == PNG


def test_validation_script_reports_each_setting_against_every_baseline(tmp_path, cache):
    out = tmp_path / "validate"
    short = ["--set", "search.steps=10", "--set", "search.eval_every=5", "--set", "search.selection_tune_steps=1", "--set", "search.arch_warmup_steps=2",
             "--set", "retrain.steps=6", "--set", "retrain.eval_every=3", "--set", "retrain.final_eval_windows=4",
             "--set", "logging.tensorboard=false"]
    proc = run(str(ROOT / "experiments" / "common" / "validate.py"), "--config", TINY, *short, "--settings", "highlr", "--seeds", "2",
               "--out", str(out), cache=cache)
    numbers = json.loads((out / "report.json").read_text())
    assert [r["setting"] for r in numbers] == ["highlr"]
    r = numbers[0]
    assert r["retrain"] == {"steps": 6, "lr": 3e-3, "warmup_steps": 0}
    labels = [row["label"] for row in r["rows"]]
    assert labels == ["searched", *BASELINES]
    assert all(len(row["valid"]) == 2 for row in r["rows"])  # 2 seeds each, none diverged
    searched = Genotype.load(out / "highlr" / "search" / "genotype.json")
    assert r["genotype"] == searched.describe() and searched.provenance["config"]["search"]["warmup_steps"] == 0
    assert r["verdict"] in ("beats", "matches", "loses") and r["best_baseline"] in BASELINES
    assert f"**{r['verdict'].replace('loses', 'loses to', 1)}**" in proc.stdout and "| **searched** |" in (out / "report.md").read_text()
    assert (out / "curves.png").read_bytes()[:8] == PNG
    assert json.loads((out / "highlr" / "validate.json").read_text()) == r  # what a later call's report merges
    assert r["command"].startswith("python experiments/common/validate.py --config ") and f"Command: `{r['command']}`" in proc.stdout
    assert [c["label"] for c in r["curves"]] == labels and [s for s, _ in r["curves"][0]["points"]] == [3, 6]


@pytest.mark.parametrize("searched, best, want", [
    ([2.0, 2.4], [2.3, 2.5], "matches"),   # gap -0.2, larger sd 0.283
    ([2.0, 2.02], [2.3, 2.32], "beats"),
    ([2.5, 2.52], [2.3, 2.32], "loses"),
    ([], [2.3], "loses (every seed diverged)"),
])
def test_validation_verdict(searched, best, want):
    assert experiment_script("common/validate").verdict(searched, best) == want


def test_a_damaged_run_record_is_redone_and_a_damaged_comparison_record_refused(tmp_path):
    """A metrics.json cut short (a crash, a full disk) is retrained, not a traceback for every
    later re-run; a damaged compare.json is refused in one line naming it."""
    from autoln.retrain.compare import run_compare
    from autoln.config import load_config
    from autoln.core.errors import ConfigError

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["retrain.steps=6", "retrain.eval_every=3", "retrain.final_eval_windows=4", "logging.progress=false",
                             "logging.tensorboard=false", f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"])
    out = tmp_path / "cmp"
    first = run_compare(cfg, [], ["all-pre"], 1, out)[0].runs[0]
    metrics = out / "all-pre" / "seed0" / "metrics.json"
    metrics.write_text(metrics.read_text()[:50])
    again = run_compare(cfg, [], ["all-pre"], 1, out)[0].runs[0]
    assert again["valid"] == first["valid"] and json.loads(metrics.read_text())["valid"] == first["valid"]
    (out / "compare.json").write_text("")
    with pytest.raises(ConfigError, match="compare.json is damaged"):
        run_compare(cfg, [], ["all-pre"], 1, out)


def test_a_one_seed_comparison_says_it_is_a_look_and_ties_are_marked(tmp_path):
    from autoln.retrain.compare import ONE_SEED, Entry, write_report
    from autoln.config import load_config

    cfg = load_config(TINY, ["logging.tensorboard=false"])

    def run(v: float) -> dict:
        return {"valid": {"bits_per_byte": v}, "test": {"bits_per_byte": v}, "wall_time_s": 1.0, "history": [{"step": 1, "bits_per_byte": v}]}

    one = [Entry("a", "a", "pre", [run(2.000)]), Entry("b", "b", "post", [run(2.008)])]
    write_report(one, tmp_path, cfg)
    md = (tmp_path / "compare.md").read_text()
    assert ONE_SEED in md and "| +0.0080 |" in md and "tie" not in md.split(ONE_SEED)[1]
    three = [Entry("a", "a", "pre", [run(2.00), run(2.02), run(2.04)]),      # mean 2.02, std 0.02
             Entry("b", "b", "post", [run(2.03), run(2.04), run(2.05)]),     # +0.02: a tie
             Entry("c", "c", "deepnorm", [run(2.10), run(2.11), run(2.12)])]  # +0.09: not
    write_report(three, tmp_path, cfg)
    md = (tmp_path / "compare.md").read_text()
    assert ONE_SEED not in md and "| best |" in md and "+0.0200 (tie: within one std)" in md and "| +0.0900 |" in md


def test_an_interrupted_run_of_a_comparison_is_continued_from_its_checkpoint(tmp_path, capsys):
    """A re-run comparison continues a run cut off at step 3 from its checkpoint (not from step
    0) and gets the uninterrupted run's numbers exactly; a checkpoint made with another config
    cannot be continued, so that run starts again, with a line saying why."""
    from autoln.retrain.compare import run_compare
    from autoln.config import load_config
    from autoln.retrain.run_retrain import retrain_reusing, run_retrain

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    keys = ["retrain.steps=6", "retrain.eval_every=3", "retrain.final_eval_windows=4", "logging.progress=false",
            "logging.tensorboard=false", f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"]
    cfg = load_config(TINY, keys)
    whole = run_compare(cfg, [], ["all-post"], 1, tmp_path / "whole")[0].runs[0]

    class Stop(Exception):
        pass

    def stop_at_3(step, _metrics):
        if step == 3:
            raise Stop

    out = tmp_path / "cut"
    with pytest.raises(Stop):
        run_retrain(cfg, "all-post", out / "all-post" / "seed0", on_eval=stop_at_3)
    capsys.readouterr()
    resumed = run_compare(cfg, [], ["all-post"], 1, out)[0].runs[0]
    err = capsys.readouterr().err
    assert "(resuming)" in err and "resumed from" in err and "at step 3" in err
    assert resumed["valid"] == whole["valid"] and resumed["test"] == whole["test"]

    other = tmp_path / "other"
    with pytest.raises(Stop):
        run_retrain(load_config(TINY, keys + ["retrain.lr=1e-3"]), "all-post", other, on_eval=stop_at_3)
    capsys.readouterr()
    again = retrain_reusing(cfg, "all-post", other)
    assert "cannot be resumed" in capsys.readouterr().err and again["valid"] == whole["valid"]


def test_a_comparison_with_two_workers_gets_the_numbers_of_one_at_a_time(tmp_path, monkeypatch):
    """--workers 2: two retrains at once in spawned processes (one torch thread each on a
    2-core machine, as this process has), every run's numbers exactly those of one at a time."""
    import os

    from autoln.retrain.compare import run_compare
    from autoln.config import load_config

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["retrain.steps=4", "retrain.warmup_steps=1", "retrain.eval_every=2", "retrain.final_eval_windows=4", "logging.progress=false",
                             "logging.tensorboard=false", f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"])
    one = run_compare(cfg, [], ["all-post", "all-pre"], 1, tmp_path / "one")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    two = run_compare(cfg, [], ["all-post", "all-pre"], 1, tmp_path / "two", workers=2)
    assert [e.label for e in two] == ["all-post", "all-pre"]
    for a, b in zip(one, two):
        assert a.runs[0]["valid"] == b.runs[0]["valid"] and a.runs[0]["test"] == b.runs[0]["test"]
    table = (tmp_path / "two" / "compare.md").read_text()
    assert "| all-post | post post | 1 |" in table and "| all-pre | pre pre | 1 |" in table


def test_a_genotype_with_the_placements_of_a_finished_run_takes_its_numbers(tmp_path, capsys):
    """A genotype file whose placements equal a finished run's in the comparison folder (here
    all-pre's) is that same retrain: its runs record the finished ones' numbers with
    same_run_as, and a real retrain of the file in a fresh folder gives exactly those numbers."""
    from autoln.retrain.compare import run_compare
    from autoln.config import load_config
    from autoln.models.genotype import baseline

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["retrain.steps=4", "retrain.warmup_steps=1", "retrain.eval_every=2", "retrain.final_eval_windows=4",
                             "logging.progress=false", "logging.tensorboard=false", f"data.corpus={text}",
                             f"data.cache_dir={tmp_path / 'cache'}"])
    pre = baseline("all-pre", cfg.model, 256).to_dict()
    k, n = len(cfg.model.candidates), len(pre["placements"])
    (tmp_path / "mine").mkdir()
    same = Genotype.from_dict({**pre, "candidates": list(cfg.model.candidates), "probabilities": [[1 / k] * k] * n}).save(
        tmp_path / "mine" / "genotype.json")
    out = tmp_path / "cmp"
    pre = run_compare(cfg, [], ["all-pre"], 2, out)[0]
    capsys.readouterr()
    mine = run_compare(cfg, [str(same)], ["all-pre"], 2, out)[0]
    assert mine.label == "mine" and "the same placements and config as all-pre/seed1" in capsys.readouterr().err
    for i in range(2):
        record = json.loads((out / "mine" / f"seed{i}" / "metrics.json").read_text())
        assert record["same_run_as"] == f"all-pre/seed{i}" and record["genotype"] == str(same)
        assert record["genotype_file"] == Genotype.load(same).to_dict()
        assert mine.runs[i]["valid"] == pre.runs[i]["valid"] and not (out / "mine" / f"seed{i}" / "checkpoint.pt").exists()
    fresh = run_compare(cfg, [str(same)], [], 1, tmp_path / "fresh")[0].runs[0]
    assert fresh["valid"] == pre.runs[0]["valid"] and fresh["test"] == pre.runs[0]["test"] and "same_run_as" not in fresh
    # a run made with another config is not the same retrain: after --overwrite with another lr
    # (which redoes only its own genotypes), all-pre's old runs no longer stand for the file
    other = dataclasses.replace(cfg, retrain=dataclasses.replace(cfg.retrain, lr=cfg.retrain.lr / 2))
    run_compare(other, [], ["all-post"], 1, out, overwrite=True)
    (tmp_path / "again").mkdir()
    again = Genotype.load(same).save(tmp_path / "again" / "genotype.json")
    run = run_compare(other, [str(again)], [], 1, out)[0].runs[0]
    assert "same_run_as" not in run and run["valid"] != pre.runs[0]["valid"]
    # two files of one call with the same placements: one retrain, the other takes its numbers
    (tmp_path / "twin").mkdir()
    twin = Genotype.load(same).save(tmp_path / "twin" / "genotype.json")
    capsys.readouterr()
    pair = run_compare(cfg, [str(same), str(twin)], [], 1, tmp_path / "pair")
    assert capsys.readouterr().err.count("autoln retrain ->") == 1
    assert pair[1].runs[0]["same_run_as"] == "mine/seed0" and pair[1].runs[0]["valid"] == pair[0].runs[0]["valid"]


def test_a_run_made_with_other_settings_or_an_incomplete_record_is_redone(tmp_path, capsys):
    """compare.json deleted and the comparison re-run at another lr: every run's own config.yaml
    says it was made with the old lr, so each is retrained (not shown under the new header);
    a metrics.json that is valid JSON but lacks a finished run's fields ({}) counts as damaged."""
    from autoln.retrain.compare import run_compare
    from autoln.config import load_config

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    keys = ["retrain.steps=4", "retrain.warmup_steps=1", "retrain.eval_every=2", "retrain.final_eval_windows=4",
            "logging.progress=false", "logging.tensorboard=false", f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"]
    out = tmp_path / "cmp"
    old = run_compare(load_config(TINY, keys), [], ["all-pre"], 1, out)[0].runs[0]
    (out / "compare.json").unlink()
    capsys.readouterr()
    new = run_compare(load_config(TINY, keys + ["retrain.lr=1e-2"]), [], ["all-pre"], 1, out)[0].runs[0]
    assert "made with other settings (retrain.lr (0.002 -> 0.01))" in capsys.readouterr().err
    assert new["valid"] != old["valid"] and "lr: 0.01" in (out / "all-pre" / "seed0" / "config.yaml").read_text()
    (out / "all-pre" / "seed0" / "metrics.json").write_text("{}")
    again = run_compare(load_config(TINY, keys + ["retrain.lr=1e-2"]), [], ["all-pre"], 1, out)[0].runs[0]
    assert "is damaged; continuing that run from its checkpoint" in capsys.readouterr().err and again["valid"] == new["valid"]


@pytest.mark.parametrize("n", [3, 25])
def test_the_curves_figure_gives_each_genotype_its_own_line_and_keeps_the_legend_off_the_curves(n):
    from matplotlib.colors import to_hex

    from autoln.retrain.compare import Entry, curves_figure

    entries = [Entry(f"g{i:02d}", "", runs=[{"history": [{"step": s, "bits_per_byte": 3.0 - i / 100 - s / 1000} for s in (100, 200)]}])
               for i in range(n)]
    fig = curves_figure(entries, "bits_per_byte")
    ax = fig.axes[0]
    styles = {(to_hex(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}
    assert len(ax.get_lines()) == n and len(styles) == n  # 10 colours, then a new line style
    legend = ax.get_legend() or fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [f"g{i:02d} (1 seed)" for i in range(n)]
    fig.canvas.draw()  # as TensorBoard's add_figure renders it: the plain figure, no bbox_inches="tight"
    outside = legend.get_window_extent().x0 >= ax.get_window_extent().x1
    assert outside == (n > 10)
    assert legend.get_window_extent().x1 <= fig.bbox.x1 and legend.get_window_extent().y0 >= fig.bbox.y0


def test_reports_of_calls_split_by_settings_add_up(tmp_path):
    from experiments.common.validate import commands_line, merge_saved

    out = tmp_path
    first = merge_saved(out, "ground_truth", [{"setting": "deep", "tau": 0.4}], ["--settings", "deep"])
    assert first == [{"setting": "deep", "tau": 0.4, "command": "python experiments/truth/ground_truth.py --settings deep"}]
    (out / "highlr").mkdir()
    (out / "highlr" / "ground_truth.json").write_text("{cut sho")  # damaged: left out
    merged = merge_saved(out, "ground_truth", [{"setting": "shallow", "tau": 0.6}], ["--settings", "shallow"])
    assert [(r["setting"], r["tau"]) for r in merged] == [("shallow", 0.6), ("deep", 0.4)]  # SETTINGS order, not call order
    assert json.loads((out / "shallow" / "ground_truth.json").read_text())["tau"] == 0.6
    assert commands_line(merged) == ("Commands: `python experiments/truth/ground_truth.py --settings shallow` (shallow); "
                                     "`python experiments/truth/ground_truth.py --settings deep` (deep)")
    again = merge_saved(out, "ground_truth", [{"setting": "deep", "tau": 0.5}], [])
    assert [(r["setting"], r["tau"]) for r in again] == [("shallow", 0.6), ("deep", 0.5)]  # a setting's new result replaces its old
    assert commands_line([again[1]]) == "Command: `python experiments/truth/ground_truth.py`"


@pytest.mark.parametrize("value, text", [(93.3, "93rd"), (90, "90th"), (91, "91st"), (92.4, "92nd"), (11, "11th"),
                                         (12, "12th"), (13, "13th"), (100, "100th"), (0, "0th"), (101, "101st")])
def test_percentiles_read_as_english_ordinals(value, text):
    from experiments.truth.ground_truth import ordinal

    assert ordinal(value) == text
