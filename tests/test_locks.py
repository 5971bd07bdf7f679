"""One run folder, one process: a second launch on a folder in use is refused and changes
nothing; the kernel frees a killed holder's folder; two first uses of a corpus build one cache."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autoln.core.errors import FolderInUse, OutputError
from autoln.core.locks import LOCK_FILE, FolderLock

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")


def test_a_held_folder_is_refused_naming_the_holder_and_let_go_at_release(tmp_path):
    folder = tmp_path / "run"
    with FolderLock(folder, "search"):
        assert (folder / LOCK_FILE).read_text().startswith(f"autoln search (process {os.getpid()} on ")
        with pytest.raises(OutputError) as err:  # a second open file description: as a second process
            FolderLock(folder, "retrain").acquire()
        assert f"--out {folder} is in use by autoln search (process {os.getpid()}" in str(err.value)
        assert isinstance(err.value, FolderInUse)  # an OutputError that the commands of many runs tell apart
        assert "changed nothing" in str(err.value) and "\n" not in str(err.value)
    assert not folder.exists()  # created by the lock, nothing written: removed again
    folder.mkdir()
    (folder / "genotype.json").write_text("{}")
    with FolderLock(folder):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["genotype.json"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="exists and is not a folder"):
        FolderLock(tmp_path / "file").acquire()
    assert FolderLock(folder, enabled=False).acquire().fh is None  # torchrun ranks above 0


def _launch(args: list[str], cache: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args, "--set", "logging.progress=false"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "XDG_CACHE_HOME": cache, "OMP_NUM_THREADS": "1"})


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _wait_for_lock(folder: Path, proc: subprocess.Popen) -> None:
    """Until ``proc`` holds ``folder``'s lock: its line is in the lock file, written after the
    ``flock`` (the file itself exists a moment before it, and a process stopped in that moment
    holds nothing)."""
    deadline = time.time() + 120
    while f"process {proc.pid} " not in _read(folder / LOCK_FILE):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.time() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_a_second_launch_on_a_folder_in_use_exits_2_and_the_first_ends_undisturbed(tmp_path):
    """search, retrain, --compare and --seeds, each running; then a real second process of the
    same command on its folder, with --overwrite, with --resume (search and retrain) and with
    neither: every second launch exits 2 with the message, and each first run ends as an
    undisturbed one (the search: the same genotype and config as a run left alone)."""
    cache = str(tmp_path / "cache")
    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 3, encoding="utf-8")
    short = ["--config", TINY, "--set", "race.enabled=false", "--set", "logging.tensorboard=false", "--set", f"data.corpus={text}"]
    firsts = {
        "search": ["search.py", *short, "--set", "search.steps=60", "--set", "search.eval_every=30", "--set",
                   "search.selection=argmax"],
        "retrain": ["retrain.py", *short, "--genotype", "all-pre", "--set", "retrain.steps=100", "--set", "retrain.eval_every=50"],
        "compare": ["retrain.py", "--compare", *short, "--baselines", "all-post", "--seeds", "1", "--set", "retrain.steps=100",
                    "--set", "retrain.eval_every=50"],
        "seeds": ["search.py", "--seeds", "2", *short, "--set", "search.steps=30", "--set", "search.eval_every=30",
                  "--set", "search.selection=argmax"],
    }
    procs = {}
    for name, args in firsts.items():  # each first run is held still once it has its folder: a stopped process keeps its lock
        procs[name] = _launch([*args, "--out", str(tmp_path / name)], cache)
        _wait_for_lock(tmp_path / name, procs[name])
        os.kill(procs[name].pid, signal.SIGSTOP)
    # --resume does not apply to --compare and --seeds (re-running them resumes), so they get two
    variants = {"search": ([], ["--overwrite"], ["--resume"]), "retrain": ([], ["--overwrite"], ["--resume"]),
                "compare": ([], ["--overwrite"]), "seeds": ([], ["--overwrite"])}
    seconds = [(name, extra, _launch([*firsts[name], "--out", str(tmp_path / name), *extra], cache))
               for name, extras in variants.items() for extra in extras]
    for name, extra, proc in seconds:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (name, extra, err[-1500:])
        assert f"--out {tmp_path / name} is in use by autoln" in err and "changed nothing" in err, (name, extra, err[-800:])
        assert "Traceback" not in err
    for proc in procs.values():
        os.kill(proc.pid, signal.SIGCONT)
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (name, err[-2000:])
        assert not (tmp_path / name / LOCK_FILE).exists()
    alone = _launch([*firsts["search"], "--out", str(tmp_path / "alone")], cache)
    assert alone.wait(timeout=600) == 0
    assert (tmp_path / "search" / "config.yaml").read_bytes() == (tmp_path / "alone" / "config.yaml").read_bytes()
    mine, ref = (json.loads((tmp_path / d / "genotype.json").read_text()) for d in ("search", "alone"))
    assert mine["placements"] == ref["placements"] and mine["probabilities"] == ref["probabilities"]
    assert json.loads((tmp_path / "retrain" / "metrics.json").read_text())["steps"] == 100
    assert (tmp_path / "compare" / "all-post" / "seed0" / "metrics.json").exists()
    assert (tmp_path / "seeds" / "genotype.json").exists() and (tmp_path / "seeds" / "seed1" / "genotype.json").exists()


def test_two_first_uses_of_a_corpus_build_one_whole_cache(tmp_path):
    """Two processes open one new corpus at once: one builds the cache while the other waits
    for it, and both read the same whole arrays, equal to a single process's."""
    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i} of a corpus opened twice at once\n" for i in range(8000)))
    code = ("import hashlib, sys, numpy as np\nfrom autoln.config import DataConfig\nfrom autoln.data import load_corpus\n"
            "c = load_corpus(DataConfig(corpus=sys.argv[1], cache_dir=sys.argv[2]))\n"
            "print(''.join(hashlib.sha256(np.asarray(c.splits[s]).tobytes()).hexdigest() for s in ('train', 'valid', 'test')))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(text), str(tmp_path / "cache")], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    out = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and out[0] == out[1]
    from autoln.config import DataConfig
    from autoln.data import load_corpus

    single = load_corpus(DataConfig(corpus=str(text), cache_dir=str(tmp_path / "single")))
    assert out[0] == "".join(hashlib.sha256(np.asarray(single.splits[s]).tobytes()).hexdigest() for s in ("train", "valid", "test"))
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1 and sorted(p.name for p in entries[0].iterdir()) == ["meta.json", "test.npy", "train.npy", "valid.npy"]
