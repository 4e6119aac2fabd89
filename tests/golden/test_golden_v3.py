"""Storage format version 3 (schema evolution) stays readable forever: these bytes were written
by the persist that introduced it (``make_golden_v3``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest

from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat, SchemaMismatch
from persist.indexed.format import evolve, meta
from tests.golden.records_v3 import Order0, Order2, fixed_commit, fixed_state
from tests.support.engine import Engine

HERE = Path(__file__).parent


def test_commit_bytes_are_pinned() -> None:
    golden = (HERE / "v3-commit.bin").read_bytes()
    assert meta.encode(fixed_commit()) == golden
    decoded = meta.decode_commit(layout.log_key(7), golden)
    assert decoded.version == 3
    assert decoded == msgspec.structs.replace(fixed_commit(), version=3)


def test_state_bytes_are_pinned() -> None:
    golden = (HERE / "v3-state.bin").read_bytes()
    assert meta.encode(fixed_state()) == golden
    decoded = meta.decode_state(layout.rollup_key(7), golden)
    assert decoded == msgspec.structs.replace(fixed_state(), version=3)
    orders = decoded.collections["orders"]
    assert evolve.version(orders) == 1
    assert [evolve.part_version(p) for p in orders.parts] == [0, 1]


def test_v3_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v3-location", loc)
    expected = json.loads((HERE / "v3-expected.json").read_text())
    ix = Engine.open(FileBlob(loc).read_only())
    assert meta.required_version(ix.state) == 3
    # parts of older versions are still there, read migrated
    keyed = ix.state.collections["keyed"]
    assert {evolve.part_version(p) for p in keyed.parts} == {0, 1}
    for name, by_version in expected.items():
        c = ix.state.collections[name]
        assert sorted(int(v) for v in by_version) == list(range(evolve.version(c) + 1))
        for v, by_time in by_version.items():
            assert sorted(int(t) for t in by_time) == list(range(c.since, c.upper))
            for t, rows in by_time.items():
                snap = ix.snapshot(name, int(t), schema_id=int(v))
                if rows == "SchemaMismatch":
                    with pytest.raises(SchemaMismatch):
                        snap.to_arrow()
                    continue
                got = snap.to_python()
                assert [[repr(k), repr(val), d] for (k, val), _, d in got] == rows, (name, v, t)
                if name == "orders":
                    cls = {"0": Order0, "2": Order2}.get(v)
                    assert cls is None or all(isinstance(x, cls) for (_, x), _, _ in got)


def test_v3_location_logs_only_evolutions_as_version_3() -> None:
    blob = FileBlob(HERE / "v3-location")
    by_kind: dict[str, set[int]] = {}
    for key in blob.list_keys(layout.LOG_PREFIX):
        data = blob.get(key)
        assert data is not None
        commit = meta.decode_commit(key, bytes(data))
        kinds = {type(op).__name__ for op in commit.ops}
        kind = "evolve" if "EvolveSchema" in kinds else "register" if "Register" in kinds \
            else "other"
        by_kind.setdefault(kind, set()).add(commit.version)
    assert by_kind["evolve"] == {3}
    assert by_kind["register"] == {1, 2}
    assert by_kind["other"] == {1}
    rollups = blob.list_keys(layout.ROLLUP_PREFIX)
    data = blob.get(rollups[-1])
    assert data is not None
    assert meta.decode_state(rollups[-1], bytes(data)).version == 3


def test_an_older_persist_refuses_the_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """A persist that reads up to version 2 stops at the first version-3 record, before it
    could read an evolved collection's parts with one schema."""
    monkeypatch.setattr(meta, "FORMAT_VERSION", 2)
    with pytest.raises(IncompatibleFormat, match="format version 3"):
        Engine.open(FileBlob(HERE / "v3-location").read_only())
    with pytest.raises(IncompatibleFormat):
        meta.decode_commit(layout.log_key(7), (HERE / "v3-commit.bin").read_bytes())
