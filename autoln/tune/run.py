"""``search.py --tune``: :func:`run_tune` runs (or resumes) a study in its folder under the
folder's lock, recovers the trials of a command that died, runs the workers
(:mod:`autoln.tune.workers`) and writes the report (:mod:`autoln.tune.report`); a study whose
storage file went, or could not be written, ends in one line (:func:`storage_lost_message`,
:func:`storage_full_message`).
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from autoln.core.commands import resume_command
from autoln.config import Config
from autoln.core.errors import AutolnError, ConfigError, OutputError, StateLost, WriteError
from autoln.core.io import write_text_atomic
from autoln.core.locks import FolderLock
from autoln.tune.journal import JournalDamaged, damaged_message, ready_journal
from autoln.tune.objective import TRIALS_DIR
from autoln.tune.storage import JOURNAL_FILE, StorageFull, StorageGone, open_storage, open_study, storage_write_error
from autoln.tune.study import Census, _optuna, best_trial, census
from autoln.tune.workers import _run_processes, recover_lost, run_worker

LOCK_FILE = "tune.lock"
#: The refusal of a second command on a study's folder (:class:`autoln.core.locks.FolderLock`'s ``refusal``).
LOCK_REFUSAL = ("--out {folder}: another 'search.py --tune' is running on this folder ({path} is locked by {holder}); "
                "add workers with --workers, or use an RDB tune.storage for several commands")


def trial_folders(out: Path) -> tuple[list[int], list[int]]:
    """The trials under ``out/trials`` whose search finished (``genotype.json``) and those whose
    search stopped with a checkpoint."""
    from autoln.oneshot.run_search import GENOTYPE_FILE
    from autoln.engine.training import CHECKPOINT_FILE

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


#: What a study begun anew finds in its folder (:func:`autoln.tune.journal.damaged_message`).
TRIALS_KEPT = ("a trial whose folder (trials/NNNN) holds a search of its own settings reuses it, or resumes it from its "
               "checkpoint (with one worker and the same tune.seed the trials draw the same parameters again, so no "
               "finished search is redone)")


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
    from autoln.engine.training import FINISHED_MARKERS, check_out_dir

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
    from autoln.engine.training import resolve_device

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
        OutputError: the folder is unusable or another command holds its lock, or its journal
            holds a damaged record before its last (:func:`autoln.tune.journal.damaged_message`;
            a last record cut short and blank lines are repaired, with a line that says so).
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
        if cfg.tune.storage is None and not overwrite:  # this command holds the folder: a stale lock, a torn last record
            for line in ready_journal(out / JOURNAL_FILE):  # were left by a killed command
                print(f"[tune] {line}", file=sys.stderr)
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
    except JournalDamaged as damaged:
        raise OutputError(damaged_message(damaged, TRIALS_KEPT, resume_command(out))) from None
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
    """``--overwrite``: delete the study (from its RDB; a journal goes with the folder's files, read
    or not: a damaged one too) and everything in the folder but the lock."""
    if cfg.tune.storage is not None:
        optuna = _optuna()
        try:
            optuna.delete_study(study_name=cfg.tune.study_name, storage=open_storage(cfg, out))
        except KeyError:
            pass
    for child in out.iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
