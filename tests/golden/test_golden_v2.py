"""Storage format version 2 (records) stays readable forever: these bytes were written by the
persist that introduced it (``make_golden_v2``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec

from persist import layout
from persist.blob.file import FileBlob
from persist.indexed.format import meta
from tests.golden.records_v2 import Order, fixed_commit, fixed_state
from tests.support.engine import Engine

HERE = Path(__file__).parent


def test_commit_bytes_are_pinned() -> None:
    golden = (HERE / "v2-commit.bin").read_bytes()
    assert meta.encode(fixed_commit()) == golden
    decoded = meta.decode_commit(layout.log_key(7), golden)
    assert decoded.version == 2
    assert decoded == msgspec.structs.replace(fixed_commit(), version=2)


def test_state_bytes_are_pinned() -> None:
    golden = (HERE / "v2-state.bin").read_bytes()
    assert meta.encode(fixed_state()) == golden
    decoded = meta.decode_state(layout.rollup_key(7), golden)
    assert decoded == msgspec.structs.replace(fixed_state(), version=2)


def test_v2_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v2-location", loc)
    expected = json.loads((HERE / "v2-expected.json").read_text())
    ix = Engine.open(FileBlob(loc).read_only())
    assert any(p.blob_key for c in ix.state.collections.values() for p in c.parts)
    assert meta.required_version(ix.state) == 2
    for name, by_time in expected.items():
        c = ix.state.collections[name]
        assert sorted(int(t) for t in by_time) == list(range(c.since, c.upper))
        for t, rows in by_time.items():
            got = ix.snapshot(name, int(t)).to_python()
            assert [[repr(k), repr(v), d] for (k, v), _, d in got] == rows, (name, t)
            if name == "orders":
                assert all(isinstance(v, Order) for (_, v), _, _ in got)


def test_v2_location_logs_only_records_as_version_2() -> None:
    blob = FileBlob(HERE / "v2-location")
    versions = {}
    for key in blob.list_keys(layout.LOG_PREFIX):
        data = blob.get(key)
        assert data is not None
        commit = meta.decode_commit(key, bytes(data))
        registers = [op.collection.name for op in commit.ops if isinstance(op, meta.Register)]
        versions[tuple(registers)] = commit.version
    assert versions[("orders",)] == 2
    assert versions[("keyed",)] == 2
    assert versions[("plain",)] == 1
    assert versions[()] == 1
