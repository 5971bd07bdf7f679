"""``race.png``: the race in one picture, and its TensorBoard entries (docs/race.md, *Outputs*).

The picture has three panels and a caption: the short rungs (the searched entries at seed 0, per
rung), every entry at the full budget (seed 0, one row each, on the scale of those values alone:
a short rung's higher losses do not squeeze them into a corner) and the final (the finalists
paired by seed, one line per seed, their means and the paired test). Below them the whole
verdict, wrapped to the figure's width. Markers that could share a place are set side by side
(a rung's entries, a finalist's seeds), so no marker hides another.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from autoln.core.io import save_figure_atomic

#: The figure's width and the panels' height (inches), the caption's font size (points).
WIDTH, PANELS_H, CAPTION_PT = 13.0, 4.6, 8.5
#: A caption character's width at most, in ems of its font (DejaVu Sans: about 0.55 on average).
CHAR_EM = 0.62


def caption_text(line: str, width_in: float = WIDTH, font_pt: float = CAPTION_PT) -> str:
    """``line`` wrapped to lines that fit ``width_in`` inches of ``font_pt`` text (less a
    margin): every word kept, none cut."""
    chars = int(0.96 * width_in * 72 / (font_pt * CHAR_EM))
    return textwrap.fill(line, width=chars, break_long_words=True, break_on_hyphens=False)


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


def short_panel(ax, record: dict, colours: dict) -> None:
    """The searched entries' seed-0 values at each short rung, a rung's entries side by side,
    an entry's points joined from rung to rung."""
    full = record["full_steps"]
    jobs = [j for j in record["jobs"] if j["seed"] == 0 and j["steps"] < full]
    steps = sorted({j["steps"] for j in jobs})
    ax.set_title("short rungs (searched entries, seed 0)", fontsize=9)
    if not steps:
        ax.text(0.5, 0.5, "no short rung ran", ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    points: dict[str, list[tuple[float, float]]] = {}
    for k, s in enumerate(steps):
        here = [j for j in jobs if j["steps"] == s and _finite(j["value"])]
        gap = 0.8 / max(len(here), 1)
        for i, j in enumerate(here):
            points.setdefault(j["entry"], []).append((k + (i - (len(here) - 1) / 2) * gap, float(j["value"])))
    for name, xy in points.items():
        xs, ys = zip(*xy)
        ax.plot(xs, ys, "-s", color=colours[name], ms=5, lw=0.8, label=name)
    ax.set_xticks(range(len(steps)), labels=[f"{s} steps" for s in steps])
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_ylabel(f"valid {record['metric']}")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(points), 3), frameon=False)


def full_panel(ax, record: dict, colours: dict) -> None:
    """Every entry's seed-0 value at the full budget, one row each, the best at the top; the
    answer bold."""
    full, answer = record["full_steps"], record["verdict"]["answer"]
    kinds = {e["name"]: e["kind"] for e in record["pool"]}
    seed0 = {j["entry"]: j["value"] for j in record["jobs"] if j["steps"] == full and j["seed"] == 0}
    order = sorted(seed0, key=lambda n: (not _finite(seed0[n]), float(seed0[n]) if _finite(seed0[n]) else 0.0))
    labels = []
    for i, name in enumerate(order):
        y, value = len(order) - 1 - i, seed0[name]
        shown = f"{float(value):.4f}" if _finite(value) else "diverged"
        labels.append(f"{name} ({kinds.get(name, '?')}) {shown}")
        if _finite(value):
            ax.plot([float(value)], [y], "o" if kinds.get(name) == "named" else "s", color=colours[name],
                    ms=8 if name == answer else 6, mec="black" if name == answer else colours[name])
    ax.set_yticks(range(len(order)), labels=labels[::-1], fontsize=8)
    for tick in ax.get_yticklabels():
        tick.set_fontweight("bold" if tick.get_text().startswith(f"{answer} (") else "normal")
    ax.set_ylim(-0.7, len(order) - 0.3)
    ax.margins(x=0.12)
    ax.set_xlabel(f"valid {record['metric']}")
    ax.set_title(f"every entry at the full budget ({full} steps, seed 0)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def final_panel(ax, record: dict) -> None:
    """The finalists at the full budget, one line per seed joining a seed's values (the pairs of
    the paired test), each finalist's seeds side by side, its mean a black bar."""
    v = record["verdict"]
    names = list(v["values"])
    seeds = max((len(x) for x in v["values"].values()), default=0)
    gap = 0.45 / max(seeds - 1, 1)
    for i in range(seeds):
        xy = [(k + (i - (seeds - 1) / 2) * gap, float(v["values"][n][i])) for k, n in enumerate(names)
              if i < len(v["values"][n]) and _finite(v["values"][n][i])]
        if xy:
            xs, ys = zip(*xy)
            ax.plot(xs, ys, "-o", color=f"C{i % 10}", ms=5, lw=1, label=f"seed {i}")
    labels = []
    for k, n in enumerate(names):
        vals = [float(x) for x in v["values"][n] if _finite(x)]
        if vals:
            mean, sd = float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
            ax.hlines(mean, k - 0.35, k + 0.35, colors="black", lw=2)
            labels.append(f"{n}\nmean {mean:.4f}\n± {sd:.4f}" if len(vals) > 1 else f"{n}\n{mean:.4f}")
        else:
            labels.append(f"{n}\ndiverged")
    ax.set_xticks(range(len(names)), labels=labels, fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    p = v.get("p_value")
    test = f"paired t-test p = {p:.3g}" if p is not None else "no test: stopped at seed 0"
    ax.set_title(f"the final: {seeds} seed{'s' if seeds != 1 else ''}, {test}", fontsize=9)
    ax.set_ylabel(f"valid {record['metric']} at {record['full_steps']} steps")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.27), ncol=min(seeds, 6), frameon=False)


def race_figure_of(record: dict):
    """The figure of ``race.json``'s ``record`` (module docstring): a matplotlib ``Figure`` (the
    caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {e["name"]: f"C{i % 10}" for i, e in enumerate(record["pool"])}
    caption = caption_text(record["verdict"]["line"])
    caption_h = (caption.count("\n") + 1) * 1.3 * CAPTION_PT / 72 + 0.2
    fig = plt.figure(figsize=(WIDTH, PANELS_H + caption_h))
    axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.25, 1.0]})
    short_panel(axes[0], record, colours)
    full_panel(axes[1], record, colours)
    final_panel(axes[2], record)
    v = record["verdict"]
    fig.suptitle(f"the race: answer {v['answer']} ({v['outcome']})", fontsize=11)
    fig.text(0.01, 0.1 / fig.get_figheight(), caption, ha="left", va="bottom", fontsize=CAPTION_PT)
    fig.tight_layout(rect=(0, caption_h / fig.get_figheight(), 1, 1))
    return fig


def race_figure(record: dict, path: Path) -> Path:
    """Write ``race.png`` (:func:`race_figure_of`) to ``path``. Returns the path."""
    import matplotlib.pyplot as plt

    fig = race_figure_of(record)
    try:
        return save_figure_atomic(fig, path)
    finally:
        plt.close(fig)


def race_tensorboard(record: dict, race_dir: Path) -> None:
    """The race's TensorBoard entries under ``race_dir``: per entry a run ``hparams/<entry>`` for
    the HParams table (entry, kind, origin, placements, answer; its value at each rung and seed,
    ``race/steps<S>_seed<i>``, and the full budget's mean, ``race/final_mean``), and the run
    ``verdict`` with the text ``race/verdict`` (the verdict line and the rule)."""
    from autoln.core.tb import Logger
    from autoln.tune import write_hparams

    answer = record["verdict"]["answer"]
    for e in record["pool"]:
        mine = [j for j in record["jobs"] if j["entry"] == e["name"] and j["value"] is not None]
        metrics = {f"race/steps{j['steps']}_seed{j['seed']}": j["value"] for j in mine}
        finals = [j["value"] for j in mine if j["steps"] == record["full_steps"]]
        if finals:
            metrics["race/final_mean"] = float(np.mean(finals))
        write_hparams(race_dir / "hparams" / e["name"], {"entry": e["name"], "kind": e["kind"], "origin": e.get("origin", e["kind"]),
                                                         "placements": e["placements"], "answer": e["name"] == answer}, metrics)
    with Logger(race_dir / "verdict") as log:
        log.text("race/verdict", f"{record['verdict']['line']}\n\nrule: {record['rule']}")
