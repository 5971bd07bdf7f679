"""What a run under ``torchrun --nproc_per_node 2`` (gloo, CPU) tells the user when it fails or is
stopped: autoln's one ``error:`` line once (rank 0's), each process's documented exit status in
torchrun's summary with autoln's line as its ``traceback`` (torchrun itself exits 1: it raises
``ChildFailedError``; docs/scale.md), a rank that fails alone still heard, one acknowledgement of
a signal, and resume hints that name the torchrun command."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest

from autoln.core import commands, distributed
from autoln.engine.checkpoint import StopSignals
from autoln.cli import guarded
from autoln.core.errors import ConfigError

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def torchrun(*args: str, cache: str, cwd=ROOT, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": cache, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def summary(stderr: str) -> tuple[dict[int, int], int, str]:
    """torchrun's ChildFailedError summary: {rank: exitcode}, the root cause's rank and its traceback line."""
    codes = {int(r): int(c) for r, c in re.findall(r"^\s+rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", stderr, re.M)}
    root = stderr.split("Root Cause (first observed failure):")[1]
    return codes, int(re.search(r"rank\s+: (\d+)", root).group(1)), re.search(r"traceback : (.*)", root).group(1)


def autoln_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_bad_input_before_the_process_group_is_one_line_and_status_2(tmp_path, cache_dir):
    # load_config refuses it before any process joins the group: every rank raises the same error
    proc = torchrun(str(ROOT / "search.py"), "--config", TINY, "--set", "model.d_model=-1", "--out", str(tmp_path / "run"), cache=cache_dir)
    line = "error: model.d_model must be a positive integer, got -1"
    assert autoln_lines(proc.stderr) == [line], proc.stderr[-3000:]
    codes, root, traceback = summary(proc.stderr)
    assert codes == {0: 2, 1: 2} and traceback == line  # each rank's own status; autoln's line, not "<N/A>" or a link
    assert proc.stderr.count("Traceback (most recent call last)") == 1  # torchrun's own ChildFailedError, no rank's
    assert proc.returncode == 1 and not (tmp_path / "run").exists()  # torchrun exits 1 whatever its processes' status


def test_bad_input_after_the_process_group_is_one_line_and_status_2(tmp_path, cache_dir):
    # the genotype is read after both ranks joined the group (the run folder is rank 0's)
    missing = tmp_path / "missing.json"
    proc = torchrun(str(ROOT / "retrain.py"), "--config", TINY, "--genotype", str(missing), "--out", str(tmp_path / "run"), cache=cache_dir)
    lines = autoln_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: --genotype {str(missing)!r}: no such file, and not a baseline name"), proc.stderr[-3000:]
    codes, root, traceback = summary(proc.stderr)
    assert codes == {0: 2, 1: 2} and traceback == lines[0]
    assert proc.stderr.count("Traceback (most recent call last)") == 1 and proc.returncode == 1


WORKER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path

import torch

from autoln import cli
from autoln.core import commands, distributed
from autoln.core.errors import ConfigError

distributed.LINGER_S = 1.5

def body():
    distributed.init(torch.device("cpu"))
    if distributed.rank() == 1:
        raise ConfigError("data.corpus: this machine cannot read it")
    print("hint:", commands.resume_command(Path("runs/x")), flush=True)
    distributed.average_([torch.ones(3)])  # waits for rank 1, which never comes

sys.exit(cli.guarded(body))
"""


def test_a_rank_failing_alone_is_heard_while_rank_0_waits_in_a_collective(tmp_path, cache_dir):
    script = tmp_path / "search.py"
    script.write_text(textwrap.dedent(WORKER.format(root=str(ROOT))))
    proc = torchrun("search.py", "--set", "x=1", cache=cache_dir, cwd=tmp_path)
    # rank 0 did not fail the same way within LINGER_S, so rank 1 prints its own line, marked
    assert autoln_lines(proc.stderr)[0] == "error: (rank 1) data.corpus: this machine cannot read it", proc.stderr[-3000:]
    # and rank 0, cut off by rank 1's exit, says so in one line (or torchrun stopped it first): no traceback
    assert all(line.startswith("error: another process of this torchrun job ended while this one waited for it")
               for line in autoln_lines(proc.stderr)[1:])
    assert proc.stderr.count("Traceback (most recent call last)") == 1 and "[rank0]" not in proc.stderr
    codes, root, traceback = summary(proc.stderr)
    assert codes[1] == 2 and codes[0] in (5, -15)  # 5: rank 0 saw its peer go; -15: torchrun's SIGTERM came first
    assert root == 1 and traceback == "error: data.corpus: this machine cannot read it"  # the first failure is the cause
    # a resume hint under torchrun is the torchrun command that was run (here python -m torch.distributed.run)
    hint = next(line for line in proc.stdout.splitlines() if line.startswith("hint: "))[6:]
    assert hint == shlex.join([*TORCHRUN, "search.py", "--set", "x=1", "--resume", "--out", "runs/x"])


@pytest.fixture
def under_torchrun(monkeypatch):
    """This process as rank ``RANK`` of a 2-process torchrun job (the variables torchrun sets)."""
    def as_rank(rank: int) -> None:
        for key, value in {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1",
                           "TORCHELASTIC_RUN_ID": "test"}.items():
            monkeypatch.setenv(key, value)
    return as_rank


def test_resume_hint_names_the_torchrun_command(monkeypatch, under_torchrun, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["search.py", "--config", "c.yaml", "--overwrite"])
    python = commands.command_line("search.py").split()[0]
    assert commands.resume_command(tmp_path / "run") == f"{python} search.py --config c.yaml --resume --out {tmp_path / 'run'}"
    under_torchrun(0)
    parent = {  # torchrun's own command line, as /proc shows it: its #! interpreter, then the script
        "script": [sys.executable, str(tmp_path / "bin" / "torchrun"), "--standalone", "--nproc_per_node", "2", *sys.argv],
        "module": ["python3", "-u", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "0", "--nproc_per_node", "8", *sys.argv],
        "unreadable": [],
    }
    expected = {"script": "bin/torchrun --standalone --nproc_per_node 2",
                "module": "python3 -u -m torch.distributed.run --nnodes 2 --node_rank 0 --nproc_per_node 8",
                "unreadable": f"{commands.beside_python('torchrun', 'torchrun')} --standalone --nproc_per_node 2"}
    for form, argv in parent.items():
        monkeypatch.setattr(commands, "_parent_argv", lambda: argv, raising=False)
        assert commands.resume_command(tmp_path / "run") == f"{expected[form]} search.py --config c.yaml --resume --out {tmp_path / 'run'}"


def test_a_signal_is_acknowledged_by_rank_0_only(under_torchrun, capsys):
    for rank, said in ((1, ""), (0, "SIGTERM: stopping before the first step")):
        under_torchrun(rank)
        stop = StopSignals()
        stop._note(signal.SIGTERM)
        err = capsys.readouterr().err
        assert stop.received == signal.SIGTERM and (err.strip().startswith(said) if said else err == "")


@pytest.fixture
def handlers_kept():
    """A rank other than 0 that waited keeps handlers that end the process: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_each_rank_records_its_line_in_torchruns_error_file(under_torchrun, monkeypatch, tmp_path, capsys, handlers_kept):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr(distributed, "LINGER_S", 0.0, raising=False)

    def bad():
        raise ConfigError("model.d_model must be a positive integer, got -1")

    def recorded() -> dict:
        return json.loads(error_file.read_text())["message"]

    under_torchrun(0)
    assert guarded(bad) == 2 and capsys.readouterr().err == "error: model.d_model must be a positive integer, got -1\n"
    assert recorded()["message"] == recorded()["extraInfo"]["py_callstack"] == "error: model.d_model must be a positive integer, got -1"
    # rank 1 is silent while rank 0 may still print; still running after the wait, it failed alone and says so
    under_torchrun(1)
    assert guarded(bad) == 2 and capsys.readouterr().err == "error: (rank 1) model.d_model must be a positive integer, got -1\n"
    assert recorded()["message"] == "error: model.d_model must be a positive integer, got -1"

    def bug():
        raise ValueError("a bug")

    with pytest.raises(ValueError):  # a bug keeps its traceback, and torchrun's summary gets it too
        guarded(bug)
    assert recorded()["message"] == "ValueError: a bug" and "Traceback" in recorded()["extraInfo"]["py_callstack"]
