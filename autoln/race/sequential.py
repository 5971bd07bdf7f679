"""The race's final as a group-sequential test: seed by seed, a searched finalist may win at any
look from ``final_seeds`` to ``max_seeds`` seeds, with a false-win rate over all looks of at most
``level`` (docs/race.md, *The final*).

The design (Jennison & Turnbull 2000, *Group Sequential Methods with Applications to Clinical
Trials*, ch. 2-3 and 7):

- **Looks.** The final measures both finalists seed by seed (paired: same seed, same batches).
  The test looks at ``n_k = final_seeds, final_seeds + 1, ..., max_seeds`` seeds, information
  fractions ``t_k = n_k / max_seeds``.
- **Efficacy boundaries from an alpha-spending function** (Lan & DeMets 1983): the cumulative
  false-win probability allowed by look ``k`` is ``alpha(t_k)``, with the O'Brien-Fleming type
  ``alpha(t) = 2 - 2 Phi(z_{1 - level/2} / sqrt(t))`` or the Pocock type
  ``alpha(t) = level * ln(1 + (e - 1) t)``; both give ``alpha(1) = level``. For standardised sums
  of paired differences ``Z_k = S_k / sqrt(n_k)`` (a Brownian motion at times ``n_k``) the
  boundaries ``c_k`` solve ``P(Z_j > -c_j for j < k, Z_k <= -c_k) = alpha(t_k) - alpha(t_{k-1})``
  under the null; :func:`z_boundaries` computes them by recursive numerical integration
  (Armitage, McPherson & Rowe 1969) on a grid.
- **Unknown variance: exact t boundaries** (Jennison & Turnbull 1991, "Exact calculations for
  sequential t, chi-squared and F tests", Biometrika 78): the paired t statistics ``T_k`` at the
  looks have a joint null law free of the variance, so :func:`t_boundaries` spends ``level`` on
  them directly (from seeded null paths), and the searched finalist wins at look ``k`` when
  ``T_k <= b_k``. (The *significance level approach*, J&T 2000 §3.8, reads nominal levels off
  :func:`z_boundaries`; with 3 to 6 seeds it lets about 5.4 % of null finals win at level 5 %,
  docs/race.md, so it is kept only as the normal-theory reference.) With a single look
  (``final_seeds == max_seeds``) the boundary is Student's quantile: the plain paired t-test.
- **Futility** (non-binding, so it only lowers the false-win rate): the final stops, and the
  named placement is the answer, as soon as the searched finalist is not ahead on the mean of
  the paired differences, or can no longer reach a boundary at any look left.

The false-win rate and the power of the design are measured by :func:`simulate` (docs/race.md,
*The final, measured*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

SPENDING = ("obrien-fleming", "pocock")


def spent(t: float, level: float, kind: str) -> float:
    """The cumulative false-win probability ``alpha(t)`` a spending function allows by
    information fraction ``t`` in ``[0, 1]`` (module docstring; Lan & DeMets 1983; Kim & DeMets 1987).

    Raises:
        ValueError: an unknown ``kind`` (one of :data:`SPENDING`)."""
    from scipy.stats import norm

    if t <= 0:
        return 0.0
    if kind == "obrien-fleming":
        return float(2 - 2 * norm.cdf(norm.ppf(1 - level / 2) / math.sqrt(min(t, 1.0))))
    if kind == "pocock":
        return float(level * math.log(1 + (math.e - 1) * min(t, 1.0)))
    raise ValueError(f"race.spending: expected one of {list(SPENDING)}, got {kind!r}")


@lru_cache(maxsize=64)
def z_boundaries(looks: tuple[int, ...], level: float, kind: str, grid: int = 4001) -> tuple[float, ...]:
    """The efficacy boundaries ``c_k`` (standard-normal units, lower values win: ``Z_k <= -c_k``)
    at ``looks`` (seeds at each look, increasing), spending ``level`` by :func:`spent` over the
    information fractions ``looks[k] / looks[-1]``.

    The null density of ``S_k`` (the sum of ``n_k`` standard-normal differences) on the paths
    that have not crossed is carried on a grid from look to look (convolution with
    ``N(0, n_k - n_{k-1})``); each ``c_k`` is found by bisection so that the probability of
    crossing first at look ``k`` equals the increment of :func:`spent`.

    Raises:
        ValueError: ``looks`` empty or not increasing, ``level`` outside (0, 0.5), an unknown ``kind``."""
    import numpy as np
    from scipy.stats import norm

    if not looks or any(b <= a for a, b in zip(looks, looks[1:])) or looks[0] < 1:
        raise ValueError(f"race final: looks must be increasing positive seed counts, got {list(looks)}")
    if not 0 < level < 0.5:
        raise ValueError(f"race.level: expected a number in (0, 0.5), got {level}")
    n_max = looks[-1]
    half = 10.0 * math.sqrt(n_max)
    s = np.linspace(-half, half, grid)
    ds = s[1] - s[0]
    density = None  # of S on the continuing paths, at the last look
    bounds: list[float] = []
    before = 0.0
    for k, n in enumerate(looks):
        if density is None:
            f = norm.pdf(s, scale=math.sqrt(n))
        else:
            kernel = norm.pdf(np.arange(-(grid - 1), grid) * ds, scale=math.sqrt(n - looks[k - 1]))
            f = _convolve(density, kernel, grid) * ds
        target = spent(n / n_max, level, kind) - before
        before += target

        cdf = (np.cumsum(f) - f / 2) * ds  # P(S <= s) on the continuing paths (trapezoid), read between grid points linearly

        def crossing(c: float) -> float:
            return float(np.interp(-c * math.sqrt(n), s, cdf))

        lo, hi = 0.0, 12.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if crossing(mid) > target else (lo, mid)
        c = (lo + hi) / 2
        bounds.append(c)
        density = np.where(s > -c * math.sqrt(n), f, 0.0)
    return tuple(bounds)


def _convolve(density, kernel, grid: int):
    """``density`` (on the grid) convolved with ``kernel`` (on offsets ``-(grid-1)..grid-1``),
    back on the same grid."""
    import numpy as np

    full = np.convolve(density, kernel)  # length 3 * grid - 2; index grid - 1 + i is grid point i
    return full[grid - 1:2 * grid - 1]


@lru_cache(maxsize=64)
def t_boundaries(looks: tuple[int, ...], level: float, kind: str, paths: int = 400_000, seed: int = 0) -> tuple[float, ...]:
    """The efficacy boundaries of the paired t statistic itself (win: ``T_k <= b_k``) at
    ``looks``, spending ``level`` by :func:`spent`: exact for normal differences of any variance
    up to Monte Carlo error (Jennison & Turnbull 1991, "Exact calculations for sequential t,
    chi-squared and F tests", Biometrika 78: the joint law of ``T_1..T_K`` does not depend on the
    variance, so ``paths`` null paths of standard-normal differences, drawn with ``seed``, give
    it). Each ``b_k`` is the quantile of ``T_k`` among the paths that have not crossed that makes
    the probability of crossing first at look ``k`` the increment of :func:`spent`. The first
    look's is Student's quantile ``t_{n_1 - 1}(alpha(t_1))`` exactly.

    Raises:
        ValueError: ``looks`` not increasing or below 2 seeds, ``level`` outside (0, 0.5), an unknown ``kind``."""
    import numpy as np
    from scipy.stats import t as student

    if not looks or any(b <= a for a, b in zip(looks, looks[1:])) or looks[0] < 2:
        raise ValueError(f"race final: looks must be increasing seed counts of at least 2, got {list(looks)}")
    if not 0 < level < 0.5:
        raise ValueError(f"race.level: expected a number in (0, 0.5), got {level}")
    n_max = looks[-1]
    first = float(student.ppf(spent(looks[0] / n_max, level, kind), looks[0] - 1))
    if len(looks) == 1:
        return (first,)
    d = np.random.default_rng(seed).standard_normal((paths, n_max))
    s, q = np.cumsum(d, 1), np.cumsum(d * d, 1)
    alive = np.ones(paths, dtype=bool)
    bounds: list[float] = []
    crossed_so_far = 0
    for k, n in enumerate(looks):
        mean = s[:, n - 1] / n
        stat = mean / np.sqrt((q[:, n - 1] - n * mean ** 2) / (n - 1) / n)
        if k == 0:
            b = first
        else:
            want = int(round(spent(n / n_max, level, kind) * paths)) - crossed_so_far
            live = np.sort(stat[alive])
            b = float(live[want - 1]) if want > 0 else -math.inf
        crossed = alive & (stat <= b)
        crossed_so_far += int(crossed.sum())
        alive &= ~crossed
        bounds.append(b)
    return tuple(bounds)


@dataclass(frozen=True)
class Design:
    """The final's group-sequential design: ``first`` (seeds at the first look, the rule's
    ``final_seeds``), ``most`` (``race.max_seeds``), ``level`` and ``spending`` (:data:`SPENDING`).

    Raises:
        ValueError: ``first`` < 2, ``most`` < ``first``, ``level`` outside (0, 0.5), an unknown spending."""

    first: int = 3
    most: int = 6
    level: float = 0.05
    spending: str = "obrien-fleming"

    def __post_init__(self) -> None:
        if self.first < 2 or self.most < self.first:
            raise ValueError(f"race final: needs 2 <= final_seeds <= max_seeds, got final_seeds {self.first}, max_seeds {self.most}")
        if not 0 < self.level < 0.5:
            raise ValueError(f"race.level: expected a number in (0, 0.5), got {self.level}")
        if self.spending not in SPENDING:
            raise ValueError(f"race.spending: expected one of {list(SPENDING)}, got {self.spending!r}")

    @property
    def looks(self) -> tuple[int, ...]:
        """The seed counts at which the test looks: ``first, first + 1, ..., most``."""
        return tuple(range(self.first, self.most + 1))

    def nominal(self) -> dict[int, float]:
        """``{seeds: nominal one-sided level}`` at each look: Student's p-value of the look's
        boundary (:func:`t_boundaries`; the plain ``level`` for a single look)."""
        return dict(_levels(self.first, self.most, self.level, self.spending))

    def t_bound(self, n: int) -> float:
        """The paired t statistic's boundary at look ``n`` (win: ``t <= bound``; :func:`t_boundaries`).

        Raises:
            KeyError: ``n`` is not a look."""
        return dict(_levels(self.first, self.most, self.level, self.spending, t=True))[n]

    def describe(self) -> str:
        """The design in one clause, for the verdict line and the rule's description."""
        if self.first == self.most:
            return f"a one-sided paired t-test at level {self.level} over {self.first} seeds"
        kind = {"obrien-fleming": "O'Brien-Fleming", "pocock": "Pocock"}[self.spending]
        return (f"a group-sequential one-sided paired t-test at level {self.level} (looks at {self.first} to {self.most} seeds, "
                f"{kind} spending)")


@lru_cache(maxsize=64)
def _levels(first: int, most: int, level: float, spending: str, t: bool = False) -> tuple[tuple[int, float], ...]:
    """:meth:`Design.t_bound` (``t``) or :meth:`Design.nominal` as pairs ``(seeds, value)``, cached:
    the boundaries of :func:`t_boundaries` and their one-sided p-values under Student's t."""
    from scipy.stats import t as student

    looks = tuple(range(first, most + 1))
    bounds = t_boundaries(looks, level, spending)
    return tuple((n, b if t else float(student.cdf(b, n - 1))) for n, b in zip(looks, bounds))


def reachable(diffs: Sequence[float], n: int, bound: float) -> bool:
    """Whether some values of the paired differences at seeds ``len(diffs)..n-1`` could bring
    the paired t statistic over ``n`` seeds to ``bound`` or below (lower wins). For a given sum
    of the ``m = n - len(diffs)`` future values their spread only raises the statistic, so they
    are taken equal, ``x``: the least statistic over ``x`` is found on a logarithmic grid of
    negative values, with its limit ``-sqrt(m (n - 1) / (n - m))`` as ``x -> -inf``."""
    k = len(diffs)
    m = n - k
    if m <= 0:
        return t_stat(list(diffs)[:n]) <= bound
    if k == 0:
        return True
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    x = -max(1e-12, float(np.abs(d).max())) * 10 ** (np.arange(-80, 121) / 20)  # the future value, on a log grid
    total = d.sum() + m * x
    mean = total / n
    ss = ((d[None, :] - mean[:, None]) ** 2).sum(1) + m * (x - mean) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        stat = np.where(ss > 0, mean / np.sqrt(ss / (n - 1) / n), np.where(mean < 0, -np.inf, np.inf))
    return min(float(stat.min()), -math.sqrt(m * (n - 1) / (n - m))) <= bound


def t_stat(diffs: Sequence[float]) -> float:
    """The paired t statistic ``mean(d) / (sd(d) / sqrt(n))`` of the differences ``d`` (searched
    minus named; lower is better), ``-inf``/``inf`` when every difference is equal and below/not
    below 0, ``nan`` for fewer than 2."""
    n = len(diffs)
    if n < 2:
        return math.nan
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    if var == 0:
        return -math.inf if mean < 0 else math.inf
    return mean / math.sqrt(var / n)


def resolved(diffs: Sequence[float]) -> list[float]:
    """``diffs`` with every difference smaller than the values' resolution
    (:data:`autoln.retrain.ranking.RESOLUTION`) set to 0: float rounding is no lead."""
    from autoln.retrain.ranking import RESOLUTION

    return [0.0 if abs(d) < RESOLUTION else d for d in diffs]


def decide(diffs: Sequence[float], design: Design) -> str:
    """Where the final stands after ``len(diffs)`` seeds (``diffs``: searched minus named per
    seed, lower is better; a diverged searched run is ``+inf``, a diverged named one ``-inf``):
    ``win`` (the searched finalist crossed the boundary at this look), ``lose`` (futility: not
    ahead on the mean, or no boundary left within reach; or the last look passed without a
    win) or ``go on`` (run the next seed). Differences below the values' resolution count as 0
    (:func:`resolved`)."""
    diffs = resolved(diffs)
    n = len(diffs)
    if n == 0:
        return "go on"
    if any(math.isinf(d) and d > 0 or math.isnan(d) for d in diffs):
        return "lose"
    if any(math.isinf(d) for d in diffs):  # only the named finalist diverged: a seed it cannot answer
        return "win" if n >= design.first else "go on"
    if sum(diffs) >= 0:
        return "lose"
    if n in design.looks and t_stat(diffs) <= design.t_bound(n):
        return "win"
    if n >= design.most:
        return "lose"
    ahead = [m for m in design.looks if m > n]
    return "go on" if any(reachable(diffs, m, design.t_bound(m)) for m in ahead) else "lose"


def simulate(design: Design, lead_sd: float, runs: int, seed: int = 0, noise: Optional[Sequence[float]] = None) -> dict:
    """Finals of ``design`` on paired differences ``-lead_sd + e`` per seed (the searched
    finalist ahead by ``lead_sd`` paired standard deviations; 0: the null), ``e`` standard
    normal, or drawn with replacement from ``noise`` (residuals of real paired differences
    scaled to unit variance, e.g. the tables' own). Returns ``{"win": fraction won, "win_se":
    its Monte Carlo standard error, "seeds": mean seeds run per finalist}``.

    Raises:
        ValueError: ``runs`` < 1, or an empty ``noise``."""
    import numpy as np

    if runs < 1:
        raise ValueError(f"simulate: runs must be positive, got {runs}")
    rng = np.random.default_rng(seed)
    if noise is None:
        draws = rng.normal(0.0, 1.0, size=(runs, design.most))
    else:
        pool = np.asarray(noise, dtype=float)
        if pool.size == 0:
            raise ValueError("simulate: noise is empty")
        draws = rng.choice(pool, size=(runs, design.most), replace=True)
    draws = draws - lead_sd
    wins, seeds = 0, 0
    for row in draws:
        for n in range(1, design.most + 1):
            state = decide(row[:n].tolist(), design)
            if state != "go on":
                break
        wins += state == "win"
        seeds += n
    p = wins / runs
    return {"win": p, "win_se": math.sqrt(max(p * (1 - p), 1e-12) / runs), "seeds": seeds / runs}
