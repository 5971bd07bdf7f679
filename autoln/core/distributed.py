"""Data-parallel training across processes with ``torch.distributed`` (launched by ``torchrun``).

Every process holds the whole model (supernet or derived), draws the same global batch from
identically seeded samplers and takes its own ``batch_size / N`` rows (:func:`shard`). After
each gradient computation the gradients are averaged with one ``all_reduce`` (:func:`average_`),
so every process applies the same update and holds the same weights and alphas bitwise; the
loss rides along in the same reduction, so every process sees the same loss and takes the
same decisions (divergence, early stop). Evaluation splits the windows across processes and
sums the results (:func:`all_sum`). Only rank 0 writes files, logs and prints
(:func:`is_main`).

Why ``all_reduce`` and not the :class:`~torch.nn.parallel.DistributedDataParallel` wrapper:
DDP reduces gradients in hooks fired by ``.backward()`` on the output of a wrapped forward,
once per forward. The bilevel step (DARTS, Liu et al. 2019) takes the alpha gradient with
``torch.autograd.grad`` and, at second order, runs several forward/backward passes on
perturbed weights; reducing each gradient explicitly keeps one rule for every step and makes
an N-process run equal to a one-process run up to the order of floating-point sums.

Backends: ``gloo`` on CPU, ``nccl`` on CUDA (``cuda:LOCAL_RANK``). Without ``torchrun``
(``WORLD_SIZE`` unset or 1) every function here is a cheap no-op.

How a process of a ``torchrun`` job ends (:func:`finish`, called by :func:`autoln.cli.guarded`):
each exits with autoln's own status (2, 3, 4, 5, 130, 143); rank 0 prints the one ``error:``
line (a bad input fails the same way on every rank, before or after the process group exists);
the line also goes to torchrun's error file (``TORCHELASTIC_ERROR_FILE``), so that torchrun's
summary of failures shows it instead of ``<N/A>``. torchrun stops the other processes with
SIGTERM as soon as one ends with a failure, so a rank other than 0 waits (:data:`LINGER_S`)
for rank 0 to print and end first; one still running after that failed alone and prints its
own line. torchrun itself always exits 1 when a process failed (it raises ``ChildFailedError``,
or ``SignalException`` for a signal; no option of it passes a child's status on): docs/scale.md.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from autoln.core.errors import ConfigError
from autoln.core.signals import STOP_SIGNALS


def launched() -> bool:
    """True when started by ``torchrun`` with more than one process (``WORLD_SIZE > 1``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def active() -> bool:
    """True when a process group of more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process' rank (0 without a process group)."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """Number of processes (1 without a process group)."""
    return dist.get_world_size() if active() else 1


def launch_rank() -> int:
    """This process's rank as ``torchrun`` set it (``RANK``), also before the process group is
    joined and after it is left; 0 when not launched with more than one process."""
    return int(os.environ.get("RANK", "0")) if launched() else 0


def is_main() -> bool:
    """True on the process that writes files, logs and prints (rank 0); under ``torchrun`` also
    before :func:`init` and after :func:`shutdown` (from ``RANK``), so that an error raised
    outside the process group is printed once too."""
    return (rank() if active() else launch_rank()) == 0


def local_device(device: torch.device) -> torch.device:
    """The device this process trains on: ``cuda:LOCAL_RANK`` for CUDA under ``torchrun``,
    else ``device`` unchanged."""
    if device.type == "cuda" and launched():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def init(device: torch.device) -> None:
    """Join the ``torchrun`` process group (``env://``), once: ``nccl`` for CUDA (after
    ``torch.cuda.set_device``), ``gloo`` otherwise. No-op when not launched or already joined."""
    if not launched() or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(local_device(device))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def shutdown() -> None:
    """Leave the process group (no-op without one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def check_batch(batch_size: int, key: str) -> int:
    """This process' rows of a global batch of ``batch_size``.

    Raises:
        ConfigError: ``batch_size`` is not divisible by the number of processes (names ``key``).
    """
    n = world_size()
    if batch_size % n:
        raise ConfigError(f"{key}={batch_size} must be divisible by the number of processes ({n})")
    return batch_size // n


def shard(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """This process' contiguous block of rows of each ``(B, ...)`` tensor (``B / N`` rows;
    :func:`check_batch` has checked that N divides B)."""
    n, r = world_size(), rank()
    if n == 1:
        return tensors
    return tuple(t[r * (t.shape[0] // n):(r + 1) * (t.shape[0] // n)] for t in tensors)


def average_(tensors: Sequence[torch.Tensor]) -> None:
    """Replace each tensor, in place, by its mean over the processes: one ``all_reduce`` (sum)
    of their concatenation, divided by N. Tensors must have one dtype and device. No-op for one
    process."""
    if not active() or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def all_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum each float over the processes (float64 on ``device``); the values unchanged for one."""
    if not active():
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    """Wait for every process (no-op for one)."""
    if active():
        dist.barrier()


def print_main(*args, **kwargs) -> None:
    """``print`` on rank 0 only (one copy of each message under ``torchrun``)."""
    if is_main():
        print(*args, **kwargs)


def from_main(obj):
    """Rank 0's value of ``obj`` on every process (``broadcast_object_list``), e.g. a default
    run folder named by the time; ``obj`` itself for one process."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_true(flag: bool, device: torch.device) -> bool:
    """True on every process when ``flag`` is true on any (e.g. one process got SIGTERM), so
    that all stop at the same step; ``flag`` itself for one process."""
    if not active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


#: Seconds a process other than rank 0 waits, after failing, for rank 0 (which fails the same
#: way on the same input and prints the line) to end; torchrun then stops it (:func:`finish`).
LINGER_S = 10.0

#: Phrases of a collective that failed because another process of the job is gone (gloo's TCP
#: transport; :class:`torch.distributed.DistNetworkError` is recognised by its type).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_lost_cause(exc: BaseException) -> str:
    """The cause in a collective's report of a lost process, without gloo's source location and
    advice: ``Connection closed by peer [127.0.0.1]:5538``."""
    import re

    text = re.sub(r"^\[[^\]]*\]\s*", "", (str(exc).splitlines() or [type(exc).__name__])[0])
    return text.split(". ")[0][:300]


def peer_lost(exc: BaseException) -> bool:
    """True when ``exc`` is a collective's (or the store's) report, under ``torchrun``, that
    another process of the job ended or cannot be reached, not an error of this process."""
    if not launched():
        return False
    network = getattr(dist, "DistNetworkError", ())
    return (bool(network) and isinstance(exc, network)) or any(p in str(exc) for p in PEER_LOST)


def record_error(lines: Sequence[str], callstack: Optional[str] = None) -> None:
    """Write this process's failure to torchrun's error file (``TORCHELASTIC_ERROR_FILE``,
    one per process; no-op without it), in the format that
    :func:`torch.distributed.elastic.multiprocessing.errors.record` writes: torchrun's summary
    (``ChildFailedError``) then shows ``callstack`` (default: ``lines``, autoln's line) as the
    process's ``traceback`` instead of a link, and picks the earliest one as the root cause.
    A file that cannot be written is skipped (the line was printed already)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not (lines or callstack):
        return
    text = "\n".join(lines) or callstack.strip().splitlines()[-1]
    data = {"message": {"message": text, "extraInfo": {"py_callstack": callstack or text, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fp:
            json.dump(data, fp, allow_nan=False)
    except OSError:
        pass


def finish(code: int, lines: Sequence[str], exc: Optional[BaseException] = None) -> int:
    """End this process's part of a command with exit status ``code``; returns ``code``.

    ``lines`` are the messages the command gave (printed already on rank 0, held back on the
    others). Under ``torchrun``, for a failure (``code`` not 0, 130 or 143, or ``exc``, an
    exception about to propagate), the lines (or ``exc``'s traceback) go to torchrun's error
    file (:func:`record_error`). A rank other than 0 then waits up to :data:`LINGER_S` seconds,
    still in the process group, for rank 0 to end: torchrun answers a failed process by sending
    SIGTERM to every other one, so rank 0 must not be the last to fail or its line would be cut
    off; the SIGTERM torchrun sends this process once rank 0 has ended makes it exit at once,
    quietly, with ``code``. A rank still running after the wait failed on its own (rank 0
    waits for it in a collective, say) and prints its lines, marked ``(rank R)``, leaves the
    process group and from then on ignores SIGTERM and SIGINT (Python's own shutdown resets the
    handlers it installed, and torchrun's SIGTERM, sent when rank 0 ends, would then make the
    status -15 instead of ``code``). A signal (130, 143) ends every rank at the same step, so none
    waits. Then the process group is left.
    """
    lingered = False
    try:
        if launched() and (exc is not None or code not in (0, *(128 + s for s in STOP_SIGNALS))):
            record_error(lines, "".join(traceback.format_exception(exc)) if exc is not None else None)
            if exc is None and launch_rank() != 0 and lines:
                _wait_for_main(code)
                lingered = True
                mark = f"(rank {launch_rank()}) "
                for line in lines:
                    print(f"error: {mark}{line[7:]}" if line.startswith("error: ") else mark + line, file=sys.stderr, flush=True)
    finally:
        shutdown()
    if lingered:  # Python's shutdown resets the handlers it installed (not an ignored signal): torchrun's SIGTERM, sent
        for sig in (signal.SIGTERM, signal.SIGINT):  # when rank 0 ends once this one left the group, would make it -15
            signal.signal(sig, signal.SIG_IGN)
    return code


def _wait_for_main(code: int) -> None:
    """Sleep :data:`LINGER_S` seconds; from now on SIGTERM or SIGINT (torchrun's, once another
    process ended) end the process at once with ``code``, also while it leaves the process
    group and Python shuts down after the wait."""
    import threading

    def leave(signum, frame):
        os._exit(code)

    if threading.current_thread() is not threading.main_thread():  # no signal handlers there: do not wait
        return
    sys.stdout.flush(), sys.stderr.flush()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, leave)
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
