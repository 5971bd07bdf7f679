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
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.distributed as dist

from .errors import ConfigError


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


def is_main() -> bool:
    """True on the process that writes files, logs and prints (rank 0)."""
    return rank() == 0


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
