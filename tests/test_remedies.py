"""Remedies that work when followed (issue 36, kind 3): every ``next:`` line and every remedy
autoln prints, followed literally (the command run as printed, ``shlex.split``; the ``--set``
parsed out of the message and applied) from a working folder outside the clone, as a user who
started the first command there would.

The refusal of an older run's ``--resume`` is in ``tests/test_resume_keys.py``, the full disk's
``continue with:`` line in ``tests/test_space_errors.py``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoln import cli
from autoln.config import load_config
from autoln.core.errors import ConfigError
from autoln.models.model import TransformerLM

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
#: A retrain of 2 steps evaluated on 2 windows: a --compare of 30 of them takes seconds.
SHORT_RETRAIN = ["--set", "retrain.steps=2", "--set", "retrain.eval_every=2", "--set", "retrain.eval_windows=2",
                 "--set", "retrain.final_eval_windows=2", "--set", "retrain.warmup_steps=0"]
#: A search of 8 steps read off by argmax (its config.yaml carries the short retrain for next: lines).
SHORT_SEARCH = ["--set", "race.enabled=false", "--set", "search.steps=8", "--set", "search.arch_warmup_steps=2", "--set", "search.eval_every=4",
                "--set", "search.selection=argmax", *SHORT_RETRAIN]
OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A 220 kB text file (its last 5 % test, the 5 % before valid): read in milliseconds, unlike
    the standard library's files, whose listing each run would repeat."""
    r = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "norm", "layer", "block", "token", "search", "retrain"]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(" ".join(r.choice(words) for _ in range(12)) for _ in range(3000)) + "\n")
    return str(path)


@pytest.fixture
def work(tmp_path, monkeypatch, corpus):
    """A working folder outside the clone (default run folders land in its ``runs/``), and a
    token cache of the test's own."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


def common(corpus: str) -> list[str]:
    return ["--config", TINY, "--set", f"data.corpus={corpus}", "--set", "logging.progress=false",
            "--set", "logging.tensorboard=false"]


def started(monkeypatch, script: str, args: list[str]) -> list[str]:
    """This process as ``python <clone>/<script> args`` (the hints it prints read ``sys.argv``)."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / script), *args])
    return args


def next_line(stdout: str) -> str:
    found = re.findall(r"^next: (.*)$", stdout, re.M)
    assert len(found) == 1, stdout[-2000:]
    return found[0]


def words_of(line: str) -> list[str]:
    """The words the shell runs: ``# ...`` is a comment. The interpreter is this venv's (not a
    ``python`` on PATH) and the script exists from the working folder."""
    words = shlex.split(line, comments=True)
    assert os.path.abspath(words[0]) == sys.executable, line
    assert Path(words[1]).is_file() and Path(words[1]).name in ("search.py", "retrain.py"), line
    return words


def follow(line: str, monkeypatch, capsys) -> tuple[int, str, str]:
    """Run the printed command ``line`` in this process, as the shell would (exit status, stdout, stderr)."""
    words = words_of(line)
    main = cli.search_main if Path(words[1]).name == "search.py" else cli.retrain_main
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", words[1:])  # this process is now that command
    code = main(words[2:])
    out, err = capsys.readouterr()
    return code, out, err


def suggested(message: str) -> list[str]:
    """Every ``--set KEY=VALUE`` a message suggests, as ``KEY=VALUE``."""
    return re.findall(r"--set ([a-z_]+\.[a-z_]+=[^\s,)]+)", message)


# --- config refusals: the suggested --set gives a config that loads ---------------------------------------------------


@pytest.mark.parametrize("overrides, expected", [
    (["search.steps=8", "search.warmup_steps=8", "search.arch_warmup_steps=2"], ["search.warmup_steps=0"]),
    (["retrain.steps=8", "retrain.warmup_steps=9"], ["retrain.warmup_steps=0"]),
    (["search.steps=8"], ["search.arch_warmup_steps=1"]),  # tiny's arch_warmup_steps is 20
    (["search.early_stop=hessian", "search.steps=100", "search.eval_every=50"], ["search.eval_every=5"]),
    # too short for R-DARTS' rule at any search.eval_every: a longer search (the old hint, eval_every=1, still failed)
    (["search.early_stop=hessian", "search.steps=5", "search.warmup_steps=1", "search.arch_warmup_steps=1"], ["search.steps=7", "search.eval_every=1"]),
    (["search.mixing=sigmoid", "search.tau_start=2.0"], ["search.tau_end=2.0"]),
    (["search.mixing=sigmoid", "search.tau_start=3.0e-5"], ["search.tau_end=3e-05"]),
    (["tune.space={search.steps: {int: [200, 500], step: 100}, search.lr: {log-uniform: [1.0e-4, 1.0e-2]}}"],
     ["tune.pruner=none"]),
], ids=["search.warmup_steps", "retrain.warmup_steps", "search.arch_warmup_steps", "search.eval_every", "hessian-short",
        "search.tau_end", "search.tau_end-small", "tune.pruner"])
def test_a_config_refusal_s_suggested_set_loads(overrides, expected, capsys):
    with pytest.raises(ConfigError) as refused:
        load_config(TINY, overrides)
    sets = suggested(str(refused.value))
    assert sets == expected, str(refused.value)
    cfg = load_config(TINY, [*overrides, *sets])  # the remedy, applied on top of the same command
    if any(o.startswith("tune.") for o in overrides):
        cfg.validate_space()  # and search.py --tune accepts it too
    # through the command line: the refusal is one line with the same suggestion
    assert cli.search_main(["--config", TINY, *(a for o in overrides for a in ("--set", o)), "--out", "/nonexistent/x"]) == 2
    assert suggested(capsys.readouterr().err) == expected


def test_the_api_s_config_refusals_name_no_command_line_option():
    """``autoln.search`` turns a config refusal into the API's words; the ``--set`` hint of each
    kind of message is cut (the temperature's used to stay)."""
    import torch

    from autoln import api
    from autoln.config import SearchConfig

    for cfg in (SearchConfig(mixing="sigmoid", tau_start=2.0, arch_warmup_steps=1, warmup_steps=0),
                SearchConfig(arch_warmup_steps=100, warmup_steps=0)):
        with pytest.raises(ConfigError) as refused:
            api.search(torch.nn.Linear(2, 2), [], steps=8, cfg=cfg)
        assert "--set" not in str(refused.value) and "autoln.SearchConfig(..., key=value)" in str(refused.value)


# --- next: lines -------------------------------------------------------------------------------------------------------


def test_search_then_retrain_then_compare_each_next_line_runs_as_printed(work, corpus, monkeypatch, capsys):
    """The search's ``next:`` (a real process, from a folder outside the clone), the retrain's
    (``--compare`` against every baseline, 3 seeds: 30 retrains of 2 steps), as printed."""
    args = started(monkeypatch, "search.py", [*common(corpus), *SHORT_SEARCH, "--out", "s"])
    assert cli.search_main(args) == 0
    out = capsys.readouterr().out
    assert "--logdir" not in out  # logging.tensorboard=false: no event files to show
    words = words_of(next_line(out))
    assert words[2:] == ["--genotype", "s/genotype.json", "--config", "s/config.yaml"]
    proc = subprocess.run(words, cwd=work, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (retrained,) = (work / "runs").glob("retrain-*")
    metrics = json.loads((retrained / "metrics.json").read_text())
    searched = json.loads((work / "s" / "genotype.json").read_text())
    assert metrics["steps"] == 2 and metrics["placements"] == " ".join(searched["placements"])
    code, out, _ = follow(next_line(proc.stdout), monkeypatch, capsys)
    assert code == 0
    (compared,) = (work / "runs").glob("compare-*")
    table = (compared / "compare.csv").read_text().splitlines()
    assert len(table) == 1 + 10 and all(",3," in row for row in table[1:])  # the genotype and 9 baselines, 3 seeds each
    assert "next:" not in out  # its TensorBoard line: logging.tensorboard=false


def test_the_no_clear_winner_note_then_seeds_then_compare_run_as_printed(work, corpus, monkeypatch, capsys):
    """A search of 8 steps has no clear winner: its note's ``--seeds 3`` command runs the same
    search three times (seed 0 equals it), and that command's ``next:`` line compares the consensus."""
    args = started(monkeypatch, "search.py", [*common(corpus), *SHORT_SEARCH, "--out", "s"])
    assert cli.search_main(args) == 0
    out = capsys.readouterr().out
    (note,) = re.findall(r"^note: no clear winner .*check the answer's agreement across seeds with: (.*)$", out, re.M)
    code, out, _ = follow(note, monkeypatch, capsys)
    assert code == 0
    (seeds,) = (work / "runs").glob("seeds-*")
    first = json.loads((seeds / "seed0" / "genotype.json").read_text())
    alone = json.loads((work / "s" / "genotype.json").read_text())
    flat = [[p for row in g["probabilities"] for p in row] for g in (first, alone)]
    assert first["placements"] == alone["placements"] and flat[0] == pytest.approx(flat[1], abs=1e-6)
    assert json.loads((seeds / "genotype.json").read_text())["provenance"]["consensus"]["seeds"] == [0, 1, 2]
    code, out, _ = follow(next_line(out), monkeypatch, capsys)
    assert code == 0
    (compared,) = (work / "runs").glob("compare-*")
    assert len((compared / "compare.csv").read_text().splitlines()) == 1 + 10


def test_the_tune_study_s_rerun_note_and_next_line_run_as_printed(work, corpus, monkeypatch, capsys):
    """A study that ended short of tune.n_trials (a worker died) says to run the command again:
    the printed command has no --overwrite (which would redo the finished trials) and finishes
    the study; its ``next:`` line retrains the best genotype with the study's config."""
    import dataclasses

    from autoln import tune

    args = started(monkeypatch, "search.py", ["--tune", *common(corpus), *SHORT_SEARCH, "--set", "tune.n_trials=1",
                                              "--set", "tune.score=supernet", "--set", "tune.pruner=none",
                                              "--set", "search.monitor_windows=0",
                                              "--set", "tune.space={search.arch_lr: {log-uniform: [1.0e-4, 1.0e-2]}}",
                                              "--out", "study", "--overwrite"])
    run_tune = tune.run_tune

    def short(*a, **k):  # as if the trial's worker had died: no finished trial counted
        result = run_tune(*a, **k)
        return dataclasses.replace(result, census=dataclasses.replace(result.census, finished=0))
    monkeypatch.setattr(tune, "run_tune", short)
    assert cli.search_main(args) == 0
    out = capsys.readouterr().out
    (again,) = re.findall(r"^note: the study is not finished .*; run the command again to finish it: (.*)$", out, re.M)
    assert "next:" not in out and "--overwrite" not in shlex.split(again)
    monkeypatch.setattr(tune, "run_tune", run_tune)
    trial = (work / "study" / "trials" / "0000" / "search" / "genotype.json").stat().st_mtime_ns
    code, out, _ = follow(again, monkeypatch, capsys)
    assert code == 0 and "1/1 finished trials" in out
    assert (work / "study" / "trials" / "0000" / "search" / "genotype.json").stat().st_mtime_ns == trial  # the finished trial is kept
    line = next_line(out)
    assert shlex.split(line)[2:] == ["--genotype", "study/best_genotype.json", "--config", "study/config.yaml"]
    code, out, _ = follow(line, monkeypatch, capsys)
    assert code == 0
    (retrained,) = (work / "runs").glob("retrain-*")
    best = json.loads((work / "study" / "best_genotype.json").read_text())
    assert json.loads((retrained / "metrics.json").read_text())["placements"] == " ".join(best["placements"])


def test_the_tensorboard_line_names_this_venv_s_tensorboard_and_a_folder_with_events(work, corpus, monkeypatch, capsys):
    args = started(monkeypatch, "retrain.py", [*common(corpus), "--genotype", "all-pre", *SHORT_RETRAIN,
                                               "--set", "logging.tensorboard=true", "--out", "r"])
    assert cli.retrain_main(args) == 0
    (line,) = [l for l in capsys.readouterr().out.splitlines() if "--logdir" in l]
    words = shlex.split(line, comments=True)
    assert os.path.abspath(words[0]) == str(Path(sys.executable).parent / "tensorboard") and words[1] == "--logdir"
    assert list(Path(words[2]).glob("events.out.tfevents.*"))


def test_the_pip_command_of_a_missing_extra_installs_into_this_venv_from_any_folder(work, corpus, monkeypatch):
    import tomllib

    from autoln.data import load_corpus
    from autoln.core.errors import DataError

    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    cfg = load_config(TINY, ["data.corpus=wikitext-2"])
    with pytest.raises(DataError) as refused:
        load_corpus(cfg.data)
    (command,) = re.findall(r"; run (.*?) \(or pass a folder", str(refused.value))
    words = shlex.split(command)
    assert os.path.abspath(words[0]) == str(Path(sys.executable).parent / "pip") and words[1:3] == ["install", "-e"]
    folder, extra = re.fullmatch(r"(.*)\[(\w+)\]", words[3]).groups()
    project = tomllib.loads((Path(folder) / "pyproject.toml").read_text())["project"]
    assert project["name"] == "autoln" and extra == "hf" and "hf" in project["optional-dependencies"]


# --- the run folder's refusals -----------------------------------------------------------------------------------------


def test_an_interrupted_or_finished_folder_s_remedies_work_as_printed(work, corpus, monkeypatch, capsys):
    run = [*common(corpus), "--genotype", "all-pre", *SHORT_RETRAIN, "--out", "r"]
    assert cli.retrain_main(run) == 0
    (work / "r" / "metrics.json").unlink()  # killed after its last checkpoint
    capsys.readouterr()
    assert cli.retrain_main(run) == 2
    assert ("--out r holds an interrupted run (checkpoint.pt): continue it with --resume, or pass --overwrite to start "
            "again") in capsys.readouterr().err
    assert cli.retrain_main([*run, "--resume"]) == 0 and "at step 2" in capsys.readouterr().err
    (work / "r" / "metrics.json").unlink()
    assert cli.retrain_main([*run, "--overwrite"]) == 0 and "resumed" not in capsys.readouterr().err
    assert cli.retrain_main(run) == 2
    assert "--out r already holds a finished run (metrics.json); choose another folder or pass --overwrite" in capsys.readouterr().err
    assert cli.retrain_main([*run, "--overwrite"]) == 0
    assert cli.retrain_main([*run, "--out", "r2"]) == 0  # another folder (the last --out counts)
    # --resume of a finished run: the remedy swaps --resume for --overwrite (both together are refused)
    search = [*common(corpus), *SHORT_SEARCH, "--out", "s"]
    assert cli.search_main(search) == 0
    capsys.readouterr()
    assert cli.search_main([*search, "--resume"]) == 2
    err = capsys.readouterr().err
    assert ("--resume: s holds a finished search (genotype.json); nothing to resume (to start it again, run the command "
            "with --overwrite in place of --resume)") in err
    assert cli.search_main([*search, "--overwrite"]) == 0


# --- stops: the printed command goes on --------------------------------------------------------------------------------


def fail_forward(monkeypatch, at: int, make) -> None:
    """The ``at``-th training forward pass raises ``make()`` (or returns a NaN loss when ``make``
    is None); earlier and later ones are untouched."""
    original, calls = TransformerLM.forward, {"n": 0}

    def forward(self, idx, targets=None, mix=None):
        logits, loss = original(self, idx, targets, mix)
        if self.training and loss is not None:
            calls["n"] += 1
            if calls["n"] == at:
                if make is None:
                    return logits, loss * float("nan")
                raise make()
        return logits, loss
    monkeypatch.setattr(TransformerLM, "forward", forward)


def test_out_of_memory_in_a_run_of_a_default_folder_continues_as_printed(work, corpus, monkeypatch, capsys):
    """Memory short at step 3 of a retrain with no --out (a folder named by the time): the line
    names the command with --resume and the folder (before: "continue with --resume", which
    without --out is refused)."""
    args = started(monkeypatch, "retrain.py", [*common(corpus), "--genotype", "all-pre", *SHORT_RETRAIN,
                                               "--set", "retrain.steps=4"])
    original = TransformerLM.forward
    fail_forward(monkeypatch, 3, lambda: RuntimeError(OOM))
    assert cli.retrain_main(args) == cli.EXIT_OUT_OF_MEMORY
    err = capsys.readouterr().err
    (command,) = re.findall(r"^error: out of memory: .*; once memory is free, continue with: (.*?); or lower", err, re.M)
    monkeypatch.setattr(TransformerLM, "forward", original)  # memory is free
    (folder,) = (work / "runs").glob("retrain-all-pre-*")
    assert shlex.split(command)[-3:] == ["--resume", "--out", str(folder.relative_to(work))]
    code, _, err = follow(command, monkeypatch, capsys)
    assert code == 0 and re.search(r"resumed from .*checkpoint.pt at step 2", err)
    assert json.loads((folder / "metrics.json").read_text())["steps"] == 4 and len(list((work / "runs").iterdir())) == 1


def test_a_stop_signal_in_a_run_of_a_default_folder_continues_as_printed(work, corpus, monkeypatch, capsys):
    """SIGTERM after step 1 (no --out): ``continue with:`` names --resume and the folder."""
    from autoln.engine.checkpoint import StopSignals

    args = started(monkeypatch, "retrain.py", [*common(corpus), "--genotype", "all-pre", *SHORT_RETRAIN,
                                               "--set", "retrain.steps=4"])
    monkeypatch.setattr(StopSignals, "requested", lambda self, device: self.when == StopSignals.IN_STEPS)
    assert cli.retrain_main(args) == 143
    (command,) = re.findall(r"^interrupted: stopped by signal after step 1; .*; continue with: (.*)$", capsys.readouterr().err, re.M)
    monkeypatch.setattr(StopSignals, "requested", lambda self, device: False)
    code, _, err = follow(command, monkeypatch, capsys)
    assert code == 0 and re.search(r"resumed from .*checkpoint.pt at step 1", err)


@pytest.mark.parametrize("stop, status, said", [
    ("worker died", cli.EXIT_WORKER_DIED, r"^error: a --workers process died .*: run the command again to go on: (.*?) \(with fewer"),
    ("interrupted", 130, r"^interrupted before a run started, or between runs: .*; run the command again to go on: (.*)$"),
    ("out of memory", cli.EXIT_OUT_OF_MEMORY, r"^error: out of memory: .*; once memory is free, continue with: (.*?); or lower"),
    ("signal before step 1", 143, r"^interrupted: stopped by signal before step 1\b.*nothing to resume: run the command again: (.*)$"),
], ids=["worker-died", "interrupted", "out-of-memory", "signal-before-step-1"])
def test_a_stopped_set_of_seeds_goes_on_as_printed_keeping_its_finished_seeds(stop, status, said, work, corpus, monkeypatch, capsys):
    """``search.py --seeds 2 --overwrite`` stopped in its second search: the printed command
    (without --overwrite, which would remove the finished seed; --resume does not apply to
    --seeds) reuses seed 0 and finishes seed 1. Before, the lines said "run the command again"
    (or "--resume") without the command."""
    from concurrent.futures.process import BrokenProcessPool

    from autoln.oneshot import consensus
    from autoln.engine.checkpoint import StopSignals

    args = started(monkeypatch, "search.py", ["--seeds", "2", *common(corpus), *SHORT_SEARCH, "--out", "seeds", "--overwrite"])
    search_one = consensus._search_one
    failure = {"worker died": lambda: BrokenProcessPool("A process in the process pool was terminated abruptly"),
               "interrupted": KeyboardInterrupt, "out of memory": lambda: RuntimeError(OOM)}.get(stop)

    def second_fails(cfg, out, resume, threads):
        if out.endswith("seed1"):
            raise failure()
        return search_one(cfg, out, resume, threads)
    if failure is not None:
        monkeypatch.setattr(consensus, "_search_one", second_fails)
    else:
        monkeypatch.setattr(StopSignals, "requested", lambda self, device: "seed1" in str(self.checkpoint))
    assert cli.search_main(args) == status
    (command,) = re.findall(said, capsys.readouterr().err, re.M)
    assert "--overwrite" not in shlex.split(command) and "--resume" not in shlex.split(command)
    monkeypatch.setattr(consensus, "_search_one", search_one)
    monkeypatch.setattr(StopSignals, "requested", lambda self, device: False)
    done = (work / "seeds" / "seed0" / "genotype.json").stat().st_mtime_ns
    code, _, err = follow(command, monkeypatch, capsys)
    assert code == 0 and "[seeds] seed 0: reusing" in err
    assert (work / "seeds" / "seed0" / "genotype.json").stat().st_mtime_ns == done
    assert (work / "seeds" / "genotype.json").is_file()


@pytest.mark.parametrize("kind", ["retrain", "search"])
def test_after_a_divergence_the_new_run_it_suggests_starts_in_the_same_folder(kind, work, corpus, monkeypatch, capsys):
    """A NaN at step 3 stops the run (exit 3); "try a new run with a lower lr" in the same
    folder is refused by its checkpoint (and a resume with another lr by its config): the line
    says --overwrite (or another --out), and that new run goes."""
    main = cli.retrain_main if kind == "retrain" else cli.search_main
    run = [*common(corpus), *(["--genotype", "all-pre", *SHORT_RETRAIN, "--set", "retrain.steps=4"] if kind == "retrain"
                              else SHORT_SEARCH), "--set", "checkpoint.every=1", "--out", "d"]
    original = TransformerLM.forward
    fail_forward(monkeypatch, 3, None)
    assert main(run) == cli.EXIT_DIVERGED
    err = capsys.readouterr().err
    assert f"{kind} diverged at step " in err
    assert (f"Try a new run (--overwrite replaces this one, or choose another --out) with a lower {kind}.lr or more "
            f"{kind}.warmup_steps, or {kind}.on_divergence=skip_batch") in err
    monkeypatch.setattr(TransformerLM, "forward", original)
    lower = ["--set", f"{kind}.lr=0.001"]
    assert main([*run, *lower]) == 2 and "holds an interrupted run" in capsys.readouterr().err  # why the hint is needed
    assert main([*run, *lower, "--overwrite"]) == 0
    assert main([*run, "--set", f"{kind}.on_divergence=skip_batch", "--out", "d2"]) == 0
