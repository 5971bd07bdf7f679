"""Successive halving within a wall-time budget (Jamieson & Talwalkar 2016), as random search's
baseline runs it (Li & Talwalkar 2019): the one rule shared by the real run
(``experiments/race/random_search.py``) and its simulation from the retrain table
(``experiments/common/retrain_table.py simulate``, as NAS-Bench-201 evaluates black-box methods from
its table), so the two can only differ in the measurements they are given.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable, Sequence


def rung_steps(min_steps: int, eta: int, full_steps: int) -> list[int]:
    """Steps of each rung: ``min_steps * eta^k`` up to ``full_steps / eta`` (the last rung picks
    the genotype that is then retrained at ``full_steps``), at least one rung.
    E.g. ``(100, 3, 1000) -> [100, 300]``; ``(100, 2, 1000) -> [100, 200, 400]``."""
    steps = [min_steps]
    while steps[-1] * eta * eta <= full_steps:
        steps.append(steps[-1] * eta)
    return steps


def successive_halving(pool: Iterable[int], budget_s: float, rungs: Sequence[int], eta: int,
                       evaluate: Callable[[int, int], tuple[float, float]]) -> list[list[dict]]:
    """Run successive halving over the candidates of ``pool`` (indices, in the order they are
    drawn) and return each rung's evaluations, ``[{"index", "valid", "wall_time_s"}, ...]``.

    Each rung gets an equal share of ``budget_s`` (seconds; what a rung leaves unspent passes to
    the next). Rung 0 evaluates pool entries in order until its share is spent; rung ``k``
    evaluates the best ``ceil(n / eta)`` of rung ``k - 1`` (lowest valid first) while its share
    lasts. A run is started only when the rung's mean cost so far (for a rung's first run, the
    last rung's mean scaled by the steps) fits in what is left; rung 0's first run always
    starts. ``evaluate(index, k)`` trains candidate ``index`` at rung ``k`` and returns
    ``(valid metric, lower is better; cost in seconds)``.
    """
    share_left = 0.0
    history: list[list[dict]] = []
    for k, steps in enumerate(rungs):
        share_left += budget_s / len(rungs)
        if k == 0:
            candidates: Iterable[int] = pool
        else:
            ranked = sorted(history[-1], key=lambda r: r["valid"])
            candidates = [r["index"] for r in ranked[:max(1, math.ceil(len(ranked) / eta))]]
        done: list[dict] = []
        mean_cost = statistics.mean(r["wall_time_s"] for r in history[-1]) * steps / rungs[k - 1] if k and history[-1] else None
        for i in candidates:
            if mean_cost is not None and mean_cost > share_left:
                break  # the next run would overspend this rung's share
            valid, cost = evaluate(i, k)
            share_left -= cost
            done.append({"index": i, "valid": float(valid), "wall_time_s": float(cost)})
            mean_cost = statistics.mean(r["wall_time_s"] for r in done)
        history.append(done)
    return history


def best_of_last_rung(history: list[list[dict]]) -> dict | None:
    """The answer of successive halving: the lowest finite valid of the last rung that ran (of
    any rung when every run of the last diverged); None when nothing finite was measured."""
    last = [r for r in history[-1] if math.isfinite(r["valid"])] if history else []
    last = last or [r for h in history for r in h if math.isfinite(r["valid"])]
    return min(last, key=lambda r: r["valid"]) if last else None
