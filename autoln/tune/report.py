"""The report of a tuning study: trials table (CSV and Markdown), every finished trial's
genotype, ``best_genotype.json`` and Optuna's plots as PNG (matplotlib).

Everything is rebuilt from the study's storage, so any machine of a multi-machine study can
write it, and re-running the command refreshes it. Files (under the study folder):

- ``trials.csv``, ``trials.md``: one row per trial: number, state, outcome, score, genotype,
  parameters, supernet valid, wall time, worker, the trial it re-runs, the reason;
- ``genotypes/NNNN.json``: the genotype of each trial whose search finished;
- ``best_genotype.json``: the best complete trial's genotype, with the trial's number, score
  and parameters added to its provenance under ``tune``;
- ``plots/optimization_history.png``, ``plots/param_importances.png``,
  ``plots/intermediate_values.png`` (each skipped, with the reason in ``trials.md``, when the
  study cannot give it yet, e.g. importances before two complete trials).
"""

from __future__ import annotations

import csv
import io
import warnings
from pathlib import Path
from typing import Any

from autoln.config import Config
from autoln.models.genotype import Genotype
from autoln.core.io import save_figure_atomic, write_text_atomic
from autoln.tune.study import _headline, _optuna, best_trial, census, outcome

BEST_FILE = "best_genotype.json"
PLOTS = ("optimization_history", "param_importances", "intermediate_values")


def trial_rows(study, cfg: Config) -> list[dict[str, Any]]:
    """One dict per trial, in trial-number order (the table's rows)."""
    from optuna.trial import TrialState

    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {
            "number": t.number, "state": t.state.name, "outcome": outcome(t),
            "score": round(t.value, 5) if t.state == TrialState.COMPLETE else None,  # a pruned trial's value is its last report
            "genotype": t.user_attrs.get("placements") or "",
        }
        for key in cfg.tune.space:
            value = t.params.get(key)
            row[key] = round(value, 6) if isinstance(value, float) else value
        sv = t.user_attrs.get("supernet_valid")
        row["supernet_valid"] = round(sv, 5) if isinstance(sv, float) else None
        row["wall_time_s"] = t.user_attrs.get("wall_time_s")
        row["worker"] = t.user_attrs.get("worker") or ""
        history = t.system_attrs.get("retry_history") or [None]
        row["retry_of"] = history[-1]
        row["reason"] = t.user_attrs.get("reason") or ""
        rows.append(row)
    return rows


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    return buf.getvalue()


def _markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return ""
        return (f"{v:.4g}" if isinstance(v, float) else str(v)).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "\n".join("| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows) + "\n"


def write_report(study, cfg: Config, out: Path) -> list[Path]:
    """Write the report files listed in the module docstring; returns their paths.

    Raises:
        OSError: the folder is not writable (files already written stay whole).
    """
    rows = trial_rows(study, cfg)
    files = [write_text_atomic(out / "trials.csv", _csv(rows))]
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("genotype"):
            files.append(Genotype.from_dict(t.user_attrs["genotype"], f"trial {t.number}").save(out / "genotypes" / f"{t.number:04d}.json"))
    best = best_trial(study)
    if best is not None:
        genotype = Genotype.from_dict(best.user_attrs["genotype"], f"trial {best.number}")
        genotype.provenance["tune"] = {"study": cfg.tune.study_name, "trial": best.number, "score": best.value,
                                       "metric": f"valid {_headline(cfg)} ({cfg.tune.score})", "params": best.params,
                                       "finished_trials": census(study).finished}
        files.append(genotype.save(out / BEST_FILE))
    notes = _plots(study, out, files)
    c = census(study)
    columns = ["number", "state", "outcome", "score", "genotype", *cfg.tune.space, "supernet_valid", "wall_time_s", "retry_of", "reason"]
    text = (f"# Study `{cfg.tune.study_name}`\n\n"
            f"Score: valid {_headline(cfg)} of the {'derived model after a ' + str(cfg.tune.proxy_steps) + '-step proxy retrain' if cfg.tune.score == 'proxy_retrain' else 'supernet'} (lower is better). "
            f"Finished {c.finished} of {cfg.tune.n_trials}; running {c.running}; waiting {c.waiting}; lost {c.lost}.\n\n")
    if best is not None:
        text += f"Best: trial {best.number}, score {best.value:.4f}, genotype `{best.user_attrs.get('placements')}` -> `{BEST_FILE}`\n\n"
    else:
        text += "No trial has completed yet: no best genotype.\n\n"
    text += _markdown(rows, columns)
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    files.insert(1, write_text_atomic(out / "trials.md", text))
    return files


def _plots(study, out: Path, files: list[Path]) -> list[str]:
    """Optuna's matplotlib plots as PNG; returns a note for each plot it could not draw."""
    _optuna()  # quiet Optuna's experimental-feature warnings
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    notes = []
    for name in PLOTS:
        if name == "intermediate_values" and not any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
            notes.append(f"plots/{name}.png not drawn: no trial reported a valid loss at an evaluation yet")
            continue  # (Optuna would log a warning about its pruning feature and draw an empty plot)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = getattr(ovm, f"plot_{name}")(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            files.append(save_figure_atomic(fig, out / "plots" / f"{name}.png"))
            plt.close(fig)
        except Exception as exc:  # a plot is a view; the study's data is in the tables
            notes.append(f"plots/{name}.png not drawn: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            plt.close("all")
    return notes
