"""The one bilevel search loop, for ``search.py`` and ``autoln.search`` alike (docs/design.md §4).

:class:`SearchLoop` runs DARTS' Algorithm 1 on any supernet (:class:`autoln.models.supernet.Supernet`,
autoln's own model, or :class:`autoln.api.SearchModel`, a user's): each step one alpha step on
a D_alpha batch (:class:`autoln.oneshot.architect.Architect`), then one weight step on a D_w batch;
every ``eval_every`` steps an evaluation; at the end the read-off (``selection``: DARTS-PT's
perturbation with its fine-tuning, SPOS-style scoring, or DARTS' argmax). Where the batches
come from is a :class:`SearchData`; everything else a run does besides is a :class:`Callback`
it is given (the loop-with-hooks shape of PyTorch Lightning's ``Callback`` and Hugging Face's
``TrainerCallback``): checkpoints and resume (:class:`autoln.oneshot.search_pieces.Checkpointing`),
TensorBoard, the collapse monitor with R-DARTS' early stop, progress, the Optuna hook.

The loop draws random numbers in one fixed order per step (D_w batch, D_alpha batch, the
alpha step's Gumbel noise, the weight step's noise), so two callers that give it the same
model, batches and settings get bitwise the same alphas and genotype.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from autoln.oneshot.architect import WEIGHT_STEPS, Architect
from autoln.config import SearchConfig
from autoln.core.errors import DivergenceError
from autoln.space.mixing import linear
from autoln.oneshot.selection import ScoreSelection, Selection, most_scored, perturbation_select, score_select
from autoln.models.supernet import SupernetMixin
from autoln.engine.training import weight_optimizer

Batch = tuple[torch.Tensor, torch.Tensor]


def temperature(sc: SearchConfig, step: int) -> float:
    """The mixing temperature of 1-based search ``step``: linear from ``sc.tau_start`` at step 1
    to exactly ``sc.tau_end`` at step ``sc.steps`` (SNAS, GDAS)."""
    return linear(sc.tau_start, sc.tau_end, step - 1, sc.steps - 1)


def sdarts_noise(sc: SearchConfig, step: int) -> float:
    """SDARTS-RS's noise bound ``eps`` at 1-based search ``step``: linear from ``min(0.03,
    sc.sdarts_eps)`` at step 1 to ``sc.sdarts_eps`` at the last step, as the reference code
    (xiangning-chen/SmoothDARTS: ``epsilon_alpha = 0.03 + (eps_max - 0.03) * epoch / epochs``,
    ``eps_max`` 0.3; Chen & Hsieh 2020). 0 when ``sc.sdarts_eps`` is 0."""
    return linear(min(0.03, sc.sdarts_eps), sc.sdarts_eps, step - 1, sc.steps - 1)


@dataclass
class SearchData:
    """Where the loop's batches and losses come from.

    Attributes:
        weight_batch: ``() -> (x, y)``, the next D_w batch on the model's device (e.g. token ids
            ``(B, T)`` and next-token targets ``(B, T)``).
        arch_batch: ``() -> (x, y)``, the next D_alpha batch.
        selection_loss: ``(mix) -> float``, the supernet's mean loss (nats/token) on the
            read-off's fixed windows with mixing weights ``mix`` (the layout of
            :meth:`autoln.models.supernet.SupernetMixin.mixing_weights`).
        valid: ``() -> dict`` of the supernet's valid metrics (``loss`` in nats/token, and
            e.g. bits per byte) at each evaluation; None: no evaluation but the step count.
        state_dict, load_state_dict: save and restore where the batch sources stand (for
            checkpoints; the defaults keep nothing).
    """

    weight_batch: Callable[[], Batch]
    arch_batch: Callable[[], Batch]
    selection_loss: Callable[[torch.Tensor], float]
    valid: Optional[Callable[[], dict]] = None
    state_dict: Callable[[], dict] = dict
    load_state_dict: Callable[[dict], None] = lambda state: None


class Callback:
    """A piece of a search run, called by :class:`SearchLoop` at fixed points (every hook is a
    no-op here; a piece overrides the ones it needs). ``loop`` is the running loop: its
    ``model``, ``sc``, ``state`` (the run's bookkeeping, checkpointed) and ``step``."""

    def on_start(self, loop: "SearchLoop") -> None:
        """Before the first step of this session (after a resume: of the resumed part)."""

    def on_train_step(self, loop: "SearchLoop", step: int, stats: dict) -> None:
        """After the updates of ``step``: ``stats`` holds ``loss_w``, ``grad_norm``, ``loss_alpha``
        (NaN without an alpha step) in nats/token, and ``alpha_step`` (bool)."""

    def on_evaluate(self, loop: "SearchLoop", step: int) -> None:
        """At an evaluation, after ``loop.state["valid_metrics"]`` is set."""

    def on_step_end(self, loop: "SearchLoop", step: int, evaluation: bool) -> None:
        """Last thing of ``step`` (checkpoints, hooks, progress); may raise to end the run."""

    def on_skipped_batch(self, loop: "SearchLoop", step: int, skipped: int) -> None:
        """A non-finite step skipped under ``on_divergence: skip_batch``; ``skipped`` counts them
        (the search's, or the read-off's fine-tuning's)."""

    def on_read_off_start(self, loop: "SearchLoop", work: "ReadOffWork") -> None:
        """The read-off begins (after the last step): what it will do and its estimated time;
        ``loop.work_done`` counts its estimated seconds done at each :meth:`on_decided`."""

    def on_selection_start(self, loop: "SearchLoop", total: Optional[int], desc: str, unit: str) -> None:
        """A part of the read-off begins: ``total`` decisions (None: unknown) of ``unit`` s."""

    def on_decided(self, loop: "SearchLoop") -> None:
        """One decision of the read-off made (a site decided, a genotype scored)."""

    def on_selection_end(self, loop: "SearchLoop") -> None:
        """The read-off's decisions are done (or ended by an exception)."""

    def on_read_off(self, loop: "SearchLoop", read_off: "ReadOff") -> None:
        """After the read-off, before the run ends."""

    def on_close(self, loop: "SearchLoop") -> None:
        """When the run ends, normally or by an exception (close files)."""

    #: the key of the piece's own state in a checkpoint (None: it keeps none)
    key: Optional[str] = None

    def state_dict(self) -> Optional[dict]:
        """The piece's own checkpointed state (under :attr:`key`), or None for none."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


@dataclass
class ReadOff:
    """The loop's answer.

    Attributes:
        choices: per alpha row the chosen candidate's index.
        probabilities: ``(n_sites, K)`` float64, the final (or, after an early stop, the
            pre-rise) mixing probabilities.
        method: ``perturbation``, ``score`` or ``argmax``.
        final_step: the step of the answer's every record (after the read-off's fine-tuning).
        selection: perturbation's :class:`autoln.oneshot.selection.Selection`, else None.
        scored: scoring's :class:`autoln.oneshot.selection.ScoreSelection`, else None.
        selected_valid: the valid metrics of the supernet after the read-off, else None.
        fine_tuning_updates: bilevel steps of perturbation's fine-tuning.
        fine_tuning_skipped: of those, the ones skipped as non-finite.
        early: ``{"stopped_at_step", "genotype_from_step"}`` after R-DARTS' early stop, else None.
        shortlist: the supernet's best whole genotypes by one-hot score, ``(choices, loss in
            nats/token)`` best first, scored before the read-off changed any weight (the race's
            pool, :mod:`autoln.race.rule`); empty unless the loop was asked for them.
        qk: per searched QK-norm its choice, read off first by the argmax of its alphas and
            imposed one-hot during the sites' read-off; None where QK-norm is not searched.
        qk_probabilities: ``(n_qk, Q)`` float64, the QK-norms' probabilities then; None likewise.
    """

    choices: list[int]
    probabilities: np.ndarray
    method: str
    final_step: int
    selection: Optional[Selection] = None
    scored: Optional[ScoreSelection] = None
    selected_valid: Optional[dict] = None
    fine_tuning_updates: int = 0
    fine_tuning_skipped: int = 0
    early: Optional[dict] = None
    shortlist: list = field(default_factory=list)
    qk: Optional[list] = None
    qk_probabilities: Optional[np.ndarray] = None


@dataclass
class ReadOffWork:
    """What a read-off will do, for its start line and its time left: ``parts`` in words, the
    selection-loss ``evaluations`` and fine-tuning ``steps`` it runs at most, and the seconds of
    one of each (an evaluation timed before it starts, a step at the search's own rate)."""

    parts: list[str]
    evaluations: int
    steps: int
    evaluation_s: float
    step_s: float

    def seconds(self, evaluations: int = 0, steps: int = 0) -> float:
        """The estimated seconds of ``evaluations`` selection-loss evaluations and ``steps`` steps."""
        return evaluations * self.evaluation_s + steps * self.step_s

    @property
    def total_s(self) -> float:
        """The whole read-off's estimated seconds."""
        return self.seconds(self.evaluations, self.steps)


def unscored_batch(batches: dict) -> Optional[str]:
    """The line on a batch of ``batches`` (name -> ``(x, y)``, ``y`` ``(B, T)`` targets) whose
    every target is ignored (negative: nanoGPT's ``-1``, PyTorch's ``ignore_index=-100``), so a
    mean cross-entropy over it is 0/0 = NaN; None when each batch has a target to score."""
    for name, (_, y) in batches.items():
        if isinstance(y, torch.Tensor) and y.numel() and not bool((y >= 0).any()):
            return (f"the {name} batch has no target to score (all {y.numel()} targets are negative, ignored by the loss, as "
                    "nanoGPT's -1 padding), so its mean loss is 0/0 = nan")
    return None


def skipped_line(skipped: int, steps: int, what: str = "updates") -> Optional[str]:
    """The warning on updates skipped under ``on_divergence: skip_batch`` (None for none):
    ``skipped`` of ``steps`` ``what``, and that the run diverged when they are more than half."""
    if not skipped:
        return None
    return (f"{skipped} of {steps} {what} were skipped (NaN/inf loss or gradient, on_divergence=skip_batch)"
            + ("; the run diverged and its numbers mean little" if skipped > steps // 2 else ""))


def new_state() -> dict:
    """The loop's bookkeeping at step 0 (kept in checkpoints as ``state``)."""
    return {"valid_metrics": {}, "record": {}, "stopped_at": None, "skipped_batches": 0, "wall_time_s": 0.0,
            "alpha_history": [], "losses": [], "early": None}


@dataclass
class SearchLoop:
    """The bilevel search on ``model`` with settings ``sc`` (see the module docstring).

    Args:
        model: a supernet (:class:`autoln.models.supernet.SupernetMixin`), on its device.
        sc: :class:`autoln.config.SearchConfig` (validated).
        data: :class:`SearchData`.
        seed: the seed of the perturbation order (``np.random.default_rng([seed, 6])``) and of
            the scoring's evolution.
        callbacks: the run's pieces, called in order.
        checkpointing: the piece that writes checkpoints and watches for stop signals, or None
            (it is also a callback; the loop asks it where the last good checkpoint is).
        weight_step, perturbation_select, score_select: the weight update and the read-offs
            (default ``search.weight_mode``'s step of :data:`autoln.oneshot.architect.WEIGHT_STEPS` and
            :mod:`autoln.oneshot.selection`'s), as arguments so that a new supernet training mode or
            read-off is one function given here.

    Raises (from :meth:`run`):
        DivergenceError: a NaN/inf loss or gradient under ``on_divergence: stop``.
        whatever a callback raises (e.g. :class:`autoln.engine.checkpoint.Interrupted`).
    """

    model: SupernetMixin
    sc: SearchConfig
    data: SearchData
    seed: int = 0
    callbacks: Sequence[Callback] = ()
    checkpointing: Any = None
    state: dict = field(default_factory=new_state)
    start: int = 0
    weight_step: Optional[Callable] = None
    perturbation_select: Callable = perturbation_select
    score_select: Callable = score_select
    shortlist: int = 0

    def __post_init__(self) -> None:
        if self.weight_step is None:
            self.weight_step = WEIGHT_STEPS[self.sc.weight_mode]
        self.opt_w, self.sched_w = weight_optimizer(self.model.named_weight_parameters(), self.sc)
        self.architect = Architect(self.model, self.sc)
        self.session = time.perf_counter()  # reset when :meth:`run` starts
        self.batches: dict = {}  # the last bilevel step's D_w and D_alpha batches
        self.pieces = [*([self.checkpointing] if self.checkpointing is not None else []), *self.callbacks]
        self.step_s: Optional[float] = None  # seconds per search step in this session (the read-off's estimate)
        self.work: Optional[ReadOffWork] = None
        self.work_done = 0.0  # the read-off's estimated seconds done so far

    def emit(self, hook: str, *args) -> None:
        """Call ``hook`` of every piece, in order."""
        for piece in self.pieces:
            getattr(piece, hook)(self, *args)

    def state_dict(self) -> dict:
        """Everything the next step depends on but the random states (the checkpoint's body)."""
        body = {"model": self.model.state_dict(), "weight_optimizer": self.opt_w.state_dict(),
                "weight_scheduler": self.sched_w.state_dict(), "architect": self.architect.state_dict(),
                "samplers": self.data.state_dict(), "state": dict(self.state)}
        return {**body, **{p.key: p.state_dict() for p in self.pieces if p.key is not None}}

    def load_state_dict(self, ckpt: dict) -> None:
        """Continue from a checkpoint of :meth:`state_dict` (with ``step``) and the pieces' own
        states; the caller restores the random states."""
        self.model.load_state_dict(ckpt["model"])
        self.opt_w.load_state_dict(ckpt["weight_optimizer"])
        self.sched_w.load_state_dict(ckpt["weight_scheduler"])
        self.architect.load_state_dict(ckpt["architect"])
        self.data.load_state_dict(ckpt["samplers"])
        self.state = {**new_state(), **ckpt["state"]}
        self.start = ckpt["step"]
        for piece in self.pieces:
            if piece.key is not None and piece.key in ckpt:
                piece.load_state_dict(ckpt[piece.key])
        self.model.tau = temperature(self.sc, self.start)  # what the checkpointed step used

    def wall_time(self) -> float:
        """Seconds of bilevel steps and read-off so far, over every session of a resumed run."""
        return self.state["wall_time_s"] + time.perf_counter() - self.session

    def diverged(self, step: int, what: str, state: dict) -> None:
        """Apply ``search.on_divergence`` to a non-finite step (its update was not applied). The
        message names the cause where the step's batches show it (:func:`unscored_batch`: a
        batch with no target to score), else suggests the learning rate and warm-up."""
        if self.sc.on_divergence == "stop":
            where = self.checkpointing.describe() if self.checkpointing is not None else "no checkpoint was written before it"
            new = self.checkpointing.ckpts.new_run() if self.checkpointing is not None else ""
            cause = unscored_batch(self.batches)
            if cause:
                raise DivergenceError(f"search diverged at step {step}: {what}; {where}. The cause is the batch, not the "
                                      f"learning rate: {cause}; leave such batches out of the search's batches (a window of "
                                      "padding only has nothing to predict), or set search.on_divergence=skip_batch")
            raise DivergenceError(f"search diverged at step {step}: {what}; {where}. Try a new run{new} with a lower search.lr "
                                  "or more search.warmup_steps, or search.on_divergence=skip_batch")
        state["skipped_batches"] += 1
        self.emit("on_skipped_batch", step, state["skipped_batches"])

    def bilevel_step(self, step: int, alpha_step: bool, noise: float, arch_step: int) -> dict:
        """One alpha step (when ``alpha_step``), then one weight step with SDARTS noise ``noise``."""
        batch_w, batch_a = self.data.weight_batch(), self.data.arch_batch()
        self.batches = {"D_w": batch_w, "D_alpha": batch_a}  # the last step's, for :meth:`diverged`
        loss_a = math.nan
        if alpha_step:
            loss_a = self.architect.step(batch_w, batch_a, xi=self.sched_w.get_last_lr()[0], step=arch_step)
        loss_w, grad_norm = self.weight_step(self.model, self.opt_w, self.sched_w, *batch_w, self.sc.grad_clip, noise=noise)
        return {"loss_w": loss_w, "grad_norm": grad_norm, "loss_alpha": loss_a, "alpha_step": alpha_step}

    def run(self) -> ReadOff:
        """The steps from :attr:`start` to ``sc.steps`` (none after an early stop's checkpoint),
        then the read-off. Returns :class:`ReadOff`."""
        sc = self.sc
        self.session = time.perf_counter()
        try:
            self.emit("on_start")
            todo = range(self.start + 1, sc.steps + 1) if self.state["stopped_at"] is None else range(0)
            began, ran = time.perf_counter(), 0
            for step in todo:
                ran += 1
                self.step = step
                self.model.tau = temperature(sc, step)
                alpha_step = step > sc.arch_warmup_steps and sc.arch_lr > 0  # arch_lr 0: alphas fixed at their start
                stats = self.bilevel_step(step, alpha_step, sdarts_noise(sc, step), step)
                self.state["losses"].append(stats["loss_w"])
                if not (math.isfinite(stats["loss_w"]) and math.isfinite(stats["grad_norm"])) or (
                        alpha_step and not math.isfinite(stats["loss_alpha"])):
                    what = f"L_w={stats['loss_w']}, weight grad norm={stats['grad_norm']}" + (
                        f", L_alpha (or its gradient)={stats['loss_alpha']}" if alpha_step else "")
                    self.diverged(step, what, self.state)
                self.emit("on_train_step", step, stats)
                evaluation = step % sc.eval_every == 0 or step == sc.steps
                if evaluation:
                    if self.data.valid is not None:
                        self.state["valid_metrics"] = self.data.valid()
                    self.emit("on_evaluate", step)
                self.emit("on_step_end", step, evaluation)
                if self.state["stopped_at"] is not None:
                    break
            self.step_s = (time.perf_counter() - began) / ran if ran else None
            return self.read_off()
        finally:
            self.emit("on_close")

    def read_off(self) -> ReadOff:
        """The genotype per ``sc.selection`` (argmax of the pre-rise alphas after an early stop)."""
        sc, stopped = self.sc, self.state["stopped_at"]
        qk_probs = self.model.qk_probabilities() if self.model.qk_alphas is not None else None
        qk = self.model.fix_qk() or None  # the QK-norm first (DARTS' argmax), one-hot while the sites are read off
        self.work, self.work_done = self.read_off_work(), 0.0
        if self.work is not None:
            self.emit("on_read_off_start", self.work)
        shortlist = self.scored_shortlist() if self.shortlist and sc.selection != "score" else []
        if stopped is not None:  # R-DARTS returns the architecture from before the rise, as it was then
            step, probs = self.state["early"]  # set by the piece that stopped it (the collapse monitor)
            probs = np.asarray(probs, dtype=np.float64)
            out = ReadOff([int(i) for i in probs.argmax(-1)], probs, "argmax", stopped,
                          early={"stopped_at_step": stopped, "genotype_from_step": step})
        elif sc.selection == "perturbation":
            out = self.perturbation()
        elif sc.selection == "score":
            out = self.score()
        else:
            choices = [int(i) for i in self.model.alphas.detach().argmax(-1).tolist()]
            self.model.projected = dict(enumerate(choices))
            out = ReadOff(choices, self.model.probabilities(), "argmax", sc.steps)
        if out.method != "argmax" and self.data.valid is not None:
            out.selected_valid = self.data.valid()
        out.shortlist = shortlist or (out.scored.top[:self.shortlist] if out.scored is not None else [])
        out.qk, out.qk_probabilities = qk, qk_probs
        self.emit("on_read_off", out)
        return out

    def read_off_work(self) -> Optional[ReadOffWork]:
        """What :meth:`read_off` will do (None: nothing but an argmax), one selection-loss
        evaluation timed on the supernet as it stands (no weight, alpha or random state changes)."""
        sc, k, n = self.sc, len(self.model.candidates), self.model.alphas.shape[0]
        parts, evaluations, steps = [], 0, 0
        if self.shortlist and sc.selection != "score":
            parts.append(f"scoring up to {most_scored(k, n)} genotypes for the race's shortlist")
            evaluations += most_scored(k, n)
        if self.state["stopped_at"] is None and sc.selection == "perturbation":
            parts.append(f"perturbation selection of {n} sites ({k + 1} loss evaluations each, "
                         f"{sc.selection_tune_steps} fine-tuning steps between two)")
            evaluations, steps = evaluations + n * (k + 1), (n - 1) * sc.selection_tune_steps
        elif self.state["stopped_at"] is None and sc.selection == "score":
            parts.append(f"scoring up to {most_scored(k, n)} genotypes")
            evaluations += most_scored(k, n)
        if not parts:
            return None
        began = time.perf_counter()
        with torch.no_grad():
            self.data.selection_loss(self.model.mixing_weights())
        fallback = self.state["wall_time_s"] / self.start if self.start else 0.0  # a run resumed after its last step
        return ReadOffWork(parts, evaluations, steps, time.perf_counter() - began,
                           self.step_s if self.step_s is not None else fallback)

    def scored_shortlist(self) -> list:
        """The best :attr:`shortlist` whole genotypes of the trained supernet by one-hot score
        (:func:`autoln.oneshot.selection.score_select` on the read-off's windows), before any read-off
        changes a weight; the model is left unprojected."""
        try:
            scored = self.scored("while scoring the race's shortlist", "scoring the shortlist")
        finally:
            self.model.projected = {}
        return scored.top[:self.shortlist]

    def scored(self, while_: str, desc: str):
        """:func:`autoln.oneshot.selection.score_select` on the read-off's windows, a progress tick and a
        stop check after each genotype (``while_`` says where a stop came, ``desc`` names the bar)."""
        where = f"{while_} (which starts again from the checkpoint of the search's last step)"
        self.set_stop_when(where)
        k, n = len(self.model.candidates), self.model.alphas.shape[0]
        self.emit("on_selection_start", most_scored(k, n), desc, "genotype")

        def scored_one(_: int) -> None:
            self.work_done += self.work.evaluation_s if self.work is not None else 0.0
            self.emit("on_decided")
            self.stop_if_signalled(where)

        try:
            return self.score_select(self.model, self.data.selection_loss, self.seed, progress=scored_one)
        finally:
            self.emit("on_selection_end")

    def perturbation(self) -> ReadOff:
        """DARTS-PT (Wang et al. 2021): every site decided in a random order drawn from the seed,
        ``sc.selection_tune_steps`` bilevel steps between two decisions, numbered on from the
        search's last."""
        sc, tuned, tune_state = self.sc, [0], {"skipped_batches": 0}

        def tune() -> None:
            for _ in range(sc.selection_tune_steps):
                tuned[0] += 1
                s = self.bilevel_step(sc.steps, sc.arch_lr > 0, sc.sdarts_eps, sc.steps)
                loss_a = s["loss_alpha"] if sc.arch_lr > 0 else 0.0
                if not all(math.isfinite(v) for v in (loss_a, s["loss_w"], s["grad_norm"])):
                    self.diverged(sc.steps + tuned[0], f"L_w={s['loss_w']}, L_alpha={loss_a} (fine-tuning of "
                                  "perturbation-based selection)", tune_state)
            self.stop_if_signalled("during perturbation-based selection (which starts again from the checkpoint of the "
                            "search's last step)")
            self.work_done += self.work.seconds(len(self.model.candidates) + 1, sc.selection_tune_steps) if self.work else 0.0
            self.emit("on_decided")

        self.set_stop_when("after this site's decision and fine-tuning (the selection starts again from the checkpoint of "
                       "the search's last step)")
        order = [int(i) for i in np.random.default_rng([self.seed, 6]).permutation(len(self.model.site_names))]
        self.emit("on_selection_start", len(order), "perturbation selection", "site")
        try:
            selection = self.perturbation_select(self.model, self.data.selection_loss, tune, order)
            self.work_done += self.work.seconds(len(self.model.candidates) + 1) if self.work else 0.0
            self.emit("on_decided")
        finally:
            self.emit("on_selection_end")
        return ReadOff(selection.choices, self.model.probabilities(), "perturbation", sc.steps + tuned[0],
                       selection=selection, fine_tuning_updates=tuned[0], fine_tuning_skipped=tune_state["skipped_batches"])

    def score(self) -> ReadOff:
        """Genotype scoring (SPOS, Guo et al. 2020): whole genotypes imposed one-hot, the lowest
        selection loss wins; no weight changes."""
        scored = self.scored("during genotype scoring", "scoring genotypes")
        return ReadOff(scored.choices, self.model.probabilities(), "score", self.sc.steps, scored=scored)

    def set_stop_when(self, when: str) -> None:
        """Tell the checkpointing piece what a stop signal does from now on."""
        if self.checkpointing is not None:
            self.checkpointing.signals.when = when

    def stop_if_signalled(self, where: str) -> None:
        """Stop here (raise :class:`autoln.engine.checkpoint.Interrupted`) when a stop signal came."""
        if self.checkpointing is not None:
            self.checkpointing.stop_if_signalled(where)
