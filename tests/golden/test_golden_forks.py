"""A manifest that counts its pieces' forks (``Manifest.forked``, DESIGN.md §9): its bytes are
pinned, a manifest without the counts keeps its bytes and reads as "not counted", and a
persist that predates the field reads the same manifest from it (a field it ignores)."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.indexed.format import meta
from persist.indexed.format.meta import Dropped, PieceRef, Retired, Trim
from tests.golden.records_v6 import fixed_counted_manifest, fixed_manifest

HERE = Path(__file__).parent
KEY = layout.rollup_key(7)


class _ManifestBeforeForks(msgspec.Struct, frozen=True, kw_only=True):
    """``Manifest`` as a persist before the count decodes it (the same fields, no counts)."""

    version: int = meta.MANIFEST_FORMAT_VERSION
    seq: int = 0
    epoch: int = 0
    writer: str = ""
    wall_ms: int = 0
    next_cid: int = 1
    retired: tuple[Retired, ...] = ()
    buckets: int = 1
    pieces: tuple[PieceRef, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    trim: Trim | msgspec.UnsetType = msgspec.UNSET
    log_from: int | msgspec.UnsetType = msgspec.UNSET


def test_a_manifest_counting_forks_is_pinned() -> None:
    golden = (HERE / "forks-manifest.bin").read_bytes()
    assert meta.encode_manifest(fixed_counted_manifest()) == golden
    assert meta.decode_manifest(KEY, golden) == fixed_counted_manifest()
    assert meta.decode_manifest(KEY, golden).forked == {1: 2}


def test_a_manifest_without_counts_keeps_its_bytes_and_reads_as_unknown() -> None:
    golden = (HERE / "v6-manifest.bin").read_bytes()
    assert meta.encode_manifest(fixed_manifest()) == golden
    assert meta.decode_manifest(KEY, golden).forked is msgspec.UNSET


def test_a_persist_before_the_count_reads_the_same_manifest() -> None:
    golden = (HERE / "forks-manifest.bin").read_bytes()
    assert msgspec.msgpack.decode(golden, type=meta._Versioned).version == 6  # no version bump
    old = msgspec.msgpack.decode(golden, type=_ManifestBeforeForks)
    want = fixed_manifest()
    assert msgspec.structs.asdict(old) == {
        f: getattr(want, f) for f in _ManifestBeforeForks.__struct_fields__}


def test_a_location_rolled_up_before_the_counts_gets_them_at_its_next_rollup(
        tmp_path: Path) -> None:
    """The version-6 golden location's manifests count nothing; the next rollup a writer of
    today writes counts every piece's forks (none there), decoding the pieces it must."""
    loc = tmp_path / "loc"
    shutil.copytree(HERE / "v6-location", loc)
    blob = FileBlob(loc)
    before = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert meta.decode_manifest(before, bytes(blob.get(before) or b"")).forked is msgspec.UNSET
    with persist.open(loc, reentrance_id="golden",
                      options=persist.Options(rollup_every=1)) as client:
        w, r = client.create_or_load("c5", key_type=pa.string(), value_type=pa.int64())
        w.append([(("new", 1), r.upper, 1)], upper=r.upper + 1).result()
        client.maintain()
        want = len(client.collections)
    newest = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert newest != before
    manifest = meta.decode_manifest(newest, bytes(blob.get(newest) or b""))
    assert manifest.forked == {}
    with persist.open(loc, read_only=True) as replica:
        assert len(replica.collections) == want
