"""Storage format version 4 (Parquet parts) stays readable forever: these bytes were written by
the persist that introduced it (``make_golden_v4``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import crc32c
import msgspec
import pyarrow.parquet as pq
import pytest

from persist import layout
from persist.blob.file import FileBlob
from persist.errors import IncompatibleFormat, SchemaMismatch
from persist.indexed.format import evolve, meta, sorting
from persist.indexed.maintenance.verify import verify
from tests.golden.records_v4 import fixed_commit, fixed_state, plain
from tests.support.engine import Engine

HERE = Path(__file__).parent


def test_commit_bytes_are_pinned() -> None:
    golden = (HERE / "v4-commit.bin").read_bytes()
    assert meta.encode(fixed_commit()) == golden
    decoded = meta.decode_commit(layout.log_key(7), golden)
    assert decoded.version == 4
    assert decoded == msgspec.structs.replace(fixed_commit(), version=4)


def test_state_bytes_are_pinned() -> None:
    golden = (HERE / "v4-state.bin").read_bytes()
    assert meta.encode(fixed_state()) == golden
    decoded = meta.decode_state(layout.rollup_key(7), golden)
    assert decoded == msgspec.structs.replace(fixed_state(), version=4)
    part = decoded.collections["plain"].parts[1]
    assert (part.parquet, part.checksum, part.sorted) == (True, 0x01234567, True)


def test_v4_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v4-location", loc)
    expected = json.loads((HERE / "v4-expected.json").read_text())
    ix = Engine.open(FileBlob(loc).read_only())
    assert meta.required_version(ix.state) == 4
    assert any(p.inline is not None for p in ix.state.collections["plain"].parts)
    for name, by_version in expected.items():
        c = ix.state.collections[name]
        assert sorted(int(v) for v in by_version) == list(range(evolve.version(c) + 1))
        for v, by_time in by_version.items():
            assert sorted(int(t) for t in by_time) == list(range(c.since, c.upper))
            for t, want in by_time.items():
                snap = ix.snapshot(name, int(t), schema_id=int(v))
                if want == "SchemaMismatch":
                    with pytest.raises(SchemaMismatch):
                        snap.to_arrow()
                    continue
                got = snap.to_arrow()
                assert {col: plain(got.column(col)) for col in want} == want, (name, v, t)


def test_every_blob_part_is_a_sorted_parquet_file() -> None:
    blob = FileBlob(HERE / "v4-location")
    state = Engine.open(blob.read_only()).state
    seen = {"int64": 0, "uint64": 0}
    for c in state.collections.values():
        for p in c.parts:
            if p.blob_key is None:
                continue
            path = HERE / "v4-location" / p.blob_key
            data = path.read_bytes()
            assert (p.parquet, p.sorted) == (True, True)
            assert crc32c.crc32c(data) == p.checksum
            f = pq.ParquetFile(path, page_checksum_verification=True)
            kv = f.metadata.metadata
            assert kv[b"persist.part"] == b"4"
            assert int(kv[b"persist.schema_id"]) == evolve.part_version(p)
            seen[kv[b"persist.time"].decode()] += 1
            table = f.read()
            assert len(table) == p.rows
            assert sorting.is_sorted(Engine.open(blob.read_only()).reader.read(
                p, evolve.View.of(c).schemas.part_schema(evolve.part_version(p))))
    assert seen["int64"]
    assert seen["uint64"]


def test_v4_location_logs_parquet_parts_as_version_4() -> None:
    blob = FileBlob(HERE / "v4-location")
    by_kind: dict[str, set[int]] = {}
    for key in blob.list_keys(layout.LOG_PREFIX):
        data = blob.get(key)
        assert data is not None
        commit = meta.decode_commit(key, bytes(data))
        parts = [p for op in commit.ops for p in getattr(op, "added", ())]
        parts += [op.part for op in commit.ops if isinstance(op, meta.AddPart)]
        kind = ("parquet" if any(p.parquet for p in parts) else
                "evolve" if any(isinstance(op, meta.EvolveSchema) for op in commit.ops) else
                "other")
        by_kind.setdefault(kind, set()).add(commit.version)
    assert by_kind["parquet"] == {4}
    assert by_kind["evolve"] == {3}
    assert by_kind["other"] == {1, 2}  # registers of plain types and of records, seals


def test_verify_finds_no_problems() -> None:
    report = verify(FileBlob(HERE / "v4-location").read_only())
    assert report.problems == []
    assert report.data_blobs > 0


def test_an_older_persist_refuses_the_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """A persist that reads up to version 3 stops at the first version-4 record, before it
    could read a Parquet part as an enveloped Arrow stream."""
    monkeypatch.setattr(meta, "FORMAT_VERSION", 3)
    with pytest.raises(IncompatibleFormat, match="format version 4"):
        Engine.open(FileBlob(HERE / "v4-location").read_only())
    with pytest.raises(IncompatibleFormat):
        meta.decode_commit(layout.log_key(7), (HERE / "v4-commit.bin").read_bytes())
