"""The workers of a ``search.py --tune`` study: one runs trials until the study has
``tune.n_trials`` finished ones (:func:`run_worker`); ``--workers N`` spawns N of them and
watches them (:func:`_run_processes`), failing and re-queueing the trials of one that died
(:func:`recover_lost`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from autoln.core.commands import resume_command
from autoln.config import Config
from autoln.core.errors import AutolnError, ConfigError
from autoln.core.locks import check_held
from autoln.engine.workers import oversubscribed_line, threads_per_worker
from autoln.tune.journal import JournalDamaged
from autoln.tune.objective import Objective
from autoln.tune.storage import StorageFull, StorageGone, open_study, retry_callback
from autoln.tune.study import _optuna, census

#: The exit status of a ``--workers`` process that found the storage's file gone (the command
#: that started it says so in one line).
WORKER_STORAGE_GONE = 75
POLL_S = 2.0


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
    except JournalDamaged as damaged:
        print(f"error: worker rank {rank}: {damaged}", file=sys.stderr)
        sys.exit(2)
    except AutolnError as exc:
        print(f"error: worker rank {rank}: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


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
    line = oversubscribed_line(workers)
    if line:
        print(line, file=sys.stderr, flush=True)
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
