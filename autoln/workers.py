"""Several runs at once on one machine: ``--workers N`` of ``search.py --seeds``, ``search.py
--tune`` and ``retrain.py --compare``.

Each run goes to its own spawned process (``concurrent.futures.ProcessPoolExecutor``; spawn,
not fork, so no process inherits another's torch threads or open files) with an equal share of
the CPU cores this process may use (:func:`threads_per_worker`). Runs on several machines go
through the engines made for it instead: ``torchrun`` for one model, an RDB storage for a
study.

The thread count changes the order of floating-point sums, so a run with another share of
threads equals the one-at-a-time run up to rounding (bitwise when the shares are equal).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, Callable, Sequence


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which ``taskset`` and container
    limits narrow; ``os.cpu_count()`` where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of ``workers`` processes: an equal share of :func:`usable_cores`,
    at least 1."""
    return max(1, usable_cores() // workers)


def run_in_processes(fn: Callable[..., Any], calls: Sequence[tuple], workers: int,
                     done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``[fn(*args, threads) for args in calls]`` with ``workers`` calls at a time, each in a
    spawned process with ``threads`` = :func:`threads_per_worker` torch threads. ``fn`` must be
    a module-level function and ``args`` picklable. ``done(i, result)`` is called as each call
    ends (in the order they end). Returns the results in the order of ``calls``.

    Raises:
        Whatever a call raises, as soon as it does (or a Ctrl-C): no further call starts (each
        process is handed one call at a time, none is queued ahead), the running ones are waited
        for (each ends at its own pace; a Ctrl-C reaches them too and they stop at their next
        step with a checkpoint), then the exception is raised.
        ``concurrent.futures.process.BrokenProcessPool`` when a worker process died (killed by
        a signal or the out-of-memory killer).
    """
    threads = threads_per_worker(workers)
    results: list[Any] = [None] * len(calls)
    queue = iter(enumerate(calls))
    running: dict = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:

        def start_next() -> None:
            # one call per process at a time, none queued ahead: a stop never finds a call it cannot cancel
            for i, args in queue:
                running[pool.submit(fn, *args, threads)] = i
                return

        for _ in range(workers):
            start_next()
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)  # as Ctrl-C: a line and exit 143, not a silent death
        try:
            while running:
                finished, _ = wait(set(running), return_when=FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    results[i] = future.result()  # raises the call's exception
                    if done is not None:
                        done(i, results[i])
                    start_next()
        except BaseException:
            if running:
                print(f"[workers] stopping: no further call starts; waiting for the {len(running)} running one(s) to end "
                      "(a Ctrl-C reaches them too: they stop at their next step with a checkpoint)", file=sys.stderr, flush=True)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    return results


def _stop_on_sigterm(signum, frame) -> None:
    """SIGTERM in the command that waits on its worker processes (they get it too, when it is
    sent to the process group, and stop at their next step with a checkpoint)."""
    from .checkpoint import Interrupted

    raise Interrupted(signal.SIGTERM, "stopped by SIGTERM: the running runs stop at their next step with a checkpoint; "
                                      "finished runs are kept: run the command again to go on")
