"""Storage format version 9 (compressed inline parts) stays readable forever, and a persist
that predates it refuses such a location rather than fail on its parts: these bytes were
written by the persist that introduced it (``make_golden_v9``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat
from persist.indexed.engine import Indexed
from persist.indexed.format import columnar, meta
from persist.indexed.format.meta import CollectionMeta
from tests.golden.pinning import pinned_records, reads_identically
from tests.golden.records_v9 import (
    PACKED,
    PACKED_ROWS,
    fixed_packed_append,
    fixed_packed_state,
)

HERE = Path(__file__).parent


def test_records_are_pinned() -> None:
    got = pinned_records(9, fixed_packed_append(), fixed_packed_state())
    part = got.collections["packed"].parts[0]
    assert part.packed
    assert part.inline == PACKED
    table = columnar.decode_part("p9", PACKED, columnar.part_schema(pa.int64(), pa.int64()))
    assert [((r["key"], r["value"]), r["time"], r["diff"]) for r in table.to_pylist()] == \
        PACKED_ROWS
    assert meta.PACKED_FORMAT_VERSION == meta.FORMAT_VERSION == 9


def _packed(c: CollectionMeta) -> None:
    assert c.parts
    assert all(p.packed for p in c.parts)


def test_v9_location_reads_identically(tmp_path: Path) -> None:
    reads_identically(9, tmp_path, _packed)


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
