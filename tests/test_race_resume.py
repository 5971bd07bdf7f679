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
