"""The retrain job: build the derived model of a genotype and train it from scratch (docs/design.md §1).

The derived model trains on the whole training split (D_w and D_alpha together), with AdamW,
warm-up + cosine decay and gradient clipping; it is evaluated on the valid split every
``retrain.eval_every`` steps, and on valid and test at the end (``retrain.final_eval_windows``
windows each). The diagnostics of :mod:`autoln.models.diagnostics` are computed on a fixed batch of
``DIAG_WINDOWS`` valid windows at initialisation (with the per-layer gradient norms) and at
each evaluation (with the update size since initialisation), and loss spikes are counted at
every step. Outputs: ``metrics.json``, ``checkpoint.pt``, ``config.yaml``, TensorBoard events.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from autoln.core import distributed
from autoln.config import Config
from autoln.data import (HEADLINE, WindowSampler, check_lengths, estimate_starts, estimate_text, eval_batches, eval_starts,
                   load_corpus, metrics_from_loss)
from autoln.models.diagnostics import SpikeCounter, logits, snapshot
from autoln.engine.checkpoint import CHECKPOINT_FILE, StopSignals, check_corpus_there, load_for_resume, set_rng_state, space_errors_kept
from autoln.core.errors import ConfigError, FolderInUse, GenotypeError, OutputError
from autoln.models.genotype import (NAMED, MODEL_KEYS, OPTIONAL_MODEL_KEYS, Genotype, baseline, is_baseline,
                                    unfinished_race_hint)
from autoln.space.placements import placement_names
from autoln.core.io import write_json_atomic, write_text_atomic
from autoln.core.locks import FolderLock
from autoln.models.model import build_derived
from autoln.oneshot.run_search import EvalHook, genotype_markdown
from autoln.models.supernet import site_names
from autoln.core.tb import Logger
from autoln.models.model import TransformerLM
from autoln.models.resources import check_fits
from autoln.engine.folders import METRICS_FILE, read_metrics, run_config_differences
from autoln.oneshot.search_pieces import Checkpointing
from autoln.engine.training import (check_out_dir, environment, measure, prepare_model, prepare_out_dir, progress_bar, progress_line, resolve_device,
                       seed_everything, train_step, utc_now, weight_optimizer, with_stderr)  # noqa: F401 - with_stderr: its old home

#: Valid windows of the fixed batch on which the diagnostics are computed.
DIAG_WINDOWS = 8


def log_diagnostics(log: Logger, diag: dict, step: int) -> None:
    """TensorBoard: ``diag/<name>/block<i>`` for each per-block diagnostic, ``diag/update_size``;
    at step 0 (initialisation) the per-block values are also drawn against the block index as
    the image ``diag_init`` (an image at step 0, not scalars whose step is a block index: those
    would be purged on resume from any checkpoint at or below the block count)."""
    for name, value in diag.items():
        if isinstance(value, list):
            log.scalars({f"block{i}": v for i, v in enumerate(value)}, step, f"diag/{name}")
        else:
            log.scalar(f"diag/{name}", value, step)
    per_block = {name: value for name, value in diag.items() if isinstance(value, list)}
    if step == 0 and per_block and log.writer:
        import matplotlib.pyplot as plt

        fig = init_figure(per_block)
        log.figure("diag_init", fig, 0)
        plt.close(fig)


def init_figure(per_block: dict[str, list[float]]):
    """One panel per diagnostic: its value at initialisation against the block index (for the
    residual norm index 0 is the embedding, ``l`` the output of block ``l - 1``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(per_block), figsize=(3.2 * len(per_block), 2.8), squeeze=False)
    for ax, (name, values) in zip(axes[0], per_block.items()):
        ax.plot(range(len(values)), values, marker="o", ms=3)
        ax.set(title=name, xlabel="embedding, then blocks" if name == "residual_norm" else "block")
        ax.grid(alpha=0.3)
    fig.suptitle("at initialisation", fontsize=9)
    fig.tight_layout()
    return fig


@dataclass
class RetrainResult:
    """What a retrain returns: the final valid and test metrics, the metrics file, wall time (s)
    and the trained derived model."""

    valid: dict
    test: dict
    path: Path
    wall_time_s: float
    model: TransformerLM


def resolve_genotype(spec: str, cfg: Config, vocab_size: int) -> Genotype:
    """A genotype from a file path or a baseline name (:data:`autoln.models.genotype.NAMED`, built
    at ``cfg.model``'s size).

    Raises:
        GenotypeError: unreadable/invalid file, unknown name, or a ``model.vocab_size`` that
            differs from the data's vocabulary.
    """
    if is_baseline(spec):
        if cfg.model.affine == "search":
            distributed.print_main(f"note: model.affine=search is a search option; the named baseline {spec} keeps its "
                                   "published learnable norm gains (model.affine=fixed fixes them)", file=sys.stderr)
        return baseline(spec, cfg.model, vocab_size)
    if spec and Path(spec).is_dir():
        raise GenotypeError(f"--genotype {spec!r} is a folder; give its genotype.json (e.g. {Path(spec) / 'genotype.json'})")
    if spec and unfinished_race_hint(spec) and not Path(spec).exists():
        raise GenotypeError(f"--genotype {spec!r}: no such file yet{unfinished_race_hint(spec)}")
    if not spec or not Path(spec).is_file():
        import difflib

        close = difflib.get_close_matches(spec, [*NAMED, *(f"all-{c}" for c in placement_names())], n=1)
        hint = (" ('none' has no norm, so no ':fixed' form)" if spec.startswith("all-none:")
                else f" (did you mean {close[0]!r}?)" if close else "")
        raise GenotypeError(f"--genotype {spec!r}: no such file, and not a baseline name{hint} (expected a genotype.json, "
                            f"one of {list(NAMED)} or all-<candidate> such as all-pre:fixed)")
    genotype = Genotype.load(spec)
    if genotype.model["vocab_size"] != vocab_size:
        raise GenotypeError(f"{spec}: field 'model.vocab_size' is {genotype.model['vocab_size']} but the data "
                            f"({cfg.data.corpus}, tokenizer {cfg.data.tokenizer}) has {vocab_size} tokens; "
                            "retrain on the data and tokenizer the genotype was searched with")
    return genotype


def prepare_derived(cfg: Config, genotype_spec: str, out: str | Path, overwrite: bool, check_out: bool = True):
    """What a run on a derived model needs before it builds the model: checks ``out``
    (:func:`autoln.engine.training.check_out_dir`; skipped when ``check_out`` is False, for a resumed
    run), resolves the device, loads the corpus and the
    genotype, and returns ``(device, corpus, genotype, cfg)`` with ``cfg.model`` the genotype's
    dimensions (a note is printed for each ``model.*`` key of the config that differs, and when
    the genotype was searched on other data).

    Raises:
        OutputError, DataError, GenotypeError, ConfigError.
    """
    if check_out:
        check_out_dir(out, overwrite)
    device = resolve_device(cfg.retrain.device)
    distributed.init(device)
    corpus = load_corpus(cfg.data)
    genotype = resolve_genotype(genotype_spec, cfg, corpus.vocab_size)
    mc = genotype.model_config(cfg.model)
    for key in (k for k in (*MODEL_KEYS, *OPTIONAL_MODEL_KEYS, "qk_norm") if k != "vocab_size"):
        if getattr(cfg.model, key) != getattr(mc, key):
            distributed.print_main(f"note: using the genotype's model.{key}={getattr(mc, key)} (config says {getattr(cfg.model, key)})", file=sys.stderr)
    searched_on = genotype.provenance.get("data")
    if isinstance(searched_on, dict) and searched_on.get("fingerprint_sha256") not in (None, corpus.fingerprint):
        distributed.print_main(f"note: the genotype was searched on other data ({searched_on.get('corpus')}); retraining on {corpus.name}",
              file=sys.stderr)
    check_lengths(corpus, mc.context)
    try:
        check_fits(mc, corpus.vocab_size, max(1, cfg.retrain.batch_size // distributed.world_size()), device, False, "retrain")
    except ConfigError as exc:
        if is_baseline(genotype_spec):
            raise
        raise ConfigError(f"{genotype_spec}: {exc} (the model's size comes from the genotype's 'model' field, "
                          "which --set model.* does not change)") from None
    return device, corpus, genotype, replace(cfg, model=mc)  # config.yaml and checkpoints record the model trained


def run_retrain(cfg: Config, genotype_spec: str, out: str | Path, overwrite: bool = False,
                on_eval: Optional[EvalHook] = None, resume: bool = False) -> RetrainResult:
    """Retrain the derived model of ``genotype_spec`` (file or baseline name) under ``out``.

    The model's dimensions come from the genotype (a note is printed for each ``model.*`` key of
    the config that differs); optimisation from ``cfg.retrain``. Same seed -> same initial
    weights (before DeepNorm's gain) and same batches for every genotype. ``on_eval(step,
    valid_metrics)`` runs after each evaluation's checkpoint; whatever it raises ends the run.
    Checkpoints as :func:`autoln.oneshot.run_search.run_search` (every ``checkpoint.every`` steps, at
    each evaluation, on SIGINT/SIGTERM); ``resume`` continues the run in ``out`` from its
    checkpoint, bitwise as an uninterrupted run on CPU with the same number of threads. A NaN or inf loss or gradient stops the
    run or skips that update, per ``retrain.on_divergence``. Under ``torchrun`` every process
    trains on its share of each batch and only rank 0 writes (:mod:`autoln.core.distributed`).

    Raises:
        OutputError, DataError, GenotypeError, DivergenceError; ConfigError when
        ``retrain.batch_size`` is not divisible by the number of processes, or when resuming
        with a config that differs from the checkpoint's; WriteError when a file cannot be
        written for want of space (:func:`autoln.engine.checkpoint.space_errors_kept`; the previous
        checkpoint is kept).
    """
    # from the start: a second Ctrl-C in set-up stops at once; the folder is this process's until it ends
    if resume and not Path(out).is_dir():  # before the lock, which would create it
        raise OutputError(f"--resume: {out} is not a run folder (it does not exist)")
    with StopSignals(Path(out) / CHECKPOINT_FILE) as signals, FolderLock(out, "retrain"), space_errors_kept(Path(out)):
        return _retrain(cfg, genotype_spec, Path(out), overwrite, on_eval, resume, signals)


def retrain_reusing(cfg: Config, genotype_spec: str, out: str | Path) -> dict:
    """The ``metrics.json`` content of the retrain of ``genotype_spec`` in ``out``, for the
    commands that run many retrains and are re-run after an interruption (``--compare``, the
    experiments): a finished run (:func:`read_metrics`) made with ``cfg``'s settings
    (:func:`autoln.retrain.compare.run_config_differences`) is reused, one made with others is retrained
    from step 0 (a line says which keys differ); an interrupted one
    (``checkpoint.pt``) is continued with :func:`run_retrain`'s ``resume``, bitwise as if
    uninterrupted on CPU with the same number of threads (a damaged ``metrics.json`` is removed
    first, so a finished run's last checkpoint redoes only its final evaluation); anything else,
    or a checkpoint that cannot be resumed (unreadable, made with another config or genotype: a
    line says which), is retrained from step 0.

    Raises:
        As :func:`run_retrain`: DivergenceError (the caller records it), FolderInUse (another
        process holds ``out``), OutputError, DataError, GenotypeError.
    """
    out = Path(out)
    done = read_metrics(out / METRICS_FILE)
    if done is not None:
        differs = run_config_differences(out, cfg)
        if not differs:
            return done
        print(f"note: {out} holds a retrain made with other settings ({'; '.join(differs[:3])}); retraining it", file=sys.stderr)
        run_retrain(cfg, genotype_spec, out, overwrite=True)
        return read_metrics(out / METRICS_FILE)
    if (out / METRICS_FILE).exists():  # cut short or garbled: the run's last checkpoint redoes its final evaluation
        print(f"note: {out / METRICS_FILE} is damaged; " + ("continuing that run from its checkpoint" if (out / CHECKPOINT_FILE).exists()
              else "retraining that run"), file=sys.stderr)
        (out / METRICS_FILE).unlink()
    if (out / CHECKPOINT_FILE).exists():
        try:
            run_retrain(cfg, genotype_spec, out, resume=True)
            return read_metrics(out / METRICS_FILE)
        except FolderInUse:
            raise
        except (ConfigError, GenotypeError, OutputError) as exc:
            print(f"note: {out / CHECKPOINT_FILE} cannot be resumed ({exc}); retraining from step 0", file=sys.stderr)
    run_retrain(cfg, genotype_spec, out, overwrite=True)
    return read_metrics(out / METRICS_FILE)


@dataclass
class RetrainRun:
    """One retrain's model, optimizer, schedule, sampler and bookkeeping (``state``: the valid
    history, diagnostics, counters, checkpointed), in the shape :class:`autoln.oneshot.search_pieces.Checkpointing`
    writes: :meth:`state_dict` and :meth:`wall_time`."""

    model: TransformerLM
    opt: object
    sched: object
    sampler: WindowSampler
    state: dict
    spikes: SpikeCounter
    start: int = 0
    session: float = 0.0

    def state_dict(self) -> dict:
        """The checkpoint's body (the random states aside)."""
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                "sampler": self.sampler.state_dict(), "state": {**self.state, "spikes": asdict(self.spikes)}}

    def wall_time(self) -> float:
        """Seconds of training so far, over every session of a resumed run."""
        return self.state["wall_time_s"] + time.perf_counter() - self.session


def _retrain(cfg: Config, genotype_spec: str, out: Path, overwrite: bool, on_eval: Optional[EvalHook], resume: bool,
             signals: StopSignals) -> RetrainResult:
    """The body of :func:`run_retrain`, under its ``signals``: set up, train, evaluate, write."""
    rc = cfg.retrain
    if resume:
        check_corpus_there(cfg)
    device, corpus, genotype, cfg = prepare_derived(cfg, genotype_spec, out, overwrite, check_out=not resume)
    recorded, cut_note = genotype.record(genotype_spec)  # the copy in checkpoint.pt and metrics.json: provenance bounded
    if cut_note:
        distributed.print_main(f"note: {cut_note}", file=sys.stderr)
    ckpt = None
    if resume:
        def same_genotype(saved: dict) -> None:
            if saved["genotype"]["placements"] != genotype.placements:
                raise GenotypeError(f"--resume: --genotype {genotype_spec} ({genotype.describe()}) is not the genotype of the "
                                    f"run in {out} ({' '.join(map(str, saved['genotype']['placements']))})")
        ckpt = load_for_resume(out, "retrain", cfg, METRICS_FILE, check=same_genotype)
    distributed.check_batch(rc.batch_size, "retrain.batch_size")
    main = distributed.is_main()
    mc = cfg.model
    seed_everything(rc.seed)
    train, valid = corpus.splits["train"], corpus.splits["valid"]
    sampler = WindowSampler(train, np.array([[0, len(train)]]), mc.context, rc.batch_size, seed=[rc.seed, 3])
    derived = build_derived(mc, corpus.vocab_size, genotype.block_placements(), genotype.qk_choices()).init_output_bias(corpus.unigram_log_probs())
    model = prepare_model(derived, device, rc)
    opt, sched = weight_optimizer(list(model.named_parameters()), rc)
    checkpointing = Checkpointing(out, cfg.checkpoint.every, signals, device,
                                  {"kind": "retrain", "config": cfg.to_dict(), "genotype": recorded,
                                   "data_fingerprint": corpus.fingerprint, "threads": torch.get_num_threads()},
                                  write=main, last_step=ckpt["step"] if ckpt is not None else None)
    checkpointing.stop_if_signalled(f"before step {checkpointing.ckpts.next_step}, before writing anything")
    if main:
        if ckpt is None:  # a new run, or one killed before its first checkpoint: start clean
            prepare_out_dir(out, overwrite or resume)
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
    distributed.barrier()
    valid_starts = estimate_starts(eval_starts(len(valid), mc.context, rc.final_eval_windows), rc.eval_windows)
    diag_x, diag_y = (t.to(device) for t in next(eval_batches(valid, valid_starts[:DIAG_WINDOWS], mc.context, DIAG_WINDOWS)))
    run = start_run(cfg, model, opt, sched, sampler, ckpt, diag_x, diag_y)
    log = Logger(out, cfg.logging.tensorboard and main, purge_step=run.start + 1 if run.start else None)
    if not run.start:
        log.text("config", "```yaml\n" + cfg.to_yaml() + "```")
        # a retrain has no alphas: its genotype (with the search's probabilities, if any) is text only
        log.text("genotype", f"`{genotype.describe()}` ({genotype_spec})\n\n"
                 + genotype_markdown(genotype.site_probabilities(), site_names(mc.n_layers, genotype.granularity), genotype.candidates))
        log_diagnostics(log, run.state["diag_init"], 0)
    procs = f", {distributed.world_size()} processes" if distributed.active() else ""
    resumed = f"\n  resumed from {out / CHECKPOINT_FILE} at step {run.start}" if ckpt is not None else ""
    n_params = sum(p.numel() for p in model.parameters())
    distributed.print_main(f"autoln retrain -> {out}\n  genotype: {genotype.describe()} ({genotype_spec})\n  data: {corpus.describe()}\n"
                           f"  model: {n_params:,} parameters, device {device}{procs}{resumed}", file=sys.stderr)
    checkpointing.stop_if_signalled(f"before step {checkpointing.ckpts.next_step}")
    signals.when = StopSignals.IN_STEPS
    run.session = time.perf_counter()
    try:
        train_steps(cfg, corpus, run, checkpointing, log, on_eval, (diag_x, diag_y), device)
        return finish_retrain(cfg, corpus, genotype, genotype_spec, out, run, checkpointing, log, (diag_x, n_params), device, ckpt is not None)
    finally:
        log.close()


def start_run(cfg: Config, model, opt, sched, sampler, ckpt: Optional[dict], diag_x, diag_y) -> RetrainRun:
    """The :class:`RetrainRun` at step 0 (with the diagnostics at initialisation on the fixed
    batch), or restored from ``ckpt`` with the random states."""
    if ckpt is None:
        state = {"history": [], "valid_metrics": {}, "diag_history": [], "skipped_batches": 0, "wall_time_s": 0.0,
                 "diag_ref": logits(model, diag_x), "diag_init": snapshot(model, diag_x, diag_y),
                 "spikes": asdict(SpikeCounter(factor=cfg.retrain.spike_factor))}
        return RetrainRun(model, opt, sched, sampler, state, SpikeCounter(**state["spikes"]))
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    sampler.load_state_dict(ckpt["sampler"])
    set_rng_state(ckpt["rng"])
    return RetrainRun(model, opt, sched, sampler, ckpt["state"], SpikeCounter(**ckpt["state"]["spikes"]), ckpt["step"])


def train_steps(cfg: Config, corpus, run: RetrainRun, checkpointing: Checkpointing, log: Logger, on_eval: Optional[EvalHook],
                diag: tuple, device) -> None:
    """The retrain's steps after ``run.start``: a training step, the loss-spike count, the
    divergence policy, TensorBoard; every ``retrain.eval_every`` steps (and at the last, by the
    final protocol: ``final_eval_windows`` with the standard error) an evaluation with the
    diagnostics; then the checkpoint (:class:`autoln.oneshot.search_pieces.Checkpointing`), the hook and
    the progress line."""
    rc, mc = cfg.retrain, cfg.model
    valid = corpus.splits["valid"]
    final_valid_starts = eval_starts(len(valid), mc.context, rc.final_eval_windows)
    valid_starts = estimate_starts(final_valid_starts, rc.eval_windows)  # a subset of the final windows
    show = cfg.logging.progress and distributed.is_main()
    state, model = run.state, run.model
    bar = progress_bar(range(run.start + 1, rc.steps + 1), show=show, desc="retrain", unit="step", initial=run.start, total=rc.steps)
    try:
        for step in bar:
            x, y = distributed.shard(*run.sampler.sample())
            loss_v, grad_norm = train_step(model, run.opt, run.sched, x.to(device), y.to(device), rc.grad_clip)
            run.spikes.update(loss_v)
            if not (math.isfinite(loss_v) and math.isfinite(grad_norm)):
                checkpointing.ckpts.diverged("retrain", rc.on_divergence, step, f"loss={loss_v}, grad norm={grad_norm}", state, log)
            if step % cfg.logging.log_every == 0:
                log.scalars({"loss": loss_v, "grad_norm": grad_norm}, step, "train")
                log.scalar("lr/weights", run.sched.get_last_lr()[0], step)
            evaluation = step % rc.eval_every == 0 or step == rc.steps
            if evaluation:
                # the last step is evaluated by the final protocol (final_eval_windows, with its standard
                # error): the curve's last point is the final valid number
                starts = final_valid_starts if step == rc.steps else valid_starts
                progress = f"final valid ({len(starts)} windows)" if show and step == rc.steps else None
                state["valid_metrics"] = measure(model, valid, starts, mc.context, rc.batch_size, device, cfg.data.tokenizer,
                                                 corpus.bytes_per_token.get("valid"), stderr=True, progress=progress)
                log.scalars(state["valid_metrics"], step, "valid")
                state["history"].append({"step": step, **state["valid_metrics"]})
                record_diagnostics(run, log, diag[0], step)
            checkpointing.on_step_end(run, step, evaluation)
            if evaluation and on_eval is not None:
                on_eval(step, state["valid_metrics"])
            if show:
                show_progress(cfg, corpus, bar, state, loss_v, step, evaluation, len(valid_starts))
    finally:
        bar.close()


def record_diagnostics(run: RetrainRun, log: Logger, diag_x, step: int) -> None:
    """The diagnostics of an evaluation on the fixed batch (:func:`autoln.models.diagnostics.snapshot`,
    with the update size since initialisation), logged and kept in ``diag_history``."""
    diag = snapshot(run.model, diag_x, reference=run.state["diag_ref"].to(diag_x.device))
    log_diagnostics(log, diag, step)
    log.scalar("diag/loss_spikes", run.spikes.spikes, step)
    run.state["diag_history"].append({"step": step, "loss_spikes": run.spikes.spikes, **diag})
    log.flush()


def show_progress(cfg: Config, corpus, bar, state: dict, loss_v: float, step: int, evaluation: bool, eval_windows: int) -> None:
    """The bar's text (training loss and last valid metric in the headline unit, with its
    windows), and one line per evaluation in a redirected log."""
    headline = HEADLINE[cfg.data.tokenizer]
    shown = estimate_text(state["valid_metrics"], headline)
    train_shown = f"{metrics_from_loss(loss_v, cfg.data.tokenizer, corpus.bytes_per_token.get('train'))[headline]:.3f}"
    windows = state["valid_metrics"].get("windows", eval_windows) if state["valid_metrics"] else eval_windows
    bar.set_postfix_str(f"train {train_shown}, valid {shown} ({windows} windows)")
    if evaluation:
        progress_line(True, f"retrain step {step}/{cfg.retrain.steps}: train {train_shown}, valid {shown} ({windows} windows)",
                      bar, step)


def finish_retrain(cfg: Config, corpus, genotype: Genotype, genotype_spec: str, out: Path, run: RetrainRun,
                   checkpointing: Checkpointing, log: Logger, diag: tuple, device, resumed: bool) -> RetrainResult:
    """The final evaluation of test (the last step's of valid is the final valid number), then
    ``metrics.json`` (rank 0, atomically). Returns the :class:`RetrainResult`."""
    rc, mc, state = cfg.retrain, cfg.model, run.state
    headline = HEADLINE[cfg.data.tokenizer]
    show = cfg.logging.progress and distributed.is_main()
    final = {"valid": state["valid_metrics"]}  # the last step's evaluation, on the final windows
    checkpointing.signals.when = "after the final evaluation of test (the last step's checkpoint is on disk; --resume redoes it)"
    distributed.print_main(f"final evaluation: {rc.final_eval_windows or 'all'} windows of valid (at the last step) and of test "
                           f"(retrain.final_eval_windows; the evaluations before the last step use retrain.eval_windows="
                           f"{rc.eval_windows}, an estimate)", file=sys.stderr)
    test = corpus.splits["test"]
    starts = eval_starts(len(test), mc.context, rc.final_eval_windows)
    final["test"] = measure(run.model, test, starts, mc.context, rc.batch_size, device, cfg.data.tokenizer,
                            corpus.bytes_per_token.get("test"), stderr=True, progress=f"final test ({len(starts)} windows)" if show else None)
    checkpointing.stop_if_signalled("during the final evaluation (--resume redoes it)")
    for split in ("valid", "test"):
        log.scalars({k: v for k, v in final[split].items() if k != "windows"}, rc.steps, f"final_{split}")
    wall = run.wall_time()
    diag_x, n_params = diag
    metrics = {
        "genotype": genotype_spec, "placements": genotype.describe(), "headline": headline,
        "valid": final["valid"], "test": final["test"], "steps": rc.steps, "seed": rc.seed,
        "parameters": n_params, "tokens_seen": rc.steps * rc.batch_size * mc.context,
        "wall_time_s": round(wall, 2), "history": state["history"], "created": utc_now(),
        "skipped_batches": state["skipped_batches"], "resumed_from_step": run.start if resumed else None,
        "data": {"corpus": corpus.name, "tokenizer": corpus.tokenizer, "fingerprint_sha256": corpus.fingerprint},
        "packages": environment(), "genotype_file": genotype.record(genotype_spec)[0],
        "diagnostics": {"batch_windows": int(diag_x.shape[0]), "init": state["diag_init"], "evaluations": state["diag_history"],
                        "loss_spikes": run.spikes.spikes, "spike_factor": rc.spike_factor},
    }
    path = write_json_atomic(out / METRICS_FILE, metrics) if distributed.is_main() else out / METRICS_FILE
    distributed.barrier()
    log.text("final", f"valid {headline} {final['valid'].get(headline):.4f}, test {final['test'].get(headline):.4f}")
    return RetrainResult(final["valid"], final["test"], path, wall, run.model)

