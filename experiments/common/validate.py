"""Is the searched genotype the right answer? Search, then compare against every named baseline.

In each setting it runs the default search (``search.py``'s job, in process) with the
setting's overrides, then ``retrain.py --compare``'s job: the searched genotype and every named
baseline (:data:`autoln.models.genotype.BASELINES`), ``--seeds`` seeds each, at equal budget (the
``retrain`` settings). The settings are fixed here, before any result was seen:

- ``shallow``: the default model (6 blocks, width 96) and optimisation;
- ``deep``: deep and narrow, 24 blocks of width 64 (4 heads, FFN 256);
- ``highlr``: the default model at a high learning rate with no warm-up, in the search and the
  retrains alike (``lr 3e-3``, ``warmup_steps 0``), where Post-LN is known to suffer
  (Xiong et al. 2020, §3).

A setting's verdict compares the searched genotype's mean valid metric over the seeds with the
best named baseline's: ``beats`` (lower by more than the larger of the two standard deviations),
``matches`` (within it) or ``loses``. Every run is an ordinary run folder under
``<out>/<setting>/`` (``search/``, ``compare/<label>/seed<i>``); finished runs are reused, so the
script can be re-run after an interruption or split with ``--settings``. Each setting's numbers
are kept in ``<out>/<setting>/validate.json``; the report covers every setting measured so far
(calls split by ``--settings`` add up): ``<out>/report.md`` (one table per setting: mean ± std of
valid and test metric, diverged runs), ``<out>/report.json`` and ``<out>/curves.png`` (valid
curves, one panel per setting).

    python experiments/common/validate.py [--data WIKITEXT_FOLDER] [--config FILE] [--set KEY=VALUE ...]
        [--settings shallow,deep,highlr] [--seeds 3] [--out runs/validate] [--overwrite]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.locks import FolderLock
from autoln.config import load_config
from autoln.core.io import read_json, save_figure_atomic, write_json_atomic, write_text_atomic

#: The experiments' folder (the scripts by question in its subfolders, the tables at its top).
EXPERIMENTS = Path(__file__).resolve().parents[1]

#: Settings by name: the ``--set`` overrides that define them (applied to search and retrain).
SETTINGS = {
    "shallow": [],
    "deep": ["model.n_layers=24", "model.d_model=64", "model.n_heads=4", "model.d_ff=256"],
    "highlr": ["search.lr=3e-3", "search.warmup_steps=0", "retrain.lr=3e-3", "retrain.warmup_steps=0"],
}


def verdict(searched: list[float], best: list[float]) -> str:
    """``beats`` / ``matches`` / ``loses``: the searched genotype's mean (lower is better)
    against the best baseline's, with "within the larger standard deviation" as a match."""
    if not searched:
        return "loses (every seed diverged)"
    if not best:
        return "beats (every seed of every baseline diverged)"
    sd = max(statistics.stdev(searched) if len(searched) > 1 else 0.0, statistics.stdev(best) if len(best) > 1 else 0.0)
    gap = statistics.mean(searched) - statistics.mean(best)
    return "beats" if gap < -sd else "matches" if gap <= sd else "loses"


def positive_int(text: str) -> int:
    """An ``argparse`` type: a positive integer, else a one-line error naming what was given."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_common_arguments(p, settings: str) -> None:
    """The options every experiment script shares: ``--data``, ``--config``, ``--set``,
    ``--settings`` (default ``settings``) and ``--out`` (default runs/validate, one folder per
    setting, shared by the scripts so that finished runs are reused), ``--table`` (the retrain
    table, :mod:`retrain_table`) and ``--workers`` (retrains at once:
    :func:`autoln.retrain.compare.run_compare`'s ``workers``)."""
    p.add_argument("--data", default=None, help="data.corpus (default: the config's; the tables use a WikiText-2 folder)")
    p.add_argument("--config", metavar="FILE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--settings", default=settings, help=f"comma-separated subset of {list(SETTINGS)}")
    p.add_argument("--out", default="runs/validate")
    from experiments.common.retrain_table import default_table

    p.add_argument("--table", type=table_path, default=default_table(), metavar="CSV",
                   help="the retrain table read and extended (default experiments/retrains.csv, or $AUTOLN_RETRAIN_TABLE; '' for none)")
    p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                   help="retrains at once, each in its own process with the CPU threads shared (default 1; the numbers equal one at a time's up to float rounding)")


def table_path(text: str):
    """An ``argparse`` type: the retrain table's path, or None for ``''`` (no table)."""
    return Path(text) if text else None


def parse_settings(text: str) -> list[str]:
    """The setting names of ``--settings`` (comma-separated).

    Raises:
        ConfigError: an unknown or repeated name, or none.
    """
    from autoln.core.errors import ConfigError

    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names or any(s not in SETTINGS for s in names) or len(set(names)) != len(names):
        raise ConfigError(f"--settings {text!r}: expected a comma-separated subset of {list(SETTINGS)}, each once")
    return names


def base_overrides(args) -> list[str]:
    """``--set`` values, then ``logging.progress=false`` and ``data.corpus`` from ``--data``."""
    return [*args.overrides, "logging.progress=false"] + ([f"data.corpus={args.data}"] if args.data else [])


def each_setting(args, script: str, run) -> list[dict]:
    """``run(name, overrides, out)`` for each setting of ``--settings``, in order, each under its
    folder's lock (``<out>/<name>``: one experiment process per setting folder at a time), with
    :func:`base_overrides` and ``out = Path(args.out)``. Returns the results.

    Raises:
        ConfigError: a bad ``--settings``; FolderInUse: another process holds a setting's folder;
        whatever ``run`` raises."""
    names = parse_settings(args.settings)
    overrides, out = base_overrides(args), Path(args.out)
    results = []
    for name in names:
        with FolderLock(out / name, script):
            results.append(run(name, overrides, out))
    return results


def script_path(name: str) -> str:
    """``experiments/<folder>/<script>.py``, from the repository root, of the experiment whose
    saved result is ``name`` (the script's name, then ``-<variant>`` for some: ``dependable-default``)."""
    script = name.split("-")[0]
    found = sorted(EXPERIMENTS.glob(f"*/{script}.py"))
    return found[0].relative_to(EXPERIMENTS.parent).as_posix() if found else f"experiments/{script}.py"


def merge_saved(out: Path, name: str, results: list[dict], argv: list[str] | None) -> list[dict]:
    """Save each of this call's per-setting ``results`` (JSON-able dicts with a ``setting`` key)
    as ``<out>/<setting>/<name>.json``, with ``command`` added (``python`` and the script's path,
    :func:`script_path`, and ``argv``, or ``sys.argv[1:]`` when None: the call that made it), and
    return them merged with every other setting's saved one, in :data:`SETTINGS` order. An
    experiment's report covers the result, so calls split by ``--settings`` (each setting its own
    folder and lock, so they may run at once) add up instead of overwriting each other's report.
    A damaged saved file is left out (re-run its setting to redo it).

    Raises:
        OSError: a file cannot be written."""
    command = " ".join(["python", script_path(name), *(argv if argv is not None else sys.argv[1:])])
    fresh = {r["setting"]: {**r, "command": command} for r in results}
    for setting, r in fresh.items():
        write_json_atomic(out / setting / f"{name}.json", r)
    merged = []
    for setting in SETTINGS:
        saved = fresh.get(setting) or read_json(out / setting / f"{name}.json")
        if isinstance(saved, dict) and saved.get("setting") == setting:
            merged.append(saved)
    return merged


def write_outputs(out: Path, name: str, report: str, results: list[dict], fig) -> None:
    """Write an experiment's ``<out>/<name>.md`` (``report``), ``.json`` (``results``) and
    ``.png`` (``fig``), each atomically, and print the report with the files' names."""
    write_text_atomic(out / f"{name}.md", report)
    write_json_atomic(out / f"{name}.json", results)
    save_figure_atomic(fig, out / f"{name}.png")
    print(report + f"\nwrote {out / (name + '.md')}, {out / (name + '.json')}, {out / (name + '.png')}")


def commands_line(results: list[dict]) -> str:
    """``Command: `...` `` for a report whose settings one call made, else one per setting."""
    commands = list(dict.fromkeys(r["command"] for r in results))
    if len(commands) == 1:
        return f"Command: `{commands[0]}`"
    return "Commands: " + "; ".join(f"`{c}` ({', '.join(r['setting'] for r in results if r['command'] == c)})" for c in commands)


def setting_config(name: str, overrides: list[str], config: str | None):
    """The config of setting ``name``: ``config`` (or the defaults), ``overrides``, then the
    setting's own overrides (:data:`SETTINGS`). Raises ConfigError as :func:`load_config`."""
    return load_config(config, [*overrides, *SETTINGS[name]])


def searched_genotype(cfg, name: str, out: Path, overwrite: bool = False) -> Path:
    """The default search of setting ``name`` in ``<out>/<name>/search``: reused when finished
    with the same settings (else ConfigError, unless ``overwrite``), resumed from its checkpoint
    when interrupted, else run. Returns its ``genotype.json``."""
    from autoln.oneshot.consensus import check_same_search
    from autoln.oneshot.run_search import run_search

    search_dir = out / name / "search"
    if (search_dir / "genotype.json").exists() and not overwrite:
        check_same_search(search_dir, cfg)
        print(f"[validate] {name}: reusing {search_dir / 'genotype.json'}", file=sys.stderr)
        return search_dir / "genotype.json"
    resume = (search_dir / "checkpoint.pt").exists() and not overwrite
    print(f"[validate] {name}: search -> {search_dir}", file=sys.stderr, flush=True)
    return run_search(cfg, search_dir, overwrite=not resume, resume=resume).path


def run_setting(name: str, overrides: list[str], config: str | None, seeds: int, out: Path, overwrite: bool = False,
                workers: int = 1, table: Path | None = None) -> dict:
    """Search and compare in one setting; returns its numbers. A finished search or retrain in
    ``out`` is reused only when it was made with the same settings (else ConfigError, unless
    ``overwrite``, which redoes them). ``workers``: retrains at once."""
    from autoln.retrain.compare import mean_curve
    from autoln.data import HEADLINE
    from autoln.models.genotype import BASELINES, Genotype
    from experiments.common.retrain_table import compare_with_table

    cfg = setting_config(name, overrides, config)
    genotype_path = searched_genotype(cfg, name, out, overwrite)
    genotype = Genotype.load(genotype_path)
    entries = compare_with_table(cfg, name, [str(genotype_path)], list(BASELINES), seeds, out / name / "compare",
                                 None if overwrite else table, overwrite=overwrite, workers=workers)
    headline = HEADLINE[cfg.data.tokenizer]
    rows = []
    for e in entries:
        done = [r for r in e.runs if r is not None]
        rows.append({"label": "searched" if e.spec == str(genotype_path) else e.label, "placements": e.placements,
                     "valid": [r["valid"][headline] for r in done], "test": [r["test"][headline] for r in done],
                     "diverged": len(e.runs) - len(done)})
    searched = rows[0]
    best = min(rows[1:], key=lambda r: statistics.mean(r["valid"]) if r["valid"] else float("inf"))
    return {"setting": name, "overrides": SETTINGS[name], "headline": headline, "genotype": genotype.describe(),
            "search_wall_time_s": genotype.provenance.get("metrics", {}).get("wall_time_s"),
            "rows": rows, "best_baseline": best["label"], "verdict": verdict(searched["valid"], best["valid"]),
            "retrain": {"steps": cfg.retrain.steps, "lr": cfg.retrain.lr, "warmup_steps": cfg.retrain.warmup_steps},
            "model": {"n_layers": cfg.model.n_layers, "d_model": cfg.model.d_model}, "seeds": seeds,
            "curves": [{"label": row["label"], "points": mean_curve(e, headline)} for row, e in zip(rows, entries)]}


def setting_markdown(r: dict) -> str:
    """One setting's section: settings line, table ranked by valid mean, verdict."""
    from autoln.retrain.compare import mean_std

    ranked = sorted(r["rows"], key=lambda row: statistics.mean(row["valid"]) if row["valid"] else float("inf"))
    lines = [f"## {r['setting']}", "",
             f"{r['model']['n_layers']} blocks of width {r['model']['d_model']}; retrain {r['retrain']['steps']} steps, "
             f"lr {r['retrain']['lr']}, {r['retrain']['warmup_steps']} warm-up steps; {r['seeds']} seed{'s' if r['seeds'] != 1 else ''}; overrides "
             f"`{' '.join(r['overrides']) or '(none)'}`. Searched genotype: `{r['genotype']}` "
             f"(search {r['search_wall_time_s']} s).", "",
             f"| genotype | placements | valid {r['headline']} | test {r['headline']} | diverged |", "|---|---|---|---|---|"]
    for row in ranked:
        name = f"**{row['label']}**" if row["label"] == "searched" else row["label"]
        lines.append(f"| {name} | {row['placements']} | {mean_std(row['valid'])} | {mean_std(row['test'])} | {row['diverged']} |")
    same = [row["label"] for row in r["rows"][1:] if row["placements"] == r["rows"][0]["placements"]]
    also = f" The searched genotype has the same placements as {', '.join(same)}." if same else ""
    verb = r["verdict"].replace("loses", "loses to", 1)
    lines += ["", f"Verdict: the searched genotype **{verb}** the best named baseline ({r['best_baseline']}).{also}", ""]
    return "\n".join(lines)


def curves(results: list[dict]):
    """Valid curves, one panel per setting (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results):
        for k, c in enumerate(r["curves"]):
            if c["points"]:
                ax.plot([s for s, _ in c["points"]], [v for _, v in c["points"]], color=f"C{k % 10}", lw=2.2 if k == 0 else 1.2,
                        label=c["label"])
        ax.set(title=r["setting"], xlabel="step", ylabel=f"valid {r['headline']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = OneLineParser(prog="validate.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, ",".join(SETTINGS))
    p.add_argument("--seeds", type=positive_int, default=3, help="retrain seeds per genotype (default 3)")
    p.add_argument("--overwrite", action="store_true", help="redo the searches and retrains of the chosen settings in --out")
    args = p.parse_args(argv)

    def body() -> None:
        fresh = each_setting(args, "validate.py", lambda name, overrides, out: run_setting(
            name, overrides, args.config, args.seeds, out, args.overwrite, args.workers, args.table))
        overrides, out = base_overrides(args), Path(args.out)
        results = merge_saved(out, "validate", fresh, argv)
        wins = sum(r["verdict"] in ("beats", "matches") for r in results)
        cfg = load_config(args.config, overrides)
        report = (f"# Searched genotype vs named baselines\n\nData: {cfg.data.corpus} ({cfg.data.tokenizer}). "
                  f"{commands_line(results)}\n\n"
                  f"Mean ± std over each setting's seeds of the final valid and test metric (lower is better); 'matches' = "
                  f"within the larger standard deviation. The searched genotype matches or beats the best named baseline "
                  f"in **{wins} of {len(results)}** settings.\n\n" + "\n".join(setting_markdown(r) for r in results))
        write_text_atomic(out / "report.md", report)
        write_text_atomic(out / "report.json", json.dumps(results, indent=2) + "\n")
        fig = curves(results)
        save_figure_atomic(fig, out / "curves.png")
        print(report + f"\nwrote {out / 'report.md'}, {out / 'report.json'}, {out / 'curves.png'}")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
