"""Every experiment script under experiments/ imports and parses its command line on this code:
its ``main(["--help"])`` prints its usage and exits 0 (a script left behind by a change in the
package fails here, not in the middle of a session's experiment)."""

import contextlib
import csv
import io
from pathlib import Path

import pytest

from tests.conftest import experiment_script, shared_path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(f"{p.parent.name}/{p.stem}" for p in (ROOT / "experiments").glob("*/*.py") if p.stem != "__init__")
LIBRARIES = {"common/retrain_table", "common/halving", "common/lasts"}  # modules the scripts share; retrain_table has subcommands


def test_every_script_is_listed():
    assert len(SCRIPTS) >= 25 and "race/proposer_replay" in SCRIPTS and "truth/truth_longer" in SCRIPTS


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in LIBRARIES])
def test_a_script_s_help(name):
    module = experiment_script(name)
    assert callable(getattr(module, "main", None)), f"experiments/{name}.py has no main()"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and "usage:" in out.getvalue(), f"experiments/{name}.py --help: {out.getvalue()[-500:]}"


def test_own_model_race_runs_a_tiny_race_end_to_end(tmp_path, monkeypatch):
    """``own_model_race.py``'s race, the script that stopped before its race when the API first
    called ``evaluate`` on an untrained model (its ``evaluate`` reads what its ``train`` leaves),
    run for real at a tiny size: one layer of width 16, 12 steps, the search's answer given."""
    import dataclasses

    import autoln

    m = experiment_script("race/own_model_race")
    text = tmp_path / "input.txt"
    text.write_text("".join(chr(97 + (i * 7 + i // 5) % 11) for i in range(6000)), encoding="utf-8")
    data = m.load_data(text)

    @dataclasses.dataclass
    class Tiny(m.Recipe):
        steps: int = 12
        batch_size: int = 4
        warmup: int = 2

    monkeypatch.setattr(m, "Recipe", Tiny)
    monkeypatch.setattr(m, "SIZE", dict(n_layer=1, n_embd=16, n_head=2, block_size=8, bias=False))
    monkeypatch.setattr(m, "TABLE", tmp_path / "truth.csv")
    monkeypatch.setattr(m, "table_values", lambda path=None: {})
    cands = m.SETS["3"]
    monkeypatch.setattr(m, "search_answer", lambda c, seed, d, vocab, recipe, *a, **k: autoln.SiteGenotype(
        list(cands), {"transformer.h.0.attn_site": "post", "transformer.h.0.mlp_site": "deepnorm"},
        {"transformer.h.0.attn_site": [0.2, 0.5, 0.3], "transformer.h.0.mlp_site": [0.2, 0.3, 0.5]}))
    row = m.race_one("3", 0, (data[0], data[1]), data[2])
    assert row["outcome"] in ("searched-wins", "named-wins", "tie") and row["verdict"].startswith("answer: ")
    rows = (tmp_path / "truth.csv").read_text().count("\n") - 1  # every retrain a row of the table, the fresh seeds' too
    assert len(row["fresh_answer"].split(" / ")) == 3 and int(row["retrains"]) >= 3 and rows >= int(row["retrains"])


def test_final_replay_trains_a_missing_fresh_seed_alone(tmp_path, monkeypatch):
    """``final_replay.py``'s retrain of a fresh seed (6 at 4x the budget) trains that seed, with
    ``retrain.seed`` at 6 and one seed, not seeds 0 to 6 (each 4000-step retrain is 15-25 minutes)."""
    m = experiment_script("race/final_replay")
    calls = []

    class Fake(m.Retrains):
        def __init__(self):  # the setting's config without reading a corpus
            from experiments.common.validate import setting_config

            self.setting, self.table, self.out = "shallow", tmp_path / "t.csv", tmp_path
            self.cfg = setting_config("shallow", ["logging.progress=false"], None)
            self.done = {}

        def values(self, placements):
            return self.done

    rt = Fake()

    def compare(cfg, setting, files, named, seeds, folder, table):
        calls.append((cfg.retrain.seed, seeds, named, folder.name))
        rt.done[cfg.retrain.seed - rt.cfg.retrain.seed] = 1.5

    monkeypatch.setattr("experiments.common.retrain_table.compare_with_table", compare)
    assert rt.value("mix-ln", "pre pre", 6) == 1.5
    assert calls == [(rt.cfg.retrain.seed + 6, 1, ["mix-ln"], "seed6")]


def test_the_race_s_horizon_line_on_a_replayed_final():
    """``--lasts 4``'s verdict with ``race.horizons=[1, 4]`` (``experiments/common/lasts.py``) on
    ``shallow7-seed0``'s final (``final_replays.csv``) and its 4000-step values at seeds 0-2
    (``retrains.csv``): the race's own line, the gap 0.0042 within mix-ln's standard deviation
    0.0047 (by hand), so the lead does not last; then a lead that does, and the agreement words."""
    from experiments.common.lasts import agreement, horizon_verdict

    at_1 = {"searched": [2.3525, 2.3497, 2.3352], "mix-ln": [2.4405, 2.4476, 2.4496]}
    at_4 = {"searched": [1.87115, 1.87486, 1.87982], "mix-ln": [1.86818, 1.86869, 1.87653]}
    v = horizon_verdict("post pre post deepnorm peri peri", ("mix-ln", "post post pre pre pre pre"), at_1, at_4, 4, 1000, "bits/byte")
    assert v.answer.name == "searched" and v.horizons[-1]["lead"] == "level"
    assert v.line.endswith("at 4000 steps level, within one standard deviation (searched 1.8753 ± 0.0043, mix-ln 1.8711 ± 0.0047 "
                           "bits/byte): the lead at 1000 steps does not last)")
    assert agreement(v, [1.85, 1.86, 1.87], [1.851, 1.861, 1.871]) == "its horizon line (level) agrees with the fresh seeds (level)"
    assert agreement(v, [1.80, 1.81, 1.80], [1.85, 1.86, 1.85]).startswith("its horizon line (level) does NOT agree")
    at_4["mix-ln"] = [x + 0.01 for x in at_4["mix-ln"]]  # mix-ln 0.0058 behind: more than either standard deviation
    assert horizon_verdict("post pre post deepnorm peri peri", ("mix-ln", "post post pre pre pre pre"), at_1, at_4, 4, 1000,
                           "bits/byte").line.endswith("at 4000 steps still ahead (searched 1.8753 ± 0.0043, mix-ln 1.8811 ± 0.0047 bits/byte))")
    at_1["searched"] = [2.4505, 2.4476, 2.4496]  # behind at seed 0: no horizon is trained, and the check says so
    assert agreement(horizon_verdict("x", ("mix-ln", "y"), at_1, at_4, 4, 1000, ""), [1.0], [1.0]).startswith("the verdict has no horizon line")


def test_a_final_replayed_seed_by_seed_stops_where_the_table_s_final_stopped():
    """``final_seeds`` (``experiments/common/lasts.py``, used by ``final_replay.py`` and
    ``own_model_race.py --lasts``) on each replayed final of ``experiments/final_replays.csv``,
    its values read at full precision from ``retrains.csv`` (the replays' csv rounds to 4 digits,
    and ``shallow3-seed0``'s seed 0 differs by 0.00002, below that): it asks for exactly the seeds
    the final ran (a later seed raises IndexError) and ends as the final did (``win`` for a
    searched win)."""
    import csv

    from autoln.race.rule import RaceRule
    from experiments.common.lasts import final_seeds
    from experiments.common.retrain_table import read_table

    named = {"mix-ln": "post post pre pre pre pre", "all-post": "post post post post post post"}
    table = {}  # a named placement's rows may lie under another space of the setting: the same model
    for t in read_table(ROOT / "experiments" / "retrains.csv"):
        if t.steps == 1000:
            table.setdefault((t.setting, t.genotype, t.seed), t.valid)
    with open(ROOT / "experiments" / "final_replays.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["rule"] == "r3"]
    assert {r["final"] for r in rows} >= {"shallow7-seed2", "shallow7-seed0", "shallow3-seed0", "highlr3-seed0"}
    for r in rows:
        n = int(r["seeds"])
        mine, theirs = ([table[(r["setting"], g, i)] for i in range(n)] for g in (r["searched"], named[r["named"]]))
        assert [f"{v:.4f}" for v in mine] == r["searched_values"].split(" / "), r["final"]
        assert [f"{v:.4f}" for v in theirs] == r["named_values"].split(" / "), r["final"]
        seen = []
        a, b, state = final_seeds(mine.__getitem__, theirs.__getitem__, RaceRule().design, lambda *x: seen.append(x))
        assert (a, b) == (mine, theirs), r["final"]
        assert state == ("win" if r["outcome"] == "searched-wins" else "lose"), r["final"]
        assert [x[0] for x in seen] == list(range(n)) and seen[-1][3] == state


def test_final_replay_s_horizon_line_reads_the_final_at_full_precision(tmp_path, monkeypatch):
    """``final_replay.py --lasts 4`` on ``shallow3-seed0``, from the tables alone (training
    anything fails the test): its final's seed 0 is 2.44046 against ``mix-ln``'s 2.44053, a lead
    of 0.00007 that ``final_replays.csv``'s 4 digits round away (read from there, the final would
    stop at seed 0 with no horizon line); at full precision it wins at 5 seeds and its horizon line
    (seeds 0-2 at 4000 steps: 1.8835, 1.8763, 1.8876 against 1.8682, 1.8687, 1.8765) is behind, as
    the fresh seeds are."""
    import argparse
    import shutil

    m = experiment_script("race/final_replay")
    data = shared_path("wikitext-2")
    table = tmp_path / "table.csv"
    shutil.copy(ROOT / "experiments" / "retrains.csv", table)
    monkeypatch.setattr("experiments.common.retrain_table.compare_with_table", lambda *a, **k: pytest.fail("trained a retrain"))
    lines = m.lasts("shallow3-seed0", 4, argparse.Namespace(data=str(data), table=table, out=str(tmp_path / "out"))).splitlines()
    assert lines[0] == "[lasts] shallow3-seed0 at 4000 steps, fresh seeds 6 7 8: searched 1.8783 ± 0.0037, mix-ln 1.8679 ± 0.0041: behind (+0.0103)"
    assert "(beats mix-ln at 1000 steps, 5 seeds: searched 2.4321 ± 0.0109, mix-ln 2.4422 ± 0.0064 bits/byte;" in lines[1]
    assert lines[1].endswith("at 4000 steps behind (searched 1.8825 ± 0.0057, mix-ln 1.8711 ± 0.0047 bits/byte): the lead at 1000 "
                             "steps does not last)")
    assert lines[2] == "[lasts] shallow3-seed0: its horizon line (behind) agrees with the fresh seeds (behind)"


def test_proposer_replay_reads_today_s_shallow_answer_at_the_proposers_fresh_seeds():
    """The fixed shortlist's answer at ``shallow``-7, the yardstick of the adoption rule: a final of
    ``final_replays.csv`` (search seeds 0 and 2: its searched winner's fresh seeds 6-8), else the
    race of ``races.csv`` (search seed 1: ``mix-ln``, read at the seeds 6-8 the proposers' answers
    are read at, not at ``races.csv``'s 3-5)."""
    from types import SimpleNamespace

    m = experiment_script("race/proposer_replay")
    calls = []
    stub = SimpleNamespace(full=1000, named=lambda: {"mix-ln": "post post pre pre pre pre"},
                           cands=("pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"), value=lambda g, i, steps, name: calls.append((g, i, steps)) or 2.0 + i / 100)
    assert m.Shallow.today(stub, 0) == {"answer_genotype": "post pre post deepnorm peri peri", "fresh_answer": "2.3173 / 2.3562 / 2.3393"}
    assert m.Shallow.today(stub, 2)["answer_genotype"] == "post lns none deepnorm peri none" and not calls
    assert m.Shallow.today(stub, 1) == {"answer_genotype": "post post pre pre pre pre", "fresh_answer": "2.0600 / 2.0700 / 2.0800"}
    assert calls == [("post post pre pre pre pre", i, 1000) for i in (6, 7, 8)]


@pytest.mark.parametrize("text", ["pre pre pre deepnorm outnorm outnorm outnorm outnorm | qk qk-all qk-all qk-all",
                                  "post post post post post post post post"])
def test_qk_norm_reads_a_race_s_answer_back_to_the_genotype_it_trains(text):
    """``qk_norm.py --fresh`` retrains a race's answer from its text: the text round-trips, and a
    text without QK choices has none."""
    m = experiment_script("truth/qk_norm")
    g = m.with_qk(text, m.Trainer(m.CANDS, None, 65, m.QK, 1e-3))
    assert g.describe() == text and len(g.qk) == 4 and (set(g.qk.values()) == {"none"}) == ("|" not in text)
    with pytest.raises(ValueError, match="expected 4 QK choices, got 2"):
        m.with_qk("pre pre pre pre pre pre pre pre | qk qk", m.Trainer(m.CANDS, None, 65, m.QK, 1e-3))


@pytest.mark.parametrize("multiplier, steps, tag", [(1, 500, "qk-fresh"), (4, 2000, "qk-lasts4")])
def test_qk_norm_s_fresh_check_retrains_the_answer_and_the_finalist_it_beat(monkeypatch, multiplier, steps, tag):
    """``--fresh`` / ``--lasts 4``: the race's answer and the named finalist its verdict names, at
    seeds 6-8 and ``multiplier`` times the 500-step budget."""
    m = experiment_script("truth/qk_norm")
    calls = []
    answer = "post post post post post post post post | qk qk qk qk"  # 0.05 ahead of every named one at every seed and budget
    monkeypatch.setattr(m.Trainer, "value", lambda self, g, s, n, name: calls.append((g.describe(), s, n, name))
                        or 2.0 + s / 100 - 0.05 * (g.describe() == answer))
    row = {"lr": "0.003", "search_seed": "0", "answer_genotype": answer,
           "verdict": "answer: top2 = ... (beats qwen3 at 500 steps, 4 seeds: ...)"}
    line = m.fresh(row, None, 65, multiplier)
    assert [c[1:3] for c in calls[:6]] == [(s, steps) for s in (6, 7, 8)] * 2
    if multiplier > 1:  # the final again at 500 steps, seed by seed (the differences all -0.05: a win at the first look, 3
        # seeds), then both finalists at seeds 0-2 at 2000 steps, and the race's horizon line
        assert [c[1:3] for c in calls[6:]] == [(s, 500) for s in (0, 0, 1, 1, 2, 2)] + [(s, 2000) for s in (0, 1, 2)] * 2
        said = line.splitlines()[1]
        assert said.startswith(f"[qk-lasts4] lr 0.003: the race's verdict with race.horizons=[1, 4]: answer: searched = {answer}")
        assert said.endswith("at 2000 steps still ahead (searched 1.9600 ± 0.0100, qwen3 2.0100 ± 0.0100 nats/char))")
        assert line.splitlines()[2] == "[qk-lasts4] lr 0.003: its horizon line (ahead) agrees with the fresh seeds (ahead)"
    else:
        assert len(calls) == 6
    assert calls[0][0] == row["answer_genotype"] and calls[3][0] == "pre pre pre pre pre pre pre pre | qk qk qk qk"
    assert calls[3][3] == f"{tag}:lr=0.003:qwen3" and line.startswith(f"[{tag}] lr 0.003, search seed 0, {steps} steps")


def _share_rows(proposer, shares, own, fixed, sd=0.01):
    """Share rows for ``proposer``: ``shares`` and ``own``/``fixed`` fresh means by setting, one per
    search seed, each answer's three fresh values ``mean - sd, mean, mean + sd`` (standard deviation ``sd``)."""
    rows = []
    for setting, seeds in (("nanoGPT-7", range(5)), ("shallow-7", range(3))):
        for s in seeds:
            if s >= len(shares[setting]):
                continue
            rows.append({"setting": setting, "proposer": proposer, "search_seed": str(s), "answer_genotype": "x",
                         "share": str(shares[setting][s]), "runs": "500", "worth": "2.0",
                         "fresh": " ".join(str(own[setting][s] + k * sd) for k in (-1, 0, 1)), "fixed_genotype": "y",
                         "fixed_fresh": " ".join(str(fixed[setting][s] + k * sd) for k in (-1, 0, 1))})
    return rows


def test_the_adoption_rule_on_rigged_shares(tmp_path):
    """The rule of docs/results.md on rigged rows: 70 % pooled in both settings, not behind the fixed
    shortlist on the mean nor at any search seed by more than the larger standard deviation, the
    highest mean share wins, an unfinished proposer holds the decision unless a finished setting
    already rules it out."""
    m = experiment_script("race/proposer_rule")
    level = {"nanoGPT-7": [2.0] * 5, "shallow-7": [2.0] * 3}
    ahead = {"nanoGPT-7": [1.99] * 5, "shallow-7": [1.99] * 3}
    rows = (_share_rows("good", {"nanoGPT-7": [0.7] * 5, "shallow-7": [1.0, 0.55, 0.55]}, level, level)  # 70 % exactly
            + _share_rows("best", {"nanoGPT-7": [0.8] * 5, "shallow-7": [0.8] * 3}, ahead, level)
            + _share_rows("lowsh", {"nanoGPT-7": [1.0] * 5, "shallow-7": [0.6, 0.7, 0.79]}, ahead, level)  # 69.7 %
            + _share_rows("behind", {"nanoGPT-7": [1.0] * 5, "shallow-7": [1.0] * 3},
                          {"nanoGPT-7": [1.9] * 5, "shallow-7": [1.9, 2.02, 1.9]}, level)  # ahead on the mean, behind at seed 1
            + _share_rows("ruled", {"nanoGPT-7": [0.5] * 5, "shallow-7": [1.0]}, level, level))  # shallow-7 unfinished
    default, st = m.adopt(rows)
    by = {s.proposer: s for s in st}
    assert default == "best" and by["good"].qualifies and by["best"].qualifies
    assert by["lowsh"].reasons == ["shallow-7: beats random search in 69.7 % of the pairs, below 70 %"]
    assert by["behind"].reasons == ["shallow-7: at search seed 1 behind the fixed shortlist's answer by 0.0200, more than "
                                    "the larger standard deviation 0.0100"]
    assert by["ruled"].decided and not by["ruled"].qualifies and by["ruled"].missing == {"shallow-7": [1, 2]}
    assert m.adopt(rows + _share_rows("open", {"nanoGPT-7": [0.9] * 5, "shallow-7": [0.9]}, level, level))[0] is None
    lagging = _share_rows("lag", {"nanoGPT-7": [0.9] * 5, "shallow-7": [0.9] * 3}, level, ahead)
    assert m.adopt(lagging)[0] == "none" and m.adopt(lagging)[1][0].reasons[0] == \
        "nanoGPT-7: behind the fixed shortlist on the mean at fresh seeds (2.0000 against 1.9900)"
    path = tmp_path / "shares.csv"
    m_replay = experiment_script("race/proposer_replay")
    m_replay.save_shares(path, rows[:2])
    m_replay.save_shares(path, [dict(rows[0], share="0.25")] + rows[2:4])
    back = m.read_shares(path)
    assert len(back) == 4 and back[0]["share"] == "0.25" and [r["search_seed"] for r in back] == ["0", "1", "2", "3"]
    assert "the default becomes race.proposer=best" in m.report(*m.adopt(rows))
    path.write_text("setting,proposer\nx,y\n")
    with pytest.raises(SystemExit, match="lacks the columns"):
        m.read_shares(path)


def test_the_adoption_rule_on_the_measured_nanogpt_shares():
    """The rule on ``proposer_shares.csv``'s nanoGPT-7 rows (written by ``proposer_replay.py own-model
    --report`` from the tables): the shares docs/results.md reports, 70 % for ``local``, ``tpe`` and
    ``prior`` (met), 60 % for ``ridge`` and ``gp`` (ruled out whatever ``shallow``-7 gives), and no
    answer behind the fixed shortlist's at the fresh seeds."""
    m = experiment_script("race/proposer_rule")
    rows = [r for r in m.read_shares(m.SHARES) if r["setting"] == "nanoGPT-7"]
    st = {s.proposer: s for s in m.adopt(rows)[1]}
    assert {p: round(100 * s.shares["nanoGPT-7"], 6) for p, s in st.items()} == {"local": 70, "ridge": 60, "tpe": 70, "gp": 60, "prior": 70}
    assert all(st[p].reasons == [] and not st[p].decided for p in ("local", "tpe", "prior"))
    assert all(st[p].reasons == ["nanoGPT-7: beats random search in 60.0 % of the pairs, below 70 %"] and st[p].decided for p in ("ridge", "gp"))
    races = {(r["proposer"], r["search_seed"]): r["answer_genotype"] for r in csv.DictReader(open(ROOT / "experiments" / "proposer_races.csv"))
             if r["setting"] == "nanoGPT-7"}
    assert {(r["proposer"], r["search_seed"]): r["answer_genotype"] for r in rows} == races
