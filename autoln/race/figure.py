"""``race.png``: the race's picture (each entry's value per rung, the finalists' seeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoln.core.io import save_figure_atomic


def race_figure(record: dict, path: Path) -> Path:
    """``race.png``: each entry's value against the rung's steps (seed 0; the final rung's mean
    over seeds), the finalists' seeds as dots, the answer drawn thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    answer = record["verdict"]["answer"]
    for e in record["pool"]:
        mine = [j for j in record["jobs"] if j["entry"] == e["name"] and j["value"] is not None]
        steps = sorted({j["steps"] for j in mine})
        ys = [float(np.mean([j["value"] for j in mine if j["steps"] == s])) for s in steps]
        if not steps:
            continue
        line, = ax.plot(steps, ys, "-o" if e["kind"] == "named" else "--s", lw=3 if e["name"] == answer else 1.2,
                        label=f"{e['name']} ({e.get('origin', e['kind'])})")
        finals = [j["value"] for j in mine if j["steps"] == record["full_steps"]]
        ax.scatter([record["full_steps"]] * len(finals), finals, s=12, color=line.get_color(), alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("retrain steps (rung)")
    ax.set_ylabel(f"valid {record['metric']}")
    ax.set_title(record["verdict"]["line"][:90] + ("..." if len(record["verdict"]["line"]) > 90 else ""), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure_atomic(fig, path)
