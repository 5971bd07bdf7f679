"""The race's proposers: which genotypes a proposal round tries next (``race.proposer``;
:mod:`autoln.race.schedule` runs the rounds).

A proposer sees every seed-0 retrain the race measured (``(placements, steps, value)``, lower
is better, the named placements' full-budget values among them) and the supernet's final
per-site probabilities (its *prior*, when there is a supernet), and returns genotypes none of
which the race has tried. Values are compared within a rung only: each is turned into a
z-score among the values of its rung (a diverged run one above the rung's worst), so that short
and full rungs share one scale. Each proposer is deterministic given its seed and the round,
so a resumed race and every worker on one storage propose the same genotypes.

=========  ==================================================================================
``random`` uniform random genotypes, every round (round 0 too: random search through the same
           race, the yardstick; Li & Talwalkar 2019)
``prior``  genotypes drawn from the supernet's per-site probabilities
``local``  one-site changes around the race's leaders, best first (White et al. 2020, "Local
           search is state of the art for NAS benchmarks"), the supernet's likelier candidates
           first
``ridge``  a Bayesian linear model of per-site effects (one-hot candidates), its prior mean from
           the supernet's probabilities, proposing by Thompson sampling (Russo et al. 2018)
``tpe``    Optuna's ``TPESampler(multivariate=True, group=True)`` over the sites as categorical
           parameters, every measured genotype told as a completed trial (Bergstra et al. 2011;
           BOHB, Falkner et al. 2018)
``gp``     Optuna's ``GPSampler``, the same way (a Gaussian process with expected improvement)
=========  ==================================================================================
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

Seen = Sequence[tuple[str, int, float]]


@dataclass(frozen=True)
class Space:
    """The searched space: ``candidates`` (names, e.g. ``("pre", "post", "deepnorm")``),
    ``sites`` (how many placements a genotype has), ``prior`` (the supernet's final per-site
    probabilities, shape ``[sites, len(candidates)]``, rows summing to 1; None without a
    supernet), ``group`` (sites per word of a placements string: 2 for per-sublayer
    genotypes, written ``pre/post``) and ``tail`` (the QK-norm choices every proposed genotype
    carries, as a genotype's ``describe()`` writes them after a bar, e.g. ``"qk qk none"``; empty
    without QK-norm): a proposer varies the placements only, and reads any genotype's
    placements before its bar.

    Raises:
        ValueError: no candidate, ``sites`` < 1 or not a multiple of ``group``, or a ``prior``
            of another shape."""

    candidates: tuple[str, ...]
    sites: int
    prior: Optional[np.ndarray] = None
    group: int = 1
    tail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if not self.candidates or self.sites < 1 or self.group < 1 or self.sites % self.group:
            raise ValueError(f"proposer space: needs candidates and sites >= 1, a multiple of group {self.group}; got "
                             f"{self.candidates} and {self.sites}")
        if self.prior is not None:
            p = np.asarray(self.prior, dtype=float)
            if p.shape != (self.sites, len(self.candidates)):
                raise ValueError(f"proposer space: prior must have shape {(self.sites, len(self.candidates))} (sites, candidates), "
                                 f"got {p.shape}")
            object.__setattr__(self, "prior", p / p.sum(-1, keepdims=True))

    def encode(self, placements: str) -> tuple[int, ...]:
        """``"post pre pre"`` -> ``(1, 0, 0)`` (indices into ``candidates``; ``pre/post`` gives two;
        a QK-norm part after `` | `` is not read).

        Raises:
            ValueError: a placement that is not a candidate, or another number of sites."""
        words = placements.partition(" | ")[0].replace("/", " ").split()
        if len(words) != self.sites or any(w not in self.candidates for w in words):
            raise ValueError(f"proposer: {placements!r} is not {self.sites} placements among {list(self.candidates)}")
        return tuple(self.candidates.index(w) for w in words)

    def decode(self, choices: Sequence[int]) -> str:
        """``(1, 0, 0)`` -> ``"post pre pre"`` (sites joined by ``/`` in groups of ``group``; then
        `` | `` and ``tail`` when there is one)."""
        names = [self.candidates[int(c)] for c in choices]
        text = " ".join("/".join(names[i:i + self.group]) for i in range(0, len(names), self.group))
        return f"{text} | {self.tail}" if self.tail else text


def rung_scores(seen: Seen) -> list[tuple[str, int, float]]:
    """``seen`` with each value replaced by its z-score among the values of its rung (same
    ``steps``): a rung of one value gives 0, a diverged (non-finite) value the rung's highest
    finite z-score plus 1. Lower is better."""
    by_steps: dict[int, list[float]] = {}
    for _, s, v in seen:
        by_steps.setdefault(s, []).append(v)
    out = []
    for placements, s, v in seen:
        finite = [x for x in by_steps[s] if math.isfinite(x)]
        mean = float(np.mean(finite)) if finite else 0.0
        sd = float(np.std(finite)) if len(finite) > 1 else 0.0
        z = [(x - mean) / sd if sd > 0 else 0.0 for x in finite]
        out.append((placements, s, (v - mean) / sd if math.isfinite(v) and sd > 0 else 0.0 if math.isfinite(v) else max(z, default=0.0) + 1))
    return out


def longest(seen: Seen) -> dict[str, float]:
    """Each genotype's z-score (:func:`rung_scores`) at the longest rung it reached."""
    best: dict[str, tuple[int, float]] = {}
    for placements, s, z in rung_scores(seen):
        if placements not in best or s > best[placements][0]:
            best[placements] = (s, z)
    return {g: z for g, (_, z) in best.items()}


class Proposer(ABC):
    """The base of every proposer: ``proposer(round, n, seen, taken)`` returns at most ``n``
    placements strings not in ``taken``, the same for the same arguments (memoised; the random
    stream is seeded by ``(seed, round)``). Subclasses implement :meth:`propose`."""

    name = ""

    def __init__(self, space: Space, seed: int = 0) -> None:
        self.space, self.seed = space, seed
        self._memo: dict = {}

    def __call__(self, r: int, n: int, seen: Seen, taken: frozenset) -> list[str]:
        key = (r, n, tuple(seen), taken)
        if key not in self._memo:
            rng = np.random.default_rng([self.seed, r])
            out: list[str] = []
            for g in self.propose(r, n, list(seen), taken, rng):
                if g not in taken and g not in out:
                    out.append(g)
            self._memo[key] = fill_random(self.space, out[:n], n, taken, rng)
        return list(self._memo[key])

    @abstractmethod
    def propose(self, r: int, n: int, seen: Seen, taken: frozenset, rng: np.random.Generator) -> list[str]:
        """Up to ``n`` new placements strings (duplicates and taken ones are dropped by the caller)."""


def fill_random(space: Space, out: list[str], n: int, taken: frozenset, rng: np.random.Generator) -> list[str]:
    """``out`` filled up to ``n`` with uniform random genotypes outside ``taken`` (fewer when
    the space runs out)."""
    out = list(out)
    size = len(space.candidates) ** space.sites
    tries = 0
    while len(out) < n and len(taken | set(out)) < size and tries < 100 * n:
        g = space.decode(rng.integers(len(space.candidates), size=space.sites))
        tries += 1
        if g not in taken and g not in out:
            out.append(g)
    return out


class RandomProposer(Proposer):
    """Uniform random genotypes (the yardstick: random search through the same race)."""

    name = "random"

    def propose(self, r, n, seen, taken, rng):
        return []  # fill_random does it


class PriorProposer(Proposer):
    """Genotypes drawn site by site from the supernet's final probabilities (uniform without a
    supernet)."""

    name = "prior"

    def propose(self, r, n, seen, taken, rng):
        p = self.space.prior
        if p is None:
            return []
        out: list[str] = []
        for _ in range(50 * n):
            g = self.space.decode([rng.choice(len(self.space.candidates), p=row) for row in p])
            if g not in taken and g not in out:
                out.append(g)
            if len(out) == n:
                break
        return out


class LocalProposer(Proposer):
    """One-site changes around the race's leaders (White et al. 2020): the genotypes measured at
    the longest rung best first, each leader's unmeasured neighbours, the supernet's likelier
    candidates first (in random order without a supernet)."""

    name = "local"

    def propose(self, r, n, seen, taken, rng):
        top = max((s for _, s, _ in seen), default=0)
        at_top = {g: z for g, s, z in rung_scores(seen) if s == top}
        leaders = sorted(at_top, key=lambda g: (at_top[g], g))
        out: list[str] = []
        for leader in leaders:
            base = self.space.encode(leader)
            moves = [(i, c) for i in range(self.space.sites) for c in range(len(self.space.candidates)) if c != base[i]]
            if self.space.prior is not None:
                moves.sort(key=lambda m: -self.space.prior[m[0], m[1]])
            else:
                moves = [moves[k] for k in rng.permutation(len(moves))]
            for i, c in moves:
                g = self.space.decode(base[:i] + (c,) + base[i + 1:])
                if g not in taken and g not in out:
                    out.append(g)
                if len(out) == n:
                    return out
        return out


class RidgeProposer(Proposer):
    """A Bayesian linear model of per-site effects: ``z = sum_i w[i, g_i] + noise`` over the
    one-hot candidates of each site, fitted to the rungs' z-scores (:func:`rung_scores`), prior
    ``w ~ N(m0, PRIOR_SD^2 I)`` with ``m0[i, c]`` minus the site's centred log-probability of ``c``
    (scaled so the prior's genotypes spread by ``PRIOR_SPREAD`` z), noise ``NOISE_SD``. Each
    proposal is the best genotype of one posterior draw of ``w`` (Thompson sampling), argmin per
    site; a draw that gives a taken genotype is drawn again."""

    name = "ridge"
    PRIOR_SD, PRIOR_SPREAD, NOISE_SD = 0.5, 0.5, 0.5

    def posterior(self, seen: Seen) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, covariance)`` of ``w`` flattened (site-major), shapes ``[S*C]`` and ``[S*C, S*C]``."""
        S, C = self.space.sites, len(self.space.candidates)
        m0 = np.zeros(S * C)
        if self.space.prior is not None:
            logp = np.log(np.clip(self.space.prior, 1e-6, 1.0))
            centred = logp - logp.mean(-1, keepdims=True)
            spread = math.sqrt(float(centred.var(-1).sum()))
            if spread > 0:
                m0 = (-self.PRIOR_SPREAD / spread * centred).reshape(-1)
        rows = rung_scores(seen)
        X = np.zeros((len(rows), S * C))
        for k, (g, _, _) in enumerate(rows):
            X[k, [i * C + c for i, c in enumerate(self.space.encode(g))]] = 1.0
        y = np.array([z for _, _, z in rows])
        precision = np.eye(S * C) / self.PRIOR_SD ** 2 + X.T @ X / self.NOISE_SD ** 2
        cov = np.linalg.inv(precision)
        mean = cov @ (m0 / self.PRIOR_SD ** 2 + X.T @ y / self.NOISE_SD ** 2)
        return mean, (cov + cov.T) / 2

    def propose(self, r, n, seen, taken, rng):
        S, C = self.space.sites, len(self.space.candidates)
        mean, cov = self.posterior(seen)
        out: list[str] = []
        for w in rng.multivariate_normal(mean, cov, size=20 * n, method="cholesky"):
            g = self.space.decode(w.reshape(S, C).argmin(-1))
            if g not in taken and g not in out:
                out.append(g)
            if len(out) == n:
                break
        return out


class OptunaProposer(Proposer):
    """An Optuna sampler over the sites as categorical parameters ``site0``, ``site1``, ...:
    each measured genotype a completed trial (its z-score at the longest rung it reached,
    :func:`longest`), then ``n`` asks, each told the worst value seen (a constant liar, so the
    asks differ)."""

    @abstractmethod
    def sampler(self, r: int):
        """The Optuna sampler of round ``r`` (seeded by the proposer's seed and ``r``)."""

    def propose(self, r, n, seen, taken, rng):
        import optuna
        from optuna.distributions import CategoricalDistribution

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        dists = {f"site{i}": CategoricalDistribution(list(self.space.candidates)) for i in range(self.space.sites)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings (multivariate, group, GPSampler)
            study = optuna.create_study(direction="minimize", sampler=self.sampler(r))
            told = longest(seen)
            for g, z in told.items():
                params = {k: self.space.candidates[c] for k, c in zip(dists, self.space.encode(g))}
                study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=z))
            liar = max(told.values(), default=0.0)
            out: list[str] = []
            for _ in range(10 * n):
                trial = study.ask(dists)
                g = self.space.decode([self.space.candidates.index(trial.params[k]) for k in dists])
                study.tell(trial, liar)
                if g not in taken and g not in out:
                    out.append(g)
                if len(out) == n:
                    break
        return out


class TPEProposer(OptunaProposer):
    """Optuna's ``TPESampler(multivariate=True, group=True)`` (:class:`OptunaProposer`)."""

    name = "tpe"

    def sampler(self, r):
        import optuna

        return optuna.samplers.TPESampler(seed=self.seed * 1009 + r, multivariate=True, group=True, n_startup_trials=5,
                                          constant_liar=False)


class GPProposer(OptunaProposer):
    """Optuna's ``GPSampler`` (:class:`OptunaProposer`)."""

    name = "gp"

    def sampler(self, r):
        import optuna

        return optuna.samplers.GPSampler(seed=self.seed * 1009 + r, n_startup_trials=5)


#: ``race.proposer`` -> its class (``none``: no proposer, :data:`autoln.race.rule.PROPOSER_NAMES`).
PROPOSERS: dict[str, type[Proposer]] = {c.name: c for c in (RandomProposer, PriorProposer, LocalProposer, RidgeProposer,
                                                               TPEProposer, GPProposer)}


def make_proposer(name: str, space: Space, seed: int = 0) -> Optional[Proposer]:
    """The proposer ``name`` (a key of :data:`PROPOSERS`) over ``space``, or None for ``none``.

    Raises:
        ValueError: an unknown name."""
    if name == "none":
        return None
    if name not in PROPOSERS:
        raise ValueError(f"race.proposer: expected one of {['none', *PROPOSERS]}, got {name!r}")
    return PROPOSERS[name](space, seed)
