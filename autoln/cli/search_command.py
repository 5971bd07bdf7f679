"""The command line of ``search.py`` (``autoln-search``): :func:`search_main`.

``python search.py [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite | --resume]``
``python search.py --tune [--workers N] [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite]``
``python search.py --seeds N [--workers N] [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite]``

A search, then its race (:mod:`autoln.race.run_race`), ``--seeds`` or ``--tune``, and what
each prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from autoln.cli.guard import guarded
from autoln.cli.parsing import _add_resume, _check_resume, _parser, number
from autoln.cli.shared import _refuse_torchrun, _say_if_busy, _shared_out, _skipped_note
from autoln.core.commands import again_command, resume_command, script_line, tensorboard_line


def search_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``search.py``; returns the exit status."""
    p = _parser("search.py", "Differentiable search of per-layer norm placements; writes genotype.json.",
                "search", "runs/search-<UTC time>Z; with --tune runs/tune-<tune.study_name>")
    p.add_argument("--tune", action="store_true",
                   help="run the Optuna outer loop (section tune): each trial is one search; re-running resumes the study")
    p.add_argument("--seeds", type=int, metavar="N",
                   help="run N searches (seeds search.seed..+N-1) in <out>/seed<s> and write their consensus genotype, "
                        "votes.md and the agreement; re-running finishes an interrupted set")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes on this machine for --tune, --seeds or the race after a search (default 1)")
    _add_resume(p)
    args = p.parse_args(argv)
    if args.tune and args.seeds is not None:
        p.error("--seeds and --tune are separate jobs: give one of them")
    _check_resume(p, args, "tune", "seeds")

    def body() -> None:
        from autoln.config import load_config
        from autoln.oneshot.run_search import run_search
        from autoln.engine.training import default_out_dir

        from autoln.core import distributed

        cfg = load_config(args.config, args.overrides)
        _say_if_busy()
        if args.tune:
            _refuse_torchrun("--tune")
            return _tune(cfg, args)
        if args.seeds is not None:
            _refuse_torchrun("--seeds")
            return _seeds(cfg, args)
        if args.workers < 1:
            p.error(f"--workers must be a positive integer, got {args.workers}")
        if args.workers != 1 and not cfg.race.enabled:
            p.error("--workers needs --tune, --seeds or the race after a search (race.enabled is false)")
        out = where["out"] = Path(_shared_out(args.out or default_out_dir("search"), cfg.search.device))
        race = cfg.race.enabled and not distributed.launched()
        if args.resume:
            from autoln.race.resume import check_race_off, check_search_kept

            check_race_off(out, None if race else "torchrun" if cfg.race.enabled else "race.enabled=false")
            if race and searched(out):
                check_search_kept(out, cfg)
        if not (race and args.resume and searched(out)):
            result = run_search(cfg, out, args.overwrite, resume=args.resume)
            if not distributed.is_main():
                return
            if race:  # genotype.json is only ever the race's answer
                from autoln.race.run_race import supernet_file

                result.path = supernet_file(out)
            _searched(cfg, result)
            if distributed.launched() and cfg.race.enabled:
                print("note: the race runs without torchrun: " + script_line("search.py", "--resume", "--out", out,
                                                                             "--config", out / "config.yaml"))
        if not race:
            path = out / "genotype.json"
            print("next: " + script_line("retrain.py", "--genotype", path, "--config", out / "config.yaml"))
            if cfg.logging.tensorboard:  # else the folder holds no event files to show
                print("      " + tensorboard_line(out) + "   # this search's alphas and curves (alphas.png in the folder too)")
            return
        _race(cfg, out, args.workers)

    where: dict = {}  # the run folder, once known: the out-of-memory line's resume command
    return guarded(body, lambda: resume_command(where["out"]) if "out" in where else None, lambda: where.get("out"))


def searched(out: Path) -> bool:
    """True when ``out`` holds a finished search that was to race (its own ``config.yaml`` has
    ``race.enabled``; a search made before the race existed has no ``race`` section) and whose
    race is not finished: ``--resume`` then continues the race."""
    import yaml

    from autoln.config import read_yaml
    from autoln.race.run_race import SUPERNET_FILE, finished_race

    if not ((out / "genotype.json").exists() or (out / SUPERNET_FILE).exists()) or finished_race(out) is not None:
        return False
    try:
        race = (read_yaml((out / "config.yaml").read_text(encoding="utf-8")) or {}).get("race")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return False
    return isinstance(race, dict) and race.get("enabled", True) is True


def _searched(cfg, result) -> None:
    """After a search: its genotype, the supernet's valid estimate, the file, the sites."""
    headline = next((k for k in ("bits_per_byte", "bits_per_char", "perplexity") if k in result.valid), "loss")
    se = result.valid.get(f"{headline}_stderr")
    print(f"genotype: {result.genotype.describe()}\nsupernet valid {headline}: {number(result.valid[headline])}"
          + (f" ± {number(se)}" if se is not None else "") +
          f" (an estimate on search.eval_windows={cfg.search.eval_windows} windows, ± one standard error over windows)\n"
          f"wrote {result.path} ({result.wall_time_s:.1f} s)" + (" (the supernet's read-off: the race decides the answer)"
                                                                 if result.path.name != "genotype.json" else ""))
    _skipped_note(result.genotype.provenance["metrics"]["skipped_batches"], cfg.search.steps)
    selection = result.genotype.provenance["selection"]
    if selection.get("skipped_batches"):
        _skipped_note(selection["skipped_batches"], selection["fine_tuning_updates"], "fine-tuning updates of the selection")
    _print_sites(result.genotype, result.path.parent, *loss_unit(result.valid))


def _race(cfg, out: Path, workers: int) -> None:
    """The race after the search (:mod:`autoln.race.run_race`): its verdict and the next commands."""
    from autoln.race.run_race import RACE_DIR, run_race

    out = Path(out)
    print("racing the supernet's shortlist against the named placements in real retrains (race.enabled=false skips it) ...",
          flush=True)
    result = run_race(cfg, out, workers)
    print(f"{result.verdict.line}\nwrote {result.genotype_path} (the answer; the supernet's read-off is in supernet_genotype.json), "
          f"{result.record_path}" + (f", {out / RACE_DIR / 'race.png'}" if cfg.logging.tensorboard else "")
          + f" ({result.record['wall_time_s']:.0f} s of retrains)")
    print("next: " + script_line("retrain.py", "--genotype", result.genotype_path, "--config", out / "config.yaml",
                                 "--set", f"retrain.seed={cfg.retrain.seed + 100}")
          + "   # fresh seeds: the race's own flatter the winner")
    if cfg.logging.tensorboard:
        print("      " + tensorboard_line(out) + "   # the search's alphas, the race's retrains and its HParams table")


def loss_unit(valid: dict) -> tuple[float, str]:
    """``(factor, unit)`` that put a loss in nats/token into the unit of the search's valid line:
    bits per byte or per character (``valid``'s headline over its ``loss``: ``1 / ln 2``, and for
    BPE over the valid split's bytes per token too, docs/design.md §8), or nats/token itself
    beside a perplexity, which is not linear in the loss."""
    for key, unit in (("bits_per_byte", "bits/byte"), ("bits_per_char", "bits/char")):
        if key in valid and valid.get("loss"):
            return valid[key] / valid["loss"], unit
    return 1.0, "nats/token"


def _print_sites(g, folder: Path, scale: float = 1.0, unit: str = "nats/token") -> None:
    """After a search (in ``folder``): the per-site probabilities and choice, the loss rises of perturbation-based
    selection or the best scored genotypes (losses in nats/token times ``scale``, printed in ``unit``: the valid
    line's, :func:`loss_unit`), and notes on the sites whose answer is weak (no clear winner, rises overruling
    the probabilities, no candidate that helps; the first with the ``--seeds 3`` command of the same search)."""
    from autoln.oneshot.consensus import site_choices
    from autoln.models.genotype import site_rows
    from autoln.oneshot.run_search import genotype_markdown
    from autoln.oneshot.selection import site_notes
    from autoln.models.supernet import site_names

    sites = site_names(g.model["n_layers"], g.granularity)
    print(genotype_markdown(g.site_probabilities(), sites, g.candidates, [g.candidates.index(n) for n in site_choices(g)]))
    if g.qk_norm is not None and len(g.qk_norm["candidates"]) > 1:  # a searched QK-norm: its own probabilities, read off by argmax
        import numpy as np

        qk = g.qk_norm
        print("QK-norm (its own alphas; the read-off takes the most probable):")
        print(genotype_markdown(np.asarray(qk["probabilities"]), [f"block{i}.qk" for i in range(len(qk["choices"]))],
                                qk["candidates"], [qk["candidates"].index(c) for c in qk["choices"]]))
    rises = g.provenance["selection"].get("loss_rises")
    if rises is not None:
        print(f"loss rise ({unit}) when a candidate is removed (perturbation-based selection picks the largest):")
        for site, row in zip(sites, site_rows(rises, g.granularity)):
            print(f"  {site}: " + ", ".join(f"{c} {'nan' if v is None else format(v * scale, '+.4g')}"
                                            for c, v in zip(g.candidates, row)))
    top = g.provenance["selection"].get("top")
    if top:
        print(f"genotypes scored by the supernet ({g.provenance['selection']['search']}, {g.provenance['selection']['evaluated']} "
              f"scored; loss in {unit} with the genotype imposed one-hot, the lowest wins):")
        for rank, entry in enumerate(top[:5]):
            print(f"  {rank + 1}. {entry['placements']}: {entry['loss'] * scale:.4f}")
    notes = site_notes(sites, g.candidates, site_choices(g), g.site_probabilities(),
                       site_rows(rises, g.granularity) if rises is not None else None, scored=bool(top), scale=scale, unit=unit)
    for kind, line in notes:
        if kind == "undecided":
            line += f"; check the answer's agreement across seeds with: {script_line('search.py', '--seeds', '3', '--config', folder / 'config.yaml')}"
        print(f"note: {line}")


def _seeds(cfg, args) -> None:
    """``search.py --seeds N``: run the seeds, print the vote table and the consensus."""
    from autoln.oneshot.consensus import VOTES_FILE, run_seeds
    from autoln.engine.training import default_out_dir

    out = Path(args.out) if args.out else default_out_dir("seeds")
    consensus, path = run_seeds(cfg, args.seeds, out, args.workers, args.overwrite)
    from autoln.models.genotype import Genotype

    print((out / VOTES_FILE).read_text() + f"\nconsensus genotype: {Genotype.load(path).describe()}"  # its QK-norm too
          f"\nagreement: {consensus.agreement:.0%} of sites\nwrote {path}, {out / VOTES_FILE}")
    print("next: " + script_line("retrain.py", "--compare", "--genotype", path, "--config", out / f"seed{cfg.search.seed}" / "config.yaml"))


def _tune(cfg, args) -> None:
    """``search.py --tune``: run or resume the study, print where its report is."""
    from autoln.tune import run_tune

    out = Path(args.out) if args.out else Path("runs") / f"tune-{cfg.tune.study_name}"
    result = run_tune(cfg, out, args.workers, args.overwrite)
    c = result.census
    print(f"study {cfg.tune.study_name}: {c.finished}/{cfg.tune.n_trials} finished trials ({result.wall_time_s:.1f} s)")
    if result.best_number is not None:
        print(f"best: trial {result.best_number}, score {result.best_value:.4f} -> {out / 'best_genotype.json'}")
    else:
        print("no trial completed: no best genotype (see trials.md for each trial's reason)")
    print(f"wrote {out / 'trials.md'}, {out / 'trials.csv'}, {out / 'plots'}")
    if c.finished < cfg.tune.n_trials:
        print(f"note: the study is not finished (a worker died?); run the command again to finish it: {again_command()}")
    elif result.best_number is not None:
        best = out / "best_genotype.json"
        print("next: " + script_line("retrain.py", "--genotype", best, "--config", out / "config.yaml"))
