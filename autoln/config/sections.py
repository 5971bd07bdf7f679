"""The sections of one search or retrain: where the text comes from (:class:`DataConfig`), the
Transformer and its candidate placements (:class:`ModelConfig`), the optimisation shared by the
search's weights and the retrain (:class:`TrainConfig`), the bilevel search
(:class:`SearchConfig`, with the R-DARTS rule's needs) and the retrain (:class:`RetrainConfig`);
each with its allowed values and its ``validate``, which raises
:class:`autoln.core.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

from autoln.core.errors import ConfigError, quoted
from autoln.space.placements import FIXED, NORMS, PLACEMENTS, RESIDUAL_INITS, parse_name, placement_names
from autoln.space.qk import check_qk_candidates

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

    ``qk_norm``: the QK-norm candidates of every attention layer (:mod:`autoln.space.qk`):
    ``[none]`` (default) none; one other name (``[qk]``) a fixed QK-norm in every model; several
    (``[none, qk]``) search it, with alphas of its own beside the sites' (the space is then the
    product: ``K^n_sites * Q^n_layers`` genotypes).

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
    qk_norm: list[str] = field(default_factory=lambda: ["none"])

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
        try:
            check_qk_candidates(self.qk_norm)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

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
    ``inverse_sqrt`` (Vaswani et al. 2017) or ``constant`` (:func:`autoln.engine.training.lr_factor`). ``grad_clip``: max global
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


# --- helpers -----------------------------------------------------------------------------


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
