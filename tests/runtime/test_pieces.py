"""Incremental rollups (DESIGN.md §9, :mod:`persist.indexed.state.pieces`): a rollup rewrites
only the pieces whose collections changed, its bytes independent of the untouched ones; what
it stores reads back whole (and ``persist verify`` agrees); retired pieces are collected with
their rollups; a location of whole-state rollups rolls up to manifests; a writer killed between
a rollup's pieces and its manifest loses nothing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.blob.base import Blob
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.errors import ChecksumMismatch, Corruption, Indeterminate
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.maintenance.verify import verify
from persist.indexed.state import pieces, refs
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import Overlay
from persist.location import resolve
from persist.runtime.client import Client
from tests.nemesis.seam_writer import OPTIONS, RID
from tests.nemesis.test_crashpoints import _check_recovery, _parse
from tests.runtime.pieces_writer import OTHERS
from tests.runtime.test_trim import _open
from tests.support.engine import stop_leaving_its_log
from tests.support.recording import RecordingBlob

ROOT = Path(__file__).resolve().parents[2]


#: Inline parts (every collection's metadata carries its rows, as a small append's does),
#: rollups every 8 commits, no automatic maintenance (the test runs each round).
OPTS = Options(rollup_every=8, gc_grace_seconds=3600.0, inline_threshold=4096)


def _populate(client: Client, n: int) -> None:
    for i in range(n):
        w, _ = client.create_or_load(f"c{i}", key_type=pa.int64(), value_type=pa.int64())
        w.append([((i, j), 0, 1) for j in range(20)], 1).result()
    client.maintain()


def _touch(client: Client, name: str, commits: int) -> None:
    w, r = client.create_or_load(name, key_type=pa.int64(), value_type=pa.int64())
    for _ in range(commits):
        t = r.upper
        w.append([((-t, t), t, 1)], t + 1).result()


def _rows(client: Client, name: str) -> int:
    """The rows of collection ``name`` as of its newest time."""
    _, r = client.create_or_load(name, key_type=pa.int64(), value_type=pa.int64())
    return len(r.snapshot(r.upper - 1).to_arrow())


def _named(blob: Blob) -> set[str]:
    """The pieces every stored manifest names."""
    named: set[str] = set()
    for key in blob.list_keys(layout.ROLLUP_PREFIX):
        data = blob.get(key)
        assert data is not None
        if meta.is_manifest(key, data):
            named |= {p.key for p in meta.decode_manifest(key, data).pieces}
    return named


def _rollup_bytes_one_changed(n: int) -> tuple[int, int, int]:
    """At a location of ``n`` collections: (bytes a rollup writes after commits to one
    collection, pieces it writes, bytes of every piece of the state)."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    client = _open(blob, name, OPTS)
    try:
        _populate(client, n)
        _touch(client, "c0", OPTS.rollup_every)
        client.maintain()  # the first manifest: every piece written
        whole = blob.bytes_written(layout.PIECE_PREFIX)
        blob.reset()
        _touch(client, "c1", OPTS.rollup_every)
        client.maintain()
        rollups = blob.keys_written(layout.ROLLUP_PREFIX)
        assert len(rollups) == 1, rollups
        written = blob.bytes_written(layout.ROLLUP_PREFIX) + blob.bytes_written(layout.PIECE_PREFIX)
        return written, len(blob.keys_written(layout.PIECE_PREFIX)), whole
    finally:
        client.stop()


def test_rollup_bytes_follow_what_changed_not_the_number_of_collections() -> None:
    small, small_pieces, small_whole = _rollup_bytes_one_changed(130)
    big, big_pieces, big_whole = _rollup_bytes_one_changed(1040)
    # one piece rewritten either way (the changed collection's), the rest referenced
    assert small_pieces == big_pieces == 1
    assert big_whole > 6 * small_whole
    # what grows with the collections is the manifest alone: a reference per piece (about
    # 56 bytes; 8 pieces at 130 collections, 64 at 1,040)
    assert big - small < (pieces.buckets_for(1040) - pieces.buckets_for(130)) * 100
    assert big < big_whole / 10


def test_a_manifest_reads_back_whole_and_verifies_clean() -> None:
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 200)
        for i in range(3):
            _touch(client, f"c{i * 7}", OPTS.rollup_every)
            client.maintain()
        want = client.state
    finally:
        client.stop()
    key = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    data = blob.get(key)
    assert data is not None
    assert meta.is_manifest(key, data)
    m = meta.decode_manifest(key, data)
    assert m.buckets == pieces.buckets_for(200) > 1
    assert len(m.pieces) == m.buckets
    # an older rollup's pieces not referenced any more are listed for the trim
    assert m.dropped
    assert all(d.key not in {p.key for p in m.pieces} for d in m.dropped)
    state = Machine(blob.read_only()).load()
    assert len(state.collections) == 200
    assert state.collections == want.collections
    report = verify(blob.read_only())
    assert report.problems == []
    # a piece whose bytes are not the ones its name says is corruption, found by verify
    victim = m.pieces[0].key
    inner = blob.get(victim)
    assert inner is not None
    blob.set(victim, meta.encode_piece({}))
    assert any(victim in p for p in verify(blob.read_only()).problems)
    blob.set(victim, inner)


def test_retired_pieces_and_rollups_are_collected() -> None:
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    opts = Options(rollup_every=8, gc_grace_seconds=0.0, inline_threshold=4096)
    client = _open(blob, name, opts)
    try:
        _populate(client, 200)
        for i in range(30):
            _touch(client, f"c{i}", opts.rollup_every)
            client.maintain()
        client.maintain()
        assert _rows(client, "c5") == 20 + opts.rollup_every
    finally:
        client.stop()
    rollups = blob.list_keys(layout.ROLLUP_PREFIX)
    stored = set(blob.list_keys(layout.PIECE_PREFIX))
    newest = meta.decode_manifest(rollups[-1], blob.get(rollups[-1]) or b"")
    # 30 rollups wrote about 30 pieces beyond the first 4: all but those the retained
    # rollups name are gone
    named = _named(blob)
    assert len(rollups) <= 2
    assert stored == named, (sorted(stored - named)[:3], sorted(named - stored)[:3])
    assert len(stored) <= 2 * newest.buckets
    assert verify(blob.read_only()).problems == []


def test_orphan_pieces_are_swept_and_named_ones_kept() -> None:
    """A crash between a rollup's pieces and its manifest leaves pieces no rollup names: the
    writer's sweep deletes them once they stayed so for its grace, and nothing a rollup names."""
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 100)
        for i in range(2):
            _touch(client, f"c{i}", OPTS.rollup_every)
            client.maintain()
    finally:
        client.stop()
    before = set(blob.list_keys(layout.PIECE_PREFIX))
    orphan = layout.piece_key(pieces.digest(b"orphan"))
    blob.set(orphan, meta.encode_piece({}))
    machine = Machine(blob)
    machine.load()
    assert machine.pieces.sweep(blob, 60.0, now=0.0) == []  # first seen: not yet
    assert orphan in blob.list_keys(layout.PIECE_PREFIX)
    assert machine.pieces.sweep(blob, 60.0, now=61.0) == [orphan]
    assert set(blob.list_keys(layout.PIECE_PREFIX)) == before
    assert verify(blob.read_only()).problems == []
    assert len(Machine(blob.read_only()).load().collections) == 100


def test_a_location_of_whole_rollups_rolls_up_to_manifests(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    monkeypatch.setattr(pieces, "COLLECTIONS_PER_PIECE", 1 << 20)  # as a persist before it
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 150)
        _touch(client, "c3", OPTS.rollup_every)
        client.maintain()
    finally:
        client.stop()
    old = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert not meta.is_manifest(old, blob.get(old) or b"")
    monkeypatch.undo()
    client = _open(blob, name, OPTS)
    try:
        _touch(client, "c4", OPTS.rollup_every)
        client.maintain()
    finally:
        client.stop()
    new = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert meta.is_manifest(new, blob.get(new) or b"")
    client = _open(blob, name, OPTS)
    try:
        for i in (3, 4, 149):
            _, r = client.create_or_load(f"c{i}", key_type=pa.int64(), value_type=pa.int64())
            rows = 20 + (OPTS.rollup_every if i in (3, 4) else 0)
            assert len(r.snapshot(r.upper - 1).to_arrow()) == rows
    finally:
        client.stop()
    assert verify(blob.read_only()).problems == []


def test_a_persist_before_manifests_refuses_one(monkeypatch: pytest.MonkeyPatch) -> None:
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 130)
        _touch(client, "c0", OPTS.rollup_every)
        client.maintain()
    finally:
        client.stop()
    monkeypatch.setattr(meta, "FORMAT_VERSION", meta.REFS_FORMAT_VERSION)
    with pytest.raises(persist.IncompatibleFormat):
        Machine(blob.read_only()).load()


def _spawn(location: Path, seam: str, n: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PERSIST_CRASH_AT=f"{seam}:{n}")
    return subprocess.Popen([sys.executable, "-m", "tests.runtime.pieces_writer",
                             str(location)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)


@pytest.mark.crash
@pytest.mark.parametrize(("seam", "n"), [("rollup.pieces_written", 1),
                                    ("rollup.pieces_written", 5),
                                    ("rollup.written", 5), ("trim.log_deleted", 60)])
def test_a_writer_killed_in_an_incremental_rollup_loses_nothing(
        seam: str, n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # NB: the reopening writer buckets as the child did (two collections a piece): with the
    # default 32, 13 collections fit one bucket and its rollup is a whole State whenever the
    # child died before its first manifest, which made the check below depend on timing.
    monkeypatch.setattr(pieces, "COLLECTIONS_PER_PIECE", 2)
    location = tmp_path / "loc"
    proc = _spawn(location, seam, n)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (
        f"{seam}:{n} was not reached (exit {proc.returncode}): {err.decode()[-2000:]}")
    acked, tried = _parse(out)
    _check_recovery(location, acked, tried)  # every acknowledged write; verify is clean
    blob = FileBlob(str(location))
    others = b'{"others": true}' in out
    with persist.open(location, reentrance_id=RID, options=OPTIONS) as client:
        for i in range(OTHERS if others else 0):
            _, r = client.create_or_load(f"x{i}", key_type=pa.int64(), value_type=pa.int64())
            assert r.snapshot(0).to_python() == [((i, i), 0, 1)]
        client.maintain()
    newest = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    if others:  # killed after the 13 collections were acknowledged: its rollups are manifests
        assert meta.is_manifest(newest, blob.get(newest) or b"")


@pytest.mark.s3
def test_incremental_rollups_on_s3(aws_options: dict[str, Any], bucket: str) -> None:
    """The same on S3 (the moto server): pieces written in parallel, a replica reads them,
    verify agrees."""
    url = f"s3://{bucket}/pieces-{uuid.uuid4().hex}"
    so = {**aws_options, "lock": "s3"}
    with persist.open(url, reentrance_id="w", storage_options=so, options=OPTS) as client:
        _populate(client, 70)
        for name in ("c1", "c2"):
            _touch(client, name, OPTS.rollup_every)
            client.maintain()
    loc = resolve(url, storage_options=so)
    blob = loc.read_half()
    newest = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    assert meta.is_manifest(newest, bytes(blob.get(newest) or b""))
    with persist.open(url, read_only=True, storage_options=so) as replica:
        assert len(replica.collections) == 70
        _, r = replica.create_or_load("c2", key_type=pa.int64(), value_type=pa.int64())
        assert len(r.snapshot(r.upper - 1).to_arrow()) == 20 + OPTS.rollup_every
    assert verify(blob, url=url).problems == []


def _counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the pieces decoded from now on, in order."""
    seen: list[str] = []
    plain = meta.decode_piece

    def counted(key: str, data: bytes) -> meta.Piece:
        seen.append(key)
        return plain(key, data)

    monkeypatch.setattr(meta, "decode_piece", counted)
    return seen


def _manifest(blob: Blob) -> meta.Manifest:
    key = blob.list_keys(layout.ROLLUP_PREFIX)[-1]
    data = blob.get(key)
    assert data is not None
    assert meta.is_manifest(key, bytes(data))
    return meta.decode_manifest(key, bytes(data))


def _piece_of(m: meta.Manifest, name: str) -> str:
    b = pieces.bucket_of(name, m.buckets)
    return next(r.key for r in m.pieces if r.bucket == b)


def _in_another_piece(m: meta.Manifest, *names: str) -> str:
    taken = {pieces.bucket_of(n, m.buckets) for n in names}
    return next(f"c{i}" for i in range(200) if pieces.bucket_of(f"c{i}", m.buckets) not in taken)


def test_a_writer_open_reads_every_piece_and_decodes_only_those_it_uses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lazy pieces (DESIGN.md §4): an open reads (or has a background thread read) every
    piece of its manifest once, and decodes only those of the collections the log after the
    rollup touches; a lookup decodes its one
    piece; commits and a rollup of one collection decode nothing more and write one piece;
    the first maintenance round (which plans every collection after an open) decodes the rest,
    each once, into the state an eager load reads."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 200)
        _touch(client, "c0", OPTS.rollup_every)
        client.maintain()  # a manifest
        m = _manifest(blob)
        assert len(m.pieces) == m.buckets == 8
        _touch(client, "c1", 3)  # after the rollup: replayed at the next open
    finally:
        stop_leaving_its_log(client)
    decoded = _counting_decodes(monkeypatch)
    blob.reset()
    client = _open(blob, name, OPTS)
    try:
        # the open read the piece its replay used; once open (``persist.open`` starts it, as
        # here), the rest are read in the background: each once, its envelope's crc checked
        assert blob.keys_read(layout.PIECE_PREFIX) == [_piece_of(m, "c1")]
        client._ix.machine.start_prefetch()
        prefetch = client._ix.machine.prefetch
        assert prefetch is not None
        prefetch.result(timeout=30)
        assert sorted(blob.keys_read(layout.PIECE_PREFIX)) == sorted(r.key for r in m.pieces)
        assert decoded == [_piece_of(m, "c1")]
        state = client.state
        assert len(state.collections) == 200
        assert "c1" in state.collections
        other = _in_another_piece(m, "c1")
        assert state.collections[other].name == other
        assert decoded == [_piece_of(m, "c1"), _piece_of(m, other)]
        # commits to c1 and a rollup of them: no other piece decoded, one piece written
        _touch(client, "c1", OPTS.rollup_every)
        blob.reset()
        engine = client._ix
        assert engine.maybe_rollup()
        assert len(decoded) == 2
        assert blob.keys_written(layout.PIECE_PREFIX) == [_piece_of(_manifest(blob), "c1")]
        assert len(blob.keys_written(layout.ROLLUP_PREFIX)) == 1
        client.maintain()
        assert sorted(decoded) == sorted(r.key for r in m.pieces)  # each once
        eager = Machine(blob.read_only()).load()
        assert isinstance(eager.collections, dict)
        assert dict(client.state.collections.items()) == eager.collections
        assert list(client.state.collections) == list(eager.collections)
        assert "nope" not in client.state.collections
    finally:
        client.stop()


@pytest.mark.parametrize("with_fork", [False, True])
def test_an_open_replaying_a_retirement_decodes_only_the_pieces_holding_forks(
        with_fork: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that retires a blob looks for the forks that may still read it. The manifest
    counts each piece's forks (``PieceRef.forks``), so an open replaying such a commit
    decodes the pieces it touches and those holding forks, not every piece; and a fork's blob
    is still kept (the piece holding the fork is decoded and asked)."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    opts = Options(rollup_every=8, gc_grace_seconds=3600.0, inline_threshold=0)
    client = _open(blob, name, opts)
    try:
        _populate(client, 200)
        fork = "f"
        if with_fork:
            # a fork of c1 as of now: it reads c1's first blob, which c1's merge retires
            client.fork("c1", into=fork).result()
        _touch(client, "c0", opts.rollup_every)
        client.maintain()  # a manifest, counting the forks of every piece
        m = _manifest(blob)
        assert m.forked == ({pieces.bucket_of(fork, m.buckets): 1} if with_fork else {})
        _touch(client, "c1", 4)  # then c1's 5 blob parts merge, retiring blobs
        client.maintain()
        retired = {r.key for r in client.state.retired}
        assert any(r.seq > m.seq for r in client.state.retired), "nothing retired after it"
        assert client.state.seq - m.seq < opts.rollup_every  # no round rolled up since
        shared = ({p.blob_key for p in client.state.collections[fork].parts} if with_fork
                  else set())
    finally:
        stop_leaving_its_log(client)  # as a killed writer: the next open replays the merge
    decoded = _counting_decodes(monkeypatch)
    client = _open(blob, name, opts)
    try:
        want = {_piece_of(m, "c1")} | ({_piece_of(m, fork)} if with_fork else set())
        assert set(decoded) == want, (decoded, want)
        assert {r.key for r in client.state.retired} == retired
        assert not shared & retired  # the fork still reads them
        assert _rows(client, "c1") == 24  # 20 rows at 0, then 4 one-row appends
    finally:
        client.stop()


def test_a_piece_whose_forks_disagree_with_its_manifest_is_refused() -> None:
    """The count of forks a manifest gives a piece is checked when the piece is decoded, as
    its count of collections and size are."""
    members = {"c": meta.CollectionMeta(id=1, name="c", key_type=b"", value_type=b"")}
    data = meta.encode_piece(members)
    ref = meta.PieceRef(bucket=pieces.bucket_of("c", 1), key=layout.piece_key(pieces.digest(data)),
                        count=1, nbytes=len(data))
    held = pieces.Held(ref, 7, 1, fetch=lambda: data, forks=1)
    with pytest.raises(Corruption, match=r"holds 0 forks; .* says 1"):
        held.members("c")
    honest = pieces.Held(ref, 7, 1, fetch=lambda: data, forks=0)
    assert honest.where(refs.is_fork) == []
    assert not honest.decoded  # the manifest's count answered it
    assert list(honest.members()) == ["c"]
    uncounted = pieces.Held(ref, 7, 1, fetch=lambda: data)
    assert uncounted.where(refs.is_fork) == []
    assert uncounted.decoded  # nothing to go by: decoded to find out
    # a manifest that counts forks in a piece it does not name is refused as it is read
    manifest = meta.Manifest(seq=7, buckets=1, pieces=(ref,), forked={3: 1})
    with pytest.raises(Corruption, match="counts forks in pieces it does not name"):
        pieces.read_rollup(MemoryBlob("m"), layout.rollup_key(7), meta.encode_manifest(manifest))


def test_a_corrupt_piece_raises_at_the_first_use_of_its_collections(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A piece whose bytes pass the envelope's crc but do not decode into what the manifest
    says, a piece not stored, or one whose stored bytes fail the crc: the open (which does not use it) succeeds, and
    every use of one of its collections raises ``Corruption`` (``ChecksumMismatch``) naming
    the piece, its bucket and the collection, before anything of it is returned or
    committed; the other collections work."""
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 200)
        _touch(client, "c0", OPTS.rollup_every)
        client.maintain()
    finally:
        client.stop()
    m = _manifest(blob)
    victim = _in_another_piece(m, "c0")
    key = _piece_of(m, victim)
    good = blob.get(key)
    assert good is not None
    # undecodable; decodes, to the wrong count; not stored at all
    for bad in (b"\x93not a piece", meta.encode_piece({}), None):
        newest = _manifest(blob).seq
        if bad is None:
            blob.delete(key)
        else:
            blob.set(key, bad)
        client = _open(blob, name, OPTS)
        try:
            seq = client.state.seq
            for _ in range(2):  # and again: a failed piece is never trusted later
                with pytest.raises(pieces.PieceMissing if bad is None else Corruption) as e:
                    client.state.collections[victim]
                assert e.value.key == key
                assert f"collection {victim!r}" in str(e.value)
                b = pieces.bucket_of(victim, m.buckets)
                assert f"bucket {b} of rollup {newest}" in str(e.value)
            with pytest.raises(Corruption):
                client.create_or_load(victim, key_type=pa.int64(), value_type=pa.int64())
            assert client.state.seq == seq  # nothing committed
            _touch(client, "c0", 2)  # another piece's collection works
            assert client.state.seq == seq + 2
            _touch(client, "c0", OPTS.rollup_every)
            with pytest.raises(Corruption):  # a round plans every collection after an open
                client.maintain()
            if bad == meta.encode_piece({}):
                # its rollup was written all the same (the piece referenced, undecoded)
                assert _manifest(blob).seq == client.state.seq
                assert key in {r.key for r in _manifest(blob).pieces}
            else:  # no version to give the manifest: no rollup, every one raises
                assert _manifest(blob).seq < client.state.seq
            _touch(client, "c0", 1)
            assert client.state.seq == seq + 3 + OPTS.rollup_every
        finally:
            client.stop()
        blob.set(key, good)
    # a flipped byte in a piece's stored bytes: the read at the open checks the crc
    loc = tmp_path / "loc"
    fb = FileBlob(str(loc))
    for k in [*blob.list_keys(layout.META_PREFIX)]:
        got = blob.get(k)
        assert got is not None
        fb.set(k, bytes(got))
    path = loc / key
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw))
    client = _open(fb, name, OPTS)
    try:
        for _ in range(2):
            with pytest.raises(ChecksumMismatch) as e:
                client.state.collections[victim]
            assert e.value.key == key
            assert f"collection {victim!r}" in str(e.value)
        _touch(client, "c0", 1)
    finally:
        client.stop()


def _odd(c: meta.CollectionMeta) -> bool:
    return c.id % 2 == 1


def _ids(cs: Iterable[meta.CollectionMeta]) -> list[tuple[int, str, int]]:
    return [(c.id, c.name, len(c.parts)) for c in cs]


def test_a_lazy_map_reads_and_changes_as_the_eager_dict_does() -> None:
    """``pieces.Collections`` against the dict an eager load makes, under the same random
    sets, additions, deletions and re-additions, copied as replay copies: the same items in
    the same order, lengths, lookups, and by bucket the same members (what a rollup writes);
    a copy never changes the map it was copied from."""
    name = uuid.uuid4().hex
    blob = MemoryBlob(name)
    client = _open(blob, name, OPTS)
    try:
        _populate(client, 200)
        _touch(client, "c0", OPTS.rollup_every)
        client.maintain()
    finally:
        client.stop()
    lazy = Machine(blob.read_only(), lazy=True).load().collections
    eager = Machine(blob.read_only()).load().collections
    assert isinstance(lazy, pieces.Collections)
    assert isinstance(eager, dict)
    rng = random.Random(29)
    values = list(eager.values())
    names = [f"c{i}" for i in range(200)] + [f"new{i}" for i in range(40)]
    a: MutableMapping[str, meta.CollectionMeta] = lazy
    b: dict[str, meta.CollectionMeta] = dict(eager)
    for step in range(600):
        if step % 50 == 0:  # a commit's replay: a copy, the old map kept as it was
            before = list(a.items())
            a, b = pieces.copy_collections(a), dict(b)
        n = rng.choice(names)
        if rng.random() < 0.3 and n in b:
            del a[n]
            del b[n]
        else:
            c = rng.choice(values)
            a[n] = c
            b[n] = c
        assert (n in a) == (n in b)
        assert a.get(n) is b.get(n)
        if step % 50 == 49:
            assert len(a) == len(b)
            assert list(a.items()) == list(b.items())
            # a filter answered from each piece's kept answer and the names changed, alone
            # and under a working copy (``Overlay``) staging one more change
            assert isinstance(a, pieces.Collections)
            assert sorted(a.where_items(_odd)) == sorted(
                (k, c) for k, c in b.items() if _odd(c))
            o = Overlay(a)
            o[n] = values[step % len(values)]
            want = {**b, n: values[step % len(values)]}
            assert sorted(_ids(o.where(_odd))) == sorted(_ids(c for c in want.values() if _odd(c)))
    assert list(lazy.items()) == list(eager.items())  # the loaded map never changed
    assert before != list(a.items())
    assert isinstance(a, pieces.Collections)
    grouped = {k: (dict(v.members()) if isinstance(v, pieces.Held) else v)
               for k, v in a.grouped().items()}
    want: dict[int, dict[str, meta.CollectionMeta]] = {}
    for n, c in b.items():
        want.setdefault(pieces.bucket_of(n, a.buckets), {})[n] = c
    assert {k: list(v.items()) for k, v in grouped.items()} == {
        k: list(v.items()) for k, v in want.items()}


def test_pieces_only_thinned_rollups_named_go_half_a_grace_after_their_drop() -> None:
    """Appends to one collection rewrite its bucket's piece at every rollup. Inside a grace,
    the rollups between the kept ones are thinned, and the pieces only they named go half a
    grace after a newer rollup dropped them: what is stored is what a stored rollup names,
    verify agrees, and everything reads back and restores."""
    name = uuid.uuid4().hex
    blob = RecordingBlob(MemoryBlob(name))
    grace = 2.0  # rollups protected 0.5 s after their successor, pieces 1 s after their drop
    opts = Options(rollup_every=4, gc_grace_seconds=grace, inline_threshold=4096)
    client = _open(blob, name, opts)
    try:
        _populate(client, 100)
        mark = 0
        for i in range(40):
            _touch(client, "c0", opts.rollup_every)
            client.maintain()
            if i == 30:
                mark = client.state.seq
        time.sleep(grace / 2 + 0.1)
        client.maintain()
        written = set(blob.keys_written(layout.PIECE_PREFIX))
        stored = set(blob.inner.list_keys(layout.PIECE_PREFIX))
        named = _named(blob.inner)
        assert stored == named, (sorted(stored - named)[:3], sorted(named - stored)[:3])
        rollups = blob.inner.list_keys(layout.ROLLUP_PREFIX)
        assert len(stored) < len(written) // 2, (len(stored), len(written), len(rollups))
        assert verify(blob.inner.read_only()).problems == []
        assert _rows(client, "c0") == 20 + 40 * opts.rollup_every
        client.restore(mark)
        assert _rows(client, "c0") == 20 + 31 * opts.rollup_every
    finally:
        client.stop()
    assert len(Machine(blob.inner.read_only()).load().collections) == 100


class _StoresThenFails(RecordingBlob):
    """Stores a rollup and then reports failure, while ``fail`` is set: an indeterminate
    manifest write that landed."""

    fail = False

    def _set(self, key: str, data: Any) -> None:
        super()._set(key, data)
        if self.fail and key.startswith(layout.ROLLUP_PREFIX):
            raise Indeterminate(f"{key}: the reply was lost")


def test_a_manifest_write_that_failed_stops_the_early_piece_thinning() -> None:
    """A manifest whose write failed may be stored and name pieces its writer does not know it
    names: from then on the writer leaves every piece to the trim, and verify finds every
    piece a stored manifest names."""
    name = uuid.uuid4().hex
    blob = _StoresThenFails(MemoryBlob(name))
    grace = 2.0
    opts = Options(rollup_every=4, gc_grace_seconds=grace, inline_threshold=4096)
    client = _open(blob, name, opts)
    try:
        _populate(client, 100)
        buckets = pieces.buckets_for(100)
        other = next(f"c{i}" for i in range(1, 100)
                     if pieces.bucket_of(f"c{i}", buckets) != pieces.bucket_of("c0", buckets))
        _touch(client, "c0", opts.rollup_every)
        blob.fail = True
        with pytest.raises(persist.PersistError):
            client.maintain()  # the manifest naming c0's new piece is stored nonetheless
        blob.fail = False
        # the next rollup writes that very piece again (c0 did not change since): its writer
        # would take it for one no rollup before named
        _touch(client, other, opts.rollup_every)
        client.maintain()
        for _ in range(10):
            _touch(client, "c0", opts.rollup_every)
            client.maintain()
        time.sleep(grace / 2 + 0.1)
        client.maintain()
        stored = set(blob.inner.list_keys(layout.PIECE_PREFIX))
        assert _named(blob.inner) <= stored
        assert verify(blob.inner.read_only()).problems == []
    finally:
        client.stop()
