"""``retrain.py --compare``: retrain searched genotypes and the published placements with the
same budget, data order and seeds, and tabulate and plot the result.

Each (genotype, seed) pair is one ordinary retrain (:func:`autoln.retrain.run_retrain.run_retrain`) in
``<out>/<label>/seed<i>`` with ``retrain.seed + i``; every genotype sees the same batches at a
given seed. A pair whose ``metrics.json`` exists is reused and one with a checkpoint continued
from it, so an interrupted comparison resumes where it stopped; a genotype file whose
placements equal a finished run's in the folder takes that run's numbers at that seed (the same
retrain; its ``metrics.json`` says ``same_run_as``). ``workers > 1`` runs that many retrains at
once, each in its own process with an equal share of the CPU threads (:mod:`autoln.engine.workers`). ``compare.json``
records the genotypes and settings, and a re-run with other ones is refused (``--overwrite``
redoes everything). Outputs in ``<out>``:

- ``compare.csv``, ``compare.md``: one row per genotype: placements, valid and test headline
  metric (bits per byte for bytes) as mean ± std over the seeds that finished, diverged runs,
  mean wall time per run;
- ``valid_curves.png``: valid metric against step, one colour per genotype, the line the mean
  over seeds and the band their min-max;
- TensorBoard: every run's own events (``tensorboard --logdir <out>`` shows ``<label>/seed<i>``)
  plus ``summary/`` with the mean curves as ``compare/<label>`` and the figure.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from autoln.config import Config, with_defaults
from autoln.core.commands import again_command
from autoln.core.errors import ConfigError, GenotypeError
from autoln.models.genotype import BASELINES, Genotype, is_baseline, unfinished_race_hint
from autoln.core.locks import FolderLock
from autoln.retrain.ranking import mean_std, vs_best  # noqa: F401 (mean_std re-exported for the experiments)
from autoln.core.io import read_json, save_figure_atomic, write_json_atomic, write_text_atomic
from autoln.engine.folders import METRICS_FILE, SAME_RUN_FREE, differences, read_metrics, run_config_differences  # noqa: F401 (re-exported)
from autoln.engine.training import check_out_dir

TABLE = "compare.csv"
#: The caution a one-seed comparison carries (its table and the command's output).
ONE_SEED = ("**One seed per genotype: this ranking is a look, not a result.** Differences between placements at this "
            "size are often within the seed-to-seed spread; compare with --seeds 3 (mean ± std) before drawing a conclusion.")
#: What a comparison folder was made with (specs and config); a re-run must match it.
RECORD = "compare.json"


@dataclass
class Entry:
    """One compared genotype: its ``label`` (folder name), the ``spec`` given to ``retrain.py``,
    and per seed the final metrics (None for a diverged run)."""

    label: str
    spec: str
    placements: str = ""
    runs: list = dataclasses.field(default_factory=list)


def labels_for(specs: list[str]) -> list[str]:
    """Unique folder-safe labels: a baseline's name, or a genotype file's parent folder name
    (``genotype.json``) or stem, suffixed ``-2``, ``-3``... on collisions. Baselines claim their
    names first, so ``all-pre`` is always the published placement."""
    taken = {spec for spec in specs if is_baseline(spec)}
    out: list[str] = []
    for spec in specs:
        if is_baseline(spec):
            out.append(spec)
            continue
        path = Path(spec)
        base = path.parent.name if path.stem in ("genotype", "best_genotype") and path.parent.name else path.stem
        base = "".join(c if c.isalnum() or c in "-_." else "_" for c in base).lstrip(".") or "genotype"
        label, k = base, 2
        while label in out or label in taken:
            label, k = f"{base}-{k}", k + 1
        out.append(label)
    return out


def comparison_config(cfg: Config, genotype_files: list[str]) -> Config:
    """``cfg`` with ``model`` set to the genotype files' dimensions, so the baselines are built at
    the same size (equal budget).

    Raises:
        GenotypeError: a file is invalid, or two files differ in model size (their searched
            candidate lists may differ; the first file's is kept).
    """
    if not genotype_files:
        return cfg
    models = []
    for spec in genotype_files:
        if Path(spec).is_dir():
            raise GenotypeError(f"--genotype {spec!r} is a folder; expected a genotype.json file")
        if not Path(spec).is_file():
            raise GenotypeError(f"--genotype {spec!r}: no such file" + (f" yet{unfinished_race_hint(spec)}" if unfinished_race_hint(spec) else
                                f" (baseline names go in --baselines: {list(BASELINES)})"))
        models.append((spec, Genotype.load(spec).model_config(cfg.model)))
    first_spec, first = models[0]
    for spec, mc in models[1:]:
        # the searched candidate lists may differ (that is what a comparison of searches asks);
        # the derived models' dimensions may not
        diffs = [f"model.{f.name}: {getattr(mc, f.name)!r} vs {getattr(first, f.name)!r}" for f in dataclasses.fields(mc)
                 if f.name != "candidates" and getattr(mc, f.name) != getattr(first, f.name)]
        if diffs:
            raise GenotypeError(f"{spec} and {first_spec} have different model sizes ({'; '.join(diffs)}); "
                                f"a comparison needs equal budgets")
    return dataclasses.replace(cfg, model=first)


def run_compare(cfg: Config, genotypes: list[str], baselines: list[str], seeds: int, out: str | Path,
                overwrite: bool = False, workers: int = 1) -> list[Entry]:
    """Retrain every genotype file and baseline for ``seeds`` seeds and write the report.
    ``workers``: retrains at once (module docstring); the numbers equal one at a time's up to
    floating-point rounding (:mod:`autoln.engine.workers`).

    Raises:
        ConfigError: no genotype at all, ``seeds`` < 1 or ``workers`` < 1, an unknown baseline;
            ``out`` holds a comparison made with other settings (each key named with both
            values), or a damaged ``compare.json`` (the line gives the way on, which redoes no
            finished run).
        GenotypeError, DataError, OutputError: as ``retrain.py``; OutputError also when another
            process holds ``out`` (:class:`autoln.core.locks.FolderLock`).
    """
    if seeds < 1:
        raise ConfigError(f"--seeds must be a positive integer, got {seeds}")
    if workers < 1:
        raise ConfigError(f"--workers must be a positive integer, got {workers}")
    baselines = [*baselines, *(g for g in genotypes if is_baseline(g) and g not in baselines)]
    genotypes = [g for g in genotypes if not is_baseline(g)]
    unknown = [b for b in baselines if not is_baseline(b)]
    if unknown:
        raise ConfigError(f"--baselines: unknown {unknown}; expected a comma-separated subset of {list(BASELINES)} "
                          "or all-<candidate> (e.g. all-pre:fixed)")
    specs = [*genotypes, *baselines]
    if not specs:
        raise ConfigError("--compare needs at least one --genotype or baseline")
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise ConfigError(f"--genotype/--baselines name {twice} more than once")
    cfg = comparison_config(cfg, genotypes)
    out = Path(out)
    check_out_dir(out, overwrite=False)
    with FolderLock(out, "comparison"):  # the comparison's folder is this process's until it ends
        return _run_compare(cfg, specs, seeds, out, overwrite, workers)


def retrain_one(cfg: Config, label: str, spec: str, run_dir: str, overwrite: bool, threads: int | None) -> dict | None:
    """One retrain of a comparison or of a race (:mod:`autoln.race.run_race`), in this process or a
    fresh one (``threads`` torch threads, None: this process's): ``spec`` (a genotype file or a
    baseline name, named ``label`` in the log line) with ``cfg`` in ``run_dir``; a finished run
    there is reused and an interrupted one continued (:func:`autoln.retrain.run_retrain.retrain_reusing`),
    or everything redone with ``overwrite``. Returns its ``metrics.json`` content (valid and test
    metrics in the headline unit), or None when it diverged (``diverged.txt`` then holds the
    message, and a re-run keeps it diverged).

    Raises:
        As :func:`autoln.retrain.run_retrain.run_retrain` but DivergenceError: OutputError, DataError,
        GenotypeError, ConfigError, WriteError, :class:`autoln.engine.checkpoint.Interrupted`."""
    from autoln.engine.checkpoint import CHECKPOINT_FILE
    from autoln.core.errors import DivergenceError
    from autoln.retrain.run_retrain import retrain_reusing, run_retrain

    if threads:
        import torch

        torch.set_num_threads(threads)
    run_dir = Path(run_dir)
    resuming = not overwrite and (run_dir / CHECKPOINT_FILE).exists()
    print(f"[compare] {label} seed {cfg.retrain.seed} -> {run_dir}" + (" (resuming)" if resuming else ""), file=sys.stderr, flush=True)
    try:
        if overwrite:
            run_retrain(cfg, spec, run_dir, overwrite=True)
            return json.loads((run_dir / METRICS_FILE).read_text())
        return retrain_reusing(cfg, spec, run_dir)
    except DivergenceError as exc:
        write_text_atomic(run_dir / "diverged.txt", f"{exc}\n")
        print(f"[compare] {label} seed {cfg.retrain.seed} diverged: {exc}", file=sys.stderr)
        return None


def finished_runs(out: Path) -> dict[tuple[str, str], Path]:
    """The finished runs in the comparison folder ``out``, by ``(placements, "seed<i>")``
    (placements as :meth:`autoln.models.genotype.Genotype.describe` writes them). A retrain is a
    function of its placements, seed and config (up to the order of floating-point sums, which
    the thread count sets: :mod:`autoln.engine.workers`), so one of these whose ``config.yaml`` matches
    (:func:`run_config_differences`) stands for any genotype file with the same placements."""
    found: dict[tuple[str, str], Path] = {}
    for path in sorted(out.glob("*/seed*/metrics.json")):
        m = read_metrics(path)
        if m is not None and "same_run_as" not in m:
            found.setdefault((m["placements"], path.parent.name), path)
    return found


def reuse_same_placements(source: Path, entry: "Entry", run_dir: Path) -> dict:
    """Record in ``run_dir`` the finished run ``source`` (a ``metrics.json`` of the same
    comparison, same placements, seed and config) as this entry's: its numbers, with
    ``genotype`` and ``genotype_file`` the entry's own file and ``same_run_as`` naming the run.
    Returns the record."""
    metrics = {**read_metrics(source), "genotype": entry.spec, "genotype_file": Genotype.load(entry.spec).record(entry.spec)[0],
               "same_run_as": str(source.parent.relative_to(source.parent.parent.parent))}
    write_json_atomic(run_dir / source.name, metrics)
    print(f"[compare] {entry.label} {run_dir.name}: the same placements and config as {metrics['same_run_as']}, a finished run "
          "of this comparison (the same retrain); reused", file=sys.stderr)
    return metrics


def _run_compare(cfg: Config, specs: list[str], seeds: int, out: Path, overwrite: bool, workers: int = 1) -> list[Entry]:
    """The body of :func:`run_compare`, under its folder's lock."""
    record = {"specs": specs, "config": {k: v for k, v in cfg.to_dict().items() if k in ("data", "model", "retrain")}}
    record["config"]["retrain"].pop("device", None)
    record["config"]["retrain"].pop("seed", None)
    record["config"]["retrain"]["first_seed"] = cfg.retrain.seed
    previous = out / RECORD
    if previous.exists() and not overwrite:
        old = read_json(previous)
        if not isinstance(old, dict):
            aside = previous.with_name(previous.name + ".damaged")
            raise ConfigError(f"{previous} is damaged (not the JSON record a comparison writes), so the settings of this "
                              "comparison are unknown; to go on, move it aside and run the command again: each finished run "
                              "is checked against its own config.yaml and reused when it was made with these settings: "
                              f"mv {shlex.quote(str(previous))} {shlex.quote(str(aside))} && {again_command()}")
        old_config = {k: v for k, v in with_defaults(old.get("config", {})).items() if k in record["config"]}
        old_config["retrain"] = {k: v for k, v in old_config["retrain"].items() if k not in ("device", "seed")}
        diff = differences(old_config, record["config"])
        # genotypes may be added or left out (their runs are folders of their own), but a
        # label kept must still stand for the same genotype
        old_labels = dict(zip(labels_for(old.get("specs", [])), old.get("specs", [])))
        diff += [f"{label} ({old_labels[label]!r} -> {spec!r})" for label, spec in zip(labels_for(specs), specs)
                 if label in old_labels and old_labels[label] != spec]
        if diff:
            raise ConfigError(f"--out {out} holds a comparison made with other settings ({'; '.join(diff)}); "
                              "choose another --out or pass --overwrite to redo every run")
        print(f"note: {out} holds this comparison; finished runs are reused", file=sys.stderr)
    write_json_atomic(previous, record)
    entries = [Entry(label, spec) for label, spec in zip(labels_for(specs), specs)]
    results: dict[tuple[int, int], dict | None] = {}
    jobs = []
    done = {} if overwrite else finished_runs(out)
    twins: dict[tuple[int, int], tuple[int, int]] = {}  # a pair whose placements an earlier job of this call retrains
    queued: dict[tuple[str, str], tuple[int, int]] = {}
    for k, entry in enumerate(entries):
        same = None if is_baseline(entry.spec) else Genotype.load(entry.spec).describe()
        for i in range(seeds):
            run_dir = out / entry.label / f"seed{i}"
            seeded = dataclasses.replace(cfg, retrain=dataclasses.replace(cfg.retrain, seed=cfg.retrain.seed + i))
            reused = read_metrics(run_dir / METRICS_FILE) if not overwrite else None
            redo = overwrite
            if reused is not None and same is not None and reused["placements"] != same:
                print(f"[compare] {run_dir} holds a run of {reused['placements']!r}, but {entry.spec} is now {same!r}; "
                      "retraining it", file=sys.stderr)
                reused, redo = None, True
            # a reused record is checked against the run that made it: its own folder, or the one it names
            made_in = out / reused["same_run_as"] if reused is not None and "same_run_as" in reused else run_dir
            differs = run_config_differences(made_in, seeded) if reused is not None else []
            if differs:
                print(f"[compare] {run_dir} holds a run made with other settings ({'; '.join(differs[:3])}); retraining it",
                      file=sys.stderr)
                reused, redo = None, True
            source = done.get((same, f"seed{i}")) if same is not None and not redo else None
            if reused is not None:
                results[k, i] = reused
            elif (run_dir / "diverged.txt").exists() and not redo:
                results[k, i] = None
            elif source is not None and not run_config_differences(source.parent, seeded):
                results[k, i] = reuse_same_placements(source, entry, run_dir)
            elif same is not None and (same, f"seed{i}") in queued:
                twins[k, i] = queued[same, f"seed{i}"]
            else:
                if same is not None:
                    queued[same, f"seed{i}"] = (k, i)
                jobs.append(((k, i), (seeded, entry.label, entry.spec, str(run_dir), redo)))
    if workers == 1 or len(jobs) <= 1:
        for key, args in jobs:
            results[key] = retrain_one(*args, None)
    else:
        from autoln.engine.workers import run_in_processes

        quiet = [(dataclasses.replace(seeded, logging=dataclasses.replace(seeded.logging, progress=False)), *rest)
                 for _, (seeded, *rest) in jobs]
        for (key, _), metrics in zip(jobs, run_in_processes(retrain_one, quiet, workers)):
            results[key] = metrics
    for (k, i), (k0, i0) in twins.items():
        source = out / entries[k0].label / f"seed{i0}" / METRICS_FILE
        results[k, i] = reuse_same_placements(source, entries[k], out / entries[k].label / f"seed{i}") \
            if results[k0, i0] is not None else None
    for k, entry in enumerate(entries):
        for i in range(seeds):
            metrics = results[k, i]
            if metrics is not None:
                entry.placements = metrics["placements"]
            entry.runs.append(metrics)
    write_report(entries, out, cfg)
    return entries


def md_cell(value) -> str:
    """``value`` as a Markdown table cell: a bar escaped (``pre pre | qk qk``, a genotype with QK-norm)."""
    return str(value).replace("|", "\\|")


def write_report(entries: list[Entry], out: Path, cfg: Config) -> list[Path]:
    """The table (CSV and Markdown), the curves PNG and the TensorBoard summary; returns the files."""
    from autoln.data import HEADLINE

    headline = HEADLINE[cfg.data.tokenizer]
    rows = []
    for e in entries:
        done = [r for r in e.runs if r is not None]
        valid = [r["valid"][headline] for r in done]
        test = [r["test"][headline] for r in done]
        rows.append({"genotype": e.label, "placements": e.placements, "seeds": len(e.runs),
                     f"valid_{headline}": mean_std(valid), f"test_{headline}": mean_std(test),
                     "diverged": len(e.runs) - len(done),
                     "wall_time_s": round(statistics.mean(r["wall_time_s"] for r in done), 1) if done else None,
                     "_valid_mean": statistics.mean(valid) if valid else float("inf"),
                     "_valid_std": statistics.stdev(valid) if len(valid) > 1 else 0.0})
    seeds = len(entries[0].runs)
    best = min(rows, key=lambda r: r["_valid_mean"])
    for r in rows:  # a difference within one standard deviation (the larger of the two) is a tie
        gap, sd = r["_valid_mean"] - best["_valid_mean"], max(r["_valid_std"], best["_valid_std"])
        r["vs_best"] = vs_best(gap, sd, seeds, r is best)
    cols = [c for c in rows[0] if not c.startswith("_")]
    csv = ",".join(cols) + "\n" + "\n".join(",".join(_csv_cell(r[c]) for c in cols) for r in rows) + "\n"
    ranked = sorted(rows, key=lambda r: r["_valid_mean"])
    md = (f"# Comparison at equal budget\n\n{cfg.retrain.steps} steps of batch {cfg.retrain.batch_size} x "
          f"{cfg.model.context} tokens, lr {cfg.retrain.lr} ({cfg.retrain.schedule}, {cfg.retrain.warmup_steps} warm-up steps), "
          f"seeds {cfg.retrain.seed}..{cfg.retrain.seed + len(entries[0].runs) - 1}; {headline} as mean ± std over the "
          "seeds that did not diverge (lower is better), ranked by valid; vs_best: the gap to the best valid mean, a tie "
          "when within one standard deviation (the larger of the two).\n\n"
          + (ONE_SEED + "\n\n" if seeds == 1 else "")
          + "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
          + "\n".join("| " + " | ".join("" if r[c] is None else md_cell(r[c]) for c in cols) + " |" for r in ranked) + "\n")
    files = [write_text_atomic(out / TABLE, csv), write_text_atomic(out / "compare.md", md)]
    fig = curves_figure(entries, headline)
    files.append(save_figure_atomic(fig, out / "valid_curves.png"))
    if cfg.logging.tensorboard:
        from autoln.core.tb import Logger

        log = Logger(out / "summary")
        for e in entries:
            for step, value in mean_curve(e, headline):
                log.scalar(f"compare/{e.label}", value, step)
        log.figure("compare/valid_curves", fig, 0)
        log.close()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return files


def _csv_cell(v) -> str:
    s = "" if v is None else str(v)
    return f'"{s}"' if "," in s else s


def _histories(entry: Entry, headline: str) -> list[dict[int, float]]:
    """Per finished seed, ``{step: valid metric}`` from its ``metrics.json`` history."""
    return [{h["step"]: h[headline] for h in r["history"]} for r in entry.runs if r is not None]


def mean_curve(entry: Entry, headline: str) -> list[tuple[int, float]]:
    """(step, mean valid metric over the finished seeds) at the steps all of them evaluated."""
    histories = _histories(entry, headline)
    if not histories:
        return []
    steps = sorted(set.intersection(*(set(h) for h in histories)))
    return [(s, statistics.mean(h[s] for h in histories)) for s in steps]


#: Line styles of :func:`curves_figure`, one per run of 10 colours.
LINE_STYLES = ("-", "--", ":", "-.")


def curves_figure(entries: list[Entry], headline: str):
    """Valid metric against step: per genotype the mean over seeds and a min-max band. Each
    genotype has its own colour and line style (10 colours, then dashed, dotted, dash-dot: 40
    distinct lines, after which they repeat); with more than 10 genotypes the legend sits to the
    right of the axes, in columns of up to 20, inside a figure widened to hold it (the PNG and
    TensorBoard's image alike), so that it covers no curve (a ground-truth comparison has 40)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    columns = math.ceil(len(entries) / 20) if len(entries) > 10 else 0
    fig, ax = plt.subplots(figsize=(6.5 + 2.2 * columns, 4.0 + 0.8 * bool(columns)), layout="constrained")
    for k, e in enumerate(entries):
        histories = _histories(e, headline)
        curve = mean_curve(e, headline)
        if not curve:
            continue
        steps = [s for s, _ in curve]
        lo = [min(h[s] for h in histories) for s in steps]
        hi = [max(h[s] for h in histories) for s in steps]
        color = f"C{k % 10}"
        ax.plot(steps, [v for _, v in curve], color=color, linestyle=LINE_STYLES[k // 10 % len(LINE_STYLES)],
                marker="o" if len(steps) <= 20 and len(entries) <= 10 else None, ms=3,
                label=f"{e.label} ({len(histories)} seed{'s' if len(histories) != 1 else ''})")
        ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(f"valid {headline}")
    ax.set_title("valid curves: mean over seeds, band = min-max", fontsize=9)
    ax.grid(alpha=0.3)
    if columns:
        fig.legend(fontsize=7, loc="outside right upper", ncol=columns)
    else:
        ax.legend(fontsize=8)
    return fig
