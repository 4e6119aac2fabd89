"""Storage format version 7 (the sharded log) stays readable forever, a location of an older
format is sharded by the first writer of this persist, and a persist that predates it refuses
a sharded location whichever way it reads it: these bytes were written by the persist that
introduced it (``make_golden_v7``)."""

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
from persist.cli.inspect import describe
from persist.errors import IncompatibleFormat
from persist.indexed.engine import Indexed
from persist.indexed.format import columnar, meta
from persist.indexed.maintenance.verify import verify
from persist.indexed.state.machine import Machine
from persist.location import resolve
from tests.golden.make_golden_v5 import expected_of
from tests.golden.make_golden_v7 import HEAD
from tests.golden.records_v7 import fixed_sharded_manifest, fixed_sharded_state, fixed_switch

HERE = Path(__file__).parent


def test_records_and_keys_are_pinned() -> None:
    commit = (HERE / "v7-commit.bin").read_bytes()
    state = (HERE / "v7-state.bin").read_bytes()
    manifest = (HERE / "v7-manifest.bin").read_bytes()
    assert meta.encode(fixed_switch()) == commit
    assert meta.encode(fixed_sharded_state()) == state
    assert meta.encode_manifest(fixed_sharded_manifest()) == manifest
    assert meta.decode_commit(layout.log_key(8), commit) == msgspec.structs.replace(
        fixed_switch(), version=7)
    # a whole state of version 7 is told from a manifest by its fields, not its version
    key = layout.rollup_key(7)
    assert not meta.is_manifest(key, state)
    assert meta.is_manifest(key, manifest)
    got, trim = meta.decode_rollup(key, state)
    assert got.log_from == 5
    assert trim == fixed_sharded_state().trim
    assert meta.decode_manifest(key, manifest) == fixed_sharded_manifest()
    assert meta.SHARDED_LOG_FORMAT_VERSION == 7
    # the keys: flat below the switch, in shards of 1,024 from it on, sorting by seq
    assert layout.LOG_SHARD == 1024
    assert layout.log_key(8, 9) == "meta/log/00000000000000000008"
    assert layout.log_key(9, 9) == "meta/log/s00000000000000000000/00000000000000000009"
    assert layout.log_key(1500, 9) == "meta/log/s00000000000000001024/00000000000000001500"
    keys = [layout.log_key(s, 9) for s in (1, 8, 9, 1023, 1024, 2047, 2048, 10**7)]
    assert sorted(keys) == keys


def test_v7_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v7-location", loc)
    expected = json.loads((HERE / "v7-expected.json").read_text())
    with persist.open(loc, read_only=True) as replica:
        assert expected_of(replica) == expected
    blob = FileBlob(loc)
    shards = sorted(p.name for p in (loc / layout.LOG_PREFIX).iterdir())
    assert shards == ["s00000000000000000000", "s00000000000000001024"]
    probed = Machine(blob.read_only()).load()
    assert probed.seq > HEAD
    assert meta.log_from(probed) == 2
    assert Machine(blob).load() == probed  # a writer's load: listed after its rollup
    assert verify(blob.read_only()).problems == []
    assert describe(resolve(str(loc)))["format_version"] == 7
    with persist.open(loc, reentrance_id="golden") as client:
        w, r = client.create_or_load("c0", key_type=pa.string(), value_type=pa.int64())
        w.append([(("new", 1), r.upper, 1)], upper=r.upper + 1).result()
        client.maintain()
    assert verify(blob.read_only()).problems == []


def test_an_older_persist_refuses_a_sharded_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta, "FORMAT_VERSION", 6)
    for blob in (FileBlob(HERE / "v7-location").read_only(), FileBlob(HERE / "v7-location")):
        with pytest.raises(IncompatibleFormat, match="format version 7"):
            Indexed.open(blob)  # at its newest rollup, before any log entry
    for name in ("v7-commit.bin", "v7-state.bin"):
        with pytest.raises(IncompatibleFormat):
            meta.decode_commit(layout.log_key(8), (HERE / name).read_bytes())
    with pytest.raises(IncompatibleFormat):
        meta.decode_manifest(layout.rollup_key(7), (HERE / "v7-manifest.bin").read_bytes())


def test_a_location_of_an_older_format_is_sharded_and_then_refused_by_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The v6 golden location (a flat log): this persist's first writer shards it with its
    fence, stored at the flat key an older writer of that seq would create; an older persist
    then stops there, reading (a probe) or writing (a listing, or its own commit of that
    seq), and at the next rollup."""
    # NB: its appends as plain streams, so its records are the sharded log's (a compressed
    # inline part would make them format 9, test_golden_v9)
    monkeypatch.setattr(columnar, "INLINE_PACK_SHARE", 0.0)
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v6-location", loc)
    blob = FileBlob(loc)
    before = Machine(blob).load()
    assert meta.log_from(before) is None
    no_rollups = persist.Options(rollup_every=1 << 20, background_compaction=False)
    with persist.open(loc, reentrance_id="golden", options=no_rollups) as client:
        w, r = client.create_or_load("c0", key_type=pa.string(), value_type=pa.int64())
        for _ in range(3):
            w.append([(("after", 1), r.upper, 1)], upper=r.upper + 1).result()
    # NB: what the writer left, read as a writer does (its GC may have committed on its way out)
    writer_state = Machine(blob).load()
    switch = before.seq + 1
    assert meta.log_from(writer_state) == switch + 1
    flat = blob.get(layout.log_key(switch))
    assert flat is not None
    assert meta.version_of("k", flat) == 7
    assert blob.get(layout.log_key(switch + 1, switch + 1)) is not None  # sharded from here
    assert Machine(blob.read_only()).load() == writer_state

    with monkeypatch.context() as m:
        m.setattr(meta, "FORMAT_VERSION", 6)
        for store in (blob.read_only(), blob):  # a probe, a listing
            with pytest.raises(IncompatibleFormat, match="format version 7"):
                Machine(store).load()
        # an older writer that loaded before the switch commits that seq: the key exists,
        # and the entry it finds there is refused (it never commits beside it)
        late = meta.Commit(seq=switch, epoch=before.epoch, writer="old", wall_ms=0)
        with pytest.raises(IncompatibleFormat):
            Machine(blob).commit(late, None)

    with persist.open(loc, reentrance_id="golden",
                      options=persist.Options(rollup_every=1)) as client:
        client.maintain()  # a rollup now: a manifest of version 7
    newest = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert meta.version_of(newest, bytes(blob.get(newest) or b"")) == 7
    with monkeypatch.context() as m:
        m.setattr(meta, "FORMAT_VERSION", 6)
        with pytest.raises(IncompatibleFormat, match="format version 7"):
            Machine(blob.read_only()).load()
    assert verify(blob.read_only()).problems == []
