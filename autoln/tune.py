"""The outer loop (docs/design.md §5): an Optuna study whose trials are searches with suggested
hyperparameters, scored by how good their *derived* genotype is.

A trial: suggest every ``tune.space`` entry, run :func:`autoln.run_search.run_search` in
``trials/NNNN/search``, then (``tune.score: proxy_retrain``) a short retrain of the derived
genotype in ``trials/NNNN/proxy``; its final valid loss in the headline unit (bits per byte for
bytes) is the value minimised. The valid loss at every evaluation of the search (step ``s``)
and of the proxy (step ``search.steps + s``, the trial's own ``search.steps``) is reported to the
pruner. Pruning compares trials at equal steps, so a study with a pruner may not tune
``search.steps`` (:func:`autoln.config.space_values` refuses it; ``tune.pruner: none`` allows it).

Outcomes, kept in each trial's user attribute ``outcome``: ``complete``; ``pruned`` (by the
pruner); ``diverged`` (NaN/inf loss, ended as PRUNED with the reason); ``error`` (an exception,
FAIL with the reason; the study goes on); ``running`` on a FAIL trial means its worker died
(``lost``); it is re-run. ``tune.n_trials`` caps *finished* trials (complete, pruned, diverged,
error) across every worker; the cap is exact (see :func:`admitted`).

Storage: Optuna's journal file by default (one machine; a lock file keeps a second command off
the folder, so trials found RUNNING at start are lost ones), or any RDB URL (many machines; a
heartbeat fails the trials of dead workers and Optuna's ``RetryHeartbeatStaleTrialCallback`` re-runs
them).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
import shutil
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .commands import pip_extra
from .config import Config, assign
from .errors import AutolnError, ConfigError, OutputError
from .io import write_text_atomic
from .locks import FolderLock
from .tune_study import FINISHED_OUTCOMES, Census, _headline, _optuna, best_trial, census, counts_toward_cap, outcome  # noqa: F401 (re-exported)
from .workers import threads_per_worker

JOURNAL_FILE = "study.journal"
LOCK_FILE = "tune.lock"
#: The refusal of a second command on a study's folder (:class:`autoln.locks.FolderLock`'s ``refusal``).
LOCK_REFUSAL = ("--out {folder}: another 'search.py --tune' is running on this folder ({path} is locked by {holder}); "
                "add workers with --workers, or use an RDB tune.storage for several commands")
TRIALS_DIR = "trials"
POLL_S = 2.0
#: Config keys that may change between runs of one study (they do not change what a trial computes).
RESUMABLE_KEYS = ("tune.n_trials", "tune.storage", "tune.rank_offset", "tune.heartbeat_interval", "tune.grace_period",
                  "tune.max_retry", "search.device", "retrain.device")


class OverCap(Exception):
    """A trial was created after the study's cap was taken by other workers' trials."""


def admitted(study, number: int, cap: int) -> bool:
    """Whether trial ``number`` may run under a cap of ``cap`` finished trials.

    Optuna numbers trials atomically in creation order. A trial is admitted when fewer than
    ``cap`` trials with a smaller number are finished, running or waiting. Every trial that
    later finishes with a smaller number than the last admitted one existed (running or
    waiting) when that one was admitted, so at most ``cap`` trials finish; workers keep going
    until ``cap`` have, so exactly ``cap`` do. A refused trial ends FAIL as ``over-cap``.
    """
    from optuna.trial import TrialState

    ahead = 0
    for t in study.get_trials(deepcopy=False):
        if t.number < number and (t.state in (TrialState.RUNNING, TrialState.WAITING) or counts_toward_cap(t)):
            ahead += 1
    return ahead < cap


# --- storage, study, sampler, pruner ----------------------------------------------------------


#: Times to reopen an RDB storage whose schema another command was creating at the same moment.
SCHEMA_RACE_RETRIES = 3


def open_storage(cfg: Config, out: Path):
    """The study's storage: a journal file ``out/study.journal`` or the RDB at ``tune.storage``.

    Raises:
        ConfigError: the URL's database driver is not installed, or the database refuses the
            connection (names ``tune.storage``).
    """
    optuna = _optuna()
    tc = cfg.tune
    if tc.storage is None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(out / JOURNAL_FILE)))
    try:
        for attempt in range(SCHEMA_RACE_RETRIES + 1):
            try:
                return optuna.storages.RDBStorage(tc.storage, heartbeat_interval=tc.heartbeat_interval,
                                                  grace_period=tc.grace_period,
                                                  heartbeat_stale_trial_callback=retry_callback(cfg))
            except Exception as exc:
                # Two commands starting at once on an empty database both create Optuna's tables;
                # the loser's CREATE TABLE fails with "already exists". Opening again finds them.
                if attempt == SCHEMA_RACE_RETRIES or "already exists" not in str(exc):
                    raise
                time.sleep(0.5 + random.random())
    except ModuleNotFoundError as exc:
        driver = "psycopg2-binary" if exc.name and "psycopg" in exc.name else exc.name
        raise ConfigError(f"tune.storage {_redact(tc.storage)}: the database driver '{exc.name}' is not installed "
                          f"({pip_extra('postgres') if driver == 'psycopg2-binary' else f'pip install {driver}'})") from None
    except Exception as exc:  # sqlalchemy's errors: bad URL, refused connection, missing driver, ...
        hint = ""
        if "DB access module" in str(exc) and tc.storage.startswith("postgresql://"):
            hint = f" (name the driver: postgresql+psycopg2://..., installed by {pip_extra('postgres')})"
        raise ConfigError(f"tune.storage {_redact(tc.storage)}: cannot open the database: "
                          f"{str(exc).splitlines()[0][:300]}{hint}") from None


def retry_callback(cfg: Config):
    """Optuna's callback that queues a lost trial's parameters as a new WAITING trial (at most
    ``tune.max_retry`` re-runs of one trial); the new trial records the chain in its system
    attributes ``failed_trial`` and ``retry_history``."""
    return _optuna().storages.RetryHeartbeatStaleTrialCallback(max_retry=cfg.tune.max_retry)


def _redact(url: str) -> str:
    """The URL without its password."""
    head, sep, tail = url.partition("://")
    if "@" in tail and ":" in tail.split("@", 1)[0]:
        user = tail.split("@", 1)[0].split(":", 1)[0]
        return f"{head}{sep}{user}:***@{tail.split('@', 1)[1]}"
    return url


def sampler_seed(cfg: Config, rank: int, existing: int) -> int:
    """``tune.seed + rank`` for a fresh study; a worker joining a study that already holds
    ``existing`` trials adds ``10007 * existing``, so a resumed or extended study does not redraw
    the parameters of its first trials."""
    return (cfg.tune.seed + rank + 10007 * existing) % 2**32


def make_sampler(cfg: Config, rank: int, existing: int = 0):
    """TPE (multivariate, constant liar for parallel workers) or random, seeded with
    :func:`sampler_seed`."""
    optuna = _optuna()
    seed = sampler_seed(cfg, rank, existing)
    if cfg.tune.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=cfg.tune.startup_trials, multivariate=True,
                                      constant_liar=True)


def make_pruner(cfg: Config):
    """Median (after ``tune.startup_trials`` trials), Hyperband over the search + proxy steps,
    or none."""
    optuna = _optuna()
    if cfg.tune.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=cfg.tune.startup_trials)
    if cfg.tune.pruner == "hyperband":
        total = cfg.search.steps + (cfg.tune.proxy_steps if cfg.tune.score == "proxy_retrain" else 0)
        return optuna.pruners.HyperbandPruner(min_resource=min(cfg.search.eval_every, total), max_resource=total)
    return optuna.pruners.NopPruner()


def study_config(cfg: Config) -> dict[str, Any]:
    """The flat ``section.key -> value`` config a study is tied to (without :data:`RESUMABLE_KEYS`
    and ``logging``)."""
    flat = {}
    for section, values in cfg.to_dict().items():
        if section == "logging":
            continue
        for key, value in values.items():
            if f"{section}.{key}" not in RESUMABLE_KEYS:
                flat[f"{section}.{key}"] = value
    return flat


def open_study(cfg: Config, out: Path, rank: int = 0, create: bool = False):
    """Create (``create``) or load the study ``tune.study_name`` with this worker's sampler.

    Raises:
        ConfigError: the existing study minimises nothing or was made with another config
            (the message names each differing key), or the storage cannot be opened.
    """
    optuna = _optuna()
    storage = open_storage(cfg, out)
    kwargs = dict(study_name=cfg.tune.study_name, storage=storage, sampler=optuna.samplers.RandomSampler(),
                  pruner=make_pruner(cfg))
    where = f"study '{cfg.tune.study_name}' in {_redact(cfg.tune.storage) if cfg.tune.storage else out / JOURNAL_FILE}"
    try:
        study = optuna.load_study(**kwargs)
    except KeyError:
        if not create:
            raise ConfigError(f"{where} does not exist") from None
        study = optuna.create_study(direction="minimize", load_if_exists=True, **kwargs)
    study.sampler = make_sampler(cfg, rank, len(study.get_trials(deepcopy=False)))
    if study.direction != optuna.study.StudyDirection.MINIMIZE or len(study.directions) != 1:
        raise ConfigError(f"{where} is not a single-objective minimisation study; autoln's studies minimise "
                          "the valid loss (choose another tune.study_name)")
    mine = study_config(cfg)
    theirs = study.user_attrs.get("autoln_config")
    if theirs is None:
        if create:
            study.set_user_attr("autoln_config", mine)
            study.set_user_attr("metric", _headline(cfg))
    elif theirs != mine:
        default = study_config(Config())  # a key one side lacks (another autoln version) counts as its default
        diff = [f"{k} ({_clipped_repr(theirs.get(k, default.get(k)))} in the study, {_clipped_repr(mine.get(k, default.get(k)))} now)"
                for k in sorted(set(theirs) | set(mine)) if theirs.get(k, default.get(k)) != mine.get(k, default.get(k))]
        if diff:
            fix = ("choose another tune.study_name, or pass --overwrite to delete that study from the database"
                   if cfg.tune.storage else "choose another tune.study_name or --out, or pass --overwrite")
            raise ConfigError(f"{where} was made with another config; differing keys: {'; '.join(diff)}. "
                              f"Re-run with the study's config, or {fix}")
    return study


def _clipped_repr(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters with "..." (a whole ``tune.space`` would make a
    one-line error unreadable)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- one trial --------------------------------------------------------------------------------


def suggest(trial, key: str, spec: dict) -> Any:
    """Ask ``trial`` for the value of ``key`` from its ``tune.space`` entry ``spec``."""
    if "log-uniform" in spec:
        low, high = spec["log-uniform"]
        return trial.suggest_float(key, low, high, log=True)
    if "uniform" in spec:
        low, high = spec["uniform"]
        return trial.suggest_float(key, low, high, step=spec.get("step"))
    if "int" in spec:
        low, high = spec["int"]
        return trial.suggest_int(key, low, high, step=spec.get("step", 1))
    return trial.suggest_categorical(key, spec["categorical"])


def trial_config(cfg: Config, params: dict[str, Any]) -> Config:
    """``cfg`` with a trial's parameters set and the trial's logging (no progress bar).

    Raises:
        ConfigError: the combination is invalid (e.g. a value out of range for this config).
    """
    import copy

    tcfg = copy.deepcopy(cfg)
    for key, value in params.items():
        assign(tcfg, key, value, f"trial parameter {key}")
    tcfg.logging.progress = False
    tcfg.validate_sections()
    return tcfg


def write_hparams(trial_dir: Path, params: dict[str, Any], metrics: dict[str, float]) -> None:
    """The trial's hyperparameters and final metrics for TensorBoard's HParams view (one run
    per trial, in ``trial_dir``)."""
    from torch.utils.tensorboard import SummaryWriter

    clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
    metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    with SummaryWriter(log_dir=str(trial_dir)) as writer:
        writer.add_hparams(clean, metrics, run_name=".")  # "." : the session is the trial's own run


class Objective:
    """The value a trial minimises (see the module docstring); records the outcome, reason,
    genotype and metrics in the trial's user attributes.

    Args:
        cfg: the study's resolved config.
        out: the study folder; the trial writes ``trials/NNNN``.
        worker: this worker's id (``host:pid:rank``), recorded on each trial.
    """

    def __init__(self, cfg: Config, out: Path, worker: str) -> None:
        self.cfg, self.out, self.worker = cfg, out, worker
        self.headline = _headline(cfg)

    def __call__(self, trial) -> float:
        optuna = _optuna()
        from .run_retrain import run_retrain
        from .errors import DivergenceError
        from .run_search import run_search

        started = time.perf_counter()
        for key in ("genotype", "placements", "reason", "supernet_valid", "wall_time_s"):  # a re-run copies the lost trial's
            trial.set_user_attr(key, None)
        trial.set_user_attr("outcome", "running")
        trial.set_user_attr("worker", self.worker)
        if not admitted(trial.study, trial.number, self.cfg.tune.n_trials):
            trial.set_user_attr("outcome", "over-cap")
            print(f"[tune] trial {trial.number} not run: other workers' trials took the last of the "
                  f"{self.cfg.tune.n_trials} slots", file=sys.stderr, flush=True)
            raise OverCap(f"trial {trial.number}: the cap of {self.cfg.tune.n_trials} finished trials is taken")
        params = {key: suggest(trial, key, spec) for key, spec in self.cfg.tune.space.items()}
        tdir = self.out / TRIALS_DIR / f"{trial.number:04d}"
        tdir.mkdir(parents=True, exist_ok=True)
        trial.set_user_attr("trial_dir", str(tdir))
        metrics: dict[str, float] = {}
        line = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        print(f"[tune] trial {trial.number} ({self.worker}) starts: {line}", file=sys.stderr, flush=True)

        def report(offset: int):
            def hook(step: int, valid: dict) -> None:
                trial.report(valid[self.headline], offset + step)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {offset + step}: valid {self.headline} {valid[self.headline]:.4f}")
            return hook

        def finish(state: str, reason: str = "") -> None:
            trial.set_user_attr("outcome", state)
            trial.set_user_attr("wall_time_s", round(time.perf_counter() - started, 1))
            if reason and state != "complete":
                trial.set_user_attr("reason", reason[:2000])
            if self.cfg.logging.tensorboard:
                write_hparams(tdir, params, {f"hparams/{k}": v for k, v in metrics.items()})
            print(f"[tune] trial {trial.number} {state}" + (f": {reason}" if reason else "") +
                  f" ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

        try:
            cfg = trial_config(self.cfg, params)
            result = run_search(cfg, tdir / "search", overwrite=True, on_eval=report(0))
            trial.set_user_attr("genotype", result.genotype.to_dict())
            trial.set_user_attr("placements", result.genotype.describe())
            metrics["supernet_valid"] = result.valid[self.headline]
            trial.set_user_attr("supernet_valid", metrics["supernet_valid"])
            score = metrics["supernet_valid"]
            if self.cfg.tune.score == "proxy_retrain":
                proxy = trial_config(cfg, {"retrain.steps": self.cfg.tune.proxy_steps,
                                           "retrain.eval_every": min(cfg.retrain.eval_every, self.cfg.tune.proxy_steps),
                                           "retrain.warmup_steps": min(cfg.retrain.warmup_steps, self.cfg.tune.proxy_steps - 1)})
                # the proxy's evaluations follow the trial's own search (its search.steps, which the
                # study config's need not be), so no step is reported twice
                retrained = run_retrain(proxy, str(result.path), tdir / "proxy", overwrite=True, on_eval=report(cfg.search.steps))
                metrics["proxy_valid"] = retrained.valid[self.headline]
                score = metrics["proxy_valid"]
            if not math.isfinite(score):
                raise DivergenceError(f"the score is {score}")
            metrics["score"] = score
            trial.set_user_attr("score_metric", f"valid {self.headline}")
            finish("complete", f"{self.headline} {score:.4f}, genotype {result.genotype.describe()}")
            return score
        except optuna.TrialPruned as exc:
            finish("pruned", str(exc))
            raise
        except DivergenceError as exc:
            finish("diverged", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        except KeyboardInterrupt:  # queue a re-run now, so re-running the command redoes this trial
            trial.set_user_attr("outcome", "interrupted")
            retry_callback(self.cfg)(trial.study, trial.study.get_trials(deepcopy=False)[trial.number])
            raise
        except Exception as exc:
            write_text_atomic(tdir / "error.txt", traceback.format_exc())
            finish("error", f"{type(exc).__name__}: {exc} (traceback in {tdir / 'error.txt'})")
            raise


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# --- workers ----------------------------------------------------------------------------------


def recover_lost(study, cfg: Config, which) -> list[int]:
    """Fail the RUNNING trials for which ``which(trial)`` is true (their worker is known to be
    dead) and enqueue each for a re-run (Optuna's ``RetryHeartbeatStaleTrialCallback``, at most
    ``tune.max_retry`` times). Returns the failed trials' numbers."""
    from optuna.trial import TrialState

    retry = retry_callback(cfg)
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not which(t):
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except Exception:  # finished meanwhile
            continue
        retry(study, study.get_trials(deepcopy=False)[t.number])
        failed.append(t.number)
    return failed


def run_worker(cfg: Config, out: Path, rank: int, threads: Optional[int] = None) -> None:
    """One worker: run trials until the study has ``tune.n_trials`` finished ones.

    While the finished plus running trials reach the cap, the worker waits (another worker's
    trial may still fail and free its slot; RDB heartbeats detect dead workers here).
    """
    optuna = _optuna()
    if threads:
        import torch

        torch.set_num_threads(threads)
    study = open_study(cfg, out, rank)
    worker = f"{socket.gethostname()}:{os.getpid()}:rank{rank}"
    objective = Objective(cfg, out, worker)
    while True:
        optuna.storages.fail_stale_trials(study)
        c = census(study)
        if c.finished >= cfg.tune.n_trials:
            return
        if c.finished + c.running >= cfg.tune.n_trials:
            time.sleep(POLL_S)
            continue
        study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)


def _worker_entry(cfg: Config, out: str, rank: int, threads: int) -> None:
    """Entry of a spawned worker process: exit 0 when done, 2 on bad input, 130 on Ctrl-C."""
    try:
        run_worker(cfg, Path(out), rank, threads)
    except AutolnError as exc:
        print(f"error: worker rank {rank}: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


# --- the command ------------------------------------------------------------------------------


@dataclass
class TuneResult:
    """What ``search.py --tune`` returns: the study folder, the census at the end, the best
    trial's number and value (None when no trial completed), the report's files, wall time (s)."""

    out: Path
    census: Census
    best_number: Optional[int]
    best_value: Optional[float]
    files: list[Path]
    wall_time_s: float


def check_tune_dir(out: Path, overwrite: bool = False) -> None:
    """Refuse a folder that cannot hold a study: a file, an unwritable place, or (unless
    ``overwrite``) a folder that holds a single search, retrain or diagnosis.

    Raises:
        OutputError: naming ``--out`` and what is wrong.
    """
    from .training import FINISHED_MARKERS, check_out_dir

    single = [m for m in FINISHED_MARKERS if (out / m).exists()]
    if single and not overwrite:
        raise OutputError(f"--out {out} holds a single search or retrain run ({single[0]}), not a study; "
                          "choose another folder or pass --overwrite")
    check_out_dir(out, overwrite=True, study_ok=True)


def preflight(cfg: Config) -> None:
    """Check once, before any trial, what every trial would otherwise fail on: the corpus, its
    length against ``model.context``, the device and the number of candidates.

    Raises:
        DataError, ConfigError: as :func:`autoln.run_search.run_search` would.
    """
    from .data import check_lengths, load_corpus
    from .run_search import check_searchable
    from .training import resolve_device

    check_searchable(cfg.model)
    resolve_device(cfg.search.device)
    resolve_device(cfg.retrain.device)
    check_lengths(load_corpus(cfg.data), cfg.model.context)


def run_tune(cfg: Config, out: str | Path, workers: int = 1, overwrite: bool = False) -> TuneResult:
    """Run (or resume) the study of ``cfg.tune`` with ``workers`` processes on this machine,
    then write the report (:func:`autoln.tune_report.write_report`).

    ``overwrite`` deletes the study (in its storage, RDB included) and the folder's contents
    first. Without it, an existing study is resumed when its config matches.

    Raises:
        ConfigError: bad ``workers``, storage or a study made with another config.
        OutputError: the folder is unusable or another command holds its lock.
        DataError: the corpus cannot be read or is too short (checked before any trial).
    """
    from .tune_report import write_report

    started = time.perf_counter()
    out = Path(out)
    if workers < 1:
        raise ConfigError(f"--workers must be a positive integer, got {workers}")
    check_tune_dir(out, overwrite)
    cfg.validate_space()
    preflight(cfg)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {out}: {exc.strerror or exc}") from None
    lock = FolderLock(out, "tune", enabled=True, name=LOCK_FILE, refusal=LOCK_REFUSAL).acquire()
    study = None
    try:
        stale = out / (JOURNAL_FILE + ".lock")  # Optuna's journal lock: this command holds the folder, so one found now
        if cfg.tune.storage is None and (stale.exists() or stale.is_symlink()):  # was left by a killed command
            stale.unlink()
            print(f"[tune] removed {stale}, a journal lock left by a killed command (Optuna would wait 30 s for it)",
                  file=sys.stderr)
        if overwrite:
            _clear(cfg, out)
        study = open_study(cfg, out, cfg.tune.rank_offset, create=True)
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
        if cfg.tune.storage is None:  # the lock proves no live worker: RUNNING trials are lost ones
            lost = recover_lost(study, cfg, lambda t: True)
            if lost:
                print(f"[tune] trials {lost} were running when their command died: marked failed and queued to re-run",
                      file=sys.stderr)
        c = census(study)
        print(f"[tune] study '{cfg.tune.study_name}' -> {out}: {c.finished}/{cfg.tune.n_trials} finished, "
              f"{c.running} running, {c.waiting} waiting; {workers} worker(s)", file=sys.stderr, flush=True)
        if c.finished < cfg.tune.n_trials:
            if workers == 1:
                run_worker(cfg, out, cfg.tune.rank_offset)
            else:
                _run_processes(cfg, out, workers, study)
        study = open_study(cfg, out, cfg.tune.rank_offset)
        files = write_report(study, cfg, out)
        c = census(study)
        best = best_trial(study)
        return TuneResult(out, c, best.number if best else None, best.value if best else None, files,
                          time.perf_counter() - started)
    except KeyboardInterrupt:
        if study is not None:  # keep the report of what finished; the interrupted trial is queued to re-run
            write_report(open_study(cfg, out, cfg.tune.rank_offset), cfg, out)
        raise
    except AutolnError:
        if created and study is None:  # refused before anything was written: leave no folder behind
            lock.release()
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        lock.release()


def _clear(cfg: Config, out: Path) -> None:
    """``--overwrite``: delete the study and everything in the folder but the lock."""
    optuna = _optuna()
    storage = open_storage(cfg, out)
    try:
        optuna.delete_study(study_name=cfg.tune.study_name, storage=storage)
    except KeyError:
        pass
    for child in out.iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _run_processes(cfg: Config, out: Path, workers: int, study) -> None:
    """Spawn ``workers`` worker processes (ranks ``rank_offset + i``, an equal share of the
    CPU threads each) and wait; when one dies, fail and re-queue the trial it was running."""
    ctx = mp.get_context("spawn")
    threads = threads_per_worker(workers)
    procs = []
    for i in range(workers):
        p = ctx.Process(target=_worker_entry, args=(cfg, str(out), cfg.tune.rank_offset + i, threads), daemon=False)
        p.start()
        procs.append(p)
    try:
        alive = list(procs)
        while alive:
            for p in list(alive):
                p.join(timeout=0.5)
                if p.exitcode is None:
                    continue
                alive.remove(p)
                if p.exitcode != 0:
                    lost = recover_lost(study, cfg, lambda t, pid=p.pid: f":{pid}:" in str(t.user_attrs.get("worker", "")))
                    print(f"[tune] worker pid {p.pid} exited with status {p.exitcode}"
                          + (f"; its trial(s) {lost} marked failed and queued to re-run" if lost else ""), file=sys.stderr)
                    if p.exitcode == 2:
                        raise ConfigError("a worker refused its input (see its error above)")
    except BaseException:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join()
        raise
