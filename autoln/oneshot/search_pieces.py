"""The pieces a search run gives :class:`autoln.oneshot.search_loop.SearchLoop` (its callbacks).

- :class:`Checkpointing`: ``checkpoint.pt`` every ``checkpoint.every`` steps, at each
  evaluation and on SIGINT/SIGTERM (:class:`autoln.engine.checkpoint.StopSignals`), for an exact
  resume (:func:`resume_loop`);
- :class:`TensorBoard`: scalars, the alphas, the genotype and the read-off's tables
  (:class:`autoln.core.tb.Logger`), and at the end ``alphas.png`` and ``alphas_heatmap.png``;
- :class:`Monitor`: the collapse monitor (:class:`autoln.oneshot.monitor.CollapseMonitor`) and R-DARTS'
  early stop (Zela et al. 2020);
- :class:`EvalHook`: a function called after each evaluation (the Optuna outer loop's
  intermediate values and pruning);
- :class:`Progress`: a tqdm bar on a terminal, one line per evaluation in a redirected log.

``search.py`` and ``autoln.search`` build their runs from these same pieces.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from autoln.engine.checkpoint import Checkpointer, StopSignals, set_rng_state
from autoln.oneshot.monitor import DELTA, RATIO, WINDOW, CollapseMonitor
from autoln.oneshot.search_loop import Callback, ReadOff, SearchLoop
from autoln.core.tb import Logger, write_alpha_pictures
from autoln.engine.training import TimeLeft, progress_bar, progress_line


def genotype_markdown(probs: np.ndarray, sites: list[str], candidates: list[str], chosen: Optional[list[int]] = None) -> str:
    """A Markdown table: one row per site, its probabilities ``(n_sites, K)`` and its chosen
    placement (``chosen``: per site a candidate index; default the argmax)."""
    chosen = [int(np.argmax(row)) for row in probs] if chosen is None else chosen
    head = "| site | " + " | ".join(candidates) + " | chosen |\n|---|" + "---|" * (len(candidates) + 1) + "\n"
    rows = [f"| {s} | " + " | ".join(f"{v:.3f}" for v in row) + f" | **{candidates[c]}** |"
            for s, row, c in zip(sites, probs, chosen)]
    return head + "\n".join(rows)


def selection_markdown(selection, sites: list[str], candidates: list[str]) -> str:
    """A Markdown table of perturbation-based selection (:class:`autoln.oneshot.selection.Selection`):
    per site the loss rise (nats/token) when each candidate is removed, the decision order and
    the chosen candidate."""
    head = ("Loss rise (nats/token) of the supernet when a candidate is removed; the largest rise wins.\n\n"
            "| site | " + " | ".join(candidates) + " | decided | chosen |\n|---|" + "---|" * (len(candidates) + 2) + "\n")
    rank = {site: i + 1 for i, site in enumerate(selection.order)}
    rows = [f"| {s} | " + " | ".join(f"{v:+.4f}" for v in row) + f" | {rank[i]} | **{candidates[selection.choices[i]]}** |"
            for i, (s, row) in enumerate(zip(sites, selection.loss_rises))]
    return head + "\n".join(rows)


def score_markdown(scored, describe: Callable[[list[int]], str]) -> str:
    """A Markdown table of genotype scoring (:class:`autoln.oneshot.selection.ScoreSelection`): the best
    genotypes (named by ``describe(choices)``) and their one-hot supernet loss."""
    head = (f"Genotypes scored by the supernet ({scored.method}, {scored.evaluated} scored): loss (nats/token) with the "
            "genotype imposed one-hot; the lowest wins.\n\n| rank | genotype | loss |\n|---|---|---|\n")
    return head + "\n".join(f"| {i + 1} | {describe(g)} | {v:.4f} |" for i, (g, v) in enumerate(scored.top))


class Checkpointing(Callback):
    """Checkpoints of a search run (and the stop signals' watch), as :mod:`autoln.engine.checkpoint`.

    Args:
        out: the run folder (the file is ``out/checkpoint.pt``).
        every: ``checkpoint.every`` (0: only at evaluations and on signals).
        signals: the run's :class:`autoln.engine.checkpoint.StopSignals`.
        device: where the model is (under ``torchrun`` a signal on any process stops all).
        header: what every checkpoint carries besides the loop's state (``kind``, ``config``).
        write: False on processes that do not write (``torchrun`` ranks above 0).
        last_step: the step of the checkpoint a resumed run started from.
        resume_hint: how to continue, for the stop messages (default: the command with --resume).
    """

    def __init__(self, out: Path, every: int, signals: StopSignals, device: torch.device, header: dict,
                 write: bool = True, last_step: Optional[int] = None, resume_hint: Optional[str] = None) -> None:
        self.ckpts = Checkpointer(Path(out), every, write, last_step, resume_hint)
        self.signals, self.device, self.header = signals, device, header

    def save(self, loop: SearchLoop, step: int) -> None:
        """Write the checkpoint of ``step`` now."""
        body = loop.state_dict()
        body["state"] = {**body["state"], "wall_time_s": loop.wall_time()}
        self.ckpts.save(step, {**self.header, "step": step, **body})

    def on_start(self, loop: SearchLoop) -> None:
        self.stop_if_signalled(f"before step {self.ckpts.next_step}")
        self.signals.when = StopSignals.IN_STEPS

    def on_step_end(self, loop: SearchLoop, step: int, evaluation: bool) -> None:
        self.ckpts.end_step(step, evaluation, self.signals, self.device, lambda s: self.save(loop, s))

    def stop_if_signalled(self, where: str) -> None:
        """Raise :class:`autoln.engine.checkpoint.Interrupted` when a stop signal came (``where``: for
        the message)."""
        self.ckpts.stop_if_signalled(self.signals, self.device, where)

    def describe(self) -> str:
        """Where the last good checkpoint is, for messages."""
        return self.ckpts.describe()


def resume_loop(loop: SearchLoop, ckpt: Optional[dict]) -> None:
    """Continue ``loop`` from ``ckpt`` (a checkpoint of :class:`Checkpointing`, with the random
    states), bitwise as an uninterrupted run on CPU; nothing when ``ckpt`` is None."""
    if ckpt is None:
        return
    loop.load_state_dict(ckpt)
    set_rng_state(ckpt["rng"])


class Monitor(Callback):
    """The collapse monitor at every evaluation (entropies, genotype changes and, with a fixed
    Hessian ``batch``, the alpha Hessian's largest eigenvalue and each site's candidate output
    RMS and share of the mixture on that batch, :func:`autoln.models.site.candidate_scales`, kept over
    the search in ``loop.state["scales"]``), with R-DARTS' early stop when
    ``early_stop``: the loop stops and returns the architecture of ``DELTA`` evaluations before
    the rise (:meth:`autoln.oneshot.monitor.CollapseMonitor.before_rise`). Its record is
    ``loop.state["record"]``. ``announce``: prints the stop's one line (the main process's)."""

    key = "monitor"

    def __init__(self, total_steps: int, batch=None, early_stop: bool = False,
                 announce: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> None:
        self.monitor = CollapseMonitor(total_steps=total_steps)
        self.batch, self.early_stop, self.announce = batch, early_stop, announce

    def state_dict(self) -> dict:
        return asdict(self.monitor)

    def load_state_dict(self, state: dict) -> None:
        self.monitor = CollapseMonitor(**state)

    def on_start(self, loop: SearchLoop) -> None:
        if loop.state["stopped_at"] is not None and loop.state.get("early") is None:  # a checkpoint made before "early" was kept
            loop.state["early"] = list(self.monitor.before_rise())

    def on_evaluate(self, loop: SearchLoop, step: int) -> None:
        record = self.monitor.update(loop.model, self.batch, step)
        if self.batch is not None:  # each candidate's output scale and share of the mixture (docs/design.md)
            from autoln.models.site import candidate_scales

            record["scales"] = candidate_scales(loop.model, self.batch[0], lambda x: loop.model(x))
            loop.state.setdefault("scales", []).append({"step": step, "sites": record["scales"]})
        loop.state["record"] = record
        if self.early_stop and record.get("stop"):
            loop.state["stopped_at"] = step
            loop.state["early"] = list(self.monitor.before_rise())

    def on_step_end(self, loop: SearchLoop, step: int, evaluation: bool) -> None:
        if loop.state["stopped_at"] == step:
            self.announce(f"early stop (R-DARTS) at step {step}: the Hessian eigenvalue's {WINDOW}-evaluation average "
                          f"rose above {RATIO} x its value {DELTA} evaluations earlier; the genotype is the one of step "
                          f"{loop.state['early'][0]}, before the rise")


def own_site_tag(module_name: str) -> str:
    """A site of autoln's own model as its alpha tags spell blocks: ``blocks.0.attn_site`` ->
    ``block0.attn`` (the attention site of block 0, whose alpha row is ``block0`` at granularity
    ``layer`` and ``block0.attn`` at ``sublayer``); any other name as it is."""
    match = re.fullmatch(r"blocks\.(\d+)\.(attn|ffn)_site", module_name)
    return f"block{match[1]}.{match[2]}" if match else module_name


class TensorBoard(Callback):
    """What a search logs (tags as docs/tensorboard.md): ``train/*``, ``lr/*``, ``search/tau``,
    ``alpha/<site>/<candidate>`` and the heat map, ``valid/*``, ``monitor/*``, ``entropy/<site>``,
    the genotype, the read-off's tables, ``valid_selected/*``; at the end ``alphas.png`` and
    ``alphas_heatmap.png`` in ``out`` (when ``pictures``). ``intro``: texts (tag -> Markdown)
    logged at step 0 of a new run. ``describe(choices)``: a genotype's one-line name.
    ``site_tag(module_name)``: a searched site's name in the tags ``scale/<site>/<candidate>`` and
    ``share/<site>/<candidate>``, spelled as the alpha tags spell sites (default the module name,
    which is a user's model's site name; :func:`own_site_tag` for autoln's own model)."""

    def __init__(self, log: Logger, out: Path, log_every: int, describe: Callable[[list[int]], str],
                 intro: Optional[dict] = None, pictures: bool = True, site_tag: Callable[[str], str] = str) -> None:
        self.log, self.out, self.log_every, self.describe = log, Path(out), log_every, describe
        self.intro, self.pictures, self.site_tag = intro or {}, pictures, site_tag

    def on_start(self, loop: SearchLoop) -> None:
        model, log = loop.model, self.log
        log.layout(model.site_names, model.candidates)  # no event of a step: purge_step keeps it on resume
        if not loop.start:
            for tag, text in self.intro.items():
                log.text(tag, text)
            log.alphas(model.probabilities(), model.site_names, model.candidates, 0, image=True)
            loop.state["alpha_history"].append([0, model.probabilities().tolist()])

    def on_train_step(self, loop: SearchLoop, step: int, stats: dict) -> None:
        model, log, sc = loop.model, self.log, loop.sc
        if step % self.log_every == 0:
            log.scalars({"loss": stats["loss_w"], "grad_norm": stats["grad_norm"]}, step, "train")
            if math.isfinite(stats["loss_alpha"]):
                log.scalar("train/loss_alpha", stats["loss_alpha"], step)
            log.scalar("lr/weights", loop.sched_w.get_last_lr()[0], step)
            log.scalar("lr/alphas", loop.architect.optimizer.param_groups[0]["lr"], step)
            log.scalar("search/tau", model.tau, step)
        evaluation = step % sc.eval_every == 0 or step == sc.steps
        if step % self.log_every == 0 or evaluation:
            log.alphas(model.probabilities(), model.site_names, model.candidates, step, image=evaluation)
            loop.state["alpha_history"].append([step, model.probabilities().tolist()])
            if model.qk_alphas is not None:  # the QK-norm's own alphas: scalars alpha/<block>.qk/<candidate>
                log.alphas(model.qk_probabilities(), model.qk_site_names, model.qk_candidates, step)

    def on_evaluate(self, loop: SearchLoop, step: int) -> None:
        model, log, record = loop.model, self.log, loop.state["record"]
        if loop.state["valid_metrics"]:
            log.scalars(loop.state["valid_metrics"], step, "valid")
        log.text("genotype", genotype_markdown(model.probabilities(), model.site_names, model.candidates), step)
        if "eigenvalue" in record:
            log.scalar("monitor/hessian_eigenvalue", record["eigenvalue"], step)
            log.scalar("monitor/hessian_eigenvalue_smoothed", record["eigenvalue_smoothed"], step)
        if record:
            for site, h in zip(model.site_names, record["entropy"]):
                log.scalar(f"entropy/{site}", h, step)
            log.scalar("monitor/mean_entropy", record["mean_entropy"], step)
            log.scalar("monitor/genotype_changed", float(record["genotype_changed"]), step)
        for site, scales in record.get("scales", {}).items():
            log.scalars(scales["rms"], step, f"scale/{self.site_tag(site)}")
            log.scalars(scales["share"], step, f"share/{self.site_tag(site)}")
        log.flush()

    def on_skipped_batch(self, loop: SearchLoop, step: int, skipped: int) -> None:
        self.log.scalar("train/skipped_batches", skipped, step)

    def on_read_off(self, loop: SearchLoop, read_off: ReadOff) -> None:
        model, log, step = loop.model, self.log, read_off.final_step
        if read_off.selection is not None:
            for site, row in zip(model.site_names, read_off.selection.loss_rises):
                log.scalars({cand: float(v) for cand, v in zip(model.candidates, row)}, step, f"selection/{site}")
            log.text("selection", selection_markdown(read_off.selection, model.site_names, model.candidates), step)
        if read_off.selected_valid is not None:
            log.scalars(read_off.selected_valid, step, "valid_selected")
        if read_off.selection is not None:  # the alphas went on training during the fine-tuning: where they ended
            log.alphas(model.probabilities(), model.site_names, model.candidates, step, image=True, chosen=read_off.choices)
        if read_off.scored is not None:
            log.text("selection", score_markdown(read_off.scored, self.describe), step)
        chosen = None if read_off.method == "argmax" else read_off.choices
        if self.pictures:  # pictures a user can open without TensorBoard: the alphas' curves and the heat map
            history = [*loop.state.get("alpha_history", []), [step, read_off.probabilities.tolist()]]
            write_alpha_pictures(self.out, history, model.site_names, model.candidates, chosen, log, step,
                                 loop.state["stopped_at"] or loop.sc.steps)
        log.text("genotype", f"final ({loop.sc.selection}): "
                 f"`{self.describe(read_off.choices)}`\n\n"
                 + genotype_markdown(read_off.probabilities, model.site_names, model.candidates, chosen), step)

    def on_close(self, loop: SearchLoop) -> None:
        self.log.close()


class EvalHook(Callback):
    """``fn(step, valid_metrics)`` after each evaluation's checkpoint (not at an early stop's
    step); whatever it raises ends the run (the Optuna outer loop prunes through it)."""

    def __init__(self, fn: Callable[[int, dict], None]) -> None:
        self.fn = fn

    def on_step_end(self, loop: SearchLoop, step: int, evaluation: bool) -> None:
        if evaluation and loop.state["stopped_at"] is None:
            self.fn(step, loop.state["valid_metrics"])


class Progress(Callback):
    """A tqdm bar over the steps and over the read-off's decisions (on a terminal), and one line
    per evaluation in a redirected log; the read-off says when it starts (what it does and its
    estimated time) and when it ends, and in a redirected log up to about ten lines per part
    with the read-off's time left. ``describe(loop, stats)``: the bar's text after a step (e.g.
    the training and valid loss and the current argmax)."""

    def __init__(self, show: bool, describe: Callable[[SearchLoop, dict], str]) -> None:
        self.show, self.describe = show, describe
        self.bar = self.selection_bar = None
        self.stats: dict = {}
        self.read_off_left: Optional[TimeLeft] = None
        self.part = ("", None, "", 0)  # the read-off's current part: its name, total, unit, decisions made

    def on_start(self, loop: SearchLoop) -> None:
        done = loop.state["stopped_at"] is not None
        self.bar = progress_bar(show=self.show, desc="search", unit="step", initial=loop.sc.steps if done else loop.start,
                                total=loop.sc.steps)

    def on_train_step(self, loop: SearchLoop, step: int, stats: dict) -> None:
        self.stats = stats

    def on_step_end(self, loop: SearchLoop, step: int, evaluation: bool) -> None:
        self.bar.update(1)
        if not self.show or loop.state["stopped_at"] is not None:
            return
        text = self.describe(loop, self.stats)
        self.bar.set_postfix_str(text)
        if evaluation:
            progress_line(self.show, f"search step {step}/{loop.sc.steps}: {text} ({self.bar.time_left.text(step)} for the steps, "
                                     "then the read-off)")

    def on_read_off_start(self, loop: SearchLoop, work) -> None:
        self.close_bar()
        self.read_off_left = TimeLeft(0, work.total_s)
        if self.show:
            print(f"read-off: {'; then '.join(work.parts)}: about {tqdm.format_interval(work.total_s)} (a loss evaluation "
                  f"takes {work.evaluation_s:.3g} s, a step {work.step_s:.3g} s)", file=sys.stderr, flush=True)

    def on_selection_start(self, loop: SearchLoop, total: Optional[int], desc: str, unit: str) -> None:
        self.close_bar()
        self.selection_bar = progress_bar(show=self.show, total=total, desc=desc, unit=unit)
        self.part = (desc, total, unit, 0)

    def on_decided(self, loop: SearchLoop) -> None:
        if self.selection_bar is not None:
            self.selection_bar.update(1)
        desc, total, unit, done = self.part
        self.part = (desc, total, unit, done + 1)
        every = 1 if not total or total <= 20 else math.ceil(total / 10)
        if self.read_off_left is not None and ((done + 1) % every == 0 or done + 1 == total):
            progress_line(self.show, f"read-off: {desc} {done + 1}{f'/{total}' if total else ''} {unit}s "
                                     f"({self.read_off_left.text(loop.work_done)} for the read-off)")

    def on_read_off(self, loop: SearchLoop, read_off: ReadOff) -> None:
        if self.read_off_left is not None and self.show:
            spent = self.read_off_left.clock() - self.read_off_left.t0
            print(f"read-off: done in {tqdm.format_interval(spent)} (estimated "
                  f"{tqdm.format_interval(self.read_off_left.total)})", file=sys.stderr, flush=True)

    def on_selection_end(self, loop: SearchLoop) -> None:
        if self.selection_bar is not None:
            self.selection_bar.close()
            self.selection_bar = None

    def close_bar(self) -> None:
        """Close the steps' bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_close(self, loop: SearchLoop) -> None:
        self.close_bar()
        self.on_selection_end(loop)

