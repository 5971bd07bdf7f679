"""How should the default search read off its genotype? The read-offs side by side, and the rule.

Per setting of ``experiments/common/validate.py`` (same ``--out``; its folders are shared, so finished
runs are reused both ways), four genotypes, each retrained at ``--seeds`` seeds at the setting's
retrain budget in the setting's comparison folder:

- ``perturbation``: the default search's own genotype (``<out>/<setting>/search``, DARTS-PT's
  perturbation-based selection: Wang et al. 2021, "Rethinking Architecture Selection in
  Differentiable NAS");
- ``score``: the same trained supernet read off by scoring genotypes one-hot (SPOS: Guo et al.
  2020; ``search.selection=score``: every genotype up to 4096, else evolution);
- ``argmax``: the same supernet read off by the largest alpha per site (DARTS: Liu et al. 2019);
- ``fixed-alpha``: a search whose alphas stay uniform (``search.arch_lr=0``), read off by
  perturbation: DARTS-PT's finding that this beats DARTS+PT on NAS-Bench-201 (93.80 % vs
  88.11 %).

The rule, fixed before any result (docs/results.md): a read-off replaces perturbation only if,
retrained at 3 seeds, its genotype beats the default's by more than one standard deviation
(the larger of the two) in the shallow or the deep setting and loses by more than one in
neither; ``score`` is eligible only if Kendall's tau (``<out>/<setting>/ground_truth.json``, from
``experiments/truth/ground_truth.py`` with the same ``--out``) is at least 0.5 in both settings (the
default reads off every setting). Several qualifying: the lowest mean over the two settings.
Without both settings, 3 finished seeds of every genotype and both taus, nothing is decided. It
writes ``<out>/read_off.md`` and ``<out>/read_off.json`` over every setting measured so far (each
setting's numbers are kept in ``<out>/<setting>/read_off.json``, so calls split by ``--settings``
add up and the rule can decide once both have run).

    python experiments/fidelity/read_off.py --data WIKITEXT_FOLDER [--settings shallow,deep] [--seeds 3] [--out runs/validate]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.fidelity.selection_variants import reselect  # noqa: E402
from experiments.common.validate import add_common_arguments, commands_line, each_setting, merge_saved, positive_int, searched_genotype, setting_config, verdict  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.io import read_json, write_json_atomic, write_text_atomic  # noqa: E402

READ_OFFS = ("perturbation", "score", "argmax", "fixed-alpha")
#: Kendall's tau at or above which ``score`` is eligible (the rule).
MIN_TAU = 0.5
#: The settings the rule is decided on.
RULE_SETTINGS = ("shallow", "deep")


def fixed_alpha_genotype(fixed, folder: Path) -> Path:
    """The search of config ``fixed`` (the setting's with ``search.arch_lr=0``: the alphas keep
    their near-uniform start) in ``folder``: reused when finished with the same settings,
    resumed from its checkpoint, else run. Returns its ``genotype.json``. Raises ConfigError
    when the finished one was made with other settings."""
    from autoln.oneshot.consensus import check_same_search
    from autoln.oneshot.run_search import run_search

    if (folder / "genotype.json").exists():
        check_same_search(folder, fixed)
        return folder / "genotype.json"
    resume = (folder / "checkpoint.pt").exists()
    print(f"[read-off] fixed-alpha search -> {folder}" + (" (resuming)" if resume else ""), file=sys.stderr, flush=True)
    return run_search(fixed, folder, overwrite=not resume, resume=resume).path


def run_setting(name: str, overrides: list[str], config: str | None, seeds: int, out: Path, workers: int = 1,
                table: Path | None = None) -> dict:
    """The four read-offs of one setting, retrained; returns their numbers."""
    from experiments.common.retrain_table import compare_with_table
    from autoln.data import HEADLINE
    from autoln.models.genotype import Genotype

    cfg = setting_config(name, overrides, config)
    headline = HEADLINE[cfg.data.tokenizer]
    search = searched_genotype(cfg, name, out)
    folder = out / name / "read_off"
    files = {"perturbation": search}
    for variant in ("score", "argmax"):
        reselect(search.parent, folder / variant, variant)
        files[variant] = folder / variant / "genotype.json"
    files["fixed-alpha"] = fixed_alpha_genotype(setting_config(name, [*overrides, "search.arch_lr=0"], config), folder / "fixed-alpha")
    entries = compare_with_table(cfg, name, [str(files[r]) for r in READ_OFFS], [], seeds, out / name / "compare", table, workers=workers)
    rows = {}
    for r, e in zip(READ_OFFS, entries):
        runs = [m["valid"][headline] for m in e.runs if m is not None]
        rows[r] = {"placements": Genotype.load(files[r]).describe(), "valid": runs,
                   "mean": statistics.mean(runs) if runs else None, "std": statistics.stdev(runs) if len(runs) > 1 else None}
    for r in READ_OFFS[1:]:
        rows[r]["vs_perturbation"] = against(rows[r]["valid"], rows["perturbation"]["valid"])
    gt = read_json(out / name / "ground_truth.json")  # the setting's own, kept by ground_truth.py
    tau = gt.get("fidelity", {}).get("kendall_tau") if isinstance(gt, dict) and gt.get("setting") == name else None
    return {"setting": name, "headline": headline, "rows": rows, "kendall_tau": tau}


def against(candidate: list[float], default: list[float]) -> str:
    """``beats`` / ``matches`` / ``loses``: a read-off's retrained values against the default's,
    by :func:`validate.verdict`'s rule (a gap within the larger standard deviation matches)."""
    if candidate and not default:
        return "beats (every seed of perturbation diverged)"
    return verdict(candidate, default)


def decide(results: list[dict], min_seeds: int = 3) -> tuple[str, str]:
    """The rule (module docstring) over ``results``: ``(read-off, reason)``. ``perturbation``
    stays unless another qualifies; nothing is decided without both rule settings, with fewer
    than ``min_seeds`` finished seeds of a genotype, or (for ``score``) without Kendall's tau."""
    by = {r["setting"]: r for r in results}
    missing = [s for s in RULE_SETTINGS if s not in by]
    if missing:
        return "perturbation", f"undecided: the rule needs {', '.join(RULE_SETTINGS)}; {', '.join(missing)} not measured"
    short = [f"{r} in {s}" for s in RULE_SETTINGS for r in READ_OFFS if len(by[s]["rows"][r]["valid"]) < min_seeds]
    if short:
        return "perturbation", f"undecided: the rule needs {min_seeds} finished seeds of each genotype; fewer for {', '.join(short)}"
    taus = {s: by[s]["kendall_tau"] for s in RULE_SETTINGS}
    if any(t is None for t in taus.values()):
        return "perturbation", (f"undecided: score's eligibility needs Kendall's tau in {', '.join(RULE_SETTINGS)} "
                                "(experiments/truth/ground_truth.py with the same --out)")
    qualifying, why = [], []
    for r in READ_OFFS[1:]:
        verdicts = {s: by[s]["rows"][r]["vs_perturbation"] for s in RULE_SETTINGS}
        if r == "score" and not all(t >= MIN_TAU for t in taus.values()):
            why.append(f"{r}: not eligible (Kendall's tau {', '.join(f'{t:.3f} in {s}' for s, t in taus.items())}; needs at "
                       f"least {MIN_TAU} in both)")
            continue
        wins = [s for s, v in verdicts.items() if v.startswith("beats")]
        losses = [s for s, v in verdicts.items() if v.startswith("loses")]
        if wins and not losses:
            qualifying.append(r)
        why.append(f"{r}: {', '.join(f'{v} in {s}' for s, v in verdicts.items())}")
    if not qualifying:
        return "perturbation", "no read-off qualifies (" + "; ".join(why) + ")"
    best = min(qualifying, key=lambda r: statistics.mean(by[s]["rows"][r]["mean"] for s in RULE_SETTINGS))
    return best, f"{best} qualifies (" + "; ".join(why) + ")"


def markdown(r: dict) -> str:
    """One setting's section."""
    def ms(row: dict) -> str:
        return "-" if row["mean"] is None else f"{row['mean']:.3f}" + (f" ± {row['std']:.3f}" if row["std"] is not None else "")

    tau = r["kendall_tau"]
    lines = [f"## {r['setting']}", "", f"Kendall's tau (ground truth): {'not measured' if tau is None else f'{tau:.3f}'}.", "",
             f"| read-off | genotype | valid {r['headline']} | against perturbation |", "|---|---|---|---|"]
    for name, row in r["rows"].items():
        lines.append(f"| {name} | {row['placements']} | {ms(row)} ({len(row['valid'])} seeds) | {row.get('vs_perturbation', '(default)')} |")
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    p = OneLineParser(prog="read_off.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow,deep")
    p.add_argument("--seeds", type=positive_int, default=3, help="retrain seeds per genotype (default 3)")
    args = p.parse_args(argv)

    def body() -> None:
        fresh = each_setting(args, "read_off.py", lambda n, overrides, out: run_setting(
            n, overrides, args.config, args.seeds, out, args.workers, args.table))
        out = Path(args.out)
        results = merge_saved(out, "read_off", fresh, argv)
        choice, reason = decide(results)
        report = ("# Reading off the genotype: perturbation, score, argmax, fixed alphas\n\n"
                  f"{commands_line(results)}\n\n"
                  + "\n".join(markdown(r) for r in results)
                  + f"\nThe rule's answer: **{choice}** ({reason}).\n")
        write_text_atomic(out / "read_off.md", report)
        write_json_atomic(out / "read_off.json", {"settings": results, "choice": choice, "reason": reason})
        print(report + f"\nwrote {out / 'read_off.md'}, {out / 'read_off.json'}")

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
