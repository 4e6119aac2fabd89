"""Storage format version 1 stays readable forever: these bytes were written by persist 0.1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

from persist import layout
from persist.blob import envelope
from persist.blob.file import FileBlob
from persist.errors import Corruption, IncompatibleFormat
from persist.indexed.format import columnar, meta
from tests.golden.records import fixed_commit, fixed_state
from tests.support.engine import Engine

HERE = Path(__file__).parent


def test_commit_bytes_are_pinned() -> None:
    golden = (HERE / "v1-commit.bin").read_bytes()
    assert meta.encode(fixed_commit()) == golden
    assert meta.decode_commit(layout.log_key(7), golden) == fixed_commit()


def test_state_bytes_are_pinned() -> None:
    golden = (HERE / "v1-state.bin").read_bytes()
    assert meta.encode(fixed_state()) == golden
    assert meta.decode_state(layout.rollup_key(7), golden) == fixed_state()


def test_v1_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v1-location", loc)
    expected = json.loads((HERE / "v1-expected.json").read_text())
    ix = Engine.open(FileBlob(loc).read_only())
    assert ix.state.seq > 0
    assert any(p.blob_key for c in ix.state.collections.values() for p in c.parts)
    for name, by_time in expected.items():
        c = ix.state.collections[name]
        assert sorted(int(t) for t in by_time) == list(range(c.since, c.upper))
        for t, rows in by_time.items():
            got = [[repr(k), repr(v), d] for (k, v), _, d in ix.snapshot(name, int(t)).to_python()]
            assert got == rows, (name, t)


def test_newer_metadata_version_is_refused() -> None:
    newer = msgspec.structs.replace(fixed_commit(), version=meta.FORMAT_VERSION + 1)
    with pytest.raises(IncompatibleFormat, match="upgrade persist"):
        meta.decode_commit(layout.log_key(7), meta.encode(newer))
    state = msgspec.structs.replace(fixed_state(), version=meta.FORMAT_VERSION + 1)
    with pytest.raises(IncompatibleFormat):
        meta.decode_state(layout.rollup_key(7), meta.encode(state))


def test_newer_envelope_version_is_refused() -> None:
    framed = bytearray(bytes(envelope.frame("k", b"payload")))
    framed[4] = envelope.ENVELOPE_VERSION + 1
    # keep the header checksum valid so only the version is "wrong"
    import struct

    import crc32c

    struct.pack_into("<I", framed, 20, crc32c.crc32c(bytes(framed[:16])))
    with pytest.raises(IncompatibleFormat):
        envelope.unframe("k", bytes(framed))


def test_newer_part_version_is_refused() -> None:
    schema = columnar.part_schema(pa.int64(), pa.int64())
    table = pa.table({"key": [1], "value": [2], "time": pa.array([0], pa.uint64()),
                      "diff": [1]}).cast(schema)
    newer = table.replace_schema_metadata({b"persist.part": b"99"})
    with pytest.raises(IncompatibleFormat):
        columnar.decode_part("p", columnar.encode_part(newer), schema)
    with pytest.raises(Corruption, match="format tag"):
        columnar.decode_part("p", columnar.encode_part(table.replace_schema_metadata({})), schema)
