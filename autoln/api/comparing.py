"""``autoln.compare_genotypes``: what ``retrain.py --compare`` does for autoln's model, for a user's model.

Each genotype's derived model (:func:`autoln.api.derive` on a fresh model, DeepNorm's init
included) and each uniform baseline placement (``all-pre`` is nanoGPT's own Pre-LN model:
with the one placement ``pre`` at every site the model is the unchanged one) is trained from
scratch at the same seeds and the same budget, by the user's training function or a plain
default loop, and scored by the user's evaluation (lower is better) or the mean loss on
``valid_batches``. The result ranks them by mean over seeds, with ``mean ± std`` and the gap
to the best; a gap within one standard deviation is a tie (:mod:`autoln.retrain.ranking`, the rule of
``retrain.py --compare``).

Per run, in this order: ``torch.manual_seed(seed)``, ``model = build()``, ``derive(model,
genotype)``, ``train(model, seed)``, ``evaluate(model)``: the same numbers as doing those
steps by hand (``tests/test_api_compare.py``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from autoln.api.deriving import derive
from autoln.api.site_genotype import SiteGenotype, as_site_genotype
from autoln.api.sites import as_number, as_pair, check_build, check_names, plain_qk_choices, searchable_sites
from autoln.config import RetrainConfig
from autoln.core.errors import GenotypeError, cut
from autoln.core.modes import train_mode
from autoln.retrain.ranking import RESOLUTION, is_tie, mean_std, stats, vs_best
from autoln.engine.training import on_terminal, progress_bar


@dataclass
class CompareRow:
    """One model of a :class:`Comparison`: its ``name`` (the genotype's key, or ``all-<p>``), its
    placements in site order, and ``values`` per seed (the evaluation, lower is better; the
    seeds of :attr:`Comparison.seeds`, in order)."""

    name: str
    placements: str
    values: list[float]

    @property
    def mean(self) -> float:
        """Mean over seeds."""
        return stats(self.values)[0]

    @property
    def std(self) -> float:
        """Sample standard deviation over seeds (0 for one seed)."""
        return stats(self.values)[1]


@dataclass
class Comparison:
    """What :func:`compare` returns: ``rows`` ranked best (lowest mean) first, the ``seeds``,
    ``notes``: per genotype one line on how it stands against each baseline (beats, ties,
    loses, with the gap), and the values' ``unit`` (what ``evaluate`` returns)."""

    rows: list[CompareRow]
    seeds: list[int]
    notes: list[str] = field(default_factory=list)
    unit: str = "nats/token"

    def row(self, name: str) -> CompareRow:
        """The row called ``name``.

        Raises:
            KeyError: no such row (the message lists the names)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r} in the comparison (rows: {[r.name for r in self.rows]})")

    def table(self) -> str:
        """A Markdown table: name, placements, mean ± std, per seed, vs best (a tie within one std)."""
        best = self.rows[0]
        lines = [f"| model | placements | mean ± std ({self.unit}) | per seed | vs best |", "|---|---|---|---|---|"]
        for r in self.rows:
            cell = vs_best(r.mean - best.mean, max(r.std, best.std), len(self.seeds), r is best)
            lines.append(f"| {r.name} | {r.placements.replace('|', chr(92) + '|')} | {mean_std(r.values)} | "
                         f"{' / '.join(f'{v:.4f}' for v in r.values)} | {cell} |")
        return "\n".join(lines)

    def report(self) -> str:
        """:meth:`table` and :attr:`notes`, one per line, as :func:`compare` prints them."""
        return "\n".join([self.table(), *self.notes])


Genotypes = Union[SiteGenotype, Mapping[str, SiteGenotype]]


def verdict(row: CompareRow, other: CompareRow, unit: str = "nats/token") -> str:
    """``row`` against ``other`` in words: ``beats``, ``ties`` or ``loses to``, with the gap of
    the means in ``unit`` (one seed: no tie is called unless the values are equal within
    :data:`autoln.retrain.ranking.RESOLUTION`, and the line says it is one seed)."""
    gap = row.mean - other.mean
    tie = is_tie(row.values, other.values)
    word = "ties" if tie else "beats" if gap < 0 else "loses to"
    within = (" (equal)" if abs(gap) < RESOLUTION else " (within one std)") if tie else \
        "" if len(row.values) > 1 else " (one seed: a look, not a result)"
    return f"{row.name} {word} {other.name}: {row.mean:.4f} against {other.mean:.4f} {unit}, gap {gap:+.4f}{within}"


def uniform(model: nn.Module, placement: str) -> SiteGenotype:
    """The genotype with ``placement`` at every searchable site of ``model``.

    Raises:
        ValueError: a site that does not offer ``placement``, or no searchable site."""
    sites = searchable_sites(model)
    if not sites:
        raise ValueError("autoln.compare_genotypes: build() gives a model without an autoln.Site of two or more candidates "
                         "(build the model with its candidates, e.g. GPTConfig(norm_candidates=('pre', 'post', 'deepnorm')))")
    cands = list(sites[0][1].placements)
    if placement not in cands:
        raise ValueError(f"autoln.compare_genotypes: baselines: {placement!r} is not among the sites' candidates {cands}")
    k = cands.index(placement)
    return SiteGenotype(cands, {n: placement for n, _ in sites},
                        {n: [1.0 if i == k else 0.0 for i in range(len(cands))] for n, _ in sites}, {}, *plain_qk_choices(model))


def default_train(train_batches, cfg: RetrainConfig) -> Callable[[nn.Module, int], None]:
    """A plain training loop: ``cfg.steps`` AdamW steps (decay on matrices, ``cfg``'s warm-up and
    cosine schedule, clipping; :func:`autoln.engine.training.weight_optimizer`) on the batches of
    ``train_batches`` in order, re-iterated when used up, on the model's device; in train mode
    except the modules ``build()`` froze in eval mode, each module back in its own mode after
    (:func:`autoln.core.modes.train_mode`).

    Raises:
        ValueError: ``train_batches`` that cannot be iterated again (a generator or iterator:
            each model needs the same batches), or a batch that is no ``(x, y)`` pair."""
    from autoln.engine.training import train_step, weight_optimizer

    if train_batches is None or iter(train_batches) is train_batches:
        raise ValueError("autoln.compare_genotypes: train_batches: expected a list or a DataLoader of (x, y) batches, which every "
                         "model can iterate from its start (a generator gives its batches once); or pass train=fn(model, seed)")

    def train(model: nn.Module, seed: int) -> None:
        device = next(model.parameters()).device
        opt, sched = weight_optimizer(list(model.named_parameters()), cfg)
        step = 0
        with train_mode(model):
            while step < cfg.steps:
                drawn = False
                for i, batch in enumerate(train_batches):
                    if step >= cfg.steps:
                        break
                    x, y = as_pair(batch, "train_batches", i)
                    train_step(model, opt, sched, x.to(device), y.to(device), cfg.grad_clip)
                    step, drawn = step + 1, True
                if not drawn:
                    raise ValueError("autoln.compare_genotypes: train_batches gave no batch")
    return train


def default_evaluate(valid_batches) -> Callable[[nn.Module], float]:
    """Mean loss (nats per token, weighted by tokens) over ``valid_batches``
    (:func:`autoln.engine.training.evaluate_batches`).

    Raises:
        ValueError: no ``valid_batches`` (pass them, or ``evaluate=fn(model) -> float``)."""
    from autoln.engine.training import evaluate_batches

    if valid_batches is None:
        raise ValueError("autoln.compare_genotypes: pass valid_batches (a list of (x, y) batches) or evaluate=fn(model) -> float")
    batches = list(valid_batches)

    def evaluate(model: nn.Module) -> float:
        return float(evaluate_batches(model, batches, next(model.parameters()).device))
    return evaluate


def seeds_of(seeds: Any, where: str) -> list[int]:
    """``seeds`` (a positive count ``N``: seeds ``0..N-1``; or a list of distinct integers) as a list.

    Raises:
        ValueError: naming ``where``: anything else (a float, zero, a repeated seed)."""
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if whole(seeds):
        if seeds < 1:
            raise ValueError(f"{where}: seeds: expected a positive count or a list of seeds, got {seeds!r}")
        return list(range(seeds))
    if not isinstance(seeds, (list, tuple, range)) or not seeds or not all(whole(v) for v in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ValueError(f"{where}: seeds: expected a positive count (e.g. 3) or a list of distinct integer seeds, got {seeds!r}")
    return list(seeds)


def genotype_map(genotypes: Any, where: str, one: str) -> dict[str, SiteGenotype]:
    """``genotypes`` as ``{name: SiteGenotype}``: a dict of genotypes (or of their files), or
    one genotype (or its file) named ``one``; None or an empty dict: none.

    Raises:
        GenotypeError: as :func:`autoln.api.as_site_genotype`, naming the entry."""
    if genotypes is None:
        return {}
    if isinstance(genotypes, Mapping):
        return {name: as_site_genotype(g, f"{where}: genotypes[{name!r}]") for name, g in genotypes.items()}
    return {one: as_site_genotype(genotypes, f"{where}: genotypes")}


def check_before_training(build: Callable[[], nn.Module], genotypes: Mapping[str, SiteGenotype],
                          evaluate: Callable[[nn.Module], Any], where: str) -> None:
    """What would fail after hours of training, found before the first: every genotype fits a
    fresh model (:func:`autoln.api.derive`, without DeepNorm's init), then a trial call of
    ``evaluate`` on the first one's untrained model must return a number. An ``evaluate`` that
    cannot run before training (one that reads what your ``train`` sets) is let be: what it
    raises is named in one line on stderr as your evaluate's, and the first trained model is
    its first check.

    Raises:
        GenotypeError: naming the genotype that does not fit. ValueError: ``evaluate``'s
        value is no number (:func:`autoln.api.as_number`)."""
    first = None
    for name, g in genotypes.items():
        try:
            model = derive(build(), g, init=False)
        except GenotypeError as exc:
            raise GenotypeError(f"{where}: {name}: {exc}") from None
        first = model if first is None else first
    if first is None:
        return
    try:
        value = evaluate(first)
    except Exception as exc:  # noqa: BLE001 - the user's code on a model it was not written for
        said = cut(" ".join(str(exc).split()))  # one line, however the exception's text runs
        print(f"{where}: note: a trial call of your evaluate on an untrained model, before any training, raised "
              f"{type(exc).__name__}: {said}; it is checked on the first trained model instead", file=sys.stderr, flush=True)
        return
    as_number(value, f"{where} (a trial call on an untrained model, before any training)")


def compare_genotypes(build: Callable[[], nn.Module], genotypes: Genotypes, *, baselines: Optional[Sequence[str]] = None,
                      seeds: Union[int, Sequence[int]] = 3, train: Optional[Callable[[nn.Module, int], Any]] = None,
                      evaluate: Optional[Callable[[nn.Module], float]] = None, train_batches: Optional[Iterable] = None,
                      valid_batches: Optional[Iterable] = None, cfg: Optional[RetrainConfig] = None,
                      progress: bool = True, unit: str = "nats/token") -> Comparison:
    """Train each genotype's derived model and each baseline at equal seeds and budget; rank them.

    Args:
        build: ``() -> nn.Module``, a fresh model with the searched sites (the candidates the
            genotypes were searched over), e.g. ``lambda: GPT(GPTConfig(**size, norm_candidates=C))`` (the README's sizes);
            called once per run after ``torch.manual_seed(seed)``.
        genotypes: one :class:`autoln.SiteGenotype` (named ``searched``) or ``{name: genotype}``;
            a genotype's ``genotype.json`` path serves for it.
        baselines: placements put at every site (rows ``all-<placement>``); default every
            candidate of the sites. ``all-pre`` is a Pre-LN model's own placement.
        seeds: a count ``N`` (seeds ``0..N-1``) or the seeds.
        train: ``fn(model, seed)`` that trains the model in place (your loop, your optimizer);
            default :func:`default_train` on ``train_batches`` with ``cfg``.
        evaluate: ``fn(model) -> float``, lower is better (a validation loss); default
            :func:`default_evaluate` on ``valid_batches``.
        cfg: the default loop's settings (:class:`autoln.config.RetrainConfig`: 1000 AdamW
            steps at lr 2e-3 with 50 warm-up steps, cosine to a tenth, clip 1.0).
        progress: on stderr a tqdm bar over the runs on a terminal, or one line per finished
            run with the estimated time left in a redirected log (:class:`RunProgress`), and
            the report on stdout at the end.
        unit: the unit of ``evaluate``'s value, printed after every number (default
            ``nats/token``: a cross-entropy's, as nanoGPT's loss and the default evaluation).

    Returns:
        :class:`Comparison`.

    Raises:
        ValueError: ``build`` a model rather than a function, ``seeds`` not a positive count or
            a list of distinct integers, ``baselines`` not a list of candidates, ``cfg``,
            ``train`` or ``evaluate`` of the wrong kind; no genotype and no baseline; an
            ``evaluate`` that returns no number (tried once on an untrained model before any
            training, :func:`check_before_training`); what :func:`default_train` and
            :func:`default_evaluate` raise, before ``build`` is first called.
        autoln.core.errors.GenotypeError: a genotype that is none (a string that is no file,
            search.py's genotype), or that does not fit the model (:func:`derive`): every one
            checked before the first training.
    """
    where = "autoln.compare_genotypes"
    seed_list, named, baselines = check_compare(build, genotypes, baselines, seeds, train, evaluate, cfg)
    train = train or default_train(train_batches, cfg or RetrainConfig())  # checks that need no user code first
    evaluate = evaluate or default_evaluate(valid_batches)
    torch.manual_seed(seed_list[0])
    probe = build()
    if baselines is None:
        sites = searchable_sites(probe)
        baselines = list(sites[0][1].placements) if sites else []
    models = dict(named) | {f"all-{p}": uniform(probe, p) for p in baselines}
    del probe
    if not models:
        raise ValueError(f"{where}: nothing to compare: give genotypes or baselines")
    check_before_training(build, models, evaluate, where)
    values: dict[str, list[float]] = {name: [] for name in models}
    shown = RunProgress(where, progress, len(models) * len(seed_list), "run")
    for seed in seed_list:
        for name, genotype in models.items():
            torch.manual_seed(seed)
            model = derive(build(), genotype)
            train(model, seed)
            values[name].append(as_number(evaluate(model), where))
            shown.finished(f"{name} seed {seed}: {values[name][-1]:.4f} {unit}")
    shown.close()
    rows = sorted((CompareRow(n, g.describe(), values[n]) for n, g in models.items()), key=lambda r: r.mean)
    result = Comparison(rows, seed_list, unit=unit)
    base_rows = [r for r in rows if r.name.startswith("all-") and r.name not in named]
    result.notes += [verdict(result.row(name), other, unit) for name in named for other in base_rows]
    if progress:
        print(result.report(), flush=True)
    return result


def check_compare(build, genotypes, baselines, seeds, train, evaluate, cfg) -> tuple[list[int], dict[str, SiteGenotype], Optional[list[str]]]:
    """:func:`compare_genotypes`' arguments checked: ``(seeds, named genotypes, baselines)``.

    Raises:
        ValueError, GenotypeError: as :func:`compare_genotypes` says."""
    where = "autoln.compare_genotypes"
    check_build(build, where)
    seed_list = seeds_of(seeds, where)
    named = genotype_map(genotypes, where, "searched")
    baselines = check_names(baselines, f"{where}: baselines")
    if cfg is not None and not isinstance(cfg, RetrainConfig):
        raise ValueError(f"{where}: cfg: expected an autoln.config.RetrainConfig (the default loop's settings), got a "
                         f"{type(cfg).__name__}")
    for what, fn in (("train", train), ("evaluate", evaluate)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{where}: {what}: expected a function, got a {type(fn).__name__}")
    return seed_list, named, baselines


class RunProgress:
    """The progress of a comparison or a race on a user's model, on stderr: a tqdm bar over its
    work on a terminal (each finished run written above it), and in a redirected log one line
    per finished run with the estimated time left (:class:`autoln.engine.training.TimeLeft`, as
    ``search.py``'s lines). Nothing with ``show`` False.

    Args:
        where: the function's name, the lines' prefix (``autoln.race_genotypes``).
        show: draw and print at all.
        total: the work in all (runs; a race's :func:`autoln.race.rule.most_steps`).
        unit: what ``total`` counts (``run``, ``step``).
        bound: ``total`` is a bound (a race may stop early): the estimate says "at most".
    """

    def __init__(self, where: str, show: bool, total: int, unit: str, bound: bool = False) -> None:
        self.where, self.show, self.total, self.unit, self.bound = where, show, total, unit, bound
        self.done = 0
        self.bar = progress_bar(show=show, total=total, desc=where.rsplit(".", 1)[-1], unit=unit)

    def finished(self, text: str, amount: int = 1) -> None:
        """One run finished (``amount`` units of the total): the bar moves, and ``text`` (the
        run and its value, with its unit) is printed, in a log with the time left."""
        self.done += amount
        self.bar.update(amount)
        if not self.show:
            return
        if on_terminal():
            self.bar.write(f"{self.where}: {text}", file=sys.stderr)
            return
        count = f"{self.done}/{self.total} {self.unit}s" + (" at most" if self.bound else "")
        print(f"{self.where}: {text} ({count}, {self.bar.time_left.text(self.done, bound=self.bound)})",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()
