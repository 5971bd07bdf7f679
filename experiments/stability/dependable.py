"""Is a single search dependable? One search method at several search seeds, each answer retrained.

Per setting of ``experiments/common/validate.py`` (same ``--out``; seed 0 of ``default`` is validate's
own search, reused), ``--method`` is run at each of ``--search-seeds``, and each answer is
retrained at seed 0 (``--retrain-seeds`` more on request) in the setting's shared comparison
folder, reading and extending the retrain table (``experiments/common/retrain_table.py``). Methods
(the order of issue 34's rule, docs/results.md):

- ``default``: ``search.py`` as it is;
- ``consensus3``: a consensus of 3 searches of a third of the steps (warm-ups scaled alike),
  inside one search's budget (``search.py --seeds 3``'s vote);
- ``fair``: FairNAS's strict-fairness training of the shared weights (``search.weight_mode:
  fair``), alphas fixed, genotypes scored on the supernet (``selection: score``);
- ``spos``: SPOS's one uniform path per weight step, likewise scored.

The report (``<out>/dependable.md`` and ``.json``) gives per method and setting each search
seed's answer, its seed-0 valid, wall time, the spread over search seeds (std) against a
retrain's seed std where the table has one, and, where ``ground_truth.py`` has sampled the
space, each answer's percentile.

    python experiments/stability/dependable.py --data WIKITEXT_FOLDER [--settings shallow] [--method default]
        [--search-seeds 0,1,2,3,4] [--out runs/validate]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.validate import add_common_arguments, each_setting, merge_saved, searched_genotype, setting_config, write_outputs  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402

#: Each method's ``--set`` overrides on top of the setting's (a callable of the default steps).
METHODS = {
    "default": lambda sc: [],
    "consensus3": lambda sc: [f"search.steps={sc.steps // 3}", f"search.arch_warmup_steps={sc.arch_warmup_steps // 3}",
                              f"search.warmup_steps={sc.warmup_steps // 3}"],
    "fair": lambda sc: ["search.weight_mode=fair", "search.arch_lr=0", "search.selection=score"],
    "spos": lambda sc: ["search.weight_mode=spos", "search.arch_lr=0", "search.selection=score"],
}


def seed_list(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated distinct non-negative integers, e.g. ``0,1,2``."""
    import argparse

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated non-negative integers, got {text!r}")
    return values


def answer(cfg, method: str, seed: int, folder: Path) -> tuple[Path, float]:
    """Run (or reuse, or resume) one search of ``method`` at search seed ``seed`` in ``folder``;
    returns its genotype file and wall time (s, the seeds' sum for a consensus)."""
    from autoln.oneshot.consensus import run_seeds
    from autoln.models.genotype import Genotype
    from autoln.oneshot.run_search import run_search

    if method == "consensus3":
        done = folder / "genotype.json"
        if not done.exists():
            run_seeds(cfg, 3, folder)
        walls = [Genotype.load(folder / f"seed{seed + i}" / "genotype.json").provenance["metrics"]["wall_time_s"] for i in range(3)]
        return done, float(sum(walls))
    if not (folder / "genotype.json").exists():
        run_search(cfg, folder, overwrite=not (folder / "checkpoint.pt").exists(), resume=(folder / "checkpoint.pt").exists())
    return folder / "genotype.json", float(Genotype.load(folder / "genotype.json").provenance["metrics"]["wall_time_s"])


def run_setting(name: str, overrides: list[str], config: str | None, method: str, seeds: list[int], retrain_seeds: int,
                out: Path, workers: int = 1, table: Path | None = None) -> dict:
    """Every search seed's answer of ``method`` in setting ``name``, retrained; returns the numbers."""
    from autoln.data import HEADLINE
    from autoln.models.genotype import Genotype
    from experiments.common.retrain_table import compare_with_table, kendall_tau_of_seeds, read_table, space_of

    base = setting_config(name, overrides, config)
    headline = HEADLINE[base.data.tokenizer]
    cfg = setting_config(name, [*overrides, *METHODS[method](base.search)], config)
    rows, files = [], []
    for s in seeds:
        seeded = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, seed=s))
        if method == "default" and s == base.search.seed:
            path = searched_genotype(seeded, name, out)  # validate's own search
            wall = Genotype.load(path).provenance["metrics"]["wall_time_s"]
        else:
            path, wall = answer(seeded, method, s, out / name / "dependable" / f"{method}-seed{s}")  # a label of its own
        files.append(str(path))
        rows.append({"search_seed": s, "placements": Genotype.load(path).describe(), "wall_time_s": wall})
    entries = compare_with_table(base, name, files, [], retrain_seeds, out / name / "compare", table, workers=workers)
    for row, e in zip(rows, entries):
        row["valid"] = [r["valid"][headline] for r in e.runs if r is not None]
    seed0 = [r["valid"][0] for r in rows if r["valid"]]
    result = {"setting": name, "method": method, "headline": headline, "rows": rows,
              "spread": statistics.stdev(seed0) if len(seed0) > 1 else None}
    if table is not None:
        result["noise_ceiling_tau"], _ = kendall_tau_of_seeds(read_table(table), name, space_of(base), base.retrain.steps)
    return result


def markdown(results: list[dict]) -> str:
    """One table per setting: each search seed's answer and its seed-0 valid."""
    lines = ["# Is a single search dependable?", ""]
    for r in results:
        lines += [f"## {r['setting']}, method `{r['method']}`", "", f"| search seed | answer | valid {r['headline']}, seed 0 | "
                  "wall time (s) |", "|---|---|---|---|"]
        for row in r["rows"]:
            v = f"{row['valid'][0]:.3f}" if row["valid"] else "diverged"
            lines.append(f"| {row['search_seed']} | `{row['placements']}` | {v} | {row['wall_time_s']:.0f} |")
        lines += ["", "Spread over search seeds (std of the seed-0 valid): "
                  + (f"{r['spread']:.3f}" if r["spread"] is not None else "-") + ".", ""]
    return "\n".join(lines)


def figure(results: list[dict]):
    """Each search seed's seed-0 valid, one column of points per setting and method."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    for i, r in enumerate(results):
        values = [row["valid"][0] for row in r["rows"] if row["valid"]]
        ax.plot([i] * len(values), values, "o", alpha=0.7)
    ax.set_xticks(range(len(results)), [f"{r['setting']}\n{r['method']}" for r in results], fontsize=7)
    ax.set(ylabel=f"valid {results[0]['headline']} (seed 0)" if results else "valid")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = OneLineParser(prog="dependable.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow")
    p.add_argument("--method", choices=sorted(METHODS), default="default")
    p.add_argument("--search-seeds", type=seed_list, default=[0, 1, 2, 3, 4], help="comma-separated (default 0,1,2,3,4)")
    p.add_argument("--retrain-seeds", type=int, default=1, help="retrain seeds per answer (default 1: seed 0)")
    args = p.parse_args(argv)

    def body() -> None:
        fresh = each_setting(args, "dependable.py", lambda n, overrides, out: run_setting(
            n, overrides, args.config, args.method, args.search_seeds, args.retrain_seeds, out, args.workers, args.table))
        results = merge_saved(Path(args.out), f"dependable-{args.method}", fresh, argv)
        write_outputs(Path(args.out), f"dependable-{args.method}", markdown(results), results, figure(results))

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
