"""Storage format version 6 (incremental rollups: a manifest naming pieces) stays readable
forever, and a persist that predates it refuses it: these bytes were written by the persist
that introduced it (``make_golden_v6``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.cli.inspect import describe
from persist.errors import Corruption, IncompatibleFormat
from persist.indexed.engine import Indexed
from persist.indexed.format import meta
from persist.indexed.maintenance.verify import verify
from persist.indexed.state import pieces
from persist.location import resolve
from tests.golden.make_golden_v5 import expected_of
from tests.golden.make_golden_v6 import COLLECTIONS
from tests.golden.records import fixed_state
from tests.golden.records_v6 import fixed_manifest, fixed_piece

HERE = Path(__file__).parent
KEY = layout.rollup_key(7)


def test_manifest_and_piece_bytes_are_pinned() -> None:
    manifest = (HERE / "v6-manifest.bin").read_bytes()
    piece = (HERE / "v6-piece.bin").read_bytes()
    assert meta.encode_manifest(fixed_manifest()) == manifest
    assert meta.encode_piece(fixed_piece()) == piece
    assert meta.decode_manifest(KEY, manifest) == fixed_manifest()
    assert meta.is_manifest(KEY, manifest)
    decoded = meta.decode_piece(layout.piece_key(pieces.digest(piece)), piece)
    assert decoded.version == meta.MANIFEST_FORMAT_VERSION == 6
    assert decoded.collections == fixed_state().collections


def test_a_manifest_is_never_read_as_a_whole_state() -> None:
    """Read as a ``State`` a manifest would be a location without collections."""
    with pytest.raises(Corruption, match="manifest"):
        meta.decode_state(KEY, (HERE / "v6-manifest.bin").read_bytes())


def test_v6_location_reads_identically(tmp_path: Path) -> None:
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v6-location", loc)
    expected = json.loads((HERE / "v6-expected.json").read_text())
    with persist.open(loc, read_only=True) as replica:
        assert expected_of(replica) == expected
        assert len(replica.collections) == COLLECTIONS
    blob = FileBlob(loc)
    newest = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert meta.is_manifest(newest, bytes(blob.get(newest) or b""))
    assert verify(blob.read_only()).problems == []
    info = describe(resolve(str(loc)))
    assert info["format_version"] == 6
    assert info["rollup_pieces"] == len(blob.list_keys(layout.PIECE_PREFIX)) > 0
    assert len(info["collections"]) == COLLECTIONS
    # a writer of today opens it, writes, and rolls up on the same pieces
    with persist.open(loc, reentrance_id="golden") as client:
        w, r = client.create_or_load("c5", key_type=pa.string(), value_type=pa.int64())
        w.append([(("new", 1), r.upper, 1)], upper=r.upper + 1).result()
        client.maintain()
    assert verify(blob.read_only()).problems == []


def test_an_older_persist_refuses_the_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """A persist that reads up to version 5 stops at the manifest, before it could read it as
    a location without collections."""
    monkeypatch.setattr(meta, "FORMAT_VERSION", 5)
    with pytest.raises(IncompatibleFormat, match="format version 6"):
        Indexed.open(FileBlob(HERE / "v6-location").read_only())
    with pytest.raises(IncompatibleFormat):
        meta.decode_manifest(KEY, (HERE / "v6-manifest.bin").read_bytes())
    with pytest.raises(IncompatibleFormat):
        meta.decode_piece(layout.piece_key("00"), (HERE / "v6-piece.bin").read_bytes())
