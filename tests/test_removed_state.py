"""A state file removed under a running command (issue 36): the study's journal or SQLite
database under ``search.py --tune``, a run's checkpoint between two writes, the run folder, and
the folder's lock file. Each removal is injected in-process at a known evaluation (no timing):
the command ends in one line ``error: ...`` (exit 2) naming the file, what was kept and the
command that goes on, and that command loses no finished work."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoln import cli
from autoln.core.commands import command_line
from autoln.core.errors import OutputError
from autoln.core.locks import LOCK_FILE, FolderLock

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, str]:
    """A small text corpus and its token cache, shared by the module's runs."""
    base = tmp_path_factory.mktemp("removed-state")
    text = base / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    return str(text), str(base / "cache")


def overrides(corpus) -> list[str]:
    """A search of 20 steps, evaluated (and checkpointed) at steps 10 and 20."""
    text, cache = corpus
    return [f"data.corpus={text}", f"data.cache_dir={cache}", "logging.progress=false", "search.steps=20",
            "search.eval_every=10", "search.arch_warmup_steps=4", "search.eval_windows=4", "search.monitor_windows=0",
            "search.selection=argmax"]


def common(corpus) -> list[str]:
    return ["--config", TINY, *(a for kv in overrides(corpus) for a in ("--set", kv))]


def sets(argv: list[str]) -> list[str]:
    """The ``--set`` values of a command line."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


def tune_args(corpus, out: Path, *extra: str) -> list[str]:
    return ["--tune", *common(corpus), "--out", str(out), "--set", "tune.score=supernet", "--set", "tune.pruner=none",
            "--set", "tune.sampler=random", "--set", "tune.n_trials=2", "--set", "logging.tensorboard=false", *extra]


def search(monkeypatch, capsys, argv: list[str]) -> tuple[int, str]:
    """``search.py argv`` in this process (``sys.argv`` as the command's, for the hints it prints);
    returns the exit status and stderr."""
    monkeypatch.setattr(sys, "argv", ["search.py", *argv])
    capsys.readouterr()
    status = cli.search_main(argv)
    return status, capsys.readouterr().err


def at_evaluation(monkeypatch, folder_part: str, step: int, action) -> None:
    """Run ``action()`` after the evaluation of ``step`` (its checkpoint written) of the first
    search whose folder's path ends with ``folder_part``, once."""
    import autoln.oneshot.run_search as rs

    original, done = rs.run_search, []

    def run_search(cfg, out, overwrite=False, on_eval=None, resume=False):
        def hook(s: int, valid: dict) -> None:
            if s == step and str(out).endswith(folder_part) and not done:
                done.append(s)
                action()
            if on_eval is not None:
                on_eval(s, valid)
        return original(cfg, out, overwrite=overwrite, on_eval=hook, resume=resume)

    monkeypatch.setattr(rs, "run_search", run_search)


def never_waiting(monkeypatch) -> None:
    """A one-worker study never waits for another worker's trial: fail instead of sleeping
    (today's main, its journal replayed headless, can wait forever on a trial it thinks runs)."""
    import time

    from autoln.tune import workers

    def sleep(seconds: float) -> None:
        raise AssertionError(f"the worker waits ({seconds} s) for a running trial that no worker runs")

    monkeypatch.setattr(workers, "time", SimpleNamespace(sleep=sleep, perf_counter=time.perf_counter))


def rows(out: Path) -> list[dict]:
    with open(out / "trials.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def only_error_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


# --- the study's storage -------------------------------------------------------------------------


def test_a_removed_journal_stops_in_one_line_and_the_rerun_reuses_and_resumes_the_trials(tmp_path, corpus, monkeypatch, capsys):
    """The journal removed while trial 1 searches (after its step-10 checkpoint): exit 2, one line
    naming the journal, trial 0's finished search and trial 1's checkpoint; the journal is not
    re-created headless. The same command again reuses trial 0's genotype (no new search),
    resumes trial 1 from its checkpoint, and ends with exactly the scores and reports of an
    uninterrupted study (today: three tracebacks ending in UnboundLocalError, exit 1, or, the
    journal re-created headless by the next append, an endless wait for a trial it thinks runs)."""
    from autoln.config import load_config
    from autoln.tune import open_study

    reference = tmp_path / "reference"
    status, _ = search(monkeypatch, capsys, tune_args(corpus, reference))
    assert status == 0

    out = tmp_path / "study"
    journal = out / "study.journal"
    never_waiting(monkeypatch)
    with monkeypatch.context() as m:
        at_evaluation(m, "trials/0001/search", 10, journal.unlink)
        status, err = search(m, capsys, tune_args(corpus, out))
    line = only_error_line(err)
    assert status == 2
    assert line.startswith(f"error: {journal}, the study's journal, was removed while the study ran: the record of its trials")
    assert "the finished searches of trial(s) 0 (trials/NNNN/search/genotype.json)" in line
    assert "the checkpoints of the searches of trial(s) 1 (trials/NNNN/search/checkpoint.pt)" in line
    assert line.endswith("Run the same command again: it starts the study anew, and a trial whose folder holds a search of its "
                         "own settings reuses it, or resumes it from its checkpoint (with one worker and the same tune.seed the "
                         "trials draw the same parameters again, so no finished search is redone; a folder of other settings "
                         "is moved aside, not deleted): " + command_line("search.py", *tune_args(corpus, out)))
    assert not journal.exists() and not os.path.lexists(out / "study.journal.lock")
    assert (out / "trials" / "0000" / "search" / "genotype.json").is_file()
    assert (out / "trials" / "0001" / "search" / "checkpoint.pt").is_file()
    assert not (out / "trials" / "0001" / "search" / "genotype.json").exists()
    assert list(json.loads((out / "trials" / "0001" / "reports.json").read_text())) == ["10"]

    status, err = search(monkeypatch, capsys, tune_args(corpus, out))
    assert status == 0, err[-3000:]
    assert f"[tune] trial 0: reusing {out / 'trials' / '0000' / 'search' / 'genotype.json'}" in err
    assert f"autoln search -> {out / 'trials' / '0000' / 'search'}" not in err  # not searched again
    assert f"[tune] trial 1: resuming {out / 'trials' / '0001' / 'search'} from its checkpoint" in err
    assert f"resumed from {out / 'trials' / '0001' / 'search' / 'checkpoint.pt'} at step 10" in err
    ours, theirs = rows(out), rows(reference)
    assert [(r["number"], r["outcome"], r["score"], r["genotype"]) for r in ours] == \
        [(r["number"], r["outcome"], r["score"], r["genotype"]) for r in theirs]
    cfg = load_config(TINY, sets(tune_args(corpus, out)))
    values = [t.intermediate_values for t in open_study(cfg, out).get_trials(deepcopy=False)]
    assert values == [t.intermediate_values for t in open_study(cfg, reference).get_trials(deepcopy=False)]
    assert sorted(values[0]) == [10, 20]  # trial 0's replayed from reports.json


def test_a_trial_folder_of_other_settings_is_moved_aside_not_overwritten(tmp_path, corpus, monkeypatch, capsys):
    """A study whose journal went, re-run with another space: trial 0's folder holds a search of
    other settings, so it moves to trials/0000.earlier whole (today: overwritten)."""
    out = tmp_path / "study"
    status, _ = search(monkeypatch, capsys, tune_args(corpus, out, "--set", "tune.n_trials=1"))
    assert status == 0
    before = (out / "trials" / "0000" / "search" / "genotype.json").read_text()
    (out / "study.journal").unlink()  # between two commands
    other = tune_args(corpus, out, "--set", "tune.n_trials=1", "--set", "tune.space={search.lr: {categorical: [0.003]}}")
    status, err = search(monkeypatch, capsys, other)
    assert status == 0, err[-3000:]
    assert "holds 1 trial folder(s) of an earlier one" in err
    assert (f"[tune] trial 0: {out / 'trials' / '0000'} held a trial of another study with other settings; moved it to "
            f"{out / 'trials' / '0000.earlier'}") in err
    assert (out / "trials" / "0000.earlier" / "search" / "genotype.json").read_text() == before
    assert json.loads((out / "trials" / "0000" / "search" / "genotype.json").read_text())["provenance"]["config"]["search"]["lr"] == 0.003


def test_a_removed_sqlite_database_stops_in_one_line(tmp_path, corpus, monkeypatch, capsys):
    """tune.storage=sqlite:///...: the database file removed during trial 0's search ends in one
    line naming it (today: SQLAlchemy's and Optuna's tracebacks ending in AssertionError)."""
    out, db = tmp_path / "study", tmp_path / "tune.db"
    args = tune_args(corpus, out, "--set", f"tune.storage=sqlite:///{db}")
    never_waiting(monkeypatch)
    at_evaluation(monkeypatch, "trials/0000/search", 10, db.unlink)
    status, err = search(monkeypatch, capsys, args)
    line = only_error_line(err)
    assert status == 2
    assert line.startswith(f"error: {db}, the study's SQLite database, was removed while the study ran")
    assert "the checkpoints of the searches of trial(s) 0" in line and line.endswith(command_line("search.py", *args))
    assert (out / "trials" / "0000" / "search" / "checkpoint.pt").is_file()
    assert not (out / "trials" / "0000" / "error.txt").exists()  # not a trial's own error


def test_a_replaced_journal_is_told_apart_from_a_removed_one(tmp_path):
    """Another file put in the journal's place (a copy back, an editor's save) is not read as the
    study's: the next storage call stops, saying so."""
    from autoln.tune import StorageGone, journal_backend

    path = tmp_path / "study.journal"
    backend = journal_backend(path)
    backend.append_logs([{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}])
    assert len(list(backend.read_logs(0))) == 1
    path.rename(tmp_path / "moved")
    path.write_text("")
    with pytest.raises(StorageGone) as gone:
        backend.append_logs([{"op_code": 0}])
    assert (gone.value.path, gone.value.what, gone.value.replaced) == (path, "journal", True)
    assert path.read_text() == ""  # nothing appended to the other file
    path.unlink()
    with pytest.raises(StorageGone) as gone:
        list(backend.read_logs(0))
    assert gone.value.replaced is False and not path.exists()


# --- a single run's folder -----------------------------------------------------------------------


def test_a_checkpoint_removed_between_two_writes_is_written_again(tmp_path, corpus):
    """Removed after step 10's checkpoint, checkpoint.pt is back at step 20's (atomic rename), and
    a search killed after that resumes from it."""
    import torch

    from autoln.config import load_config
    from autoln.oneshot.run_search import run_search

    out = tmp_path / "s"
    cfg = load_config(TINY, overrides(corpus))
    seen = {}

    def hook(step: int, valid: dict) -> None:
        if step == 10:
            (out / "checkpoint.pt").unlink()
        else:
            seen[step] = torch.load(out / "checkpoint.pt", weights_only=True)["step"]

    run_search(cfg, out, on_eval=hook)
    assert seen == {20: 20} and (out / "genotype.json").is_file()


@pytest.mark.parametrize("tensorboard", ["true", "false"])
def test_a_removed_run_folder_ends_in_one_line_naming_it(tmp_path, corpus, monkeypatch, capsys, tensorboard):
    """The run folder removed after step 10: the next write (an event file, or with TensorBoard
    off the checkpoint of step 20) ends the run in one line naming the folder and the command
    that starts it again (today: the failed write's file, or with TensorBoard off
    the checkpoint's temporary file, without saying the folder went)."""
    out = tmp_path / "s"
    argv = [*common(corpus), "--set", f"logging.tensorboard={tensorboard}", "--out", str(out)]
    at_evaluation(monkeypatch, str(out), 10, lambda: shutil.rmtree(out))
    status, err = search(monkeypatch, capsys, argv)
    line = only_error_line(err)
    assert status == 2
    assert line.startswith(f"error: --out {out}: the run folder was removed while this search ran (")
    assert line.endswith("its checkpoint went with it, so nothing is left to resume: start it again with: "
                         + command_line("search.py", *argv))
    assert not out.exists()


def test_a_removed_lock_file_is_recreated_and_a_folder_taken_meanwhile_stops_the_run(tmp_path, corpus, capsys):
    """The lock file removed after step 10: nobody took the folder, so the next checkpoint
    re-creates it (this process's line in it) with a warning and the run finishes; if another
    command took the folder meanwhile, the run stops at its next checkpoint, writing nothing,
    naming the holder and the last good checkpoint, and leaves the other's lock file alone
    (today: the run goes on beside the other command, and its release deletes the other's lock)."""
    from autoln.config import load_config
    from autoln.oneshot.run_search import run_search

    cfg = load_config(TINY, overrides(corpus))
    out = tmp_path / "free"
    lock = out / LOCK_FILE
    during = {}

    def hook(step: int, valid: dict) -> None:
        if step == 10:
            lock.unlink()
        else:
            during[step] = lock.read_text()

    run_search(cfg, out, on_eval=hook)
    assert during[20].startswith(f"autoln search (process {os.getpid()} on ")
    err = capsys.readouterr().err
    assert (f"warning: {lock}, the lock of {out}, was removed while this search ran: re-created and locked again "
            "(no other command holds the folder now); the run goes on") in err
    assert not lock.exists() and (out / "genotype.json").is_file()

    out = tmp_path / "taken"
    lock, other = out / LOCK_FILE, []

    def take(step: int, valid: dict) -> None:
        if step == 10:
            lock.unlink()
            other.append(FolderLock(out, "retrain").acquire())  # as a second command: its own open file

    with pytest.raises(OutputError) as lost:
        run_search(cfg, out, on_eval=take)
    assert type(lost.value).__name__ == "StateLost"  # an OutputError: exit 2
    message = str(lost.value)
    assert message.startswith(f"{lock}, the lock of {out}, was removed while this search ran, and autoln retrain (process "
                              f"{os.getpid()} on ")
    assert f"has taken the folder since; this run stopped so as not to write over that one's files; the last good " \
           f"checkpoint is {out / 'checkpoint.pt'}, step 10, unless that command has replaced it; once it has ended, " \
           f"continue with: " in message
    assert lock.read_text().startswith("autoln retrain (process")  # the other command's lock stays
    other[0].release()
    assert not lock.exists()
