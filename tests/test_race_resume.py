"""The race's stored state on ``search.py --resume`` (autoln.race.resume, autoln.tune.journal): a
journal damaged as a killed append leaves it, or busy with a killed command's lock, is repaired
with a line or refused in one line with a way on that loses no finished retrain; a resume with
other settings names each key with both values; a change that cannot apply is refused.

The retrains are rigged (:func:`reusing_job`), as a real one behaves on a re-run: a finished one
is read back from its folder, never retrained."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from autoln import cli
from autoln.config import load_config
from autoln.oneshot.run_search import run_search
from autoln.race import run_race

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
#: The rigged values: the named placements 3.0, the searched entries 0.02 below, a seed's wobble.
NOISE = (0.004, -0.002, 0.001, 0.003, -0.001, 0.002)


def tiny(tmp: Path, *sets: str) -> list[str]:
    text = tmp / "text.txt"
    if not text.exists():
        text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 3, encoding="utf-8")
    return ["--config", TINY, "--set", f"data.corpus={text}", "--set", f"data.cache_dir={tmp / 'cache'}",
            "--set", "search.steps=30", "--set", "search.eval_every=15", "--set", "search.arch_warmup_steps=6",
            "--set", "retrain.steps=30", "--set", "retrain.eval_every=15", "--set", "logging.progress=false",
            "--set", "logging.tensorboard=false", *sets]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A finished tiny search whose race has not run: its folder and command-line arguments."""
    tmp = tmp_path_factory.mktemp("race-resume")
    args = tiny(tmp)
    run_search(load_config(TINY, [a for a in args[2:] if a != "--set"]), tmp / "search")
    return tmp, args


def copy(searched, name: str) -> Path:
    tmp, _ = searched
    shutil.copytree(tmp / "search", tmp / name)
    return tmp / name


def reusing_job(trained: list, stop_after: int | None = None, hook=None):
    """A rigged ``run_job`` that keeps each value in ``<run folder>/metrics.json`` and reads a
    finished one back (as ``retrain_reusing``); a retrain it runs is appended to ``trained``. With
    ``stop_after``, the retrain after that many stops as SIGTERM stops one; ``hook(setup, n)``
    runs after the n-th retrain."""
    from autoln.engine.checkpoint import Interrupted

    def fake(setup, job):
        run_dir = setup.folder / "race" / job.entry / f"steps{job.steps}-seed{job.seed}"
        info = {"run": str(run_dir.relative_to(setup.folder)), "wall_time_s": 0.0}
        if (run_dir / "metrics.json").exists():
            return json.loads((run_dir / "metrics.json").read_text())["value"], info
        if stop_after is not None and len(trained) >= stop_after:
            raise Interrupted(signal.SIGTERM, f"stopped the race during {job.entry} at {job.steps} steps, seed {job.seed}")
        named = job.entry.startswith("all-") or job.entry in ("mix-ln", "pre-post")
        value = 3.0 + NOISE[job.seed] - (0.0 if named else 0.02 + 0.001 * (len(job.entry) % 3))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.json").write_text(json.dumps({"value": value}))
        trained.append(job.key)
        if hook is not None:
            hook(setup, len(trained))
        return value, info
    return fake


def jobs(folder: Path) -> list[tuple]:
    record = json.loads((folder / "race" / "race.json").read_text())
    return [(j["entry"], j["steps"], j["seed"], j["value"]) for j in record["jobs"]]


@pytest.fixture(scope="module")
def whole(searched):
    """The race run without a stop: its folder."""
    out = copy(searched, "whole")
    mp = pytest.MonkeyPatch()
    mp.setattr(run_race, "run_job", reusing_job([]))
    try:
        assert cli.search_main([*searched[1], "--out", str(out), "--resume"]) == 0
    finally:
        mp.undo()
    return out


def stopped(searched, name: str, monkeypatch, after: int = 4) -> tuple[Path, list]:
    """A copy whose race stopped (exit 143) after ``after`` retrains: the folder, the retrains run."""
    out = copy(searched, name)
    trained: list = []
    monkeypatch.setattr(run_race, "run_job", reusing_job(trained, stop_after=after))
    assert cli.search_main([*searched[1], "--out", str(out), "--resume"]) == 143
    assert len(trained) == after and not (out / "race" / "race.json").exists()
    return out, trained


def resume(searched, out: Path, monkeypatch, *sets: str) -> tuple[int, list]:
    trained: list = []
    monkeypatch.setattr(run_race, "run_job", reusing_job(trained))
    return cli.search_main([*searched[1], *sets, "--out", str(out), "--resume"]), trained


def journal(out: Path) -> Path:
    return out / "race" / "study.journal"


# --- the journal, damaged or busy; the other records of a run ---------------------------------


def test_a_torn_last_record_and_a_stale_journal_lock_are_repaired_with_a_line(searched, whole, monkeypatch, capsys):
    """A command killed during an append: the last record cut short and Optuna's journal lock left
    behind. The resume moves the torn record aside (the journal as it was kept beside it), removes
    the lock at once, and ends with the uninterrupted race's answer; no finished retrain reruns."""
    out, before = stopped(searched, "torn", monkeypatch)
    lines = journal(out).read_bytes().split(b"\n")
    torn = lines[-2][: len(lines[-2]) // 2]  # half of a record, as a killed write leaves it
    with open(journal(out), "ab") as fh:
        fh.write(torn)
    damaged = journal(out).read_bytes()
    os.symlink(journal(out), str(journal(out)) + ".lock")
    capsys.readouterr()
    code, after = resume(searched, out, monkeypatch)
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert f"[race] removed {journal(out)}.lock, a journal lock left by a killed command" in err
    assert not os.path.lexists(str(journal(out)) + ".lock")
    (backup,) = (out / "race").glob("study.journal.*.bak")
    assert backup.read_bytes() == damaged and not journal(out).read_bytes().endswith(torn)
    assert (f"[race] repaired {journal(out)}: its last record was cut short ({len(torn)} bytes, line {len(lines)}: a command "
            f"killed while appending it), so it was cut off and what it recorded is redone; the journal as it was is kept in "
            f"{backup}") in err
    assert "Traceback" not in err and not set(before) & set(after)  # no finished retrain ran again
    assert jobs(out) == jobs(whole)


def test_a_blank_line_is_dropped_with_a_line(searched, whole, monkeypatch, capsys):
    out, before = stopped(searched, "blank", monkeypatch)
    lines = journal(out).read_bytes().split(b"\n")
    journal(out).write_bytes(b"\n".join(lines[:3] + [b""] + lines[3:]))
    capsys.readouterr()
    code, after = resume(searched, out, monkeypatch)
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert (f"[race] repaired {journal(out)}: 1 blank line(s) (line 4), which hold no record and which Optuna's reader "
            "refuses, were dropped") in err
    assert not set(before) & set(after) and jobs(out) == jobs(whole)


@pytest.mark.parametrize("how", ["run together", "torn then whole"])
def test_a_damaged_record_in_the_middle_is_one_line_and_its_way_on_loses_no_retrain(searched, whole, monkeypatch, capsys, how):
    out, before = stopped(searched, "middle-" + how.replace(" ", "-"), monkeypatch)
    lines = journal(out).read_bytes().split(b"\n")
    first = lines[4] if how == "run together" else lines[4][:20]  # whole, or cut short by a killed append
    journal(out).write_bytes(b"\n".join(lines[:4] + [first + lines[5]] + lines[6:]))
    damaged = journal(out).read_bytes()
    capsys.readouterr()
    code, _ = resume(searched, out, monkeypatch)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err[-3000:]
    what = (f"two records run together (the second starts at column {len(lines[4]) + 1})" if how == "run together" else
            "a record cut short (its first 20 bytes) with a whole record run on after it, as a command killed while "
            "appending leaves it once another appends")
    assert err.startswith(f"error: {journal(out)}, line 5 of {len(lines) - 2}: {what}, so the study cannot be read past it "
                          "(the file was left as it is). To go on, move it aside and run the command again: the study starts "
                          "anew, and the race's finished retrains are read back from their folders")
    assert f"mv {journal(out)} {journal(out)}.damaged && " in err and "--resume" in err.split("&&")[-1]
    assert journal(out).read_bytes() == damaged  # nothing changed
    os.replace(journal(out), str(journal(out)) + ".damaged")  # the way on
    code, after = resume(searched, out, monkeypatch)
    assert code == 0 and not set(before) & set(after) and jobs(out) == jobs(whole)


def test_a_record_damaged_while_the_race_runs_is_one_line(searched, whole, monkeypatch, capsys):
    """Optuna's reader meets a damaged record as the race runs (here a blank line written after the
    second retrain, which Optuna's next record follows): one line naming the file and the line,
    not a JSONDecodeError; the resume drops the blank line and ends with the same answer."""
    out = copy(searched, "while")
    seen = {}

    def blank(setup, n):
        if n == 2:
            with open(journal(setup.folder), "ab") as fh:
                fh.write(b"\n")
            seen["line"] = journal(setup.folder).read_bytes().count(b"\n")
    trained: list = []
    monkeypatch.setattr(run_race, "run_job", reusing_job(trained, hook=blank))
    assert cli.search_main([*searched[1], "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"error: {journal(out)}, line {seen['line']} of " in err and ": a blank line, which holds no record, so the study" in err
    assert "Run the command again: it drops the blank line (keeping the journal as it was beside it) and goes on: " in err
    assert "Traceback" not in err and "JSONDecodeError" not in err
    code, after = resume(searched, out, monkeypatch)
    assert code == 0 and not set(trained) & set(after) and jobs(out) == jobs(whole)


def test_a_last_record_that_lacks_only_its_newline_is_kept_and_a_whole_journal_is_left_alone(tmp_path):
    """Optuna's reader skips a last line without its newline, and its next append runs on after
    it: a last record that is whole but for its newline gets it (nothing is lost); a whole
    journal is not touched (no backup)."""
    from autoln.tune.journal import repair_journal

    study = tmp_path / "study.journal"
    study.write_bytes(b'{"op_code":0,"worker_id":"w"}\n{"op_code":1,"worker_id":"w"}')
    line = repair_journal(study)
    assert study.read_bytes() == b'{"op_code":0,"worker_id":"w"}\n{"op_code":1,"worker_id":"w"}\n'
    assert line.startswith(f"repaired {study}: its last record lacked its newline (added); the journal as it was is kept in ")
    assert repair_journal(study) is None and len(list(tmp_path.glob("study.journal.*.bak"))) == 1


def test_a_tune_study_s_journal_torn_or_damaged_in_the_middle(tmp_path, capsys):
    """The same journal in ``search.py --tune``: a torn last record is cut off with a line and the
    study goes on; a damaged one in the middle is one line whose way on reuses the finished search."""
    out = tmp_path / "study"
    args = [*tiny(tmp_path, "--set", "search.steps=20", "--set", "search.arch_warmup_steps=4", "--set", "search.eval_every=10",
                  "--set", "search.eval_windows=4", "--set", "search.monitor_windows=0", "--set", "tune.score=supernet",
                  "--set", "tune.pruner=none", "--set", "tune.n_trials=1"), "--tune", "--out", str(out)]
    assert cli.search_main(args) == 0
    study = out / "study.journal"
    searched_at = (out / "trials" / "0000" / "search" / "genotype.json").stat().st_mtime_ns
    lines = study.read_bytes().split(b"\n")
    with open(study, "ab") as fh:
        fh.write(lines[-2][:30])
    capsys.readouterr()
    assert cli.search_main(args) == 0
    err = capsys.readouterr().err
    assert f"[tune] repaired {study}: its last record was cut short (30 bytes, line {len(lines)}" in err
    study.write_bytes(b"\n".join(lines[:2] + [lines[2] + lines[3]] + lines[4:]))
    assert cli.search_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {study}, line 3 of {len(lines) - 2}: two records run together") and len(err.splitlines()) == 1
    assert "a trial whose folder (trials/NNNN) holds a search of its own settings reuses it" in err
    assert f"mv {study} {study}.damaged && " in err
    os.replace(study, str(study) + ".damaged")  # the way on
    assert cli.search_main(args) == 0
    assert (out / "trials" / "0000" / "search" / "genotype.json").stat().st_mtime_ns == searched_at  # reused, not redone



def test_a_damaged_comparison_record_s_way_on_redoes_no_finished_run(tmp_path, monkeypatch, capsys):
    """The other record of a run of many retrains: ``retrain.py --compare``'s compare.json, damaged,
    is one line whose way on (move it aside, run again) reuses every finished run."""
    monkeypatch.setattr("sys.argv", ["retrain.py", "--compare"])
    from autoln.core.errors import ConfigError
    from autoln.retrain.compare import run_compare

    args = tiny(tmp_path)
    cfg = load_config(TINY, [a for a in args[2:] if a != "--set"] + ["retrain.steps=4", "retrain.warmup_steps=1",
                                                                     "retrain.eval_every=2", "retrain.final_eval_windows=4"])
    out = tmp_path / "cmp"
    first = run_compare(cfg, [], ["all-pre"], 1, out)[0].runs[0]
    metrics = out / "all-pre" / "seed0" / "metrics.json"
    made = metrics.stat().st_mtime_ns
    (out / "compare.json").write_text('{"specs": [], "conf')
    with pytest.raises(ConfigError) as caught:
        run_compare(cfg, [], ["all-pre"], 1, out)
    text = str(caught.value)
    assert "--overwrite" not in text and len(text.splitlines()) == 1
    head, _, again = text.rpartition(" && ")
    assert head.endswith(f"to go on, move it aside and run the command again: each finished run is checked against its own "
                         f"config.yaml and reused when it was made with these settings: mv {out / 'compare.json'} "
                         f"{out / 'compare.json.damaged'}") and again.endswith("retrain.py --compare")
    os.replace(out / "compare.json", out / "compare.json.damaged")  # the way on
    assert run_compare(cfg, [], ["all-pre"], 1, out)[0].runs[0]["valid"] == first["valid"]
    assert metrics.stat().st_mtime_ns == made  # reused, not retrained


# --- a resume with other settings ------------------------------------------------------------


@pytest.mark.parametrize("sets, named", [
    (("race.final_seeds=2",), "race.final_seeds: 3 then, 2 now"),
    (("retrain.lr=0.003",), "retrain.lr: 0.002 then, 0.003 now"),
    (("retrain.steps=90",), "retrain.steps: 30 then, 90 now"),
    (("race.eta=2", "retrain.seed=7"), "retrain.seed: 0 then, 7 now; race.eta: 3 then, 2 now"),
])
def test_a_race_resumed_with_other_settings_names_each_key_with_both_values(searched, monkeypatch, capsys, sets, named):
    out, _ = stopped(searched, "other-" + sets[0].replace("=", "-"), monkeypatch)
    capsys.readouterr()
    code, trained = resume(searched, out, monkeypatch, *(a for s in sets for a in ("--set", s)))
    err = capsys.readouterr().err.strip()
    assert code == 2 and not trained and len(err.splitlines()) == 1
    assert err.startswith(f"error: the race of {out} (study race-") and f"was started with other settings: {named}. " in err
    assert "full_steps" not in err and "(config differ)" not in err
    assert "Resume it with the search's own config (without the --set of those keys): " in err


def test_where_the_retrains_run_may_change_and_is_said(searched, whole, monkeypatch, capsys):
    out, before = stopped(searched, "moved", monkeypatch)
    capsys.readouterr()
    code, after = resume(searched, out, monkeypatch, "--set", "retrain.device=cpu")
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert "[race] note: the race goes on with retrain.device: 'auto' then, 'cpu' now (where and how fast its retrains run" in err
    assert not set(before) & set(after) and jobs(out) == jobs(whole)


@pytest.mark.parametrize("race_started", [False, True])
@pytest.mark.parametrize("sets, named", [
    (("search.steps=20",), "search.steps: 30 then, 20 now"),
    (("race.top_k=5", "model.d_model=16"), "model.d_model: 32 then, 16 now; race.top_k: 3 then, 5 now"),
])
def test_the_finished_search_s_own_settings_cannot_change_on_a_race_resume(searched, monkeypatch, capsys, race_started, sets, named):
    if race_started:
        out, _ = stopped(searched, f"kept-{race_started}-{sets[0].replace('=', '-')}", monkeypatch)
    else:
        out = copy(searched, f"kept-{race_started}-{sets[0].replace('=', '-')}")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    code, trained = resume(searched, out, monkeypatch, *(a for s in sets for a in ("--set", s)))
    err = capsys.readouterr().err.strip()
    assert code == 2 and not trained and len(err.splitlines()) == 1, err[-2000:]
    assert err == (f"error: --resume: {out} holds a finished search, and settings it was made with cannot change now: {named}. "
                   f"Resume with its own config ({out / 'config.yaml'}, without the --set of those keys), or search again with "
                   "them (--overwrite in place of --resume, or another --out)")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing ran, nothing was written


def test_race_enabled_false_on_a_stopped_race_is_refused_naming_what_is_kept(searched, monkeypatch, capsys):
    out, before = stopped(searched, "off", monkeypatch)
    capsys.readouterr()
    code, _ = resume(searched, out, monkeypatch, "--set", "race.enabled=false")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith(f"error: --resume: {out} holds a race stopped before its answer ({len(before)} finished retrain(s) in "
                          f"{out / 'race'}), and race.enabled=false cannot finish it. The supernet's read-off alone is "
                          f"{out / 'supernet_genotype.json'} (retrain.py --genotype takes it); to finish the race")
    assert not (out / "genotype.json").exists()  # no read-off answered in the race's place
