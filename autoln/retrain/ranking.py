"""Means over seeds and the tie rule shared by ``retrain.py --compare`` and ``autoln.compare_genotypes``.

A difference of two means within one standard deviation over seeds (the larger of the two
sample standard deviations) is a tie: with 3 seeds a smaller gap is not told apart from seed
noise. Lower is better throughout (a loss, bits per byte).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence


#: The values' resolution (in their own unit: bits per byte, nats): two values closer than this
#: are equal, whatever their spread says. The tables keep 6 decimals, the printout 4; a
#: difference of 1e-12 is float rounding, not a result.
RESOLUTION = 1e-6


def mean_std(values: Sequence[float]) -> str:
    """``mean ± std`` (sample std) of the finite ``values`` at 4 decimals; the value alone for one; ``-`` for none."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def stats(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, sample std)`` of the finite ``values`` (a NaN or inf score is a diverged run,
    left out as ``retrain.py --compare`` leaves out diverged seeds): ``(inf, 0)`` for none, std
    0 for one."""
    values = [float(v) for v in values if math.isfinite(float(v))]
    if not values:
        return float("inf"), 0.0
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def is_tie(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when the means of ``a`` and ``b`` (values per seed) differ by at most the larger of
    their two standard deviations, or by less than :data:`RESOLUTION` (equal); otherwise never
    with fewer than two values on either side (one seed tells no noise)."""
    (ma, sa), (mb, sb) = stats(a), stats(b)  # stats leaves the non-finite values out
    if math.isfinite(ma) and math.isfinite(mb) and abs(ma - mb) < RESOLUTION:
        return True
    if sum(map(math.isfinite, a)) < 2 or sum(map(math.isfinite, b)) < 2:
        return False
    return abs(ma - mb) <= max(sa, sb)


def vs_best(gap: float, sd: float, seeds: int, best: bool) -> str:
    """The ``vs_best`` cell of a comparison row: ``best``, ``-`` (no finished run), ``+0.0000
    (tie: equal)`` when ``gap`` is below :data:`RESOLUTION`, or ``+gap`` with `` (tie: within one
    std)`` when ``gap <= sd`` over two or more seeds."""
    if best:
        return "best"
    if not math.isfinite(gap):
        return "-"
    if gap < RESOLUTION:
        return f"+{gap:.4f} (tie: equal)"
    return f"+{gap:.4f}" + (" (tie: within one std)" if seeds > 1 and gap <= sd else "")
