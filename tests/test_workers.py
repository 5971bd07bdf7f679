"""--workers: several runs at once in spawned processes (autoln.engine.workers), and how their
failures reach the command."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest

from autoln.engine.workers import run_in_processes, threads_per_worker, usable_cores


def _mark_then(folder: str, i: int, threads: int) -> int:
    """A call: leaves a mark, fails at once for 0, else sleeps; returns i * 10."""
    Path(folder, f"started{i}").write_text(str(threads))
    if i == 0:
        raise ValueError("call 0 failed")
    time.sleep(1.5)
    return i * 10


def test_results_come_back_in_the_calls_order_each_with_its_share_of_threads(tmp_path):
    calls = [(str(tmp_path), i) for i in (3, 1, 2)]
    ended = []
    assert run_in_processes(_mark_then, calls, 2, done=lambda i, r: ended.append((i, r))) == [30, 10, 20]
    assert sorted(ended) == [(0, 30), (1, 10), (2, 20)]
    assert {Path(tmp_path, f"started{i}").read_text() for i in (1, 2, 3)} == {str(threads_per_worker(2))}
    assert threads_per_worker(2) == max(1, usable_cores() // 2) and threads_per_worker(10 ** 6) == 1
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_the_first_failure_cancels_the_calls_not_started_and_is_raised(tmp_path):
    """Call 0 fails at once: of 12 calls on 2 workers only the two handed out ever start (none
    is queued ahead of a free process), and the failure is raised once call 1 has ended."""
    with pytest.raises(ValueError, match="call 0 failed"):
        run_in_processes(_mark_then, [(str(tmp_path), i) for i in range(12)], 2)
    assert sorted(p.name for p in tmp_path.glob("started*")) == ["started0", "started1"]


def test_a_stopped_worker_s_interrupt_and_a_dead_worker_reach_the_command_as_one_line(capsys):
    from concurrent.futures.process import BrokenProcessPool

    from autoln.engine.checkpoint import Interrupted
    from autoln.cli import EXIT_WORKER_DIED, guarded

    stop = pickle.loads(pickle.dumps(Interrupted(15, "stopped by signal after step 7")))
    assert isinstance(stop, Interrupted) and stop.signum == 15 and str(stop) == "stopped by signal after step 7"

    def stopped():
        raise stop

    assert guarded(stopped) == 143 and "interrupted: stopped by signal after step 7" in capsys.readouterr().err

    def died():
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    assert guarded(died) == EXIT_WORKER_DIED == 5
    err = capsys.readouterr().err
    assert err.startswith("error: a --workers process died") and "Traceback" not in err


def test_sigterm_to_the_command_stops_it_after_the_running_calls_with_one_line(tmp_path):
    """SIGTERM to a command waiting on its workers: no further call starts, the running ones
    end, and the command says so in one line and exits 143 (not a silent death)."""
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = ("import sys; from autoln.cli import guarded; from autoln.engine.workers import run_in_processes; "
              "from tests.test_workers import _mark_then; "
              f"sys.exit(guarded(lambda: run_in_processes(_mark_then, [({str(tmp_path)!r}, i) for i in range(1, 9)], 2)))")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stderr=subprocess.PIPE, text=True)
    while len(list(tmp_path.glob("started*"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143 and "interrupted: stopped by SIGTERM" in err and "Traceback" not in err, err
    assert len(list(tmp_path.glob("started*"))) == 2
