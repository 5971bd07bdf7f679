"""End to end through the real command line: search -> genotype.json -> retrain -> metrics.json,
TensorBoard tags read back, and clear errors on bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoln import cli
from autoln.models.genotype import Genotype

from .conftest import ROOT, shared_path

TINY = str(ROOT / "configs" / "tiny.yaml")


def run(script: str, *args: str, cache: str, check: bool = True, progress: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    proc = subprocess.run([sys.executable, str(ROOT / script), *args, "--set", f"logging.progress={str(progress).lower()}"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def event_tags(folder: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def custom_scalar_charts(acc) -> dict[str, list[str]]:
    """The Custom Scalars layout of a run: chart title -> its tags (multiline charts)."""
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    if metadata.CONFIG_SUMMARY_TAG not in acc.Tags()["tensors"]:
        return {}
    layout = layout_pb2.Layout.FromString(acc.Tensors(metadata.CONFIG_SUMMARY_TAG)[-1].tensor_proto.string_val[0])
    return {chart.title: list(chart.multiline.tag) for cat in layout.category for chart in cat.chart}


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    cache = str(root / "cache")
    proc = run("search.py", "--config", TINY, "--out", str(root / "search"), cache=cache)
    return root, cache, proc


def test_search_writes_valid_genotype_and_tensorboard(searched):
    root, _, proc = searched
    out = root / "search"
    g = Genotype.load(out / "genotype.json")
    assert len(g.placements) == 2 and set(g.placements) <= {"pre", "post", "deepnorm"}
    assert g.provenance["data"]["corpus"] == "stdlib" and len(g.provenance["data"]["fingerprint_sha256"]) == 64
    assert g.provenance["config"]["search"]["steps"] == 100
    assert "python retrain.py --genotype" in proc.stdout
    assert "| site | pre | post | deepnorm | chosen |" in proc.stdout
    # the loss rises in the valid line's unit: bits per byte, the nats/token of the record over ln 2
    assert "loss rise (bits/byte)" in proc.stdout and "nats/token" not in proc.stdout.split("loss rise")[1].split("\nnext")[0]
    rises = Genotype.load(out / "supernet_genotype.json").provenance["selection"]["loss_rises"]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("  block0: "))
    shown = [float(part.split()[1]) for part in line.split(": ", 1)[1].split(", ")]
    assert shown == pytest.approx([v / math.log(2) for v in rises[0]], rel=1e-3)
    assert (out / "config.yaml").exists() and (out / "checkpoint.pt").exists()
    acc = event_tags(out)
    scalars = set(acc.Tags()["scalars"])
    expected = {"train/loss", "train/loss_alpha", "valid/loss", "valid/bits_per_byte", "lr/weights", "lr/alphas"}
    expected |= {f"alpha/block{i}/{c}" for i in range(2) for c in ("pre", "post", "deepnorm")}
    assert expected <= scalars
    assert "alphas" in acc.Tags()["images"]
    assert {"genotype/text_summary", "config/text_summary"} <= set(acc.Tags()["tensors"])
    assert [e.step for e in acc.Scalars("valid/bits_per_byte")] == [50, 100]
    supernet = Genotype.load(out / "supernet_genotype.json")  # the read-off; genotype.json is the race's answer
    probs = [acc.Scalars(f"alpha/block{i}/{c}")[-1].value for i in range(2) for c in supernet.candidates]
    assert probs == pytest.approx([p for row in supernet.probabilities for p in row], abs=1e-6)
    race = json.loads((out / "race" / "race.json").read_text())
    assert g.provenance["race"]["answer"] == race["verdict"]["answer"] and race["verdict"]["line"] in proc.stdout
    # a line per retrain of the race, with its steps done out of the race's most and the time left at most
    import re

    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[race] ") and " steps, seed " in ln]
    assert len(lines) == len(race["jobs"]) and all(re.search(r"; \d+/\d+ steps at most, at most about \d\d:\d\d left\)$", ln)
                                                  for ln in lines), lines
    g = supernet  # the rest is about the search's own record
    # the probabilities from step 0 every logging.log_every (5) steps, and one chart per site
    # with every candidate in the Custom Scalars layout
    steps = [e.step for e in acc.Scalars("alpha/block1/post")]
    assert steps[:21] == list(range(0, 101, 5)) and all(s > 100 for s in steps[21:])
    assert [e.value for e in acc.Scalars("alpha/block0/pre")][0] == pytest.approx(1 / 3, abs=0.01)
    assert custom_scalar_charts(acc) == {f"block{i}": [f"alpha/block{i}/{c}" for c in ("pre", "post", "deepnorm")] for i in range(2)}
    # perturbation-based selection (the default): each site's choice is its largest loss rise,
    # recorded in the provenance and in TensorBoard
    sel = g.provenance["selection"]
    assert sel["method"] == "perturbation" and sorted(sel["order"]) == ["block0", "block1"]
    assert g.placements == [g.candidates[int(np.argmax(r))] for r in sel["loss_rises"]]
    rises = [acc.Scalars(f"selection/block{i}/{c}")[-1].value for i in range(2) for c in g.candidates]
    assert rises == pytest.approx([v for row in sel["loss_rises"] for v in row], abs=1e-5)
    assert "selection/text_summary" in acc.Tags()["tensors"]
    assert "valid_selected/bits_per_byte" in scalars
    # every record of the answer at one step: the last fine-tuning update of the selection
    end = 100 + sel["fine_tuning_updates"]
    assert steps[-1] == end and [e.step for e in acc.Images("alphas")][-1] == end
    assert acc.Scalars("valid_selected/bits_per_byte")[-1].step == end == acc.Scalars("selection/block0/pre")[-1].step
    assert acc.Tensors("genotype/text_summary")[-1].step == end == acc.Tensors("selection/text_summary")[-1].step
    # pictures in the run folder, and the curves in the Images tab
    assert (out / "alphas.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / "alphas_heatmap.png").stat().st_size > 1000
    assert [e.step for e in acc.Images("alpha_curves")] == [end]


def test_retrain_reports_bits_per_byte(searched):
    root, cache, _ = searched
    out = root / "retrain"
    proc = run("retrain.py", "--genotype", str(root / "search" / "genotype.json"), "--config", TINY, "--out", str(out), cache=cache)
    m = json.loads((out / "metrics.json").read_text())
    assert 0 < m["valid"]["bits_per_byte"] < 8 and 0 < m["test"]["bits_per_byte"] < 8
    assert m["steps"] == 150 and m["valid"]["windows"] == 32
    assert f"bits_per_byte {m['valid']['bits_per_byte']:.4f}" in proc.stdout
    acc = event_tags(out)
    assert {"train/loss", "valid/bits_per_byte", "lr/weights"} <= set(acc.Tags()["scalars"])
    # a retrain has no alphas: nothing lands in the search's alpha charts (its one image is the
    # diagnostics at initialisation against the block index); its genotype is text
    assert not [t for t in acc.Tags()["scalars"] if t.startswith("alpha/")] and acc.Tags()["images"] == ["diag_init"]
    assert "genotype/text_summary" in acc.Tags()["tensors"] and not custom_scalar_charts(acc)
    # a finished run folder is refused without --overwrite, and left untouched
    before = (out / "metrics.json").read_bytes()
    proc = run("retrain.py", "--genotype", "all-pre", "--config", TINY, "--out", str(out), cache=cache, check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert (out / "metrics.json").read_bytes() == before


def test_baseline_names_and_same_seed_same_batches(searched):
    root, cache, _ = searched
    losses = {}
    for name in ("all-pre", "mix-ln"):
        run("retrain.py", "--genotype", name, "--config", TINY, "--out", str(root / name), "--set", "retrain.steps=20", cache=cache)
        losses[name] = json.loads((root / name / "metrics.json").read_text())
    assert losses["mix-ln"]["placements"] == "post pre"  # round(0.25 * 2) = 1 Post-LN block first
    assert losses["all-pre"]["placements"] == "pre pre"
    assert losses["all-pre"]["valid"]["loss"] != losses["mix-ln"]["valid"]["loss"]


@pytest.mark.parametrize("args, needle", [
    (["--set", "model.n_heads=3"], "model.d_model"),
    (["--set", "modle.x=1"], "modle"),
    (["--set", "data.corpus=/no/such/file.txt"], "/no/such/file.txt"),
    (["--config", "/no/such/config.yaml"], "/no/such/config.yaml"),
])
def test_search_bad_input_is_one_clear_line(tmp_path, args, needle):
    proc = run("search.py", "--config", TINY, *args, "--out", str(tmp_path / "o"), cache=str(tmp_path / "c"), check=False)
    assert proc.returncode == 2
    assert needle in proc.stderr and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_retrain_bad_genotype(tmp_path):
    bad = tmp_path / "g.json"
    bad.write_text('{"format": "autoln.genotype"}')
    proc = run("retrain.py", "--genotype", str(bad), "--config", TINY, "--out", str(tmp_path / "o"), cache=str(tmp_path / "c"), check=False)
    assert proc.returncode == 2 and "field 'version'" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("retrain.py", "--genotype", "all-sandwich", "--config", TINY, "--out", str(tmp_path / "o2"), cache=str(tmp_path / "c"), check=False)
    assert proc.returncode == 2 and "all-sandwich" in proc.stderr


@pytest.mark.parametrize("tokenizer, metric", [("bytes", "bits_per_byte"), ("words", "perplexity")])
def test_wikitext2_search_and_retrain(tmp_path, tokenizer, metric):
    corpus = str(shared_path("wikitext-2"))
    cache = str(tmp_path / "cache")
    sets = ["--set", "race.enabled=false", "--set", f"data.corpus={corpus}", "--set", f"data.tokenizer={tokenizer}", "--set", "search.steps=20",
            "--set", "search.arch_warmup_steps=4", "--set", "retrain.steps=20", "--set", "search.eval_every=10", "--set", "retrain.eval_every=10"]
    run("search.py", "--config", TINY, *sets, "--out", str(tmp_path / "s"), cache=cache)
    g = Genotype.load(tmp_path / "s" / "genotype.json")
    assert g.model["vocab_size"] == (256 if tokenizer == "bytes" else 33_278)
    run("retrain.py", "--genotype", str(tmp_path / "s" / "genotype.json"), "--config", TINY, *sets, "--out", str(tmp_path / "r"), cache=cache)
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["valid"][metric] > 0 and m["data"]["tokenizer"] == tokenizer
    if tokenizer == "words":
        assert m["valid"]["perplexity"] < 33_278 * 2


@pytest.mark.parametrize("sets", [
    ["search.order=2"],
    ["search.mixing=gumbel", "search.tau_start=5", "search.tau_end=0.5"],
    ["search.mixing=gumbel-hard", "search.tau_start=5", "search.tau_end=0.5"],
    ["search.mixing=sigmoid", "search.zero_one_weight=10", "search.tau_end=1.0"],
    ["search.arch_warmup_steps=20", "search.beta_reg_max=5", "search.sdarts_eps=0.03", "search.early_stop=hessian",
     "search.eval_every=5", "search.eval_windows=4", "search.monitor_windows=2", "model.granularity=sublayer"],  # R-DARTS needs 7 evaluations
], ids=["order2", "gumbel", "gumbel-hard", "sigmoid", "regularised"])
def test_search_options_run_to_a_valid_genotype(tmp_path, sets):
    args = [a for s in ["race.enabled=false", "search.steps=40", "search.eval_every=20", *sets] for a in ("--set", s)]
    run("search.py", "--config", TINY, *args, "--out", str(tmp_path / "s"), cache=str(tmp_path / "c"))
    g = Genotype.load(tmp_path / "s" / "genotype.json")
    assert len(g.placements) == 2
    metrics = g.provenance["metrics"]
    assert len(metrics["site_entropy"]) == (4 if "model.granularity=sublayer" in sets else 2)
    assert all(0 <= h <= np.log(3) + 1e-9 for h in metrics["site_entropy"])
    assert len(metrics["hessian_eigenvalues"]) == (8 if "search.eval_every=5" in sets else 2) or metrics["stopped_early"]
    acc = event_tags(tmp_path / "s")
    tags = set(acc.Tags()["scalars"])
    assert {"monitor/hessian_eigenvalue", "monitor/mean_entropy", "monitor/genotype_changed", "search/tau"} <= tags
    if "search.tau_start=5" in sets:
        taus = acc.Scalars("search/tau")
        assert taus[0].value == pytest.approx(5 - 4.5 * (taus[0].step - 1) / 39)
        assert taus[-1].step == 40 and taus[-1].value == pytest.approx(0.5)  # the last step uses tau_end exactly


def test_bad_input_leaves_no_folder_and_overwrite_keeps_old_run_until_inputs_are_good(tmp_path, searched):
    root, cache, _ = searched
    fresh = tmp_path / "never"
    proc = run("search.py", "--config", TINY, "--set", "model.candidates=[pre]", "--out", str(fresh), cache=cache, check=False)
    assert proc.returncode == 2 and "at least two candidates" in proc.stderr and not fresh.exists()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    before = {p.name: p.read_bytes() for p in (root / "search").iterdir() if p.is_file()}
    proc = run("search.py", "--config", TINY, "--set", f"data.corpus={empty}", "--out", str(root / "search"), "--overwrite",
               cache=cache, check=False)
    assert proc.returncode == 2 and "empty" in proc.stderr
    assert {p.name: p.read_bytes() for p in (root / "search").iterdir() if p.is_file()} == before
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = run("search.py", "--config", TINY, "--out", str(afile / "sub"), cache=cache, check=False)
    assert proc.returncode == 2 and "is a file" in proc.stderr and "Traceback" not in proc.stderr


def test_retrain_config_records_the_trained_model(searched):
    import yaml

    root, cache, _ = searched
    out = root / "retrain-cfg"
    run("retrain.py", "--genotype", str(root / "search" / "genotype.json"), "--out", str(out), "--set", "retrain.steps=2",
        "--set", "retrain.eval_every=1", "--set", "retrain.final_eval_windows=2", "--set", "retrain.eval_windows=2", cache=cache)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["model"]["n_layers"] == 2 and saved["model"]["d_model"] == 32  # the genotype's, not the default 6 x 96


def test_heat_map_scale_is_stretched_to_the_largest_difference_from_uniform():
    from autoln.core.tb import heat_scale

    near = np.array([[0.337, 0.331, 0.332], [0.33, 0.334, 0.336]])
    assert heat_scale(near) == pytest.approx(0.337 - 1 / 3)  # not the fixed 0..1 scale that made it one colour
    assert heat_scale(np.full((2, 4), 0.25)) == 1e-3 and heat_scale(np.array([[1.0, 0.0]])) == pytest.approx(0.5)


def test_heat_map_boxes_the_chosen_placement_even_below_the_top_probability():
    """After perturbation-based selection the chosen candidate need not have the largest
    probability: the heat map boxes and stars the chosen cell of each site, not the argmax."""
    from matplotlib.patches import Rectangle

    from autoln.core.tb import alpha_figure

    probs = np.array([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])
    ax = alpha_figure(probs, ["block0", "block1"], ["pre", "post", "deepnorm"], chosen=[1, 2]).axes[0]
    boxes = sorted((int(p.get_x() + 0.5), int(p.get_y() + 0.5)) for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill())
    assert boxes == [(1, 0), (2, 1)]  # (candidate, site): post at block0 (0.3 < 0.5), deepnorm at block1
    assert sorted(t.get_text() for t in ax.texts if t.get_text().endswith("*")) == ["0.300*", "0.700*"]


def test_a_redirected_log_gets_a_line_per_evaluation_not_bar_redraws(tmp_path, capsys):
    """Off a terminal (stderr to a file or pipe; here pytest's capture) the progress bars would
    write a line per redraw (tqdm#750): the search and the retrain write one line per
    evaluation instead, in one unit."""
    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    common = ["--config", TINY, "--set", "race.enabled=false", "--set", f"data.corpus={text}", "--set", f"data.cache_dir={tmp_path / 'c'}",
              "--set", "logging.tensorboard=false", "--set", "logging.progress=true"]
    assert cli.search_main([*common, "--set", "search.steps=20", "--set", "search.eval_every=10", "--set", "search.arch_warmup_steps=4",
                            "--set", "search.selection=argmax", "--out", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("search step")]
    assert "\r" not in err and [line.split(":")[0] for line in lines] == ["search step 10/20", "search step 20/20"]
    assert all("bits/byte" in line and "nats" not in line for line in lines)
    # each line carries the estimated time left, as the bar's ETA does on a terminal
    import re

    assert all(re.search(r"\(about \d\d:\d\d left for the steps, then the read-off\)$", line) for line in lines), lines
    assert cli.retrain_main([*common, "--genotype", "all-pre", "--set", "retrain.steps=20", "--set", "retrain.eval_every=10",
                             "--set", "retrain.final_eval_windows=4", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("retrain step")]
    assert "\r" not in err and len(lines) == 2 and all(re.search(r"\(about \d\d:\d\d left\)$", line) for line in lines), lines


def _strict(path: Path):
    def refuse(name):
        raise ValueError(f"{path}: not strict JSON ({name})")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_every_json_file_a_search_writes_is_strict(searched):
    root, _, _ = searched
    paths = sorted(root.rglob("*.json"))  # the search's own and the data cache's (meta.json, tokenizer.json)
    for path in paths:
        _strict(path)
    assert {"genotype.json", "meta.json"} <= {p.name for p in paths}


def test_no_json_file_is_written_with_a_writer_that_allows_nan():
    """Every JSON that autoln writes goes through :func:`autoln.core.io.write_json_atomic` (NaN as
    null) or passes ``allow_nan=False``: a ``json.dump`` or a ``json.dumps`` handed to a writer
    without it is how ``reports.json`` came to hold a bare NaN."""
    import ast

    writers = {"write_text_atomic", "write", "write_text", "dump"}
    found = []
    for path in sorted((ROOT / "autoln").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name not in writers:
                continue
            dumps = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                     and c.func.attr in ("dump", "dumps") and getattr(c.func.value, "id", "") == "json"]
            for call in dumps:
                if not any(k.arg == "allow_nan" and getattr(k.value, "value", True) is False for k in call.keywords):
                    found.append(f"{path.name}:{call.lineno}")
    assert found == []


@pytest.mark.parametrize("script, main", [("autoln-search", "search_main"), ("autoln-retrain", "retrain_main")])
def test_a_console_script_s_help_names_it(script, main, monkeypatch, capsys):
    from autoln import cli

    monkeypatch.setattr(sys, "argv", [f"/venv/bin/{script}", "--help"])
    with pytest.raises(SystemExit) as exc:
        getattr(cli, main)(["--help"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {script} ")
    monkeypatch.setattr(sys, "argv", ["search.py"])
    assert cli.invoked_as("search.py") == "search.py"


def test_a_misspelt_baseline_names_the_nearest(tmp_path):
    from autoln.config import load_config
    from autoln.core.errors import GenotypeError
    from autoln.retrain.run_retrain import resolve_genotype

    cfg = load_config(TINY)
    with pytest.raises(GenotypeError, match=r"--genotype 'all-pree': no such file, and not a baseline name \(did you mean 'all-pre'\?\)"):
        resolve_genotype("all-pree", cfg, 256)
    with pytest.raises(GenotypeError, match=r"'mix-lm'.*did you mean 'mix-ln'\?"):
        resolve_genotype("mix-lm", cfg, 256)


def test_a_busy_machine_is_said_once_before_the_run(tmp_path, monkeypatch, capsys):
    """The load above the cores and several threads: one line, before any work, naming the load,
    the cores, the threads and the one-thread advice; one thread, or an idle machine: nothing."""
    import torch

    from autoln.models.resources import busy_line

    assert busy_line(threads=2, load=5.25, cores=2) == (
        "note: the machine is busy (load 5.2 on 2 cores): with 2 threads this run's threads wait on each other and it may "
        "take several times as long; give each run one thread (OMP_NUM_THREADS=1 before the command)")
    assert busy_line(threads=1, load=5.0, cores=2) is None  # one thread: nothing to advise
    assert busy_line(threads=2, load=2.0, cores=2) is None  # at the cores, not above
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 3.0, 0.0, 0.0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    code = cli.retrain_main(["--config", TINY, "--genotype", "all-pree", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("note: the machine is busy") == 1 and f"on {cores} cores" in err and "OMP_NUM_THREADS=1" in err
    assert err.index("the machine is busy") < err.index("all-pree")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    assert cli.retrain_main(["--config", TINY, "--genotype", "all-pree", "--out", str(tmp_path / "r2")]) == 2
    assert "busy" not in capsys.readouterr().err


def test_alphas_png_marks_an_overruled_site_and_the_end_of_the_search():
    """The tiny config's case: ``block1`` ends at ``0.232 | 0.741 | 0.027`` and the loss rises
    choose ``pre``: its panel says so in red, in a red frame; ``block0`` chose its largest and
    stays plain; a dashed line at step 500 marks where the search ends and the read-off's
    fine-tuning (to 600) begins."""
    import matplotlib.pyplot as plt

    from autoln.core.tb import alpha_curves_figure

    cands = ["pre", "post", "deepnorm"]
    history = [(s, [[0.6, 0.3, 0.1], [0.232, 0.741, 0.027]]) for s in (0, 250, 500, 600)]
    fig = alpha_curves_figure(history, ["block0", "block1"], cands, chosen=[0, 0], search_steps=500)
    plain, overruled = fig.axes[0], fig.axes[1]
    assert plain.get_title() == "block0: pre" and plain.title.get_color() != "red"
    assert overruled.get_title() == "block1: pre (overruled: post 0.74)" and overruled.title.get_color() == "red"
    assert overruled.spines["left"].get_edgecolor()[:3] == (1.0, 0.0, 0.0)
    for ax in (plain, overruled):
        assert [list(ln.get_xdata()) for ln in ax.lines if ln.get_linestyle() == "--"] == [[500, 500]]
    assert "the search's 500 steps, then, past the dashed line, the read-off's fine-tuning" in fig._supxlabel.get_text()
    plt.close(fig)
    fig = alpha_curves_figure(history[:3], ["block0", "block1"], cands, chosen=[0, 1], search_steps=500)  # argmax: no fine-tuning
    assert all(ln.get_linestyle() != "--" for ax in fig.axes[:2] for ln in ax.lines)
    assert fig.axes[1].get_title() == "block1: post" and fig._supxlabel.get_text() == "step"
    plt.close(fig)
