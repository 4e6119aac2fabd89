"""A collection's history (``ReadHandle.history``, ``persist history``) and reads as of a
wall-clock time (``ReadHandle.as_of_timestamp``)."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.cli import main
from persist.errors import InvalidUsage
from persist.indexed.state import transitions as state


def _utc(ms: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms, tz=datetime.UTC)


def test_each_seal_is_recorded_with_its_time_and_counts(tmp_path: Path) -> None:
    loc = str(tmp_path / "loc")
    with persist.open(loc) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        before = time.time()
        w.append([(("a", 1), 0, 2), (("b", 1), 0, 1)], upper=1).result()
        w.write([(("a", 1), 1, -1)]).result()
        w.write([(("c", 1), 2, 5)]).result()
        w.seal(3).result()
        w.seal(4).result()  # a seal adding nothing
        after = time.time()
        seals = r.history()
    assert [s.upper for s in seals] == [1, 3, 4]
    assert [(s.updates, s.inserted, s.retracted) for s in seals] == [(2, 3, 0), (2, 5, 1),
                                                                     (0, 0, 0)]
    assert all(_utc(before - 1) <= s.committed_at <= _utc(after + 1) for s in seals)
    assert [s.seq for s in seals] == sorted(s.seq for s in seals)
    # the history is part of the state: a replica and a reopened writer see the same
    with persist.open(loc, read_only=True) as replica:
        _, rr = replica.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert rr.history() == seals
    with persist.open(loc) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert r.history() == seals


def test_history_survives_rollups_and_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.setattr(state, "HISTORY_ENTRIES", 5)
    loc = str(tmp_path / "loc")
    with persist.open(loc, options=persist.Options(rollup_every=2)) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(9):
            w.append([((t, t), t, 1)], upper=t + 1).result()
        assert [s.upper for s in r.history()] == [5, 6, 7, 8, 9]
    with persist.open(loc, read_only=True) as replica:
        _, rr = replica.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert [s.upper for s in rr.history()] == [5, 6, 7, 8, 9]


def test_as_of_timestamp_reads_what_was_sealed_then(tmp_path: Path) -> None:
    with persist.open(str(tmp_path / "loc")) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        with pytest.raises(InvalidUsage, match="no recorded seals"):
            r.as_of_timestamp(time.time())
        w.append([(("a", 1), 0, 1)], upper=1).result()
        first = r.history()[-1].committed_at
        time.sleep(0.05)
        w.append([(("b", 1), 1, 1)], upper=5).result()
        second = r.history()[-1].committed_at
        assert r.as_of_timestamp(first) == 0
        assert r.as_of_timestamp(first + (second - first) / 2) == 0
        assert r.as_of_timestamp(second) == 4
        assert r.as_of_timestamp(second.isoformat()) == 4
        assert r.as_of_timestamp(second.timestamp() + 3600) == 4
        got = r.snapshot(r.as_of_timestamp(first)).to_python()
        assert got == [(("a", 1), 0, 1)]
        with pytest.raises(InvalidUsage, match="before its oldest recorded seal"):
            r.as_of_timestamp(first - datetime.timedelta(seconds=1))
        with pytest.raises(InvalidUsage, match="no time zone"):
            r.as_of_timestamp(second.replace(tzinfo=None))
        with pytest.raises(InvalidUsage, match="not an ISO-8601"):
            r.as_of_timestamp("yesterday")
        with pytest.raises(InvalidUsage, match="a timestamp is"):
            r.as_of_timestamp(True)
        w.allow_compaction(3).result()
        with pytest.raises(InvalidUsage, match="below its since 3"):
            r.as_of_timestamp(first)


def test_the_history_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loc = str(tmp_path / "loc")
    with persist.open(loc) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.append([(("a", 1), 0, 1), (("b", 1), 0, -2)], upper=1).result()
    assert main(["history", loc, "c", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(e["upper"], e["updates"], e["inserted"], e["retracted"]) for e in rows] == \
        [(1, 2, 1, 2)]
    assert main(["history", loc, "c"]) == 0
    out = capsys.readouterr().out
    assert "1 recorded seals" in out
    assert "committed at (UTC)" in out
