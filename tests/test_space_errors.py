"""A full disk or a file-size limit at every writer (issue 36, kind 1): one line naming the file
and the cause, exit status 2, the previous checkpoint whole, ``--resume`` working once there is
space again.

The limit is real: each run is a subprocess whose ``RLIMIT_FSIZE`` is lowered (``ulimit -f``)
at the n-th call of one writer, so that writer, and every one after it, meets ``EFBIG`` from
the operating system through whatever library writes the file (``torch.save``'s
``RuntimeError``, NumPy's short write, TensorBoard's writer thread, matplotlib).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from .conftest import ROOT

resource = pytest.importorskip("resource", reason="RLIMIT_FSIZE needs POSIX")

TINY = str(ROOT / "configs" / "tiny.yaml")
SHORT = ["--set", "race.enabled=false", "--set", "search.steps=40", "--set", "search.eval_every=20", "--set", "search.arch_warmup_steps=10",
         "--set", "search.selection=argmax", "--set", "logging.progress=false"]

#: Runs one command (``search`` or ``retrain``) with ``RLIMIT_FSIZE`` lowered to 64 bytes at the
#: n-th call of ``module.attr`` (a writer), before that call.
HARNESS = textwrap.dedent("""
    import importlib, resource, sys
    module_name, attr, nth, entry = sys.argv[1:5]
    owner = importlib.import_module(module_name)
    if "." in attr:
        cls, attr = attr.split(".")
        owner = getattr(owner, cls)
    original = getattr(owner, attr)
    calls = [0]
    def armed(*args, **kwargs):
        calls[0] += 1
        if calls[0] == int(nth):
            resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))
        return original(*args, **kwargs)
    setattr(owner, attr, armed)
    from autoln import cli
    sys.argv = [entry + ".py", *sys.argv[5:]]
    sys.exit(getattr(cli, entry + "_main")())
""")


def run_limited(module: str, attr: str, nth: int, entry: str, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", HARNESS, module, attr, str(nth), entry, *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def run_cli(script: str, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_line(proc: subprocess.CompletedProcess, file: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert f"cannot write {file}" in line and "File too large (over this process's file-size limit, ulimit -f)" in line, line
    return line


def no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.rglob(".*.tmp")]


# every writer of autoln.core.io, one subprocess: the library's exception becomes OSError(EFBIG, file)
WRITERS = textwrap.dedent("""
    import errno, json, resource, sys
    import numpy as np, torch
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path
    from autoln.core import io
    from autoln.core.tb import Logger
    out = Path(sys.argv[1])
    src = out / "src.bin"
    src.write_bytes(b"x" * 10000)
    writers = {
        "checkpoint.pt": lambda p: io.save_torch_atomic({"w": torch.zeros(4000)}, p),
        "train.npy": lambda p: io.save_numpy_atomic(np.zeros(4000), p),
        "metrics.json": lambda p: io.write_json_atomic(p, list(range(4000))),
        "config.yaml": lambda p: io.write_text_atomic(p, "x" * 10000),
        "alphas.png": lambda p: io.save_figure_atomic(plt.figure(), p),
        "copy.json": lambda p: io.copy_atomic(src, p),
    }
    for name in writers:
        (out / name).write_bytes(b"old")
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))
    seen = {}
    for name, write in writers.items():
        try:
            write(out / name)
            seen[name] = "written"
        except OSError as exc:
            seen[name] = [exc.errno, exc.filename, (out / name).read_bytes().decode()]
    log = Logger(out / "tb")
    try:
        for i in range(3000):
            log.scalar("x", float(i), i)
        log.flush()
        seen["events"] = "written"
    except OSError as exc:
        seen["events"] = [exc.errno, exc.filename, ""]
    log.close()
    print(json.dumps(seen))
""")


def test_every_writer_reports_a_file_size_limit_as_an_oserror_naming_its_file_and_keeps_the_old_file(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WRITERS, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    import errno

    for name in ("checkpoint.pt", "train.npy", "metrics.json", "config.yaml", "alphas.png", "copy.json"):
        assert seen[name] == [errno.EFBIG, str(tmp_path / name), "old"], (name, seen[name])
    code, events, _ = seen["events"]
    assert code == errno.EFBIG and Path(events).parent == tmp_path / "tb" and Path(events).name.startswith("events.out.tfevents.")
    # TensorBoard's writer thread raised it: its own traceback is not printed, and close() did not raise it again
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, proc.stderr[-2000:]
    no_temporaries(tmp_path)


@pytest.mark.parametrize("module, attr, nth, file", [
    ("autoln.engine.checkpoint", "save", 2, "checkpoint.pt"),   # torch.save's RuntimeError; the first checkpoint is kept
    ("autoln.core.tb", "Logger.scalar", 40, "events.out.tfevents"),  # TensorBoard's writer thread
    ("autoln.core.io", "save_figure_atomic", 1, "alphas.png"),  # matplotlib (imported where it is used)
    ("autoln.models.genotype", "write_json_atomic", 1, "genotype.json"),
])
def test_a_search_out_of_space_at_a_writer_says_one_line_keeps_its_checkpoint_and_resumes(module, attr, nth, file, tmp_path):
    out = tmp_path / "run"
    proc = run_limited(module, attr, nth, "search", "--config", TINY, *SHORT, "--out", str(out), cache=tmp_path / "cache")
    line = assert_one_line(proc, str(out / file))
    assert "continue with: " in line and "--resume" in line and f"--out {out}" in line
    ckpt = out / "checkpoint.pt"
    if file == "checkpoint.pt":
        assert f"the previous checkpoint {ckpt} is kept" in line
        assert torch.load(ckpt, map_location="cpu", weights_only=False)["step"] == 20  # the first one, whole
    no_temporaries(out)
    # once there is space: the command the line names continues the run to its end
    again = run_cli("search.py", "--config", TINY, *SHORT, "--out", str(out), "--resume", cache=tmp_path / "cache")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "genotype.json").read_text())["placements"]


def test_a_retrain_out_of_space_at_metrics_json_says_one_line_and_resumes(tmp_path):
    out = tmp_path / "retrain"
    args = ["--config", TINY, "--genotype", "all-pre", "--set", "retrain.steps=20", "--set", "retrain.eval_every=10",
            "--set", "logging.progress=false", "--out", str(out)]
    proc = run_limited("autoln.retrain.run_retrain", "write_json_atomic", 1, "retrain", *args, cache=tmp_path / "cache")
    line = assert_one_line(proc, str(out / "metrics.json"))
    assert f"the previous checkpoint {out / 'checkpoint.pt'} is kept" in line and "--resume" in line
    assert torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)["step"] == 20
    again = run_cli("retrain.py", *args, "--resume", cache=tmp_path / "cache")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["steps"] == 20


def test_a_token_cache_out_of_space_is_a_note_and_the_run_goes_on(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    code = textwrap.dedent(f"""
        import resource
        from autoln.config import DataConfig
        from autoln.data import load_corpus
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))
        c = load_corpus(DataConfig(corpus={str(corpus)!r}, tokenizer="chars"))
        print(len(c.splits["train"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [note] = [line for line in proc.stderr.splitlines() if line.startswith("note: the token cache was not written")]
    assert "train.npy: File too large" in note and "goes on from the tokens in memory" in note
    assert int(proc.stdout.split()[-1]) > 0


def test_a_report_out_of_space_outside_a_run_names_the_file_and_the_command_to_run_again(capsys, monkeypatch):
    """The reports of --compare/--seeds/--tune are written outside any run: the line names the
    file and the command, run again as it was (without --overwrite: it reuses finished runs)."""
    import errno

    from autoln import cli

    monkeypatch.setattr(sys, "argv", ["retrain.py", "--compare", "--overwrite", "--out", "cmp"])

    def report():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "cmp/compare.md")

    assert cli.guarded(report) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write cmp/compare.md: No space left on device; the files written before it are kept. "
                          "Once there is space, continue with: ")
    assert err.endswith("retrain.py --compare --out cmp") and "--overwrite" not in err

    def torch_save():  # a library's RuntimeError over the OSError, reaching guarded unconverted
        try:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    assert cli.guarded(torch_save) == 2
    assert "cannot write a file (the library that wrote it did not say which): File too large (over this process's file-size limit, ulimit -f)" in capsys.readouterr().err


TUNE = ["--tune", "--config", TINY, "--set", "logging.progress=false", "--set", "search.steps=20", "--set", "search.eval_every=10",
        "--set", "search.arch_warmup_steps=4", "--set", "search.eval_windows=4", "--set", "search.monitor_windows=0",
        "--set", "search.selection=argmax", "--set", "tune.score=supernet", "--set", "tune.pruner=none", "--set",
        "tune.sampler=random", "--set", "tune.n_trials=2", "--set", "logging.tensorboard=false"]


@pytest.mark.parametrize("storage", ["journal", "sqlite"])
def test_a_tune_study_whose_storage_is_out_of_space_says_one_line_and_goes_on_when_run_again(storage, tmp_path):
    """Optuna reports a failed storage write in its own errors (for the journal and SQLite,
    ``AssertionError: Should not reach``, three tracebacks, exit 1): one line instead, the
    journal cut back to its last whole record, and the printed command finishes the study."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world, this is a text corpus.\n" * 2000)
    out = tmp_path / "study"
    args = [*TUNE, "--set", f"data.corpus={corpus}", "--out", str(out)]
    if storage == "journal":
        armed = ("optuna.storages.journal._file", "JournalFileBackend.append_logs", 6)
        file, what = out / "study.journal", "the study's journal): File too large"
    else:
        url = f"sqlite:///{tmp_path / 'study.db'}"
        # the failed write leaves its trial RUNNING: a short heartbeat lets the re-run fail it in seconds, not a minute
        args += ["--set", f"tune.storage={url}", "--set", "tune.heartbeat_interval=1", "--set", "tune.grace_period=3"]
        armed = ("optuna.storages._rdb.storage", "RDBStorage.set_trial_state_values", 2)
        file, what = url, "the study's database): disk I/O error"  # SQLite's word for EFBIG
    proc = run_limited(*armed[:2], armed[2], "search", *args[0:], cache=tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert line.startswith(f"error: cannot write {file} ({what}; the study's record up to its last write is intact"), line
    again = line.split("it goes on with the study: ", 1)[1]
    import shlex

    rerun = subprocess.run(shlex.split(again), capture_output=True, text=True, cwd=ROOT, timeout=600,
                           env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "2/2 finished trials" in rerun.stdout + rerun.stderr


def test_a_disk_full_before_the_lock_file_is_written_names_the_lock_file(tmp_path):
    """The first write of a run is the holder line in its lock file: on a full disk (here a
    file-size limit) the line names that file, and the command run again as printed goes on."""
    out = tmp_path / "run"
    proc = run_limited("autoln.core.locks", "FolderLock._write_holder", 1, "search", "--config", TINY, *SHORT, "--out", str(out),
                       cache=tmp_path / "cache")
    line = assert_one_line(proc, str(out / ".autoln.lock"))
    assert "the files written before it are kept. Once there is space, continue with: " in line
    import shlex

    again = subprocess.run(shlex.split(line.split("continue with: ", 1)[1]), capture_output=True, text=True, cwd=ROOT,
                           timeout=600, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "genotype.json").is_file()
