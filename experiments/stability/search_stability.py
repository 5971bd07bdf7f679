"""How stable is the search? Several seeds x several bilevel variants on one config.

For each variant and seed it runs ``search.py``'s job (in process) into
``<out>/<variant>/seed<k>`` (a finished run is reused, so the script can be re-run or split
across processes with ``--variants``), then prints a Markdown report: the genotype of each
run, how many sites agree across all seeds, and the final per-site entropies (nats; ``ln 3 =
1.099`` is uniform over three candidates).

    python experiments/stability/search_stability.py [--config FILE] [--set KEY=VALUE ...]
        [--seeds 0,1,2] [--variants order1,order2,gumbel-hard] [--out runs/stability]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoln.cli import guarded
from autoln.config import load_config
from autoln.models.genotype import Genotype
from autoln.oneshot.run_search import run_search

#: Variants by name: the ``--set`` overrides that define them.
VARIANTS = {
    "order1": [],
    "order2": ["search.order=2"],
    "gumbel": ["search.mixing=gumbel"],
    "gumbel-hard": ["search.mixing=gumbel-hard"],
    "sigmoid": ["search.mixing=sigmoid", "search.zero_one_weight=10"],
}


def report(out: Path, variants: list[str], seeds: list[int]) -> str:
    """Markdown tables of the finished runs under ``out``."""
    lines = ["| variant | seed | genotype | supernet valid | per-site entropy (nats) | wall s |", "|---|---|---|---|---|---|"]
    agree = []
    for v in variants:
        gs = []
        for s in seeds:
            f = out / v / f"seed{s}" / "genotype.json"
            if not f.exists():
                lines.append(f"| {v} | {s} | (not run) | | | |")
                continue
            g = Genotype.load(f)
            gs.append(g)
            m = g.provenance["metrics"]
            valid = m["supernet_valid"]
            score = next((f"{valid[k]:.4f} {k}" for k in ("bits_per_byte", "bits_per_char", "perplexity") if k in valid), "")
            ent = " ".join(f"{h:.4f}" for h in m["site_entropy"])
            lines.append(f"| {v} | {s} | {g.describe()} | {score} | {ent} | {m['wall_time_s']:.0f} |")
        if len(gs) == len(seeds) and gs:
            sites = [list(zip(*[g.block_placements()[i] for g in gs])) for i in range(len(gs[0].placements))]
            per_site = [len(set(p)) == 1 for block in sites for p in (block if gs[0].granularity == "sublayer" else block[:1])]
            agree.append(f"| {v} | {sum(per_site)} / {len(per_site)} |")
    return "\n".join(lines + ["", "| variant | sites on which all seeds agree |", "|---|---|"] + agree) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--variants", default="order1,order2,gumbel-hard", help=f"comma list of {list(VARIANTS)}")
    p.add_argument("--out", default="runs/stability")
    args = p.parse_args(argv)

    def body() -> None:
        seeds = [int(s) for s in args.seeds.split(",")]
        variants = args.variants.split(",")
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            raise SystemExit(f"error: unknown variant(s) {unknown}; expected {list(VARIANTS)}")
        out = Path(args.out)
        for v in variants:
            for s in seeds:
                run_dir = out / v / f"seed{s}"
                if (run_dir / "genotype.json").exists():
                    continue
                cfg = load_config(args.config, [*args.overrides, *VARIANTS[v], f"search.seed={s}", "logging.progress=false"])
                result = run_search(cfg, run_dir)
                print(f"{v} seed {s}: {result.genotype.describe()} ({result.wall_time_s:.0f} s)", file=sys.stderr)
        print(report(out, variants, seeds))

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
