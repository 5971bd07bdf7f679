"""The search job: train the supernet bilevel (docs/design.md §4) and export the genotype (docs/design.md §6).

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

from . import distributed
from .architect import Architect, weight_step
from .config import Config
from .data import HEADLINE, UNITS, WindowSampler, arch_split, check_lengths, eval_starts, load_corpus, metrics_from_loss
from .checkpoint import CHECKPOINT_FILE, Checkpointer, StopSignals, load_for_resume, set_rng_state
from .errors import ConfigError, OutputError
from .genotype import Genotype, from_probabilities, nest_sites
from .io import write_text_atomic
from .locks import FolderLock
from .mixing import linear
from .monitor import DELTA, RATIO, WINDOW, CollapseMonitor
from .resources import check_fits
from .selection import LossFn, ScoreSelection, Selection, clear_winner, perturbation_select, score_select
from .supernet import Supernet
from .tb import Logger, write_alpha_pictures
from .training import (check_out_dir, environment, evaluate, prepare_model, prepare_out_dir, progress_bar, progress_line,
                       resolve_device, seed_everything, utc_now, weight_optimizer)

GENOTYPE_FILE = "genotype.json"


@dataclass
class SearchResult:
    """What a search returns: the genotype, its file, the final valid metrics, the wall time (s)
    and the trained supernet."""

    genotype: Genotype
    path: Path
    valid: dict
    wall_time_s: float
    model: Supernet


def check_searchable(mc) -> None:
    """Raise :class:`ConfigError` unless ``mc.candidates`` (a :class:`ModelConfig`'s) offers a
    choice: a search needs at least two candidate placements."""
    if len(mc.searched_candidates()) < 2:
        raise ConfigError(f"model.candidates: a search needs at least two candidates, got {mc.candidates}")


def temperature(sc, step: int) -> float:
    """The mixing temperature of 1-based search ``step``: linear from ``sc.tau_start`` at step 1
    to exactly ``sc.tau_end`` at step ``sc.steps`` (SNAS, GDAS)."""
    return linear(sc.tau_start, sc.tau_end, step - 1, sc.steps - 1)


#: A supernet whose final valid loss is within this many nats/token of the unigram plateau
#: (:meth:`autoln.data.Corpus.unigram_plateau`) has learnt nothing beyond token frequencies.
PLATEAU_MARGIN = 0.1


def sdarts_noise(sc, step: int) -> float:
    """SDARTS-RS's noise bound ``eps`` at 1-based search ``step``: linear from ``min(0.03,
    sc.sdarts_eps)`` at step 1 to ``sc.sdarts_eps`` at the last step, as the reference code
    (xiangning-chen/SmoothDARTS: ``epsilon_alpha = 0.03 + (eps_max - 0.03) * epoch / epochs``,
    ``eps_max`` 0.3; Chen & Hsieh 2020). 0 when ``sc.sdarts_eps`` is 0."""
    return linear(min(0.03, sc.sdarts_eps), sc.sdarts_eps, step - 1, sc.steps - 1)


def undecided_sites(probs: np.ndarray, sites: list[str], lead: float = 0.15) -> list[str]:
    """The sites of ``probs`` ``(n_sites, K)`` without a clear winner: the top probability leads
    the runner-up by less than ``lead`` (:func:`autoln.selection.clear_winner`)."""
    return [site for site, row in zip(sites, probs) if not clear_winner(row, lead)]


def genotype_markdown(probs: np.ndarray, sites: list[str], candidates: list[str], chosen: Optional[list[int]] = None) -> str:
    """A Markdown table: one row per site, its probabilities ``(n_sites, K)`` and its chosen
    placement (``chosen``: per site a candidate index; default the argmax)."""
    chosen = [int(np.argmax(row)) for row in probs] if chosen is None else chosen
    head = "| site | " + " | ".join(candidates) + " | chosen |\n|---|" + "---|" * (len(candidates) + 1) + "\n"
    rows = [f"| {s} | " + " | ".join(f"{v:.3f}" for v in row) + f" | **{candidates[c]}** |"
            for s, row, c in zip(sites, probs, chosen)]
    return head + "\n".join(rows)


def monitor_step(monitor: CollapseMonitor, model: Supernet, batch, log: Logger, step: int) -> dict:
    """Update the collapse monitor at an evaluation and log ``monitor/*`` and ``entropy/<site>``;
    returns the monitor's record. ``batch``: the fixed Hessian batch, or None."""
    record = monitor.update(model, batch, step)
    if "eigenvalue" in record:
        log.scalar("monitor/hessian_eigenvalue", record["eigenvalue"], step)
        log.scalar("monitor/hessian_eigenvalue_smoothed", record["eigenvalue_smoothed"], step)
    for site, h in zip(model.site_names, record["entropy"]):
        log.scalar(f"entropy/{site}", h, step)
    log.scalar("monitor/mean_entropy", record["mean_entropy"], step)
    log.scalar("monitor/genotype_changed", float(record["genotype_changed"]), step)
    return record


def run_selection(model: Supernet, loss: LossFn, tune: Callable[[], None], seed: int, log: Logger, step: Callable[[], int],
                  show: bool) -> Selection:
    """Perturbation-based selection (:func:`autoln.selection.perturbation_select`) of every site
    in a random order drawn from ``seed``, with a progress bar; logs the loss rises as scalars
    ``selection/<site>/<candidate>`` (nats/token) and a Markdown table ``selection`` at
    ``step()``, the step of the last fine-tuning update (where the selection ends, as every
    record of its result). ``loss`` and ``tune`` as there."""
    n_sites = len(model.site_names)
    order = [int(i) for i in np.random.default_rng([seed, 6]).permutation(n_sites)]
    bar = progress_bar(show=show, total=n_sites, desc="perturbation selection", unit="site")

    def tune_and_count() -> None:
        bar.update(1)
        tune()

    try:
        selection = perturbation_select(model, loss, tune_and_count, order)
    finally:
        bar.close()
    for site, row in zip(model.site_names, selection.loss_rises):
        log.scalars({cand: float(v) for cand, v in zip(model.candidates, row)}, step(), f"selection/{site}")
    log.text("selection", selection_markdown(selection, model.site_names, model.candidates), step())
    return selection


def selection_markdown(selection: Selection, sites: list[str], candidates: list[str]) -> str:
    """A Markdown table of perturbation-based selection: per site the loss rise (nats/token) when
    each candidate is removed, the decision order and the chosen candidate."""
    head = ("Loss rise (nats/token) of the supernet when a candidate is removed; the largest rise wins.\n\n"
            "| site | " + " | ".join(candidates) + " | decided | chosen |\n|---|" + "---|" * (len(candidates) + 2) + "\n")
    rank = {site: i + 1 for i, site in enumerate(selection.order)}
    rows = [f"| {s} | " + " | ".join(f"{v:+.4f}" for v in row) + f" | {rank[i]} | **{candidates[selection.choices[i]]}** |"
            for i, (s, row) in enumerate(zip(sites, selection.loss_rises))]
    return head + "\n".join(rows)


def genotype_names(choices: list[int], candidates: list[str], granularity: str) -> str:
    """One line naming a genotype given per site as candidate indices (``post pre ...``, or
    ``post/pre ...`` per block for ``sublayer``)."""
    names = [candidates[c] for c in choices]
    if granularity == "layer":
        return " ".join(names)
    return " ".join(f"{names[2 * i]}/{names[2 * i + 1]}" for i in range(len(names) // 2))


def score_markdown(scored: ScoreSelection, candidates: list[str], granularity: str) -> str:
    """A Markdown table of genotype scoring: the best genotypes and their one-hot supernet loss."""
    head = (f"Genotypes scored by the supernet ({scored.method}, {scored.evaluated} scored): loss (nats/token) with the "
            "genotype imposed one-hot; the lowest wins.\n\n| rank | genotype | loss |\n|---|---|---|\n")
    return head + "\n".join(f"| {i + 1} | {genotype_names(g, candidates, granularity)} | {v:.4f} |" for i, (g, v) in enumerate(scored.top))


#: Called after each evaluation with the step and the valid metrics; may raise to stop the run
#: (the Optuna outer loop reports intermediate values and prunes through it).
EvalHook = Callable[[int, dict], None]


def run_search(cfg: Config, out: str | Path, overwrite: bool = False, on_eval: Optional[EvalHook] = None,
               resume: bool = False) -> SearchResult:
    """Run one search with the resolved config ``cfg``, writing everything under ``out``.

    Writes ``config.yaml``, TensorBoard events, ``checkpoint.pt`` (every ``checkpoint.every``
    steps, at each evaluation, and on SIGINT/SIGTERM, after which it raises
    :class:`autoln.checkpoint.Interrupted`) and ``genotype.json``. ``on_eval(step,
    valid_metrics)`` runs after each evaluation's checkpoint; whatever it raises ends the run
    (event files are closed first). ``resume``: continue the run in ``out`` from its checkpoint
    (:func:`autoln.checkpoint.load_for_resume`); the result is bitwise that of an
    uninterrupted run on CPU. A NaN or inf loss or gradient stops the run or skips that update,
    per ``search.on_divergence``.

    Under ``torchrun`` (:mod:`autoln.distributed`) every process runs this function on its
    share of each batch; only rank 0 writes files, logs and prints, and every process returns
    the same result.

    Raises:
        OutputError: ``out`` holds a finished search and ``overwrite`` is False (or, with
            ``resume``, at all), or its checkpoint is unreadable.
        DataError: the corpus cannot be read or is too short for ``model.context``.
        DivergenceError: a NaN/inf loss or gradient under ``on_divergence: stop`` (the last
            good checkpoint is kept).
        ConfigError: ``search.batch_size`` not divisible by the number of processes; with
            ``resume``, a config that differs from the checkpoint's (naming each key).
    """
    if resume and not Path(out).is_dir():  # before the lock, which would create it
        raise OutputError(f"--resume: {out} is not a run folder (it does not exist)")
    with StopSignals(Path(out) / CHECKPOINT_FILE) as signals, FolderLock(out, "search"):  # from the start: a second Ctrl-C in set-up stops at once
        return _search(cfg, Path(out), overwrite, on_eval, resume, signals)


def _search(cfg: Config, out: Path, overwrite: bool, on_eval: Optional[EvalHook], resume: bool,
            signals: StopSignals) -> SearchResult:
    """The body of :func:`run_search`, under its ``signals``."""
    sc, mc = cfg.search, cfg.model
    if resume:
        ckpt = load_for_resume(out, "search", cfg, GENOTYPE_FILE)
    else:
        check_out_dir(out, overwrite)
        ckpt = None
    check_searchable(mc)
    device = resolve_device(sc.device)
    distributed.init(device)
    distributed.check_batch(sc.batch_size, "search.batch_size")
    main = distributed.is_main()
    corpus = load_corpus(cfg.data)
    check_lengths(corpus, mc.context)
    check_fits(mc, corpus.vocab_size, sc.batch_size // distributed.world_size(), device, True, "search")
    seed_everything(sc.seed)
    train, valid = corpus.splits["train"], corpus.splits["valid"]
    w_chunks, a_chunks = arch_split(len(train), mc.context, cfg.data.chunk_tokens, cfg.data.arch_fraction, sc.seed)
    sampler_w = WindowSampler(train, w_chunks, mc.context, sc.batch_size, seed=[sc.seed, 1])
    sampler_a = WindowSampler(train, a_chunks, mc.context, sc.batch_size, seed=[sc.seed, 2])
    valid_starts = eval_starts(len(valid), mc.context, sc.eval_windows)
    bpt = corpus.bytes_per_token.get("valid")  # bits per byte of a BPE corpus

    supernet = Supernet(mc, corpus.vocab_size, sc.arch_init_std, sc.tau_start, sc.mixing).init_output_bias(corpus.unigram_log_probs())
    model = prepare_model(supernet, device, sc)
    opt_w, sched_w = weight_optimizer(model.named_weight_parameters(), sc)
    architect = Architect(model, sc)
    monitor = CollapseMonitor(total_steps=sc.steps)
    monitor_batch = None
    if sc.monitor_windows:
        fixed = WindowSampler(train, a_chunks, mc.context, sc.monitor_windows, seed=[sc.seed, 4]).sample()
        monitor_batch = tuple(t.to(device) for t in fixed)

    ckpts = Checkpointer(out, cfg.checkpoint.every, main, ckpt["step"] if ckpt is not None else None)
    ckpts.stop_if_signalled(signals, device, f"before step {ckpts.next_step}, before writing anything")
    if main:
        if ckpt is None:  # a new run, or one killed before its first checkpoint: start clean
            prepare_out_dir(out, overwrite or resume)
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
    distributed.barrier()
    state = {"valid_metrics": {}, "record": {}, "stopped_at": None, "skipped_batches": 0, "wall_time_s": 0.0,
             "alpha_history": []}  # (step, probabilities) as logged: alphas.png's curves
    start = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt_w.load_state_dict(ckpt["weight_optimizer"])
        sched_w.load_state_dict(ckpt["weight_scheduler"])
        architect.load_state_dict(ckpt["architect"])
        monitor = CollapseMonitor(**ckpt["monitor"])
        sampler_w.load_state_dict(ckpt["samplers"]["w"])
        sampler_a.load_state_dict(ckpt["samplers"]["alpha"])
        state.update(ckpt["state"])
        start = ckpt["step"]
        set_rng_state(ckpt["rng"])
        model.tau = temperature(sc, start)  # what the checkpointed step used (the selection after the last step uses it)
    log = Logger(out, cfg.logging.tensorboard and main, purge_step=start + 1 if start else None)
    log.layout(model.site_names, model.candidates)  # the layout is no event of a step: purge_step keeps it on resume
    if not start:
        log.text("config", "```yaml\n" + cfg.to_yaml() + "```")
        log.text("data", corpus.describe())
        log.alphas(model.probabilities(), model.site_names, model.candidates, 0, image=True)
        state["alpha_history"].append([0, model.probabilities().tolist()])
    headline = HEADLINE[cfg.data.tokenizer]
    procs = f", {distributed.world_size()} processes" if distributed.active() else ""
    resumed = f"\n  resumed from {out / CHECKPOINT_FILE} at step {start}" if ckpt is not None else ""
    distributed.print_main(f"autoln search -> {out}\n  data: {corpus.describe()}\n  supernet: {sum(p.numel() for p in model.weight_parameters()):,} weights, "
          f"alphas {tuple(model.alphas.shape)} over {model.candidates}, order {sc.order}, mixing {sc.mixing}, device {device}{procs}{resumed}",
          file=sys.stderr)
    ckpts.stop_if_signalled(signals, device, f"before step {ckpts.next_step}")
    signals.when = StopSignals.IN_STEPS
    session = time.perf_counter()

    def checkpoint(step: int) -> None:
        ckpts.save(step, {
            "kind": "search", "step": step, "config": cfg.to_dict(), "model": model.state_dict(),
            "weight_optimizer": opt_w.state_dict(), "weight_scheduler": sched_w.state_dict(),
            "architect": architect.state_dict(), "monitor": asdict(monitor),
            "samplers": {"w": sampler_w.state_dict(), "alpha": sampler_a.state_dict()},
            "state": {**state, "wall_time_s": state["wall_time_s"] + time.perf_counter() - session},
        })

    show = cfg.logging.progress and main
    todo = range(start + 1, sc.steps + 1) if state["stopped_at"] is None else range(0)  # an early stop's checkpoint: done
    bar = progress_bar(todo, show=show, desc="search", unit="step", initial=start, total=sc.steps)
    try:
        for step in bar:
            model.tau = temperature(sc, step)
            batch_w = tuple(t.to(device) for t in distributed.shard(*sampler_w.sample()))
            batch_a = tuple(t.to(device) for t in distributed.shard(*sampler_a.sample()))
            loss_a = float("nan")
            alpha_step = step > sc.arch_warmup_steps and sc.arch_lr > 0  # arch_lr 0: alphas fixed at their start
            if alpha_step:
                loss_a = architect.step(batch_w, batch_a, xi=sched_w.get_last_lr()[0], step=step)
            loss_w, grad_norm = weight_step(model, opt_w, sched_w, *batch_w, sc.grad_clip, noise=sdarts_noise(sc, step))
            if not (math.isfinite(loss_w) and math.isfinite(grad_norm)) or (alpha_step and not math.isfinite(loss_a)):
                what = f"L_w={loss_w}, weight grad norm={grad_norm}" + (f", L_alpha (or its gradient)={loss_a}" if alpha_step else "")
                ckpts.diverged("search", sc.on_divergence, step, what, state, log)
            if step % cfg.logging.log_every == 0:
                log.scalars({"loss": loss_w, "grad_norm": grad_norm}, step, "train")
                if math.isfinite(loss_a):
                    log.scalar("train/loss_alpha", loss_a, step)
                log.scalar("lr/weights", sched_w.get_last_lr()[0], step)
                log.scalar("lr/alphas", architect.optimizer.param_groups[0]["lr"], step)
                log.scalar("search/tau", model.tau, step)
            evaluation = step % sc.eval_every == 0 or step == sc.steps
            if step % cfg.logging.log_every == 0 or evaluation:
                log.alphas(model.probabilities(), model.site_names, model.candidates, step, image=evaluation)
                state["alpha_history"].append([step, model.probabilities().tolist()])
            if evaluation:
                valid_metrics = metrics_from_loss(evaluate(model, valid, valid_starts, mc.context, sc.batch_size, device), cfg.data.tokenizer, bpt)
                state["valid_metrics"] = valid_metrics
                log.scalars(valid_metrics, step, "valid")
                log.text("genotype", genotype_markdown(model.probabilities(), model.site_names, model.candidates), step)
                state["record"] = monitor_step(monitor, model, monitor_batch, log, step)
                log.flush()
                if sc.early_stop == "hessian" and state["record"].get("stop"):
                    state["stopped_at"] = step
            ckpts.end_step(step, evaluation, signals, device, checkpoint)
            if state["stopped_at"] is not None:
                distributed.print_main(f"early stop (R-DARTS) at step {step}: the Hessian eigenvalue's {WINDOW}-evaluation average "
                                       f"rose above {RATIO} x its value {DELTA} evaluations earlier; the genotype is the one of step "
                                       f"{monitor.before_rise()[0]}, before the rise", file=sys.stderr)
                break
            if evaluation and on_eval is not None:
                on_eval(step, state["valid_metrics"])
            if show:
                names = [model.candidates[i] for i in model.alphas.detach().argmax(-1).tolist()]
                arch = f"argmax [{' '.join(names)}]" if alpha_step else f"alphas frozen until step {sc.arch_warmup_steps + 1}"
                shown = f"{state['valid_metrics'][headline]:.3f} {UNITS[headline]}" if state["valid_metrics"] else "-"
                # one unit for both: the training loss in the headline unit too (bits per byte for bytes)
                train_shown = f"{metrics_from_loss(loss_w, cfg.data.tokenizer, corpus.bytes_per_token.get('train'))[headline]:.3f}"
                bar.set_postfix_str(f"train {train_shown}, supernet valid {shown}, {arch}")
                if evaluation:
                    progress_line(show, f"search step {step}/{sc.steps}: train {train_shown}, supernet valid {shown}, {arch}")
    except BaseException:
        bar.close()
        log.close()
        raise
    bar.close()
    valid_metrics, record, stopped_at = state["valid_metrics"], state["record"], state["stopped_at"]
    selection = scored = None  # a resumed run that was interrupted here redoes the selection from the last step's checkpoint
    early = None
    final_step = stopped_at or sc.steps  # the step of the genotype's every record (after any fine-tuning of the selection)
    if stopped_at is not None:  # R-DARTS returns the architecture from before the rise, as it was then
        early = {"stopped_at_step": stopped_at, "genotype_from_step": monitor.before_rise()[0]}
    elif sc.selection == "perturbation":
        tuned, tune_state = [0], {"skipped_batches": 0}

        def tune() -> None:  # DARTS-PT's fine-tuning: bilevel steps, numbered on from the search's last; then a stop point
            for _ in range(sc.selection_tune_steps):
                tuned[0] += 1
                batch_w = tuple(t.to(device) for t in distributed.shard(*sampler_w.sample()))
                batch_a = tuple(t.to(device) for t in distributed.shard(*sampler_a.sample()))
                loss_a = architect.step(batch_w, batch_a, xi=sched_w.get_last_lr()[0], step=sc.steps) if sc.arch_lr > 0 else 0.0
                loss_w, grad_norm = weight_step(model, opt_w, sched_w, *batch_w, sc.grad_clip, noise=sc.sdarts_eps)
                if not all(math.isfinite(v) for v in (loss_a, loss_w, grad_norm)):
                    ckpts.diverged("search", sc.on_divergence, sc.steps + tuned[0],
                                   f"L_w={loss_w}, L_alpha={loss_a} (fine-tuning of perturbation-based selection)", tune_state, log)
            ckpts.stop_if_signalled(signals, device, "during perturbation-based selection (which starts again from the "
                                    "checkpoint of the search's last step)")

        signals.when = ("after this site's decision and fine-tuning (the selection starts again from the checkpoint of "
                        "the search's last step)")
        sel_starts = WindowSampler(train, a_chunks, mc.context, sc.selection_windows, seed=[sc.seed, 5]).sample_starts()
        try:
            selection = run_selection(model, lambda mix: evaluate(model, train, sel_starts, mc.context, sc.batch_size, device, mix=mix),
                                      tune, sc.seed, log, lambda: sc.steps + tuned[0], show)
        except BaseException:
            log.close()
            raise
        selected_valid = metrics_from_loss(evaluate(model, valid, valid_starts, mc.context, sc.batch_size, device), cfg.data.tokenizer, bpt)
        final_step = sc.steps + tuned[0]  # the selection ends after its fine-tuning updates: its every record is logged there
        log.scalars(selected_valid, final_step, "valid_selected")
        # the alphas went on training during the fine-tuning: log where they ended, after it
        log.alphas(model.probabilities(), model.site_names, model.candidates, final_step, image=True, chosen=selection.choices)

    elif sc.selection == "score":
        signals.when = "during genotype scoring (which starts again from the checkpoint of the search's last step)"
        sel_starts = WindowSampler(train, a_chunks, mc.context, sc.selection_windows, seed=[sc.seed, 5]).sample_starts()
        bar = progress_bar(show=show, desc="scoring genotypes", unit="genotype")

        def scored_one(_: int) -> None:
            bar.update(1)
            ckpts.stop_if_signalled(signals, device, "during genotype scoring (which starts again from the checkpoint of "
                                    "the search's last step)")

        try:
            scored = score_select(model, lambda mix: evaluate(model, train, sel_starts, mc.context, sc.batch_size, device, mix=mix),
                                  sc.seed, progress=scored_one)
        except BaseException:
            log.close()
            raise
        finally:
            bar.close()
        selected_valid = metrics_from_loss(evaluate(model, valid, valid_starts, mc.context, sc.batch_size, device), cfg.data.tokenizer, bpt)
        log.scalars(selected_valid, sc.steps, "valid_selected")
        log.text("selection", score_markdown(scored, model.candidates, mc.granularity), sc.steps)

    probs = model.probabilities() if early is None else np.asarray(monitor.before_rise()[1], dtype=np.float64)
    wall = state["wall_time_s"] + time.perf_counter() - session
    plateau = metrics_from_loss(corpus.unigram_plateau("valid"), cfg.data.tokenizer, bpt)
    at_plateau = bool(valid_metrics) and valid_metrics["loss"] > plateau["loss"] - PLATEAU_MARGIN
    if at_plateau:
        distributed.print_main(
            f"warning: the supernet's valid loss ({valid_metrics[headline]:.3f} {headline}) is at the unigram plateau "
            f"({plateau[headline]:.3f}): it has learnt the token frequencies and nothing else, so its alphas and loss rises "
            "say nothing about the placements. Train it longer, or with more warm-up (search.warmup_steps) or a lower "
            "search.lr, before trusting this genotype", file=sys.stderr)
    provenance = {
        "created": utc_now(), "command": " ".join(sys.argv), "seed": sc.seed, "config": cfg.to_dict(),
        "data": {"corpus": corpus.name, "tokenizer": corpus.tokenizer, "fingerprint_sha256": corpus.fingerprint,
                 "tokens": {k: int(len(v)) for k, v in corpus.splits.items()}},
        "packages": environment(),
        "metrics": {"steps": stopped_at or sc.steps, "stopped_early": stopped_at is not None,
                    "wall_time_s": round(wall, 2), "supernet_valid": valid_metrics,
                    "skipped_batches": state["skipped_batches"], "resumed_from_step": start if ckpt is not None else None,
                    "site_entropy": record.get("entropy"), "hessian_eigenvalues": monitor.eigenvalues,
                    "unigram_plateau": plateau, "at_unigram_plateau": at_plateau},
        "selection": {"method": sc.selection if early is None else "argmax"},
    }
    if early is not None:
        provenance["metrics"]["early_stop"] = early
        provenance["selection"]["note"] = (f"R-DARTS early stop at step {stopped_at}: the argmax of the alphas of step "
                                           f"{early['genotype_from_step']}, before the eigenvalue rise (Zela et al. 2020)")
    if selection is not None:
        provenance["metrics"]["supernet_valid_selected"] = selected_valid
        provenance["selection"].update({
            "loss_rises": nest_sites([[round(float(v), 6) if math.isfinite(v) else None for v in row]
                                      for row in selection.loss_rises], mc.granularity),
            "order": [model.site_names[i] for i in selection.order], "windows": sc.selection_windows,
            "tune_steps": sc.selection_tune_steps, "unit": "nats/token", "fine_tuning_updates": tuned[0],
            "skipped_batches": tune_state["skipped_batches"]})
    if scored is not None:
        provenance["metrics"]["supernet_valid_selected"] = selected_valid
        provenance["selection"].update({
            "search": scored.method, "evaluated": scored.evaluated, "windows": sc.selection_windows, "unit": "nats/token",
            "loss": round(scored.loss, 6),
            "top": [{"placements": genotype_names(g, model.candidates, mc.granularity), "loss": round(v, 6)} for g, v in scored.top]})
    chosen = selection.choices if selection is not None else scored.choices if scored is not None else None
    genotype = from_probabilities(probs, mc, corpus.vocab_size, provenance, chosen)
    if main and cfg.logging.tensorboard:  # pictures a user can open without TensorBoard: the alphas' curves and the heat map
        history = [*state.get("alpha_history", []), [final_step, probs.tolist()]]
        write_alpha_pictures(out, history, model.site_names, model.candidates, chosen, log, final_step)
    path = genotype.save(out / GENOTYPE_FILE) if main else out / GENOTYPE_FILE
    distributed.barrier()
    log.text("genotype", f"final ({sc.selection}): `{genotype.describe()}`\n\n"
             + genotype_markdown(probs, model.site_names, model.candidates, chosen), final_step)
    log.close()
    return SearchResult(genotype, path, valid_metrics, wall, model)
