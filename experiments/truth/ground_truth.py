"""Ground truth: where does the searched genotype fall among random genotypes of its own space?

Per setting of ``experiments/common/validate.py`` (``shallow``, ``deep``, ``highlr``; the same folders,
so validate's search and retrains are reused and it reuses these):

1. the setting's default search (``<out>/<setting>/search``, validate's);
2. a uniform random sample of distinct genotypes of the searched space (``model.candidates``,
   one placement per block: ``3^6 = 729`` genotypes at 6 blocks), drawn reproducibly from
   ``--sample-seed`` and written as genotype files ``<out>/<setting>/sample/g<i>.json``;
3. every sampled genotype, every named baseline and the searched genotype retrained at seed 0
   at the setting's retrain budget (``retrain.py --compare``'s job, in ``<out>/<setting>/compare``);
4. the ``--top`` best samples (by seed-0 valid) and the searched genotype at ``--seeds`` seeds;
5. supernet fidelity: the search's trained supernet (its checkpoint of the last bilevel step)
   scores every sampled genotype imposed one-hot on ``--score-windows`` fixed valid windows
   (:func:`autoln.oneshot.fidelity.score_genotypes`), and Kendall's tau relates those scores to the
   retrained seed-0 valid losses (:func:`autoln.oneshot.fidelity.kendall_tau`; Yu et al. 2020).

The report, ``<out>/ground_truth.md`` and ``.json`` (over every setting measured so far; each
setting's numbers are kept in ``<out>/<setting>/ground_truth.json``), gives per setting the sample's quantiles, each
named baseline's and the searched genotype's percentile (the share of sampled genotypes whose
seed-0 valid metric is worse), the best sampled genotype (the lowest mean over seeds among the top
``--top``), the random-search baseline when
``experiments/race/random_search.py`` has finished in the same ``--out``, and Kendall's tau;
``<out>/ground_truth.png`` shows the sample's distribution with the others marked. Finished runs
are reused, so it can be stopped and re-run; the sample only grows with ``--samples``.

    python experiments/truth/ground_truth.py --data WIKITEXT_FOLDER [--settings shallow,deep]
        [--samples shallow=30,deep=20] [--top 5] [--seeds 3] [--out runs/validate]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.validate import (SETTINGS, add_common_arguments, base_overrides, commands_line, each_setting, merge_saved, parse_settings, positive_int,  # noqa: E402
                                         searched_genotype, setting_config, verdict, write_outputs)

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.io import read_json  # noqa: E402

#: Sample sizes by setting (the issue's minimum: 30 at 6 blocks, 20 at 24 blocks).
DEFAULT_SAMPLES = {"shallow": 30, "deep": 20, "highlr": 30}
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def percentile(value: float, sample: list[float]) -> float:
    """The share (in %) of ``sample`` that is worse (higher) than ``value``; ties count half."""
    if not sample:
        return float("nan")
    worse = sum(v > value for v in sample) + 0.5 * sum(v == value for v in sample)
    return 100.0 * worse / len(sample)


def write_sample(cfg, folder: Path, n: int, seed: int) -> list[str]:
    """The first ``n`` genotypes of the reproducible sample as files ``folder/g<i>.json`` (an
    existing file is kept when it holds the same placements, else ConfigError). Returns their paths."""
    from autoln.data import load_corpus
    from autoln.core.errors import ConfigError
    from autoln.oneshot.fidelity import sample_genotypes
    from autoln.models.genotype import Genotype, from_probabilities

    cands = cfg.model.searched_candidates()
    vocab = load_corpus(cfg.data).vocab_size
    paths = []
    for i, names in enumerate(sample_genotypes(n, cfg.model.n_layers, cands, seed)):
        path = folder / f"g{i:02d}.json"
        if path.exists():
            if Genotype.load(path).placements != names:
                raise ConfigError(f"{path} holds another genotype than --sample-seed {seed} draws; choose another --out")
        else:
            probs = np.eye(len(cands))[[cands.index(p) for p in names]]
            g = from_probabilities(probs, cfg.model, vocab, {"sample": {"seed": seed, "index": i}}, [cands.index(p) for p in names])
            g.save(path)
        paths.append(str(path))
    return paths


def trained_supernet(search_dir: Path):
    """``(supernet, config, corpus)`` of the search in ``search_dir``: its
    :class:`autoln.models.supernet.Supernet` with the weights of its checkpoint (the last bilevel step),
    on the CPU.

    Raises:
        ConfigError: ``config.yaml`` unreadable (:func:`autoln.config.load_config`);
        FileNotFoundError: no checkpoint in ``search_dir``."""
    import torch

    from autoln.engine.checkpoint import CHECKPOINT_FILE
    from autoln.config import load_config
    from autoln.data import load_corpus
    from autoln.models.supernet import Supernet

    cfg = load_config(search_dir / "config.yaml")
    corpus = load_corpus(cfg.data)
    net = Supernet(cfg.model, corpus.vocab_size, mixing=cfg.search.mixing, candidate_scale=cfg.search.candidate_scale)
    net.load_state_dict(torch.load(search_dir / CHECKPOINT_FILE, map_location="cpu", weights_only=True)["model"])
    return net, cfg, corpus


def supernet_scores(search_dir: Path, genotypes: list[list[str]], windows: int) -> list[float]:
    """The trained supernet of ``search_dir`` (:func:`trained_supernet`) scoring each genotype
    (per-block names) one-hot on ``windows`` fixed valid windows, nats per token."""
    from autoln.data import eval_starts
    from autoln.oneshot.fidelity import score_genotypes

    net, cfg, corpus = trained_supernet(search_dir)
    valid = corpus.splits["valid"]
    starts = eval_starts(len(valid), cfg.model.context, windows)
    return [float(v) for v in score_genotypes(net, [[(p, p) for p in g] for g in genotypes], valid, starts, cfg.search.batch_size)]


def run_setting(name: str, overrides: list[str], config: str | None, n_samples: int, top: int, seeds: int,
                sample_seed: int, score_windows: int, out: Path, baselines: list[str], workers: int = 1,
                table: Path | None = None) -> dict:
    """Sample, retrain, score and summarise one setting; returns its numbers."""
    from autoln.data import HEADLINE
    from autoln.oneshot.fidelity import kendall_tau
    from experiments.common.retrain_table import compare_with_table

    def run_compare(cfg, specs, baselines, n_seeds, folder, workers=1):
        return compare_with_table(cfg, name, specs, baselines, n_seeds, folder, table, workers=workers)
    from autoln.models.genotype import Genotype

    cfg = setting_config(name, overrides, config)
    headline = HEADLINE[cfg.data.tokenizer]
    searched = str(searched_genotype(cfg, name, out))
    samples = write_sample(cfg, out / name / "sample", n_samples, sample_seed)
    compare = out / name / "compare"
    print(f"[ground truth] {name}: {n_samples} sampled genotypes, the searched one and {len(baselines)} baselines at seed 0",
          file=sys.stderr, flush=True)
    run_compare(cfg, [searched], baselines, 1, compare, workers=workers)  # the references first: a short run already says something
    first = run_compare(cfg, [searched, *samples], baselines, 1, compare, workers=workers)

    def valid(entry) -> list[float]:
        return [r["valid"][headline] for r in entry.runs if r is not None]

    sample_entries = first[1:1 + n_samples]
    seed0 = [valid(e)[0] if valid(e) else float("inf") for e in sample_entries]
    best = sorted(range(n_samples), key=lambda i: seed0[i])[:top]
    print(f"[ground truth] {name}: the top {top} samples and the searched genotype at {seeds} seeds", file=sys.stderr, flush=True)
    again = run_compare(cfg, [searched, *(samples[i] for i in best)], [], seeds, compare, workers=workers)
    by_spec = {e.spec: e for e in again}
    placements = [Genotype.load(p).placements for p in samples]
    scores = supernet_scores(out / name / "search", placements, score_windows)
    finite = [i for i in range(n_samples) if np.isfinite(seed0[i]) and np.isfinite(scores[i])]
    tau = kendall_tau([scores[i] for i in finite], [seed0[i] for i in finite]) if len(finite) >= 2 else None
    sample_values = [v for v in seed0 if np.isfinite(v)]
    rows = []
    for e in first[n_samples + 1:]:
        runs = valid(e)
        rows.append({"label": e.label, "placements": e.placements, "seed0": runs[0] if runs else None,
                     "percentile": percentile(runs[0], sample_values) if runs else 0.0})
    s_entry = by_spec[searched]
    s_runs = valid(s_entry)
    random_search = read_random_search(out / name, compare, headline)
    result = {
        "setting": name, "headline": headline, "n_samples": n_samples, "sample_seed": sample_seed,
        "quantiles": {f"q{int(q * 100)}": float(np.quantile(sample_values, q)) for q in QUANTILES} if sample_values else {},
        "diverged_samples": n_samples - len(finite),
        "searched": {"placements": s_entry.placements, "valid": s_runs, "mean": statistics.mean(s_runs) if s_runs else None,
                     "std": statistics.stdev(s_runs) if len(s_runs) > 1 else None,
                     "percentile_seed0": percentile(s_runs[0], sample_values) if s_runs else 0.0,
                     "percentile_mean": percentile(statistics.mean(s_runs), sample_values) if s_runs else 0.0},
        "baselines": rows,
        "top": [{"label": first[1 + i].label, "placements": first[1 + i].placements, "seed0": seed0[i],
                 "valid": valid(by_spec[samples[i]]), "mean": statistics.mean(valid(by_spec[samples[i]])) if valid(by_spec[samples[i]]) else None,
                 "std": statistics.stdev(valid(by_spec[samples[i]])) if len(valid(by_spec[samples[i]])) > 1 else None} for i in best],
        "fidelity": {"kendall_tau": tau, "score_windows": score_windows,
                     "supernet_loss": scores, "retrained_seed0": seed0,
                     "samples": [first[1 + i].label for i in range(n_samples)]},
        "random_search": random_search,
        "retrain": {"steps": cfg.retrain.steps, "lr": cfg.retrain.lr, "warmup_steps": cfg.retrain.warmup_steps},
        "model": {"n_layers": cfg.model.n_layers, "d_model": cfg.model.d_model, "candidates": cfg.model.searched_candidates()},
    }
    return result


def read_random_search(setting_dir: Path, compare: Path, headline: str) -> dict | None:
    """The finished random search of ``experiments/race/random_search.py`` in ``setting_dir``
    (its ``result.json``) with the full retrains of its best genotype, or None."""
    res = read_json(setting_dir / "random_search" / "result.json")
    if not isinstance(res, dict):
        return None
    from autoln.retrain.run_retrain import read_metrics

    runs = [m["valid"][headline] for m in (read_metrics(p) for p in sorted((compare / "random_search").glob("seed*/metrics.json")))
            if m is not None]
    return {**res, "valid": runs, "mean": statistics.mean(runs) if runs else None,
            "std": statistics.stdev(runs) if len(runs) > 1 else None}


#: Where random search's budget came from when its result does not say (made before it did).
WALL_TIME = "the search's wall time"


def best_sampled(top: list[dict]) -> dict | None:
    """The best sampled genotype: among the ``top`` rows (the best samples by seed-0 valid, each
    retrained at several seeds), the lowest mean over its seeds; a row without a finished seed
    ranks last, by its seed-0 value. Ranking by the seed-0 value that chose the top rows would
    favour a lucky seed (the winner's curse). Returns None for no rows."""
    return min(top, key=lambda t: (t["mean"] is None, t["seed0"] if t["mean"] is None else t["mean"]), default=None)


def ordinal(value: float) -> str:
    """``value`` rounded, with its English ordinal suffix: 93 -> ``93rd``, 11 -> ``11th``, 100 -> ``100th``."""
    n = round(value)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def fmt(mean, std=None) -> str:
    """``mean ± std`` at 3 decimals (``-`` when missing)."""
    if mean is None:
        return "-"
    return f"{mean:.3f}" + (f" ± {std:.3f}" if std is not None else "")


def setting_markdown(r: dict) -> str:
    """One setting's section of the report."""
    h, q = r["headline"], r["quantiles"]
    s = r["searched"]
    lines = [f"## {r['setting']}", "",
             f"{r['model']['n_layers']} blocks of width {r['model']['d_model']}, candidates {r['model']['candidates']}; "
             f"retrain {r['retrain']['steps']} steps, lr {r['retrain']['lr']}, {r['retrain']['warmup_steps']} warm-up steps. "
             f"{r['n_samples']} distinct genotypes drawn uniformly (sample seed {r['sample_seed']}), each retrained at seed 0"
             + (f"; {r['diverged_samples']} diverged" if r["diverged_samples"] else "") + ".", "",
             f"Sample quantiles of valid {h} (seed 0): " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()), "",
             f"| genotype | placements | valid {h}, seed 0 | percentile (share of the sample it beats) | mean over seeds |",
             "|---|---|---|---|---|",
             f"| **searched** | {s['placements']} | {fmt(s['valid'][0] if s['valid'] else None)} | {s['percentile_seed0']:.0f} % "
             f"(mean: {s['percentile_mean']:.0f} %) | {fmt(s['mean'], s['std'])} ({len(s['valid'])} seeds) |"]
    for b in sorted(r["baselines"], key=lambda b: b["seed0"] if b["seed0"] is not None else float("inf")):
        lines.append(f"| {b['label']} | {b['placements']} | {fmt(b['seed0'])} | {b['percentile']:.0f} % | |")
    for t in r["top"]:
        lines.append(f"| sample {t['label']} | {t['placements']} | {fmt(t['seed0'])} | top {len(r['top'])} | "
                     f"{fmt(t['mean'], t['std'])} ({len(t['valid'])} seeds) |")
    rs = r["random_search"]
    if rs:
        lines.append(f"| random search | {rs['placements']} | {fmt(rs['valid'][0] if rs['valid'] else None)} | "
                     f"{percentile(rs['valid'][0], [v for v in r['fidelity']['retrained_seed0'] if np.isfinite(v)]):.0f} % | "
                     f"{fmt(rs['mean'], rs['std'])} ({len(rs['valid'])} seeds) |")
    tau = r["fidelity"]["kendall_tau"]
    best = best_sampled(r["top"])
    lines += ["", f"Best sampled genotype (lowest mean over seeds among the top {len(r['top'])} by seed 0): {best['label']} "
              f"`{best['placements']}`, {fmt(best['mean'], best['std'])}." if best else "",
              "", f"Supernet fidelity: Kendall's tau between the supernet's one-hot loss ({r['fidelity']['score_windows']} valid "
              f"windows) and the retrained seed-0 valid loss over the sample: **{tau:.3f}**." if tau is not None else
              "Supernet fidelity: too few finished samples for Kendall's tau.", ""]
    if rs:
        lines += [f"Random search ({rs['budget_s']:.0f} s, {rs.get('budget_from', WALL_TIME)}; {rs['spent_s']:.0f} s spent on "
                  f"{rs['evaluated']} short retrains): best `{rs['placements']}`.", ""]
    if not s["valid"]:
        bar = "Against the issue's bar: every seed of the searched genotype diverged, so it lies below the whole sample."
    else:
        bar = (f"Against the issue's bar: the searched genotype's mean over {len(s['valid'])} seeds lies at the "
               f"**{ordinal(s['percentile_mean'])}** percentile of the sample (target: at least the 90th)")
        if rs and rs["valid"]:
            bar += (f"; against random search it **{verdict(s['valid'], rs['valid']).replace('loses', 'loses to', 1)}** it "
                    f"(means {fmt(s['mean'])} vs {fmt(rs['mean'])}; within the larger standard deviation counts as matching).")
        else:
            bar += "; random search: " + ("its best genotype's retrains are not finished." if rs else "not run yet.")
    lines += [bar, ""]
    return "\n".join(lines)


def figure(results: list[dict]):
    """Per setting: the sample's seed-0 valid values as a histogram, the baselines and the
    searched genotype (and random search) as vertical lines."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results):
        vals = [v for v in r["fidelity"]["retrained_seed0"] if np.isfinite(v)]
        ax.hist(vals, bins=min(15, max(5, len(vals) // 2)), color="0.75", label=f"{len(vals)} random genotypes")
        for k, b in enumerate(b for b in r["baselines"] if b["seed0"] is not None):
            ax.axvline(b["seed0"], color=f"C{k % 10}", lw=1, ls="--", label=b["label"])
        if r["searched"]["valid"]:
            ax.axvline(r["searched"]["valid"][0], color="k", lw=2.5, label="searched")
        if r["random_search"] and r["random_search"]["valid"]:
            ax.axvline(r["random_search"]["valid"][0], color="m", lw=2, label="random search")
        ax.set(title=r["setting"], xlabel=f"valid {r['headline']} (seed 0)", ylabel="genotypes")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = OneLineParser(prog="ground_truth.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow,deep")
    p.add_argument("--samples", default=None, help="per setting, e.g. shallow=30,deep=20 (the defaults)")
    p.add_argument("--top", type=positive_int, default=5, help="best samples retrained at --seeds seeds (default 5)")
    p.add_argument("--seeds", type=positive_int, default=3)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--baselines", default=None, help="comma-separated named baselines (default: every one)")
    p.add_argument("--score-windows", type=positive_int, default=128, help="valid windows on which the supernet scores each genotype")
    args = p.parse_args(argv)

    def body() -> None:
        from autoln.core.errors import ConfigError
        from autoln.models.genotype import BASELINES, is_baseline

        names = parse_settings(args.settings)
        baselines = list(BASELINES) if args.baselines is None else [b.strip() for b in args.baselines.split(",") if b.strip()]
        samples = dict(DEFAULT_SAMPLES)
        for item in (args.samples or "").split(","):
            if not item.strip():
                continue
            key, _, value = item.partition("=")
            if key.strip() not in SETTINGS or not value.strip().isdigit() or int(value) < 2:
                raise ConfigError(f"--samples {args.samples!r}: expected setting=N pairs with N >= 2, e.g. shallow=30,deep=20")
            samples[key.strip()] = int(value)
        if any(args.top > samples[n] for n in names):
            raise ConfigError(f"--top {args.top} is more than a setting's sample ({ {n: samples[n] for n in names} })")
        unknown = [b for b in baselines if not is_baseline(b)]
        if unknown:  # before any search: refused with nothing written
            raise ConfigError(f"--baselines: unknown {unknown}; expected a comma-separated subset of {list(BASELINES)}")
        for n in names:
            cfg = setting_config(n, base_overrides(args), args.config)
            space = len(cfg.model.searched_candidates()) ** cfg.model.n_layers
            if samples[n] > space:
                raise ConfigError(f"--samples {n}={samples[n]}: the {n} setting's space holds {space} genotypes "
                                  f"({len(cfg.model.searched_candidates())} candidates, {cfg.model.n_layers} blocks)")
        fresh = each_setting(args, "ground_truth.py", lambda n, overrides, out: run_setting(
            n, overrides, args.config, samples[n], args.top, args.seeds, args.sample_seed, args.score_windows, out,
            baselines, args.workers, args.table))
        out = Path(args.out)
        results = merge_saved(out, "ground_truth", fresh, argv)
        report = ("# Ground truth: the searched genotype among random genotypes of its space\n\n"
                  f"{commands_line(results)}. Percentile: the share of the random sample "
                  "whose seed-0 valid metric is worse (higher); the searched genotype's is given for its seed-0 run and "
                  "for its mean over seeds.\n\n" + "\n".join(setting_markdown(r) for r in results))
        write_outputs(out, "ground_truth", report, results, figure(results))

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
