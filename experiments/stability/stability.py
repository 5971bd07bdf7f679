"""Is the answer stable? The seeds' own genotypes against their consensus, retrained.

Per setting of ``experiments/common/validate.py`` (same ``--out``; its compare folder is shared, so
runs are reused both ways): ``search.py --seeds N``'s job in ``<out>/<setting>/seeds`` (finished
seeds are reused, an interrupted one resumes), then the consensus genotype and every distinct
seed genotype retrained at ``--retrain-seeds`` seeds at the setting's retrain budget. The first
seed's search is ``experiments/common/validate.py``'s own (``<out>/<setting>/search``, same config,
same seed): when it is finished with the same settings it is copied into ``seeds/seed<s>``
rather than run again. A seed's answer counts as *stable* when its retrained mean lies within
one standard deviation (the larger of the two genotypes') of the consensus genotype's mean, the rule
``experiments/common/validate.py`` uses for "matches"; a seed whose genotype is the consensus is stable
by definition. The per-site agreement and the vote table are reported beside it as information.
It writes ``<out>/stability.md`` and ``<out>/stability.json`` over every setting measured so far
(each setting's numbers are kept in ``<out>/<setting>/stability.json``).

    python experiments/stability/stability.py --data WIKITEXT_FOLDER [--settings shallow,deep] [--seeds 3]
        [--retrain-seeds 3] [--out runs/validate]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.validate import add_common_arguments, commands_line, each_setting, merge_saved, positive_int, setting_config, verdict  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.io import write_json_atomic, write_text_atomic  # noqa: E402


def reuse_validate_search(cfg, name: str, out: Path) -> bool:
    """Copy validate's finished search of setting ``name`` (``<out>/<name>/search``) into the first
    seed's folder of ``search.py --seeds`` (``<out>/<name>/seeds/seed<search.seed>``) when that
    folder is empty and the search was made with the same settings (the seed's config is
    ``cfg``, whose ``search.seed`` is the first seed). The copy is made in a temporary folder and
    renamed, so an interrupted copy leaves nothing half-written. Returns whether it copied."""
    import shutil

    from autoln.oneshot.consensus import check_same_search
    from autoln.core.errors import ConfigError

    source = out / name / "search"
    target = out / name / "seeds" / f"seed{cfg.search.seed}"
    if not (source / "genotype.json").exists() or target.exists():
        return False
    try:
        check_same_search(source, cfg)
    except ConfigError:
        return False
    tmp = target.with_name(target.name + ".copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("*.lock"))
    tmp.rename(target)
    print(f"[stability] {name}: seed {cfg.search.seed} is validate's search ({source}), copied to {target}", file=sys.stderr)
    return True


def run_setting(name: str, overrides: list[str], config: str | None, n_seeds: int, retrain_seeds: int, out: Path,
                workers: int = 1, table: Path | None = None) -> dict:
    """The seeds' searches, their consensus and the retrains of one setting; returns its numbers."""
    from experiments.common.retrain_table import compare_with_table
    from autoln.oneshot.consensus import check_same_search, run_seeds, vote
    from autoln.core.errors import ConfigError
    from autoln.data import HEADLINE
    from autoln.models.genotype import Genotype

    cfg = setting_config(name, overrides, config)
    headline = HEADLINE[cfg.data.tokenizer]
    folder = out / name / "seeds"
    consensus_file = folder / "genotype.json"
    if not consensus_file.exists():
        reuse_validate_search(cfg, name, out)
        run_seeds(cfg, n_seeds, folder, workers)
    seed_files = [folder / f"seed{cfg.search.seed + i}" / "genotype.json" for i in range(n_seeds)]
    genotypes = [Genotype.load(f) for f in seed_files]
    consensus = Genotype.load(consensus_file)
    # a genotype equal to validate's searched one (the same search's answer) is retrained under
    # that file's label, so its finished runs in the shared comparison folder are reused
    known = {}
    validate_search = out / name / "search"
    if (validate_search / "genotype.json").exists():
        try:
            check_same_search(validate_search, cfg)
            known[Genotype.load(validate_search / "genotype.json").describe()] = str(validate_search / "genotype.json")
        except ConfigError:
            pass
    distinct: dict[str, str] = {}
    for f, g in [(consensus_file, consensus), *zip(seed_files, genotypes)]:
        distinct.setdefault(g.describe(), known.get(g.describe(), str(f)))
    print(f"[stability] {name}: {len(distinct)} distinct genotypes at {retrain_seeds} seeds", file=sys.stderr, flush=True)
    entries = compare_with_table(cfg, name, list(distinct.values()), [], retrain_seeds, out / name / "compare", table, workers=workers)
    valid = {e.spec: [r["valid"][headline] for r in e.runs if r is not None] for e in entries}
    cons = valid[distinct[consensus.describe()]]
    rows = []
    for i, g in enumerate(genotypes):
        runs = valid[distinct[g.describe()]]
        same = g.describe() == consensus.describe()
        rows.append({"seed": cfg.search.seed + i, "placements": g.describe(), "valid": runs,
                     "mean": statistics.mean(runs) if runs else None, "std": statistics.stdev(runs) if len(runs) > 1 else None,
                     "stable": same or verdict(runs, cons) == "matches",
                     "direction": None if same or verdict(runs, cons) == "matches" else
                     "better" if verdict(runs, cons).startswith("beats") else "worse"})
    return {"setting": name, "headline": headline, "agreement": vote(genotypes).agreement,
            "consensus": {"placements": consensus.describe(), "valid": cons, "mean": statistics.mean(cons) if cons else None,
                          "std": statistics.stdev(cons) if len(cons) > 1 else None},
            "seeds": rows, "stability": sum(r["stable"] for r in rows) / len(rows)}


def markdown(r: dict) -> str:
    """One setting's section of the report."""
    def ms(row: dict) -> str:
        return "-" if row["mean"] is None else f"{row['mean']:.3f}" + (f" ± {row['std']:.3f}" if row["std"] is not None else "")

    c = r["consensus"]
    lines = [f"## {r['setting']}", "", f"Per-site agreement of the seeds: {r['agreement']:.0%}. Consensus `{c['placements']}`: "
             f"valid {r['headline']} {ms(c)} ({len(c['valid'])} seeds).", "",
             f"| search seed | genotype | valid {r['headline']} | within one std of the consensus |", "|---|---|---|---|"]
    lines += [f"| {row['seed']} | {row['placements']} | {ms(row)} | {'yes' if row['stable'] else 'no (retrains ' + str(row['direction']) + ')'} |" for row in r["seeds"]]
    lines += ["", f"Stability: **{r['stability']:.0%}** of the seeds' answers retrain as well as the consensus.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = OneLineParser(prog="stability.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow,deep")
    p.add_argument("--seeds", type=int, default=3, help="search seeds (default 3)")
    p.add_argument("--retrain-seeds", type=positive_int, default=3, help="retrain seeds per genotype (default 3)")
    args = p.parse_args(argv)

    def body() -> None:
        from autoln.core.errors import ConfigError

        if args.seeds < 2:
            raise ConfigError(f"--seeds must be at least 2 (one search needs no consensus), got {args.seeds}")
        fresh = each_setting(args, "stability.py", lambda n, overrides, out: run_setting(
            n, overrides, args.config, args.seeds, args.retrain_seeds, out, args.workers, args.table))
        out = Path(args.out)
        results = merge_saved(out, "stability", fresh, argv)
        report = ("# Stability: the seeds' answers against their consensus\n\n"
                  f"{commands_line(results)}\n\n"
                  + "\n".join(markdown(r) for r in results))
        write_text_atomic(out / "stability.md", report)
        write_json_atomic(out / "stability.json", results)
        print(report + f"\nwrote {out / 'stability.md'}, {out / 'stability.json'}")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
