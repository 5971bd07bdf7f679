"""``race.png`` read by its layout (autoln.race.figure): the whole verdict in a caption inside the
figure, the full-budget entries on their own scale, the final's seeds paired, no marker hidden
under another."""

from __future__ import annotations

import itertools
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from autoln.race.figure import race_figure, race_figure_of  # noqa: E402

NAMED = {"all-pre": 2.4877, "all-post": 2.4620, "all-deepnorm": 2.7100, "mix-ln": 2.4651, "pre-post": 2.5300}
#: The report's race: a read-off far above the rest at 111 steps, two entries equal there and at 333.
SHORT = {"read-off": 3.6012, "argmax": 3.1000, "top1": 3.1000, "top2": 3.1010, "top3": 3.2200}
FINAL = {"top1": [2.4620, 2.4550, 2.4600], "all-post": [2.4620, 2.4551, 2.4700]}
LINE = ("answer: all-post (no searched placement beat it at 1000 steps, 3 seeds: best searched top1 2.4590 ± 0.0036, "
        "all-post 2.4624 ± 0.0075 bits/byte; ahead on the mean, it did not pass a group-sequential one-sided paired t-test at "
        "level 0.05 (looks at 3 to 6 seeds, O'Brien-Fleming spending; p = 0.2113 at 3 seeds): a tie, and the named placement "
        "is the simpler answer)")


def record(short=SHORT, final=FINAL, line=LINE, p_value=0.2113) -> dict:
    """A race.json record: ``short`` at 111 steps (the best two again at 333), every named entry
    at 1000 steps (seed 0), the ``final`` finalists seed by seed."""
    jobs = [{"entry": n, "steps": 111, "seed": 0, "value": v} for n, v in short.items()]
    jobs += [{"entry": n, "steps": 333, "seed": 0, "value": 2.80} for n in sorted(short, key=short.get)[:2]]
    jobs += [{"entry": n, "steps": 1000, "seed": 0, "value": v} for n, v in NAMED.items()]
    jobs += [{"entry": n, "steps": 1000, "seed": i, "value": v} for n, vs in final.items() for i, v in enumerate(vs)
             if (n, i) != ("all-post", 0)]
    pool = [{"name": n, "kind": "named", "placements": n, "origin": "named"} for n in NAMED]
    pool += [{"name": n, "kind": "searched", "placements": n, "origin": "supernet"} for n in {**short, **final} if n not in NAMED]
    return {"full_steps": 1000, "metric": "bits_per_byte", "pool": pool, "jobs": jobs, "rule": "the rule",
            "verdict": {"answer": "all-post", "outcome": "tie", "line": line, "p_value": p_value, "values": final,
                        "searched": "top1", "named": "all-post", "horizons": []}}


def drawn(rec: dict):
    fig = race_figure_of(rec)
    fig.canvas.draw()
    return fig, fig.canvas.get_renderer()


def panel(fig, title: str):
    return next(ax for ax in fig.axes if ax.get_title().startswith(title))


def inside(inner, outer, slack: float = 1.0) -> bool:
    return inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack and inner.x1 <= outer.x1 + slack and inner.y1 <= outer.y1 + slack


def markers(ax):
    """``(x, y, diameter)`` in pixels of every marker drawn in ``ax``."""
    out = []
    for line in ax.get_lines():
        if line.get_marker() in ("", " ", "None", None):
            continue
        size = line.get_markersize() * ax.figure.dpi / 72
        for x, y in ax.transData.transform(list(zip(line.get_xdata(), line.get_ydata()))):
            out.append((x, y, size))
    return out


@pytest.mark.parametrize("rec", [record(), record(line=LINE[:-1] + "; " + "at 4000 steps level, within one standard deviation "
                                                  "(top1 1.8753 ± 0.0043, all-post 1.8711 ± 0.0047 bits/byte): the lead at 1000 "
                                                  "steps does not last)" * 3),
                                 record(short={}, final={"top1": [2.4700], "all-post": [2.4620]}, p_value=None)],
                         ids=["report", "long-verdict", "no-short-rung-one-seed"])
def test_the_whole_verdict_is_a_caption_inside_the_figure_clear_of_the_panels(rec):
    fig, renderer = drawn(rec)
    try:
        caption = next(t for t in fig.texts if "".join(t.get_text().split()) == "".join(rec["verdict"]["line"].split()))
        box = caption.get_window_extent(renderer)
        assert inside(box, fig.bbox)  # not cut at either side or the bottom
        assert max(len(s) for s in caption.get_text().splitlines()) < len(rec["verdict"]["line"])  # wrapped, not one long line
        for ax in fig.axes:
            tight = ax.get_tightbbox(renderer)  # the panel with its title, tick labels and legend
            assert inside(tight, fig.bbox), ax.get_title()
            assert not tight.overlaps(box), ax.get_title()
        assert inside(fig._suptitle.get_window_extent(renderer), fig.bbox)
    finally:
        plt.close(fig)


def test_the_full_budget_entries_have_a_panel_on_their_own_scale():
    rec = record()
    fig, _ = drawn(rec)
    try:
        ax = panel(fig, "every entry at the full budget (1000 steps, seed 0)")
        shown = sorted(x for line in ax.get_lines() for x in line.get_xdata())
        seed0 = sorted(j["value"] for j in rec["jobs"] if j["steps"] == 1000 and j["seed"] == 0)
        assert shown == pytest.approx(seed0)  # every entry's seed 0 at 1000 steps, one point each
        lo, hi = ax.get_xlim()
        assert lo < min(seed0) and hi > max(seed0) and hi - lo < 1.5 * (max(seed0) - min(seed0))  # their scale, not 3.6's
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels[-1] == "all-post (named) 2.4620" and len(labels) == len(seed0)  # the best at the top
        assert [t.get_fontweight() for t in ax.get_yticklabels() if t.get_text().startswith("all-post")] == ["bold"]
    finally:
        plt.close(fig)


def test_the_final_panel_pairs_the_finalists_seed_by_seed():
    rec = record()
    fig, _ = drawn(rec)
    try:
        ax = panel(fig, "the final: 3 seeds, paired t-test p = 0.211")
        seeds = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines() if line.get_label().startswith("seed")}
        assert seeds == {f"seed {i}": [FINAL["top1"][i], FINAL["all-post"][i]] for i in range(3)}  # one line per seed
        assert [t.get_text() for t in ax.get_xticklabels()] == ["top1\nmean 2.4590\n± 0.0036", "all-post\nmean 2.4624\n± 0.0075"]
        means = sorted(float(seg[0][1]) for c in ax.collections for seg in c.get_segments())
        assert means == pytest.approx(sorted(sum(v) / 3 for v in FINAL.values()))
    finally:
        plt.close(fig)


@pytest.mark.parametrize("rec", [record(), record(short={**SHORT, "top4": 3.1, "top5": 3.1, "top6": 3.1})], ids=["report", "ties"])
def test_no_marker_hides_another(rec):
    """Equal values (argmax and top1 at 111 steps, top1 and all-post at seed 0 of the final and
    of the full budget) sit side by side, not on top of each other."""
    fig, _ = drawn(rec)
    try:
        for ax in fig.axes:
            for (x1, y1, d1), (x2, y2, d2) in itertools.combinations(markers(ax), 2):
                assert math.hypot(x1 - x2, y1 - y2) >= max(d1, d2), (ax.get_title(), (x1, y1), (x2, y2))
    finally:
        plt.close(fig)


def test_race_png_is_written_and_the_figure_closed(tmp_path):
    before = len(plt.get_fignums())
    path = race_figure(record(), tmp_path / "race.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(plt.get_fignums()) == before
