"""Random search at the search's budget: the bar a differentiable search has to clear.

Per setting of ``experiments/common/validate.py`` (same ``--out``, so the setting's search is reused):
spend the wall time of the setting's default search (its ``wall_time_s``, or ``--budget-s``) on
short retrains of random genotypes of the searched space, by successive halving (Jamieson &
Talwalkar 2016; the random-search baseline of Li & Talwalkar 2019, "Random Search and
Reproducibility for NAS"):

- rung ``k`` retrains from scratch for ``min_steps * eta^k`` steps (a full schedule of that
  length), up to ``retrain.steps / eta``: 100 and 300 steps at the default 1000 with
  ``--min-steps 100 --eta 3``;
- each rung gets an equal share of the budget (what a rung leaves unspent passes to the next):
  rung 0 retrains fresh random genotypes (a reproducible stream from ``--sample-seed``, distinct)
  until its share is spent; rung ``k`` retrains the best ``1/eta`` of rung ``k - 1`` (by valid
  metric on ``--rank-windows`` valid windows) while its share lasts;
- the best genotype of the last rung is written as ``<out>/<setting>/random_search/genotype.json``
  and retrained at the full budget at ``--seeds`` seeds beside the searched genotype (in
  ``<out>/<setting>/compare/random_search``, outside the budget, as the searched genotype's own
  retrains are).

Budget accounting uses each short retrain's own ``wall_time_s`` (from its first step to its final
evaluation, as the search's); run both under the same load (e.g. one thread each). Finished
short retrains are reused, so the command can be stopped and re-run. It writes
``<out>/<setting>/random_search/result.json`` and prints the result; ``experiments/truth/ground_truth.py``
puts it in its report.

    python experiments/race/random_search.py --data WIKITEXT_FOLDER [--settings shallow,deep] [--budget-s S]
        [--min-steps 100] [--eta 3] [--seeds 3] [--out runs/validate]
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.halving import best_of_last_rung, rung_steps, successive_halving  # noqa: E402,F401 - rung_steps: its old home
from experiments.common.validate import add_common_arguments, each_setting, positive_int, searched_genotype, setting_config  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.io import write_json_atomic  # noqa: E402


def short_config(cfg, steps: int, windows: int):
    """``cfg`` with a retrain of ``steps`` steps (a full schedule of that length; the warm-up as
    configured, cut below ``steps``), evaluated once, at the end, on ``windows`` valid and test
    windows; no TensorBoard."""
    rc = dataclasses.replace(cfg.retrain, steps=steps, eval_every=steps, final_eval_windows=windows,
                             warmup_steps=min(cfg.retrain.warmup_steps, steps - 1))
    return dataclasses.replace(cfg, retrain=rc, checkpoint=dataclasses.replace(cfg.checkpoint, every=steps),
                               logging=dataclasses.replace(cfg.logging, tensorboard=False, progress=False))


def short_retrain(cfg, spec: str, folder: Path) -> dict:
    """One short retrain in ``folder`` (reused when finished, continued when interrupted); a
    diverged one scores inf, costs the time it ran, and is recorded (``diverged.json``) so that a
    re-run does not train it again."""
    from autoln.core.errors import DivergenceError
    from autoln.core.io import read_json, write_json_atomic
    from autoln.retrain.run_retrain import retrain_reusing

    diverged = read_json(folder / "diverged.json")
    if isinstance(diverged, dict):
        return diverged
    started = time.perf_counter()
    try:
        return retrain_reusing(cfg, spec, folder)
    except DivergenceError as exc:
        record = {"valid": {"loss": math.inf}, "wall_time_s": time.perf_counter() - started, "diverged": str(exc)}
        write_json_atomic(folder / "diverged.json", record)
        return record


def run_setting(name: str, overrides: list[str], config: str | None, budget_s: float | None, min_steps: int, eta: int,
                seeds: int, sample_seed: int, rank_windows: int, out: Path, workers: int = 1, table: Path | None = None) -> dict:
    """Successive halving of random genotypes within the budget, then the best at ``seeds`` seeds.
    The short retrains run one at a time, as the search they are measured against ran;
    ``workers`` applies to the final retrains only."""
    from autoln.data import HEADLINE, load_corpus
    from experiments.common.retrain_table import compare_with_table
    from autoln.core.errors import ConfigError
    from autoln.oneshot.fidelity import sample_genotypes
    from autoln.models.genotype import Genotype, from_probabilities

    cfg = setting_config(name, overrides, config)
    headline = HEADLINE[cfg.data.tokenizer]
    searched = searched_genotype(cfg, name, out)
    budget_from = "--budget-s" if budget_s is not None else "the search's wall time"
    if budget_s is None:
        budget_s = Genotype.load(searched).provenance.get("metrics", {}).get("wall_time_s")
        if not budget_s:
            raise ConfigError(f"{searched} records no wall_time_s; give --budget-s")
    folder = out / name / "random_search"
    cands = cfg.model.searched_candidates()
    vocab = load_corpus(cfg.data).vocab_size
    rungs = rung_steps(min_steps, eta, cfg.retrain.steps)
    space = len(cands) ** cfg.model.n_layers
    draws: list[list[str]] = []

    def genotype_file(i: int) -> str:
        while len(draws) <= i:
            draws.append(sample_genotypes(len(draws) + 1, cfg.model.n_layers, cands, sample_seed)[-1])
        path = folder / "genotypes" / f"r{i:03d}.json"
        if not path.exists():
            idx = [cands.index(p) for p in draws[i]]
            from_probabilities(np.eye(len(cands))[idx], cfg.model, vocab, {"random_search": {"seed": sample_seed, "index": i}}, idx).save(path)
        return str(path)

    def evaluate(i: int, k: int) -> tuple[float, float]:
        print(f"[random search] {name}: rung {k} ({rungs[k]} steps) genotype r{i:03d}", file=sys.stderr, flush=True)
        m = short_retrain(short_config(cfg, rungs[k], rank_windows), genotype_file(i), folder / f"rung{k}" / f"r{i:03d}")
        return float(m["valid"].get(headline, m["valid"]["loss"])), float(m.get("wall_time_s", 0.0))

    history = successive_halving(range(space), budget_s, rungs, eta, evaluate)
    for rung in history:
        for r in rung:
            r["placements"] = " ".join(draws[r["index"]])
    spent, evaluated = sum(r["wall_time_s"] for h in history for r in h), sum(len(h) for h in history)
    best = best_of_last_rung(history)
    if best is None:
        raise ConfigError(f"random search in {folder}: every short retrain diverged")
    best_file = folder / "genotype.json"
    Genotype.load(genotype_file(best["index"])).save(best_file)
    print(f"[random search] {name}: best {best['placements']}; retraining it at {seeds} seeds", file=sys.stderr, flush=True)
    if table is not None:  # the short retrains of the rungs are measured retrains too
        from experiments.common.retrain_table import current_commit, record_runs, space_of

        record_runs(folder, name, space_of(cfg), current_commit(), table)
    entries = compare_with_table(cfg, name, [str(best_file)], [], seeds, out / name / "compare", table, workers=workers)
    runs = [r["valid"][headline] for r in entries[0].runs if r is not None]
    result = {"setting": name, "budget_s": budget_s, "budget_from": budget_from, "spent_s": spent, "evaluated": evaluated, "rungs": rungs, "eta": eta,
              "placements": best["placements"], "history": history, "headline": headline,
              "valid": runs, "mean": statistics.mean(runs) if runs else None, "std": statistics.stdev(runs) if len(runs) > 1 else None}
    write_json_atomic(folder / "result.json", result)
    return result


def main(argv=None) -> int:
    p = OneLineParser(prog="random_search.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow,deep")
    p.add_argument("--budget-s", type=float, default=None, help="seconds to spend (default: the setting's search wall time)")
    p.add_argument("--min-steps", type=positive_int, default=100, help="steps of the first rung (default 100)")
    p.add_argument("--eta", type=int, default=3, help="keep the best 1/eta of a rung; the next rung trains eta times longer (default 3)")
    p.add_argument("--rank-windows", type=positive_int, default=128, help="valid windows that rank a short retrain (default 128)")
    p.add_argument("--seeds", type=positive_int, default=3)
    p.add_argument("--sample-seed", type=int, default=1, help="stream of random genotypes (ground_truth.py's sample uses 0)")
    args = p.parse_args(argv)

    def body() -> None:
        from autoln.core.errors import ConfigError

        if args.eta < 2:
            raise ConfigError(f"--eta must be at least 2, got {args.eta}")
        if args.budget_s is not None and not args.budget_s > 0:
            raise ConfigError(f"--budget-s must be positive, got {args.budget_s}")
        results = each_setting(args, "random_search.py", lambda n, overrides, out: run_setting(
            n, overrides, args.config, args.budget_s, args.min_steps, args.eta, args.seeds, args.sample_seed,
            args.rank_windows, out, args.workers, args.table))
        for r in results:
            n = r["setting"]
            mean = f"{r['mean']:.4f}" + (f" ± {r['std']:.4f}" if r["std"] is not None else "") if r["mean"] is not None else "-"
            print(f"{n}: random search spent {r['spent_s']:.0f} of {r['budget_s']:.0f} s on {r['evaluated']} short retrains "
                  f"(rungs {r['rungs']} steps); best {r['placements']}: valid {r['headline']} {mean} over {len(r['valid'])} seeds")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
