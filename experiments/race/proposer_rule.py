"""The adoption rule for ``race.proposer``, applied (docs/results.md, *A search that beats random
search*: written before any proposer's race ran): which proposer becomes the default.

It reads ``experiments/proposer_shares.csv``, one row per (setting, proposer, search seed), which
``proposer_replay.py --report`` writes from the tables at full precision: the share of simulated
random-search races whose answer the proposer's answer beats, and both answers' values at the
fresh seeds 6, 7, 8 (the proposer's, and the fixed-shortlist race's at the same search seed).
A proposer qualifies when, in *both* settings (nanoGPT-7, search seeds 0-4; ``shallow``-7, 0-2):

- its share, pooled over the setting's search seeds, is at least 70 %;
- at the fresh seeds its answers' mean over the search seeds is no worse than the fixed
  shortlist's answers' mean; and
- at no search seed is its answer behind the fixed shortlist's by more than the larger of the two
  answers' standard deviations over the fresh seeds.

Of those that qualify the one with the highest share (the mean of the two settings' shares) is
the default; if none does, the default stays ``none`` (the fixed shortlist). A proposer with a
search seed without a share row is undecided unless a finished setting already rules it out; while one is
undecided, no default is named::

    python experiments/race/proposer_rule.py [--shares experiments/proposer_shares.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

SHARES = Path(__file__).resolve().parents[1] / "proposer_shares.csv"
FIELDS = ["setting", "proposer", "search_seed", "answer_genotype", "share", "runs", "worth", "fresh", "fixed_genotype", "fixed_fresh"]
SETTINGS = {"nanoGPT-7": (0, 1, 2, 3, 4), "shallow-7": (0, 1, 2)}
MIN_SHARE = 0.70


@dataclass
class Standing:
    """One proposer under the rule: ``shares`` (setting -> pooled share, a fraction) of the finished
    settings, ``reasons`` it fails (empty when it qualifies) and ``missing`` (setting -> search
    seeds not yet run)."""

    proposer: str
    shares: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
    missing: dict = field(default_factory=dict)

    @property
    def decided(self) -> bool:
        return bool(self.reasons) or not self.missing

    @property
    def qualifies(self) -> bool:
        return not self.reasons and not self.missing


def _values(text: str) -> list[float]:
    return [float(x) for x in text.split()]


def standing(proposer: str, rows: list[dict]) -> Standing:
    """``proposer``'s :class:`Standing` from share rows (``FIELDS``; ``share`` a fraction, ``fresh``
    and ``fixed_fresh`` space-separated values at the fresh seeds, lower is better).

    Raises ``ValueError`` naming the row when a finished setting lacks the fixed shortlist's values."""
    st = Standing(proposer)
    for setting, seeds in SETTINGS.items():
        mine = {int(r["search_seed"]): r for r in rows if (r["setting"], r["proposer"]) == (setting, proposer)}
        missing = [s for s in seeds if s not in mine]
        if missing:
            st.missing[setting] = missing
            continue
        share = statistics.mean(float(mine[s]["share"]) for s in seeds)
        st.shares[setting] = share
        if share < MIN_SHARE:
            st.reasons.append(f"{setting}: beats random search in {100 * share:.1f} % of the pairs, below {100 * MIN_SHARE:.0f} %")
        for s in seeds:
            if not mine[s]["fixed_fresh"].strip():
                raise ValueError(f"proposer_shares.csv: {setting} {proposer} search seed {s} has no fixed_fresh values "
                                 f"(the fixed shortlist's answer at the fresh seeds)")
        own = [_values(mine[s]["fresh"]) for s in seeds]
        fixed = [_values(mine[s]["fixed_fresh"]) for s in seeds]
        a, b = statistics.mean(map(statistics.mean, own)), statistics.mean(map(statistics.mean, fixed))
        if a > b:
            st.reasons.append(f"{setting}: behind the fixed shortlist on the mean at fresh seeds ({a:.4f} against {b:.4f})")
        for s, x, y in zip(seeds, own, fixed):
            gap, sd = statistics.mean(x) - statistics.mean(y), max(statistics.stdev(x), statistics.stdev(y))
            if gap > sd:
                st.reasons.append(f"{setting}: at search seed {s} behind the fixed shortlist's answer by {gap:.4f}, more than "
                                  f"the larger standard deviation {sd:.4f}")
    return st


def adopt(rows: list[dict]) -> tuple[str | None, list[Standing]]:
    """The rule (module docstring) on share rows: ``(default, standings)``, where ``default`` is the
    qualifying proposer with the highest mean share, ``"none"`` when none qualifies, and ``None``
    while a proposer is undecided."""
    proposers = list(dict.fromkeys(r["proposer"] for r in rows))
    standings = [standing(p, rows) for p in proposers]
    if not all(s.decided for s in standings):
        return None, standings
    good = [s for s in standings if s.qualifies]
    if not good:
        return "none", standings
    return max(good, key=lambda s: statistics.mean(s.shares.values())).proposer, standings


def read_shares(path: Path) -> list[dict]:
    """The share rows of ``path``; ``SystemExit`` naming the file when it is missing or lacks a column."""
    if not path.exists():
        raise SystemExit(f"{path}: no such file; write it with `python experiments/race/proposer_replay.py SETTING --data ... --report`")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    lacking = [c for c in FIELDS if rows and c not in rows[0]]
    if lacking:
        raise SystemExit(f"{path}: lacks the columns {lacking}; expected {FIELDS}")
    return rows


def report(default: str | None, standings: list[Standing]) -> str:
    """The rule's answer as printed: a ``[rule]`` line naming the default (``default`` as
    :func:`adopt` returns it), then one line per proposer with its pooled shares (percent) and
    why it qualifies, fails or is undecided."""
    lines = []
    for s in standings:
        shares = ", ".join(f"{k} {100 * v:.1f} %" for k, v in s.shares.items())
        state = "qualifies" if s.qualifies else "fails: " + "; ".join(s.reasons) if s.reasons else \
            "undecided: " + "; ".join(f"{k} has no share rows for search seeds {v}" for k, v in s.missing.items())
        lines.append(f"  {s.proposer:6s} ({shares or 'no setting finished'}): {state}")
    head = {None: "the rule cannot be applied yet: a proposer is undecided",
            "none": "no proposer qualifies: the default stays race.proposer=none (the fixed shortlist)"}.get(
        default, f"the default becomes race.proposer={default}")
    return "\n".join([f"[rule] {head}"] + lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shares", type=Path, default=SHARES, help="the share rows (proposer_replay.py --report writes them)")
    args = p.parse_args(argv)
    print(report(*adopt(read_shares(args.shares))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
