"""The storage of a ``search.py --tune`` study (docs/design.md §5): opening Optuna's storage
(:func:`open_storage`), the study with this worker's sampler and pruner (:func:`open_study`),
and the check that a resumed study was made with the same settings (:func:`study_config`).

Storage: Optuna's journal file by default (one machine; a lock file keeps a second command off
the folder, so trials found RUNNING at start are lost ones), or any RDB URL (many machines; a
heartbeat fails the trials of dead workers and Optuna's ``RetryHeartbeatStaleTrialCallback`` re-runs
them).

The journal (or a ``sqlite:///`` database file) removed or replaced while the study runs raises
:class:`StorageGone`; a write refused for want of space, :class:`StorageFull`
(:mod:`autoln.tune.run` turns each into one line).
"""

from __future__ import annotations

import os
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

from autoln.core.commands import beside_python, pip_extra
from autoln.config import Config
from autoln.core.errors import ConfigError
from autoln.tune.study import _headline, _optuna

JOURNAL_FILE = "study.journal"
#: Config keys that may change between runs of one study (they do not change what a trial computes).
RESUMABLE_KEYS = ("tune.n_trials", "tune.storage", "tune.rank_offset", "tune.heartbeat_interval", "tune.grace_period",
                  "tune.max_retry", "search.device", "retrain.device")


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
    file), and a re-run would read that headless file as the study. A record Optuna's reader
    refuses raises :class:`autoln.tune.journal.JournalDamaged`, naming its line, in place of
    Optuna's bare ``JSONDecodeError``."""
    from optuna.storages.journal import JournalFileBackend

    from autoln.tune.journal import JournalDamaged, first_damage

    class WatchedJournalFile(JournalFileBackend):
        def __init__(self, file_path: str) -> None:
            super().__init__(file_path)  # creates the file when missing
            self.file = StorageFile(Path(file_path), "journal")

        def read_logs(self, log_number_from: int):
            self.file.check()
            try:
                yield from super().read_logs(log_number_from)
            except (OSError, ValueError) as exc:  # removed or replaced while being read, or a damaged record
                self.file.check()
                damage = first_damage(self.file.path.read_bytes(), blank_ok=False) if isinstance(exc, ValueError) else None
                if damage is not None:
                    raise JournalDamaged(self.file.path, *damage) from None
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
                          f"{storage_error_text(exc, tc.storage)}{hint}") from None


def storage_error_text(exc: BaseException, url: str) -> str:
    """The first line of the error ``exc`` that opening the storage at ``url`` raised, cut to 300
    characters; Optuna's schema mismatch (``... execute `$ optuna storage upgrade --storage
    $STORAGE_URL` ...``) whole, with the URL itself in place of its placeholder (the password
    masked, :func:`_redact`) and the ``optuna`` script beside this interpreter."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "$STORAGE_URL" not in text:
        return text[:300]
    optuna_script = beside_python("optuna", "optuna")
    return text.replace("`$ optuna ", f"`{optuna_script} ").replace("$STORAGE_URL", shlex.quote(_redact(url)))


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
