"""--workers: several runs at once in spawned processes (autoln.workers), and how their
failures reach the command."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest

from autoln.workers import run_in_processes, threads_per_worker, usable_cores


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
    """Call 0 fails at once: it is raised without running the whole queue (of 12 calls of 1.5 s
    on 2 workers, only those already handed to a process run)."""
    with pytest.raises(ValueError, match="call 0 failed"):
        run_in_processes(_mark_then, [(str(tmp_path), i) for i in range(12)], 2)
    assert len(list(tmp_path.glob("started*"))) < 12


def test_a_stopped_worker_s_interrupt_and_a_dead_worker_reach_the_command_as_one_line(capsys):
    from concurrent.futures.process import BrokenProcessPool

    from autoln.checkpoint import Interrupted
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
