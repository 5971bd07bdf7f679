"""The outer loop (docs/design.md §5): an Optuna study whose trials are searches with suggested
hyperparameters, scored by how good their *derived* genotype is.

A trial: suggest every ``tune.space`` entry, run :func:`autoln.oneshot.run_search.run_search` in
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

A removed state file: the journal (or a ``sqlite:///`` database file) removed or replaced while
the study runs stops the command with one line (:class:`autoln.core.errors.StateLost`, exit 2):
the study's record went with it, but every trial's folder stays. Re-running the command starts
the study anew, and a trial whose folder (``trials/NNNN``, from the lost study) holds a search
of its own settings reuses it when finished, or resumes it from its checkpoint, replaying the
valid losses it reported (``reports.json``) so that the pruner decides as before; one with
other settings is moved aside to ``trials/NNNN.earlier``. A removed ``tune.lock`` is
re-created (:meth:`autoln.core.locks.FolderLock.check`).
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

from autoln.core.commands import beside_python, pip_extra, resume_command
from autoln.config import Config, assign, read_yaml
from autoln.core.errors import AutolnError, ConfigError, OutputError, StateLost, WriteError
from autoln.core.io import read_json, write_json_atomic, write_text_atomic
from autoln.core.locks import FolderLock, check_held
from autoln.tune.study import FINISHED_OUTCOMES, Census, _headline, _optuna, best_trial, census, counts_toward_cap, outcome  # noqa: F401 (re-exported)
from autoln.runs.workers import threads_per_worker

JOURNAL_FILE = "study.journal"
LOCK_FILE = "tune.lock"
#: The refusal of a second command on a study's folder (:class:`autoln.core.locks.FolderLock`'s ``refusal``).
LOCK_REFUSAL = ("--out {folder}: another 'search.py --tune' is running on this folder ({path} is locked by {holder}); "
                "add workers with --workers, or use an RDB tune.storage for several commands")
TRIALS_DIR = "trials"
#: A trial's valid losses as reported to the pruner (``{step: value}``), in its folder: a re-run
#: after a lost journal replays them for the search it reuses.
REPORTS_FILE = "reports.json"
#: The exit status of a ``--workers`` process that found the storage's file gone (the command
#: that started it says so in one line).
WORKER_STORAGE_GONE = 75
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


class StorageGone(BaseException):
    """Internal: the study's storage file (:class:`StorageFile`) was removed or replaced under
    this process. A ``BaseException`` on purpose: Optuna's ``study.optimize`` catches a trial's
    every ``Exception`` and then writes the trial's state to the same storage, which fails again
    inside its own ``finally`` (``UnboundLocalError: ... 'updated_state'``, or ``AssertionError:
    Should not reach`` for SQLite; optuna 4 and 5). This one passes through Optuna untouched to
    :func:`run_tune` (or a worker's entry), which turns it into one
    :class:`autoln.core.errors.StateLost` line (:func:`storage_lost_message`)."""

    def __init__(self, path: Path, what: str, replaced: bool) -> None:
        super().__init__(f"{path} ({what}) was {'replaced' if replaced else 'removed'}")
        self.path, self.what, self.replaced = path, what, replaced


class StorageFull(BaseException):
    """Internal: a write to the study's journal failed for want of space (a full disk, a
    file-size limit; :func:`autoln.core.io.is_space_error`). The journal is cut back to its last
    whole record (:func:`journal_backend`), so the study is intact. A ``BaseException`` for the
    reason :class:`StorageGone` is one; :func:`run_tune` turns it into one
    :class:`autoln.core.errors.WriteError` line (:func:`storage_full_message`)."""

    def __init__(self, path: Path, what: str, cause: OSError) -> None:
        super().__init__(f"{path} ({what}): {cause.strerror or cause}")
        self.path, self.what, self.cause = path, what, cause


def storage_write_error(exc: BaseException) -> Optional[str]:
    """The cause, in the driver's words, when ``exc`` or its causes are a write the study's
    database refused (SQLAlchemy's ``OperationalError``: SQLite's ``database or disk is full``,
    or its ``disk I/O error`` under a file-size limit), or a write that failed for want of
    space (:func:`autoln.core.io.is_space_error`); None otherwise. Optuna reports such a failure in
    its own errors over it (``StorageInternalError``, then ``AssertionError: Should not reach``)."""
    from autoln.core.io import is_space_error

    seen = set()
    while exc is not None and id(exc) not in seen:
        if is_space_error(exc):
            return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        if type(exc).__name__ == "OperationalError" and type(exc).__module__.startswith("sqlalchemy"):
            orig = getattr(exc, "orig", None)
            return str(orig or exc).splitlines()[0]
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class StorageFile:
    """The file a study's storage keeps it in (the journal, or a SQLite database) and its
    identity (device, inode) when this process opened it.

    Args:
        path: the file; None for a storage without one (PostgreSQL, MySQL, SQLite in memory),
            whose :meth:`check` does nothing.
        what: its name in messages (``journal``, ``SQLite database``).
    """

    def __init__(self, path: Optional[Path], what: str) -> None:
        self.path, self.what = path, what
        self.identity = self._identity() if path is not None else None

    def _identity(self) -> Optional[tuple[int, int]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self) -> None:
        """Raise :class:`StorageGone` when the file at :attr:`path` is not the one opened (removed,
        or another file put in its place)."""
        if self.path is None:
            return
        now = self._identity()
        if now != self.identity:
            raise StorageGone(self.path, self.what, replaced=now is not None)


def journal_backend(path: Path):
    """Optuna's ``JournalFileBackend`` on ``path``, checking before each read and append that
    the file is still the one it opened (:attr:`file`, a :class:`StorageFile`). Optuna's own
    backend re-creates a removed journal at its next append, as a journal without the study's
    first records: its next read fails (``json ... Extra data``, its offsets point into the old
    file), and a re-run would read that headless file as the study."""
    from optuna.storages.journal import JournalFileBackend

    class WatchedJournalFile(JournalFileBackend):
        def __init__(self, file_path: str) -> None:
            super().__init__(file_path)  # creates the file when missing
            self.file = StorageFile(Path(file_path), "journal")

        def read_logs(self, log_number_from: int):
            self.file.check()
            try:
                yield from super().read_logs(log_number_from)
            except (OSError, ValueError):  # removed or replaced while being read
                self.file.check()
                raise

        def append_logs(self, logs) -> None:
            from autoln.core.io import is_space_error

            self.file.check()
            file_path = self.file.path
            size = os.path.getsize(file_path)
            try:
                super().append_logs(logs)
            except OSError as exc:
                if not is_space_error(exc):
                    raise
                try:  # a record cut short would spoil every later one: back to the last whole record
                    os.truncate(file_path, size)
                except OSError:
                    pass
                raise StorageFull(Path(file_path), "journal", exc) from None

    return WatchedJournalFile(str(path))


def sqlite_file(url: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URL (relative to the working directory, as SQLite
    opens it), or None for another database or SQLite in memory."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # a bad URL: open_storage names it
        return None
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return None
    return Path(name)


#: Times to reopen an RDB storage whose schema another command was creating at the same moment.
SCHEMA_RACE_RETRIES = 3


def open_storage(cfg: Config, out: Path):
    """The study's storage: a journal file ``out/study.journal`` or the RDB at ``tune.storage``.
    Its attribute ``autoln_file`` is the :class:`StorageFile` it keeps the study in (the
    journal, a SQLite file, or none), watched by the study's every trial.

    Raises:
        ConfigError: the URL's database driver is not installed, or the database refuses the
            connection (names ``tune.storage``).
    """
    optuna = _optuna()
    tc = cfg.tune
    if tc.storage is None:
        from optuna.storages.journal import JournalStorage

        backend = journal_backend(out / JOURNAL_FILE)
        storage = JournalStorage(backend)
        storage.autoln_file = backend.file  # the study's file, watched (open_study passes it on)
        return storage
    try:
        for attempt in range(SCHEMA_RACE_RETRIES + 1):
            try:
                storage = optuna.storages.RDBStorage(tc.storage, heartbeat_interval=tc.heartbeat_interval,
                                                     grace_period=tc.grace_period,
                                                     heartbeat_stale_trial_callback=retry_callback(cfg))
                database = sqlite_file(tc.storage)
                storage.autoln_file = StorageFile(database if database is not None and database.exists() else None,
                                                  "SQLite database")
                return storage
            except Exception as exc:
                # Two commands starting at once on an empty database both create Optuna's tables;
                # the loser's CREATE TABLE fails with "already exists". Opening again finds them.
                if attempt == SCHEMA_RACE_RETRIES or "already exists" not in str(exc):
                    raise
                time.sleep(0.5 + random.random())
    except ModuleNotFoundError as exc:
        driver = "psycopg2-binary" if exc.name and "psycopg" in exc.name else exc.name
        install = pip_extra("postgres") if driver == "psycopg2-binary" else f"{beside_python('pip', 'pip')} install {driver}"
        raise ConfigError(f"tune.storage {_redact(tc.storage)}: the database driver '{exc.name}' is not installed "
                          f"({install})") from None
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
        if section in ("logging", "race"):  # how the answer is shown and decided after a search, not what a trial measures
            continue
        for key, value in values.items():
            if f"{section}.{key}" not in RESUMABLE_KEYS:
                flat[f"{section}.{key}"] = value
    return flat


def open_study(cfg: Config, out: Path, rank: int = 0, create: bool = False):
    """Create (``create``) or load the study ``tune.study_name`` with this worker's sampler.
    Its attribute ``autoln_file`` is the storage's :class:`StorageFile`.

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
    study.autoln_file = storage.autoln_file
    study.sampler = make_sampler(cfg, rank, len(study.get_trials(deepcopy=False)))
    if study.direction != optuna.study.StudyDirection.MINIMIZE or len(study.directions) != 1:
        raise ConfigError(f"{where} is not a single-objective minimisation study; autoln's studies minimise "
                          "the valid loss (choose another tune.study_name)")
    from autoln.data import load_corpus

    mine = study_config(cfg)
    theirs = study.user_attrs.get("autoln_config")
    if theirs is None:
        if create:
            study.set_user_attr("autoln_config", mine)
            study.set_user_attr("metric", _headline(cfg))
            study.set_user_attr("data_fingerprint", load_corpus(cfg.data).fingerprint)
    elif theirs != mine:
        default = study_config(Config())  # a key one side lacks (another autoln version) counts as its default
        keys = [k for k in sorted(set(theirs) | set(mine)) if theirs.get(k, default.get(k)) != mine.get(k, default.get(k))]
        if "data.corpus" in keys and study.user_attrs.get("data_fingerprint") == load_corpus(cfg.data).fingerprint:
            keys.remove("data.corpus")  # the corpus moved with its bytes (another machine): the same study
            if rank == 0:
                print(f"note: the study's corpus moved ({theirs['data.corpus']} -> {mine['data.corpus']}); its bytes are the "
                      "study's, so the study goes on with it", file=sys.stderr)
        diff = [f"{k} ({_clipped_repr(theirs.get(k, default.get(k)))} in the study, {_clipped_repr(mine.get(k, default.get(k)))} now)"
                for k in keys]
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
    from autoln.core.tb import Logger

    clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
    metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    with Logger(trial_dir) as log:
        log.hparams(clean, metrics)  # the trial's own run: a full disk names its event file


class Objective:
    """The value a trial minimises (see the module docstring); records the outcome, reason,
    genotype and metrics in the trial's user attributes.

    Args:
        cfg: the study's resolved config.
        out: the study folder; the trial writes ``trials/NNNN``.
        worker: this worker's id (``host:pid:rank``), recorded on each trial.
        storage_file: the study's :class:`StorageFile` (``study.autoln_file``), checked when a
            trial ends; None: not checked.
    """

    def __init__(self, cfg: Config, out: Path, worker: str, storage_file: Optional[StorageFile] = None) -> None:
        self.cfg, self.out, self.worker = cfg, out, worker
        self.headline = _headline(cfg)
        self.file = storage_file or StorageFile(None, "storage")

    def __call__(self, trial) -> float:
        """Run the trial (:meth:`run`). An exception it ends with while the study's file is gone
        (a storage error that the removal caused) becomes :class:`StorageGone`, which Optuna
        passes on; the file is checked once more before Optuna writes the value."""
        try:
            value = self.run(trial)
        except StorageGone:
            raise
        except BaseException:
            self.file.check()
            raise
        self.file.check()
        return value

    def run(self, trial) -> float:
        """The trial itself: suggest, search (:meth:`search`), proxy retrain, score."""
        optuna = _optuna()
        from autoln.retrain.run_retrain import run_retrain
        from autoln.core.errors import DivergenceError

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
        earlier = tdir.is_dir()  # a trial's folder is its own: one found now is a lost study's (its journal went)
        tdir.mkdir(parents=True, exist_ok=True)
        trial.set_user_attr("trial_dir", str(tdir))
        metrics: dict[str, float] = {}
        line = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        print(f"[tune] trial {trial.number} ({self.worker}) starts: {line}", file=sys.stderr, flush=True)
        reports: dict[int, float] = {}

        def report(offset: int):
            def hook(step: int, valid: dict) -> None:
                reports[offset + step] = valid[self.headline]  # before the storage: kept if that fails
                write_json_atomic(tdir / REPORTS_FILE, {str(k): v for k, v in sorted(reports.items())})  # NaN as null
                self.file.check()  # a SQLite file's removal shows only at a write, as an error of the trial's
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
            result = self.search(trial.number, cfg, tdir, report(0), earlier)
            trial.set_user_attr("genotype", result.genotype.to_dict())
            trial.set_user_attr("placements", result.genotype.describe())
            skipped = {"search": result.genotype.provenance["metrics"].get("skipped_batches", 0),
                       "selection": result.genotype.provenance.get("selection", {}).get("skipped_batches", 0)}
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
                skipped["proxy_retrain"] = (read_json(retrained.path) or {}).get("skipped_batches", 0)
            record_skipped(trial, skipped)
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
            tdir.mkdir(parents=True, exist_ok=True)  # the trial's folder may be what was removed
            write_text_atomic(tdir / "error.txt", traceback.format_exc())
            finish("error", f"{type(exc).__name__}: {exc} (traceback in {tdir / 'error.txt'})")
            raise

    def search(self, number: int, cfg: Config, tdir: Path, hook, earlier: bool):
        """The trial's search in ``tdir/search``: a new one, or, when ``earlier`` (the folder was
        there before the trial: a lost study's, see the module docstring), the search it holds
        (:func:`earlier_search`): a finished one is reused, one with a checkpoint resumed, each
        after replaying the valid losses it reported (``reports.json``) through ``hook``; one
        made with other settings is moved aside (:func:`set_aside`). Returns the
        :class:`autoln.oneshot.run_search.SearchResult` (``model`` None when reused).

        Raises:
            optuna.TrialPruned: the pruner stops the trial at a replayed step.
        """
        from autoln.models.genotype import Genotype
        from autoln.oneshot.run_search import GENOTYPE_FILE, SearchResult, run_search

        folder = tdir / "search"
        held = earlier_search(folder, cfg) if earlier else None
        if held == "other":
            aside = set_aside(tdir)
            print(f"[tune] trial {number}: {tdir} held a trial of another study with other settings; moved it to {aside}",
                  file=sys.stderr, flush=True)
            held = None
        if held is None:
            (tdir / REPORTS_FILE).unlink(missing_ok=True)  # an earlier trial's, if any: not this search's
            return run_search(cfg, folder, overwrite=True, on_eval=hook)
        recorded = read_json(tdir / REPORTS_FILE)
        recorded = recorded if isinstance(recorded, dict) else {}
        try:
            replay = sorted((int(k), math.nan if v is None else float(v)) for k, v in recorded.items() if int(k) <= cfg.search.steps)
        except (TypeError, ValueError):
            replay = []
        if held == "finished":
            genotype = Genotype.load(folder / GENOTYPE_FILE)
            measured = genotype.provenance["metrics"]
            print(f"[tune] trial {number}: reusing {folder / GENOTYPE_FILE}, a finished search of this trial's settings "
                  "from the study this folder held before", file=sys.stderr, flush=True)
            for step, value in replay or [(measured["steps"], measured["supernet_valid"][self.headline])]:
                hook(step, {self.headline: value})
            return SearchResult(genotype, folder / GENOTYPE_FILE, measured["supernet_valid"], measured["wall_time_s"], None)
        print(f"[tune] trial {number}: resuming {folder} from its checkpoint, a search of this trial's settings from the "
              "study this folder held before", file=sys.stderr, flush=True)
        for step, value in replay:
            hook(step, {self.headline: value})
        return run_search(cfg, folder, on_eval=hook, resume=True)


def record_skipped(trial, skipped: dict[str, int]) -> None:
    """Keep on the trial the updates ``on_divergence: skip_batch`` skipped (user attribute
    ``skipped_batches``: by part of the trial, ``search``, ``selection``, ``proxy_retrain``),
    with one warning line when there were any: a score made over skipped updates is weaker."""
    trial.set_user_attr("skipped_batches", skipped)
    if any(skipped.values()):
        parts = ", ".join(f"{n} in the {k.replace('_', ' ')}" for k, n in skipped.items() if n)
        print(f"[tune] trial {trial.number}: warning: updates skipped (NaN/inf loss or gradient, on_divergence=skip_batch): "
              f"{parts}", file=sys.stderr, flush=True)


def earlier_search(folder: Path, cfg: Config) -> Optional[str]:
    """What the search folder ``folder`` of a trial holds from before the trial (a lost study's):
    ``"finished"`` (a genotype searched with ``cfg``'s data, model and search sections,
    :func:`autoln.oneshot.consensus.check_same_search`), ``"checkpoint"`` (a checkpoint of a search whose
    ``config.yaml`` ``--resume`` accepts with ``cfg``, :func:`autoln.runs.checkpoint.resume_differences`),
    ``"other"`` (either, made otherwise, or unreadable) or None (neither: nothing to keep)."""
    import torch

    from autoln.runs.checkpoint import moved_corpus, resume_differences
    from autoln.config import with_defaults
    from autoln.oneshot.consensus import check_same_search
    from autoln.oneshot.run_search import GENOTYPE_FILE
    from autoln.runs.training import CHECKPOINT_FILE

    if (folder / GENOTYPE_FILE).exists():
        try:
            check_same_search(folder, cfg)
        except AutolnError:  # other settings, or a genotype file that does not read
            return "other"
        return "finished"
    if (folder / CHECKPOINT_FILE).exists():
        try:
            saved = read_yaml((folder / "config.yaml").read_text(encoding="utf-8"))
            diffs = resume_differences(with_defaults(saved), cfg.to_dict(), "search")[0] if isinstance(saved, dict) else ["?"]
            if any(d.startswith("data.corpus ") for d in diffs):  # a corpus that moved with its bytes is the same
                ckpt = torch.load(folder / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
                diffs = moved_corpus(diffs, ckpt.get("data_fingerprint"), cfg)[0]
            same = not diffs
        except Exception:  # noqa: BLE001 - unreadable config or checkpoint (yaml, torch, a bad corpus): not reusable
            same = False
        return "checkpoint" if same else "other"
    return None


def set_aside(tdir: Path) -> Path:
    """Rename the trial folder ``tdir`` to the first free ``NNNN.earlier``, ``NNNN.earlier2``, ...
    beside it (nothing of another study is deleted), and create ``tdir`` anew. Returns the new name."""
    aside, k = tdir.with_name(f"{tdir.name}.earlier"), 1
    while aside.exists():
        k += 1
        aside = tdir.with_name(f"{tdir.name}.earlier{k}")
    tdir.rename(aside)
    tdir.mkdir()
    return aside


def trial_folders(out: Path) -> tuple[list[int], list[int]]:
    """The trials under ``out/trials`` whose search finished (``genotype.json``) and those whose
    search stopped with a checkpoint."""
    from autoln.oneshot.run_search import GENOTYPE_FILE
    from autoln.runs.training import CHECKPOINT_FILE

    finished, stopped = [], []
    for folder in sorted((out / TRIALS_DIR).glob("[0-9][0-9][0-9][0-9]")):
        if (folder / "search" / GENOTYPE_FILE).exists():
            finished.append(int(folder.name))
        elif (folder / "search" / CHECKPOINT_FILE).exists():
            stopped.append(int(folder.name))
    return finished, stopped


def storage_lost_message(gone: StorageGone, out: Path) -> str:
    """The one line of a study whose storage file went (``gone``): the file, that the study's
    record went with it, the trial folders kept, and the command that starts it again and
    reuses them (:meth:`Objective.search`)."""
    again = resume_command(out)
    what = (f"{gone.path}, the study's {gone.what}, was {'replaced by another file' if gone.replaced else 'removed'} "
            "while the study ran")
    if not out.is_dir():
        return f"{what}, and the study folder {out} with it: nothing of the study is left; start it again with: {again}"
    finished, stopped = trial_folders(out)
    kept = []
    if finished:
        kept.append(f"the finished searches of trial(s) {', '.join(map(str, finished))} (trials/NNNN/search/genotype.json)")
    if stopped:
        kept.append(f"the checkpoints of the searches of trial(s) {', '.join(map(str, stopped))} (trials/NNNN/search/checkpoint.pt)")
    return (f"{what}: the record of its trials (parameters, scores, states) went with it, so this command stopped. "
            f"Kept in {out / TRIALS_DIR}: {' and '.join(kept) if kept else 'no trial had a search on disk yet'}. "
            f"Run the same command again: it starts the study anew, and a trial whose folder holds a search of its own "
            f"settings reuses it, or resumes it from its checkpoint (with one worker and the same tune.seed the trials "
            f"draw the same parameters again, so no finished search is redone; a folder of other settings is moved "
            f"aside, not deleted): {again}")


def storage_full_message(path, what: str, cause: str, out: Path) -> str:
    """The one line of a study whose storage could not be written for want of space: the file,
    that the study is intact, the trial folders kept, and the command that goes on."""
    finished, stopped = trial_folders(out) if out.is_dir() else ([], [])
    kept = [f"the finished searches of trial(s) {', '.join(map(str, finished))}"] if finished else []
    if stopped:
        kept.append(f"the checkpoints of trial(s) {', '.join(map(str, stopped))}")
    return (f"cannot write {path} ({what}): {cause}; the study's record up to its last write is intact"
            f"{', and ' + ' and '.join(kept) + ' are kept in ' + str(out / TRIALS_DIR) if kept else ''}. Once there is space, "
            f"run the same command again; it goes on with the study: {resume_command(out)}")


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
    trial may still fail and free its slot; RDB heartbeats detect dead workers here). Before
    each trial it checks the study's file (:class:`StorageFile`) and the folder's lock
    (:func:`autoln.core.locks.check_held`, held by the command's own process).

    Raises:
        StorageGone: the study's journal or SQLite file was removed or replaced.
        StateLost: the lock file was removed and another command took the folder.
    """
    optuna = _optuna()
    if threads:
        import torch

        torch.set_num_threads(threads)
    study = open_study(cfg, out, rank)
    worker = f"{socket.gethostname()}:{os.getpid()}:rank{rank}"
    objective = Objective(cfg, out, worker, study.autoln_file)
    while True:
        study.autoln_file.check()
        check_held(lock_kept(out))
        optuna.storages.fail_stale_trials(study)
        c = census(study)
        if c.finished >= cfg.tune.n_trials:
            return
        if c.finished + c.running >= cfg.tune.n_trials:
            time.sleep(POLL_S)
            continue
        study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)


def lock_kept(out: Path) -> str:
    """The end of the message when another command took the study's folder
    (:meth:`autoln.core.locks.FolderLock.check`): what is kept and the command that goes on."""
    return (f"; the finished trials stay in the study's storage and their folders: once that command has ended, run "
            f"this one again: {resume_command(out)}")


def _worker_entry(cfg: Config, out: str, rank: int, threads: int) -> None:
    """Entry of a spawned worker process: exit 0 when done, 2 on bad input, 130 on Ctrl-C,
    :data:`WORKER_STORAGE_GONE` (silently: the command says it) when the study's file went."""
    try:
        run_worker(cfg, Path(out), rank, threads)
    except StorageGone:
        sys.exit(WORKER_STORAGE_GONE)
    except StorageFull as full:
        print(f"error: worker rank {rank}: cannot write {full.path} (the study's {full.what}): {full.cause.strerror}",
              file=sys.stderr)
        sys.exit(2)
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
    from autoln.runs.training import FINISHED_MARKERS, check_out_dir

    single = [m for m in FINISHED_MARKERS if (out / m).exists()]
    if single and not overwrite:
        raise OutputError(f"--out {out} holds a single search or retrain run ({single[0]}), not a study; "
                          "choose another folder or pass --overwrite")
    check_out_dir(out, overwrite=True, study_ok=True)


def preflight(cfg: Config) -> None:
    """Check once, before any trial, what every trial would otherwise fail on: the corpus, its
    length against ``model.context``, the device and the number of candidates.

    Raises:
        DataError, ConfigError: as :func:`autoln.oneshot.run_search.run_search` would.
    """
    from autoln.data import check_lengths, load_corpus
    from autoln.oneshot.run_search import check_searchable
    from autoln.runs.training import resolve_device

    check_searchable(cfg.model)
    resolve_device(cfg.search.device)
    resolve_device(cfg.retrain.device)
    check_lengths(load_corpus(cfg.data), cfg.model.context)


def run_tune(cfg: Config, out: str | Path, workers: int = 1, overwrite: bool = False) -> TuneResult:
    """Run (or resume) the study of ``cfg.tune`` with ``workers`` processes on this machine,
    then write the report (:func:`autoln.tune.report.write_report`).

    ``overwrite`` deletes the study (in its storage, RDB included) and the folder's contents
    first. Without it, an existing study is resumed when its config matches.

    Raises:
        ConfigError: bad ``workers``, storage or a study made with another config.
        OutputError: the folder is unusable or another command holds its lock.
        StateLost: the study's journal or SQLite file was removed or replaced while it ran
            (:func:`storage_lost_message`), or its lock file was removed and another command
            took the folder.
        DataError: the corpus cannot be read or is too short (checked before any trial).
    """
    from autoln.tune.report import write_report

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
        try:
            return _run_study(cfg, out, workers, study, started)
        except KeyboardInterrupt:
            study.autoln_file.check()  # a removed journal is what to report, not the Ctrl-C
            # keep the report of what finished; the interrupted trial is queued to re-run
            write_report(open_study(cfg, out, cfg.tune.rank_offset), cfg, out)
            raise
        except AutolnError:
            raise
        except Exception as exc:
            study.autoln_file.check()  # a storage error that its removed file caused: say that instead
            cause = storage_write_error(exc)
            if cause is not None:  # an RDB (SQLite) that cannot write: Optuna ends in its own error over it
                raise WriteError(storage_full_message(cfg.tune.storage, "the study's database", cause, out)) from None
            raise
    except StorageGone as gone:
        raise StateLost(storage_lost_message(gone, out)) from None
    except StorageFull as full:
        raise WriteError(storage_full_message(full.path, f"the study's {full.what}", full.cause.strerror, out)) from None
    except AutolnError:
        if created and study is None:  # refused before anything was written: leave no folder behind
            lock.release()
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        lock.release()


def _run_study(cfg: Config, out: Path, workers: int, study, started: float) -> TuneResult:
    """The body of :func:`run_tune` once its ``study`` is open: recover lost trials, run the
    workers, write the report.

    Raises:
        StorageGone: the study's journal or SQLite file was removed or replaced meanwhile.
    """
    from autoln.tune.report import write_report

    write_text_atomic(out / "config.yaml", cfg.to_yaml())
    if cfg.tune.storage is None:  # the lock proves no live worker: RUNNING trials are lost ones
        lost = recover_lost(study, cfg, lambda t: True)
        if lost:
            print(f"[tune] trials {lost} were running when their command died: marked failed and queued to re-run",
                  file=sys.stderr)
    c = census(study)
    print(f"[tune] study '{cfg.tune.study_name}' -> {out}: {c.finished}/{cfg.tune.n_trials} finished, "
          f"{c.running} running, {c.waiting} waiting; {workers} worker(s)", file=sys.stderr, flush=True)
    earlier = sorted(p.name for p in (out / TRIALS_DIR).glob("[0-9][0-9][0-9][0-9]") if p.is_dir())
    if earlier and not study.get_trials(deepcopy=False):
        print(f"[tune] the study is new, but {out / TRIALS_DIR} holds {len(earlier)} trial folder(s) of an earlier one (its "
              "storage was removed?): a trial whose folder holds a search of its own settings reuses it, or resumes it "
              "from its checkpoint; one with other settings is moved aside to NNNN.earlier", file=sys.stderr, flush=True)
    if c.finished < cfg.tune.n_trials:
        if workers == 1:
            run_worker(cfg, out, cfg.tune.rank_offset)
        else:
            _run_processes(cfg, out, workers, study)
    study.autoln_file.check()  # before opening it again (a removed journal would be created anew, empty)
    study = open_study(cfg, out, cfg.tune.rank_offset)
    files = write_report(study, cfg, out)
    c = census(study)
    best = best_trial(study)
    return TuneResult(out, c, best.number if best else None, best.value if best else None, files,
                      time.perf_counter() - started)


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
    CPU threads each) and wait; when one dies, fail and re-queue the trial it was running.
    Every half second it checks the study's file and the folder's lock, as :func:`run_worker`;
    when either went, the workers are stopped with SIGTERM (each search writes its checkpoint).

    Raises:
        StorageGone, StateLost: as :func:`run_worker`.
        ConfigError: a worker refused its input.
    """
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
                study.autoln_file.check()
                check_held(lock_kept(out))
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
