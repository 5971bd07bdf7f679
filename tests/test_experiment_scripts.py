"""Every experiment script under experiments/ imports and parses its command line on this code:
its ``main(["--help"])`` prints its usage and exits 0 (a script left behind by a change in the
package fails here, not in the middle of a session's experiment)."""

import contextlib
import io
from pathlib import Path

import pytest

from tests.conftest import experiment_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(f"{p.parent.name}/{p.stem}" for p in (ROOT / "experiments").glob("*/*.py") if p.stem != "__init__")
LIBRARIES = {"common/retrain_table", "common/halving"}  # modules the scripts share; retrain_table has subcommands


def test_every_script_is_listed():
    assert len(SCRIPTS) >= 25 and "race/proposer_replay" in SCRIPTS and "truth/truth_longer" in SCRIPTS


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in LIBRARIES])
def test_a_script_s_help(name):
    module = experiment_script(name)
    assert callable(getattr(module, "main", None)), f"experiments/{name}.py has no main()"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and "usage:" in out.getvalue(), f"experiments/{name}.py --help: {out.getvalue()[-500:]}"
