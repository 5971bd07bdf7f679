"""Memory and the machine: a lower-bound estimate checked before a run builds its model, and allocation failures
during a run turned into one line.

The estimate counts what a training step cannot do without, in fp32 (4 bytes):

- the parameters, their gradients and AdamW's two moments: ``16 * P`` bytes, ``P`` from the
  model's dimensions (:func:`parameter_count`);
- the activations kept for the backward pass, per token of the ``B x T`` batch: per branch
  call ``6 d + 2 d_ff`` values (the branch input and its norm, q, k, v, the attention output,
  the FFN's two hidden tensors), plus the ``n_heads * T`` attention probabilities with
  attention dropout (:class:`autoln.models.model.CausalSelfAttention` then computes them explicitly), and
  ``3 V`` for the logits, their softmax and its gradient. The supernet calls each branch
  once per distinct branch input of its candidates (:func:`autoln.space.placements.branch_calls`:
  2 for ``pre, post, deepnorm``, 3 for all seven placements), the derived model once.

The real footprint is larger (allocator slack, temporaries, the evaluation batch), so a run this
check refuses could not have run, and one whose bound exceeds half the free memory gets a
warning (:data:`WARN_FRACTION`); one it admits may still fail, and then
:func:`is_out_of_memory` lets the command line report it as one line (exit status 4) while the
run folder keeps its last checkpoint.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from autoln.core import distributed
from autoln.config import ModelConfig, RetrainConfig, SearchConfig
from autoln.core.errors import ConfigError
from autoln.space.placements import branch_calls

GIB = 2**30
#: :func:`check_fits` warns when a step costs more than this many times the FLOPs of a step of
#: the default config (:func:`step_flops`), whose time is known (:data:`DEFAULT_STEP_SECONDS`).
SLOW_FACTOR = 50
#: Seconds per step of the default config alone on a 2-core laptop-class CPU (README, "How long
#: things take": the default search's 500 steps in about 4 minutes; the derived model's
#: training step 0.11 s in ``benchmarks/bench_step.py``).
DEFAULT_STEP_SECONDS = {True: 0.5, False: 0.11}
#: :func:`check_fits` warns when the lower bound exceeds this fraction of the free memory: the
#: real footprint is larger than the bound (on CPU, about twice it at the default size).
WARN_FRACTION = 0.5


def parameter_count(mc: ModelConfig, vocab_size: int) -> int:
    """Parameters of a model with ``mc``'s dimensions (tied LM head, output bias, the norms'
    gains and biases counted as two per site plus the final norm): an integer, exact up to the
    placements' norm parameters (a few ``d_model`` per block)."""
    d, ff, L = mc.d_model, mc.d_ff, mc.n_layers
    block = 4 * d * d + 2 * d * ff + 2 * 2 * d
    return vocab_size * d + mc.context * d + L * block + 2 * d + vocab_size


@dataclass(frozen=True)
class Estimate:
    """A training step's memory lower bound, in bytes: ``state`` (weights, gradients, AdamW
    moments) and ``activations`` (kept for backward); ``total`` their sum."""

    parameters: int
    state: int
    activations: int

    @property
    def total(self) -> int:
        return self.state + self.activations


def estimate(mc: ModelConfig, vocab_size: int, batch_rows: int, supernet: bool) -> Estimate:
    """The lower bound of the module docstring for a step on ``batch_rows`` windows of
    ``mc.context`` tokens (this process' rows under ``torchrun``)."""
    p = parameter_count(mc, vocab_size)
    calls = branch_calls(mc.searched_candidates()) if supernet else 1
    attention = mc.n_heads * mc.context if mc.dropout > 0 else 0  # SDPA's fused kernels keep no T x T matrix
    per_token = mc.n_layers * calls * (6 * mc.d_model + 2 * mc.d_ff + attention) + 3 * vocab_size
    return Estimate(parameters=p, state=16 * p, activations=4 * batch_rows * mc.context * per_token)


def step_flops(mc: ModelConfig, vocab_size: int, batch_rows: int, supernet: bool) -> float:
    """FLOPs of one training step on ``batch_rows`` windows of ``mc.context`` tokens, by the
    count of Kaplan et al. 2020 (§2.1, Table 1): per token, a forward pass costs ``2 N`` for the
    ``N`` weights of the matmuls plus ``2 L T d`` for attention's scores and weighted sum, and a
    training step three times a forward pass. The supernet runs each branch
    :func:`autoln.space.placements.branch_calls` times and takes an alpha step and a weight step (two
    passes). A float: the attention term grows with ``T``, so a step grows with ``T^2``."""
    calls = branch_calls(mc.searched_candidates()) if supernet else 1
    d, L, T = mc.d_model, mc.n_layers, mc.context
    per_token = 2 * L * calls * (4 * d * d + 2 * d * mc.d_ff + T * d) + 2 * vocab_size * d
    return 3 * per_token * batch_rows * T * (2 if supernet else 1)


#: Seconds each run spends outside its steps on the default machine (building the model, opening
#: the cached corpus, checkpoints, the event file): what dominates a tiny run.
RUN_OVERHEAD_SECONDS = 1.5


def retrain_seconds(mc: ModelConfig, vocab_size: int, rc) -> float:
    """Estimated wall seconds of one retrain of ``mc``'s size with the settings ``rc``
    (:class:`autoln.config.RetrainConfig`) on 2 idle CPU cores: ``rc.steps`` training steps at
    :data:`DEFAULT_STEP_SECONDS` scaled by :func:`step_flops` against the default config's,
    the evaluations (every ``eval_every`` steps on ``eval_windows`` windows, then the final one
    on ``final_eval_windows`` of valid and of test; a forward pass is a third of a step) and
    :data:`RUN_OVERHEAD_SECONDS`. The default retrain gives about 115 s (measured: 114 s)."""
    from autoln.config import ModelConfig as Default

    default = Default()
    per_row = DEFAULT_STEP_SECONDS[False] / step_flops(default, vocab_size, 16, False) * step_flops(mc, vocab_size, 1, False)
    evals = (rc.steps // rc.eval_every) * rc.eval_windows + 2 * (rc.final_eval_windows or 2048)
    return rc.steps * rc.batch_size * per_row + evals * per_row / 3 + RUN_OVERHEAD_SECONDS


def free_memory(device: torch.device) -> Optional[int]:
    """Bytes free for this process on ``device``: CUDA's ``mem_get_info``; on CPU the kernel's
    ``MemAvailable`` (Linux ``/proc/meminfo``), else physical pages available (``sysconf``);
    None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(mc: ModelConfig, vocab_size: int, batch_rows: int, device: torch.device, supernet: bool,
               section: str, free: Optional[int] = None) -> Estimate:
    """Refuse a run whose lower-bound estimate exceeds the memory free on ``device``
    (``free`` bytes if given, else :func:`free_memory`), and print a one-line warning to stderr
    (main process) when it exceeds :data:`WARN_FRACTION` of it.
    Returns the estimate.

    Raises:
        ConfigError: naming the model keys, ``<section>.batch_size`` and both figures in GiB.
    """
    est = estimate(mc, vocab_size, batch_rows, supernet)
    free = free_memory(device) if free is None else free
    if free is not None and est.total > free:
        what = "supernet" if supernet else "model"
        raise ConfigError(
            f"the {what} needs at least {est.total / GIB:,.1f} GiB on {device.type} ({est.parameters:,} parameters with their "
            f"gradients and AdamW moments: {est.state / GIB:,.1f} GiB; activations of {batch_rows} x {mc.context} tokens: "
            f"{est.activations / GIB:,.1f} GiB) but {free / GIB:,.1f} GiB are free; lower model.d_model ({mc.d_model}), "
            f"model.n_layers ({mc.n_layers}), model.d_ff ({mc.d_ff}), model.context ({mc.context}) or {section}.batch_size")
    if free is not None and est.total > WARN_FRACTION * free:
        distributed.print_main(
            f"warning: the {'supernet' if supernet else 'model'} needs at least {est.total / GIB:,.1f} GiB per step on {device.type} "
            f"(a lower bound; the real need is larger) and {free / GIB:,.1f} GiB are free: the run may run out of memory or "
            f"swap; lower model.context ({mc.context}) or {section}.batch_size if it stalls", file=sys.stderr)
    if device.type == "cpu":
        check_time(mc, vocab_size, batch_rows, supernet, section)
    return est


def check_time(mc: ModelConfig, vocab_size: int, batch_rows: int, supernet: bool, section: str) -> float:
    """Print a one-line warning to stderr (main process) when a CPU step costs more than
    :data:`SLOW_FACTOR` times a step of the default model and batch (:func:`step_flops`, same
    vocabulary and candidates), with the time that implies at :data:`DEFAULT_STEP_SECONDS`.
    Returns that ratio (a float; 1.0 for the default config)."""
    default_rows = (SearchConfig() if supernet else RetrainConfig()).batch_size
    default = ModelConfig(candidates=mc.candidates)
    ratio = step_flops(mc, vocab_size, batch_rows, supernet) / step_flops(default, vocab_size, default_rows, supernet)
    if ratio > SLOW_FACTOR:
        seconds = ratio * DEFAULT_STEP_SECONDS[supernet]
        distributed.print_main(
            f"warning: one step costs about {ratio:,.0f}x a step of the default size (~{_duration(seconds)} per step on a 2-core "
            f"CPU, where the default takes {DEFAULT_STEP_SECONDS[supernet]} s); attention's cost grows with model.context squared "
            f"({mc.context}): lower model.context, model.n_layers ({mc.n_layers}), model.d_model ({mc.d_model}) or "
            f"{section}.batch_size ({batch_rows}) or run it on a GPU (search.device / retrain.device)", file=sys.stderr)
    return ratio


def _duration(seconds: float) -> str:
    """``seconds`` as a short duration: 40 s, 12 min, 3.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def busy_line(threads: Optional[int] = None, load: Optional[float] = None, cores: Optional[int] = None) -> Optional[str]:
    """One line when the machine is busier than its cores and this run has several PyTorch
    threads, else None: the 1-minute load average (``os.getloadavg``; runnable processes,
    averaged) above the cores this process may run on (``os.sched_getaffinity``, else
    ``os.cpu_count``), and ``threads`` (default ``torch.get_num_threads()``) above 1. Then the
    threads wait on each other for the cores others hold, and a run can take several times the
    README's times for idle cores (the default search: 51 minutes with two threads among three
    other jobs, 13-21 with one): the line says to give each run one thread. With one thread
    there is nothing to advise and nothing is said. ``load`` and ``cores`` are measured when
    None (tests pass their own); a platform without a load average gives None. An
    ``OMP_NUM_THREADS`` that is set but invalid (:func:`valid_thread_count`) is named in the
    line: the runtime ignored it."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads <= 1:
        return None
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average on this platform
            return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load <= cores:
        return None
    set_to = os.environ.get("OMP_NUM_THREADS")
    ignored = "" if set_to is None or valid_thread_count(set_to) else (
        f"; OMP_NUM_THREADS={set_to!r} now is not a positive integer, so it was ignored and the run took {threads} threads")
    return (f"note: the machine is busy (load {load:.1f} on {cores} cores): with {threads} threads this run's threads wait on "
            f"each other and it may take several times as long; give each run one thread (OMP_NUM_THREADS=1 before the "
            f"command){ignored}")


def valid_thread_count(value: str) -> bool:
    """Whether ``value`` is an ``OMP_NUM_THREADS`` the OpenMP runtime takes: a positive integer,
    or a comma-separated list of them (one per nesting level). Another value (``0``, ``abc``,
    empty) is ignored by it, with a ``libgomp: Invalid value`` line, and torch takes its default."""
    return bool(re.fullmatch(r"\s*[1-9][0-9]*\s*(,\s*[1-9][0-9]*\s*)*", value))


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an allocation failure: Python's ``MemoryError``, ``torch.OutOfMemoryError``
    (CUDA), or the ``RuntimeError`` of torch's CPU allocator (``DefaultCPUAllocator: can't
    allocate memory``)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "DefaultCPUAllocator" in text
                                              or "out of memory" in text.lower())
