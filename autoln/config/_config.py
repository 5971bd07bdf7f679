"""Configuration: one dataclass per section, loaded from YAML with ``--set`` overrides.

A config file has the sections ``data``, ``model``, ``search``, ``retrain``, ``tune``,
``checkpoint`` and ``logging`` (every section and key is optional; missing ones take the defaults below, which are
the CPU defaults of ``configs/search.yaml``). One file serves ``search.py`` (and its ``--tune``
outer loop) and ``retrain.py``.

Overrides are ``section.key=value`` strings whose value is parsed as YAML, e.g.
``--set search.steps=200`` or ``--set model.candidates=[pre,post]``.

Errors: every problem raises :class:`autoln.core.errors.ConfigError` naming the key
(``model.d_model``) and, for files, the file.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from autoln.core.errors import ConfigError, cut, quoted
from autoln.space.placements import FIXED, NORMS, PLACEMENTS, RESIDUAL_INITS, parse_name, placement_names

TOKENIZERS = ("bytes", "chars", "words", "bpe", "tokens")
#: ``data.token_dtype``: the width of a token folder's ids (:func:`autoln.data.token_width`).
TOKEN_DTYPES = ("auto", "uint16", "uint32")
SCHEDULE_NAMES = ("cosine", "inverse_sqrt", "constant")
PRECISIONS = ("auto", "fp32", "bf16")
DIVERGENCE_POLICIES = ("stop", "skip_batch")
#: ``model.affine``: the norms' elementwise gain and bias learnable, fixed at 1 and 0, or searched per site.
AFFINES = ("learnable", "fixed", "search")
GRANULARITIES = ("layer", "sublayer")
OUTPUT_BIASES = ("unigram", "none")
#: Characters a string value of a config may have (Linux's PATH_MAX): every string key is a path, a
#: URL, a name or one of a few words, and a run copies the config into its ``config.yaml``,
#: checkpoints, TensorBoard text and genotype, so a longer one is refused on read, naming the key.
MAX_STRING = 4096
#: Characters of YAML the resolved config of a file and ``--set`` may take (the defaults take
#: about 2,000; a long ``tune.space`` a few thousand): checked after validation, naming the
#: largest key, so no list (``tune.space`` choices) makes every run's copies large.
MAX_CONFIG_YAML = 65_536


@dataclass
class DataConfig:
    """Where the text comes from and how it is tokenised and split (docs/design.md §8, §4).

    ``corpus``: ``"stdlib"`` (the Python standard library's source, the default), a text file,
    a folder in the WikiText layout (``train.txt``, ``valid.txt``, ``test.txt``), or a short
    name fetched by Hugging Face ``datasets`` (``wikitext-2``, ``wikitext-103``, their ``-raw``
    forms: :data:`autoln.data.HF_CORPORA`; an existing path of that name wins).
    ``valid_fraction``/``test_fraction``: tail shares of a single-file corpus (cut at line ends).
    ``arch_fraction``: share of the training split's chunks that form D_alpha (the rest is D_w).
    ``chunk_tokens``: size of those chunks, in tokens; every window lies inside one chunk.
    ``cache_dir``: where token arrays are cached (default ``$XDG_CACHE_HOME/autoln``).

    ``corpus`` may also be a folder of token files in nanoGPT's layout (``train.bin`` and
    ``val.bin`` of ``uint16`` token ids, as its ``prepare.py`` writes them, or ``uint32``;
    ``val.bin``'s first half is the valid split, its second the test split): ``tokenizer`` is
    then ``tokens`` (the default there) and ``vocab_size`` gives the vocabulary size, or the
    folder's ``meta.pkl`` does. ``token_dtype``: the ids' width, ``auto`` (meta.pkl's ``dtype``
    when it has one, else ``uint16`` up to 65,536 ids and ``uint32`` above:
    :func:`autoln.data.token_width`), ``uint16`` or ``uint32``.

    ``tokenizer``: ``bytes`` (default), ``chars``, ``words``, ``bpe`` (a byte-level BPE of
    ``bpe_vocab_size`` tokens trained on the training split with Hugging Face ``tokenizers``,
    cached like the token arrays, or the user's ``tokenizer_file``, a ``tokenizer.json``) or
    ``tokens`` (token files). Bytes and BPE report bits per byte, so results compare across
    tokenisers.
    """

    corpus: str = "stdlib"
    tokenizer: str = "bytes"
    vocab_size: Optional[int] = None
    token_dtype: str = "auto"
    bpe_vocab_size: int = 4096
    tokenizer_file: Optional[str] = None
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    arch_fraction: float = 0.5
    chunk_tokens: int = 4096
    cache_dir: Optional[str] = None

    def validate(self) -> None:
        _one_of("data.tokenizer", self.tokenizer, TOKENIZERS)
        _one_of("data.token_dtype", self.token_dtype, TOKEN_DTYPES)
        for key in ("valid_fraction", "test_fraction", "arch_fraction"):
            value = getattr(self, key)
            if not 0.0 < value < 1.0:
                raise ConfigError(f"data.{key} must be strictly between 0 and 1, got {value}")
        if self.valid_fraction + self.test_fraction >= 0.5:
            raise ConfigError("data.valid_fraction + data.test_fraction must be below 0.5")
        _positive("data.chunk_tokens", self.chunk_tokens)
        if self.vocab_size is not None:
            _positive("data.vocab_size", self.vocab_size)
        if not 256 < self.bpe_vocab_size <= 2**20:
            raise ConfigError(f"data.bpe_vocab_size must be above 256 (the byte alphabet) and at most 2^20, got {self.bpe_vocab_size}")


@dataclass
class ModelConfig:
    """Decoder-only Transformer dimensions and the search space (docs/design.md §2-3).

    ``n_layers`` blocks of width ``d_model`` with ``n_heads`` heads and FFN width ``d_ff``;
    ``context`` tokens per window; ``norm`` is the norm type used by every placement and the
    final norm (``layernorm``, ``rmsnorm`` or ``dyt``, :data:`autoln.space.placements.NORMS`);
    ``candidates`` the placements searched (names of :data:`autoln.space.placements.PLACEMENTS`,
    optionally ``<name>:fixed``); ``granularity`` one alpha vector per block (``layer``) or
    per sublayer (``sublayer``).

    ``affine``: the norms' elementwise gain and bias are ``learnable``, ``fixed`` at 1 and 0
    (the final norm's too), or searched per site (``search``: every candidate with a norm in
    both forms, :meth:`searched_candidates`).

    ``output_bias``: the LM head's bias. ``unigram`` (default): a learnable bias that starts at
    the training split's add-one-smoothed log unigram frequencies, so every placement starts
    at the unigram distribution instead of the uniform one (the prior-probability init of the
    output bias, Lin et al. 2017 "Focal Loss", §3.3; Karpathy 2019 "A Recipe for Training
    Neural Networks", "init well"). ``none``: no bias (GPT-2/nanoGPT's head; Post-LN and
    DeepNorm stacks then sit at the unigram plateau for hundreds of steps, see docs/search.md).

    ``residual_init``: how the residual branches start. ``scaled`` (default): the output
    projections (attention out, FFN second layer) times GPT-2's ``1/sqrt(2N)`` (Radford et
    al. 2019, §2.3), for every placement and in the supernet; DeepNorm's derived sites keep
    their own gain ``b``. ``unscaled``: plain ``xavier_normal_`` (the earlier start, under which
    a 24-block supernet stays at the unigram plateau, see docs/search.md).
    """

    n_layers: int = 6
    d_model: int = 96
    n_heads: int = 4
    d_ff: int = 384
    context: int = 128
    dropout: float = 0.0
    norm: str = "layernorm"
    candidates: list[str] = field(default_factory=lambda: ["pre", "post", "deepnorm"])
    granularity: str = "layer"
    output_bias: str = "unigram"
    affine: str = "learnable"
    residual_init: str = "scaled"

    def validate(self) -> None:
        for key in ("n_layers", "d_model", "n_heads", "d_ff", "context"):
            _positive(f"model.{key}", getattr(self, key))
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        _one_of("model.norm", self.norm, tuple(NORMS))
        _one_of("model.granularity", self.granularity, GRANULARITIES)
        _one_of("model.output_bias", self.output_bias, OUTPUT_BIASES)
        _one_of("model.residual_init", self.residual_init, RESIDUAL_INITS)
        if not self.candidates:
            raise ConfigError("model.candidates must name at least one placement")
        for name in self.candidates:
            _one_of("model.candidates", name, tuple(placement_names()))
        if len(set(self.candidates)) != len(self.candidates):
            raise ConfigError(f"model.candidates has duplicates: {quoted(self.candidates)}")
        _one_of("model.affine", self.affine, AFFINES)

    def searched_candidates(self) -> list[str]:
        """The candidate names the supernet holds at every site, in order: ``candidates`` as
        listed (``affine: learnable``), each with fixed gains (``fixed``: ``pre`` ->
        ``pre:fixed``), or both forms side by side (``search``: ``pre, pre:fixed, post, ...``).
        Placements without norms (``none``) have one form. Idempotent on its own output."""
        out: list[str] = []
        for name in self.candidates:
            base, _ = parse_name(name)
            forms = {"learnable": [name], "fixed": [base + FIXED], "search": [base, base + FIXED]}[self.affine]
            for form in forms if PLACEMENTS[base].has_norm else [base]:
                if form not in out:
                    out.append(form)
        return out


@dataclass
class TrainConfig:
    """Optimisation settings shared by the search's weights and the retrain (AdamW).

    ``steps``: optimizer steps. ``lr``: peak learning rate, reached after ``warmup_steps`` of
    linear warm-up (0: none), then ``schedule``: ``cosine`` decay to ``lr * min_lr_ratio``,
    ``inverse_sqrt`` (Vaswani et al. 2017) or ``constant`` (:func:`autoln.runs.training.lr_factor`). ``grad_clip``: max global
    gradient norm (0 disables). ``eval_every``: steps between validation evaluations, each on
    ``eval_windows`` fixed windows of the valid split. ``device``: ``auto`` (CUDA when
    available), ``cpu`` or ``cuda``. ``precision``: ``auto`` (bf16 autocast on CUDA, fp32 on
    CPU), ``fp32`` or ``bf16`` (autocast of the forward passes; weights, optimizer states and
    the loss stay fp32). ``compile``: ``torch.compile`` each Transformer block (regional
    compilation: one compiled graph serves every block of the same placements).

    ``on_divergence``: what a NaN or inf loss or gradient does: ``stop`` (default; the run ends
    with exit status 3 and its last good checkpoint) or ``skip_batch`` (that update is skipped
    and counted; the learning-rate schedule goes on).

    ``batch_size`` is the global batch: under ``torchrun`` each of the N processes takes
    ``batch_size / N`` of its rows, so a run sees the same batches whatever N.
    """

    steps: int = 600
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 50
    schedule: str = "cosine"
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_windows: int = 64
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    on_divergence: str = "stop"

    def validate(self, section: str) -> None:
        for key in ("steps", "batch_size", "eval_every", "eval_windows"):
            _positive(f"{section}.{key}", getattr(self, key))
        _above_zero(self, section, ("lr",))
        _non_negative(self, section, ("weight_decay", "grad_clip", "warmup_steps"))
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"{section}.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for b in self.betas:
            if not 0.0 <= b < 1.0:
                raise ConfigError(f"{section}.betas must lie in [0, 1), got {list(self.betas)}")
        _one_of(f"{section}.device", self.device, ("auto", "cpu", "cuda"))
        _one_of(f"{section}.precision", self.precision, PRECISIONS)
        _one_of(f"{section}.on_divergence", self.on_divergence, DIVERGENCE_POLICIES)
        _one_of(f"{section}.schedule", self.schedule, SCHEDULE_NAMES)
        if self.warmup_steps and self.warmup_steps >= self.steps:
            raise ConfigError(f"{section}.warmup_steps ({self.warmup_steps}) must be below {section}.steps ({self.steps}): "
                              f"the learning rate would never reach {section}.lr (e.g. --set {section}.warmup_steps="
                              f"{self.steps // 10})")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"{section}.seed must be in [0, 2^32), got {self.seed}")


ORDERS = (1, 2)
#: The R-DARTS rule's needs (:mod:`autoln.oneshot.monitor`: WINDOW + DELTA eigenvalues, LAG, START_FRACTION;
#: repeated here because the config cannot import the model code; a test ties them together).
R_DARTS_MIN_EVALUATIONS, R_DARTS_LAG, R_DARTS_START_FRACTION = 7, 4, 0.4
MIXING_NAMES = ("softmax", "gumbel", "gumbel-hard", "sigmoid")
EARLY_STOPS = ("none", "hessian")
SELECTIONS = ("argmax", "perturbation", "score")
#: ``search.weight_mode``: how the shared weights are trained (:data:`autoln.oneshot.architect.WEIGHT_STEPS`).
WEIGHT_MODES = ("mixed", "fair", "spos")
#: ``search.candidate_scale`` (:data:`autoln.models.model.CANDIDATE_SCALES`, kept equal by a test).
CANDIDATE_SCALES = ("raw", "common")


@dataclass
class SearchConfig(TrainConfig):
    """Bilevel search settings (docs/design.md §4): weight settings from :class:`TrainConfig`, plus

    - the architecture optimizer (Adam with DARTS' ``arch_betas`` (0.5, 0.999),
      ``arch_weight_decay`` 1e-3 and init ``arch_init_std * randn``; ``arch_lr`` 1e-2 instead of
      DARTS' 3e-4, which was set for ~20k alpha steps, not the default's 400: see docs/search.md);
    - ``order``: 1 (first-order) or 2 (second-order, DARTS' unrolled step, ``xi`` = current
      weight learning rate);
    - ``mixing``: ``softmax`` | ``gumbel`` | ``gumbel-hard`` | ``sigmoid`` (:mod:`autoln.space.mixing`),
      with temperature annealed linearly from ``tau_start`` to ``tau_end`` over ``steps``;
    - ``zero_one_weight``: weight of Fair DARTS' zero-one loss on the alpha objective;
    - ``arch_warmup_steps``: weights only until this step (alphas frozen); ``arch_lr`` 0 freezes
      them for the whole search at their near-uniform start (DARTS-PT's supernet trained with
      fixed uniform alphas, Wang et al. 2021, §5), no alpha step is taken;
    - ``beta_reg_max``: beta-DARTS' lambda, rising linearly from 0 to this over ``steps``;
    - ``sdarts_eps``: SDARTS-RS uniform noise on the mixing weights in weight steps;
    - ``monitor_windows``: windows of the fixed D_alpha batch on which the collapse monitor
      computes the alpha Hessian at each evaluation (0 disables the eigenvalue);
    - ``early_stop``: ``none`` | ``hessian`` (R-DARTS rule on the monitored eigenvalue);
    - ``weight_mode``: how the shared weights are trained (:data:`autoln.oneshot.architect.WEIGHT_STEPS`):
      ``mixed`` (DARTS' relaxed mixture), ``fair`` (FairNAS's strict fairness: every candidate of
      every site once per step, one update) or ``spos`` (one uniformly drawn path per step);
    - ``selection``: how the genotype is read off the supernet (:mod:`autoln.oneshot.selection`):
      ``argmax`` of the alphas (DARTS) or ``perturbation`` (DARTS-PT, Wang et al. 2021), which
      decides the sites one at a time by the valid-loss rise when a candidate is removed,
      measured on ``selection_windows`` fixed D_alpha windows, with ``selection_tune_steps``
      bilevel steps of fine-tuning between two decisions; or ``score`` (SPOS, Guo et al.
      2020), the genotype whose one-hot supernet loss on those windows is lowest, over every
      genotype (up to 4096) or by evolutionary search;
    - ``candidate_scale``: ``raw`` mixes the candidates' outputs as they are; ``common`` brings
      each to the mixture's weighted RMS, per token and detached, before the weighted sum
      (:func:`autoln.models.model.common_scale_mix`; the "one scale" variant of docs/results.md).
    """

    steps: int = 500
    arch_lr: float = 1e-2
    arch_betas: tuple[float, float] = (0.5, 0.999)
    arch_weight_decay: float = 1e-3
    arch_init_std: float = 1e-3
    order: int = 1
    mixing: str = "softmax"
    tau_start: float = 1.0
    tau_end: float = 0.1
    zero_one_weight: float = 0.0
    arch_warmup_steps: int = 100
    beta_reg_max: float = 0.0
    sdarts_eps: float = 0.0
    monitor_windows: int = 8
    early_stop: str = "none"
    selection: str = "perturbation"
    selection_windows: int = 32
    selection_tune_steps: int = 20
    weight_mode: str = "mixed"
    candidate_scale: str = "raw"

    def validate(self, section: str = "search") -> None:
        super().validate(section)
        _above_zero(self, section, ("tau_start", "tau_end"))
        _non_negative(self, section, ("arch_lr", "arch_weight_decay", "arch_init_std", "zero_one_weight", "arch_warmup_steps",
                                      "beta_reg_max", "sdarts_eps", "monitor_windows"))
        if self.order not in ORDERS:
            raise ConfigError(f"search.order must be 1 or 2, got {self.order}")
        _one_of("search.mixing", self.mixing, MIXING_NAMES)
        _one_of("search.early_stop", self.early_stop, EARLY_STOPS)
        _one_of("search.selection", self.selection, SELECTIONS)
        _one_of("search.weight_mode", self.weight_mode, WEIGHT_MODES)
        _one_of("search.candidate_scale", self.candidate_scale, CANDIDATE_SCALES)
        _positive("search.selection_windows", self.selection_windows)
        _non_negative(self, section, ("selection_tune_steps",))
        if self.early_stop == "hessian" and self.monitor_windows == 0:
            raise ConfigError("search.early_stop=hessian needs search.monitor_windows > 0")
        if self.arch_warmup_steps >= self.steps:
            raise ConfigError(f"search.arch_warmup_steps ({self.arch_warmup_steps}) must be below search.steps ({self.steps}): "
                              "the alphas are frozen during the warm-up, so they would never move and the genotype would be "
                              f"their random start (e.g. --set search.arch_warmup_steps={self.steps // 5}, 20 % of the steps)")
        if self.zero_one_weight > 0 and self.mixing != "sigmoid":
            raise ConfigError(f"search.zero_one_weight ({self.zero_one_weight}) needs search.mixing=sigmoid (got {self.mixing}): "
                              "Fair DARTS' zero-one loss pushes sigmoid(alpha) to 0 or 1, and only sigmoid mixing uses those weights")
        if self.early_stop == "hessian" and not r_darts_can_stop(self.steps, self.eval_every):
            evals, late = r_darts_evaluations(self.steps, self.eval_every)
            why = (f"search.early_stop=hessian cannot stop with search.steps={self.steps} and search.eval_every={self.eval_every}: "
                   f"R-DARTS compares {R_DARTS_MIN_EVALUATIONS} evaluations' eigenvalues and returns the architecture "
                   f"{R_DARTS_LAG} evaluations back, not before {R_DARTS_START_FRACTION:.0%} of the steps; this search has "
                   f"{evals} evaluations ({late} from that point)")
            every = next((e for e in range(max(1, self.steps // 20), 0, -1) if r_darts_can_stop(self.steps, e)), None)
            if every is not None:
                raise ConfigError(f"{why}. Lower search.eval_every (e.g. --set search.eval_every={every})")
            shortest = next(s for s in itertools.count(self.steps + 1) if r_darts_can_stop(s, 1))
            raise ConfigError(f"{why}, and {self.steps} steps are too few even with search.eval_every=1: lengthen the search "
                              f"or set search.early_stop=none (e.g. --set search.steps={shortest} --set search.eval_every=1)")
        if self.tau_start != self.tau_end and self.mixing == "sigmoid":
            raise ConfigError(f"search.tau_start/tau_end: sigmoid mixing has no temperature; leave both equal, they are "
                              f"{self.tau_start} and {self.tau_end} (e.g. --set search.tau_end={self.tau_start})")


def r_darts_evaluations(steps: int, eval_every: int) -> tuple[int, int]:
    """The evaluations of a search of ``steps`` steps evaluated every ``eval_every`` steps (and at
    its last step), and how many of them come at or after :data:`R_DARTS_START_FRACTION` of the
    steps, where R-DARTS' rule (:mod:`autoln.oneshot.monitor`) may stop it."""
    evals = sorted({*range(eval_every, steps + 1, eval_every), steps})
    return len(evals), len([e for e in evals if e >= R_DARTS_START_FRACTION * steps])


def r_darts_can_stop(steps: int, eval_every: int) -> bool:
    """Whether ``search.early_stop: hessian`` can stop such a search: at least
    :data:`R_DARTS_MIN_EVALUATIONS` evaluations, more than :data:`R_DARTS_LAG` of them late
    enough (:func:`r_darts_evaluations`)."""
    evals, late = r_darts_evaluations(steps, eval_every)
    return evals >= R_DARTS_MIN_EVALUATIONS and late > R_DARTS_LAG


@dataclass
class RetrainConfig(TrainConfig):
    """Retrain settings: :class:`TrainConfig` plus ``final_eval_windows``, the number of
    non-overlapping windows of the valid and test splits used for the final numbers
    (``null`` = the whole split), and ``spike_factor``: a training step whose loss exceeds this
    factor times the running mean counts as a loss spike (:class:`autoln.models.diagnostics.SpikeCounter`).
    """

    steps: int = 1000
    final_eval_windows: Optional[int] = 512
    spike_factor: float = 1.5

    def validate(self, section: str = "retrain") -> None:
        super().validate(section)
        if not self.spike_factor > 1.0:
            raise ConfigError(f"retrain.spike_factor must be > 1, got {self.spike_factor}")
        if self.final_eval_windows is not None:
            _positive("retrain.final_eval_windows", self.final_eval_windows)


#: Most corners of ``tune.space`` that :meth:`Config.validate_space` checks together.
MAX_CORNERS = 4096
DISTRIBUTIONS = ("log-uniform", "uniform", "int", "categorical")
TUNABLE_SECTIONS = ("data", "model", "search", "retrain")
#: Keys a study may not tune: they change what the score measures (data, splits, the windows it
#: is computed on), where it runs, or are set by the tuner itself (``tune.proxy_steps``).
UNTUNABLE = ("data.corpus", "data.tokenizer", "data.valid_fraction", "data.test_fraction", "data.cache_dir",
             "search.device", "retrain.device", "retrain.steps", "retrain.final_eval_windows")
SCORES = ("proxy_retrain", "supernet")
PRUNERS = ("median", "hyperband", "none")
SAMPLERS = ("tpe", "random")


def _default_space() -> dict[str, dict]:
    return {
        "search.arch_lr": {"log-uniform": [1.0e-4, 3.0e-2]},
        "search.lr": {"log-uniform": [5.0e-4, 5.0e-3]},
        "search.arch_warmup_steps": {"int": [0, 100], "step": 25},
        "search.tau_start": {"log-uniform": [0.5, 5.0]},
        "search.beta_reg_max": {"uniform": [0.0, 10.0]},
        "search.order": {"categorical": [1, 2]},
    }


@dataclass
class TuneConfig:
    """The Optuna outer loop of ``search.py --tune`` (docs/design.md §5).

    - ``n_trials``: cap on the study's finished trials (complete, pruned or failed by their
      own error), across every worker and machine; trials lost with a killed worker do not
      count and are re-run (at most ``max_retry`` times each).
    - ``score``: what a trial minimises: ``proxy_retrain`` (the derived genotype's valid loss,
      in the headline unit, after a ``proxy_steps``-step retrain with the ``retrain``
      settings) or ``supernet`` (the supernet's final valid loss).
    - ``pruner``: ``median`` | ``hyperband`` | ``none``, fed the valid loss at every
      evaluation of the search and of the proxy retrain; ``startup_trials``: trials before
      the median pruner or TPE act.
    - ``sampler``: ``tpe`` (multivariate, constant liar) | ``random``; seeded with
      ``seed + rank`` where a worker's rank is ``rank_offset`` plus its index on this machine.
    - ``storage``: ``null`` (Optuna's journal file ``study.journal`` in the study folder) or an
      RDB URL (``sqlite:///tune.db``, ``postgresql+psycopg2://user@host/db``); ``study_name`` names the
      study in it. RDB storages use a heartbeat every ``heartbeat_interval`` s; a trial
      silent for ``grace_period`` s is failed and re-run.
    - ``space``: ``{"section.key": {distribution: [low, high]}}`` with distribution
      ``log-uniform`` | ``uniform`` | ``int`` (optional ``step``) | ``categorical`` (a list of
      choices); keys are any ``data``/``model``/``search``/``retrain`` key.
    """

    n_trials: int = 20
    score: str = "proxy_retrain"
    proxy_steps: int = 200
    pruner: str = "median"
    sampler: str = "tpe"
    startup_trials: int = 5
    seed: int = 0
    rank_offset: int = 0
    storage: Optional[str] = None
    study_name: str = "autoln"
    heartbeat_interval: int = 10
    grace_period: int = 60
    max_retry: int = 2
    space: dict[str, dict] = field(default_factory=_default_space)

    def validate(self) -> None:
        for key in ("n_trials", "proxy_steps", "heartbeat_interval", "grace_period"):
            _positive(f"tune.{key}", getattr(self, key))
        _non_negative(self, "tune", ("startup_trials", "max_retry", "rank_offset"))
        _one_of("tune.score", self.score, SCORES)
        _one_of("tune.pruner", self.pruner, PRUNERS)
        _one_of("tune.sampler", self.sampler, SAMPLERS)
        if not 0 <= self.seed < 2**31:
            raise ConfigError(f"tune.seed must be in [0, 2^31), got {self.seed}")
        if self.grace_period <= self.heartbeat_interval:
            raise ConfigError(f"tune.grace_period ({self.grace_period}) must exceed tune.heartbeat_interval ({self.heartbeat_interval})")
        if self.storage is not None and "://" not in self.storage:
            raise ConfigError(f"tune.storage must be null (a journal file in the study folder) or an RDB URL such as "
                              f"sqlite:///tune.db or postgresql+psycopg2://user@host/db, got {quoted(self.storage)}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.study_name):
            raise ConfigError(f"tune.study_name must be letters, digits, '.', '_' or '-' (not starting with '.'), "
                              f"got {quoted(self.study_name)}")
        if not self.space:
            raise ConfigError("tune.space must name at least one key to tune")


@dataclass
class RaceConfig:
    """The race that decides ``search.py``'s answer (docs/design.md §10, :mod:`autoln.race.rule`): the
    supernet's read-off, its argmax and its ``top_k`` whole genotypes by one-hot score race the
    named placements of the searched candidates in real retrains (the ``retrain`` settings),
    synchronous successive halving with ``eta`` and ``rungs`` ending at ``retrain.steps``, the
    finalists at ``final_seeds`` seeds (``retrain.seed`` + 0, 1, ...); a searched finalist is the
    answer only if it beats the best named one by a one-sided paired t-test at ``level``.
    ``enabled: false`` gives the supernet's answer alone (no retrain). The race's study lives on
    ``tune.storage`` (or a journal file in ``<search folder>/race``)."""

    enabled: bool = True
    top_k: int = 3
    eta: int = 3
    rungs: int = 3
    final_seeds: int = 3
    level: float = 0.05

    def validate(self) -> None:
        _non_negative(self, "race", ("top_k",))
        _positive("race.rungs", self.rungs)
        if self.eta < 2:
            raise ConfigError(f"race.eta must be at least 2 (each rung keeps 1/eta of its entries), got {self.eta}")
        if self.final_seeds < 2:
            raise ConfigError(f"race.final_seeds must be at least 2 (the verdict is a paired test over seeds), got {self.final_seeds}")
        if not 0 < self.level < 1:
            raise ConfigError(f"race.level must be in (0, 1) (the paired t-test's level, e.g. 0.05), got {self.level}")


@dataclass
class CheckpointConfig:
    """``every``: steps between checkpoints of a search or retrain (besides those at each
    evaluation, at the end and on SIGINT/SIGTERM); 0 for none but those."""

    every: int = 100

    def validate(self) -> None:
        if self.every < 0:
            raise ConfigError(f"checkpoint.every must be >= 0 (0: only at evaluations and on signals), got {self.every}")


@dataclass
class LoggingConfig:
    """``tensorboard``: write the run's pictures in its folder: TensorBoard event files and, for
    a search, ``alphas.png`` and ``alphas_heatmap.png`` (off: neither, the quickest runs);
    ``progress``: show progress, as a
    tqdm bar on a terminal and, when stderr is redirected to a file, as one line per evaluation
    (a bar there would add a line per redraw); ``false`` shows neither. ``log_every``: steps
    between training-loss scalars."""

    tensorboard: bool = True
    progress: bool = True
    log_every: int = 10

    def validate(self) -> None:
        _positive("logging.log_every", self.log_every)


@dataclass
class Config:
    """The resolved configuration of one run: the sections above."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    race: RaceConfig = field(default_factory=RaceConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        """Check every value's range, and that each ``tune.space`` entry names a known key
        with a well-formed distribution; raises :class:`ConfigError` naming the key."""
        self.data.validate()
        self.model.validate()
        self.search.validate()
        self.retrain.validate()
        self.tune.validate()
        self.race.validate()
        self.checkpoint.validate()
        self.logging.validate()
        for key, spec in self.tune.space.items():
            space_values(key, spec, self)

    def validate_space(self) -> None:
        """For ``search.py --tune``: check that every bound and choice of ``tune.space``, set
        alone on this config, gives a valid config (so a study does not start with a space
        whose every trial would fail).

        Then every corner of the space (each combination of bounds and choices, up to
        :data:`MAX_CORNERS`) is checked the same way, for rules that tie two tuned keys.

        Raises:
            ConfigError: naming the ``tune.space`` entry (or entries), the value and the problem.
        """
        values = {key: space_values(key, spec, self) for key, spec in self.tune.space.items()}
        for key, choices in values.items():
            for value in choices:
                try:
                    self._trial({key: value}).validate_sections()
                except ConfigError as exc:
                    raise ConfigError(f"tune.space['{cut(key)}']: the value {quoted(value)} is invalid: {exc} "
                                      f"[change that range in tune.space: --set of a tuned key has no effect]") from None
        # then the corners of the space, where two tuned keys together can break a rule
        # (e.g. search.arch_warmup_steps at its top with search.steps at its bottom)
        if len(values) > 1 and math.prod(len(v) for v in values.values()) <= MAX_CORNERS:
            for combo in itertools.product(*values.values()):
                params = dict(zip(values, combo))
                try:
                    self._trial(params).validate_sections()
                except ConfigError as exc:
                    shown = ", ".join(f"{cut(k)}={quoted(v)}" for k, v in params.items())
                    raise ConfigError(f"tune.space: a trial could draw {shown}, which is invalid: {exc} "
                                      f"[narrow these ranges in tune.space]") from None

    def _trial(self, params: dict) -> "Config":
        trial = copy.deepcopy(self)
        trial.tune.space = {}
        for key, value in params.items():
            assign(trial, key, value, "tune.space")
        return trial

    def validate_sections(self) -> None:
        """Validate the sections a trial changes (data, model, search, retrain)."""
        self.data.validate()
        self.model.validate()
        self.search.validate()
        self.retrain.validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples become lists), suitable for YAML and JSON."""
        return _plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The resolved config as YAML text (the content of a run's ``config.yaml``)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two changes: a key given twice in one mapping is an error
    (PyYAML keeps the last silently, so ``model:`` written twice would drop the first section),
    and numbers are read as YAML 1.2 reads them (:data:`YAML12_FLOAT`: ``1e-4`` and ``3E5`` are
    numbers, where PyYAML's YAML 1.1 resolver reads a float without a dot as a string)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {quoted(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


#: A YAML 1.2 float as written (the core schema's, with YAML 1.1's ``_`` separators): with a dot, or
#: with an exponent and no dot (``1e-4``, ``2E+3``), or ``.5``; PyYAML's own resolver, tried first, keeps
#: ``.inf``, ``.nan`` and the sexagesimal forms.
YAML12_FLOAT = re.compile(r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                                     |[0-9][0-9_]*[eE][-+]?[0-9]+
                                     |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?)$""", re.X)
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))


def read_yaml(text: str) -> Any:
    """YAML text as Python values, with :class:`_UniqueKeyLoader` (numbers as YAML 1.2 reads
    them, duplicate keys refused): config files, ``--set`` values and the runs' own
    ``config.yaml`` all go through it.

    Raises:
        yaml.YAMLError: invalid YAML or a duplicate key; ValueError: an integer of more than
            4,300 digits (Python's limit for ``int()``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


#: Keys added with a default that changed what earlier runs did: a record without the key was
#: made the earlier way, so :func:`with_defaults` fills in that value, not today's default.
EARLIER_BEHAVIOUR = {("model", "residual_init"): "unscaled"}


def with_defaults(recorded: dict) -> dict:
    """A config dict recorded by an earlier run (checkpoint, genotype provenance, comparison
    record), with every key added since then at its built-in default (or, for a key in
    :data:`EARLIER_BEHAVIOUR`, at what runs did before the key existed), so that comparing it
    with today's config reports real differences only. Sections and keys it holds are kept."""
    out = Config().to_dict()
    for (section, key), value in EARLIER_BEHAVIOUR.items():
        if isinstance(recorded.get(section), dict) and key not in recorded[section]:
            out[section][key] = value
    for section, values in recorded.items():
        if isinstance(values, dict) and isinstance(out.get(section), dict):
            out[section] = {**out[section], **values}
        else:
            out[section] = values
    return out


#: Keys that say only where and how fast a run goes, not what it computes: the device, the
#: compiler, the mixed precision and the token cache's folder. A checkpoint is portable between
#: a GPU and a CPU, so ``--resume`` lets these change (:func:`autoln.runs.checkpoint.resume_differences`),
#: and a finished retrain made on another device stands for this one (:mod:`autoln.runs.folders`).
PLACE_KEYS = ("data.cache_dir", "search.device", "search.compile", "search.precision",
              "retrain.device", "retrain.compile", "retrain.precision")

#: Files a finished or interrupted run leaves beside its ``config.yaml`` (:func:`is_run_config`).
RUN_RECORDS = ("checkpoint.pt", "metrics.json", "genotype.json")


def is_run_config(path: str | Path) -> bool:
    """True when ``path`` is a run's own ``config.yaml``: a file of that name in a folder that
    also holds one of :data:`RUN_RECORDS`. Such a file records what the run did, so a key it
    lacks (it was written before the key existed) means the earlier behaviour, not today's
    default (:func:`earlier_behaviour`)."""
    path = Path(path)
    return path.name == "config.yaml" and any((path.parent / name).is_file() for name in RUN_RECORDS)


def earlier_behaviour(raw: dict, path: str | Path) -> dict:
    """``raw`` (a run's own config file, :func:`is_run_config`) with each key of
    :data:`EARLIER_BEHAVIOUR` that its section lacks set to what runs did before the key
    existed, as :func:`with_defaults` reads checkpoints and records; a ``note:`` line names each.
    So the remedy printed on ``--resume`` ("resume with the run's own config") works for a run
    older than the key."""
    out = {section: (dict(values) if isinstance(values, dict) else values) for section, values in raw.items()}
    for (section, key), value in EARLIER_BEHAVIOUR.items():
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section][key] = value
            _note(f"note: {path} has no {section}.{key} (the run is older than the key): read as {value!r}, what runs "
                  "did before it existed", file=sys.stderr)
    return out


def _note(text: str, file=None) -> None:
    """Print a ``note:`` line to stderr, once under ``torchrun`` (on rank 0, from the ``RANK``
    variable: the notes come before the process group exists)."""
    if os.environ.get("RANK", "0") == "0":
        print(text, file=file or sys.stderr)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a :class:`Config` from defaults, an optional YAML file and ``--set`` overrides.

    Args:
        path: YAML file with any of the sections; ``None`` for the defaults. A run's own
            ``config.yaml`` (:func:`is_run_config`) reads a key it lacks as the earlier
            behaviour (:func:`earlier_behaviour`).
        overrides: strings ``section.key=value``; ``value`` is parsed as YAML.

    Raises:
        ConfigError: unreadable or non-mapping file, unknown section or key, wrong type or
            out-of-range value, a string over :data:`MAX_STRING` characters, a resolved config
            over :data:`MAX_CONFIG_YAML` characters of YAML (:func:`check_size`); the message
            names the key and the file or ``--set``, and quotes values bounded
            (:func:`autoln.core.errors.quoted`).
    """
    raw: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
        try:
            loaded = read_yaml(text)
        except ValueError as exc:  # an integer of more than 4,300 digits (Python's limit for int())
            raise ConfigError(f"config file {path} is not valid YAML: {cut(str(exc), 120)}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where_in = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ConfigError(f"config file {path} is not valid YAML{where_in}: {cut(problem)}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(loaded).__name__}")
        raw = earlier_behaviour(loaded, path) if is_run_config(path) else loaded
    cfg = Config()
    given: dict[str, str] = {}  # section.key -> where it was set
    for section, values in raw.items():
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"section '{cut(section)}' in {where} must be a mapping of keys")
        for key, value in values.items():
            _assign(cfg, f"{section}.{key}", value, where)
            given[f"{section}.{key}"] = where
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got '{cut(item)}'")
        dotted, text = item.split("=", 1)
        try:
            value = read_yaml(text) if text.strip() else None
        except (yaml.YAMLError, ValueError):  # ValueError: an integer of more than 4,300 digits
            value = text
        _assign(cfg, dotted.strip(), value, "--set")
        given[dotted.strip()] = "--set"
    # chosen by the user: every --set, and a file's values other than the defaults (a run's own
    # config.yaml lists every key, its defaults included)
    default = Config()
    chosen = {k: w for k, w in given.items() if w == "--set"
              or getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1]) != getattr(getattr(default, k.split(".")[0]), k.split(".")[1])}
    fit_defaults(cfg, chosen)
    cfg.validate()
    check_size(cfg, where + (" and --set" if overrides else ""))
    return cfg


def check_size(cfg: Config, where: str) -> None:
    """Refuse a resolved config whose YAML is over :data:`MAX_CONFIG_YAML` characters: every run
    copies it (``config.yaml``, checkpoints, TensorBoard text, a genotype's provenance), and no
    setting needs that much. Each string is already at most :data:`MAX_STRING` characters; what
    remains is a long list, such as ``tune.space`` choices.

    Raises:
        ConfigError: naming ``where`` (the file and/or ``--set``), the size and the largest key.
    """
    size = len(cfg.to_yaml())
    if size <= MAX_CONFIG_YAML:
        return
    sizes = {f"{section}.{key}": len(yaml.safe_dump(value)) for section, values in cfg.to_dict().items() for key, value in values.items()}
    largest = max(sizes, key=sizes.get)
    raise ConfigError(f"the config ({where}) is {size:,} characters of YAML, more than the {MAX_CONFIG_YAML:,} "
                      f"a run copies into its outputs; the largest key is {largest} ({sizes[largest]:,} characters): shorten it")


def fit_defaults(cfg: Config, chosen: dict[str, str]) -> None:
    """Make the keys the user left at their built-in defaults agree with the ones they chose,
    so that a documented option works with every other key at its default (a contradiction
    between two keys the user chose is left for :meth:`Config.validate` to refuse). ``chosen``:
    ``section.key`` -> where it was set: every ``--set``, and a file's keys whose value is not
    the built-in default. In place; prints a note for each key it changes, except the
    temperature that sigmoid mixing does not use.

    - A ``data.corpus`` folder of token files (``train.bin``) is read with ``data.tokenizer: tokens``.
    - ``search.mixing: sigmoid`` has no temperature: ``tau_end`` takes ``tau_start``'s value.
    - A default warm-up (``search.warmup_steps``, ``retrain.warmup_steps``) that is not shorter
      than the run becomes a tenth of its steps; a default ``search.arch_warmup_steps`` (100,
      a fifth of the default 500 steps) that is not below ``search.steps`` becomes a fifth.
    - ``search.early_stop: hessian`` with a default ``search.eval_every`` too sparse for the
      R-DARTS rule evaluates 20 times.

    Raises:
        ConfigError: a key set with ``--set`` that does nothing with the others (selection
            settings of a selection that does not use them; a config file's are left alone,
            as a file serves many runs).
    """
    import sys

    sc = cfg.search
    if "data.tokenizer" not in chosen and (Path(cfg.data.corpus).expanduser() / "train.bin").is_file():
        cfg.data.tokenizer = "tokens"  # a folder of nanoGPT token files is tokenised already
    if sc.mixing == "sigmoid" and not {"search.tau_start", "search.tau_end"} & set(chosen):
        sc.tau_end = sc.tau_start
    fits = [("search", "warmup_steps", 10), ("retrain", "warmup_steps", 10), ("search", "arch_warmup_steps", 5)]
    for section, key, share in fits:
        tc = getattr(cfg, section)
        if f"{section}.{key}" not in chosen and tc.steps >= 1 and getattr(tc, key) >= tc.steps:
            new = tc.steps // share
            _note(f"note: {section}.{key} set to {new}, {'a tenth' if share == 10 else 'a fifth'} of {section}.steps="
                  f"{tc.steps} (its default {getattr(tc, key)} is not shorter than the run; set it to choose another)", file=sys.stderr)
            setattr(tc, key, new)
    if sc.early_stop == "hessian" and "search.eval_every" not in chosen and sc.steps >= 20:
        evals = sorted({*range(sc.eval_every, sc.steps + 1, sc.eval_every), sc.steps})
        if len(evals) < R_DARTS_MIN_EVALUATIONS or len([e for e in evals if e >= R_DARTS_START_FRACTION * sc.steps]) <= R_DARTS_LAG:
            _note(f"note: search.eval_every set to {sc.steps // 20} (20 evaluations; R-DARTS' early stop needs at least "
                  f"{R_DARTS_MIN_EVALUATIONS}, and the default {sc.eval_every} gives {len(evals)})", file=sys.stderr)
            sc.eval_every = sc.steps // 20
    inert = [("search.selection_tune_steps", sc.selection != "perturbation", "only perturbation-based selection fine-tunes"),
             ("search.selection_windows", sc.selection == "argmax", "argmax reads the alphas and measures nothing")]
    for key, idle, why in inert:  # set on the command line for this run (a config file serves many runs and modes)
        if chosen.get(key) == "--set" and idle:
            raise ConfigError(f"{key} ({chosen[key]}) does nothing with search.selection={sc.selection}: {why}; "
                              f"drop it, or choose a selection that uses it")


# --- helpers -----------------------------------------------------------------------------


def space_values(key: str, spec: Any, cfg: Config) -> list[Any]:
    """Check one ``tune.space`` entry and return the values that bound it: ``[low, high]`` of
    a range, or every choice of a ``categorical``.

    Raises:
        ConfigError: ``key`` is not ``section.key`` of a tunable section, ``spec`` is not a
            mapping with exactly one of :data:`DISTRIBUTIONS` (plus ``step`` for ``int`` and
            ``uniform``), bounds are not numbers with low < high (low > 0 for log-uniform),
            a bound does not fit the key's type, or the key is in :data:`UNTUNABLE`.
    """
    where = f"tune.space['{cut(key)}']"
    section = key.split(".")[0]
    if section not in TUNABLE_SECTIONS or key.count(".") != 1:
        raise ConfigError(f"{where}: keys must be section.key with section one of {list(TUNABLE_SECTIONS)}")
    obj = getattr(cfg, section)
    name = key.split(".")[1]
    hints = typing.get_type_hints(type(obj))
    if name not in hints:
        raise ConfigError(f"{where}: unknown key; keys of '{section}': {', '.join(f.name for f in dataclasses.fields(obj))}")
    if key in UNTUNABLE:
        raise ConfigError(f"{where}: {key} cannot be tuned (it changes what the score measures or is set by the "
                          f"tuner; not tunable: {', '.join(UNTUNABLE)})")
    if key == "search.steps" and cfg.tune.pruner != "none":
        raise ConfigError(f"{where}: a tuned search length cannot be pruned fairly (the pruner compares trials at equal "
                          f"steps, and a shorter search is behind there only for being shorter); tune it with "
                          f"--set tune.pruner=none (now {quoted(cfg.tune.pruner)}), or fix search.steps and tune the rest")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping such as {{log-uniform: [1.0e-4, 1.0e-2]}}, got {quoted(spec)}")
    kinds = [k for k in spec if k in DISTRIBUTIONS]
    extra = [k for k in spec if k not in DISTRIBUTIONS and k != "step"]
    if len(kinds) != 1 or extra:
        raise ConfigError(f"{where} must have exactly one of {list(DISTRIBUTIONS)} (and optionally step), got keys {quoted(list(spec))}")
    kind, args = kinds[0], spec[kinds[0]]
    if "step" in spec and kind not in ("int", "uniform"):
        raise ConfigError(f"{where}: step is only for int and uniform")
    if kind == "categorical":
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where}: categorical needs a non-empty list of choices, got {quoted(args)}")
        for choice in args:
            if not (choice is None or isinstance(choice, (bool, int, float, str))):
                raise ConfigError(f"{where}: categorical choices must be numbers, strings, booleans or null, got {quoted(choice)}")
        if len(set(map(repr, args))) != len(args):
            raise ConfigError(f"{where}: categorical choices repeat: {quoted(args)}")
        return [_coerce(c, hints[name], key, where) for c in args]
    if (not isinstance(args, list) or len(args) != 2
            or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in args)):
        raise ConfigError(f"{where}: {kind} needs [low, high] as two finite numbers, got {quoted(args)}")
    if kind == "int":  # integral numbers written as 1e3 are integers
        args = [int(a) if isinstance(a, float) and a.is_integer() else a for a in args]
    low, high = args
    if not low < high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high})")
    if kind == "log-uniform" and low <= 0:
        raise ConfigError(f"{where}: log-uniform needs low > 0, got {low}")
    base = hints[name]
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        base = [a for a in typing.get_args(base) if a is not type(None)][0]
    if kind == "int":
        if base is not int or not all(isinstance(a, int) for a in args):
            raise ConfigError(f"{where}: int needs an integer key and integer bounds ({key} is {_type_name(hints[name])})")
        step = spec.get("step", 1)
        step = int(step) if isinstance(step, float) and step.is_integer() else step
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0 or (high - low) % step:
            raise ConfigError(f"{where}: step must be a positive integer dividing high - low, got {quoted(step)}")
    else:
        if base is not float:
            raise ConfigError(f"{where}: {kind} needs a number key ({key} is {_type_name(hints[name])}); use int or categorical")
        step = spec.get("step")
        if step is not None:
            n = (high - low) / step if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0 else 0.0
            if kind != "uniform" or n < 1 or abs(n - round(n)) > 1e-9 * max(1.0, n):
                raise ConfigError(f"{where}: step must be a positive number that divides high - low, got {quoted(step)}")
    return [_coerce(a, hints[name], key, where) for a in args]


def assign(cfg: Config, dotted: str, value: Any, where: str) -> None:
    """Set ``cfg.<section>.<key>`` from a YAML value, coerced to the field's type.

    Raises:
        ConfigError: unknown section or key, or a value of the wrong type (names the key and
            ``where`` it came from).
    """
    _assign(cfg, dotted, value, where)


def _assign(cfg: Config, dotted: str, value: Any, where: str) -> None:
    parts = dotted.split(".")
    sections = [f.name for f in dataclasses.fields(Config)]
    if len(parts) != 2:
        raise ConfigError(f"key '{cut(dotted)}' ({where}) must have the form section.key")
    section, key = parts
    if section not in sections:
        import difflib

        close = difflib.get_close_matches(section, sections, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"unknown section '{cut(section)}' ({where}); {hint}expected one of {sections}")
    obj = getattr(cfg, section)
    hints = typing.get_type_hints(type(obj))
    known = [f.name for f in dataclasses.fields(obj)]
    if key not in known:
        import difflib

        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{section}.{close[0]}'? " if close else ""
        raise ConfigError(f"unknown key '{cut(dotted)}' ({where}); {hint}keys of '{section}': {', '.join(known)}")
    setattr(obj, key, _coerce(value, hints[key], dotted, where))


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, key, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e3 (YAML 1.2 reads it as a float)
            return int(value)
    elif tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
    elif tp is str:
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise ConfigError(f"'{key}' ({where}) is {quoted(value, 60)}: a string of at most {MAX_STRING:,} "
                                  "characters is expected (a path, a URL or a name)")
            return value
    elif origin is list:
        if isinstance(value, list):
            return [_coerce(v, args[0], key, where) for v in value]
    elif origin is tuple:
        if isinstance(value, (list, tuple)) and len(value) == len(args):
            return tuple(_coerce(v, a, key, where) for v, a in zip(value, args))
    elif origin is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {k: _coerce(v, args[1], f"{key}['{cut(k)}']", where) for k, v in value.items()}
    elif tp is dict:
        if isinstance(value, dict):
            return copy.deepcopy(value)
    raise ConfigError(f"'{key}' ({where}) must be {_type_name(tp)}, got {quoted(value)}")


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return f"a list of {_PLURAL.get(args[0], str(args[0]))}"
    if origin is dict or tp is dict:
        return "a mapping"
    if origin is tuple:
        return f"a list of {len(args)} {_PLURAL.get(args[0], str(args[0]))}"
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)][0]
        return f"{_type_name(inner)} or null"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}.get(tp, str(tp))


_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value}")


def _above_zero(obj: Any, section: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        if not getattr(obj, key) > 0:
            raise ConfigError(f"{section}.{key} must be > 0, got {getattr(obj, key)}")


def _non_negative(obj: Any, section: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        if getattr(obj, key) < 0:
            raise ConfigError(f"{section}.{key} must be >= 0, got {getattr(obj, key)}")


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {list(allowed)}, got {quoted(value)}")


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
