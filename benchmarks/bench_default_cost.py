"""The default command's whole cost in default retrains (issue 43: at most 12).

In one run on one machine: ``python search.py`` with the built-in defaults (the search, its
shortlist and perturbation read-off, then the race) and one default ``retrain.py --genotype
all-pre`` (1000 steps, final evaluation), both as subprocesses with the same thread count, timed
from start to exit. Printed: the two wall times, their ratio, and the search's and the race's
parts (the race's retrains as ``race.json`` records them, and its rungs). The two are measured
one after the other, so a machine whose load changes between them shifts that ratio: run it
alone. A second ratio divides the command's wall time by the mean time of the race's own
full-budget retrains (default retrains of the same run, under its load).

With ``--set race.horizons=[1,4]`` the longer retrains (run after the final, only when the
searched finalist led) are timed apart, so one run gives the cost of both ``[1]`` (the same run
less them) and ``[1, 4]``.

    OMP_NUM_THREADS=2 python benchmarks/bench_default_cost.py [--out runs/bench-cost] [--set race.horizons=[1,4]] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` from the repository root with its output in ``log``; its wall time in seconds.

    Raises:
        SystemExit: the command failed (its log's tail is printed)."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        code = subprocess.call(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if code:
        sys.exit(f"{' '.join(cmd)} failed ({code}):\n" + log.read_text(encoding="utf-8")[-3000:])
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/bench-cost"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="settings for both commands (default: none, the built-in defaults)")
    args = p.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    sets = [a for o in args.overrides for a in ("--set", o)]
    retrain_s = timed([sys.executable, "retrain.py", "--genotype", "all-pre", *sets, "--set", "logging.progress=false",
                       "--out", str(args.out / "retrain")], args.out / "retrain.log")
    total_s = timed([sys.executable, "search.py", *sets, "--set", "logging.progress=false", "--out", str(args.out / "search")],
                    args.out / "search.log")
    genotype = json.loads((args.out / "search" / "supernet_genotype.json").read_text())
    race = json.loads((args.out / "search" / "race" / "race.json").read_text())
    search_s = genotype["provenance"]["metrics"]["wall_time_s"]
    finals = [j["wall_time_s"] for j in race["jobs"] if j["steps"] == race["full_steps"] and j.get("wall_time_s")]
    inside = sum(finals) / len(finals) if finals else float("nan")
    longer = [j for j in race["jobs"] if j["steps"] > race["full_steps"]]  # race.horizons beyond 1: after the final
    longer_s = sum(j.get("wall_time_s") or 0.0 for j in longer)
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}\n"
          f"one default retrain (all-pre, 1000 steps): {retrain_s:.0f} s\n"
          f"python search.py (search + race): {total_s:.0f} s = {total_s / retrain_s:.2f} default retrains\n"
          f"  against the race's own full-budget retrains (mean {inside:.0f} s each, the same run's load): "
          f"{total_s / inside:.2f} default retrains\n"
          f"  the search's steps: {search_s:.0f} s; the race's {len(race['jobs'])} retrains: {race['wall_time_s']:.0f} s of "
          f"training; rungs {[(r['steps'], len(r['entries'])) for r in race['rungs']]}\n"
          f"  race.horizons {race['settings'].get('horizons', [1])}: {len(longer)} longer retrains, {longer_s:.0f} s of training"
          f" = {longer_s / inside:.2f} default retrains; without them (race.horizons=[1], the rest identical): "
          f"{(total_s - longer_s) / inside:.2f} default retrains\n"
          f"  verdict: {race['verdict']['line']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
