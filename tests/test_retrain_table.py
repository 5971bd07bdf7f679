"""The retrain table (experiments/common/retrain_table.py, issue 34): reading and writing (append, reuse,
a damaged row refused in one line), the seeds' noise ceiling, random search replayed from the
table against successive halving counted by hand, and a restored row that run_compare reuses
instead of retraining."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from .conftest import ROOT

table = importlib.import_module("experiments.common.retrain_table")
halving = importlib.import_module("experiments.common.halving")
race_replay = importlib.import_module("experiments.race.race_replay")

SPACE = "pre+post+deepnorm"
CID = "0123456789ab"


def row(genotype: str, valid: float, seed: int = 0, steps: int = 1000, wall: float = 100.0, setting: str = "shallow"):
    return table.Row(setting, SPACE, genotype, seed, steps, 512, valid, valid + 0.01, wall, CID, "abc123")


def test_append_keeps_the_first_measurement_and_reads_back_what_it_wrote(tmp_path):
    path = tmp_path / "t.csv"
    assert table.read_table(path) == []
    first = [row("pre pre", 2.5), row("post post", 2.4), row("pre pre", 2.6, seed=1)]
    assert table.append_rows(first, path) == 3
    assert table.append_rows([row("pre pre", 9.9), row("post pre", 2.45)], path) == 1  # the same retrain is reused, not replaced
    rows = table.read_table(path)
    assert len(rows) == 4 and table.lookup(rows, "shallow", SPACE, "pre pre", 0, 1000).valid == 2.5
    assert table.lookup(rows, "shallow", SPACE, "pre pre", 2, 1000) is None
    assert path.read_text().splitlines()[0] == ",".join(table.FIELDS)
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically


def _append_one_at_a_time(path: str, worker: int) -> None:
    for i in range(15):
        table.append_rows([row("pre pre", 2.0 + i / 100, seed=100 * worker + i)], path)


def test_processes_appending_at_once_lose_no_row(tmp_path):
    # the experiments run side by side on one table: each append reads and writes it whole, under a lock
    import multiprocessing

    path = tmp_path / "t.csv"
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    procs = [ctx.Process(target=_append_one_at_a_time, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(r.seed for r in table.read_table(path)) == sorted(100 * w + i for w in range(4) for i in range(15))


@pytest.mark.parametrize("line, why", [
    ("shallow,pre+post+deepnorm,pre pre,zero,1000,512,2.5,2.51,100.0,0123456789ab,abc", "does not parse"),
    ("shallow,pre+post+deepnorm,pre pre,0,1000,512,2.5,2.51,100.0,0123456789ab", "expected the 11 fields"),
    ("wide,pre+post+deepnorm,pre pre,0,1000,512,2.5,2.51,100.0,0123456789ab,abc", "setting 'wide'"),
    ("shallow,pre+post+deepnorm,peri pre,0,1000,512,2.5,2.51,100.0,0123456789ab,abc", "not a list of placements"),
    ("shallow,pre+post+deepnorm,pre pre,0,1000,512,nan,2.51,100.0,0123456789ab,abc", "finite"),
    ("shallow,pre+post+deepnorm,pre pre,0,1000,512,2.5,2.51,100.0,xyz,abc", "12-digit hex"),
])
def test_a_damaged_row_is_refused_in_one_line_naming_the_file_and_line(tmp_path, line, why):
    path = tmp_path / "t.csv"
    table.append_rows([row("pre pre", 2.5)], path)
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(table.TableError, match=why) as info:
        table.read_table(path)
    assert str(info.value).startswith(f"{path}:3: ") and "\n" not in str(info.value)
    with pytest.raises(table.TableError):
        table.append_rows([row("post post", 2.4)], path)  # nothing is written over a damaged table
    assert path.read_text().endswith(line + "\n")


def test_the_seeds_noise_ceiling_is_kendall_s_tau_between_two_seeds():
    values = {"pre pre": (1.0, 1.0), "pre post": (2.0, 3.0), "post pre": (3.0, 2.0), "post post": (4.0, 4.0)}
    rows = [row(g, v[s], seed=s) for g, v in values.items() for s in (0, 1)] + [row("deepnorm pre", 1.5)]
    tau, n = table.kendall_tau_of_seeds(rows, "shallow", SPACE, 1000)
    assert n == 4 and tau == pytest.approx((5 - 1) / 6)  # one discordant pair of six


def test_successive_halving_counted_by_hand():
    # rung 0 (100 steps, 10 s each) and rung 1 (300 steps, 30 s): a 60 s budget gives each rung 30 s
    valid = {(0, 0): 3.0, (1, 0): 2.0, (2, 0): 2.5, (3, 0): 1.0, (1, 1): 1.9}
    calls = []

    def evaluate(i, k):
        calls.append((i, k))
        return valid[i, k], 10.0 if k == 0 else 30.0

    history = halving.successive_halving([0, 1, 2, 3], 60.0, [100, 300], 3, evaluate)
    # rung 0: 30 s pay for three runs (10 + 10 + 10); the fourth would overspend; rung 1: the best
    # ceil(3 / 3) = 1, whose expected cost 10 * 300 / 100 = 30 fits the 30 s share
    assert calls == [(0, 0), (1, 0), (2, 0), (1, 1)]
    assert halving.best_of_last_rung(history)["index"] == 1
    # with 40 s: rung 0's 20 s pay for two runs, and rung 1's 20 s cannot pay an expected 30: no
    # run there, and the answer is rung 0's best
    calls.clear()
    history = halving.successive_halving([0, 1, 2, 3], 40.0, [100, 300], 3, evaluate)
    assert calls == [(0, 0), (1, 0)] and history[1] == [] and halving.best_of_last_rung(history)["index"] == 1


def test_random_search_replayed_from_the_table_matches_halving_counted_by_hand():
    genotypes = ["pre pre", "pre post", "post pre", "post post"]
    short100 = {"pre pre": 3.0, "pre post": 2.0, "post pre": 2.5, "post post": 1.0}
    full = {"pre pre": 2.9, "pre post": 2.1, "post pre": 2.6, "post post": 2.2}
    rows = ([row(g, short100[g], steps=100, wall=10.0) for g in genotypes]
            + [row(g, short100[g] - 0.1, steps=300, wall=30.0) for g in genotypes]
            + [row(g, full[g]) for g in genotypes] + [row("deepnorm pre", 1.0)])  # not measured short: not drawn
    runs = table.simulate_random_search(rows, "shallow", SPACE, 60.0, [100, 300], 3, 1000, runs=50, seed=7)
    pool = sorted(genotypes)
    for run, r in enumerate(runs):
        order = np.random.default_rng([7, run]).permutation(4)
        first_three = [pool[i] for i in order[:3]]  # by hand: rung 0 pays for three, rung 1 retrains their best
        best = min(first_three, key=short100.get)
        assert (r["genotype"], r["valid"], r["evaluated"], r["spent_s"]) == (best, full[best], 4, 60.0)
    assert len({r["genotype"] for r in runs}) > 1
    # a searched genotype measured at the same rungs is no random draw: the sample keeps it out
    rows += [row("deepnorm post", 0.5, steps=100, wall=10.0), row("deepnorm post", 0.5, steps=300, wall=30.0),
             row("deepnorm post", 0.4)]
    assert table.simulate_random_search(rows, "shallow", SPACE, 60.0, [100, 300], 3, 1000, runs=50, seed=7,
                                        genotypes=genotypes) == runs
    assert "deepnorm post" in {r["genotype"] for r in table.simulate_random_search(rows, "shallow", SPACE, 60.0, [100, 300], 3,
                                                                                   1000, runs=50, seed=7)}
    with pytest.raises(table.TableError, match="every rung"):
        table.simulate_random_search(rows, "deep", SPACE, 60.0, [100, 300], 3, 1000)


def test_win_share_counts_pairs_with_ties_as_half():
    assert table.win_share([2.0, 2.5], [2.1, 2.5, 3.0]) == pytest.approx((3 + 1.5) / 6)


def test_a_restored_row_is_reused_by_run_compare_instead_of_retraining(tmp_path, cache_dir, monkeypatch):
    from autoln.retrain.compare import run_compare
    from autoln.config import load_config

    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    cfg = load_config(str(ROOT / "configs" / "tiny.yaml"), ["retrain.steps=12", "retrain.eval_every=12",
                                                           "retrain.final_eval_windows=8", "logging.progress=false"])
    path = tmp_path / "t.csv"
    first = table.compare_with_table(cfg, "shallow", [], ["all-post"], 1, tmp_path / "a", path)
    rows = table.read_table(path)
    assert [(r.genotype, r.seed, r.steps, r.windows) for r in rows] == [("post post", 0, 12, 8)]
    assert rows[0].valid == first[0].runs[0]["valid"]["bits_per_byte"]  # to the last bit
    assert table.restore_runs(rows, "shallow", cfg, tmp_path / "b") == 2  # by placements, and as the baseline's own folder
    trained = []
    monkeypatch.setattr("autoln.retrain.compare.retrain_one", lambda *a: trained.append(a))
    again = run_compare(cfg, [], ["all-post"], 1, tmp_path / "b")
    assert trained == [] and again[0].runs[0]["valid"]["bits_per_byte"] == rows[0].valid
    other = load_config(str(ROOT / "configs" / "tiny.yaml"), ["retrain.steps=12", "retrain.lr=1e-4"])
    assert table.restore_runs(rows, "shallow", other, tmp_path / "c") == 0  # another config's row stands for nothing


def test_rank_agreement_counts_the_top_tenth_and_kendall_s_tau_by_hand():
    truth = {f"g{i}": float(i) for i in range(20)}  # g0 best
    scores = {**{f"g{i}": float(i) for i in range(20)}, "g0": 2.5, "g1": 0.5, "g2": 0.0, "g3": 3.5}
    out = table.rank_agreement(scores, truth)
    # top 10 % of 20 = 2: truth's {g0, g1}, the predictor's {g2, g1}: one hit; pairs out of order among
    # g0..g3 (scores 2.5, 0.5, 0.0, 3.5): (g0,g1), (g0,g2), (g1,g2) -> 3 discordant of 190
    assert (out["hits"], out["of"], out["n"]) == (1, 2, 20)
    assert out["tau"] == pytest.approx((187 - 3) / 190)
    with pytest.raises(table.TableError, match="two genotypes"):
        table.rank_agreement({"g0": 1.0}, truth)


TINY_ARGS = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "search.steps=30", "--set", "search.arch_warmup_steps=6",
             "--set", "retrain.steps=12", "--set", "retrain.eval_every=12", "--set", "retrain.final_eval_windows=8"]


def test_dependable_and_horizon_commands_on_the_tiny_config(tmp_path, cache_dir, monkeypatch, capsys):
    """Both new experiment commands end to end on the tiny config: every answer and retrain lands
    in the table, a re-run trains nothing more, and the reports give the figures the issue asks for."""
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    dependable = importlib.import_module("experiments.stability.dependable")
    horizon = importlib.import_module("experiments.truth.horizon")
    out, path = tmp_path / "v", tmp_path / "t.csv"
    common = [*TINY_ARGS, "--out", str(out), "--table", str(path)]
    assert dependable.main([*common, "--method", "default", "--search-seeds", "0,1"]) == 0
    report = json.loads((out / "shallow" / "dependable-default.json").read_text())
    assert [r["search_seed"] for r in report["rows"]] == [0, 1] and all(len(r["valid"]) == 1 for r in report["rows"])
    rows = table.read_table(path)
    assert {r.genotype for r in rows} == {r["placements"] for r in report["rows"]}
    assert horizon.main([*common, "--multipliers", "1,2", "--genotypes", "searched,all-post", "--seeds", "1"]) == 0
    h = json.loads((out / "horizon.json").read_text())[0]
    assert [b["steps"] for b in h["budgets"]] == [12, 24] and h["budgets"][1]["best_baseline"] == "all-post"
    assert "searched" in h["budgets"][1]["gaps"] and (out / "horizon.png").is_file()
    assert sorted({r.steps for r in table.read_table(path)}) == [12, 24]
    before = len(table.read_table(path))
    trained = []
    monkeypatch.setattr("autoln.retrain.compare.retrain_one", lambda *a: trained.append(a))
    assert dependable.main([*common, "--method", "default", "--search-seeds", "0,1"]) == 0  # all reused
    assert trained == [] and len(table.read_table(path)) == before
    capsys.readouterr()


def test_the_race_replay_draws_the_ground_truth_sample_and_no_searched_genotype():
    from autoln.oneshot.fidelity import sample_genotypes

    cands = ["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"]
    stream = [" ".join(g) for g in sample_genotypes(5, 6, cands, 0)]
    searched = "post pre post deepnorm peri peri"  # a race's answer with seed-0 rows like the sample's
    assert searched not in stream
    have = {*stream[:3], stream[4], searched, "pre pre pre pre pre pre"}
    assert race_replay.random_sample(have, cands, 6, 0) == stream[:3]  # the measured prefix; g03 missing ends it
    assert race_replay.random_sample(set(), cands, 6, 0) == []


def test_the_check_run_runs_the_simulated_race_for_real_and_agrees_where_the_retrains_agree(tmp_path, monkeypatch):
    """``race_replay.py --check-run``: the real race (retrains faked to return the table's own
    values) runs job by job until the plan is done, finds the simulated answer and every value."""
    from argparse import Namespace

    from autoln.race import rule as R
    from autoln.models.genotype import baseline
    from autoln.race.run_race import job_config, named_specs, rule_of

    cfg = race_replay.setting_config("shallow", TINY_ARGS[3::2], str(ROOT / "configs" / "tiny.yaml"))
    cands, n, full, fp = cfg.model.searched_candidates(), cfg.model.n_layers, cfg.retrain.steps, "f" * 12
    space = "+".join(cands)
    named = {k: baseline(k, cfg.model, 256).describe() for k in named_specs(cands)}
    sample = [" ".join(cands[(i + j) % len(cands)] for j in range(n)) for i in range(3)]  # no uniform placement (n > 1)
    value = {g: 2.0 + 0.1 * i for i, g in enumerate([*sample, *named.values()])}

    def row_of(placements: str, job) -> "table.Row":
        jcfg = job_config(cfg, job)
        return table.Row("shallow", space, placements, jcfg.retrain.seed, job.steps, jcfg.retrain.final_eval_windows,
                         value[placements] + 0.01 * job.seed - 0.001 * job.steps, 0.0, 10.0 * job.steps,
                         table.config_id(jcfg.to_dict(), fp), "abc123")

    rows = [row_of(named.get(e, e), R.Job(e, steps, i)) for e in [*sample, *named]
            for steps in R.rung_steps(full, rule_of(cfg)) for i in range(rule_of(cfg).final_seeds)]
    path, check = tmp_path / "t.csv", tmp_path / "check.csv"
    table.append_rows(rows, path)
    folder = tmp_path / "replay"
    s = race_replay.Setup("shallow", space, cfg, 256, fp, named, sample, [], 1e9, folder,
                          race_replay.TableRetrains("shallow", space, path, folder, fp))
    ran = []
    monkeypatch.setattr(race_replay, "task_of", lambda s, job, folder: job)
    monkeypatch.setattr(race_replay, "run_tasks",
                        lambda jobs, t, w: ran.extend(jobs) or [row_of(named.get(j.entry, j.entry), j) for j in jobs])
    report = race_replay.check_run(s, Namespace(check_run=0, seed=0, out=str(tmp_path), check_table=check, workers=1))
    sim_entries, sim_plan, sim_values, _ = race_replay.simulate(s, 0, 0, False)
    assert "the same" in report and "differ by at most 0.0000" in report
    assert sorted(j.key for j in ran) == sorted(sim_values) and sim_plan.done
