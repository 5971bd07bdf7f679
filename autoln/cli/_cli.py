"""Command lines of ``search.py`` and ``retrain.py``.

``python search.py [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite | --resume]``
``python search.py --tune [--workers N] [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite]``
``python search.py --seeds N [--workers N] [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite]``
``python retrain.py --genotype FILE_OR_NAME [--config FILE] [--set KEY=VALUE ...] [--out DIR] [--overwrite | --resume]``
``python retrain.py --compare [--genotype FILE ...] [--baselines LIST] [--seeds N] [--workers N] [--config FILE] [--set ...] [--out DIR]``

Exit status: 0 on success, 2 for bad input (config, data, genotype, output folder, or a file
the system refuses; one line ``error: ...`` naming the file or field, no traceback), 3 when
training diverged (``on_divergence: stop``), 4 out of memory, 5 when a ``--workers`` process
(or another ``torchrun`` process) died, 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, after the run's checkpoint is written;
``--resume`` continues from it.

Data-parallel: ``torchrun --nproc_per_node N search.py ...`` (or ``retrain.py``) trains one
model across N processes (:mod:`autoln.core.distributed`); only rank 0 prints and writes. Each
process exits with the status above; torchrun itself exits 1 on any failure (docs/scale.md).
``--tune``, ``--seeds`` and ``--compare`` run several jobs and take ``--workers N`` (processes
on this machine) instead; ``--tune`` and ``--compare`` refuse ``torchrun``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from autoln.core.commands import again_command, resume_command, script_line, tensorboard_line
from autoln.core.errors import AutolnError, DivergenceError

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_OUT_OF_MEMORY = 4
EXIT_WORKER_DIED = 5


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line ``error: ...`` (exit 2), like every
    other bad input, instead of the usage block; ``--help`` still prints it. An unrecognized
    ``--<name>`` that is a config key gets the ``--set`` that sets it (:func:`set_hint`)."""

    #: the command's own config section (``search`` or ``retrain``), looked in first for hints
    section: str = "search"

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = set_hint(extras, self.section)
            self.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; {hint}" if hint else ""))
        return parsed

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


def set_hint(extras: list[str], section: str) -> Optional[str]:
    """For unrecognized arguments such as ``--steps 100`` or ``--d-model=64``: ``did you mean
    --set search.steps=100?`` naming every ``--<name>`` that is a config key (dashes read as
    underscores; the command's own ``section`` first, then the others in file order); None
    when no argument is one."""
    import dataclasses

    from autoln.config import Config

    defaults = Config()
    sections = [section] + [f.name for f in dataclasses.fields(Config) if f.name != section]
    keys = {}
    for sec in sections:
        for f in dataclasses.fields(getattr(defaults, sec)):
            keys.setdefault(f.name, f"{sec}.{f.name}")
    sets = []
    for i, tok in enumerate(extras):
        if not tok.startswith("--"):
            continue
        name, eq, value = tok[2:].partition("=")
        key = keys.get(name.replace("-", "_"))
        if key is None:
            continue
        if not eq:
            nxt = extras[i + 1] if i + 1 < len(extras) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "VALUE"
        sets.append(f"--set {key}={value}")
    return f"did you mean {' '.join(sets)}?" if sets else None


#: The config file's sections (:class:`autoln.config.Config`'s fields), for ``--help``.
CONFIG_SECTIONS = ("data", "model", "search", "retrain", "tune", "race", "checkpoint", "logging")


def number(value: float) -> str:
    """A metric for the terminal: 4 decimals, or 4 significant digits when huge (a blown-up
    perplexity)."""
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"


def invoked_as(script: str) -> str:
    """The command's name as the user typed it: the console script (``autoln-search``,
    ``autoln-retrain``) when run through one, else ``script`` (``search.py``, ``retrain.py``)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("autoln-") else script


def _parser(prog: str, description: str, section: str, default_out: str) -> argparse.ArgumentParser:
    p = OneLineParser(prog=invoked_as(prog), description=description)
    p.section = section
    p.add_argument("--config", metavar="FILE", help=f"YAML config (sections {', '.join(CONFIG_SECTIONS)})")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help=f"override one config key, e.g. --set {section}.steps=200 (repeatable)")
    p.add_argument("--out", metavar="DIR", help=f"run folder (default {default_out})")
    p.add_argument("--overwrite", action="store_true", help="reuse an --out folder that holds a finished run")
    return p


def _add_resume(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out from its checkpoint (same command otherwise)")


def _check_resume(p: argparse.ArgumentParser, args: argparse.Namespace, *others: str) -> None:
    if not args.resume:
        return
    if args.overwrite:
        p.error("--resume continues a run and --overwrite starts it again: give one of them")
    if not args.out:
        p.error("--resume needs --out DIR, the folder of the run to continue")
    for option in others:
        if getattr(args, option):
            p.error(f"--resume does not apply to --{option} (re-running that command resumes it)")


def guarded(body: Callable[[], None], resume: Optional[Callable[[], Optional[str]]] = None,
            folder: Optional[Callable[[], Optional[Path]]] = None) -> int:
    """Run ``body`` and turn autoln's errors, refused files and Ctrl-C into one line and an
    exit status; under ``torchrun`` rank 0 prints the line, every process exits with the status
    and leaves the process group at the end (:func:`autoln.core.distributed.finish`). ``resume()``:
    the command that continues the run once memory is free (the out-of-memory line's), None
    while the run folder is not known yet; default (and None) :func:`autoln.core.commands.again_command`.
    ``folder``: the run folder (None while not known), whose checkpoints (there or in a run below
    it) decide whether the out-of-memory line says one is kept."""
    said: list[str] = []
    try:
        code = _guarded(body, _on_main(said), resume, folder)
    except BaseException as exc:  # a bug: its traceback goes to torchrun's summary too
        distributed = sys.modules.get("autoln.core.distributed")
        if distributed is not None:
            distributed.finish(1, said, exc) if isinstance(exc, Exception) else distributed.shutdown()
        raise
    distributed = sys.modules.get("autoln.core.distributed")  # None: Ctrl-C came while torch imported
    return code if distributed is None else distributed.finish(code, said)


def _guarded(body: Callable[[], None], say: Callable[..., None], resume: Optional[Callable[[], Optional[str]]] = None,
             folder: Optional[Callable[[], Optional[Path]]] = None) -> int:
    """:func:`guarded`'s exit status for ``body``, its lines given to ``say``."""
    try:
        from autoln.core import distributed  # noqa: F401 - imported inside the try: Ctrl-C may come while torch imports

        try:
            body()
        except DivergenceError as exc:
            say(f"error: {exc}", file=sys.stderr)
            return EXIT_DIVERGED
    except AutolnError as exc:
        say(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (MemoryError, RuntimeError) as exc:  # RuntimeError: torch's allocators (CPU and CUDA)
        from concurrent.futures.process import BrokenProcessPool

        from autoln.core.io import os_error_in
        from autoln.models.resources import is_out_of_memory

        from autoln.core.commands import again_command

        if isinstance(exc, BrokenProcessPool):
            say("error: a --workers process died (killed by a signal, or by the system's out-of-memory killer); finished "
                f"runs and checkpoints on disk are kept: run the command again to go on: {again_command()} (with fewer "
                "--workers if memory was short)", file=sys.stderr)
            return EXIT_WORKER_DIED
        if "autoln.core.distributed" in sys.modules and sys.modules["autoln.core.distributed"].peer_lost(exc):  # another torchrun process ended
            say(f"error: another process of this torchrun job ended while this one waited for it ({sys.modules['autoln.core.distributed'].peer_lost_cause(exc)}); "
                "its own error line, or torchrun's summary of failures, says why; checkpoints already written are kept",
                file=sys.stderr)
            return EXIT_WORKER_DIED
        if os_error_in(exc) is not None and not is_out_of_memory(exc):  # a library's report of a refused write
            say(f"error: {os_error_line(os_error_in(exc))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not is_out_of_memory(exc):
            raise
        go_on = (resume() if resume else None) or again_command()
        where = folder() if folder else None
        kept = ("The run folder keeps its last checkpoint" if where is not None and next(Path(where).rglob("checkpoint.pt"), None)
                else "No checkpoint was written before it (it starts again from step 0)")
        kept += f"; once memory is free, continue with: {go_on}"
        say(f"error: out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}. {kept}; or lower "
            "model.context, the batch_size or the model's size (model.d_model, model.n_layers, model.d_ff) and start a new "
            "run (--overwrite replaces this one, or choose another --out)", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    except OSError as exc:  # a file the system refuses (permissions, full disk, ...)
        say(f"error: {os_error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        # a bare KeyboardInterrupt came outside a run's steps (imports, config, between the runs of
        # --seeds/--tune/--compare): nothing half-done is kept, finished runs and checkpoints are
        from autoln.core.commands import again_command

        say(f"interrupted: {exc}" if str(exc) else "interrupted before a run started, or between runs: finished runs and "
            f"checkpoints on disk are kept; run the command again to go on: {again_command()}", file=sys.stderr)
        return 128 + getattr(exc, "signum", 2)
    return 0


def os_error_line(exc: OSError) -> str:
    """The line for a file the system refuses: its name and the cause; for a want of space
    (:data:`autoln.core.io.SPACE_ERRNOS`; inside a run, :func:`autoln.runs.checkpoint.space_errors_kept`
    has said it already) what is kept and the command to run again once there is space."""
    from autoln.runs.checkpoint import space_message
    from autoln.core.commands import rerun_line
    from autoln.core.io import SPACE_ERRNOS

    if exc.errno in SPACE_ERRNOS:
        again = rerun_line(sys.argv[0], *(a for a in sys.argv[1:] if a != "--overwrite"))
        return space_message(exc, None, again)
    from autoln.core.errors import cut

    return f"{cut(str(exc.filename or ''))}: {exc.strerror or exc}"  # a path can be 128 KiB long


def _on_main(said: list) -> Callable[..., None]:
    """``print`` that appends each message to ``said`` and prints it on rank 0 only: under
    ``torchrun`` every process raises the same error for the same input, before the process
    group exists or after, so one copy is enough (the rank from ``RANK``, as
    :func:`autoln.core.distributed.is_main`; another rank prints its own only when it failed alone,
    :func:`autoln.core.distributed.finish`)."""
    import os

    main = int(os.environ.get("WORLD_SIZE", "1")) <= 1 or int(os.environ.get("RANK", "0")) == 0

    def say(*args, **kwargs) -> None:
        said.append(kwargs.get("sep", " ").join(str(a) for a in args))
        if main:
            print(*args, **kwargs)
    return say


def _shared_out(out, device_name: str):
    """The run folder, rank 0's under ``torchrun`` (a default folder is named by the time,
    which may differ between processes); joins the process group first."""
    from autoln.core import distributed
    from autoln.runs.training import resolve_device

    if distributed.launched():
        distributed.init(resolve_device(device_name))
    return distributed.from_main(out)


def _skipped_note(skipped: int, steps: int, what: str = "updates") -> None:
    """Warn when ``on_divergence: skip_batch`` skipped updates (:func:`autoln.oneshot.search_loop.skipped_line`)."""
    from autoln.oneshot.search_loop import skipped_line

    line = skipped_line(skipped, steps, what)
    if line:
        print(f"warning: {line}", file=sys.stderr)


def _refuse_torchrun(option: str) -> None:
    from autoln.core import distributed
    from autoln.core.errors import ConfigError

    if distributed.launched():
        raise ConfigError(f"{option} runs several jobs and cannot run under torchrun; start it with plain python"
                          + (" (use --workers N for parallel trials)" if option == "--tune" else ""))


def _say_if_busy() -> None:
    """On the main process, one line on stderr when the load is above the cores
    (:func:`autoln.models.resources.busy_line`)."""
    from autoln.core import distributed
    from autoln.models.resources import busy_line

    line = busy_line() if distributed.is_main() else None
    if line:
        print(line, file=sys.stderr, flush=True)


def search_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``search.py``; returns the exit status."""
    p = _parser("search.py", "Differentiable search of per-layer norm placements; writes genotype.json.",
                "search", "runs/search-<timestamp>; with --tune runs/tune-<tune.study_name>")
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
        from autoln.runs.training import default_out_dir

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
    from autoln.runs.training import default_out_dir

    out = Path(args.out) if args.out else default_out_dir("seeds")
    consensus, path = run_seeds(cfg, args.seeds, out, args.workers, args.overwrite)
    print((out / VOTES_FILE).read_text() + f"\nconsensus genotype: {' '.join(consensus.candidates[k] for k in consensus.choices)}"
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


DEFAULT_BASELINES = "all-pre,all-post,all-deepnorm,mix-ln,pre-post,all-peri,all-outnorm,all-lns,all-none"  # autoln.models.genotype.BASELINES (a test keeps them equal)


def retrain_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``retrain.py``; returns the exit status."""
    p = _parser("retrain.py", "Train the derived model of a genotype (or a named baseline) from scratch; "
                "with --compare, several genotypes and the published placements at equal budget and seeds.",
                "retrain", "runs/retrain[-<baseline>]-<timestamp>; with --compare runs/compare-<timestamp>")
    p.add_argument("--genotype", action="append", default=[], metavar="FILE_OR_NAME",
                   help=f"genotype.json from search.py, or a named baseline: {' | '.join(DEFAULT_BASELINES.split(','))}, or any "
                        "all-<candidate> such as all-pre:fixed (required once; with --compare repeatable and optional)")
    p.add_argument("--compare", action="store_true",
                   help="retrain every --genotype and every --baselines entry for --seeds seeds; write a table and curves")
    p.add_argument("--baselines", metavar="LIST", help=f"with --compare: comma-separated baselines (default {DEFAULT_BASELINES}; '' for none)")
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
        from autoln.runs.training import default_out_dir

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


def _compare(cfg, args) -> None:
    """``retrain.py --compare``: run the comparison and print its table."""
    from autoln.retrain.compare import run_compare
    from autoln.runs.training import default_out_dir

    baselines = [b.strip() for b in (DEFAULT_BASELINES if args.baselines is None else args.baselines).split(",") if b.strip()]
    out = Path(args.out) if args.out else default_out_dir("compare")
    run_compare(cfg, args.genotype, baselines, 3 if args.seeds is None else args.seeds, out, args.overwrite, args.workers)
    print((out / "compare.md").read_text() + f"\nwrote {out / 'compare.csv'}, {out / 'compare.md'}, {out / 'valid_curves.png'}")
    if cfg.logging.tensorboard:  # else the runs' folders hold no event files to show
        print("next: " + tensorboard_line(out) + "   # every run's curves, one folder per genotype and seed")
