"""Pieces shared by the search and the retrain: device, seeding, AdamW with warm-up + cosine
schedule, evaluation, run folders and provenance."""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as _dt
import functools
import math
import os
import platform
import shutil
import random
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from autoln.core import distributed
from autoln.config import TrainConfig
from autoln.data import eval_batches
from autoln.core.errors import ConfigError, OutputError
from autoln.core.io import missing_link
from autoln.core.modes import eval_mode
from autoln.models.model import TransformerLM, weight_param_groups


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cpu``; ``cuda``. Under ``torchrun`` CUDA
    means ``cuda:LOCAL_RANK`` (:func:`autoln.core.distributed.local_device`).

    Raises:
        ConfigError: ``cuda`` requested but not available (names the key as ``*.device``).
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested (search.device / retrain.device) but CUDA is not available")
    return distributed.local_device(torch.device(name))


def autocast_dtype(precision: str, device: torch.device) -> Optional[torch.dtype]:
    """The forward passes' autocast dtype for ``train.precision``: ``auto`` -> bf16 on CUDA,
    none (fp32) elsewhere; ``bf16`` -> bf16; ``fp32`` -> none."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


@functools.lru_cache(maxsize=None)
def keep_cpu_memory() -> bool:
    """On Linux with glibc, let ``malloc`` keep freed memory for reuse instead of handing large
    blocks back to the kernel (``mallopt``: mmap threshold 1 GiB, trim threshold 16 GiB).

    Why: torch on CPU allocates each step's activations with the system ``malloc``; glibc
    serves blocks above its mmap threshold with fresh ``mmap`` calls and unmaps them on free,
    so every step page-faults its activation memory back in (the kernel zeroes each page). That
    cost grows with the activation memory (the supernet's is about 2x the derived model's). It
    is the CPU counterpart of CUDA's caching allocator; PyTorch's CPU performance guide
    recommends jemalloc or tcmalloc for the same reason. The process then keeps its peak heap
    until it exits. Returns True when applied (once per process); False elsewhere."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 1 << 34))
    except (OSError, AttributeError):
        return False


def prepare_model(model: TransformerLM, device: torch.device, cfg: TrainConfig) -> TransformerLM:
    """Move ``model`` to ``device`` and set up how it runs there (the GPU path):

    - autocast of the forward passes per ``cfg.precision`` (:func:`autocast_dtype`);
    - on CUDA, TF32 matmuls for what stays fp32 (``torch.set_float32_matmul_precision("high")``);
    - with ``cfg.compile``, ``torch.compile`` of each block in place (``Block.compile()``,
      "regional compilation": blocks with the same placements share one compiled graph, and
      the mixing weights enter as tensors, so annealing the temperature does not recompile).
      Code that needs double backward (the alpha Hessian) runs the blocks eagerly with
      ``torch.compiler.set_stance("force_eager")``.

    On CPU, freed activation memory is kept for reuse (:func:`keep_cpu_memory`).

    Returns the same module."""
    if device.type == "cpu":
        keep_cpu_memory()
    model.to(device)
    model.autocast_dtype = autocast_dtype(cfg.precision, device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    if cfg.compile:
        for block in model.blocks:
            block.compile()
    return model


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _cosine(step: int, cfg: TrainConfig) -> float:
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _inverse_sqrt(step: int, cfg: TrainConfig) -> float:
    return math.sqrt(max(1, cfg.warmup_steps) / (step + 1))


def _constant(step: int, cfg: TrainConfig) -> float:
    return 1.0


#: Decay after warm-up, by ``train.schedule`` name: factor of the peak learning rate at 0-based
#: optimizer step ``step >= warmup_steps``.
SCHEDULES = {"cosine": _cosine, "inverse_sqrt": _inverse_sqrt, "constant": _constant}


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Learning-rate multiplier at optimizer step ``step`` (0-based): linear warm-up from
    ``1/warmup_steps`` to 1 over ``warmup_steps`` (none when 0), then ``cfg.schedule``:

    - ``cosine``: decay to ``min_lr_ratio`` at ``steps`` (Loshchilov & Hutter 2017, SGDR
      without restarts);
    - ``inverse_sqrt``: ``sqrt(max(1, warmup_steps) / (step + 1))``, Vaswani et al. 2017 §5.3
      (1 at the end of warm-up, ``1/sqrt(step + 1)`` without it);
    - ``constant``: 1.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    return SCHEDULES[cfg.schedule](step, cfg)


def weight_optimizer(named_params: Sequence[tuple[str, nn.Parameter]], cfg: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (decoupled weight decay on matrices only; the fused kernel when the parameters are
    on CUDA) and its :func:`lr_factor` scheduler."""
    params = weight_param_groups(named_params, cfg.weight_decay)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, fused=on_cuda(named_params[0][1]) or None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    return opt, sched


def on_cuda(param: torch.Tensor) -> bool:
    """True when ``param`` lives on a CUDA device (where fused Adam/AdamW kernels exist)."""
    return param.device.type == "cuda"


def on_terminal() -> bool:
    """True when stderr is a terminal: a progress bar redraws in place there, while in a
    redirected log every redraw would be another line (tqdm#750)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class TimeLeft:
    """The estimated time left of a run, at the rate measured since this was made: the ETA a
    tqdm bar shows on a terminal, for the one line per evaluation of a redirected log.

    Args:
        done: units of work already done when the run (re)starts (steps, runs, retrain steps).
        total: the units of the whole run (``None``: given per call).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, done: float = 0, total: Optional[float] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.start, self.total, self.clock = done, total, clock
        self.t0 = clock()

    def seconds(self, done: float, total: Optional[float] = None) -> Optional[float]:
        """Seconds left when ``done`` of ``total`` (default the run's) units are done: the units
        still to do at the rate so far; ``None`` before the first unit or without a total."""
        total = self.total if total is None else total
        spent, n = self.clock() - self.t0, done - self.start
        if total is None or n <= 0 or spent <= 0:
            return None
        return max(0.0, (total - done) * spent / n)

    def text(self, done: float, total: Optional[float] = None, bound: bool = False) -> str:
        """E.g. ``about 3:12 left`` (tqdm's ``[H:]MM:SS``); ``at most about ...`` when ``total``
        is a bound (a race's most steps); ``time left: after the first`` before any unit."""
        left = self.seconds(done, total)
        if left is None:
            return "time left: after the first"
        return f"{'at most ' if bound else ''}about {tqdm.format_interval(left)} left"


def progress_bar(iterable=None, *, show: bool, **kwargs) -> tqdm:
    """A tqdm bar (``kwargs`` as tqdm's) drawn when ``show`` (``logging.progress`` on the main
    process) and stderr is a terminal; off a terminal it is disabled, and :func:`progress_line`
    writes one line per evaluation instead, with the bar's ``time_left`` (a :class:`TimeLeft`
    from its ``initial`` and ``total``)."""
    bar = tqdm(iterable, disable=not (show and on_terminal()), dynamic_ncols=True, **kwargs)
    bar.time_left = TimeLeft(kwargs.get("initial") or 0, kwargs.get("total"))
    return bar


def progress_line(show: bool, text: str, bar: Optional[tqdm] = None, done: Optional[float] = None) -> None:
    """With ``show`` and stderr not a terminal (a redirected log), write ``text`` as one line to
    stderr: the progress a bar would have shown, once per evaluation; with ``bar`` (from
    :func:`progress_bar`) and ``done`` (its units done), followed by the estimated time left."""
    if show and not on_terminal():
        if bar is not None and done is not None:
            text += f" ({bar.time_left.text(done)})"
        print(text, file=sys.stderr, flush=True)


def evaluate(model: nn.Module, tokens: np.ndarray, starts: np.ndarray, context: int, batch_size: int, device: torch.device,
             mix: Optional[torch.Tensor] = None, progress: Optional[str] = None, stderr: bool = False):
    """Mean cross-entropy (nats per token) of ``model`` over the windows of ``tokens`` at
    ``starts`` (:func:`evaluate_batches` over :func:`autoln.data.eval_batches` of ``batch_size``
    windows of ``context`` tokens). Under ``torchrun`` each process evaluates every N-th window
    and the sums are added up, so every process returns the same mean. ``progress``: a tqdm bar
    with that description (batches, rate and time left), on the main process. ``mix`` and
    ``stderr`` as :func:`evaluate_batches`.
    """
    mine = starts[distributed.rank()::distributed.world_size()]
    batches = eval_batches(tokens, mine, context, batch_size)
    if progress is not None and distributed.is_main():
        batches = progress_bar(batches, show=True, desc=progress, total=math.ceil(len(mine) / batch_size), unit="batch", leave=False)
    return evaluate_batches(model, batches, device, mix, stderr)


@torch.no_grad()
def evaluate_batches(model: nn.Module, batches: Iterable, device: torch.device, mix: Optional[torch.Tensor] = None,
                     stderr: bool = False):
    """Mean cross-entropy (nats per token) of ``model`` over ``batches`` of ``(x, y)`` pairs
    (token ids and next-token targets, ``(B, T)`` each), weighted by the targets scored: a
    negative target (nanoGPT's ``-1`` padding, PyTorch's ``ignore_index``) is ignored by the
    loss and not counted, and a batch without a scored target is skipped (its mean is 0/0).

    ``model(x, y)`` (``model(x, y, mix=mix)`` when ``mix``, a supernet's mixing weights in the
    layout of its ``mixing_weights``, is given) must return ``(logits, loss)``. The model is
    put in eval mode and each of its modules back in its own mode (:func:`autoln.core.modes.eval_mode`:
    a module frozen in eval mode stays so). Under ``torchrun`` the sums of every process's batches are added
    up, so every process returns the same mean.

    With ``stderr`` it returns ``(mean, standard error)``: the standard error of the mean over
    windows (rows), ``std(window means) / sqrt(n_windows)`` (windows of equal length; 0 for one
    window), from the logits' per-token cross-entropy.

    Raises:
        ZeroDivisionError: no batch at all (on every process).
    """
    total, count, w_sum, w_sq, n_win = 0.0, 0, 0.0, 0.0, 0
    with eval_mode(model):
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            scored = int((y >= 0).sum())  # negative targets are ignored by the loss (nanoGPT's -1 padding)
            if not scored:
                continue  # nothing to score: its mean loss would be 0/0 = NaN
            logits, loss = model(x, y) if mix is None else model(x, y, mix=mix)
            total += loss.item() * scored
            count += scored
            if stderr:
                per_window = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                               reduction="none").view(y.shape).mean(1).double()
                w_sum, w_sq, n_win = w_sum + float(per_window.sum()), w_sq + float((per_window ** 2).sum()), n_win + len(per_window)
    total, count, w_sum, w_sq, n_win = distributed.all_sum([total, count, w_sum, w_sq, n_win], device)
    if not stderr:
        return total / count
    var = max(0.0, (w_sq - w_sum ** 2 / n_win) / (n_win - 1)) if n_win > 1 else 0.0
    return total / count, math.sqrt(var / n_win)


def with_stderr(metrics: dict, se_nats: float, loss_nats: float, windows: int) -> dict:
    """``metrics`` (of :func:`autoln.data.metrics_from_loss`) with ``windows`` and the standard
    error over windows of the loss (``loss_stderr``, nats per token) and of each metric that is
    a fixed multiple of it (``<bits metric>_stderr``; perplexity is not, and has none)."""
    out = {**metrics, "windows": int(windows), "loss_stderr": se_nats}
    for key in ("bits_per_byte", "bits_per_char"):
        if key in metrics and loss_nats:
            out[f"{key}_stderr"] = se_nats * metrics[key] / loss_nats
    return out


def measure(model: nn.Module, tokens: np.ndarray, starts: np.ndarray, context: int, batch_size: int, device: torch.device,
            tokenizer: str, bytes_per_token: Optional[float], stderr: bool = False, progress: Optional[str] = None) -> dict:
    """The metrics of ``model`` on the windows of ``tokens`` at ``starts`` (:func:`evaluate`):
    loss in nats per token and the units of :func:`autoln.data.metrics_from_loss` (bits per
    byte of a byte corpus or a BPE one with ``bytes_per_token``, perplexity). With ``stderr``
    also ``windows`` and each metric's standard error over windows (:func:`with_stderr`): the
    retrain's protocol. The search's supernet valid and the retrain's evaluations both go
    through here."""
    from autoln.data import metrics_from_loss

    if not stderr:
        return metrics_from_loss(evaluate(model, tokens, starts, context, batch_size, device, progress=progress),
                                 tokenizer, bytes_per_token)
    loss, se = evaluate(model, tokens, starts, context, batch_size, device, progress=progress, stderr=True)
    return with_stderr(metrics_from_loss(loss, tokenizer, bytes_per_token), se, loss, len(starts))


FINISHED_MARKERS = ("genotype.json", "metrics.json", "diagnostics.json")
CHECKPOINT_FILE = "checkpoint.pt"
#: Files a run writes in its folder (besides TensorBoard event files).
RUN_FILES = (*FINISHED_MARKERS, CHECKPOINT_FILE, "config.yaml", "alphas.png", "alphas_heatmap.png", "supernet_genotype.json")
#: Folders of a run's own making, removed with it (a search's race: :mod:`autoln.race.run_race`).
RUN_FOLDERS = ("race",)


#: Files that mark a folder as a tuning study's (``search.py --tune``).
STUDY_MARKERS = ("study.journal", "tune.lock", "trials.csv")


def check_out_dir(out: str | Path, overwrite: bool, study_ok: bool = False) -> Path:
    """Check, without touching anything, that ``out`` can hold a new run: it is a folder or can
    be created, and it holds no finished search (``genotype.json``), retrain
    (``metrics.json``) or diagnosis (``diagnostics.json``) unless ``overwrite`` (one folder
    holds one run).

    ``study_ok``: the caller is ``search.py --tune`` (a folder holding a study is its own);
    every other command refuses such a folder, even with ``overwrite``.

    Raises:
        OutputError: ``out`` or an ancestor is a file or a symbolic link to nothing
            (:func:`autoln.core.io.missing_link`), the nearest existing ancestor is not
            writable, ``out`` holds a tuning study (unless ``study_ok``), or ``out`` holds a
            finished run or an interrupted one (a checkpoint: ``--resume`` continues it) and
            ``overwrite`` is False.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} exists and is not a folder")
    link = missing_link(out)
    if link is not None:
        raise OutputError(f"--out {out}: {link}; create that folder, or choose another --out")
    study = [m for m in STUDY_MARKERS if (out / m).exists()]
    if study and not study_ok:
        raise OutputError(f"--out {out} holds a tuning study ({study[0]}); choose another folder")
    finished = [m for m in FINISHED_MARKERS if (out / m).exists()]
    if finished and not overwrite:
        raise OutputError(f"--out {out} already holds a finished run ({finished[0]}); choose another folder or pass --overwrite")
    if (out / CHECKPOINT_FILE).exists() and not overwrite:
        raise OutputError(f"--out {out} holds an interrupted run ({CHECKPOINT_FILE}): continue it with --resume, "
                          "or pass --overwrite to start again")
    ancestor = out.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"--out {out}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"--out {out}: {ancestor} is not writable")
    return out


def prepare_out_dir(out: str | Path, overwrite: bool) -> Path:
    """Create the run folder after :func:`check_out_dir`; call it once the inputs are known to
    be good, so bad input leaves no folder behind. With ``overwrite`` the previous run's files
    (:data:`RUN_FILES`, event files and :data:`RUN_FOLDERS`) are removed first, so the folder
    never mixes two runs.

    Raises:
        OutputError: as :func:`check_out_dir`, or the folder cannot be created.
    """
    out = check_out_dir(out, overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            for f in [*(out / name for name in RUN_FILES), *out.glob("events.out.tfevents.*")]:
                f.unlink(missing_ok=True)
            for folder in (out / name for name in RUN_FOLDERS):
                if folder.is_dir():
                    shutil.rmtree(folder)
    except OSError as exc:
        raise OutputError(f"--out {out}: {exc.strerror or exc}") from None
    return out


def utc_stamp() -> str:
    """The current time in UTC as ``YYYYmmdd-HHMMSSZ`` (``Z``: UTC): names made from it sort in
    the order they were made, whatever the time zone of the machine or of ``TZ``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%SZ")


def default_out_dir(kind: str, tag: str = "") -> Path:
    """``runs/<kind>[-<tag>]-<YYYYmmdd-HHMMSS>Z`` under the current folder, the time in UTC
    (:func:`utc_stamp`), so that ``ls -d runs/search-* | tail -n 1`` is the newest search."""
    return Path("runs") / "-".join(p for p in (kind, tag, utc_stamp()) if p)


def environment() -> dict[str, str]:
    """Package versions for provenance."""
    import autoln

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "autoln": autoln.__version__, "platform": platform.platform()}


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def clip_and_norm(params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` (0 = no clipping); returns the norm before."""
    params = [p for p in params if p.grad is not None]
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) if params else 0.0


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, x: torch.Tensor, y: torch.Tensor,
               grad_clip: float) -> tuple[float, float]:
    """One optimizer step of a derived model on ``x, y`` ``(B, T)``: mean cross-entropy,
    backward, global-norm clipping to ``grad_clip`` (0: none), step, scheduler step.

    Under ``torchrun`` the gradients and the loss are averaged over the processes first.

    Returns ``(loss in nats/token, gradient norm before clipping)``.
    """
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    return finish_step(list(model.parameters()), loss, optimizer, scheduler, grad_clip)


def finish_step(params: list[nn.Parameter], loss: torch.Tensor, optimizer: torch.optim.Optimizer, scheduler,
                grad_clip: float) -> tuple[float, float]:
    """After ``backward``: average the gradients of ``params`` and the loss over the processes
    (:func:`autoln.core.distributed.average_`), clip to ``grad_clip``, step the optimizer and the
    scheduler. Returns ``(loss in nats/token, gradient norm before clipping)``.

    When the loss or the gradient norm is NaN or inf the optimizer step is not taken (the
    weights stay as they were; the caller applies ``on_divergence``); the scheduler still steps.
    """
    loss = loss.detach().reshape(1).clone()
    distributed.average_([p.grad for p in params if p.grad is not None] + [loss])
    norm = clip_and_norm(params, grad_clip)
    value = loss.item()
    if math.isfinite(value) and math.isfinite(norm):
        optimizer.step()
    scheduler.step()
    return value, norm
