"""``search.py``'s race: the supernet's shortlist against the named placements, decided by real
retrains (docs/design.md §10; the rule is :mod:`autoln.race.rule`).

After the search the command enters into a pool the supernet's read-off (``genotype.json``,
kept as ``supernet_genotype.json``), the argmax of its final probabilities, its best
``race.top_k`` whole genotypes by one-hot score, and the named placements of the searched
candidates (``all-<candidate>``, ``mix-ln`` and ``pre-post`` when ``pre`` and ``post`` are
candidates), each genotype once. Every retrain of the race is one trial of an Optuna study,
enqueued when :func:`autoln.race.rule.plan` asks for it, and run as ``retrain.py`` runs it (the
``retrain`` settings at the rung's length, seed ``retrain.seed`` plus the seed index) in
``<search>/race/<entry>/steps<S>-seed<i>``. The study lives on ``tune.storage`` (an RDB: several
machines sharing the run folder) or in the journal file ``<search>/race/study.journal``;
``--workers N`` runs N worker processes on this machine. A killed race continues with
``search.py --resume``: finished retrains are read from the study, an interrupted one continues
from its checkpoint.

When the race is done the command writes, in the search folder:

- ``genotype.json``: the answer (a named placement, or the searched genotype that beat it), the
  verdict in its ``provenance.race``; ``retrain.py --genotype`` takes it as it is;
- ``race/race.json``: the rule, the pool, every rung and retrain (entry, steps, seed, value,
  wall time) and the verdict; ``race/race.png`` (:mod:`autoln.race.figure`): the short rungs, the
  full-budget entries and the final's paired seeds, the verdict as its caption; TensorBoard's
  HParams table of the entries in ``race/hparams`` and the verdict as text in ``race/verdict``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence


from autoln.engine.checkpoint import CHECKPOINT_FILE, Interrupted
from autoln.core.commands import resume_command
from autoln.retrain.compare import retrain_one
from autoln.config import Config
from autoln.data import HEADLINE, UNITS, load_corpus
from autoln.core.errors import OutputError
from autoln.models.genotype import QK_NAMED, named_qk
from autoln.models.genotype import BASELINES, Genotype, baseline, from_probabilities, over_candidates, site_rows
from autoln.core.io import read_json, write_json_atomic
from autoln.core.locks import FolderLock
from autoln.race.propose import Proposer, Space, make_proposer
from autoln.race.resume import GENOTYPE_FILE, RACE_DIR, SUPERNET_FILE, compare_record, journal_message, ready_race_journal
from autoln.race.rule import Entry, Job, RaceRule, make_pool, origin
from autoln.race.schedule import Plan, most_steps, plan, proposal_names, rungs_text, steps_done
from autoln.race.figure import race_figure, race_tensorboard
from autoln.race.verdict import Verdict, verdict
from autoln.engine.training import TimeLeft
from autoln.tune import open_storage
from autoln.tune.journal import JournalDamaged

RACE_FILE = "race.json"
POLL_S = 1.0


def rule_of(cfg: Config) -> RaceRule:
    """The :class:`autoln.race.rule.RaceRule` of ``cfg.race``."""
    rc = cfg.race
    return RaceRule(eta=rc.eta, rungs=rc.rungs, final_seeds=rc.final_seeds, level=rc.level, max_seeds=rc.max_seeds,
                    spending=rc.spending, horizons=tuple(rc.horizons), proposer=rc.proposer, budget=rc.budget,
                    proposals=rc.proposals)


def named_specs(candidates: list[str], qk_candidates: Sequence[str] = ("none",)) -> list[str]:
    """The named placements a search over ``candidates`` (and QK-norm over ``qk_candidates``)
    races: each of :data:`autoln.models.genotype.BASELINES` whose placements are all candidates
    (``mix-ln`` and ``pre-post`` need ``pre`` and ``post``), then ``all-<c>`` for any other
    candidate (``pre:fixed``), then ``olmo2``, ``gemma3``, ``qwen3`` where their placement and a
    QK-norm of theirs are candidates (:func:`autoln.space.qk.named_qk`)."""
    out = []
    for name in BASELINES:
        needs = {"pre", "post"} if name in ("mix-ln", "pre-post") else {name[4:]}
        if needs <= set(candidates):
            out.append(name)
    out += [f"all-{c}" for c in candidates if f"all-{c}" not in out]
    return out + [n for n in QK_NAMED if named_qk(n, candidates, qk_candidates) is not None]


def race_pool(cfg: Config, supernet: Genotype, vocab: int, folder: Path) -> tuple[list[Entry], dict[str, str], dict[str, str]]:
    """The race's pool from the search's genotype ``supernet`` (module docstring): ``(entries,
    aliases, specs)``, ``specs`` each entry's ``retrain.py --genotype`` argument (a baseline
    name, or a genotype file written in ``folder/pool``)."""
    mc = supernet.model_config(cfg.model)
    probs = supernet.site_probabilities()
    cands = list(supernet.candidates)
    searched: list[tuple[str, list[int]]] = [("read-off", [cands.index(p) for p in site_rows(supernet.placements, supernet.granularity)])]
    searched.append(("argmax", [int(i) for i in probs.argmax(-1)]))
    for i, entry in enumerate(supernet.provenance.get("selection", {}).get("shortlist", [])):
        searched.append((f"top{i + 1}", [int(c) for c in entry["choices"]]))
    if cfg.race.proposer == "random":  # random search through the same race: no supernet entry
        searched = []
    named = named_specs(cands, mc.qk_norm)
    named_pl = [(n, baseline(n, mc, vocab).describe()) for n in named]
    qk = supernet.qk_choices() if supernet.qk_norm is not None else None  # the read-off's QK-norm, for every searched entry
    genotypes = {name: from_probabilities(probs, mc, vocab, {"race_entry": name, "searched_in": str(folder)}, choices, qk)
                 for name, choices in searched}
    entries, aliases = make_pool([(n, g.describe()) for n, g in genotypes.items()], named_pl)
    specs = {n: n for n in named}
    pool_dir = folder / RACE_DIR / "pool"
    for e in entries:
        if not e.named:
            path = pool_dir / f"{e.name}.json"
            if not path.exists() or Genotype.load(path).describe() != e.placements:
                genotypes[e.name].save(path)
            specs[e.name] = str(path)
    return entries, aliases, specs


def job_config(cfg: Config, job: Job) -> Config:
    """The retrain settings of ``job``: ``cfg.retrain`` at ``job.steps`` steps and seed
    ``retrain.seed + job.seed``, evaluating at least at the end, without a progress bar. A short
    rung keeps its schedule's shape: the warm-up scaled with the length (``round(warmup_steps *
    job.steps / retrain.steps)``); at the full budget and at a longer horizon the warm-up is the
    retrain's own and the schedule stretches to the longer end, as a user's longer run (and the
    experiments' ground truth at 4x) trains."""
    rc = cfg.retrain
    scaled = rc.warmup_steps if job.steps >= rc.steps else round(rc.warmup_steps * job.steps / rc.steps)
    warmup = min(scaled, job.steps - 1)
    retrain = dataclasses.replace(rc, steps=job.steps, seed=rc.seed + job.seed, eval_every=min(rc.eval_every, job.steps),
                                  warmup_steps=max(0, warmup))
    return dataclasses.replace(cfg, retrain=retrain, logging=dataclasses.replace(cfg.logging, progress=False))


def study_name(supernet: Genotype) -> str:
    """The race's study name: ``race-`` and a hash of the search's answer, seed and creation
    time, the same on every machine that shares the run folder."""
    key = json.dumps([supernet.describe(), supernet.provenance.get("seed"), supernet.provenance.get("created")])
    return "race-" + hashlib.sha1(key.encode()).hexdigest()[:12]


@dataclass
class RaceSetup:
    """What every worker of one race shares: the config, the search folder, the pool (entries,
    aliases, specs), the full budget, the rule and the headline metric."""

    cfg: Config
    folder: Path
    entries: list[Entry]
    aliases: dict[str, str]
    specs: dict[str, str]
    full_steps: int
    rule: RaceRule
    headline: str
    name: str
    supernet: Optional[Genotype] = None
    proposer: Optional[Proposer] = None

    def entry_names(self) -> list[str]:
        """Every entry the race can run: the pool and the names proposal rounds can give."""
        return [e.name for e in self.entries] + proposal_names(sum(not e.named for e in self.entries), self.full_steps, self.rule)

    def plan(self, values: dict) -> Plan:
        """:func:`autoln.race.schedule.plan` of this race; each proposed entry gets its genotype
        file in ``race/pool`` (its ``retrain.py --genotype`` argument)."""
        p = plan(self.entries, values, self.full_steps, self.rule, self.proposer)
        for e in p.proposed:
            if e.name not in self.specs:
                path = self.folder / RACE_DIR / "pool" / f"{e.name}.json"
                if not path.exists() or Genotype.load(path).describe() != e.placements:
                    choices = list(self.proposer.space.encode(e.placements))
                    from_probabilities(self.supernet.site_probabilities(), self.supernet.model_config(self.cfg.model),
                                       self.supernet.model["vocab_size"], {"race_entry": e.name, "origin": origin(e),
                                                                            "searched_in": str(self.folder)}, choices,
                                       self.supernet.qk_choices() if self.supernet.qk_norm is not None else None).save(path)
                self.specs[e.name] = str(path)
        return p

    def record(self) -> dict:
        """What the study records of this race (a resumed race must match it)."""
        rc = self.cfg.to_dict()
        return {"pool": [dataclasses.asdict(e) for e in self.entries], "full_steps": self.full_steps,
                "rule": dataclasses.asdict(self.rule), "seed": self.cfg.retrain.seed,
                "config": {k: rc[k] for k in ("data", "model", "retrain")}}


def open_race_study(setup: RaceSetup, quiet: bool = False):
    """The race's study on ``tune.storage`` or in ``<folder>/race/study.journal``, its record set
    or checked (:func:`autoln.race.resume.compare_record`; ``quiet``: a worker's, whose notes the
    command has said).

    Raises:
        ConfigError: the storage cannot be opened, or its race was started with other settings
            (naming each key with both values)."""
    import optuna

    storage = open_storage(setup.cfg, setup.folder / RACE_DIR)
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # after open_storage (which sets WARNING): a stopped retrain is the race's to report
    study = optuna.create_study(study_name=setup.name, storage=storage, direction="minimize", load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    compare_record(study, setup.record(), setup.folder, setup.name, quiet)
    return study


def job_key(system_attrs: dict) -> Optional[tuple[str, int, int]]:
    """``Job.key`` ``(entry, steps, seed)`` of an enqueued trial from its system attributes
    (Optuna keeps ``enqueue_trial``'s parameters as ``fixed_params``); None for another trial."""
    params = system_attrs.get("fixed_params")
    if not params or set(params) != {"entry", "steps", "seed"}:
        return None
    return params["entry"], int(params["steps"]), int(params["seed"])


def held_before(study, number: int, key: tuple[str, int, int]) -> bool:
    """Whether a trial numbered below ``number`` holds the job ``key`` (waiting, running or
    complete). Two workers that read the plan at once both enqueue its next jobs; the earliest
    trial of a job runs it and the later ones stand down, so no retrain runs twice (and no two
    workers share a run folder). Optuna pops a waiting trial to one worker only."""
    from optuna.trial import TrialState

    states = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
    return any(t.number < number and job_key(t.system_attrs) == key for t in study.get_trials(deepcopy=False, states=states))


def stands_down(study, trial) -> bool:
    """Whether the running ``trial`` (an ``optuna.Trial``) has no job of its own: Optuna made
    it because another worker took the last queued job first, or an earlier trial holds its job
    (:func:`held_before`)."""
    key = job_key(study._storage.get_trial_system_attrs(trial._trial_id))
    return key is None or held_before(study, trial.number, key)


def measured(study) -> tuple[dict, set, dict]:
    """From the study's trials: ``(values, busy, info)``: ``values`` by ``Job.key`` (a diverged
    retrain is ``inf``; a trial that failed otherwise, e.g. stopped, is not a value),
    ``busy`` the keys of waiting or running trials, ``info`` each value's ``wall_time_s`` and
    ``run`` folder."""
    from optuna.trial import TrialState

    values, busy, info = {}, set(), {}
    for t in study.get_trials(deepcopy=False):
        key = job_key(t.system_attrs)
        if key is None:
            continue
        if t.state == TrialState.COMPLETE and key not in values:
            values[key] = float(t.value)
            info[key] = {k: t.user_attrs[k] for k in ("wall_time_s", "run", "diverged") if k in t.user_attrs}
        elif t.state in (TrialState.WAITING, TrialState.RUNNING):
            busy.add(key)
    return values, busy, info


def run_job(setup: RaceSetup, job: Job) -> tuple[float, dict]:
    """One retrain of the race (reused when finished, continued from its checkpoint when
    interrupted): ``(value in the headline unit, inf when it diverged; its info)``. What the
    retrain prints goes to ``race/logs/<entry>-steps<S>-seed<i>.txt``."""
    run_dir = setup.folder / RACE_DIR / job.entry / f"steps{job.steps}-seed{job.seed}"
    log = setup.folder / RACE_DIR / "logs" / f"{job.entry}-steps{job.steps}-seed{job.seed}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        with open(log, "a", encoding="utf-8") as fh, contextlib.redirect_stderr(fh), contextlib.redirect_stdout(fh):
            metrics = retrain_one(job_config(setup.cfg, job), job.entry, setup.specs[job.entry], str(run_dir), False, None)
            if metrics is not None:
                print(f"valid {setup.headline} {metrics['valid'][setup.headline]:.6f}, test {setup.headline} "
                      f"{metrics['test'][setup.headline]:.6f} ({run_dir / 'metrics.json'})")
    except Interrupted as exc:  # the retrain's own message names its folder; the race goes on from the search folder
        kept = "its checkpoint is kept" if (run_dir / CHECKPOINT_FILE).exists() else "it starts again"
        raise Interrupted(exc.signum, f"stopped the race during {job.entry} at {job.steps} steps, seed {job.seed} ({kept}); "
                                      f"the finished retrains are kept; continue with: {resume_command(setup.folder)}") from None
    info = {"run": str(run_dir.relative_to(setup.folder)), "wall_time_s": round(time.perf_counter() - t0, 2)}
    if metrics is None:
        return math.inf, {**info, "diverged": True}
    info["wall_time_s"] = round(float(metrics.get("wall_time_s", info["wall_time_s"])), 2)
    return float(metrics["valid"][setup.headline]), info


def worker(setup: RaceSetup, rank: int = 0, threads: Optional[int] = None) -> None:
    """Run the race's retrains until :func:`autoln.race.rule.plan` says it is done: enqueue the
    pending jobs no trial holds, run a waiting one, or wait for the other workers' running
    ones. Every worker on the study does the same, on this machine or another."""
    import optuna

    if threads:
        import torch

        torch.set_num_threads(threads)
    study = open_race_study(setup, quiet=True)
    names = setup.entry_names()
    most = most_steps(setup.entries, setup.full_steps, setup.rule)
    eta = TimeLeft(steps_done(measured(study)[0]), most)  # every worker's retrain steps, at this worker's view of the rate

    def objective(trial) -> float:
        if stands_down(study, trial):
            trial.set_user_attr("spare", True)
            raise optuna.TrialPruned()
        job = Job(trial.suggest_categorical("entry", names), trial.suggest_int("steps", 1, setup.full_steps * max(setup.rule.horizons)),
                  trial.suggest_int("seed", 0, setup.rule.max_seeds - 1))
        value, info = run_job(setup, job)
        for k, v in info.items():
            trial.set_user_attr(k, v)
        unit = UNITS.get(setup.headline, setup.headline)
        done = steps_done(measured(study)[0]) + job.steps  # this trial's value is stored when it returns
        print(f"[race] {job.entry} at {job.steps} steps, seed {job.seed}: "
              + ("diverged" if info.get("diverged") else f"{value:.4f} {unit}") + f" ({info['wall_time_s']:.0f} s; "
              f"{done}/{most} steps at most, {eta.text(done, bound=True)})", file=sys.stderr, flush=True)
        return value  # inf for a diverged retrain: a measurement, ranked last

    while True:
        values, busy, _ = measured(study)
        p = setup.plan(values)
        if p.done:
            return
        for job in p.pending:
            if job.key not in busy:
                study.enqueue_trial({"entry": job.entry, "steps": job.steps, "seed": job.seed})
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        if waiting:
            study.optimize(objective, n_trials=1)
        else:
            optuna.storages.fail_stale_trials(study)
            time.sleep(POLL_S)


def _worker_entry(setup: RaceSetup, rank: int, threads: int) -> None:
    """A spawned worker process (:func:`autoln.engine.workers.run_in_processes`)."""
    worker(setup, rank, threads)


def fail_left_running(study) -> list[int]:
    """Mark failed the trials a killed command left running in its own journal (only this
    command, which holds the race folder's lock, runs them); returns their numbers."""
    from optuna.trial import TrialState

    left = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for t in left:
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    return [t.number for t in left]


@dataclass
class RaceResult:
    """A finished race: the :class:`autoln.race.verdict.Verdict`, the final :class:`autoln.race.rule.Plan`,
    the answer's genotype file and ``race.json``'s path."""

    verdict: Verdict
    plan: Plan
    genotype_path: Path
    record_path: Path
    record: dict


def setup_race(cfg: Config, folder: Path) -> RaceSetup:
    """The race of the search in ``folder`` (its ``supernet_genotype.json``, written from
    ``genotype.json`` when missing).

    Raises:
        OutputError: the folder holds no finished search."""
    sup = supernet_file(folder)
    supernet = Genotype.load(sup)
    corpus = load_corpus(cfg.data)
    entries, aliases, specs = race_pool(cfg, supernet, corpus.vocab_size, folder)
    rule = rule_of(cfg)
    proposer = None
    if rule.proposer != "none":
        cands = list(supernet.candidates)
        probs = supernet.site_probabilities()
        tail = supernet.describe().partition(" | ")[2]  # every proposal carries the read-off's QK-norm (empty without)
        proposer = make_proposer(rule.proposer, Space(tuple(cands), probs.shape[0], probs, 1 if supernet.granularity == "layer" else 2,
                                                      tail), cfg.retrain.seed)
    return RaceSetup(cfg, folder, entries, aliases, specs, cfg.retrain.steps, rule, HEADLINE[cfg.data.tokenizer],
                     study_name(supernet), supernet, proposer)


def supernet_file(folder: Path) -> Path:
    """``folder/supernet_genotype.json``, the search's read-off: its ``genotype.json`` is renamed
    so when the race begins, so that ``genotype.json`` is only ever the race's answer.

    Raises:
        OutputError: the folder holds no finished search."""
    sup = Path(folder) / SUPERNET_FILE
    if not sup.exists():
        if not (Path(folder) / GENOTYPE_FILE).exists():
            raise OutputError(f"{folder} holds no finished search (no {GENOTYPE_FILE}): nothing to race")
        os.replace(Path(folder) / GENOTYPE_FILE, sup)
    return sup


def run_race(cfg: Config, folder: str | Path, workers: int = 1) -> RaceResult:
    """Race the shortlist of the finished search in ``folder`` (module docstring) and write the
    answer. ``workers``: worker processes on this machine (each an equal share of the cores).

    Raises:
        OutputError: no finished search in ``folder``; another process holds ``folder/race`` (a
            journal study; with an RDB ``tune.storage`` every machine's command joins the race);
            its journal holds a damaged record before its last (a last record cut short, a
            stale journal lock and blank lines are repaired, with a line that says so:
            :mod:`autoln.tune.journal`).
        ConfigError: the storage cannot be opened or holds this race with other settings.
        Interrupted: SIGINT or SIGTERM (the running retrain keeps its checkpoint; ``search.py
            --resume`` continues the race).
        As ``retrain.py``: DataError, GenotypeError, WriteError.
    """
    folder = Path(folder)
    setup = setup_race(cfg, folder)
    # a journal file is this machine's: one command at a time; an RDB study takes every machine's workers
    with FolderLock(folder / RACE_DIR, "race", enabled=cfg.tune.storage is None):
        try:
            values, info = race_values(setup, workers)
        except JournalDamaged as damaged:  # Optuna's reader met it while the race ran
            raise OutputError(journal_message(damaged, folder)) from None
    return finish_race(setup, values, info)


def race_values(setup: RaceSetup, workers: int) -> tuple[dict, dict]:
    """The race's retrains run (the caller holds the race folder): the journal made ready
    (:func:`autoln.race.resume.ready_race_journal`), the study opened, the trials a stopped run
    left running failed, the pool said, the workers run. Returns :func:`measured`'s values and info."""
    if setup.cfg.tune.storage is None:
        ready_race_journal(setup.folder)
    study = open_race_study(setup)
    if setup.cfg.tune.storage is None:
        left = fail_left_running(study)
        if left:
            print(f"[race] trials {left} were left running by a stopped run; they continue from their checkpoints",
                  file=sys.stderr)
    describe_pool(setup)
    if workers > 1:
        from autoln.engine.workers import run_in_processes

        run_in_processes(_worker_entry, [(setup, i) for i in range(workers)], workers)
    else:
        worker(setup)
    values, _, info = measured(study)
    return values, info


def describe_pool(setup: RaceSetup) -> None:
    """Print the pool, the aliases, the rungs that will run (:func:`autoln.race.schedule.rungs_text`)
    and the rule (stderr)."""
    width = max(len(e.name) for e in setup.entries)
    rows = [f"  {e.name:{width}s}  {e.kind:8s}  {e.placements}" for e in setup.entries]
    same = [f"{a} = {b}" for a, b in setup.aliases.items()]
    print(f"autoln race -> {setup.folder / RACE_DIR}\n  pool ({len(setup.entries)}):\n" + "\n".join(rows)
          + (f"\n  the same genotype: {', '.join(same)}" if same else "")
          + f"\n  rungs: {rungs_text(setup.entries, setup.full_steps, setup.rule)}\n  rule: {setup.rule.describe()}",
          file=sys.stderr, flush=True)


def finish_race(setup: RaceSetup, values: dict, info: dict) -> RaceResult:
    """The verdict, ``genotype.json`` (the answer with the verdict in its provenance),
    ``race.json``, ``race.png``, the HParams table and the verdict's text."""
    p = setup.plan(values)
    everyone = setup.entries + p.proposed
    unit = UNITS.get(setup.headline, setup.headline)
    v = verdict(p.finalists, values, setup.full_steps, setup.rule, unit)
    folder = setup.folder
    jobs = [{"entry": k[0], "placements": next(e.placements for e in everyone if e.name == k[0]), "steps": k[1],
             "seed": k[2], "retrain_seed": setup.cfg.retrain.seed + k[2], "value": values[k] if math.isfinite(values[k]) else None,
             **info.get(k, {})} for k in sorted(values, key=lambda k: (k[1], k[2], k[0]))]
    record = {"rule": setup.rule.describe(), "settings": dataclasses.asdict(setup.rule), "full_steps": setup.full_steps,
              "metric": setup.headline, "pool": [dataclasses.asdict(e) | {"origin": origin(e)} for e in everyone],
              "aliases": setup.aliases,
              "rungs": p.rungs, "jobs": jobs,
              "verdict": {"answer": v.answer.name, "placements": v.answer.placements, "kind": v.answer.kind, "outcome": v.outcome,
                          "line": v.line, "p_value": v.p_value, "values": v.values,
                          "searched": v.searched.name if v.searched else None, "named": v.named.name if v.named else None,
                          "horizons": v.horizons, "origin": origin(v.answer)},
              "wall_time_s": round(sum(j.get("wall_time_s") or 0 for j in jobs), 1)}
    record_path = write_json_atomic(folder / RACE_DIR / RACE_FILE, record)
    supernet = Genotype.load(folder / SUPERNET_FILE)
    provenance = {**supernet.provenance, "race": {k: record["verdict"][k] for k in ("answer", "outcome", "line", "p_value")}
                  | {"rule": record["rule"], "record": f"{RACE_DIR}/{RACE_FILE}", "supernet_genotype": SUPERNET_FILE}}
    if v.answer.named:
        named = baseline(v.answer.name, supernet.model_config(setup.cfg.model), supernet.model["vocab_size"])
        answer = over_candidates(named, supernet.candidates)  # the file still says what was searched
    else:
        answer = Genotype.load(setup.specs[v.answer.name])
    answer = dataclasses.replace(answer, provenance=provenance)
    path = answer.save(folder / GENOTYPE_FILE)
    if setup.cfg.logging.tensorboard:
        race_figure(record, folder / RACE_DIR / "race.png")
        race_tensorboard(record, folder / RACE_DIR)
    return RaceResult(v, p, path, record_path, record)


def finished_race(folder: Path) -> Optional[dict]:
    """``race.json`` of ``folder``'s finished race, or None."""
    path = Path(folder) / RACE_DIR / RACE_FILE
    return read_json(path) if path.exists() else None
