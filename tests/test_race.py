"""The race (autoln.race.rule: the rule; autoln.race.run_race: search.py's race on an Optuna study;
autoln.race_genotypes: a user's model): a rule counted by hand, rigged evaluations, a stop and
resume, two workers on one storage."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from autoln import cli
from autoln.race import run_race
from autoln.config import load_config
from autoln.models.genotype import Genotype
from autoln.race.rule import Entry, RaceRule, finalists_of, make_pool, rung_steps
from autoln.race.schedule import plan, run
from autoln.race.verdict import paired_p, verdict
from autoln.oneshot.run_search import run_search

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


# --- the rule, counted by hand -------------------------------------------------------------------


def test_rung_steps_end_at_the_full_budget():
    assert rung_steps(1000, RaceRule()) == [111, 333, 1000]
    assert rung_steps(500, RaceRule()) == [56, 167, 500]
    assert rung_steps(150, RaceRule(eta=2, rungs=4)) == [19, 38, 75, 150]
    assert rung_steps(2, RaceRule()) == [1, 2]  # rungs of one step merge
    with pytest.raises(ValueError, match="final_seeds >= 2"):
        RaceRule(final_seeds=1)


def test_pool_enters_each_genotype_once_the_named_one_first():
    entries, aliases = make_pool([("read-off", "post pre"), ("argmax", "pre pre"), ("top1", "post post")],
                                 [("all-pre", "pre pre"), ("mix-ln", "post pre")], own=("own", "pre post"))
    assert [(e.name, e.kind, e.own) for e in entries] == [("own", "named", True), ("all-pre", "named", False),
                                                          ("mix-ln", "named", False), ("top1", "searched", False)]
    assert aliases == {"read-off": "mix-ln", "argmax": "all-pre"}
    with pytest.raises(ValueError, match="share a name"):
        make_pool([("a", "x")], [("a", "y")])


def test_finalists_are_the_best_named_the_own_and_the_searched_survivor():
    named = [Entry("n1", "a", "named"), Entry("n2", "b", "named"), Entry("own", "e", "named", own=True)]
    at = {"n1": 2.0, "n2": 1.0, "own": 9.0}
    assert [x.name for x in finalists_of([Entry("s2", "d", "searched")], named, at)] == ["n2", "own", "s2"]
    assert [x.name for x in finalists_of([], named, {**at, "n2": 3.0})] == ["n1", "n2", "own"]  # no searched: two best named
    assert [x.name for x in finalists_of([], named, {**at, "n2": math.nan})] == ["n1", "own"]  # a diverged one ranks last


def test_the_curtailed_final_follows_from_student_s_t():
    import numpy as np
    from scipy.stats import t

    # a search over paired differences of 3 seeds with one of them >= 0: the t statistic never drops below -2
    rng = np.random.default_rng(0)
    d = np.concatenate([np.abs(rng.normal(size=(20000, 1))) * rng.choice([0, 1e-3, 1], size=(20000, 1)),
                        rng.normal(size=(20000, 2)) * rng.choice([0.01, 1, 100], size=(20000, 1)) - rng.choice([0, 1, 10], size=(20000, 1))], axis=1)
    stats = np.sqrt(3) * d.mean(axis=1) / d.std(axis=1, ddof=1)
    assert stats.min() >= -2 - 1e-9 and stats.min() < -1.99

    # one difference d_1 >= 0 among n: the paired t statistic is at least -(n - 1), e.g. d = (0, -x, -x) gives exactly -2
    assert paired_p([1.0, 0.0, 0.0], [1.0, 1.0, 1.0]) == pytest.approx(float(t.cdf(-2.0, 2)))
    assert float(t.cdf(-2.0, 2)) == pytest.approx(0.0918, abs=1e-4) and 0.0918 > 0.05  # so n = 3 at level 0.05 stops
    from autoln.race.sequential import Design, decide, reachable

    three = Design(3, 3, 0.05)  # one look at 3 seeds: the t statistic must reach t(0.05, 2) = -2.920
    assert three.t_bound(3) == pytest.approx(-2.919986, abs=1e-6)
    assert decide([0.0], three) == "lose" and decide([-1.0, 0.5], three) == "lose"  # one difference >= 0: t >= -2
    assert decide([-1.0, -0.5], three) == "go on" and decide([-1.0], three) == "go on"
    assert decide([-1.0, 0.0], Design(2, 2, 0.05)) == "lose"
    assert reachable([-1.0, 0.0], 4, Design(4, 4, 0.05).t_bound(4))  # -3 < t(0.05, 3) = -2.353: four seeds could still pass
    assert reachable([-1.0, 0.0], 3, Design(3, 3, 0.1).t_bound(3))  # -2 < t(0.1, 2) = -1.886
    assert not reachable([-1.0, 0.0], 3, three.t_bound(3))


#: A table counted by hand: 5 named and 5 searched entries, 1000 steps, eta 3. Rung 111 runs the
#: searched ones and keeps ceil(5/3) = 2 (top1, top2); rung 333 keeps the best one (top1). Beside
#: them the 5 named run at 1000 steps, seed 0: the best there (all-outnorm, which a short rung
#: would have judged by its slow start) and top1 go to the final at seeds 0, 1, 2.
TABLE = {
    ("read-off", 111, 0): 3.40, ("argmax", 111, 0): 3.30, ("top1", 111, 0): 3.00, ("top2", 111, 0): 3.10, ("top3", 111, 0): 3.20,
    ("top1", 333, 0): 2.75, ("top2", 333, 0): 2.76,
    ("all-pre", 1000, 0): 2.350, ("all-post", 1000, 0): 2.420, ("all-deepnorm", 1000, 0): 2.450, ("mix-ln", 1000, 0): 2.380,
    ("all-outnorm", 1000, 0): 2.336, ("all-outnorm", 1000, 1): 2.331, ("all-outnorm", 1000, 2): 2.341,
    ("top1", 1000, 0): 2.320, ("top1", 1000, 1): 2.322, ("top1", 1000, 2): 2.318,
}
NAMED = ("all-pre", "all-post", "all-deepnorm", "mix-ln", "all-outnorm")
#: Revision r2's final: one look, the plain paired t-test over 3 seeds (``max_seeds == final_seeds``).
R2 = RaceRule(max_seeds=3)
POOL = [Entry(n, p, "named") for n, p in zip(NAMED, "abcde")] + \
    [Entry(n, p, "searched") for n, p in zip(("read-off", "argmax", "top1", "top2", "top3"), "fghij")]


def test_the_rule_against_a_table_counted_by_hand():
    rule = R2
    first = plan(POOL, {}, 1000, rule)
    assert [j.key for j in first.pending] == [(n, 1000, 0) for n in NAMED] + \
        [(n, 111, 0) for n in ("read-off", "argmax", "top1", "top2", "top3")] and not first.done  # the long jobs first
    second = plan(POOL, {k: v for k, v in TABLE.items() if k[1] == 111 or k[2] == 0 and k[0] in NAMED}, 1000, rule)
    assert [j.key for j in second.pending] == [("top1", 333, 0), ("top2", 333, 0)]
    third = plan(POOL, {k: v for k, v in TABLE.items() if k[1] < 1000}, 1000, rule)  # the short rungs done, the named not yet
    assert [j.key for j in third.pending] == [(n, 1000, 0) for n in NAMED] + [("top1", 1000, 0)]  # the survivor's seed 0 beside them
    fourth = plan(POOL, {k: v for k, v in TABLE.items() if k[2] == 0 and k[:2] != ("top1", 333)}, 1000, rule)
    assert [j.key for j in fourth.pending] == [("top1", 333, 0)]
    done = plan(POOL, TABLE, 1000, rule)
    assert done.done and [e.name for e in done.finalists] == ["all-outnorm", "top1"] and done.seeds == 3
    assert done.rungs[0] == {"steps": 111, "entries": ["read-off", "argmax", "top1", "top2", "top3"], "survivors": ["top1", "top2"]}
    assert done.rungs[1] == {"steps": 333, "entries": ["top1", "top2"], "survivors": ["top1"]}
    assert done.rungs[2] == {"steps": 1000, "entries": list(NAMED), "seeds": 1, "named": True, "survivors": ["all-outnorm"]}
    assert done.rungs[3] == {"steps": 1000, "entries": ["all-outnorm", "top1"], "seeds": 3}
    v = verdict(done.finalists, TABLE, 1000, rule, "bits/byte")
    # differences top1 - all-outnorm: -0.016, -0.009, -0.023: mean -0.016, sd 0.007, t = -0.016 / (0.007 / sqrt 3) = -3.959;
    # one-sided p of Student's t with 2 degrees of freedom at -3.959: 0.5 * (1 - t / sqrt(t^2 + 2)) = 0.02913
    assert v.p_value == pytest.approx(0.5 * (1 - 3.959 / math.sqrt(3.959 ** 2 + 2)), abs=2e-4)
    assert v.answer.name == "top1" and v.outcome == "searched-wins"
    assert v.line.startswith("answer: top1 = h (beats all-outnorm at 1000 steps, 3 seeds: top1 2.3200 ± 0.0020, "
                             "all-outnorm 2.3360 ± 0.0050")
    strict = verdict(done.finalists, TABLE, 1000, RaceRule(level=0.01, max_seeds=3), "bits/byte")  # the same values at a stricter level: a tie
    assert strict.answer.name == "all-outnorm" and strict.outcome == "tie" and "tied with it" in strict.line
    measured = []
    p, values = run(POOL, 1000, rule, lambda job: measured.append(job.key) or TABLE[job.key])
    assert p.done and sorted(measured) == sorted(TABLE) and values == TABLE  # exactly the table's retrains, once each


def test_a_searched_finalist_behind_at_seed_0_ends_the_final_there():
    behind = {k: v for k, v in TABLE.items() if k[2] == 0}
    behind[("top1", 1000, 0)] = 2.336  # level with all-outnorm at seed 0: not ahead
    measured = []
    p, values = run(POOL, 1000, R2, lambda job: measured.append(job.key) or behind[job.key])
    assert p.done and p.seeds == 1 and p.rungs[-1]["seeds"] == 1 and sorted(measured) == sorted(behind)  # no seed 1 or 2
    v = verdict(p.finalists, values, 1000, R2, "bits/byte")
    assert v.answer.name == "all-outnorm" and v.outcome == "named-wins" and v.p_value is None
    assert v.line == ("answer: all-outnorm (no searched placement beat it at 1000 steps, seed 0: best searched top1 2.3360, "
                      "all-outnorm 2.3360 bits/byte; level with it at seed 0, it could not pass a one-sided paired t-test at level "
                      "0.05 over 3 seeds, so the final stopped there)")
    later = {**TABLE, ("top1", 1000, 1): 2.331}  # ahead at seed 0, level at seed 1: the final stops after two seeds
    measured = []
    p2, values2 = run(POOL, 1000, R2, lambda job: measured.append(job.key) or later[job.key])
    assert p2.seeds == 2 and ("top1", 1000, 2) not in measured and ("all-outnorm", 1000, 2) not in measured
    v2 = verdict(p2.finalists, values2, 1000, R2, "bits/byte")
    # ahead on the mean over 2 seeds but one difference is 0: t >= -2 at 3 seeds, no boundary within reach: a tie
    assert v2.answer.name == "all-outnorm" and v2.outcome == "tie" and "no boundary of a one-sided paired t-test at level 0.05 " \
        "over 3 seeds within reach at 2 seeds, so the final stopped there" in v2.line
    four = RaceRule(final_seeds=4, max_seeds=4)  # where four seeds could still pass (t >= -3 < -2.353), the final goes on
    p4, _ = run(POOL, 1000, four, lambda job: later.get(job.key, 2.3))
    assert p4.seeds == 4 and p4.rungs[-1]["seeds"] == 4
    p5, _ = run(POOL, 1000, four, lambda job: behind.get(job.key, 2.3))  # not ahead on the mean at seed 0: futility, at once
    assert p5.seeds == 1
    with pytest.raises(KeyError):  # a final that could not stop needs every seed
        verdict(p.finalists, {**values, ("top1", 1000, 0): 2.30}, 1000, R2)


def test_paired_p_edge_cases():
    assert paired_p([1, 2, 3], [2, 3, 4]) == 0.0  # every difference -1: no spread, a lower a
    assert paired_p([2, 3, 4], [1, 2, 3]) == 1.0
    assert paired_p([1, math.nan, 1], [2, 2, 2]) == 1.0  # a diverged run of the searched side never wins
    assert paired_p([1, 1, 1.1], [2, math.inf, 2]) == 0.0


# --- search.py's race on the tiny config -----------------------------------------------------------


def tiny(tmp, *sets):
    text = tmp / "text.txt"
    if not text.exists():
        text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 3, encoding="utf-8")
    return ["--config", TINY, "--set", f"data.corpus={text}", "--set", f"data.cache_dir={tmp / 'cache'}",
            "--set", "search.steps=30", "--set", "search.eval_every=15", "--set", "search.arch_warmup_steps=6",
            "--set", "retrain.steps=30", "--set", "retrain.eval_every=15", "--set", "logging.progress=false", *sets]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A finished tiny search (its race not run): the folder and its command-line arguments."""
    tmp = tmp_path_factory.mktemp("race")
    args = tiny(tmp)
    sets = [a for a in args[2:] if a != "--set"]
    cfg = load_config(TINY, sets)
    run_search(cfg, tmp / "search")
    return tmp, args


def copy(searched, name: str) -> Path:
    tmp, _ = searched
    shutil.copytree(tmp / "search", tmp / name)
    return tmp / name


def rigged(monkeypatch, values: dict[str, float]) -> list:
    """run_job returns ``values[entry]`` (plus a tiny per-seed wobble) instead of retraining."""
    calls = []

    def fake(setup, job):
        calls.append(job.key)
        return values.get(job.entry, 9.0) + 0.001 * ((job.seed * 7) % 3), {"run": "rigged", "wall_time_s": 0.0}
    monkeypatch.setattr(run_race, "run_job", fake)
    return calls


def test_a_rigged_baseline_win_is_the_answer_and_says_so(searched, monkeypatch, capsys):
    out = copy(searched, "baseline-wins")
    rigged(monkeypatch, {"all-deepnorm": 1.0})
    assert cli.search_main([*searched[1], "--out", str(out), "--resume"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "answer: all-deepnorm (no searched placement beat it at 30 steps" in text
    g = Genotype.load(out / "genotype.json")
    assert g.describe() == "deepnorm deepnorm" and g.provenance["race"]["answer"] == "all-deepnorm"
    searched_over = Genotype.load(out / "supernet_genotype.json").candidates
    assert g.candidates == searched_over == ["pre", "post", "deepnorm"]  # what was searched, not the answer's own placements
    assert g.probabilities == [[0.0, 0.0, 1.0]] * 2
    assert g.provenance["race"]["outcome"] == "named-wins" and (out / "supernet_genotype.json").exists()
    record = json.loads((out / "race" / "race.json").read_text())
    assert record["verdict"]["answer"] == "all-deepnorm" and record["rule"].startswith("synchronous successive halving")
    said = next(line for line in captured.err.splitlines() if line.startswith("  rungs: "))
    kinds = {e["name"]: e["kind"] for e in record["pool"]}
    ran = {kind: {j["steps"] for j in record["jobs"] if kinds[j["entry"]] == kind and j["seed"] == 0} for kind in ("searched", "named")}
    assert rung_line_steps(said) == ran  # the printout's rungs are the ones race.json holds
    assert (out / "race" / "race.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "race" / "verdict"), size_guidance={"tensors": 0})
    acc.Reload()
    shown = acc.Tensors("race/verdict/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert shown.startswith(record["verdict"]["line"])  # the verdict in TensorBoard's TEXT tab, not only the HParams table
    # retrain.py takes the answer as it is
    assert cli.retrain_main(["--genotype", str(out / "genotype.json"), *searched[1], "--set", "retrain.steps=2",
                             "--set", "retrain.eval_every=2", "--set", "retrain.warmup_steps=0", "--out", str(out / "retrain")]) == 0


def test_a_searched_genotype_that_wins_beyond_the_rule_is_the_answer(searched, monkeypatch, capsys):
    out = copy(searched, "searched-wins")
    record = Genotype.load(out / "genotype.json").describe()
    named = {"all-pre": 3.0, "all-post": 3.1, "all-deepnorm": 3.2, "mix-ln": 3.3, "pre-post": 3.4}
    rigged(monkeypatch, {**named, "read-off": 2.0, "argmax": 2.0, "top1": 2.0, "top2": 2.0, "top3": 2.0})
    assert cli.search_main([*searched[1], "--out", str(out), "--resume"]) == 0
    g = Genotype.load(out / "genotype.json")
    race = g.provenance["race"]
    assert race["outcome"] == "searched-wins" and race["p_value"] < 0.05 and not race["answer"].startswith("all-")
    assert "beats all-pre at 30 steps" in capsys.readouterr().out
    if record not in {"pre pre", "post post", "deepnorm deepnorm", "post pre", "pre post"}:
        assert race["answer"] == "read-off" and g.describe() == record


@pytest.fixture(scope="module")
def whole(searched):
    """The race of the tiny search run without a stop, by one worker."""
    out = copy(searched, "whole")
    subprocess.run([sys.executable, str(ROOT / "search.py"), *searched[1], "--resume", "--out", str(out)], check=True,
                   capture_output=True, cwd=ROOT, timeout=600)
    return out


def test_a_stopped_race_resumes_to_the_same_answer(searched, whole):
    stopped = copy(searched, "stopped")
    cmd = [sys.executable, str(ROOT / "search.py"), *searched[1], "--resume"]
    proc = subprocess.Popen([*cmd, "--out", str(stopped)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((stopped / "race" / "logs").glob("*.txt"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    text = err.decode()
    assert "stopped the race during" in text and "--resume" in text and str(stopped) in text.split("continue with:")[-1]
    assert "Traceback" not in text  # one line, not Optuna's report of the failed trial
    assert not (stopped / "race" / "race.json").exists() and not (stopped / "genotype.json").exists()  # no answer yet
    again = subprocess.run([*cmd, "--out", str(stopped)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = (json.loads((f / "race" / "race.json").read_text()) for f in (whole, stopped))
    assert a["verdict"] == b["verdict"]
    assert [(j["entry"], j["steps"], j["seed"], j["value"]) for j in a["jobs"]] == \
           [(j["entry"], j["steps"], j["seed"], j["value"]) for j in b["jobs"]]


#: Paired differences (searched minus named) per final seed that cross no boundary of the default
#: final at 3 or 4 seeds (t = -2.52 against -9.39; -2.93 against -4.12) and cross it at 5 (t = -3.92
#: against -2.87): the sequential final runs seeds 0-4 and the searched finalist wins there.
SEQUENTIAL = (-0.02, -0.005, -0.03, -0.01, -0.02, -0.015)


def sequential_job(stop_at: Optional[int] = None):
    """A rigged ``run_job``: named placements 3.0 plus a seed's noise, searched entries
    :data:`SEQUENTIAL` below them; at the final's seed ``stop_at`` it stops as ``run_job`` does
    on SIGTERM (the retrain's stop signals raise :class:`Interrupted`, which ``run_job`` words)."""
    from autoln.engine.checkpoint import Interrupted

    noise = (0.004, -0.002, 0.001, 0.003, -0.001, 0.002)

    def fake(setup, job):
        named = job.entry.startswith("all-") or job.entry in ("mix-ln", "pre-post")
        if stop_at is not None and job.seed == stop_at:
            raise Interrupted(signal.SIGTERM, f"stopped the race during {job.entry} at {job.steps} steps, seed {job.seed}")
        return 3.0 + noise[job.seed] + (0.0 if named else SEQUENTIAL[job.seed]), {"run": "rigged", "wall_time_s": 0.0}
    return fake


def test_a_sequential_final_stopped_at_seed_4_resumes_to_the_same_answer(searched, monkeypatch, capsys):
    whole_out, stopped = copy(searched, "sequential-whole"), copy(searched, "sequential-stopped")
    monkeypatch.setattr(run_race, "run_job", sequential_job())
    assert cli.search_main([*searched[1], "--out", str(whole_out), "--resume"]) == 0
    record = json.loads((whole_out / "race" / "race.json").read_text())
    assert record["verdict"]["outcome"] == "searched-wins" and "5 seeds" in capsys.readouterr().out
    assert max(j["seed"] for j in record["jobs"]) == 4  # the final stopped at its win, seed 5 never ran
    monkeypatch.setattr(run_race, "run_job", sequential_job(stop_at=4))
    assert cli.search_main([*searched[1], "--out", str(stopped), "--resume"]) == 143
    assert not (stopped / "race" / "race.json").exists()
    monkeypatch.setattr(run_race, "run_job", sequential_job())
    assert cli.search_main([*searched[1], "--out", str(stopped), "--resume"]) == 0
    again = json.loads((stopped / "race" / "race.json").read_text())
    assert again["verdict"] == record["verdict"]
    assert [(j["entry"], j["steps"], j["seed"], j["value"]) for j in again["jobs"]] == \
           [(j["entry"], j["steps"], j["seed"], j["value"]) for j in record["jobs"]]


def test_horizons_retrain_the_finalists_longer_and_say_whether_the_lead_lasts():
    """TABLE's final (top1 ahead of all-outnorm at 3 seeds, rule r2's single look) with
    horizons (1, 4): the two finalists run at 4000 steps, 3 seeds each, and the line says how
    the lead moved; the answer stays the one at the full budget."""
    rule = RaceRule(max_seeds=3, horizons=(1, 4))
    done = plan(POOL, TABLE, 1000, rule)
    assert not done.done and [j.key for j in done.pending] == [(e, 4000, i) for i in range(3) for e in ("top1", "all-outnorm")]
    assert done.rungs[-1] == {"steps": 4000, "entries": ["top1", "all-outnorm"], "seeds": 3, "horizon": 4}
    gone = {**TABLE, **{("top1", 4000, i): 1.880 + 0.001 * i for i in range(3)}, **{("all-outnorm", 4000, i): 1.870 + 0.002 * i for i in range(3)}}
    assert plan(POOL, gone, 1000, rule).done
    v = verdict(plan(POOL, gone, 1000, rule).finalists, gone, 1000, rule, "bits/byte")
    assert v.answer.name == "top1" and v.outcome == "searched-wins"  # the answer at the user's budget
    assert v.horizons[0]["lead"] == "behind" and v.horizons[0]["steps"] == 4000
    assert v.line.endswith("; at 4000 steps behind (top1 1.8810 ± 0.0010, all-outnorm 1.8720 ± 0.0020 bits/byte): "
                           "the lead at 1000 steps does not last)")
    lasts = {**TABLE, **{("top1", 4000, i): 1.860 + 0.001 * i for i in range(3)}, **{("all-outnorm", 4000, i): 1.870 for i in range(3)}}
    w = verdict(plan(POOL, lasts, 1000, rule).finalists, lasts, 1000, rule, "bits/byte")
    assert w.horizons[0]["lead"] == "ahead" and "; at 4000 steps still ahead (top1 1.8610 ± 0.0010" in w.line
    assert "does not last" not in w.line
    behind = {k: v for k, v in TABLE.items() if k[2] == 0}
    behind[("top1", 1000, 0)] = 2.40  # behind at seed 0: nothing to last, no horizon retrain
    p, values = run(POOL, 1000, rule, lambda job: behind[job.key])
    assert p.done and not any(k[1] == 4000 for k in values)
    from autoln.race.schedule import most_steps

    assert most_steps(POOL, 1000, rule) - most_steps(POOL, 1000, R2) == 2 * 3 * 4000
    with pytest.raises(ValueError, match="horizons"):
        RaceRule(horizons=(2, 4))


def test_the_horizon_line_of_search_py_on_a_lead_that_vanishes_at_4x(searched, monkeypatch, capsys):
    out = copy(searched, "horizon")
    fake = sequential_job()

    def longer(setup, job):  # at 4x the budget the named placements pull ahead of every searched one
        value, info = fake(setup, job)
        named = job.entry.startswith("all-") or job.entry in ("mix-ln", "pre-post")
        return (value - (0.05 if named else 0.0) if job.steps > 30 else value), info
    monkeypatch.setattr(run_race, "run_job", longer)
    assert cli.search_main([*searched[1], "--out", str(out), "--resume", "--set", "race.horizons=[1, 4]"]) == 0
    text = capsys.readouterr().out
    record = json.loads((out / "race" / "race.json").read_text())
    assert record["verdict"]["outcome"] == "searched-wins" and record["verdict"]["horizons"][0]["lead"] == "behind"
    assert sorted({j["steps"] for j in record["jobs"]})[-1] == 120 and sum(j["steps"] == 120 for j in record["jobs"]) == 6
    assert "at 120 steps behind" in text and "the lead at 30 steps does not last" in text


def test_two_workers_on_one_storage_run_each_retrain_once(searched, whole):
    two = copy(searched, "two")
    cmd = [sys.executable, str(ROOT / "search.py"), *searched[1], "--resume"]
    proc = subprocess.run([*cmd, "--out", str(two), "--workers", "2"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = (json.loads((f / "race" / "race.json").read_text()) for f in (whole, two))
    assert [(j["entry"], j["steps"], j["seed"]) for j in a["jobs"]] == [(j["entry"], j["steps"], j["seed"]) for j in b["jobs"]]
    for x, y in zip(a["jobs"], b["jobs"]):  # one thread each instead of two: equal up to the order of float sums
        assert x["value"] == pytest.approx(y["value"], rel=1e-4)
    logs = sorted(p.name for p in (two / "race" / "logs").glob("*.txt"))
    assert len(logs) == len(b["jobs"])  # every retrain ran in one worker, once


def test_race_config_defaults_are_the_rule_s():
    """race.* in the configuration (the config layer, below the race) and RaceRule (the API's
    rule) hold the same defaults: search.py's race and race_genotypes' race are one rule."""
    from autoln.config import Config

    assert run_race.rule_of(Config()) == RaceRule()


def test_race_settings_are_checked_by_name(tmp_path):
    from autoln.core.errors import ConfigError

    for key, value, words in (("race.final_seeds", 1, "race.final_seeds must be at least 2"),
                              ("race.eta", 1, "race.eta must be at least 2"), ("race.level", 0.5, "race.level must be in (0, 0.5)"),
                              ("race.max_seeds", 2, "race.max_seeds must be at least race.final_seeds (3"),
                              ("race.spending", "linear", "race.spending must be one of ['obrien-fleming', 'pocock']")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            load_config(TINY, [f"{key}={value}"])


# --- the API's race on a user's model ----------------------------------------------------------------


def test_race_genotypes_keeps_the_model_s_own_placement_in_the_final(capsys):
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from gpt import GPT, GPTConfig

    import autoln

    cands = ("pre", "post", "deepnorm")

    def build():
        return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=False, norm_candidates=cands))

    from autoln.api import searchable_sites

    sites = [n for n, _ in searchable_sites(build())]
    searched = autoln.SiteGenotype(list(cands), dict(zip(sites, ["post", "deepnorm", "post", "deepnorm"])),
                                   {s: [0.2, 0.5, 0.3] for s in sites})
    # a rigged evaluation: every model scores by its placements, the own Pre-LN best; train does nothing
    score = {"pre": 1.0, "post": 2.0, "deepnorm": 3.0}
    seen = []

    def evaluate(model):
        placements = [next(iter(m.placements)) for m in model.modules() if isinstance(m, autoln.Site)]
        return sum(score[p] for p in placements) / len(placements) + 0.01 * torch.rand(()).item()

    outcome = autoln.race_genotypes(build, searched, train=lambda m, s, n: seen.append((s, n)), evaluate=evaluate, steps=90,
                                    unit="nats/char")
    # stderr is no terminal here, as in a redirected log: a line per retrain, its value in the unit given, the steps done
    # out of the race's most (6 at 90 steps, then up to 3 finalists x 5 more seeds: 1890) and the time left at most
    import re

    lines = [ln for ln in capsys.readouterr().err.splitlines() if " steps, seed " in ln and "answer:" not in ln]
    found = [re.fullmatch(r"autoln\.race_genotypes: \S+ at 90 steps, seed 0: \d\.\d{4} nats/char \((\d+)/1890 steps at most, "
                          r"at most about \d\d:\d\d left\)", ln) for ln in lines]
    assert all(found) and [int(m.group(1)) for m in found] == [90 * k for k in range(1, 7)], "\n".join(lines)
    assert outcome.verdict.answer.name == "all-pre" and outcome.verdict.answer.own
    assert outcome.genotype.describe() == "pre pre pre pre" and outcome.genotype.provenance["race"]["answer"] == "all-pre"
    # 6 entries (argmax = all-post): the one searched entry (read-off) skips the short rungs; the five named run at 90 steps,
    # seed 0, and the best (all-pre, the own) meets read-off in the final, where read-off is behind at seed 0: the final stops
    assert outcome.plan.rungs[0] == {"steps": 90, "entries": ["all-pre", "all-post", "all-deepnorm", "mix-ln", "pre-post"],
                                     "seeds": 1, "named": True, "survivors": ["all-pre"]}
    assert outcome.plan.rungs[1] == {"steps": 90, "entries": ["all-pre", "read-off"], "seeds": 1}
    assert seen == [(0, 90)] * 6 and [e.name for e in outcome.plan.finalists] == ["all-pre", "read-off"]
    assert "so the final stopped there" in outcome.verdict.line
    with pytest.raises(ValueError, match="own: 'peri' is not among"):
        autoln.race_genotypes(build, searched, train=lambda m, s, n: None, evaluate=evaluate, steps=9, own="peri")


def test_race_genotypes_refuses_bad_arguments_before_any_training(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    from gpt import GPT, GPTConfig

    import autoln
    from autoln.api import searchable_sites
    from autoln.core.errors import GenotypeError

    cands = ("pre", "post")

    def build():
        return GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=7, bias=False, norm_candidates=cands))

    sites = [n for n, _ in searchable_sites(build())]
    good = autoln.SiteGenotype(list(cands), {s: "post" for s in sites}, {s: [0.4, 0.6] for s in sites})
    trained = []
    kw = dict(train=lambda m, s, n: trained.append(n), evaluate=lambda m: 1.0, steps=9, progress=False)
    for bad, error, words in ((dict(searched=None), GenotypeError, "searched: expected an autoln.SiteGenotype"),
                              (dict(searched=[good]), GenotypeError, "searched: expected"),
                              (dict(searched=good, baselines="mix-ln"), ValueError, "baselines: expected a list of names"),
                              (dict(searched=good, rule={"eta": 2}), ValueError, "rule: expected an autoln.race.rule.RaceRule"),
                              (dict(searched=good, values={"x": 1.0}), ValueError, "values: expected")):
        with pytest.raises(error, match=words):
            autoln.race_genotypes(build, **bad, **kw)
    misfit = autoln.SiteGenotype(list(cands), {"foo": "pre"}, {"foo": [1.0, 0.0]})
    with pytest.raises(GenotypeError, match="bad: "):
        autoln.race_genotypes(build, {"good": good, "bad": misfit}, **kw)
    assert trained == []  # all refused before the first training
    with pytest.raises(ValueError, match=r"evaluate returned None \(NoneType\): expected a number"):
        autoln.race_genotypes(build, good, train=lambda m, s, n: None, evaluate=lambda m: None, steps=9, progress=False)
    good.save(tmp_path / "g.json")  # a genotype file is taken as the searched genotype
    out = autoln.race_genotypes(build, str(tmp_path / "g.json"), train=lambda m, s, n: None, evaluate=lambda m: 1.0, steps=9,
                                progress=False)
    assert out.verdict.answer.name == "all-pre"  # every value equal: no searched genotype beats the own placement
    from autoln.core.errors import DivergenceError

    with pytest.raises(DivergenceError, match="every finalist of the race diverged"):
        autoln.race_genotypes(build, good, train=lambda m, s, n: None, evaluate=lambda m: float("nan"), steps=9, progress=False)


def test_a_job_two_workers_enqueued_at_once_runs_in_the_earliest_trial_only():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    for entry in ("top3", "top3", "mix-ln"):  # two workers read the same plan and both enqueued top3
        study.enqueue_trial({"entry": entry, "steps": 3, "seed": 0})
    key = ("top3", 3, 0)
    assert [run_race.job_key(t.system_attrs) for t in study.trials] == [key, key, ("mix-ln", 3, 0)]
    assert not run_race.held_before(study, 0, key) and run_race.held_before(study, 1, key)
    assert not run_race.held_before(study, 2, ("mix-ln", 3, 0)) and run_race.job_key({}) is None
    ran = []

    def objective(trial):
        if run_race.stands_down(study, trial):
            raise optuna.TrialPruned()
        ran.append((trial.number, trial.suggest_categorical("entry", ["top3", "mix-ln"])))
        return 1.0

    study.optimize(objective, n_trials=4)  # the fourth has no queued job: it stands down as well
    assert ran == [(0, "top3"), (2, "mix-ln")] and len(study.trials) == 4
    study.enqueue_trial({"entry": "top3", "steps": 3, "seed": 0})  # a late copy of a finished job stands down too
    assert run_race.held_before(study, 4, key)


def test_most_steps_is_the_work_of_a_race_whose_searched_finalist_leads_at_every_seed():
    """The bound behind the race's time left: 5 searched and 5 named entries at (1000, eta 3,
    3 rungs) take 5 * 111 + 2 * 333 + 6 * 1000 + 3 * 2 * 1000 steps when no final stops early,
    and fewer when the searched finalist is behind at seed 0."""
    from autoln.race.schedule import most_steps, steps_done

    entries = [Entry(f"s{i}", f"s{i}", "searched") for i in range(5)] + [Entry("all-pre", "p", "named", True)] \
        + [Entry(f"n{i}", f"n{i}", "named") for i in range(4)]
    assert most_steps(entries, 1000, R2) == 5 * 111 + 2 * 333 + 6 * 1000 + 3 * 2 * 1000 == 13221
    assert most_steps(entries, 1000, RaceRule()) == 5 * 111 + 2 * 333 + 6 * 1000 + 3 * 5 * 1000 == 22221  # up to 6 seeds
    rank = {"s0": 1.0, "n1": 1.5, "all-pre": 1.7}
    _, values = run(entries, 1000, RaceRule(), lambda job: rank.get(job.entry, 2.0))
    assert steps_done(values) == 13221
    rank["s0"] = 1.8  # behind both named finalists at seed 0: the final stops after its first seed
    _, values = run(entries, 1000, RaceRule(), lambda job: rank.get(job.entry, 2.0))
    assert steps_done(values) == 13221 - 3 * 2 * 1000
    three = entries[:3]  # a pool of three goes to the final at once: every entry, every seed
    assert most_steps(three, 90, RaceRule()) == 3 * 90 * 3


# --- degenerate values: a rounding difference is no lead, the words fit the numbers -----------------

def _api_race(evaluate, **kw):
    """The API's race on a tiny GPT with a rigged ``evaluate`` (``train`` does nothing)."""
    sys.path.insert(0, str(ROOT / "examples"))
    from gpt import GPT, GPTConfig

    import autoln
    from autoln.api import searchable_sites

    cands = ("pre", "post", "deepnorm")

    def build():
        return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=False, norm_candidates=cands))

    sites = [n for n, _ in searchable_sites(build())]
    searched = autoln.SiteGenotype(list(cands), dict(zip(sites, ["post", "deepnorm", "post", "deepnorm"])), {s: [0.2, 0.5, 0.3] for s in sites})
    return autoln.race_genotypes(build, searched, train=lambda m, s, n: None, evaluate=evaluate, steps=9, progress=False, **kw)


def _placements(model):
    import autoln

    return [next(iter(m.placements)) for m in model.modules() if isinstance(m, autoln.Site)]


def rung_line_steps(line: str) -> dict[str, set[int]]:
    """The steps a pool's rung line (:func:`autoln.race.schedule.rungs_text`) names, by who runs
    them: ``searched`` (the searched entries' rounds) and ``named``."""
    parts = line.split("; ")
    searched = {int(n) for part in parts if "searched" in part or "proposed" in part for n in re.findall(r"at (\d+)", part)}
    named = {int(n) for part in parts if " named at " in part for n in re.findall(r"at (\d+)", part)}
    return {"searched": searched, "named": named}


@pytest.mark.parametrize("searched", [1, 2, 3, 4, 5, 7, 10])
def test_the_rung_line_names_exactly_the_rungs_the_race_runs(searched):
    """With 3 searched entries at eta 3 the best of the 111-step rung is alone: the line says
    111 then 1000, not the 333 that never runs; with 5, 111, 333 and 1000."""
    from autoln.race.schedule import rungs_text

    pool = [Entry(n, p, "named") for n, p in zip(NAMED, "abcde")] + [Entry(f"s{i}", f"x{i}", "searched") for i in range(searched)]
    line = rungs_text(pool, 1000, R2)
    p, values = run(pool, 1000, R2, lambda job: 2.0 + 0.01 * int(job.entry[1:]) if job.entry[0] == "s" else 2.5)
    ran = {k[1] for k in values if k[0].startswith("s") and k[2] == 0}
    assert rung_line_steps(line) == {"searched": ran, "named": {1000}}
    assert ran == {1: {1000}, 2: {111, 1000}, 3: {111, 1000}, 4: {111, 333, 1000}, 5: {111, 333, 1000}}.get(searched, ran)
    if searched == 3:
        assert line.startswith("3 searched at 111 steps, the best 1 at 1000; 5 named at 1000;") and "333" not in line


def test_a_searched_entry_lower_by_float_rounding_does_not_win():
    """1e-12 below the named placements at every seed: below the values' resolution (1e-6), no
    lead: the named placement is the answer, level with the searched one, no p = 0."""
    def evaluate(model):  # the searched read-off (post deepnorm post deepnorm) 1e-12 below every named placement
        return 1.0 - (1e-12 if _placements(model) == ["post", "deepnorm", "post", "deepnorm"] else 0.0)

    out = _api_race(evaluate)
    assert out.verdict.outcome == "named-wins" and out.verdict.answer.name == "all-pre"
    assert "level with it at seed 0" in out.verdict.line and "p = 0" not in out.verdict.line


def test_equal_values_are_level_not_behind():
    out = _api_race(lambda m: 2.0)
    assert out.verdict.outcome == "named-wins" and "level with it at seed 0" in out.verdict.line
    assert "behind" not in out.verdict.line


def test_every_finalist_diverged_names_the_api_s_remedy_not_config_keys():
    from autoln.core.errors import DivergenceError

    with pytest.raises(DivergenceError, match="lower your train loop's learning rate") as e:
        _api_race(lambda m: float("nan"))
    assert "retrain.lr" not in str(e.value)


def test_ties_and_leads_below_the_resolution():
    from autoln.race.sequential import Design, decide, resolved
    from autoln.race.verdict import lead
    from autoln.retrain.ranking import RESOLUTION, is_tie, vs_best

    assert RESOLUTION == 1e-6 and resolved([-1e-12, -2e-6, 5e-7]) == [0.0, -2e-6, 0.0]
    assert decide([-1e-12] * 6, Design(3, 6, 0.05, "obrien-fleming")) == "lose"  # before: t = -inf, a win
    assert decide([-0.01] * 3, Design(3, 6, 0.05, "obrien-fleming")) == "win"
    assert paired_p([1.0 - 1e-12] * 3, [1.0] * 3) == 1.0 and paired_p([0.99] * 3, [1.0] * 3) == 0.0
    assert lead([1.0] * 3, [1.0 + 1e-12] * 3) == "level" and lead([1.0] * 3, [1.1] * 3) == "ahead"
    assert is_tie([1.0, 1.0], [1.0 + 1e-12] * 2) and is_tie([1.0], [1.0 + 1e-9]) and not is_tie([1.0, 1.0], [1.1, 1.1])
    assert vs_best(1e-12, 0.0, 2, False) == "+0.0000 (tie: equal)" and vs_best(0.1, 0.0, 2, False) == "+0.1000"


def test_the_answer_asked_for_before_the_race_ends_names_the_race_and_the_read_off(searched, capsys):
    """The README's next commands run while the race goes on: genotype.json is not there yet
    (supernet_genotype.json is), and both retrain.py and --compare say why, in one line."""
    out = copy(searched, "racing")
    run_race.supernet_file(out)  # what the race does when it begins: genotype.json becomes supernet_genotype.json
    answer = str(out / "genotype.json")
    assert cli.retrain_main(["--genotype", answer, *searched[1], "--out", str(out / "r")]) == 2
    assert cli.retrain_main(["--compare", "--genotype", answer, *searched[1], "--out", str(out / "c")]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "no such file" in line]
    assert len(said) == 2  # one line each
    for line in said:
        assert f"--genotype {answer!r}: no such file yet: the race of the search in {out} has not finished" in line
        assert "search.py --resume --out" in line and f"meanwhile {out / 'supernet_genotype.json'} holds the supernet's read-off" in line
    assert not (out / "r").exists() and not (out / "c").exists()
