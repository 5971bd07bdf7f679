"""The command line of ``retrain.py`` (``autoln-retrain``): :func:`retrain_main`.

``python retrain.py --genotype FILE_OR_NAME [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite | --resume]``
``python retrain.py --compare [--genotype FILE ...] [--baselines LIST] [--seeds N] [--workers N] [--config FILE] [--set ...] [--out DIR]``

One retrain, or with ``--compare`` several genotypes and the named baselines, and what each
prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from autoln.cli.guard import guarded
from autoln.cli.parsing import _add_resume, _check_resume, _parser, number
from autoln.cli.shared import _refuse_torchrun, _say_if_busy, _shared_out, _skipped_note
from autoln.core.commands import resume_command, script_line, tensorboard_line

DEFAULT_BASELINES = "all-pre,all-post,all-deepnorm,mix-ln,pre-post,all-peri,all-outnorm,all-lns,all-none"  # autoln.models.genotype.BASELINES (a test keeps them equal)


def retrain_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``retrain.py``; returns the exit status."""
    p = _parser("retrain.py", "Train the derived model of a genotype (or a named baseline) from scratch; "
                "with --compare, several genotypes and the published placements at equal budget and seeds.",
                "retrain", "runs/retrain[-<baseline>]-<UTC time>Z; with --compare runs/compare-<UTC time>Z")
    p.add_argument("--genotype", action="append", default=[], metavar="FILE_OR_NAME",
                   help=f"genotype.json from search.py, or a named baseline: {' | '.join(DEFAULT_BASELINES.split(','))}, an open model's "
                        "placement with QK-norm: olmo2 | gemma3 | qwen3, or any all-<candidate> such as all-pre:fixed (required once; with --compare repeatable and optional)")
    p.add_argument("--compare", action="store_true",
                   help="retrain every --genotype and every --baselines entry for --seeds seeds; write a table and curves")
    p.add_argument("--baselines", metavar="LIST", help=f"with --compare: comma-separated baselines (default {DEFAULT_BASELINES}, "
                   "and olmo2,gemma3,qwen3 when a genotype has QK-norm; '' for none)")
    p.add_argument("--seeds", type=int, metavar="N", help="with --compare: seeds per genotype (default 3)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="with --compare: retrains at once, each in its own process with the CPU threads shared (default 1)")
    _add_resume(p)
    args = p.parse_args(argv)
    _check_resume(p, args, "compare")
    if args.workers < 1:
        p.error(f"--workers must be a positive integer, got {args.workers}")
    if not args.compare:
        if (args.baselines, args.seeds) != (None, None) or args.workers != 1:
            p.error("--baselines, --seeds and --workers need --compare")
        if len(args.genotype) != 1:
            p.error("give exactly one --genotype (or use --compare for several)")

    def body() -> None:
        from autoln.config import load_config
        from autoln.engine.training import default_out_dir

        cfg = load_config(args.config, args.overrides)
        _say_if_busy()
        if args.compare:
            _refuse_torchrun("--compare")
            return _compare(cfg, args)
        from autoln.core import distributed
        from autoln.models.genotype import is_baseline
        from autoln.retrain.run_retrain import run_retrain

        spec = args.genotype[0]
        tag = spec if is_baseline(spec) else ""
        out = where["out"] = _shared_out(args.out or default_out_dir("retrain", tag), cfg.retrain.device)
        result = run_retrain(cfg, spec, out, args.overwrite, resume=args.resume)
        if not distributed.is_main():
            return
        def shown(m: dict, k: str) -> str:
            se = f" ± {number(m[k + '_stderr'])}" if k + "_stderr" in m else ""
            return f"{k} {number(m[k])}{se}" + (" nats/token" if k == "loss" else "")

        lines = [f"{split} ({m['windows']} windows, ± one standard error over windows): "
                 + ", ".join(shown(m, k) for k in m if k != "windows" and not k.endswith("_stderr"))
                 for split, m in (("valid", result.valid), ("test", result.test))]
        print("\n".join(lines) + f"\nwrote {result.path} ({result.wall_time_s:.1f} s)")
        _skipped_note(json.loads(result.path.read_text())["skipped_batches"], cfg.retrain.steps)
        genotype = () if is_baseline(spec) else ("--genotype", spec)
        runs = 3 * (len(DEFAULT_BASELINES.split(",")) + (0 if is_baseline(spec) else 1))
        print("next: " + script_line("retrain.py", "--compare", *genotype, "--seeds", "3", "--config", Path(out) / "config.yaml")
              + f"   # against the named baselines, 3 seeds each ({runs} retrains: {compare_time(result, cfg, runs)})")
        if cfg.logging.tensorboard:  # else the folder holds no event files to show
            print("      " + tensorboard_line(Path(out)) + "   # this run's curves (one run per --logdir keeps others off its charts)")

    where: dict = {}  # the run folder, once known: the out-of-memory line's resume command
    return guarded(body, lambda: resume_command(where["out"]) if "out" in where else None, lambda: where.get("out"))


def compare_time(result, cfg, runs: int) -> str:
    """``about N min on 2 idle cores``: ``runs`` retrains like ``result``'s, estimated from the
    config's own size (:func:`autoln.models.resources.retrain_seconds`)."""
    from autoln.models.resources import retrain_seconds

    seconds = runs * retrain_seconds(result.model.cfg, result.model.vocab_size, cfg.retrain)
    return f"about {seconds / 3600:.1f} h on 2 idle cores" if seconds > 5400 else f"about {max(1, round(seconds / 60))} min on 2 idle cores"


def _any_qk(specs) -> bool:
    """True when one of the genotype files ``specs`` has QK-norm somewhere (unreadable ones are
    left to the comparison's own checks, which name them)."""
    from autoln.core.errors import GenotypeError
    from autoln.models.genotype import Genotype, is_baseline

    for spec in specs:
        if is_baseline(spec):
            continue
        try:
            if Genotype.load(spec).has_qk():
                return True
        except GenotypeError:
            continue
    return False


def _compare(cfg, args) -> None:
    """``retrain.py --compare``: run the comparison and print its table."""
    from autoln.retrain.compare import run_compare
    from autoln.engine.training import default_out_dir

    baselines = [b.strip() for b in (DEFAULT_BASELINES if args.baselines is None else args.baselines).split(",") if b.strip()]
    if args.baselines is None and _any_qk(args.genotype):  # a genotype with QK-norm meets the open models' pairings too
        baselines += ["olmo2", "gemma3", "qwen3"]
    out = Path(args.out) if args.out else default_out_dir("compare")
    run_compare(cfg, args.genotype, baselines, 3 if args.seeds is None else args.seeds, out, args.overwrite, args.workers)
    print((out / "compare.md").read_text() + f"\nwrote {out / 'compare.csv'}, {out / 'compare.md'}, {out / 'valid_curves.png'}")
    if cfg.logging.tensorboard:  # else the runs' folders hold no event files to show
        print("next: " + tensorboard_line(out) + "   # every run's curves, one folder per genotype and seed")
