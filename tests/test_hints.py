"""Two hints of the issue on the command and the API telling the same: a ``--<key>`` that is a
config key is answered with the ``--set`` that sets it, and nanoGPT's ``train.bin`` given as a
corpus file is answered with its folder."""

from __future__ import annotations

import numpy as np
import pytest

from autoln.cli import retrain_main, search_main, set_hint
from autoln.config import load_config
from autoln.data import load_corpus
from autoln.core.errors import DataError


@pytest.mark.parametrize("main, argv, want", [
    (search_main, ["--steps", "100"], "error: unrecognized arguments: --steps 100; did you mean --set search.steps=100? "
                                      "(see search.py --help)"),
    (retrain_main, ["--steps=5", "--d-model", "64", "--foo"],
     "error: unrecognized arguments: --steps=5 --d-model 64 --foo; did you mean --set retrain.steps=5 "
     "--set model.d_model=64? (see retrain.py --help)"),
    (search_main, ["--arch-lr"], "did you mean --set search.arch_lr=VALUE?"),
    (search_main, ["--bogus", "3"], "error: unrecognized arguments: --bogus 3 (see search.py --help)"),
])
def test_an_option_that_is_a_config_key_gets_its_set(main, argv, want, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and want in err and "\n" not in err


def test_the_hint_looks_in_the_command_s_section_first():
    assert set_hint(["--lr", "1e-3"], "search") == "did you mean --set search.lr=1e-3?"
    assert set_hint(["--lr", "1e-3"], "retrain") == "did you mean --set retrain.lr=1e-3?"
    assert set_hint(["--corpus", "x.txt"], "search") == "did you mean --set data.corpus=x.txt?"
    assert set_hint(["-x"], "search") is None


def test_nanogpt_s_train_bin_as_a_corpus_file_says_to_pass_the_folder(tmp_path):
    np.arange(2000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.arange(500, dtype=np.uint16).tofile(tmp_path / "val.bin")
    cfg = load_config(None, [f"data.corpus={tmp_path / 'train.bin'}", f"data.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DataError, match=rf"train.bin is one of nanoGPT's token files .*--set data.corpus={tmp_path}\b"):
        load_corpus(cfg.data)
    folder = load_config(None, [f"data.corpus={tmp_path}", "data.vocab_size=2000", f"data.cache_dir={tmp_path / 'cache'}"])
    assert load_corpus(folder.data) is not None  # the folder is read (as token ids)
