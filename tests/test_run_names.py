"""Run folders and the lines around them: default names in UTC that sort in time whatever the
zone, and one clear line where a folder, a thread count or a storage cannot be used as given."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
import types

import pytest

from autoln.engine import training

from .conftest import ROOT


@pytest.fixture
def zone(monkeypatch):
    """Set the process's time zone (``TZ`` and ``time.tzset``), restored afterwards."""

    def set_zone(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()
    yield set_zone
    monkeypatch.undo()
    time.tzset()


def at(instant: dt.datetime):
    """A stand-in for the ``datetime`` module whose clock reads ``instant`` (aware, UTC): ``now()``
    gives the local wall time of the process's zone, ``now(tz)`` the time in ``tz``, as the real one."""

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return instant.astimezone(tz) if tz is not None else instant.astimezone().replace(tzinfo=None)
    return types.SimpleNamespace(datetime=Frozen, timezone=dt.timezone)


def test_default_names_are_utc_and_sort_in_time_across_zones(zone, monkeypatch):
    first = dt.datetime(2026, 12, 7, 3, 8, 57, tzinfo=dt.timezone.utc)
    zone("UTC")
    monkeypatch.setattr(training, "_dt", at(first))
    older = training.default_out_dir("search")
    zone("America/Los_Angeles")  # the second run 2 s later, from a shell in another zone
    monkeypatch.setattr(training, "_dt", at(first + dt.timedelta(seconds=2)))
    newer = training.default_out_dir("search")
    assert str(older) == os.path.join("runs", "search-20261207-030857Z")
    assert str(newer) == os.path.join("runs", "search-20261207-030859Z")
    assert sorted([str(newer), str(older)])[-1] == str(newer)  # `ls -d runs/search-* | tail -n 1` is the newest
    assert training.default_out_dir("retrain", "all-pre").name == "retrain-all-pre-20261207-030859Z"


def test_the_real_clock_gives_the_utc_time_under_any_zone(zone):
    zone("Asia/Tokyo")
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    name = training.default_out_dir("seeds").name
    after = dt.datetime.now(dt.timezone.utc)
    match = re.fullmatch(r"seeds-(\d{8}-\d{6})Z", name)
    assert match, name
    stamp = dt.datetime.strptime(match.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
    assert before <= stamp <= after  # Tokyo's wall time would be 9 hours ahead


def test_the_readme_s_newest_folder_idiom_holds_and_the_names_are_documented_as_utc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "S=$(ls -d runs/search-* | tail -n 1)    # the newest search folder" in readme  # true of UTC names (above)
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    assert "`runs/search-<YYYYmmdd-HHMMSS>Z` and `runs/retrain[-<baseline>]-<YYYYmmdd-HHMMSS>Z`, the time\n  in UTC (`Z`)" in usage
    assert "runs/search-20261203-160000Z/genotype.json" in (ROOT / "docs" / "race.md").read_text(encoding="utf-8")


# --- the small ones: a line that names what was given and why it does not do what was meant -----


def tiny_args(tmp_path) -> list[str]:
    """The tiny config on a small text corpus (the README), cached under ``tmp_path``."""
    text = tmp_path / "text.txt"
    if not text.exists():
        text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 3, encoding="utf-8")
    return ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", f"data.corpus={text}",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "logging.progress=false"]


def test_more_workers_than_cores_is_said_in_one_line(monkeypatch, capsys):
    import operator

    from autoln.engine import workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 1)
    assert workers.run_in_processes(operator.add, [(10,), (20,)], 2) == [11, 21]  # each call gets its 1 thread
    err = capsys.readouterr().err
    assert err.count("note: --workers 2 on 1 core:") == 1
    assert workers.run_in_processes(operator.add, [(10,)], 2) == [11]  # one call: one process, nothing to say
    assert "note: --workers" not in capsys.readouterr().err
    assert workers.oversubscribed_line(5, 2) == (
        "note: --workers 5 on 2 cores: the 5 processes share the cores (one thread each) and take turns on them, which is "
        "no faster than --workers 2 and often slower; the results are the same")
    assert workers.oversubscribed_line(2, 2) is None and workers.oversubscribed_line(1, 1) is None


def test_tune_s_worker_processes_say_it_too(tmp_path, monkeypatch, capsys):
    """``search.py --tune --workers N`` starts its own processes (autoln.tune.workers): the same line
    before the first one starts (here the first start fails, so nothing runs)."""
    import multiprocessing

    from autoln.config import load_config
    from autoln.engine import workers
    from autoln.tune import workers as tune_workers

    class Started(Exception):
        pass

    def process(**kwargs):
        raise Started()
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.setattr(multiprocessing, "get_context", lambda kind: types.SimpleNamespace(Process=process))
    with pytest.raises(Started):
        tune_workers._run_processes(load_config(None, []), tmp_path, 5, None)
    assert "note: --workers 5 on 2 cores: the 5 processes share the cores" in capsys.readouterr().err


def test_a_schema_mismatch_names_the_storage_s_own_url(tmp_path):
    import sqlite3

    import optuna

    from autoln.config import load_config
    from autoln.core.errors import ConfigError
    from autoln.tune.storage import open_storage

    db = tmp_path / "old.db"
    url = f"sqlite:///{db}"
    optuna.storages.RDBStorage(url)  # the tables, then an older schema's revision, as an old optuna left them
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v3.0.0.d'")
    with pytest.raises(ConfigError) as caught:
        open_storage(load_config(None, ["tune.storage=" + url]), tmp_path)
    text = str(caught.value)
    assert "$STORAGE_URL" not in text and f"storage upgrade --storage {url}` for upgrading the storage" in text
    assert len(text.splitlines()) == 1
    from autoln.tune.storage import storage_error_text

    secret = RuntimeError("The runtime optuna version 5.1.0 is no longer compatible with the table schema (set up by optuna "
                          "4.0.0). Please execute `$ optuna storage upgrade --storage $STORAGE_URL` for upgrading the storage.")
    shown = storage_error_text(secret, "postgresql+psycopg2://ann:hunter2@db.example:5432/studies")
    assert "hunter2" not in shown and "--storage 'postgresql+psycopg2://ann:***@db.example:5432/studies'`" in shown
    assert storage_error_text(RuntimeError("x" * 400 + "\nmore"), url) == "x" * 300


@pytest.mark.parametrize("below", [False, True])
def test_an_out_that_is_a_link_to_nothing_names_the_link_and_its_target(tmp_path, below, capsys):
    from autoln import cli

    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone" / "runs")
    out = link / "search" if below else link
    assert cli.search_main([*tiny_args(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --out {out}: {link} is a symbolic link to {tmp_path / 'gone' / 'runs'}, which does not exist; "
                   "create that folder, or choose another --out")
    assert cli.search_main([*tiny_args(tmp_path), "--tune", "--out", str(out)]) == 2
    assert f"{link} is a symbolic link to {tmp_path / 'gone' / 'runs'}, which does not exist" in capsys.readouterr().err
    assert link.is_symlink() and not (tmp_path / "gone").exists()  # nothing was created


@pytest.mark.parametrize("value", ["0", "abc"])
def test_the_busy_note_says_an_invalid_omp_num_threads_was_ignored(value, monkeypatch):
    from autoln.models.resources import busy_line

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert busy_line(threads=2, load=5.25, cores=2) == (
        "note: the machine is busy (load 5.2 on 2 cores): with 2 threads this run's threads wait on each other and it may "
        "take several times as long; give each run one thread (OMP_NUM_THREADS=1 before the command); "
        f"OMP_NUM_THREADS={value!r} now is not a positive integer, so it was ignored and the run took 2 threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a valid value: only the advice
    assert busy_line(threads=2, load=5.25, cores=2).endswith("(OMP_NUM_THREADS=1 before the command)")


def test_resume_of_an_empty_folder_is_refused_as_a_missing_one_is(tmp_path, capsys):
    from autoln import cli

    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.search_main([*tiny_args(tmp_path), "--out", str(empty), "--resume"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --resume: {empty} is not a run folder (it is empty): there is nothing "
                                               "to resume; start the run without --resume")
    assert list(empty.iterdir()) == []  # nothing was started in it
    assert cli.retrain_main([*tiny_args(tmp_path), "--genotype", "all-pre", "--out", str(empty), "--resume"]) == 2
    assert f"error: --resume: {empty} is not a run folder (it is empty)" in capsys.readouterr().err
    assert cli.search_main([*tiny_args(tmp_path), "--out", str(tmp_path / "missing"), "--resume"]) == 2
    assert f"error: --resume: {tmp_path / 'missing'} is not a run folder (it does not exist)" in capsys.readouterr().err
