"""One trial of a ``search.py --tune`` study (docs/design.md §5): the outer loop's trials are
searches with suggested hyperparameters, scored by how good their *derived* genotype is.

A trial: suggest every ``tune.space`` entry, run :func:`autoln.oneshot.run_search.run_search` in
``trials/NNNN/search``, then (``tune.score: proxy_retrain``) a short retrain of the derived
genotype in ``trials/NNNN/proxy``; its final valid loss in the headline unit (bits per byte for
bytes) is the value minimised. The valid loss at every evaluation of the search (step ``s``)
and of the proxy (step ``search.steps + s``, the trial's own ``search.steps``) is reported to the
pruner. Pruning compares trials at equal steps, so a study with a pruner may not tune
``search.steps`` (:func:`autoln.config.space_values` refuses it; ``tune.pruner: none`` allows it).

Outcomes, kept in each trial's user attribute ``outcome``: ``complete``; ``pruned`` (by the
pruner); ``diverged`` (NaN/inf loss, ended as PRUNED with the reason); ``error`` (an exception,
FAIL with the reason; the study goes on); ``running`` on a FAIL trial means its worker died
(``lost``); it is re-run. ``tune.n_trials`` caps *finished* trials (complete, pruned, diverged,
error) across every worker; the cap is exact (see :func:`admitted`).

A removed state file: the journal (or a ``sqlite:///`` database file) removed or replaced while
the study runs stops the command with one line (:class:`autoln.core.errors.StateLost`, exit 2):
the study's record went with it, but every trial's folder stays. Re-running the command starts
the study anew, and a trial whose folder (``trials/NNNN``, from the lost study) holds a search
of its own settings reuses it when finished, or resumes it from its checkpoint, replaying the
valid losses it reported (``reports.json``) so that the pruner decides as before; one with
other settings is moved aside to ``trials/NNNN.earlier``. A removed ``tune.lock`` is
re-created (:meth:`autoln.core.locks.FolderLock.check`).
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from autoln.config import Config, assign, read_yaml
from autoln.core.errors import AutolnError
from autoln.core.io import read_json, write_json_atomic, write_text_atomic
from autoln.tune.storage import StorageFile, StorageGone, retry_callback
from autoln.tune.study import _headline, _optuna, counts_toward_cap

TRIALS_DIR = "trials"
#: A trial's valid losses as reported to the pruner (``{step: value}``), in its folder: a re-run
#: after a lost journal replays them for the search it reuses.
REPORTS_FILE = "reports.json"


class OverCap(Exception):
    """A trial was created after the study's cap was taken by other workers' trials."""


def admitted(study, number: int, cap: int) -> bool:
    """Whether trial ``number`` may run under a cap of ``cap`` finished trials.

    Optuna numbers trials atomically in creation order. A trial is admitted when fewer than
    ``cap`` trials with a smaller number are finished, running or waiting. Every trial that
    later finishes with a smaller number than the last admitted one existed (running or
    waiting) when that one was admitted, so at most ``cap`` trials finish; workers keep going
    until ``cap`` have, so exactly ``cap`` do. A refused trial ends FAIL as ``over-cap``.
    """
    from optuna.trial import TrialState

    ahead = 0
    for t in study.get_trials(deepcopy=False):
        if t.number < number and (t.state in (TrialState.RUNNING, TrialState.WAITING) or counts_toward_cap(t)):
            ahead += 1
    return ahead < cap


# --- one trial --------------------------------------------------------------------------------


def suggest(trial, key: str, spec: dict) -> Any:
    """Ask ``trial`` for the value of ``key`` from its ``tune.space`` entry ``spec``."""
    if "log-uniform" in spec:
        low, high = spec["log-uniform"]
        return trial.suggest_float(key, low, high, log=True)
    if "uniform" in spec:
        low, high = spec["uniform"]
        return trial.suggest_float(key, low, high, step=spec.get("step"))
    if "int" in spec:
        low, high = spec["int"]
        return trial.suggest_int(key, low, high, step=spec.get("step", 1))
    return trial.suggest_categorical(key, spec["categorical"])


def trial_config(cfg: Config, params: dict[str, Any]) -> Config:
    """``cfg`` with a trial's parameters set and the trial's logging (no progress bar).

    Raises:
        ConfigError: the combination is invalid (e.g. a value out of range for this config).
    """
    import copy

    tcfg = copy.deepcopy(cfg)
    for key, value in params.items():
        assign(tcfg, key, value, f"trial parameter {key}")
    tcfg.logging.progress = False
    tcfg.validate_sections()
    return tcfg


def write_hparams(trial_dir: Path, params: dict[str, Any], metrics: dict[str, float]) -> None:
    """The trial's hyperparameters and final metrics for TensorBoard's HParams view (one run
    per trial, in ``trial_dir``)."""
    from autoln.core.tb import Logger

    clean = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
    metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    with Logger(trial_dir) as log:
        log.hparams(clean, metrics)  # the trial's own run: a full disk names its event file


class Objective:
    """The value a trial minimises (see the module docstring); records the outcome, reason,
    genotype and metrics in the trial's user attributes.

    Args:
        cfg: the study's resolved config.
        out: the study folder; the trial writes ``trials/NNNN``.
        worker: this worker's id (``host:pid:rank``), recorded on each trial.
        storage_file: the study's :class:`StorageFile` (``study.autoln_file``), checked when a
            trial ends; None: not checked.
    """

    def __init__(self, cfg: Config, out: Path, worker: str, storage_file: Optional[StorageFile] = None) -> None:
        self.cfg, self.out, self.worker = cfg, out, worker
        self.headline = _headline(cfg)
        self.file = storage_file or StorageFile(None, "storage")

    def __call__(self, trial) -> float:
        """Run the trial (:meth:`run`). An exception it ends with while the study's file is gone
        (a storage error that the removal caused) becomes :class:`StorageGone`, which Optuna
        passes on; the file is checked once more before Optuna writes the value."""
        try:
            value = self.run(trial)
        except StorageGone:
            raise
        except BaseException:
            self.file.check()
            raise
        self.file.check()
        return value

    def run(self, trial) -> float:
        """The trial itself: suggest, search (:meth:`search`), proxy retrain, score."""
        optuna = _optuna()
        from autoln.retrain.run_retrain import run_retrain
        from autoln.core.errors import DivergenceError

        started = time.perf_counter()
        for key in ("genotype", "placements", "reason", "supernet_valid", "wall_time_s"):  # a re-run copies the lost trial's
            trial.set_user_attr(key, None)
        trial.set_user_attr("outcome", "running")
        trial.set_user_attr("worker", self.worker)
        if not admitted(trial.study, trial.number, self.cfg.tune.n_trials):
            trial.set_user_attr("outcome", "over-cap")
            print(f"[tune] trial {trial.number} not run: other workers' trials took the last of the "
                  f"{self.cfg.tune.n_trials} slots", file=sys.stderr, flush=True)
            raise OverCap(f"trial {trial.number}: the cap of {self.cfg.tune.n_trials} finished trials is taken")
        params = {key: suggest(trial, key, spec) for key, spec in self.cfg.tune.space.items()}
        tdir = self.out / TRIALS_DIR / f"{trial.number:04d}"
        earlier = tdir.is_dir()  # a trial's folder is its own: one found now is a lost study's (its journal went)
        tdir.mkdir(parents=True, exist_ok=True)
        trial.set_user_attr("trial_dir", str(tdir))
        metrics: dict[str, float] = {}
        line = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        print(f"[tune] trial {trial.number} ({self.worker}) starts: {line}", file=sys.stderr, flush=True)
        reports: dict[int, float] = {}

        def report(offset: int):
            def hook(step: int, valid: dict) -> None:
                reports[offset + step] = valid[self.headline]  # before the storage: kept if that fails
                write_json_atomic(tdir / REPORTS_FILE, {str(k): v for k, v in sorted(reports.items())})  # NaN as null
                self.file.check()  # a SQLite file's removal shows only at a write, as an error of the trial's
                trial.report(valid[self.headline], offset + step)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {offset + step}: valid {self.headline} {valid[self.headline]:.4f}")
            return hook

        def finish(state: str, reason: str = "") -> None:
            trial.set_user_attr("outcome", state)
            trial.set_user_attr("wall_time_s", round(time.perf_counter() - started, 1))
            if reason and state != "complete":
                trial.set_user_attr("reason", reason[:2000])
            if self.cfg.logging.tensorboard:
                write_hparams(tdir, params, {f"hparams/{k}": v for k, v in metrics.items()})
            print(f"[tune] trial {trial.number} {state}" + (f": {reason}" if reason else "") +
                  f" ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

        try:
            cfg = trial_config(self.cfg, params)
            result = self.search(trial.number, cfg, tdir, report(0), earlier)
            trial.set_user_attr("genotype", result.genotype.to_dict())
            trial.set_user_attr("placements", result.genotype.describe())
            skipped = {"search": result.genotype.provenance["metrics"].get("skipped_batches", 0),
                       "selection": result.genotype.provenance.get("selection", {}).get("skipped_batches", 0)}
            metrics["supernet_valid"] = result.valid[self.headline]
            trial.set_user_attr("supernet_valid", metrics["supernet_valid"])
            score = metrics["supernet_valid"]
            if self.cfg.tune.score == "proxy_retrain":
                proxy = trial_config(cfg, {"retrain.steps": self.cfg.tune.proxy_steps,
                                           "retrain.eval_every": min(cfg.retrain.eval_every, self.cfg.tune.proxy_steps),
                                           "retrain.warmup_steps": min(cfg.retrain.warmup_steps, self.cfg.tune.proxy_steps - 1)})
                # the proxy's evaluations follow the trial's own search (its search.steps, which the
                # study config's need not be), so no step is reported twice
                retrained = run_retrain(proxy, str(result.path), tdir / "proxy", overwrite=True, on_eval=report(cfg.search.steps))
                metrics["proxy_valid"] = retrained.valid[self.headline]
                score = metrics["proxy_valid"]
                skipped["proxy_retrain"] = (read_json(retrained.path) or {}).get("skipped_batches", 0)
            record_skipped(trial, skipped)
            if not math.isfinite(score):
                raise DivergenceError(f"the score is {score}")
            metrics["score"] = score
            trial.set_user_attr("score_metric", f"valid {self.headline}")
            finish("complete", f"{self.headline} {score:.4f}, genotype {result.genotype.describe()}")
            return score
        except optuna.TrialPruned as exc:
            finish("pruned", str(exc))
            raise
        except DivergenceError as exc:
            finish("diverged", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        except KeyboardInterrupt:  # queue a re-run now, so re-running the command redoes this trial
            trial.set_user_attr("outcome", "interrupted")
            retry_callback(self.cfg)(trial.study, trial.study.get_trials(deepcopy=False)[trial.number])
            raise
        except Exception as exc:
            tdir.mkdir(parents=True, exist_ok=True)  # the trial's folder may be what was removed
            write_text_atomic(tdir / "error.txt", traceback.format_exc())
            finish("error", f"{type(exc).__name__}: {exc} (traceback in {tdir / 'error.txt'})")
            raise

    def search(self, number: int, cfg: Config, tdir: Path, hook, earlier: bool):
        """The trial's search in ``tdir/search``: a new one, or, when ``earlier`` (the folder was
        there before the trial: a lost study's, see the module docstring), the search it holds
        (:func:`earlier_search`): a finished one is reused, one with a checkpoint resumed, each
        after replaying the valid losses it reported (``reports.json``) through ``hook``; one
        made with other settings is moved aside (:func:`set_aside`). Returns the
        :class:`autoln.oneshot.run_search.SearchResult` (``model`` None when reused).

        Raises:
            optuna.TrialPruned: the pruner stops the trial at a replayed step.
        """
        from autoln.models.genotype import Genotype
        from autoln.oneshot.run_search import GENOTYPE_FILE, SearchResult, run_search

        folder = tdir / "search"
        held = earlier_search(folder, cfg) if earlier else None
        if held == "other":
            aside = set_aside(tdir)
            print(f"[tune] trial {number}: {tdir} held a trial of another study with other settings; moved it to {aside}",
                  file=sys.stderr, flush=True)
            held = None
        if held is None:
            (tdir / REPORTS_FILE).unlink(missing_ok=True)  # an earlier trial's, if any: not this search's
            return run_search(cfg, folder, overwrite=True, on_eval=hook)
        recorded = read_json(tdir / REPORTS_FILE)
        recorded = recorded if isinstance(recorded, dict) else {}
        try:
            replay = sorted((int(k), math.nan if v is None else float(v)) for k, v in recorded.items() if int(k) <= cfg.search.steps)
        except (TypeError, ValueError):
            replay = []
        if held == "finished":
            genotype = Genotype.load(folder / GENOTYPE_FILE)
            measured = genotype.provenance["metrics"]
            print(f"[tune] trial {number}: reusing {folder / GENOTYPE_FILE}, a finished search of this trial's settings "
                  "from the study this folder held before", file=sys.stderr, flush=True)
            for step, value in replay or [(measured["steps"], measured["supernet_valid"][self.headline])]:
                hook(step, {self.headline: value})
            return SearchResult(genotype, folder / GENOTYPE_FILE, measured["supernet_valid"], measured["wall_time_s"], None)
        print(f"[tune] trial {number}: resuming {folder} from its checkpoint, a search of this trial's settings from the "
              "study this folder held before", file=sys.stderr, flush=True)
        for step, value in replay:
            hook(step, {self.headline: value})
        return run_search(cfg, folder, on_eval=hook, resume=True)


def record_skipped(trial, skipped: dict[str, int]) -> None:
    """Keep on the trial the updates ``on_divergence: skip_batch`` skipped (user attribute
    ``skipped_batches``: by part of the trial, ``search``, ``selection``, ``proxy_retrain``),
    with one warning line when there were any: a score made over skipped updates is weaker."""
    trial.set_user_attr("skipped_batches", skipped)
    if any(skipped.values()):
        parts = ", ".join(f"{n} in the {k.replace('_', ' ')}" for k, n in skipped.items() if n)
        print(f"[tune] trial {trial.number}: warning: updates skipped (NaN/inf loss or gradient, on_divergence=skip_batch): "
              f"{parts}", file=sys.stderr, flush=True)


def earlier_search(folder: Path, cfg: Config) -> Optional[str]:
    """What the search folder ``folder`` of a trial holds from before the trial (a lost study's):
    ``"finished"`` (a genotype searched with ``cfg``'s data, model and search sections,
    :func:`autoln.oneshot.consensus.check_same_search`), ``"checkpoint"`` (a checkpoint of a search whose
    ``config.yaml`` ``--resume`` accepts with ``cfg``, :func:`autoln.engine.checkpoint.resume_differences`),
    ``"other"`` (either, made otherwise, or unreadable) or None (neither: nothing to keep)."""
    import torch

    from autoln.engine.checkpoint import moved_corpus, resume_differences
    from autoln.config import with_defaults
    from autoln.oneshot.consensus import check_same_search
    from autoln.oneshot.run_search import GENOTYPE_FILE
    from autoln.engine.training import CHECKPOINT_FILE

    if (folder / GENOTYPE_FILE).exists():
        try:
            check_same_search(folder, cfg)
        except AutolnError:  # other settings, or a genotype file that does not read
            return "other"
        return "finished"
    if (folder / CHECKPOINT_FILE).exists():
        try:
            saved = read_yaml((folder / "config.yaml").read_text(encoding="utf-8"))
            diffs = resume_differences(with_defaults(saved), cfg.to_dict(), "search")[0] if isinstance(saved, dict) else ["?"]
            if any(d.startswith("data.corpus ") for d in diffs):  # a corpus that moved with its bytes is the same
                ckpt = torch.load(folder / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
                diffs = moved_corpus(diffs, ckpt.get("data_fingerprint"), cfg)[0]
            same = not diffs
        except Exception:  # noqa: BLE001 - unreadable config or checkpoint (yaml, torch, a bad corpus): not reusable
            same = False
        return "checkpoint" if same else "other"
    return None


def set_aside(tdir: Path) -> Path:
    """Rename the trial folder ``tdir`` to the first free ``NNNN.earlier``, ``NNNN.earlier2``, ...
    beside it (nothing of another study is deleted), and create ``tdir`` anew. Returns the new name."""
    aside, k = tdir.with_name(f"{tdir.name}.earlier"), 1
    while aside.exists():
        k += 1
        aside = tdir.with_name(f"{tdir.name}.earlier{k}")
    tdir.rename(aside)
    tdir.mkdir()
    return aside


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
