"""The finals of autoln's races (``experiments/races.csv``, rule r2) decided again under the
group-sequential final (rule r3, :mod:`autoln.race.sequential`), the seeds it asks for past the
table's retrained for real, then the answer and the named finalist at 3 fresh seeds past every
seed the final can use (6, 7, 8).

Each final is the race's searched finalist against its best named finalist at the setting's
full budget, paired by seed (seed indices added to ``retrain.seed``, as the race's). Their
values come from ``experiments/retrains.csv`` where it holds them; a missing one is retrained in
``--out`` and recorded there (``experiments/common/retrain_table.py``), so nothing is paid for
twice. :data:`FINALS` lists the races whose decision the new final can change (ties, searched
wins, a final stopped while the searched finalist was ahead on the mean); a race whose searched
finalist was behind at seed 0 ends there under both rules. One row per final goes to
``experiments/final_replays.csv``::

    OMP_NUM_THREADS=1 python experiments/race/final_replay.py --data WIKITEXT_FOLDER [--finals shallow7-seed2,shallow7-seed0] [--lasts 4]

``--lasts 4``: then each final the searched finalist won, both finalists at 4 times the budget
at its fresh seeds (``truth_longer.py``'s longer retrain), and whether the lead lasts; then at
the seeds ``race.horizons=[1, 4]`` trains them at (0, 1, 2), the verdict line the race gives
with that setting, and whether its horizon line agrees with the fresh seeds.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*

from autoln.core.io import append_csv_row  # noqa: E402
from autoln.race.rule import REVISION, RaceRule  # noqa: E402
from autoln.race.verdict import lead_line, paired_p  # noqa: E402
from experiments.common.lasts import final_seeds  # noqa: E402

SEVEN = "model.candidates=[pre, post, deepnorm, peri, outnorm, lns, none]"
OUT_TABLE = Path(__file__).resolve().parents[1] / "final_replays.csv"
FIELDS = ["final", "setting", "space", "search_seed", "searched", "named", "rule", "outcome", "seeds", "p_value", "searched_values",
          "named_values", "fresh_seeds", "fresh_searched", "fresh_named", "commit"]

#: ``name: (setting, candidate set, search seed, searched finalist's placements, named finalist)``,
#: read off ``races.csv`` (rule r2) and the retrain table's seeds of the finalists.
FINALS = {
    "shallow7-seed2": ("shallow", "7", 2, "post lns none deepnorm peri none", "mix-ln"),  # r2: a tie, p = 0.0565
    "shallow7-seed0": ("shallow", "7", 0, "post pre post deepnorm peri peri", "mix-ln"),  # r2: searched-wins
    "shallow3-seed0": ("shallow", "3", 0, "post post pre post pre post", "mix-ln"),  # r2: a tie, p = 0.096
    "highlr3-seed0": ("highlr", "3", 0, "post pre post post post post", "all-post"),  # r2: stopped at 2 seeds, ahead on the mean
}


class Retrains:
    """The setting's retrains at its full budget: read from the table, else run and recorded."""

    def __init__(self, setting: str, k: str, data: str, table: Path, out: Path, multiplier: int = 1) -> None:
        import dataclasses

        from autoln.data import load_corpus
        from experiments.common.retrain_table import space_of
        from experiments.common.validate import setting_config

        self.setting, self.table, self.out = setting, table, out
        self.cfg = setting_config(setting, [*([SEVEN] if k == "7" else []), "logging.progress=false", f"data.corpus={data}"], None)
        if multiplier > 1:  # truth_longer.py's and horizon.py's longer retrain: the warm-up as configured, eval_every scaled
            rc = self.cfg.retrain
            self.cfg = dataclasses.replace(self.cfg, retrain=dataclasses.replace(rc, steps=rc.steps * multiplier,
                                                                                 eval_every=rc.eval_every * multiplier))
        self.space, self.vocab = space_of(self.cfg), load_corpus(self.cfg.data).vocab_size

    def values(self, placements: str) -> dict[int, float]:
        """``{seed index: valid}`` of ``placements`` at the full budget in this setting's config."""
        from autoln.data import load_corpus
        from experiments.common.retrain_table import config_id, read_table

        cid = config_id(self.cfg.to_dict(), load_corpus(self.cfg.data).fingerprint)
        return {r.seed - self.cfg.retrain.seed: r.valid for r in (read_table(self.table) if self.table.exists() else [])
                if r.setting == self.setting and r.genotype == placements and r.steps == self.cfg.retrain.steps
                and r.config == cid and r.windows == self.cfg.retrain.final_eval_windows}

    def value(self, spec: str, placements: str, seed: int) -> float:
        """One retrain: from the table, else run (``spec``, a named placement or a genotype file,
        at that seed alone: a fresh seed 6 at 4x the budget trains seed 6, not seeds 0-6) and
        recorded."""
        have = self.values(placements)
        if seed not in have:
            import dataclasses

            from autoln.models.genotype import is_baseline
            from experiments.common.retrain_table import compare_with_table

            folder = self.out / self.setting / f"{self.cfg.retrain.steps}" / placements.replace(" ", "-") / f"seed{seed}"
            files, named = ([], [spec]) if is_baseline(spec) else ([spec], [])
            one = dataclasses.replace(self.cfg, retrain=dataclasses.replace(self.cfg.retrain, seed=self.cfg.retrain.seed + seed))
            compare_with_table(one, self.setting, files, named, 1, folder, self.table)
            have = self.values(placements)
        return have[seed]

    def genotype_file(self, placements: str) -> str:
        """``placements`` as a genotype file under ``--out`` (written once)."""
        import numpy as np

        from autoln.models.genotype import from_probabilities

        cands = self.cfg.model.searched_candidates()
        path = self.out / "genotypes" / f"{self.setting}-{placements.replace(' ', '-')}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            idx = [cands.index(p) for p in placements.split()]
            from_probabilities(np.eye(len(cands))[idx], self.cfg.model, self.vocab, {"final_replay": {}}, idx).save(path)
        return str(path)


def replay(name: str, args) -> dict:
    """One final under rule r3 and its fresh seeds; the row of ``final_replays.csv``."""
    from autoln.models.genotype import baseline
    from experiments.common.retrain_table import current_commit

    setting, k, search_seed, searched, named = FINALS[name]
    rt = Retrains(setting, k, args.data, args.table, Path(args.out))
    named_placements = baseline(named, rt.cfg.model, rt.vocab).describe()
    spec = rt.genotype_file(searched)
    rule = RaceRule()

    def said(i, a, b, state):
        print(f"[final] {name} seed {i}: {searched} {a:.4f}, {named} {b:.4f}: {state}", file=sys.stderr, flush=True)

    mine, theirs, state = final_seeds(lambda i: rt.value(spec, searched, i), lambda i: rt.value(named, named_placements, i),
                                      rule.design, said)
    fresh = list(range(rule.max_seeds, rule.max_seeds + 3))
    fresh_mine = [rt.value(spec, searched, i) for i in fresh]
    fresh_theirs = [rt.value(named, named_placements, i) for i in fresh]
    outcome = "searched-wins" if state == "win" else ("tie" if sum(mine) < sum(theirs) else "named-wins")
    return {"final": name, "setting": setting, "space": rt.space, "search_seed": search_seed, "searched": searched, "named": named,
            "rule": REVISION, "outcome": outcome, "seeds": len(mine),
            "p_value": f"{paired_p(mine, theirs):.4g}" if len(mine) > 1 else "",
            "searched_values": " / ".join(f"{v:.4f}" for v in mine), "named_values": " / ".join(f"{v:.4f}" for v in theirs),
            "fresh_seeds": " ".join(str(rt.cfg.retrain.seed + i) for i in fresh),
            "fresh_searched": " / ".join(f"{v:.4f}" for v in fresh_mine), "fresh_named": " / ".join(f"{v:.4f}" for v in fresh_theirs),
            "commit": current_commit()}


def lasts(name: str, multiplier: int, args) -> Optional[str]:
    """Does the lead last? For a final of ``final_replays.csv`` (rule r3) whose searched
    finalist won: both finalists at ``multiplier`` times the budget at its fresh seeds (rows of
    the retrain table), then the race's own verdict with ``race.horizons=[1, multiplier]``
    (``experiments/common/lasts.py``) at seeds 0-2. Returns those lines, or None (no such final)."""
    if not OUT_TABLE.exists():
        return None
    with open(OUT_TABLE, newline="", encoding="utf-8") as f:
        row = next((r for r in csv.DictReader(f) if (r["final"], r["rule"]) == (name, REVISION) and r["outcome"] == "searched-wins"), None)
    if row is None:
        return None
    from autoln.models.genotype import baseline
    from experiments.common.lasts import agreement, race_horizon

    setting, k, _, searched, named = FINALS[name]
    rt = Retrains(setting, k, args.data, args.table, Path(args.out), multiplier)
    spec, named_placements = rt.genotype_file(searched), baseline(named, rt.cfg.model, rt.vocab).describe()
    fresh = [int(s) - rt.cfg.retrain.seed for s in row["fresh_seeds"].split()]
    a = [rt.value(spec, searched, i) for i in fresh]
    b = [rt.value(named, named_placements, i) for i in fresh]
    line = f"[lasts] {name} at {rt.cfg.retrain.steps} steps, fresh seeds {row['fresh_seeds']}: {lead_line(a, b, ('searched', named))}"
    budget = Retrains(setting, k, args.data, args.table, Path(args.out))  # the final's rows, at full precision from the table

    def value(entry, i, n):
        placements = searched if entry == "searched" else named_placements
        return (rt if n == rt.cfg.retrain.steps else budget).value(spec if entry == "searched" else named, placements, i)

    said = race_horizon(value, searched, (named, named_placements), budget.cfg.retrain.steps, multiplier, "bits/byte")
    return f"{line}\n[lasts] {name}: the race's verdict with race.horizons=[1, {multiplier}]: {said.line}\n" \
           f"[lasts] {name}: {agreement(said, a, b)}"


def main(argv=None) -> int:
    from experiments.common.retrain_table import default_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the WikiText-2 folder")
    p.add_argument("--finals", default=",".join(FINALS), help=f"a comma-separated subset of {list(FINALS)}")
    p.add_argument("--table", type=Path, default=default_table())
    p.add_argument("--out", default="runs/final_replay")
    p.add_argument("--lasts", type=int, default=0, metavar="K",
                   help="then each searched win's finalists at K times the budget, at its fresh seeds")
    args = p.parse_args(argv)
    names = [n for n in args.finals.split(",") if n]
    unknown = [n for n in names if n not in FINALS]
    if unknown:
        p.error(f"--finals: unknown {unknown}; expected a subset of {list(FINALS)}")
    done = set()
    if OUT_TABLE.exists():
        with open(OUT_TABLE, newline="", encoding="utf-8") as f:
            done = {(r["final"], r["rule"]) for r in csv.DictReader(f)}
    for name in names:
        if (name, REVISION) in done:
            continue
        row = replay(name, args)
        append_csv_row(OUT_TABLE, FIELDS, row)
        m, t = (statistics.mean(float(x) for x in row[c].split(" / ")) for c in ("fresh_searched", "fresh_named"))
        print(f"[final] {name}: {row['outcome']} after {row['seeds']} seeds (p = {row['p_value'] or '-'}); fresh seeds "
              f"{row['fresh_seeds']}: searched {m:.4f}, {row['named']} {t:.4f}", flush=True)
    if args.lasts > 1:
        for name in names:
            line = lasts(name, args.lasts, args)
            if line:
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
