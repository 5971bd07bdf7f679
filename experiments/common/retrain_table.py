"""The table of every measured retrain, kept in the repository (``experiments/retrains.csv``).

One row per retrain: ``setting`` (``experiments/common/validate.py``'s), ``space`` (the searched
candidates joined by ``+``, e.g. ``pre+post+deepnorm``), ``genotype`` (per-block placements,
space-separated), ``seed``, ``steps``, ``windows`` (valid and test windows of its final
evaluation), ``valid`` and ``test`` (bits per byte), ``wall_time_s`` (first step to final
evaluation), ``config`` (:func:`config_id`: the data's content and every model and retrain
setting but the seed and the genotype's own, so rows of another corpus or size never stand
for each other) and ``commit`` (the code that trained it). A row stands for a finished run folder:
the experiment scripts extend the table with what they train (:func:`record_runs`) and rebuild
the run folders it holds before they train (:func:`restore_runs`), so no retrain is paid for
twice, across sessions whose run folders are gone. A new supernet, read-off or strategy is then
scored against the whole table (e.g. :func:`kendall_tau_of_seeds`, :func:`simulate_random_search`).

    python experiments/common/retrain_table.py record --out runs/validate --commit SHA [--table FILE]
    python experiments/common/retrain_table.py summary [--table FILE]
    python experiments/common/retrain_table.py simulate --setting shallow --space SPACE --budget-s S [--runs 500]
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.halving import best_of_last_rung, successive_halving  # noqa: E402

#: The table beside the experiment scripts (the tests point ``AUTOLN_RETRAIN_TABLE`` elsewhere).
TABLE = Path(__file__).resolve().parents[1] / "retrains.csv"


def default_table() -> Path:
    """``$AUTOLN_RETRAIN_TABLE`` when set, else :data:`TABLE`."""
    import os

    return Path(os.environ.get("AUTOLN_RETRAIN_TABLE") or TABLE)


def compare_with_table(cfg, setting: str, specs: list[str], baselines: list[str], seeds: int, compare: Path,
                       table: Optional[Path], **kwargs):
    """:func:`autoln.retrain.compare.run_compare` that reads and extends the retrain table ``table``
    (none: as ``run_compare``): the table's retrains are restored into ``compare`` first
    (:func:`restore_runs`, so they are not trained again), and every finished retrain in it is
    recorded after, even when the comparison ends by an exception (:func:`record_runs`).
    Returns ``run_compare``'s entries."""
    from autoln.retrain.compare import run_compare

    if table is not None:
        restore_runs(read_table(table), setting, cfg, compare)
    try:
        return run_compare(cfg, specs, baselines, seeds, compare, **kwargs)
    finally:
        if table is not None and Path(compare).is_dir():
            record_runs(compare, setting, space_of(cfg), current_commit(), table)
SETTINGS = ("shallow", "deep", "highlr")


class TableError(ValueError):
    """A damaged table: the message names the file, the line and what was expected."""


@dataclass(frozen=True)
class Row:
    """One measured retrain (see the module docstring for the fields; bits per byte)."""

    setting: str
    space: str
    genotype: str
    seed: int
    steps: int
    windows: int
    valid: float
    test: float
    wall_time_s: float
    config: str
    commit: str

    @property
    def key(self) -> tuple:
        """What makes two rows the same retrain: setting, space, genotype, seed, steps, windows, config."""
        return (self.setting, self.space, self.genotype, self.seed, self.steps, self.windows, self.config)


FIELDS = [f.name for f in fields(Row)]


def parse_row(record: dict, where: str) -> Row:
    """A :class:`Row` from one CSV record.

    Raises:
        TableError: a missing or extra field, a number that does not parse, an unknown setting,
            an empty genotype or space, a genotype whose placements are not in its space."""
    if None in record or set(record) != set(FIELDS) or any(v is None for v in record.values()):
        raise TableError(f"{where}: expected the {len(FIELDS)} fields {','.join(FIELDS)}")
    try:
        row = Row(record["setting"], record["space"], record["genotype"], int(record["seed"]), int(record["steps"]),
                  int(record["windows"]), float(record["valid"]), float(record["test"]), float(record["wall_time_s"]),
                  record["config"], record["commit"])
    except ValueError as exc:
        raise TableError(f"{where}: a field does not parse ({exc})") from None
    if row.setting not in SETTINGS:
        raise TableError(f"{where}: setting {row.setting!r} is not one of {list(SETTINGS)}")
    space = row.space.split("+")
    if not row.genotype or not all(p in space for p in row.genotype.split()):
        raise TableError(f"{where}: genotype {row.genotype!r} is not a list of placements of the space {row.space!r}")
    if row.steps < 1 or row.windows < 1 or not row.wall_time_s >= 0 or not (math.isfinite(row.valid) and math.isfinite(row.test)):
        raise TableError(f"{where}: steps and windows must be positive, wall_time_s not negative, valid and test finite")
    if len(row.config) != 12 or any(c not in "0123456789abcdef" for c in row.config):
        raise TableError(f"{where}: config {row.config!r} is not a 12-digit hex id (config_id)")
    return row


def read_table(path: Path = TABLE) -> list[Row]:
    """Every row of the table at ``path`` (none when it does not exist yet).

    Raises:
        TableError: a damaged row or header, in one line naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TableError(f"{path}: cannot be read ({exc})") from None
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames != FIELDS:
        raise TableError(f"{path}:1: expected the header {','.join(FIELDS)}, got {','.join(reader.fieldnames or [])}")
    return [parse_row(record, f"{path}:{reader.line_num}") for record in reader]


def write_table(rows: Iterable[Row], path: Path = TABLE) -> Path:
    """Write ``rows`` (sorted by setting, space, steps, genotype, seed) atomically: a temporary
    file, then ``os.replace``, so an interrupted write leaves the old table whole."""
    from autoln.core.io import write_text_atomic

    buf = io.StringIO()
    writer = csv.DictWriter(buf, FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in sorted(rows, key=lambda r: (SETTINGS.index(r.setting), r.space, r.steps, r.genotype, r.seed, r.windows)):
        # valid and test as Python's shortest round-trip text: a restored run reads back the very float measured
        writer.writerow({**asdict(row), "valid": repr(row.valid), "test": repr(row.test), "wall_time_s": f"{row.wall_time_s:.1f}"})
    return write_text_atomic(Path(path), buf.getvalue())


def append_rows(new: Iterable[Row], path: Path = TABLE) -> int:
    """Add the rows of ``new`` whose retrain (:attr:`Row.key`) the table does not hold yet;
    a row it holds is kept as it is (the first measurement stays). Returns how many were added.

    Several experiment processes append to one table: the read and the write happen under an
    exclusive lock on ``<table>.lock`` (:func:`autoln.core.locks.build_lock`), so no process writes
    back a table that lacks another's new rows.

    Raises:
        TableError: the existing table is damaged (nothing is written then)."""
    from autoln.core.locks import build_lock

    new = list(new)
    with build_lock(Path(path).with_name(Path(path).name + ".lock")):
        rows = read_table(path)
        known = {r.key for r in rows}
        added = []
        for row in new:
            if row.key not in known:
                known.add(row.key)
                added.append(row)
        if added:
            write_table([*rows, *added], path)
    return len(added)


def lookup(rows: Iterable[Row], setting: str, space: str, genotype: str, seed: int, steps: int,
           windows: Optional[int] = None) -> Optional[Row]:
    """The row of that retrain (any ``windows`` when None), or None."""
    for r in rows:
        if (r.setting, r.space, r.genotype, r.seed, r.steps) == (setting, space, genotype, seed, steps) and (
                windows is None or r.windows == windows):
            return r
    return None


def config_id(config: dict, fingerprint: str) -> str:
    """12 hex digits of the SHA-256 of what a retrain's number depends on besides its genotype
    and seed: the corpus's content (``fingerprint``, :attr:`autoln.data.Corpus.fingerprint`; not
    its path, which differs between machines) and its tokenizer, the ``model`` section but the
    genotype's own keys (``candidates``, ``granularity``, ``affine``, ``qk_norm``: the QK-norm a
    retrain builds is its genotype's, whose text says it), the ``retrain`` section but ``seed``
    and ``device``. ``config``: a config as a dict (:meth:`autoln.config.Config.to_dict`). A key
    added to the config later at its default (``qk_norm``) leaves the rows written before it
    valid: their ids are unchanged."""
    import hashlib
    import json

    model = {k: v for k, v in config["model"].items() if k not in ("candidates", "granularity", "affine", "qk_norm")}
    retrain = {k: v for k, v in config["retrain"].items() if k not in ("seed", "device")}
    key = {"data": [fingerprint, config["data"].get("tokenizer")], "model": model, "retrain": retrain}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_config_id(folder: Path, fingerprint: str) -> Optional[str]:
    """:func:`config_id` of the run in ``folder`` (its ``config.yaml``), or None when unreadable."""
    import yaml

    from autoln.config import read_yaml, with_defaults

    try:
        return config_id(with_defaults(read_yaml((Path(folder) / "config.yaml").read_text(encoding="utf-8")) or {}), fingerprint)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError, KeyError):
        return None


def row_from_run(folder: Path, setting: str, space: str, commit: str) -> Optional[Row]:
    """The row of the finished retrain in ``folder`` (its ``metrics.json``, bits per byte, and
    ``config.yaml``), or None when it is not finished, diverged, or restored from the table."""
    from autoln.retrain.run_retrain import read_metrics

    m = read_metrics(Path(folder) / "metrics.json")
    if m is None or "restored_from" in m:
        return None
    cid = run_config_id(folder, (m.get("data") or {}).get("fingerprint_sha256", ""))
    if cid is None:
        return None
    h = m.get("headline", "bits_per_byte")
    valid, test = m["valid"].get(h), m["test"].get(h)
    if valid is None or test is None or not (math.isfinite(valid) and math.isfinite(test)):
        return None
    return Row(setting, space, m["placements"], int(m["seed"]), int(m["steps"]), int(m["valid"].get("windows", 0)) or 1,
               float(valid), float(test), float(m.get("wall_time_s", 0.0)), cid, commit)


def current_commit() -> str:
    """The repository's ``HEAD`` (12 hex digits), with ``+`` when tracked files differ from it;
    ``unknown`` outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+" if dirty else "")) if head else "unknown"


def record_runs(out: Path, setting: str, space: str, commit: str, path: Path = TABLE) -> int:
    """Add every finished retrain under ``out`` (any depth: compare folders, random search's
    rungs, loose retrains) to the table. Returns how many rows were new."""
    rows = [row_from_run(m.parent, setting, space, commit) for m in sorted(Path(out).rglob("metrics.json"))]
    return append_rows([r for r in rows if r is not None], path)


def space_of(cfg) -> str:
    """The ``space`` of a config: its searched candidates joined by ``+``."""
    return "+".join(cfg.model.searched_candidates())


def restore_runs(rows: Iterable[Row], setting: str, cfg, compare: Path, windows: Optional[int] = None) -> int:
    """Rebuild, in the comparison folder ``compare`` (:func:`autoln.retrain.compare.run_compare`'s
    layout), a finished run folder for each table row of ``setting`` in ``cfg``'s space at
    ``cfg.retrain.steps`` (and ``windows``, default ``cfg.retrain.final_eval_windows``) that has
    none: ``table-<placements>/seed<i>`` (found by placements for any genotype file), and
    ``<baseline>/seed<i>`` for each named baseline with those placements. Each holds the
    ``config.yaml`` that retrain would have written and a ``metrics.json`` with the row's
    numbers (``restored_from`` says so), so ``run_compare`` reuses it instead of retraining.
    A folder that already holds a run is left alone. Returns how many were written."""
    import dataclasses

    from autoln.data import HEADLINE, load_corpus
    from autoln.models.genotype import BASELINES, baseline, from_probabilities
    from autoln.core.io import write_json_atomic, write_text_atomic

    rc = cfg.retrain
    if HEADLINE[cfg.data.tokenizer] != "bits_per_byte":
        return 0
    windows = windows or rc.final_eval_windows
    space, cands = space_of(cfg), cfg.model.searched_candidates()
    corpus = load_corpus(cfg.data)
    vocab, cid = corpus.vocab_size, config_id(cfg.to_dict(), corpus.fingerprint)
    named = {baseline(b, cfg.model, vocab).describe(): b for b in BASELINES}
    written = 0
    for r in rows:
        if (r.setting, r.space, r.steps, r.windows, r.config) != (setting, space, rc.steps, windows, cid) or r.seed < rc.seed:
            continue
        idx = [cands.index(p) for p in r.genotype.split()]
        if len(idx) != cfg.model.n_layers:
            continue
        genotype = from_probabilities(np.eye(len(cands))[idx], cfg.model, vocab, {}, idx)
        seeded = dataclasses.replace(cfg, model=genotype.model_config(cfg.model), retrain=dataclasses.replace(rc, seed=r.seed))
        labels = ["table-" + r.genotype.replace(" ", "-")] + ([named[r.genotype]] if r.genotype in named else [])
        for label in labels:
            folder = Path(compare) / label / f"seed{r.seed - rc.seed}"
            if (folder / "metrics.json").exists() or (folder / "checkpoint.pt").exists():
                continue
            if label in BASELINES:  # the baseline's own record, as retrain.py writes it for that name
                seeded = dataclasses.replace(seeded, model=baseline(label, cfg.model, vocab).model_config(cfg.model))
            valid = {"bits_per_byte": r.valid, "windows": r.windows}
            write_text_atomic(folder / "config.yaml", seeded.to_yaml())
            write_json_atomic(folder / "metrics.json", {
                "genotype": label, "placements": r.genotype, "headline": "bits_per_byte", "valid": valid,
                "test": {"bits_per_byte": r.test, "windows": r.windows}, "steps": r.steps, "seed": r.seed,
                "wall_time_s": r.wall_time_s, "history": [{"step": r.steps, **valid}],
                "data": {"corpus": corpus.name, "tokenizer": corpus.tokenizer, "fingerprint_sha256": corpus.fingerprint},
                "restored_from": f"experiments/retrains.csv (commit {r.commit})"})
            written += 1
    return written


def kendall_tau_of_seeds(rows: Iterable[Row], setting: str, space: str, steps: int, seeds: tuple[int, int] = (0, 1)) -> tuple[Optional[float], int]:
    """The table's own noise ceiling: Kendall's tau between the valid values of two retrain
    seeds over the genotypes measured at both (same setting, space and steps). Returns
    ``(tau, number of genotypes)``; tau is None below two genotypes."""
    from scipy.stats import kendalltau

    by = {}
    for r in rows:
        if (r.setting, r.space, r.steps) == (setting, space, steps) and r.seed in seeds:
            by.setdefault(r.genotype, {})[r.seed] = r.valid
    both = [g for g, v in by.items() if len(v) == 2]
    if len(both) < 2:
        return None, len(both)
    return float(kendalltau([by[g][seeds[0]] for g in both], [by[g][seeds[1]] for g in both]).statistic), len(both)


def random_sample(have: set, candidates: list[str], n_layers: int, seed: int) -> list[str]:
    """The longest prefix of :func:`autoln.oneshot.fidelity.sample_genotypes`' stream (``seed``; one
    placement per block, ``n_layers`` blocks) whose genotypes (placements strings) are all in
    ``have``: the random sample the table measured, never a searched genotype that happens to
    have the same rows (``experiments/truth/ground_truth.py`` draws seed 0, ``random_search.py`` 1)."""
    from autoln.oneshot.fidelity import sample_genotypes

    sample = []
    for g in sample_genotypes(min(len(candidates) ** n_layers, len(have) + 1), n_layers, candidates, seed):
        if " ".join(g) not in have:
            break
        sample.append(" ".join(g))
    return sample


def simulate_random_search(rows: Iterable[Row], setting: str, space: str, budget_s: float, rungs: list[int], eta: int,
                           full_steps: int, runs: int = 500, seed: int = 0, genotypes: Optional[Iterable[str]] = None) -> list[dict]:
    """Random search by successive halving (:func:`halving.successive_halving`, the rule
    ``experiments/race/random_search.py`` runs), replayed ``runs`` times from the table as
    NAS-Bench-201 evaluates black-box methods: each run draws the genotypes measured at every
    rung and at ``full_steps`` (seed 0) in a random order (its own generator,
    ``default_rng([seed, run])``), pays each short retrain's recorded wall time and valid, and
    answers the best of its last rung. ``genotypes`` (placements strings): the random sample to
    draw from, e.g. ``ground_truth.py``'s; None draws every genotype measured so, which takes in
    the searched races' own genotypes once the table holds them at the same rungs. Returns per run ``{"genotype", "valid"`` (its seed-0
    retrain at ``full_steps``)``, "evaluated", "spent_s"}``.

    Raises:
        TableError: no genotype is measured at every rung and at the full budget."""
    rows = [r for r in rows if (r.setting, r.space) == (setting, space)]
    short = {(r.genotype, r.steps): r for r in rows if r.seed == 0 and r.steps in rungs}
    full = {r.genotype: r for r in rows if r.seed == 0 and r.steps == full_steps}
    allowed = None if genotypes is None else set(genotypes)
    pool = sorted(g for g in full if all((g, s) in short for s in rungs) and (allowed is None or g in allowed))
    if not pool:
        raise TableError(f"the table holds no genotype of {setting}/{space} retrained at every rung {rungs} and at "
                         f"{full_steps} steps (seed 0): record random search's short retrains first")
    out = []
    for run in range(runs):
        order = [int(i) for i in np.random.default_rng([seed, run]).permutation(len(pool))]

        def evaluate(i: int, k: int) -> tuple[float, float]:
            r = short[(pool[i], rungs[k])]
            return r.valid, r.wall_time_s

        history = successive_halving(order, budget_s, rungs, eta, evaluate)
        best = best_of_last_rung(history)
        out.append({"genotype": pool[best["index"]], "valid": full[pool[best["index"]]].valid,
                    "evaluated": sum(len(h) for h in history), "spent_s": sum(r["wall_time_s"] for h in history for r in h)})
    return out


def rank_agreement(scores: dict[str, float], truth: dict[str, float], top: float = 0.1) -> dict:
    """How well a predictor's ``scores`` (genotype -> lower is better, e.g. a supernet's one-hot
    loss) rank the genotypes of ``truth`` (genotype -> seed-0 retrained valid, e.g. the table's
    sample): Kendall's tau over the genotypes in both, and how many of truth's best
    ``ceil(top * n)`` are among the predictor's best ``ceil(top * n)`` (issue 34: "how many of the
    sample's top 10 % it ranks in its own top 10 %"). Returns ``{"tau", "hits", "of", "n"}``.

    Raises:
        TableError: fewer than two genotypes in both."""
    from scipy.stats import kendalltau

    both = sorted(set(scores) & set(truth))
    if len(both) < 2:
        raise TableError(f"rank agreement needs two genotypes scored and measured, got {len(both)}")
    k = max(1, math.ceil(top * len(both)))
    best_true = set(sorted(both, key=truth.get)[:k])
    best_pred = set(sorted(both, key=scores.get)[:k])
    tau = float(kendalltau([scores[g] for g in both], [truth[g] for g in both]).statistic)
    return {"tau": tau, "hits": len(best_true & best_pred), "of": k, "n": len(both)}


def win_share(search_values: list[float], random_values: list[float]) -> float:
    """The share of pairs (search seed, random-search run) in which the search's answer retrains
    lower than random search's (ties count half): the issue's "beats random search in at least
    80 % of the pairs"."""
    wins = sum((s < r) + 0.5 * (s == r) for s in search_values for r in random_values)
    return wins / (len(search_values) * len(random_values))


def summary(rows: list[Row]) -> str:
    """Markdown: per setting, space and steps the number of rows and genotypes, and the seed
    noise ceiling (Kendall's tau between seeds 0 and 1) where two seeds are measured."""
    lines = ["| setting | space | steps | rows | genotypes | seed-0 valid (min / median / max) | tau seed 0 vs 1 |", "|---|---|---|---|---|---|---|"]
    groups = sorted({(r.setting, r.space, r.steps) for r in rows}, key=lambda k: (SETTINGS.index(k[0]), k[1], k[2]))
    for setting, space, steps in groups:
        sel = [r for r in rows if (r.setting, r.space, r.steps) == (setting, space, steps)]
        seed0 = sorted(r.valid for r in sel if r.seed == 0)
        tau, n = kendall_tau_of_seeds(rows, setting, space, steps)
        spread = f"{seed0[0]:.3f} / {statistics.median(seed0):.3f} / {seed0[-1]:.3f}" if seed0 else "-"
        lines.append(f"| {setting} | {space} | {steps} | {len(sel)} | {len({r.genotype for r in sel})} | {spread} | "
                     + (f"{tau:.3f} ({n} genotypes)" if tau is not None else "-") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from autoln.cli import OneLineParser, guarded

    p = OneLineParser(prog="retrain_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, default=default_table())
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="add the finished retrains under --out to the table")
    rec.add_argument("--out", type=Path, required=True, help="an experiment's --out (one folder per setting)")
    rec.add_argument("--space", required=True, help="the searched candidates joined by +, e.g. pre+post+deepnorm")
    rec.add_argument("--commit", required=True, help="the commit the retrains ran at")
    rec.add_argument("--settings", default=",".join(SETTINGS))
    sub.add_parser("summary", help="rows per setting, space and steps; the seed noise ceiling")
    sim = sub.add_parser("simulate", help="random search replayed from the table")
    sim.add_argument("--setting", required=True, choices=SETTINGS)
    sim.add_argument("--space", required=True)
    sim.add_argument("--budget-s", type=float, required=True)
    sim.add_argument("--runs", type=int, default=500)
    sim.add_argument("--full-steps", type=int, default=1000)
    sim.add_argument("--rungs", default="100,300")
    sim.add_argument("--eta", type=int, default=3)
    sim.add_argument("--sample-seed", type=int, default=None,
                     help="draw only the random sample of this seed (ground_truth.py's is 0, random_search.py's 1); default: every genotype measured")
    args = p.parse_args(argv)

    def body() -> None:
        if args.command == "record":
            for setting in args.settings.split(","):
                if (args.out / setting).is_dir():
                    n = record_runs(args.out / setting, setting, args.space, args.commit, args.table)
                    print(f"{setting}: {n} new rows -> {args.table}")
        elif args.command == "summary":
            print(summary(read_table(args.table)))
        else:
            rows = read_table(args.table)
            sample = None
            if args.sample_seed is not None:
                mine = [r for r in rows if (r.setting, r.space) == (args.setting, args.space)]
                n_layers = len(mine[0].genotype.split()) if mine else 1
                sample = random_sample({r.genotype for r in mine}, args.space.split("+"), n_layers, args.sample_seed)
            runs = simulate_random_search(rows, args.setting, args.space, args.budget_s,
                                          [int(s) for s in args.rungs.split(",")], args.eta, args.full_steps, args.runs,
                                          genotypes=sample)
            values = sorted(r["valid"] for r in runs)
            print(f"{len(runs)} simulated random searches of {args.budget_s:.0f} s: answer's valid at {args.full_steps} steps, "
                  f"median {statistics.median(values):.3f}, q10 {np.quantile(values, 0.1):.3f}, q90 {np.quantile(values, 0.9):.3f}; "
                  f"{statistics.mean(r['evaluated'] for r in runs):.1f} short retrains per run")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
