"""Hostile input, table-driven: every case goes through the command-line entry points
(``autoln.cli.search_main`` / ``retrain_main``, which ``search.py`` and ``retrain.py`` call with
``sys.argv``) and must exit non-zero with one message naming the file or field, print no
traceback, and leave every existing output untouched (a finished search and a finished retrain
sit beside each case; a fresh ``--out`` is not created)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autoln.cli import retrain_main, search_main
from autoln.config import ModelConfig
from autoln.models.genotype import baseline

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
GENOTYPE = baseline("all-pre", ModelConfig(n_layers=2, d_model=32, n_heads=2, d_ff=128, context=32), 256).to_dict()


def genotype_with(**changes) -> str:
    g = json.loads(json.dumps(GENOTYPE))
    for dotted, value in changes.items():
        node, *path = dotted.split("__")
        target = g
        for key in [node, *path][:-1]:
            target = target[int(key) if isinstance(target, list) else key]
        last = [node, *path][-1]
        if value is KeyError:
            del target[last]
        else:
            target[int(last) if isinstance(target, list) else last] = value
    return json.dumps(g)


def without(key: str) -> str:
    g = dict(GENOTYPE)
    del g[key]
    return json.dumps(g)


# name: (script, files to create {name: text or bytes}, extra argv (FILE:<name> -> path, WS -> workspace), needle)
CASES = {
    # --- genotype JSON --------------------------------------------------------------------------
    "genotype truncated": ("retrain", {"g.json": json.dumps(GENOTYPE)[:60]}, ["--genotype", "FILE:g.json"], "not valid JSON"),
    "genotype empty file": ("retrain", {"g.json": ""}, ["--genotype", "FILE:g.json"], "g.json is not valid JSON"),
    "genotype not an object": ("retrain", {"g.json": "[1, 2]"}, ["--genotype", "FILE:g.json"], "expected a JSON object"),
    "genotype undecodable": ("retrain", {"g.json": b"\xff\xfe\x00{"}, ["--genotype", "FILE:g.json"], "cannot read genotype file"),
    "genotype missing file": ("retrain", {}, ["--genotype", "FILE:none.json"], "none.json"),
    "genotype placements wrong type": ("retrain", {"g.json": genotype_with(placements="pre")}, ["--genotype", "FILE:g.json"], "field 'placements'"),
    "genotype n_layers wrong type": ("retrain", {"g.json": genotype_with(model__n_layers="two")}, ["--genotype", "FILE:g.json"], "field 'model.n_layers'"),
    "genotype unknown key": ("retrain", {"g.json": genotype_with(colour="blue")}, ["--genotype", "FILE:g.json"], "field 'colour'"),
    "genotype missing key": ("retrain", {"g.json": without("placements")}, ["--genotype", "FILE:g.json"], "field 'placements': missing"),
    "genotype unknown candidate": ("retrain", {"g.json": genotype_with(placements__1="sandwich")}, ["--genotype", "FILE:g.json"], "field 'placements[1]'"),
    "genotype NaN probability": ("retrain", {"g.json": genotype_with(probabilities__0=[math.nan])}, ["--genotype", "FILE:g.json"], "field 'probabilities[0]'"),
    "genotype negative probability": ("retrain", {"g.json": genotype_with(probabilities__0=[-1.0])}, ["--genotype", "FILE:g.json"], "field 'probabilities[0]'"),
    "genotype layer count mismatch": ("retrain", {"g.json": genotype_with(model__n_layers=3)}, ["--genotype", "FILE:g.json"], "model.n_layers is 3"),
    "genotype vocabulary mismatch": ("retrain", {"g.json": genotype_with(model__vocab_size=300)}, ["--genotype", "FILE:g.json"], "model.vocab_size"),
    "genotype unknown baseline": ("retrain", {}, ["--genotype", "all-sandwich"], "all-sandwich"),
    # --- config YAML ------------------------------------------------------------------------------
    "config unknown key": ("search", {"c.yaml": "model:\n  colour: blue\n"}, ["--config", "FILE:c.yaml"], "model.colour"),
    "config unknown section": ("search", {"c.yaml": "modle:\n  n_layers: 2\n"}, ["--config", "FILE:c.yaml"], "modle"),
    "config wrong type": ("search", {"c.yaml": "model:\n  n_layers: two\n"}, ["--config", "FILE:c.yaml"], "model.n_layers"),
    "config zero size": ("search", {"c.yaml": "model:\n  d_model: 0\n"}, ["--config", "FILE:c.yaml"], "model.d_model"),
    "config negative size": ("search", {"c.yaml": "search:\n  batch_size: -4\n"}, ["--config", "FILE:c.yaml"], "search.batch_size"),
    "config width not divisible by heads": ("search", {"c.yaml": "model:\n  d_model: 30\n  n_heads: 4\n"}, ["--config", "FILE:c.yaml"], "model.d_model"),
    "config invalid YAML": ("search", {"c.yaml": "model: [n_layers: 2\n"}, ["--config", "FILE:c.yaml"], "c.yaml is not valid YAML"),
    "config not a mapping": ("search", {"c.yaml": "- 1\n- 2\n"}, ["--config", "FILE:c.yaml"], "c.yaml must hold a mapping"),
    "config not UTF-8": ("search", {"c.yaml": b"model:\n  norm: \xff\n"}, ["--config", "FILE:c.yaml"], "c.yaml is not UTF-8"),
    "config duplicate key": ("search", {"c.yaml": "model:\n  n_layers: 2\nmodel:\n  d_model: 32\n"}, ["--config", "FILE:c.yaml"], "duplicate key 'model'"),
    "genotype is a folder": ("retrain", {"gdir/x": "x"}, ["--genotype", "FILE:gdir"], "is a folder"),
    "config missing file": ("search", {}, ["--config", "FILE:none.yaml"], "none.yaml"),
    "config bad --set": ("search", {}, ["--set", "search.steps"], "--set expects section.key=value"),
    "config bad on_divergence": ("search", {}, ["--set", "search.on_divergence=ignore"], "search.on_divergence"),
    "config negative checkpoint.every": ("retrain", {}, ["--genotype", "all-pre", "--set", "checkpoint.every=-1"], "checkpoint.every"),
    "config bad precision": ("retrain", {}, ["--genotype", "all-pre", "--set", "retrain.precision=fp8"], "retrain.precision"),
    # --- data ---------------------------------------------------------------------------------------
    "data empty file": ("search", {"empty.txt": ""}, ["--set", "data.corpus=FILE:empty.txt"], "empty.txt"),
    "data shorter than the context": ("search", {"short.txt": "a few words\n" * 3}, ["--set", "data.corpus=FILE:short.txt"], "short.txt"),
    "data missing split file": ("search", {"wiki/train.txt": "x y z\n" * 500, "wiki/test.txt": "x y\n" * 200},
                                ["--set", "data.corpus=FILE:wiki", "--set", "data.tokenizer=words"], "valid.txt"),
    "data undecodable for chars": ("search", {"bin.txt": b"\xff\xfe\xfa" * 4000}, ["--set", "data.corpus=FILE:bin.txt", "--set", "data.tokenizer=chars"], "bin.txt"),
    "data undecodable for words": ("search", {"bin.txt": b"ok \xff\xfe\n" * 4000}, ["--set", "data.corpus=FILE:bin.txt", "--set", "data.tokenizer=words"], "bin.txt"),
    "data missing corpus": ("search", {}, ["--set", "data.corpus=FILE:nowhere.txt"], "nowhere.txt"),
    # --- output folders -------------------------------------------------------------------------------
    "out holds a finished search": ("search", {}, ["--out", "WS/prev_search"], "already holds a finished run"),
    "out holds a finished retrain": ("retrain", {}, ["--genotype", "all-pre", "--out", "WS/prev_retrain"], "already holds a finished run"),
    "out holds an interrupted run": ("search", {}, ["--out", "WS/prev_interrupted"], "--resume"),
    "out is a file": ("search", {"afile": "x"}, ["--out", "FILE:afile"], "afile"),
    "resume a finished run": ("search", {}, ["--out", "WS/prev_search", "--resume"], "holds a finished search"),
    "resume a missing folder": ("retrain", {}, ["--genotype", "all-pre", "--out", "WS/nothing_here", "--resume"], "nothing_here"),
    "resume a corrupt checkpoint": ("search", {"broken/checkpoint.pt": b"PK\x03\x04 truncated"}, ["--out", "FILE:broken", "--resume"], "checkpoint.pt"),
    "resume with overwrite": ("search", {}, ["--out", "WS/prev_search", "--resume", "--overwrite"], "--resume"),
    "resume without out": ("retrain", {}, ["--genotype", "all-pre", "--resume"], "--resume needs --out"),
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = tmp_path_factory.mktemp("hostile")
    (ws / "prev_search").mkdir()
    (ws / "prev_search" / "genotype.json").write_text(json.dumps(GENOTYPE))
    (ws / "prev_search" / "config.yaml").write_text("search: {steps: 1}\n")
    (ws / "prev_interrupted").mkdir()
    (ws / "prev_interrupted" / "checkpoint.pt").write_bytes(b"an interrupted run's checkpoint")
    (ws / "prev_retrain").mkdir()
    (ws / "prev_retrain" / "metrics.json").write_text('{"valid": {"loss": 1.0}}')
    return ws


def snapshot(ws: Path) -> dict:
    return {str(p.relative_to(ws)): p.read_bytes() for d in ("prev_search", "prev_retrain", "prev_interrupted") for p in (ws / d).rglob("*")}


def test_the_table_has_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_is_refused_clearly(name, workspace, tmp_path, capsys, monkeypatch):
    script, files, extra, needle = CASES[name]
    monkeypatch.setenv("XDG_CACHE_HOME", str(workspace / "cache"))
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    def resolve(arg: str) -> str:
        arg = arg.replace("WS/", f"{workspace}/")
        return arg.replace("FILE:", f"{tmp_path}/")

    argv = [resolve(a) for a in extra]
    if "--config" not in argv:
        argv = ["--config", TINY, *argv]
    fresh = tmp_path / "fresh"
    if "--out" not in argv and "--resume" not in argv:
        argv += ["--out", str(fresh)]
    argv += ["--set", "logging.progress=false"]
    before = snapshot(workspace)
    main = search_main if script == "search" else retrain_main
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code != 0, f"{name}: accepted"
    assert needle in err, f"{name}: {err!r}"
    assert "Traceback" not in err
    assert snapshot(workspace) == before and not fresh.exists()
