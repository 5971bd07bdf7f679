"""``autoln.search``: the bilevel search on a user's model.

:func:`search` runs the bilevel loop (DARTS, Liu et al. 2019), reads the genotype off
(``search.selection``: DARTS-PT's perturbation by default) and returns a
:class:`autoln.api.site_genotype.SiteGenotype`: one placement per site, by the site's module
name, in a :class:`SearchOutcome`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch
from torch import nn

from autoln.api.batches import BatchStream, first_batches
from autoln.api.run_folder import GENOTYPE_FILE, check_resumable, resume_hint
from autoln.api.search_model import LossFn, SearchModel, unused_note
from autoln.api.search_settings import alpha_travel_warning, check_search
from autoln.api.site_genotype import SiteGenotype, genotype_notes
from autoln.api.sites import as_pair
from autoln.config import SearchConfig
from autoln.core.modes import train_mode
from autoln.models.supernet import set_candidate_scale


@dataclass
class SearchOutcome:
    """What :func:`search` returns: the genotype, the trained :class:`SearchModel` (its sites
    left one-hot at the answer by the selection), per-step losses (nats per token) and
    ``notes``: one line each on what weakens the answer, as ``search.py`` prints them: alphas
    that could not separate in the steps given, then :func:`genotype_notes` (arbitrary choices,
    ties of the loss rises and how they were broken, overruled probabilities, no clear winner).
    With ``progress`` they are printed on stderr as the search ends."""

    genotype: SiteGenotype
    model: SearchModel
    losses: list[float]
    notes: list[str] = field(default_factory=list)


def search(model: nn.Module, train_batches: Iterable, *, steps: Optional[int] = None, arch_batches: Optional[Iterable] = None,
           cfg: Optional[SearchConfig] = None, loss_fn: Optional[LossFn] = None, seed: int = 0,
           progress: bool = True, selection_batches: Optional[Iterable] = None, valid_batches: Optional[Iterable] = None,
           out: Optional[str | Path] = None, resume: bool = False, overwrite: bool = False, tensorboard: bool = False,
           checkpoint_every: int = 100, on_eval: Optional[Callable[[int, dict], None]] = None,
           shortlist: int = 3) -> SearchOutcome:
    """The bilevel search (docs/design.md §4) on a user's model with searchable sites: the same
    loop as ``search.py`` (:class:`autoln.oneshot.search_loop.SearchLoop`) with the same pieces.

    Each step takes one alpha step on a D_alpha batch (first- or second-order, per
    ``cfg.order``; none during ``cfg.arch_warmup_steps`` or with ``cfg.arch_lr`` 0), then one
    weight step (AdamW with ``cfg``'s schedule, SDARTS noise per ``cfg.sdarts_eps``) on a D_w
    batch; the temperature falls from ``cfg.tau_start`` to ``cfg.tau_end``; the collapse monitor
    runs at each evaluation (every ``cfg.eval_every`` steps; R-DARTS' early stop with
    ``cfg.early_stop``). Then the genotype is read off per ``cfg.selection``: ``perturbation``
    (DARTS-PT, with ``cfg.selection_tune_steps`` bilevel steps between two decisions),
    ``score`` (SPOS) or ``argmax``, measured through :func:`autoln.engine.training.evaluate_batches`
    on fixed ``selection_batches``.

    Args:
        model: the user's module, with :class:`autoln.models.model.Site` s of two or more candidates
            (wrapped here as a :class:`SearchModel`, its alphas drawn after ``torch.manual_seed(seed)``),
            or a :class:`SearchModel` (used as it is); trained in place, on its own device, in
            train mode but for modules frozen in eval mode inside it, each module back in its
            mode on return (:func:`autoln.core.modes.train_mode`).
        train_batches: ``(x, y)`` batches for the weights (re-iterated when used up).
        steps: bilevel steps; default ``cfg.steps``, and without ``cfg`` ``search.py``'s 500.
        arch_batches: ``(x, y)`` batches for the alphas (D_alpha); default: every other batch
            of ``train_batches`` (DARTS' half split).
        cfg: the search settings (:class:`autoln.config.SearchConfig`); default
            :func:`default_config` (``search.py``'s schedule, its warm-ups scaled for fewer
            steps). When the alphas cannot separate in the steps given
            (:func:`alpha_travel_warning`) one line says so on stderr and in the outcome's notes.
        loss_fn: ``(model, x, y) -> (logits, loss)``; default :func:`nanogpt_loss`.
        seed: the seed of the alphas (a plain model), the selection order and the scoring.
        progress: a tqdm bar on a terminal.
        selection_batches: the read-off's fixed batches; default, for D_alpha batches given as a
            list, its first batches holding ``cfg.selection_windows`` windows, and otherwise the
            next such batches of the D_alpha stream when the read-off begins. The first fixed
            batch's first ``cfg.monitor_windows`` rows are the collapse monitor's Hessian batch
            (none when the batches are drawn at the read-off: entropies only).
        valid_batches: batches on which the supernet's valid loss is measured at each
            evaluation (``valid/loss`` in TensorBoard, ``on_eval``'s metrics); default none.
        out: a run folder for ``checkpoint.pt`` (every ``checkpoint_every`` steps, at each
            evaluation, on SIGINT/SIGTERM), ``genotype.json`` and, with ``tensorboard``, the
            event files and ``alphas.png``; default none (nothing written).
        resume: continue the interrupted search in ``out`` from its checkpoint: call with the
            same model class, batches and settings; bitwise as an uninterrupted run on CPU. A
            folder without a checkpoint yet (stopped before its first) starts from step 0, as
            ``search.py --resume`` does; a folder that does not exist is refused.
        checkpoint_every: steps between checkpoints besides those at each evaluation and on
            SIGINT/SIGTERM (0: only those).
        overwrite: reuse an ``out`` that holds a finished or interrupted search.
        on_eval: ``fn(step, valid_metrics)`` after each evaluation; what it raises ends the run.
        shortlist: how many of the trained supernet's best whole genotypes by one-hot score
            (on the read-off's batches, before the read-off changes a weight) the genotype's
            provenance keeps as ``shortlist`` (``[{"sites": {site: placement}, "loss": nats/token}]``):
            the pool of :func:`autoln.race_genotypes` besides the read-off and the argmax.

    Returns:
        :class:`SearchOutcome`.

    Raises:
        ConfigError: an invalid ``cfg`` (the message names the key); with ``resume``, other
            settings than the checkpoint's.
        OutputError: ``out`` unusable, or holding a run (see ``resume``, ``overwrite``);
            its :class:`~autoln.core.errors.WriteError` when a file in ``out`` cannot be written
            for want of space (the previous checkpoint is kept; resume once there is space).
        ValueError: as :class:`SearchModel`; batches that run out at once; ``tensorboard``
            or ``resume`` without ``out``.
        DivergenceError: a NaN/inf loss under ``cfg.on_divergence: stop``.
        autoln.engine.checkpoint.Interrupted: SIGINT/SIGTERM with ``out`` (the checkpoint is written).
    """
    from contextlib import ExitStack

    from autoln.core.locks import FolderLock
    from autoln.engine.checkpoint import StopSignals, space_errors_kept

    cfg, out = check_search(model, steps, seed, shortlist, checkpoint_every, cfg, loss_fn, on_eval, out, tensorboard, resume,
                            train_batches, arch_batches, selection_batches, valid_batches)
    if not isinstance(model, SearchModel):
        torch.manual_seed(seed)
        model = SearchModel(model, loss_fn, cfg.arch_init_std, cfg.tau_start, cfg.mixing)
        set_candidate_scale(model, cfg.candidate_scale)
    travel = alpha_travel_warning(cfg, len(model.candidates))
    warnings = ([travel] if travel else []) + model.layer_notes
    for line in warnings:
        print(f"autoln.search: warning: {line}", file=sys.stderr, flush=True)
    with ExitStack() as stack:
        signals = None
        if out is not None:
            out = Path(out)
            signals = stack.enter_context(StopSignals(out / "checkpoint.pt", resume_hint(out)))
            stack.enter_context(FolderLock(out, "autoln.search"))
            stack.enter_context(space_errors_kept(out, resume_hint(out)))
        stack.enter_context(train_mode(model, root=model.model))  # each module's mode back as found; frozen ones kept
        outcome = _search(model, cfg, train_batches, arch_batches, selection_batches, valid_batches, seed, progress,
                          out, resume, overwrite, tensorboard, checkpoint_every, on_eval, signals, shortlist)
    outcome.notes[:0] = warnings
    return outcome


def _search(model: SearchModel, cfg: SearchConfig, train_batches, arch_batches, selection_batches, valid_batches, seed: int,
            progress: bool, out: Optional[Path], resume: bool, overwrite: bool, tensorboard: bool, checkpoint_every: int,
            on_eval, signals, shortlist: int = 0) -> SearchOutcome:
    """The body of :func:`search`: the loop's data and pieces, the run, the answer."""
    from dataclasses import asdict

    from autoln.oneshot.search_loop import SearchData, SearchLoop
    from autoln.oneshot.search_pieces import Checkpointing, EvalHook, Monitor, Progress, TensorBoard, resume_loop
    from autoln.core.tb import Logger
    from autoln.engine.training import evaluate_batches, prepare_out_dir

    device = model.alphas.device
    weights = BatchStream(train_batches, "train_batches", device)
    alphas = BatchStream(arch_batches, "arch_batches", device) if arch_batches is not None else weights
    d_alpha, every, offset = (arch_batches, 1, 0) if arch_batches is not None else (train_batches, 2, 1)
    d_name = "arch_batches" if arch_batches is not None else "train_batches"
    fixed = [as_pair(b, "selection_batches", i) for i, b in enumerate(selection_batches)] if selection_batches is not None \
        else first_batches(d_alpha, cfg.selection_windows, d_name, every, offset) if isinstance(d_alpha, (list, tuple)) else None
    hessian = tuple(t[:cfg.monitor_windows].to(device) for t in fixed[0]) if cfg.monitor_windows and fixed else None
    if cfg.early_stop == "hessian" and hessian is None:
        raise ValueError("autoln.search: cfg.early_stop='hessian' needs a fixed Hessian batch: pass selection_batches "
                         "(its first batch serves), or arch_batches as a list")
    drawn: list = []

    def selection() -> list:  # the read-off's fixed batches; drawn from D_alpha at the read-off when not given
        if fixed is not None:
            return fixed
        if not drawn:
            drawn.append(alphas())
            while sum(len(b[0]) for b in drawn) < cfg.selection_windows:
                drawn.append(alphas())
        return drawn

    def load(state: dict) -> None:
        weights.load_state_dict(state["w"])
        if alphas is not weights:
            alphas.load_state_dict(state["alpha"])

    data = SearchData(weights, alphas, lambda mix: evaluate_batches(model, selection(), device, mix=mix),
                      valid=(lambda: {"loss": evaluate_batches(model, valid_batches, device)}) if valid_batches is not None else None,
                      state_dict=lambda: {"w": weights.state_dict(), "alpha": alphas.state_dict()}, load_state_dict=load)
    header = {"kind": "api-search", "config": {**asdict(cfg), "seed": seed, "sites": list(model.site_names)},
              "threads": torch.get_num_threads()}
    ckpt = check_resumable(out, resume, overwrite, header) if out is not None else None
    describe = lambda choices: " ".join(model.candidates[c] for c in model.expand(choices))  # noqa: E731
    pieces: list = [Monitor(cfg.steps, hessian, cfg.early_stop == "hessian")]
    checkpointing = None
    if out is not None:
        if ckpt is None:
            prepare_out_dir(out, overwrite or resume)
        checkpointing = Checkpointing(out, checkpoint_every, signals, device, header, last_step=ckpt["step"] if ckpt else None,
                                      resume_hint=resume_hint(out))
        if tensorboard:
            start = ckpt["step"] if ckpt else 0
            pieces.append(TensorBoard(Logger(out, True, purge_step=start + 1 if start else None), out, 10, describe,
                                      intro={"settings": "```\n" + json.dumps(header["config"], indent=1, default=str) + "\n```"}))
    if on_eval is not None:
        pieces.append(EvalHook(on_eval))
    pieces.append(Progress(progress, lambda loop, stats: f"train loss {stats['loss_w']:.3f} {loss_unit(model)}"))
    loop = SearchLoop(model, cfg, data, seed=seed, callbacks=pieces, checkpointing=checkpointing, shortlist=shortlist)
    resume_loop(loop, ckpt)
    read_off = loop.run()
    genotype = site_genotype(model, read_off, loop)
    if out is not None:
        genotype.save(out / GENOTYPE_FILE)
    skipped = skipped_lines(loop, read_off)
    for line in skipped:
        print(f"autoln.search: warning: {line}", file=sys.stderr, flush=True)
    notes = skipped + genotype_notes(genotype, seed) + ([unused_note(model.unused_sites)] if model.unused_sites else [])
    if progress:
        for line in notes:
            print(f"autoln.search: note: {line}", file=sys.stderr, flush=True)
    return SearchOutcome(genotype, model, list(loop.state["losses"]), notes)


def loss_unit(model: SearchModel) -> str:
    """The unit of the progress line's train loss: ``nats/token`` for the default loss (the
    model's own loss, nanoGPT's mean cross-entropy, or the cross-entropy of its logits), else
    ``(your loss_fn's unit)``."""
    from autoln.api.search_model import nanogpt_loss

    return "nats/token" if model.loss_fn is nanogpt_loss else "(your loss_fn's unit)"


def skipped_lines(loop, read_off) -> list[str]:
    """The warnings on updates ``on_divergence: skip_batch`` skipped, in the search and in the
    read-off's fine-tuning (:func:`autoln.oneshot.search_loop.skipped_line`), as ``search.py`` gives them."""
    from autoln.oneshot.search_loop import skipped_line

    lines = [skipped_line(loop.state["skipped_batches"], loop.sc.steps),
             skipped_line(read_off.fine_tuning_skipped, read_off.fine_tuning_updates, "fine-tuning updates of the selection")]
    return [line for line in lines if line]


def site_genotype(model: SearchModel, read_off, loop) -> SiteGenotype:
    """The :class:`SiteGenotype` of a finished loop: per site its row's chosen placement and
    probabilities, with the read-off's details as provenance (loss rises in nats/token per
    site, or the scored genotypes, or the early stop)."""
    rows = model.expand(list(range(len(model.site_names))))
    names = model.module_sites
    probs = [row / row.sum() for row in np.asarray(read_off.probabilities, dtype=np.float64)]  # as search.py's genotype
    provenance: dict[str, Any] = {"steps": loop.sc.steps, "selection": read_off.method, "site_names": list(names),
                                  "skipped_batches": loop.state["skipped_batches"],
                                  "final_train_loss": loop.state["losses"][-1] if loop.state["losses"] else None,
                                  "wall_time_s": round(loop.wall_time(), 2)}
    if read_off.selection is not None:
        provenance["loss_rises"] = {n: [round(float(v), 6) for v in read_off.selection.loss_rises[r]] for n, r in zip(names, rows)}
    if read_off.scored is not None:
        provenance.update({"search": read_off.scored.method, "evaluated": read_off.scored.evaluated, "loss": read_off.scored.loss})
    if read_off.early is not None:
        provenance["early_stop"] = read_off.early
    if loop.state.get("scales"):
        provenance["candidate_scales"] = loop.state["scales"]
    if read_off.shortlist:
        provenance["shortlist"] = [{"sites": {n: model.candidates[g[r]] for n, r in zip(names, rows)}, "loss": round(float(v), 6)}
                                   for g, v in read_off.shortlist]
    qk, qk_probs = {}, {}
    if read_off.qk:  # the searched QK-norms' choices, by module name
        qk = dict(zip(model.qk_site_names, read_off.qk))
        qk_probs = {n: [float(v) for v in row / row.sum()] for n, row in zip(model.qk_site_names, read_off.qk_probabilities)}
    return SiteGenotype(list(model.candidates), {n: model.candidates[read_off.choices[r]] for n, r in zip(names, rows)},
                        {n: [float(v) for v in probs[r]] for n, r in zip(names, rows)}, provenance, qk,
                        list(model.qk_candidates) if qk else [], qk_probs)
