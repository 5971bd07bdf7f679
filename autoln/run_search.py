"""The search job: train the supernet bilevel (DESIGN §4) and export the genotype (DESIGN §6).

Each step takes one alpha step on a D_alpha batch (:class:`autoln.architect.Architect`), then
one weight step on a D_w batch (DARTS Alg. 1 order). Every ``search.eval_every`` steps and at
the end: valid loss of the supernet, the alpha probabilities (scalars + image), the current
genotype (text), and a checkpoint. At the end ``genotype.json`` is written atomically.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from . import distributed
from .architect import Architect, weight_step
from .config import Config
from .data import HEADLINE, WindowSampler, arch_split, check_lengths, eval_starts, load_corpus, metrics_from_loss
from .errors import AutolnError, ConfigError
from .genotype import Genotype, from_probabilities
from .io import save_torch_atomic, write_text_atomic
from .mixing import linear
from .monitor import LAG, RATIO, CollapseMonitor
from .supernet import Supernet
from .tb import Logger
from .training import (check_out_dir, environment, evaluate, prepare_model, prepare_out_dir, resolve_device,
                       seed_everything, utc_now, weight_optimizer)

GENOTYPE_FILE = "genotype.json"


class DivergenceError(AutolnError):
    """A training loss became NaN or inf; the message names the step and the last checkpoint."""


@dataclass
class SearchResult:
    """What a search returns: the genotype, its file, the final valid metrics, the wall time (s)
    and the trained supernet."""

    genotype: Genotype
    path: Path
    valid: dict
    wall_time_s: float
    model: Supernet


def last_checkpoint(out: Path) -> str:
    """How to describe the run's last checkpoint in a divergence message."""
    ckpt = out / "checkpoint.pt"
    return f"the last good checkpoint is {ckpt}" if ckpt.exists() else "no checkpoint was written before it (none before the first evaluation)"


def check_searchable(mc) -> None:
    """Raise :class:`ConfigError` unless ``mc.candidates`` (a :class:`ModelConfig`'s) offers a
    choice: a search needs at least two candidate placements."""
    if len(mc.candidates) < 2:
        raise ConfigError(f"model.candidates: a search needs at least two candidates, got {mc.candidates}")


def weak_preference(probs: np.ndarray, margin: float = 0.05) -> bool:
    """True when at every site the top probability beats the runner-up by less than ``margin``:
    the argmax genotype is then a weak preference (e.g. alphas moved little in a short search)."""
    top2 = np.sort(probs, axis=-1)[:, -2:]
    return bool(probs.shape[-1] > 1 and (top2[:, 1] - top2[:, 0] < margin).all())


def genotype_markdown(probs: np.ndarray, sites: list[str], candidates: list[str]) -> str:
    """A Markdown table: one row per site, its probabilities and its argmax placement."""
    head = "| site | " + " | ".join(candidates) + " | chosen |\n|---|" + "---|" * (len(candidates) + 1) + "\n"
    rows = [f"| {s} | " + " | ".join(f"{v:.3f}" for v in row) + f" | **{candidates[int(np.argmax(row))]}** |"
            for s, row in zip(sites, probs)]
    return head + "\n".join(rows)


def monitor_step(monitor: CollapseMonitor, model: Supernet, batch, log: Logger, step: int) -> dict:
    """Update the collapse monitor at an evaluation and log ``monitor/*`` and ``entropy/<site>``;
    returns the monitor's record. ``batch``: the fixed Hessian batch, or None."""
    record = monitor.update(model, batch)
    if "eigenvalue" in record:
        log.scalar("monitor/hessian_eigenvalue", record["eigenvalue"], step)
        log.scalar("monitor/hessian_eigenvalue_smoothed", record["eigenvalue_smoothed"], step)
    for site, h in zip(model.site_names, record["entropy"]):
        log.scalar(f"entropy/{site}", h, step)
    log.scalar("monitor/mean_entropy", record["mean_entropy"], step)
    log.scalar("monitor/genotype_changed", float(record["genotype_changed"]), step)
    return record


#: Called after each evaluation with the step and the valid metrics; may raise to stop the run
#: (the Optuna outer loop reports intermediate values and prunes through it).
EvalHook = Callable[[int, dict], None]


def run_search(cfg: Config, out: str | Path, overwrite: bool = False, on_eval: Optional[EvalHook] = None) -> SearchResult:
    """Run one search with the resolved config ``cfg``, writing everything under ``out``.

    Writes ``config.yaml``, TensorBoard events, ``checkpoint.pt`` (at each evaluation) and
    ``genotype.json``. ``on_eval(step, valid_metrics)`` runs after each evaluation's
    checkpoint; whatever it raises ends the run (event files are closed first).

    Under ``torchrun`` (:mod:`autoln.distributed`) every process runs this function on its
    share of each batch; only rank 0 writes files, logs and prints, and every process returns
    the same result.

    Raises:
        OutputError: ``out`` holds a finished search and ``overwrite`` is False.
        DataError: the corpus cannot be read or is too short for ``model.context``.
        DivergenceError: a NaN/inf loss (the last checkpoint is kept).
        ConfigError: ``search.batch_size`` not divisible by the number of processes.
    """
    started = time.perf_counter()
    sc, mc = cfg.search, cfg.model
    check_out_dir(out, overwrite)
    check_searchable(mc)
    device = resolve_device(sc.device)
    distributed.init(device)
    distributed.check_batch(sc.batch_size, "search.batch_size")
    main = distributed.is_main()
    corpus = load_corpus(cfg.data)
    check_lengths(corpus, mc.context)
    seed_everything(sc.seed)
    train, valid = corpus.splits["train"], corpus.splits["valid"]
    w_chunks, a_chunks = arch_split(len(train), mc.context, cfg.data.chunk_tokens, cfg.data.arch_fraction, sc.seed)
    sampler_w = WindowSampler(train, w_chunks, mc.context, sc.batch_size, seed=[sc.seed, 1])
    sampler_a = WindowSampler(train, a_chunks, mc.context, sc.batch_size, seed=[sc.seed, 2])
    valid_starts = eval_starts(len(valid), mc.context, sc.eval_windows)

    model = prepare_model(Supernet(mc, corpus.vocab_size, sc.arch_init_std, sc.tau_start, sc.mixing), device, sc)
    opt_w, sched_w = weight_optimizer(model.named_weight_parameters(), sc)
    architect = Architect(model, sc)
    monitor = CollapseMonitor()
    monitor_batch = None
    if sc.monitor_windows:
        fixed = WindowSampler(train, a_chunks, mc.context, sc.monitor_windows, seed=[sc.seed, 4]).sample()
        monitor_batch = tuple(t.to(device) for t in fixed)

    out = Path(out)
    if main:
        prepare_out_dir(out, overwrite)
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
    distributed.barrier()
    log = Logger(out, cfg.logging.tensorboard and main)
    log.text("config", "```yaml\n" + cfg.to_yaml() + "```")
    log.text("data", corpus.describe())
    headline = HEADLINE[cfg.data.tokenizer]
    procs = f", {distributed.world_size()} processes" if distributed.active() else ""
    distributed.print_main(f"autoln search -> {out}\n  data: {corpus.describe()}\n  supernet: {sum(p.numel() for p in model.weight_parameters()):,} weights, "
          f"alphas {tuple(model.alphas.shape)} over {model.candidates}, order {sc.order}, mixing {sc.mixing}, device {device}{procs}",
          file=sys.stderr)

    def checkpoint(step: int) -> None:
        if not main:
            return
        save_torch_atomic({
            "kind": "search", "step": step, "config": cfg.to_dict(), "model": model.state_dict(),
            "weight_optimizer": opt_w.state_dict(), "weight_scheduler": sched_w.state_dict(),
            "architect": architect.state_dict(), "monitor": asdict(monitor),
            "samplers": {"w": sampler_w.state_dict(), "alpha": sampler_a.state_dict()},
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()},
        }, out / "checkpoint.pt")

    valid_metrics: dict = {}
    record: dict = {}
    stopped_at = None
    show = cfg.logging.progress and main
    bar = tqdm(range(1, sc.steps + 1), desc="search", disable=not show, dynamic_ncols=True)
    try:
        for step in bar:
            model.tau = linear(sc.tau_start, sc.tau_end, step - 1, sc.steps)
            batch_w = tuple(t.to(device) for t in distributed.shard(*sampler_w.sample()))
            batch_a = tuple(t.to(device) for t in distributed.shard(*sampler_a.sample()))
            loss_a = float("nan")
            if step > sc.arch_warmup_steps:
                loss_a = architect.step(batch_w, batch_a, xi=sched_w.get_last_lr()[0], step=step)
            loss_w, grad_norm = weight_step(model, opt_w, sched_w, *batch_w, sc.grad_clip, noise=sc.sdarts_eps)
            if not math.isfinite(loss_w) or (step > sc.arch_warmup_steps and not math.isfinite(loss_a)):
                raise DivergenceError(f"search diverged at step {step}: L_w={loss_w}, L_alpha={loss_a}; "
                                      f"{last_checkpoint(out)} (try a lower search.lr or more search.warmup_steps)")
            if step % cfg.logging.log_every == 0:
                log.scalars({"loss": loss_w, "grad_norm": grad_norm}, step, "train")
                if math.isfinite(loss_a):
                    log.scalar("train/loss_alpha", loss_a, step)
                log.scalar("lr/weights", sched_w.get_last_lr()[0], step)
                log.scalar("lr/alphas", architect.optimizer.param_groups[0]["lr"], step)
                log.scalar("search/tau", model.tau, step)
            if step % sc.eval_every == 0 or step == sc.steps:
                valid_metrics = metrics_from_loss(evaluate(model, valid, valid_starts, mc.context, sc.batch_size, device), cfg.data.tokenizer)
                log.scalars(valid_metrics, step, "valid")
                probs = model.probabilities()
                log.alphas(probs, model.site_names, model.candidates, step)
                log.text("genotype", genotype_markdown(probs, model.site_names, model.candidates), step)
                record = monitor_step(monitor, model, monitor_batch, log, step)
                log.flush()
                checkpoint(step)
                if sc.early_stop == "hessian" and record.get("stop"):
                    stopped_at = step
                    distributed.print_main(f"early stop (R-DARTS) at step {step}: smoothed Hessian eigenvalue rose above "
                          f"{RATIO} x its value {LAG} evaluations earlier", file=sys.stderr)
                    break
                if on_eval is not None:
                    on_eval(step, valid_metrics)
            if show:
                names = [model.candidates[i] for i in model.alphas.detach().argmax(-1).tolist()]
                shown = f"{valid_metrics[headline]:.3f}" if valid_metrics else "-"
                bar.set_postfix_str(f"loss {loss_w:.3f} valid {shown} [{' '.join(names)}]")
    except BaseException:
        bar.close()
        log.close()
        raise
    bar.close()

    wall = time.perf_counter() - started
    provenance = {
        "created": utc_now(), "command": " ".join(sys.argv), "seed": sc.seed, "config": cfg.to_dict(),
        "data": {"corpus": corpus.name, "tokenizer": corpus.tokenizer, "fingerprint_sha256": corpus.fingerprint,
                 "tokens": {k: int(len(v)) for k, v in corpus.splits.items()}},
        "packages": environment(),
        "metrics": {"steps": stopped_at or sc.steps, "stopped_early": stopped_at is not None,
                    "wall_time_s": round(wall, 2), "supernet_valid": valid_metrics,
                    "site_entropy": record.get("entropy"), "hessian_eigenvalues": monitor.eigenvalues},
    }
    genotype = from_probabilities(model.probabilities(), mc, corpus.vocab_size, provenance)
    path = genotype.save(out / GENOTYPE_FILE) if main else out / GENOTYPE_FILE
    distributed.barrier()
    log.text("genotype", f"final: `{genotype.describe()}`\n\n" + genotype_markdown(model.probabilities(), model.site_names, model.candidates), stopped_at or sc.steps)
    log.close()
    return SearchResult(genotype, path, valid_metrics, wall, model)
