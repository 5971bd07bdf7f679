"""Run folders and the lines around them: default names in UTC that sort in time whatever the
zone, and one clear line where a folder, a thread count or a storage cannot be used as given."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
import types

import pytest

from autoln.engine import training

from .conftest import ROOT


@pytest.fixture
def zone(monkeypatch):
    """Set the process's time zone (``TZ`` and ``time.tzset``), restored afterwards."""

    def set_zone(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()
    yield set_zone
    monkeypatch.undo()
    time.tzset()


def at(instant: dt.datetime):
    """A stand-in for the ``datetime`` module whose clock reads ``instant`` (aware, UTC): ``now()``
    gives the local wall time of the process's zone, ``now(tz)`` the time in ``tz``, as the real one."""

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return instant.astimezone(tz) if tz is not None else instant.astimezone().replace(tzinfo=None)
    return types.SimpleNamespace(datetime=Frozen, timezone=dt.timezone)


def test_default_names_are_utc_and_sort_in_time_across_zones(zone, monkeypatch):
    first = dt.datetime(2026, 12, 7, 3, 8, 57, tzinfo=dt.timezone.utc)
    zone("UTC")
    monkeypatch.setattr(training, "_dt", at(first))
    older = training.default_out_dir("search")
    zone("America/Los_Angeles")  # the second run 2 s later, from a shell in another zone
    monkeypatch.setattr(training, "_dt", at(first + dt.timedelta(seconds=2)))
    newer = training.default_out_dir("search")
    assert str(older) == os.path.join("runs", "search-20261207-030857Z")
    assert str(newer) == os.path.join("runs", "search-20261207-030859Z")
    assert sorted([str(newer), str(older)])[-1] == str(newer)  # `ls -d runs/search-* | tail -n 1` is the newest
    assert training.default_out_dir("retrain", "all-pre").name == "retrain-all-pre-20261207-030859Z"


def test_the_real_clock_gives_the_utc_time_under_any_zone(zone):
    zone("Asia/Tokyo")
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    name = training.default_out_dir("seeds").name
    after = dt.datetime.now(dt.timezone.utc)
    match = re.fullmatch(r"seeds-(\d{8}-\d{6})Z", name)
    assert match, name
    stamp = dt.datetime.strptime(match.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
    assert before <= stamp <= after  # Tokyo's wall time would be 9 hours ahead


def test_the_readme_s_newest_folder_idiom_holds_and_the_names_are_documented_as_utc():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "S=$(ls -d runs/search-* | tail -n 1)    # the newest search folder" in readme  # true of UTC names (above)
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    assert "`runs/search-<YYYYmmdd-HHMMSS>Z` and `runs/retrain[-<baseline>]-<YYYYmmdd-HHMMSS>Z`, the time\n  in UTC (`Z`)" in usage
    assert "runs/search-20261203-160000Z/genotype.json" in (ROOT / "docs" / "race.md").read_text(encoding="utf-8")
