"""Storage format version 9 (compressed inline parts) stays readable forever, and a persist
that predates it refuses such a location rather than fail on its parts: these bytes were
written by the persist that introduced it (``make_golden_v9``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat
from persist.indexed.engine import Indexed
from persist.indexed.format import columnar, meta
from persist.indexed.maintenance.verify import verify
from tests.golden.make_golden_v8 import expected_of
from tests.golden.records_v9 import (
    PACKED,
    PACKED_ROWS,
    fixed_packed_append,
    fixed_packed_state,
)

HERE = Path(__file__).parent


def test_records_are_pinned() -> None:
    commit = (HERE / "v9-commit.bin").read_bytes()
    state = (HERE / "v9-state.bin").read_bytes()
    assert meta.encode(fixed_packed_append()) == commit
    assert meta.encode(fixed_packed_state()) == state
    assert meta.decode_commit(layout.log_key(9), commit) == msgspec.structs.replace(
        fixed_packed_append(), version=9)
    got = meta.decode_state(layout.rollup_key(9), state)
    assert got == msgspec.structs.replace(fixed_packed_state(), version=9)
    part = got.collections["packed"].parts[0]
    assert part.packed
    assert part.inline == PACKED
    table = columnar.decode_part("p9", PACKED, columnar.part_schema(pa.int64(), pa.int64()))
    assert [((r["key"], r["value"]), r["time"], r["diff"]) for r in table.to_pylist()] == \
        PACKED_ROWS
    assert meta.PACKED_FORMAT_VERSION == meta.FORMAT_VERSION == 9


def test_v9_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v9-location", loc)
    expected = json.loads((HERE / "v9-expected.json").read_text())
    with persist.open(loc, read_only=True) as replica:
        c = replica.state.collections["c0"]
        assert c.parts
        assert all(p.packed for p in c.parts)
        assert expected_of(replica) == expected
    assert verify(FileBlob(loc).read_only()).problems == []
    with persist.open(loc, reentrance_id="golden") as client:
        w, r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        w.append([((5000, 1), r.upper, 1)], upper=r.upper + 1).result()
        w.allow_compaction(r.upper - 1).result()
        client.maintain()
        assert expected_of(client)["c0"]["snapshots"][str(r.upper - 1)][-1] == [5000, 1, 1]
    assert verify(FileBlob(loc).read_only()).problems == []


def test_v9_location_logs_its_appends_as_version_9() -> None:
    blob = FileBlob(HERE / "v9-location").read_only()
    versions: dict[int, tuple[int, bool]] = {}
    for key in blob.list_keys(layout.LOG_PREFIX):
        data = blob.get(key)
        assert data is not None
        commit = meta.decode_commit(key, bytes(data))
        parts = [op.part for op in commit.ops if isinstance(op, meta.AddPart)]
        versions[commit.seq] = (commit.version, bool(parts) and all(p.packed for p in parts))
    appends = [v for v, packed in versions.values() if packed]
    assert len(appends) == 3
    assert set(appends) == {9}
    # the fence and the registration hold no part: they keep their older versions
    assert all(v < 9 for v, packed in versions.values() if not packed)


def test_an_older_persist_refuses_the_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta, "FORMAT_VERSION", 8)
    with pytest.raises(IncompatibleFormat, match="format version 9"):
        Indexed.open(FileBlob(HERE / "v9-location").read_only())
    for name in ("v9-commit.bin", "v9-state.bin"):
        with pytest.raises(IncompatibleFormat, match="format version 9"):
            meta.decode_commit(layout.log_key(9), (HERE / name).read_bytes())
