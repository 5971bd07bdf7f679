"""search.py's race with proposal rounds (race.proposer; autoln.race.schedule, autoln.race.propose)
on a tiny search over three blocks: each entry's origin in race.json and the verdict, a stop and
resume in a proposal round, the random proposer replayed from its own retrains, and two workers
on one storage."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoln import cli
from autoln.config import load_config
from autoln.models.genotype import Genotype
from autoln.oneshot.run_search import run_search
from autoln.race import run_race
from autoln.race.propose import Space, make_proposer
from autoln.race.rule import Entry, Job
from autoln.race.schedule import run

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
CANDS = ("pre", "post", "deepnorm")


def corpus_text() -> str:
    """A fixed text of about 40 kB (500 lines of 12 words from a fixed list, drawn by a seeded
    generator): a corpus no edit elsewhere in the repository changes, so the tiny search, its
    shortlist and the rounds it leaves room for stay what the tests count."""
    words = "the race decides where layer norms go every retrain is a row seeds paired by seed".split()
    rng = np.random.default_rng(0)
    return "\n".join(" ".join(words[i] for i in rng.integers(len(words), size=12)) for _ in range(500))


def tiny(tmp: Path, *sets: str) -> list[str]:
    text = tmp / "text.txt"
    if not text.exists():
        text.write_text(corpus_text(), encoding="utf-8")
    return ["--config", TINY, "--set", f"data.corpus={text}", "--set", f"data.cache_dir={tmp / 'cache'}", "--set", "model.n_layers=3",
            "--set", "search.steps=30", "--set", "search.eval_every=15", "--set", "search.arch_warmup_steps=6",
            "--set", "retrain.steps=30", "--set", "retrain.eval_every=15", "--set", "logging.progress=false", *sets]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A finished tiny search over three blocks (27 genotypes; its race not run)."""
    tmp = tmp_path_factory.mktemp("proposals")
    args = tiny(tmp)
    run_search(load_config(TINY, [a for a in args[2:] if a != "--set"]), tmp / "search")
    return tmp, args


def copy(searched, name: str) -> Path:
    shutil.copytree(searched[0] / "search", searched[0] / name)
    return searched[0] / name


def placements_of(setup, entry: str) -> str:
    """An entry's placements: the pool's, else its genotype file's (a proposed entry)."""
    return next((e.placements for e in setup.entries if e.name == entry), None) or Genotype.load(setup.specs[entry]).describe()


def rigged_value(placements: str, steps: int) -> float:
    """One good site (``deepnorm`` in block 1; in block 0 it is bad), ``post`` a little worse anywhere."""
    words = placements.split()
    return 3.0 + 3.0 / steps - 0.5 * (words[1] == "deepnorm") + 0.3 * (words[0] == "deepnorm") + 0.05 * words.count("post")


def rigged(monkeypatch, stop_at: str | None = None) -> None:
    """run_job returns :func:`rigged_value` (plus a per-seed wobble), stopping as on SIGTERM at the
    entry ``stop_at``."""
    from autoln.engine.checkpoint import Interrupted

    def fake(setup, job):
        if job.entry == stop_at:
            raise Interrupted(signal.SIGTERM, f"stopped the race during {job.entry} at {job.steps} steps, seed {job.seed}")
        return rigged_value(placements_of(setup, job.entry), job.steps) + 0.002 * ((job.seed * 7) % 3), {"wall_time_s": 0.0}
    monkeypatch.setattr(run_race, "run_job", fake)


PROPOSE = ["--set", "race.proposals=2", "--set", "race.budget=4"]


def jobs_of(folder: Path) -> list[tuple]:
    record = json.loads((folder / "race" / "race.json").read_text())
    return [(j["entry"], j["placements"], j["steps"], j["seed"], j["value"]) for j in record["jobs"]]


def test_proposed_entries_say_where_they_came_from_and_a_stop_in_a_round_resumes_to_the_same_answer(searched, monkeypatch, capsys):
    whole, stopped = copy(searched, "tpe-whole"), copy(searched, "tpe-stopped")
    args = [*searched[1], *PROPOSE, "--set", "race.proposer=tpe", "--resume"]
    rigged(monkeypatch)
    assert cli.search_main([*args, "--out", str(whole)]) == 0
    record = json.loads((whole / "race" / "race.json").read_text())
    proposed = [e for e in record["pool"] if e["origin"].startswith("proposed by tpe")]
    assert [e["name"] for e in proposed] == ["tpe1-1", "tpe1-2", "tpe2-1", "tpe2-2"]  # 4 full retrains: round 0 and two rounds
    assert {e["origin"] for e in record["pool"]} >= {"named", "the supernet's read-off", "proposed by tpe at round 2"}
    for e in proposed:
        assert Genotype.load(whole / "race" / "pool" / f"{e['name']}.json").describe() == e["placements"]
    assert [r["round"] for r in record["rungs"] if "round" in r][-1] == 2
    v = record["verdict"]
    assert v["outcome"] == "searched-wins" and v["placements"].split()[1] == "deepnorm"
    assert (v["origin"].startswith("proposed by tpe") == ("proposed by tpe" in v["line"]))
    assert Genotype.load(whole / "genotype.json").describe() == v["placements"]
    capsys.readouterr()
    rigged(monkeypatch, stop_at="tpe2-1")
    assert cli.search_main([*args, "--out", str(stopped)]) == 143
    assert not (stopped / "race" / "race.json").exists()
    rigged(monkeypatch)
    assert cli.search_main([*args, "--out", str(stopped)]) == 0
    assert json.loads((stopped / "race" / "race.json").read_text())["verdict"] == v
    assert jobs_of(stopped) == jobs_of(whole)


def test_the_random_proposer_s_race_is_replayed_from_its_own_retrains(searched, monkeypatch):
    """``race.proposer=random`` enters no supernet genotype; the race replayed in this process
    (:func:`autoln.race.schedule.run`, values looked up by placements, the same seeded proposer)
    asks for exactly the retrains the real one ran and gives its answer: how
    ``experiments/race/proposer_replay.py`` simulates random search."""
    out = copy(searched, "random")
    rigged(monkeypatch)
    assert cli.search_main([*searched[1], *PROPOSE, "--set", "race.proposer=random", "--resume", "--out", str(out)]) == 0
    record = json.loads((out / "race" / "race.json").read_text())
    assert all(e["kind"] == "named" or e["origin"].startswith("proposed by random") for e in record["pool"])
    value = {(j["placements"], j["steps"], j["seed"]): j["value"] for j in record["jobs"]}
    named = [Entry(e["name"], e["placements"], "named") for e in record["pool"] if e["kind"] == "named"]
    cfg = load_config(TINY, [a for a in searched[1][2:] if a != "--set"])
    proposer = make_proposer("random", Space(CANDS, 3), cfg.retrain.seed)
    rule = run_race.rule_of(load_config(TINY, [a for a in [*searched[1], *PROPOSE][2:] if a != "--set"] + ["race.proposer=random"]))
    names: dict = {e.name: e.placements for e in named}

    def measure(job: Job) -> float:
        return value[(names[job.entry], job.steps, job.seed)]

    import autoln.race.schedule as S
    from autoln.race.verdict import verdict

    original = S.plan

    def plan(*a, **k):  # the proposed entries' placements, as the runner learns them
        p = original(*a, **k)
        names.update({e.name: e.placements for e in p.proposed})
        return p
    monkeypatch.setattr(S, "plan", plan)
    p, values = run(named, cfg.retrain.steps, rule, measure, propose=proposer)
    assert sorted((names[k[0]], k[1], k[2]) for k in values) == sorted(value)  # the same retrains, none more
    assert verdict(p.finalists, values, cfg.retrain.steps, rule).answer.placements == record["verdict"]["placements"]


def test_two_workers_with_proposals_run_each_retrain_once_and_what_the_plan_asks(searched):
    """Two worker processes on one journal: every retrain once (a log each), exactly the retrains
    the plan asks for given the values they measured (replayed in this process with the same
    seeded proposer), a proposal round among them."""
    from autoln.race.rule import make_pool

    two = copy(searched, "local-two")
    sets = ["--set", "race.proposals=2", "--set", "race.budget=3.5", "--set", "race.proposer=local"]
    cmd = [sys.executable, str(ROOT / "search.py"), *searched[1], *sets, "--resume", "--out", str(two), "--workers", "2"]
    b = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert b.returncode == 0, b.stderr[-2000:]
    record = json.loads((two / "race" / "race.json").read_text())
    jobs = jobs_of(two)
    assert len(list((two / "race" / "logs").glob("*.txt"))) == len(jobs)  # every retrain ran in one worker, once
    assert any(j[0].startswith("local1-") for j in jobs)
    cfg = load_config(TINY, [a for a in [*searched[1], *sets][2:] if a != "--set"])
    pool = [Entry(e["name"], e["placements"], e["kind"]) for e in record["pool"] if not e["origin"].startswith("proposed")]
    entries, _ = make_pool([(e.name, e.placements) for e in pool if e.kind == "searched"],
                           [(e.name, e.placements) for e in pool if e.kind == "named"])
    probs = Genotype.load(two / "supernet_genotype.json").site_probabilities()
    proposer = make_proposer("local", Space(CANDS, 3, probs), cfg.retrain.seed)
    value = {(j[0], j[2], j[3]): j[4] for j in jobs}
    _, values = run(entries, cfg.retrain.steps, run_race.rule_of(cfg), lambda job: value[job.key], propose=proposer)
    assert sorted(values) == sorted(value)  # the plan, replayed on the workers' values, asks for these retrains and no other


def test_race_genotypes_enters_proposed_genotypes_into_a_user_s_model():
    """The API's race with ``RaceRule(proposer="ridge")``: proposals are site genotypes of the
    user's model, derived and trained like any entry; one with the rigged good site wins."""
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from gpt import GPT, GPTConfig

    import autoln
    from autoln.api import searchable_sites
    from autoln.race.rule import RaceRule

    def build():
        return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=False, norm_candidates=CANDS))

    sites = [n for n, _ in searchable_sites(build())]
    searched = autoln.SiteGenotype(list(CANDS), dict(zip(sites, ["post", "post", "pre", "post"])), {s: [0.3, 0.4, 0.3] for s in sites})

    def evaluate(model):  # deepnorm at the second site is good, elsewhere bad; a little seed noise
        placements = [next(iter(m.placements)) for m in model.modules() if isinstance(m, autoln.Site)]
        return 2.0 - 1.0 * (placements[1] == "deepnorm") + 0.3 * placements.count("deepnorm") + 0.05 * torch.rand(()).item()

    trained = []
    outcome = autoln.race_genotypes(build, searched, train=lambda m, s, n: trained.append(n), evaluate=evaluate, steps=90,
                                    rule=RaceRule(proposer="ridge", proposals=2, budget=4), progress=False)
    pool = {e["name"]: e for e in outcome.record["pool"]}
    assert pool["ridge1-1"]["origin"] == "proposed by ridge at round 1"
    assert outcome.verdict.answer.placements.split()[1] == "deepnorm" and outcome.verdict.outcome == "searched-wins"
    assert outcome.record["verdict"]["origin"].startswith("proposed by ridge")
    assert outcome.genotype.describe() == outcome.verdict.answer.placements
