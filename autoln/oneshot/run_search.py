"""The search job: train the supernet bilevel (docs/design.md §4) and export the genotype (docs/design.md §6).

``search.py``'s run of the one loop (:class:`autoln.oneshot.search_loop.SearchLoop`): this module sets
up the corpus's D_w / D_alpha samplers and autoln's supernet, gives the loop its pieces
(:mod:`autoln.oneshot.search_pieces`: checkpoints, TensorBoard, the collapse monitor, the Optuna hook,
progress) and writes the genotype with its provenance, atomically, as ``genotype.json``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from autoln.core import distributed
from autoln.config import Config
from autoln.data import HEADLINE, WindowSampler, arch_split, check_lengths, estimate_text, eval_starts, load_corpus, metrics_from_loss
from autoln.engine.checkpoint import CHECKPOINT_FILE, StopSignals, check_corpus_there, load_for_resume, space_errors_kept
from autoln.core.errors import ConfigError, OutputError
from autoln.models.genotype import Genotype, from_probabilities, nest_sites
from autoln.core.io import write_text_atomic
from autoln.core.locks import FolderLock
from autoln.models.resources import check_fits
from autoln.oneshot.search_loop import ReadOff, SearchData, SearchLoop, sdarts_noise, temperature  # noqa: F401 - sdarts_noise, temperature: their old home
from autoln.oneshot.search_pieces import (Checkpointing, EvalHook as EvalPiece, Monitor, Progress, TensorBoard, genotype_markdown,  # noqa: F401
                            own_site_tag, resume_loop, score_markdown, selection_markdown)
from autoln.oneshot.architect import weight_step  # noqa: F401 - looked up at each call (late): see late_bound
from autoln.oneshot.selection import clear_winner, perturbation_select, score_select  # noqa: F401 - as weight_step
from autoln.models.supernet import Supernet
from autoln.core.tb import Logger
from autoln.engine.training import check_out_dir, environment, evaluate, measure, prepare_model, prepare_out_dir, resolve_device, seed_everything, utc_now

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
        qk = (f" (QK-norm, model.qk_norm={mc.qk_norm}, is searched beside the placements, not alone)"
              if len(mc.qk_norm) > 1 else "")
        raise ConfigError(f"model.candidates: a search needs at least two candidates, got {mc.candidates}{qk}")


#: A supernet whose final valid loss is within this many nats/token of the unigram plateau
#: (:meth:`autoln.data.Corpus.unigram_plateau`) has learnt nothing beyond token frequencies.
PLATEAU_MARGIN = 0.1


def undecided_sites(probs: np.ndarray, sites: list[str], lead: float = 0.15) -> list[str]:
    """The sites of ``probs`` ``(n_sites, K)`` without a clear winner: the top probability leads
    the runner-up by less than ``lead`` (:func:`autoln.oneshot.selection.clear_winner`)."""
    return [site for site, row in zip(sites, probs) if not clear_winner(row, lead)]


def genotype_names(choices: list[int], candidates: list[str], granularity: str) -> str:
    """One line naming a genotype given per site as candidate indices (``post pre ...``, or
    ``post/pre ...`` per block for ``sublayer``)."""
    names = [candidates[c] for c in choices]
    if granularity == "layer":
        return " ".join(names)
    return " ".join(f"{names[2 * i]}/{names[2 * i + 1]}" for i in range(len(names) // 2))


#: Called after each evaluation with the step and the valid metrics; may raise to stop the run
#: (the Optuna outer loop reports intermediate values and prunes through it).
EvalHook = Callable[[int, dict], None]


def run_search(cfg: Config, out: str | Path, overwrite: bool = False, on_eval: Optional[EvalHook] = None,
               resume: bool = False) -> SearchResult:
    """Run one search with the resolved config ``cfg``, writing everything under ``out``.

    Writes ``config.yaml``, TensorBoard events, ``checkpoint.pt`` (every ``checkpoint.every``
    steps, at each evaluation, and on SIGINT/SIGTERM, after which it raises
    :class:`autoln.engine.checkpoint.Interrupted`) and ``genotype.json``. ``on_eval(step,
    valid_metrics)`` runs after each evaluation's checkpoint; whatever it raises ends the run
    (event files are closed first). ``resume``: continue the run in ``out`` from its checkpoint
    (:func:`autoln.engine.checkpoint.load_for_resume`); the result is bitwise that of an
    uninterrupted run on CPU. A NaN or inf loss or gradient stops the run or skips that update,
    per ``search.on_divergence``.

    Under ``torchrun`` (:mod:`autoln.core.distributed`) every process runs this function on its
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
        WriteError: a file could not be written for want of space or of file-size limit
            (:func:`autoln.engine.checkpoint.space_errors_kept`); the previous checkpoint is kept.
    """
    if resume and not Path(out).is_dir():  # before the lock, which would create it
        raise OutputError(f"--resume: {out} is not a run folder (it does not exist)")
    with StopSignals(Path(out) / CHECKPOINT_FILE) as signals, FolderLock(out, "search"), space_errors_kept(Path(out)):  # from the start: a second Ctrl-C in set-up stops at once
        return _search(cfg, Path(out), overwrite, on_eval, resume, signals)




def search_data(cfg: Config, corpus, model, device) -> tuple[SearchData, dict]:
    """The corpus's batches for the loop: D_w and D_alpha windows of the training split (the
    split of :func:`autoln.data.arch_split`), the read-off's fixed D_alpha windows and the
    supernet's valid metrics, each under ``torchrun`` this process's share. Returns the
    :class:`SearchData` and ``{"a_chunks": ...}`` (the D_alpha chunks, for the monitor)."""
    sc, mc = cfg.search, cfg.model
    train, valid = corpus.splits["train"], corpus.splits["valid"]
    w_chunks, a_chunks = arch_split(len(train), mc.context, cfg.data.chunk_tokens, cfg.data.arch_fraction, sc.seed)
    sampler_w = WindowSampler(train, w_chunks, mc.context, sc.batch_size, seed=[sc.seed, 1])
    sampler_a = WindowSampler(train, a_chunks, mc.context, sc.batch_size, seed=[sc.seed, 2])
    valid_starts = eval_starts(len(valid), mc.context, sc.eval_windows)
    sel_starts = WindowSampler(train, a_chunks, mc.context, sc.selection_windows, seed=[sc.seed, 5]).sample_starts()
    bpt = corpus.bytes_per_token.get("valid")  # bits per byte of a BPE corpus

    def draw(sampler) -> Callable[[], tuple]:
        return lambda: tuple(t.to(device) for t in distributed.shard(*sampler.sample()))

    def load(state: dict) -> None:
        sampler_w.load_state_dict(state["w"])
        sampler_a.load_state_dict(state["alpha"])

    data = SearchData(
        weight_batch=draw(sampler_w), arch_batch=draw(sampler_a),
        selection_loss=lambda mix: evaluate(model, train, sel_starts, mc.context, sc.batch_size, device, mix=mix),
        valid=lambda: measure(model, valid, valid_starts, mc.context, sc.batch_size, device, cfg.data.tokenizer, bpt, stderr=True),
        state_dict=lambda: {"w": sampler_w.state_dict(), "alpha": sampler_a.state_dict()}, load_state_dict=load)
    return data, {"a_chunks": a_chunks}


def progress_text(cfg: Config, corpus) -> Callable[[SearchLoop, dict], str]:
    """The progress bar's text after a step: the training loss and the supernet's last valid
    metric in the headline unit (bits per byte for bytes), and the alphas' argmax."""
    sc, headline = cfg.search, HEADLINE[cfg.data.tokenizer]

    def text(loop: SearchLoop, stats: dict) -> str:
        model, valid = loop.model, loop.state["valid_metrics"]
        names = [model.candidates[i] for i in model.alphas.detach().argmax(-1).tolist()]
        arch = f"argmax [{' '.join(names)}]" if stats["alpha_step"] else f"alphas frozen until step {sc.arch_warmup_steps + 1}"
        shown = estimate_text(valid, headline)
        train_shown = f"{metrics_from_loss(stats['loss_w'], cfg.data.tokenizer, corpus.bytes_per_token.get('train'))[headline]:.3f}"
        return f"train {train_shown}, supernet valid {shown}, {arch}"

    return text


def search_pieces(cfg: Config, out: Path, corpus, model, device, a_chunks, on_eval: Optional[EvalHook], start: int) -> list:
    """The callbacks of ``search.py``'s run, in order: the collapse monitor (with its fixed
    Hessian batch of ``search.monitor_windows`` D_alpha windows, and R-DARTS' early stop per
    ``search.early_stop``), TensorBoard (rank 0, ``logging.tensorboard``), the Optuna hook and
    progress (``logging.progress`` on rank 0). ``start``: the step a resumed run continues after
    (TensorBoard drops what the interrupted run logged after it)."""
    sc, mc, main = cfg.search, cfg.model, distributed.is_main()
    monitor_batch = None
    if sc.monitor_windows:
        fixed = WindowSampler(corpus.splits["train"], a_chunks, mc.context, sc.monitor_windows, seed=[sc.seed, 4]).sample()
        monitor_batch = tuple(t.to(device) for t in fixed)
    pieces = [Monitor(sc.steps, monitor_batch, sc.early_stop == "hessian",
                      announce=lambda text: distributed.print_main(text, file=sys.stderr))]
    pieces.append(TensorBoard(
        Logger(out, cfg.logging.tensorboard and main, purge_step=start + 1 if start else None), out, cfg.logging.log_every,
        lambda choices: genotype_names(choices, model.candidates, mc.granularity),
        intro={"config": "```yaml\n" + cfg.to_yaml() + "```", "data": corpus.describe()},
        pictures=main and cfg.logging.tensorboard, site_tag=own_site_tag))
    if on_eval is not None:
        pieces.append(EvalPiece(on_eval))
    pieces.append(Progress(cfg.logging.progress and main, progress_text(cfg, corpus)))
    return pieces


def late_bound(name: str) -> Callable:
    """This module's function ``name``, looked up at each call: the loop's weight step and
    read-offs are this module's names, so replacing one here (a test's slow step, an
    experiment's read-off variant) replaces it in the run."""
    return lambda *args, **kwargs: globals()[name](*args, **kwargs)


def _search(cfg: Config, out: Path, overwrite: bool, on_eval: Optional[EvalHook], resume: bool,
            signals: StopSignals) -> SearchResult:
    """The body of :func:`run_search`, under its ``signals``."""
    sc, mc = cfg.search, cfg.model
    if resume:
        check_corpus_there(cfg)
    ckpt = load_for_resume(out, "search", cfg, GENOTYPE_FILE) if resume else None
    if not resume:
        check_out_dir(out, overwrite)
    check_searchable(mc)
    device = resolve_device(sc.device)
    distributed.init(device)
    distributed.check_batch(sc.batch_size, "search.batch_size")
    main = distributed.is_main()
    corpus = load_corpus(cfg.data)
    check_lengths(corpus, mc.context)
    check_fits(mc, corpus.vocab_size, sc.batch_size // distributed.world_size(), device, True, "search")
    seed_everything(sc.seed)
    supernet = Supernet(mc, corpus.vocab_size, sc.arch_init_std, sc.tau_start, sc.mixing, sc.candidate_scale).init_output_bias(corpus.unigram_log_probs())
    model = prepare_model(supernet, device, sc)
    data, split = search_data(cfg, corpus, model, device)
    start = ckpt["step"] if ckpt is not None else 0
    checkpointing = Checkpointing(out, cfg.checkpoint.every, signals, device, {"kind": "search", "config": cfg.to_dict(),
                                                                                "data_fingerprint": corpus.fingerprint,
                                                                                "threads": torch.get_num_threads()},
                                  write=main, last_step=ckpt["step"] if ckpt is not None else None)
    checkpointing.stop_if_signalled(f"before step {start + 1}, before writing anything")
    if main:
        if ckpt is None:  # a new run, or one killed before its first checkpoint: start clean
            prepare_out_dir(out, overwrite or resume)
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
    distributed.barrier()
    pieces = search_pieces(cfg, out, corpus, model, device, split["a_chunks"], on_eval, start)
    loop = SearchLoop(model, sc, data, seed=sc.seed, callbacks=pieces, checkpointing=checkpointing,
                      weight_step=late_bound("weight_step") if sc.weight_mode == "mixed" else None,
                      perturbation_select=late_bound("perturbation_select"),
                      score_select=late_bound("score_select"), shortlist=cfg.race.top_k if cfg.race.enabled else 0)
    resume_loop(loop, ckpt)
    procs = f", {distributed.world_size()} processes" if distributed.active() else ""
    resumed = f"\n  resumed from {out / CHECKPOINT_FILE} at step {start}" if ckpt is not None else ""
    distributed.print_main(f"autoln search -> {out}\n  data: {corpus.describe()}\n  supernet: {sum(p.numel() for p in model.weight_parameters()):,} weights, "
                           f"alphas {tuple(model.alphas.shape)} over {model.candidates}"
                           + (f", QK-norm alphas {tuple(model.qk_alphas.shape)} over {model.qk_candidates}" if model.qk_alphas is not None else "")
                           + f", order {sc.order}, mixing {sc.mixing}, "
                           f"device {device}{procs}{resumed}", file=sys.stderr)
    read_off = loop.run()
    return finish_search(cfg, out, corpus, loop, read_off, ckpt is not None)


def finish_search(cfg: Config, out: Path, corpus, loop: SearchLoop, read_off: ReadOff, resumed: bool) -> SearchResult:
    """Warn when the supernet sits at the unigram plateau; write ``genotype.json`` (rank 0) with
    the run's provenance (:func:`search_provenance`). Returns the :class:`SearchResult`."""
    headline = HEADLINE[cfg.data.tokenizer]
    valid_metrics = loop.state["valid_metrics"]
    plateau = metrics_from_loss(corpus.unigram_plateau("valid"), cfg.data.tokenizer, corpus.bytes_per_token.get("valid"))
    at_plateau = bool(valid_metrics) and valid_metrics["loss"] > plateau["loss"] - PLATEAU_MARGIN
    if at_plateau:
        distributed.print_main(
            f"warning: the supernet's valid loss ({valid_metrics[headline]:.3f} {headline}) is at the unigram plateau "
            f"({plateau[headline]:.3f}): it has learnt the token frequencies and nothing else, so its alphas and loss rises "
            "say nothing about the placements. Train it longer, or with more warm-up (search.warmup_steps) or a lower "
            "search.lr, before trusting this genotype", file=sys.stderr)
    wall = loop.wall_time()
    provenance = search_provenance(cfg, corpus, loop, read_off, {"unigram_plateau": plateau, "at_unigram_plateau": at_plateau,
                                                                 "wall_time_s": round(wall, 2)}, resumed)
    chosen = None if read_off.method == "argmax" else read_off.choices
    genotype = from_probabilities(read_off.probabilities, cfg.model, corpus.vocab_size, provenance, chosen, read_off.qk,
                                  read_off.qk_probabilities)
    path = genotype.save(out / GENOTYPE_FILE) if distributed.is_main() else out / GENOTYPE_FILE
    distributed.barrier()
    return SearchResult(genotype, path, valid_metrics, wall, loop.model)


def search_provenance(cfg: Config, corpus, loop: SearchLoop, read_off: ReadOff, extra: dict, resumed: bool) -> dict:
    """The genotype's ``provenance``: command, seed, config, data, packages, the run's metrics
    (steps, wall time, supernet valid, skipped batches, entropies, eigenvalues, ``extra``) and
    the read-off's details (loss rises and order, or the scored genotypes, or the early stop)."""
    sc, mc, state = cfg.search, cfg.model, loop.state
    monitor = next(p.monitor for p in loop.pieces if isinstance(p, Monitor))
    stopped_at = state["stopped_at"]
    provenance = {
        "created": utc_now(), "command": " ".join(sys.argv), "seed": sc.seed, "config": cfg.to_dict(),
        "data": {"corpus": corpus.name, "tokenizer": corpus.tokenizer, "fingerprint_sha256": corpus.fingerprint,
                 "tokens": {k: int(len(v)) for k, v in corpus.splits.items()}},
        "packages": environment(),
        "metrics": {"steps": stopped_at or sc.steps, "stopped_early": stopped_at is not None,
                    "wall_time_s": extra["wall_time_s"], "supernet_valid": state["valid_metrics"],
                    "skipped_batches": state["skipped_batches"], "resumed_from_step": loop.start if resumed else None,
                    "site_entropy": state["record"].get("entropy"), "hessian_eigenvalues": monitor.eigenvalues,
                    "unigram_plateau": extra["unigram_plateau"], "at_unigram_plateau": extra["at_unigram_plateau"],
                    "candidate_scales": state.get("scales", [])},
        "selection": {"method": sc.selection if read_off.early is None else "argmax"},
    }
    if read_off.early is not None:
        provenance["metrics"]["early_stop"] = read_off.early
        provenance["selection"]["note"] = (f"R-DARTS early stop at step {stopped_at}: the argmax of the alphas of step "
                                           f"{read_off.early['genotype_from_step']}, before the eigenvalue rise (Zela et al. 2020)")
    if read_off.selected_valid is not None:
        provenance["metrics"]["supernet_valid_selected"] = read_off.selected_valid
    if read_off.selection is not None:
        sel = read_off.selection
        provenance["selection"].update({
            "loss_rises": nest_sites([[round(float(v), 6) if math.isfinite(v) else None for v in row]
                                      for row in sel.loss_rises], mc.granularity),
            "order": [loop.model.site_names[i] for i in sel.order], "windows": sc.selection_windows,
            "tune_steps": sc.selection_tune_steps, "unit": "nats/token", "fine_tuning_updates": read_off.fine_tuning_updates,
            "skipped_batches": read_off.fine_tuning_skipped})
    if read_off.shortlist:
        provenance["selection"]["shortlist"] = [{"placements": genotype_names(g, loop.model.candidates, mc.granularity),
                                                 "choices": [int(c) for c in g], "loss": round(v, 6)} for g, v in read_off.shortlist]
    if read_off.scored is not None:
        scored = read_off.scored
        provenance["selection"].update({
            "search": scored.method, "evaluated": scored.evaluated, "windows": sc.selection_windows, "unit": "nats/token",
            "loss": round(scored.loss, 6),
            "top": [{"placements": genotype_names(g, loop.model.candidates, mc.granularity), "loss": round(v, 6)}
                    for g, v in scored.top]})
    return provenance
