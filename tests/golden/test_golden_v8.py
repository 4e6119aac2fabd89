"""Storage format version 8 (marks: compaction's marks step) stays readable forever, and a
persist that predates it refuses a marked location rather than read the rows its marks hide:
these bytes were written by the persist that introduced it (``make_golden_v8``)."""

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
from persist.indexed.format import meta
from persist.indexed.maintenance.verify import verify
from tests.golden.make_golden_v8 import expected_of
from tests.golden.records_v8 import fixed_marked_state, fixed_marks_step, unmarked_part

HERE = Path(__file__).parent


def test_records_are_pinned() -> None:
    commit = (HERE / "v8-commit.bin").read_bytes()
    state = (HERE / "v8-state.bin").read_bytes()
    assert meta.encode(fixed_marks_step()) == commit
    assert meta.encode(fixed_marked_state()) == state
    assert meta.decode_commit(layout.log_key(9), commit) == msgspec.structs.replace(
        fixed_marks_step(), version=8)
    got = meta.decode_state(layout.rollup_key(9), state)
    assert got == msgspec.structs.replace(fixed_marked_state(), version=8)
    marked = got.collections["marked"].parts[0]
    assert marked.marks is not None
    assert marked.marks.count == 2
    assert marked.blob_key == unmarked_part().blob_key
    assert meta.MARKS_FORMAT_VERSION == 8 < meta.FORMAT_VERSION
    # an unmarked part keeps its bytes (marks omitted while None)
    assert b"marks" not in meta.encode(msgspec.structs.replace(
        fixed_marked_state(), collections={}))


def test_v8_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v8-location", loc)
    expected = json.loads((HERE / "v8-expected.json").read_text())
    with persist.open(loc, read_only=True) as replica:
        c = replica.state.collections["c0"]
        assert any(p.marks is not None and p.marks.count for p in c.parts)
        assert expected_of(replica) == expected
    assert verify(FileBlob(loc).read_only()).problems == []
    with persist.open(loc, reentrance_id="golden") as client:
        w, r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        w.append([((5000, 1), r.upper, 1)], upper=r.upper + 1).result()
        w.allow_compaction(r.upper - 1).result()
        client.maintain()
        assert expected_of(client)["c0"]["snapshots"][str(r.upper - 1)][-1] == [5000, 1, 1]
    assert verify(FileBlob(loc).read_only()).problems == []


def test_an_older_persist_refuses_a_marked_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta, "FORMAT_VERSION", 7)
    with pytest.raises(IncompatibleFormat, match="format version 8"):
        Indexed.open(FileBlob(HERE / "v8-location").read_only())
    for name in ("v8-commit.bin", "v8-state.bin"):
        with pytest.raises(IncompatibleFormat, match="format version 8"):
            meta.decode_commit(layout.log_key(9), (HERE / name).read_bytes())
