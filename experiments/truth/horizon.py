"""Does the answer last? Genotypes retrained at multiples of the retrain budget.

Every figure of ``experiments/common/validate.py`` is a retrain of ``retrain.steps`` steps (1000 by
default), a regime in which placements that start fast win, while users train far longer; a
genotype with blocks that have no norm may win a short run and lose a long one (short-horizon
bias, Wu et al. 2018). Per setting (``validate.py``'s, same ``--out``: its searched genotype is
reused), each of ``--genotypes`` (``searched``, a genotype file, or a named baseline) is
retrained at ``--multipliers`` times the setting's steps (the warm-up as configured, the cosine
schedule stretched to the longer end) for ``--seeds`` seeds, in ``<out>/<setting>/horizon-<steps>``,
reading and extending the retrain table (``experiments/common/retrain_table.py``); then the gap of each
genotype to the best named baseline among them is reported per budget (mean ± std, "within one
standard deviation" a tie, as ``validate.py``'s verdict), with a plot of the gaps against the
budget (``<out>/horizon.png``) and ``<out>/horizon.md`` / ``.json``.

    python experiments/truth/horizon.py --data WIKITEXT_FOLDER [--settings shallow] [--multipliers 1,2,4]
        [--genotypes searched,mix-ln,all-post] [--seeds 3] [--out runs/validate]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.validate import (add_common_arguments, each_setting, merge_saved, positive_int, searched_genotype, setting_config,  # noqa: E402
                                         verdict, write_outputs)

from autoln.cli import OneLineParser, guarded  # noqa: E402


def positive_ints(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated positive integers, e.g. ``1,2,4``."""
    import argparse

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def run_setting(name: str, overrides: list[str], config: str | None, multipliers: list[int], genotypes: list[str],
                seeds: int, out: Path, workers: int = 1, table: Path | None = None) -> dict:
    """Retrain ``genotypes`` at each multiple of the setting's steps; returns the numbers."""
    from autoln.data import HEADLINE
    from autoln.models.genotype import is_baseline
    from experiments.common.retrain_table import compare_with_table

    cfg = setting_config(name, overrides, config)
    headline = HEADLINE[cfg.data.tokenizer]
    specs = [str(searched_genotype(cfg, name, out)) if g == "searched" else g for g in genotypes]
    budgets = []
    for m in multipliers:
        steps = cfg.retrain.steps * m
        # as many evaluations as at 1x (the 1x runs are the setting's own comparison's)
        longer = dataclasses.replace(cfg, retrain=dataclasses.replace(cfg.retrain, steps=steps, eval_every=cfg.retrain.eval_every * m))
        folder = out / name / ("compare" if m == 1 else f"horizon-{steps}")
        files = [s for s in specs if not is_baseline(s)]
        entries = compare_with_table(longer, name, files, [s for s in specs if is_baseline(s)], seeds, folder, table, workers=workers)
        labels = [g for g in genotypes if not is_baseline(g)] + [g for g in genotypes if is_baseline(g)]  # run_compare's order
        rows = [{"genotype": g, "placements": e.placements, "valid": [r["valid"][headline] for r in e.runs if r is not None]}
                for g, e in zip(labels, entries)]
        budgets.append({"multiplier": m, "steps": steps, "rows": rows, **gaps(rows)})
    return {"setting": name, "headline": headline, "seeds": seeds, "budgets": budgets}


def gaps(rows: list[dict]) -> dict:
    """Each non-baseline genotype's gap (mean valid minus the best named baseline's mean, lower
    is better) and verdict against the best named baseline of ``rows``."""
    from autoln.models.genotype import is_baseline

    named = [r for r in rows if is_baseline(r["genotype"]) and r["valid"]]
    if not named:
        return {"best_baseline": None, "gaps": {}}
    best = min(named, key=lambda r: statistics.mean(r["valid"]))
    out = {}
    for r in rows:
        if not is_baseline(r["genotype"]) and r["valid"]:
            one = len(r["valid"]) < 2 or len(best["valid"]) < 2  # no standard deviation: no verdict
            out[r["genotype"]] = {"gap": statistics.mean(r["valid"]) - statistics.mean(best["valid"]),
                                  "verdict": "one seed, no verdict against" if one else verdict(r["valid"], best["valid"])}
    return {"best_baseline": best["genotype"], "gaps": out}


def fmt(values: list[float]) -> str:
    """``mean ± std (n seeds)``."""
    if not values:
        return "-"
    return f"{statistics.mean(values):.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "") + f" ({len(values)})"


def markdown(results: list[dict]) -> str:
    """One table per setting: rows genotypes, columns budgets, and the gap line."""
    lines = ["# Does the answer last? Retrains at multiples of the retrain budget", ""]
    for r in results:
        budgets = r["budgets"]
        lines += [f"## {r['setting']}", "", f"valid {r['headline']}, mean ± std (seeds)", "",
                  "| genotype | " + " | ".join(f"{b['steps']} steps" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
        for i, row in enumerate(budgets[0]["rows"]):
            lines.append(f"| {row['genotype']} (`{row['placements']}`) | " + " | ".join(fmt(b["rows"][i]["valid"]) for b in budgets) + " |")
        for g in budgets[0]["gaps"]:
            lines.append("")
            lines.append(f"Gap of {g} to the best named baseline: " + "; ".join(
                f"{b['steps']} steps {b['gaps'][g]['gap']:+.3f} ({b['gaps'][g]['verdict']} {b['best_baseline']})"
                for b in budgets if g in b["gaps"]) + ".")
        lines.append("")
    return "\n".join(lines)


def figure(results: list[dict]):
    """The gap to the best named baseline against the budget, one line per searched genotype."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for r in results:
        for g in r["budgets"][0]["gaps"]:
            pts = [(b["steps"], b["gaps"][g]["gap"]) for b in r["budgets"] if g in b["gaps"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{r['setting']}: {g}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="retrain steps", ylabel=f"gap to the best named baseline ({results[0]['headline']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = OneLineParser(prog="horizon.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow")
    p.add_argument("--multipliers", type=positive_ints, default=[1, 2, 4], help="multiples of retrain.steps (default 1,2,4)")
    p.add_argument("--genotypes", default="searched,mix-ln,all-post", help="searched, genotype files or named baselines")
    p.add_argument("--seeds", type=positive_int, default=3)
    args = p.parse_args(argv)

    def body() -> None:
        genotypes = [g.strip() for g in args.genotypes.split(",") if g.strip()]
        fresh = each_setting(args, "horizon.py", lambda n, overrides, out: run_setting(
            n, overrides, args.config, args.multipliers, genotypes, args.seeds, out, args.workers, args.table))
        results = merge_saved(Path(args.out), "horizon", fresh, argv)
        write_outputs(Path(args.out), "horizon", markdown(results), results, figure(results))

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
