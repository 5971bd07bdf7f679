"""Checkpoints and exact resume: a search and a retrain killed with SIGKILL at a random step and
resumed end bitwise equal to uninterrupted runs; SIGTERM writes a checkpoint and exits 143;
divergence stops (exit 3, last good checkpoint kept) or skips the batch, per on_divergence; a second
SIGINT ends a run at once, even inside a long step."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autoln.retrain import run_retrain as rr
from autoln.oneshot import run_search as rs
from autoln.config import load_config
from autoln.core.errors import ConfigError, DataError, DivergenceError
from autoln.models.model import TransformerLM

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
SEARCH = ["--set", "race.enabled=false", "--set", "search.steps=40", "--set", "search.eval_every=20", "--set", "search.arch_lr=0.01", "--set", "search.arch_warmup_steps=10"]
RETRAIN = ["--set", "retrain.steps=48", "--set", "retrain.eval_every=16", "--set", "retrain.final_eval_windows=8"]
COMMON = ["--config", TINY, "--set", "checkpoint.every=4", "--set", "logging.progress=false", "--set", "logging.log_every=2"]


def command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / script), *COMMON, *args]


def env(cache: str) -> dict:
    return {**os.environ, "XDG_CACHE_HOME": cache}


def run(args: list[str], cache: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, env=env(cache), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def checkpoint_step(folder: Path) -> int:
    try:
        return torch.load(folder / "checkpoint.pt", weights_only=True)["step"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


def kill_after(args: list[str], folder: Path, step: int, sig: int, cache: str) -> subprocess.CompletedProcess:
    """Start the command, wait until its checkpoint reaches ``step``, wait a random moment more
    (so the kill lands anywhere in a later step), send ``sig``."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(cache), cwd=ROOT)
    deadline = time.time() + 300
    while checkpoint_step(folder) < step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[1][-2000:]
    time.sleep(random.Random(step).uniform(0.0, 0.15))
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def final_state(folder: Path) -> dict:
    return torch.load(folder / "checkpoint.pt", weights_only=True)["model"]


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_search_killed_at_a_random_step_resumes_bitwise(tmp_path):
    cache = str(tmp_path / "cache")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run(command("search.py", *SEARCH, "--out", str(whole)), cache)
    step = random.Random(1).randint(8, 20)
    proc = kill_after(command("search.py", *SEARCH, "--out", str(killed)), killed, step, signal.SIGKILL, cache)
    assert proc.returncode == -signal.SIGKILL and not (killed / "genotype.json").exists()
    # the killed holder's lock file is left behind, but the kernel released its lock: as a job a
    # scheduler re-queues after a lost node, the same command with --resume proceeds
    assert (killed / ".autoln.lock").read_text().startswith("autoln search (process ")
    proc = run(command("search.py", *SEARCH, "--out", str(killed), "--resume"), cache)
    assert "resumed from" in proc.stderr and not (killed / ".autoln.lock").exists()

    a, b = (json.loads((d / "genotype.json").read_text()) for d in (whole, killed))
    assert a["placements"] == b["placements"] and a["probabilities"] == b["probabilities"]
    ma, mb = a["provenance"]["metrics"], b["provenance"]["metrics"]
    assert ma["supernet_valid"] == mb["supernet_valid"] and ma["hessian_eigenvalues"] == mb["hessian_eigenvalues"]
    assert mb["resumed_from_step"] >= step and ma["resumed_from_step"] is None
    assert_same_state(final_state(whole), final_state(killed))  # weights and alphas, bitwise
    for tag in ("train/loss", "train/loss_alpha", "valid/loss"):
        assert scalars(whole, tag) == scalars(killed, tag), tag  # the killed run's extra events are purged


def test_retrain_killed_or_terminated_resumes_bitwise(tmp_path):
    cache = str(tmp_path / "cache")
    args = ("--genotype", "mix-ln", *RETRAIN)
    whole, killed, termed = tmp_path / "whole", tmp_path / "killed", tmp_path / "termed"
    run(command("retrain.py", *args, "--out", str(whole)), cache)
    step = random.Random(2).randint(8, 24)
    proc = kill_after(command("retrain.py", *args, "--out", str(killed)), killed, step, signal.SIGKILL, cache)
    assert proc.returncode == -signal.SIGKILL
    run(command("retrain.py", *args, "--out", str(killed), "--resume"), cache)
    # SIGTERM: the run finishes its step, writes a checkpoint there and exits 143
    proc = kill_after(command("retrain.py", *args, "--out", str(termed)), termed, 8, signal.SIGTERM, cache)
    assert proc.returncode == 143 and "--resume" in proc.stderr and "Traceback" not in proc.stderr
    stopped = checkpoint_step(termed)
    assert f"after step {stopped}" in proc.stderr and not (termed / "metrics.json").exists()
    run(command("retrain.py", *args, "--out", str(termed), "--resume"), cache)

    ref = json.loads((whole / "metrics.json").read_text())
    for folder in (killed, termed):
        m = json.loads((folder / "metrics.json").read_text())
        for key in ("valid", "test", "history"):
            assert m[key] == ref[key], (folder.name, key)
        assert m["diagnostics"]["evaluations"] == ref["diagnostics"]["evaluations"]
        assert m["diagnostics"]["init"] == ref["diagnostics"]["init"]
        assert_same_state(final_state(whole), final_state(folder))
        assert scalars(whole, "train/loss") == scalars(folder, "train/loss")


def test_resume_of_a_finished_or_missing_run_and_a_different_config(tmp_path):
    cache = str(tmp_path / "cache")
    out = tmp_path / "s"
    run(command("search.py", "--set", "race.enabled=false", "--set", "search.steps=8", "--set", "search.arch_warmup_steps=2", "--set", "search.eval_every=4", "--out", str(out)), cache)
    proc = subprocess.run(command("search.py", "--set", "race.enabled=false", "--set", "search.steps=8", "--set", "search.arch_warmup_steps=2", "--out", str(out), "--resume"),
                          capture_output=True, text=True, env=env(cache), cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "finished search" in proc.stderr
    (out / "genotype.json").unlink()  # as if killed after its last checkpoint
    proc = subprocess.run(command("search.py", "--set", "race.enabled=false", "--set", "search.steps=8", "--set", "search.arch_warmup_steps=2", "--set", "search.eval_every=4", "--set",
                                  "search.lr=0.01", "--set", "model.d_ff=64", "--out", str(out), "--resume"),
                          capture_output=True, text=True, env=env(cache), cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "search.lr (checkpoint 0.002, now 0.01)" in proc.stderr and "model.d_ff" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def nan_at(monkeypatch):
    """Make the ``n``-th training-mode forward pass return a NaN loss."""
    def arm(n: int) -> None:
        original = TransformerLM.forward
        calls = {"n": 0}

        def forward(self, idx, targets=None, mix=None):
            logits, loss = original(self, idx, targets, mix)
            if self.training and loss is not None:
                calls["n"] += 1
                if calls["n"] == n:
                    loss = loss * float("nan")
            return logits, loss
        monkeypatch.setattr(TransformerLM, "forward", forward)
    return arm


def tiny(tmp_path, *sets: str):
    os.environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return load_config(TINY, ["retrain.steps=12", "retrain.eval_every=6", "retrain.final_eval_windows=4", "search.steps=12",
                              "search.eval_every=6", "search.arch_warmup_steps=0", "checkpoint.every=2", "logging.progress=false", *sets])


def test_divergence_stop_keeps_the_last_good_checkpoint(tmp_path, nan_at):
    nan_at(7)
    with pytest.raises(DivergenceError, match=r"diverged at step 7: loss=nan.*last good checkpoint is .*checkpoint.pt, step 6\. Try a new run"):
        rr.run_retrain(tiny(tmp_path), "all-post", tmp_path / "r")
    ckpt = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 6 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert not (tmp_path / "r" / "metrics.json").exists()


def test_divergence_skip_batch_skips_that_update_only(tmp_path, nan_at):
    cfg = tiny(tmp_path, "retrain.on_divergence=skip_batch")
    clean = rr.run_retrain(cfg, "all-post", tmp_path / "clean")
    nan_at(7)
    skipped = rr.run_retrain(cfg, "all-post", tmp_path / "skipped")
    m = json.loads(skipped.path.read_text())
    assert m["skipped_batches"] == 1 and json.loads(clean.path.read_text())["skipped_batches"] == 0
    params = dict(skipped.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in params.values())
    assert any(not torch.equal(p, params[n]) for n, p in clean.model.named_parameters())  # step 7 was not applied
    assert m["history"][0] == json.loads(clean.path.read_text())["history"][0]  # identical up to step 6


def test_search_skip_batch_counts_a_nan_alpha_step(tmp_path, nan_at):
    nan_at(3)  # the second step's alpha pass (each step: alpha pass, weight pass)
    result = rs.run_search(tiny(tmp_path, "search.on_divergence=skip_batch"), tmp_path / "s")
    assert result.genotype.provenance["metrics"]["skipped_batches"] == 1
    assert torch.isfinite(result.model.alphas).all()
    nan_at(3)
    with pytest.raises(DivergenceError, match=r"search diverged at step 2: .*L_alpha \(or its gradient\)=nan"):
        rs.run_search(tiny(tmp_path), tmp_path / "s2")


def test_divergence_through_the_command_line(tmp_path):
    """A learning rate of 1000 makes the loss NaN within a few steps: ``stop`` exits 3 naming
    the step and the last good checkpoint; under ``skip_batch`` a search finishes, counts the
    skipped updates and says so (the retrain's ``skip_batch`` is tested in-process above)."""
    cache = str(tmp_path / "cache")
    args = ["--genotype", "all-post", "--set", "retrain.lr=1000", "--set", "retrain.warmup_steps=0",
            "--set", "retrain.grad_clip=0", "--set", "retrain.steps=20", "--set", "retrain.eval_every=10",
            "--set", "retrain.final_eval_windows=4"]
    proc = subprocess.run(command("retrain.py", *args, "--out", str(tmp_path / "stop")), capture_output=True, text=True,
                          env=env(cache), cwd=ROOT, timeout=300)
    assert proc.returncode == 3 and "retrain diverged at step" in proc.stderr and "Traceback" not in proc.stderr
    assert "checkpoint" in proc.stderr and not (tmp_path / "stop" / "metrics.json").exists()
    # the search goes on too: its monitor meets a non-finite alpha Hessian and records NaN
    proc = run(command("search.py", "--set", "race.enabled=false", "--set", "search.lr=1000", "--set", "search.warmup_steps=0", "--set", "search.grad_clip=0",
                       "--set", "search.steps=20", "--set", "search.arch_warmup_steps=5", "--set", "search.eval_every=10",
                       "--set", "search.on_divergence=skip_batch",
                       "--out", str(tmp_path / "search-skip")), cache)
    g = json.loads((tmp_path / "search-skip" / "genotype.json").read_text())
    skipped = g["provenance"]["metrics"]["skipped_batches"]
    assert 0 < skipped <= 20 and f"warning: {skipped} of 20 updates were skipped" in proc.stderr


def test_usage_errors_are_one_line_and_huge_numbers_stay_short():
    from autoln.cli import number, retrain_main
    from autoln.oneshot.monitor import max_eigenvalue

    with pytest.raises(SystemExit) as exc:
        retrain_main(["--genotype", "all-pre", "--resume"])
    assert exc.value.code == 2
    assert number(3.14159) == "3.1416" and number(1.01e304) == "1.01e+304"
    assert math.isnan(max_eigenvalue(torch.tensor([[1.0, float("inf")], [float("inf"), 1.0]])))
    assert max_eigenvalue(torch.tensor([[2.0, 0.0], [0.0, 1.0]])) == pytest.approx(2.0)


def test_search_resumed_from_its_last_step_redoes_the_selection_exactly(tmp_path):
    """A search stopped after its last step (during perturbation-based selection) resumes from
    that step's checkpoint: the annealed temperature is restored with it, so the selection, the
    fine-tuning and the genotype are those of the uninterrupted run."""
    cfg = tiny(tmp_path, "search.tau_end=0.1", "search.selection_tune_steps=3")
    whole = rs.run_search(cfg, tmp_path / "whole").genotype
    again = tmp_path / "again"
    again.mkdir()
    for name in ("checkpoint.pt", "config.yaml"):
        shutil.copy(tmp_path / "whole" / name, again / name)
    resumed = rs.run_search(cfg, again, resume=True).genotype
    assert resumed.placements == whole.placements and resumed.probabilities == whole.probabilities
    assert resumed.provenance["selection"]["loss_rises"] == whole.provenance["selection"]["loss_rises"]
    assert whole.provenance["config"]["search"]["tau_end"] == 0.1


SLOW_STEP = """
import sys, torch
import autoln.oneshot.run_search as rs
from autoln.cli import search_main
plain = rs.weight_step
def slow(*args, **kwargs):
    print("SLOW-STEP", file=sys.stderr, flush=True)
    torch.set_num_threads(1)
    a = torch.randn(6000, 6000)
    for _ in range(20):  # a step of minutes, nearly all of it inside torch's C++ matmuls
        a = a @ a
    return plain(*args, **kwargs)
rs.weight_step = slow
sys.exit(search_main())
"""


def test_a_second_sigint_ends_a_run_at_once_even_inside_a_long_step(tmp_path):
    """The first SIGINT asks the run to stop after its step; a second one, sent while that step
    (here minutes long, inside one torch call) runs, must end the process within 5 s with 130."""
    args = [sys.executable, "-c", SLOW_STEP, *COMMON, "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(str(tmp_path / "c")), cwd=ROOT)
    lines = []
    for line in proc.stderr:  # wait until the slow step has begun
        lines.append(line)
        if "SLOW-STEP" in line:
            break
    assert proc.poll() is None, "".join(lines)[-2000:]
    time.sleep(0.5)  # inside the matmuls now
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None  # the first signal waits for the step to end
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        rest = proc.communicate(timeout=5)[1]
    finally:
        proc.kill()
    assert time.monotonic() - sent < 5
    assert proc.returncode == 130, rest[-2000:]
    said = "".join(lines) + rest
    assert "SIGINT: stopping at the end of the step in progress, after writing a checkpoint" in said  # acknowledged at once
    # the slow step is step 1 and checkpoint.every is 4: nothing to resume from, and it says so
    assert "second signal (SIGINT): stopping at once; no checkpoint was written yet, so there is nothing to resume" in said
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


SLOW_SET_UP = """
import sys, time
import autoln.retrain.run_retrain as rr
from autoln.cli import retrain_main
plain = rr.snapshot
def slow(*args, **kwargs):  # the initial diagnostics, before the first step, made slow
    print("SLOW-SET-UP", file=sys.stderr, flush=True)
    time.sleep(3)
    return plain(*args, **kwargs)
rr.snapshot = slow
sys.exit(retrain_main())
"""


def test_a_signal_during_set_up_stops_before_the_first_step_and_says_there_is_nothing_to_resume(tmp_path):
    """SIGINT while a retrain sets up (its initial diagnostics) stops it before step 1 (exit 130),
    writing no checkpoint, with a message that says so instead of a resume command."""
    args = [sys.executable, "-c", SLOW_SET_UP, *COMMON, "--genotype", "all-pre", "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(str(tmp_path / "c")), cwd=ROOT)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "SLOW-SET-UP" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[1]
    said = "".join(lines) + rest
    assert proc.returncode == 130, said[-2000:]
    assert "SIGINT: stopping before the first step (the run is setting up; no checkpoint is written)" in said
    assert "stopped by signal before step 1; no checkpoint was written, so there is nothing to resume" in said
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_the_resume_hint_is_the_run_s_own_command_with_resume(monkeypatch):
    """The hint printed on a stop is a command to paste: the same arguments, no --overwrite, with
    --resume and --out; a command of several jobs is re-run as it was."""
    from autoln.core.commands import resume_command

    monkeypatch.setattr(sys, "argv", ["search.py", "--config", "my config.yaml", "--overwrite"])
    line = resume_command(Path("runs/a"))
    assert line.endswith("search.py --config 'my config.yaml' --resume --out runs/a")
    monkeypatch.setattr(sys, "argv", ["retrain.py", "--genotype", "all-pre", "--out", "x", "--resume"])
    assert resume_command(Path("x")).endswith("retrain.py --genotype all-pre --out x --resume")
    monkeypatch.setattr(sys, "argv", ["search.py", "--seeds", "3", "--out", "s"])
    assert resume_command(Path("s/seed0")).endswith("search.py --seeds 3 --out s")
    # an experiment script has no --resume: run again as it was, it continues its runs
    monkeypatch.setattr(sys, "argv", ["experiments/truth/ground_truth.py", "--settings", "deep", "--out", "v"])
    assert resume_command(Path("v/deep/compare/g00/seed0")).endswith("experiments/truth/ground_truth.py --settings deep --out v")
    # ... and never with --overwrite, which would redo what is finished
    monkeypatch.setattr(sys, "argv", ["experiments/common/validate.py", "--overwrite", "--out", "v"])
    assert resume_command(Path("v/deep/search")).endswith("experiments/common/validate.py --out v")
    monkeypatch.setattr(sys, "argv", ["search.py", "--seeds", "3", "--overwrite", "--out", "s"])
    assert resume_command(Path("s/seed0")).endswith("search.py --seeds 3 --out s")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/autoln-retrain", "--genotype", "all-pre"])
    assert resume_command(Path("x")).endswith("/venv/bin/autoln-retrain --genotype all-pre --resume --out x")


def test_a_half_written_checkpoint_left_by_a_killed_process_is_removed(tmp_path):
    """A process killed while writing its checkpoint leaves the atomic write's temporary file
    (``.checkpoint.pt.<random>.tmp``); the next run on that folder removes it, and nothing else."""
    from autoln.engine.checkpoint import Checkpointer

    stale = tmp_path / ".checkpoint.pt.f57d_q8n.tmp"
    stale.write_bytes(b"half a checkpoint")
    kept = [tmp_path / "checkpoint.pt", tmp_path / ".genotype.json.a1.tmp"]
    for path in kept:
        path.write_bytes(b"x")
    Checkpointer(tmp_path, 10, write=False)  # a process that does not write (torchrun rank > 0) leaves it
    assert stale.exists()
    Checkpointer(tmp_path, 10, write=True)
    assert not stale.exists() and all(path.exists() for path in kept)


def test_a_resumed_retrain_keeps_every_tensorboard_series(tmp_path):
    """A value whose TensorBoard step is not a training step is purged by a resume (purge_step).
    A 6-block retrain stopped after its step-2 checkpoint and resumed (purging steps >= 3) has
    every scalar series of the uninterrupted run, point for point; the per-block values at
    initialisation are an image at step 0, not scalars stepped by the block index."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["model.n_layers=6", "retrain.steps=4", "retrain.eval_every=2", "retrain.final_eval_windows=4",
                             "retrain.warmup_steps=1", "checkpoint.every=2", "logging.progress=false", "logging.log_every=1",
                             f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"])
    rr.run_retrain(cfg, "all-pre", tmp_path / "whole")

    def stop(step: int, _valid: dict) -> None:
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rr.run_retrain(cfg, "all-pre", tmp_path / "part", on_eval=stop)
    rr.run_retrain(cfg, "all-pre", tmp_path / "part", resume=True)

    def events(folder: Path):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
        acc.Reload()
        return acc

    whole, part = events(tmp_path / "whole"), events(tmp_path / "part")
    tags = whole.Tags()["scalars"]
    assert sorted(tags) == sorted(part.Tags()["scalars"]) and "diag/residual_norm/block6" in tags
    assert not [t for t in tags if t.startswith("diag_init/")]
    for tag in tags:
        assert [(e.step, e.value) for e in whole.Scalars(tag)] == [(e.step, e.value) for e in part.Scalars(tag)], tag
    assert [e.step for e in part.Images("diag_init")] == [0]


def test_a_new_event_file_waits_past_the_second_of_those_already_there(tmp_path):
    """TensorBoard orders a folder's event files by name; two of one second sort by pid and a
    counter compared as text. A new file waits out the current second when a file of that second
    is there (the rest of it: 0.7 s at 100.3), and not at all for an older one or one of a later
    second (a clock set back)."""
    from autoln.core.tb import wait_past_event_files

    (tmp_path / "events.out.tfevents.0000000100.host.1.9").write_bytes(b"")
    slept = []
    assert wait_past_event_files(tmp_path, clock=lambda: 100.3, sleep=slept.append) == pytest.approx(0.7)
    assert slept == [pytest.approx(0.7)]
    assert wait_past_event_files(tmp_path, clock=lambda: 101.0, sleep=slept.append) == 0.0
    assert wait_past_event_files(tmp_path, clock=lambda: 99.5, sleep=slept.append) == 0.0
    assert wait_past_event_files(tmp_path / "none", clock=lambda: 100.3, sleep=slept.append) == 0.0
    assert len(slept) == 1


def test_a_resumed_logger_right_after_the_first_is_read_after_it(tmp_path, monkeypatch):
    """The instance CI hit: a resumed event file created in the same second as the first, with
    TensorBoard's file counter going from 9 to 10 (".10" sorts before ".9"), was read first, so
    its step-4 point came before steps 0 and 2. Now the resumed file sorts last and the series
    reads 0, 2, 4 with the interrupted run's step 4 purged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    from autoln.core.tb import Logger

    monkeypatch.setattr(event_file_writer._global_uid, "_value", 9)
    with Logger(tmp_path) as log:
        for step, value in [(0, 1.0), (2, 2.0), (4, 9.0)]:  # step 4: written after the step-2 checkpoint
            log.scalar("train/loss", value, step)
    with Logger(tmp_path, purge_step=3) as log:
        log.scalar("train/loss", 3.0, 4)
    files = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert [name.rsplit(".", 1)[1] for name in files] == ["9", "10"]
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(0, 1.0), (2, 2.0), (4, 3.0)]


def test_a_corpus_moved_with_the_same_bytes_resumes_and_another_is_refused(tmp_path, capsys):
    """Resume on another machine: the corpus at a new path with the same bytes goes on (a note
    says so) to the uninterrupted result; other bytes, or a checkpoint that kept no fingerprint,
    are refused by name; a remedy that points at a corpus no longer there says to move it."""
    old, new, other = tmp_path / "a" / "text.txt", tmp_path / "b" / "text.txt", tmp_path / "c" / "text.txt"
    for p in (old, new, other):
        p.parent.mkdir()
    text = (ROOT / "README.md").read_text(encoding="utf-8") * 2
    old.write_text(text, encoding="utf-8")
    other.write_text(text.replace("autoln", "AUTOLN"), encoding="utf-8")

    def cfg(corpus, *sets):
        return load_config(TINY, ["retrain.steps=4", "retrain.eval_every=2", "retrain.final_eval_windows=4", "retrain.warmup_steps=1",
                                  "checkpoint.every=2", "logging.progress=false", f"data.corpus={corpus}",
                                  f"data.cache_dir={tmp_path / 'cache'}", *sets])

    whole = rr.run_retrain(cfg(old), "all-pre", tmp_path / "whole")

    def stop(step: int, _valid: dict) -> None:
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rr.run_retrain(cfg(old), "all-pre", tmp_path / "part", on_eval=stop)
    old.rename(new)  # the run goes to another machine, its corpus to another path
    with pytest.raises(ConfigError, match=r"data.corpus .*another corpus: its bytes' fingerprint is"):
        rr.run_retrain(cfg(other), "all-pre", tmp_path / "part", resume=True)
    with pytest.raises(DataError, match=r"a/text.txt does not exist; if the corpus moved .*resume with --set data.corpus="):
        rr.run_retrain(cfg(old), "all-pre", tmp_path / "part", resume=True)  # the run's own config names the old path
    capsys.readouterr()
    done = rr.run_retrain(cfg(new), "all-pre", tmp_path / "part", resume=True)
    err = capsys.readouterr().err
    assert "note: --resume: the corpus moved (checkpoint " in err and "its bytes are the checkpoint's" in err
    assert json.loads(done.path.read_text())["valid"] == json.loads(whole.path.read_text())["valid"]


def test_a_checkpoint_without_a_fingerprint_cannot_take_a_moved_corpus(tmp_path):
    from autoln.engine.checkpoint import moved_corpus

    cfg = load_config(TINY, ["data.corpus=stdlib"])
    diffs = ["data.corpus (checkpoint /old/x.txt, now stdlib)", "retrain.lr (checkpoint 0.002, now 0.01)"]
    kept, note = moved_corpus(diffs, None, cfg)
    assert note is None and "records no fingerprint of its corpus's bytes" in kept[0] and kept[1] == diffs[1]
    assert moved_corpus(diffs[1:], None, cfg) == (diffs[1:], None)  # no corpus difference: nothing to look at


def test_a_finished_search_is_reused_where_its_corpus_moved_with_its_bytes(tmp_path):
    from autoln.oneshot.consensus import check_same_search
    from autoln.data import load_corpus
    from autoln.models.genotype import baseline

    text = (ROOT / "README.md").read_text(encoding="utf-8") * 2
    old, new, other = tmp_path / "old.txt", tmp_path / "new.txt", tmp_path / "other.txt"
    new.write_text(text, encoding="utf-8")
    other.write_text(text.replace("autoln", "AUTOLN"), encoding="utf-8")

    def cfg(corpus):
        return load_config(TINY, [f"data.corpus={corpus}", f"data.cache_dir={tmp_path / 'cache'}"])

    g = baseline("all-pre", cfg(new).model, 256)
    g.provenance = {"config": cfg(old).to_dict(), "data": {"fingerprint_sha256": load_corpus(cfg(new).data).fingerprint}}
    g.save(tmp_path / "s" / "genotype.json")
    check_same_search(tmp_path / "s", cfg(new))  # the same bytes at another path: reused
    with pytest.raises(ConfigError, match="data.corpus"):
        check_same_search(tmp_path / "s", cfg(other))


def test_sighup_stops_a_run_as_sigterm_does(tmp_path):
    """A closed terminal or ssh session (SIGHUP): the step finishes, its checkpoint is written and
    the resume command printed, exit 129; the other catchable signals that end a process by
    default are in the same table."""
    from autoln.core.signals import STOP_SIGNALS

    assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU,
            signal.SIGALRM} == set(STOP_SIGNALS)
    assert not {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGPROF, signal.SIGKILL} & set(STOP_SIGNALS)
    cache, out = str(tmp_path / "cache"), tmp_path / "hup"
    proc = kill_after(command("retrain.py", "--genotype", "all-pre", *RETRAIN, "--out", str(out)), out, 8, signal.SIGHUP, cache)
    assert proc.returncode == 128 + signal.SIGHUP and "SIGHUP: stopping" in proc.stderr and "--resume" in proc.stderr
    stopped = checkpoint_step(out)
    assert stopped >= 8 and f"after step {stopped}" in proc.stderr and "Traceback" not in proc.stderr


def test_a_resume_with_another_thread_count_says_it_is_not_bitwise(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["retrain.steps=4", "retrain.eval_every=2", "retrain.final_eval_windows=4", "checkpoint.every=2", "retrain.warmup_steps=1",
                             "logging.progress=false", f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"])

    def stop(step: int, _valid: dict) -> None:
        if step == 2:
            raise KeyboardInterrupt

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with pytest.raises(KeyboardInterrupt):
            rr.run_retrain(cfg, "all-pre", tmp_path / "r", on_eval=stop)
        assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)["threads"] == 1
        torch.set_num_threads(2)
        capsys.readouterr()
        rr.run_retrain(cfg, "all-pre", tmp_path / "r", resume=True)
    finally:
        torch.set_num_threads(threads)
    assert "note: --resume with torch threads (checkpoint 1, now 2): the run goes on from its checkpoint, but is no longer " \
        "bitwise" in capsys.readouterr().err
