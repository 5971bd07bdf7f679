"""Several runs at once on one machine: ``--workers N`` of ``search.py --seeds``, ``search.py
--tune`` and ``retrain.py --compare``.

Each run goes to its own spawned process (``concurrent.futures.ProcessPoolExecutor``; spawn,
not fork, so no process inherits another's torch threads or open files) with an equal share of
the CPU cores this process may use (:func:`threads_per_worker`). The workers sit in process
groups of their own and the command sends SIGINT and SIGTERM on to them, so Ctrl-C, ``kill``
of the command or of its process group all stop every run at its next step with a checkpoint,
and the command says how to go on. (A command killed with SIGKILL cannot: its workers finish
the run they hold.) Runs on several machines go
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
from pathlib import Path
from typing import Any, Callable, Sequence

from autoln.core.signals import STOP_SIGNALS


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


def oversubscribed_line(workers: int, cores: int | None = None) -> str | None:
    """One ``note:`` line when ``workers`` processes outnumber the ``cores`` this process may use
    (default :func:`usable_cores`), else None: each then runs one thread and they take turns on
    the cores, so the runs end no sooner than with one worker per core (measured: 5 workers on 2
    cores took 57 s where 1 took 26 s; the answer is the same)."""
    cores = usable_cores() if cores is None else cores
    if workers <= cores:
        return None
    return (f"note: --workers {workers} on {cores} core{'s' if cores != 1 else ''}: the {workers} processes share the "
            f"cores (one thread each) and take turns on them, which is no faster than --workers {cores} and often "
            f"slower; the results are the same")


def run_in_processes(fn: Callable[..., Any], calls: Sequence[tuple], workers: int,
                     done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``[fn(*args, threads) for args in calls]`` with ``workers`` calls at a time, each in a
    spawned process with ``threads`` = :func:`threads_per_worker` torch threads. ``fn`` must be
    a module-level function and ``args`` picklable. ``done(i, result)`` is called as each call
    ends (in the order they end). Returns the results in the order of ``calls``.

    Raises:
        Whatever a call raises, as soon as it does: no further call starts (each process is
        handed one call at a time, none is queued ahead), the running ones are waited for (each
        ends at its own pace), then the exception is raised.
        :class:`autoln.engine.checkpoint.Interrupted` on SIGINT or SIGTERM, after sending it on to the
        running calls (they stop at their next step with a checkpoint) and waiting for them.
        ``concurrent.futures.process.BrokenProcessPool`` when a worker process died (killed by
        a signal or the out-of-memory killer).

    More processes than cores print :func:`oversubscribed_line` on stderr first.
    """
    threads = threads_per_worker(workers)
    line = oversubscribed_line(min(workers, len(calls)))
    if line:
        print(line, file=sys.stderr, flush=True)
    results: list[Any] = [None] * len(calls)
    _stopping.clear()
    queue = iter(enumerate(calls))
    running: dict = {}
    # before the first worker exists: from here on a signal reaches the workers only through _forward
    forwarding = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _forward) for sig in STOP_SIGNALS} if forwarding else {}
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_worker_start) as pool:

            def start_next() -> None:
                # one call per process at a time, none queued ahead: a stop never finds a call it cannot cancel
                for i, args in queue:
                    running[pool.submit(fn, *args, threads)] = i
                    return

            try:
                for _ in range(workers):
                    start_next()
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
                    print(f"[workers] stopping: no further call starts; waiting for the {len(running)} running one(s) to end",
                          file=sys.stderr, flush=True)
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return results


_stopping: list[int] = []


def _forward(signum, frame) -> None:
    """SIGINT or SIGTERM in the command that waits on its workers (which sit in process groups of
    their own, so a terminal's Ctrl-C or a scheduler's ``kill`` reaches them only this way): sent
    on to every worker, which stops at its next step with a checkpoint (a second one: at once);
    the first one also stops the command with a line saying how to go on."""
    import multiprocessing

    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass
    if _stopping:
        return
    _stopping.append(signum)
    from autoln.engine.checkpoint import Interrupted
    from autoln.core.commands import resume_command

    name = signal.Signals(signum).name
    raise Interrupted(signum, f"stopped by {name}: it was sent on to the running runs, which stop at their next step with "
                              f"a checkpoint; finished runs are kept. Continue with: {resume_command(Path.cwd())}")


def _worker_start() -> None:
    """Initializer of a worker process: a process group of its own (signals come from the command,
    :func:`_forward`), and until a run installs its own handlers (:class:`autoln.engine.checkpoint.StopSignals`)
    a signal ends it quietly, without a traceback from the middle of an import."""
    os.setpgrp()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
