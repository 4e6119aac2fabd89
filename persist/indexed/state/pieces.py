"""Incremental rollups: a rollup is a small manifest and the pieces holding its collections.

A location's collections are hashed by name into ``buckets`` buckets (:func:`bucket_of`, a
power of two sized so a bucket holds about :data:`COLLECTIONS_PER_PIECE` collections,
:func:`buckets_for`). A rollup stores each bucket's collections as one immutable
:class:`~persist.indexed.format.meta.Piece` at ``meta/piece/<digest>`` (named by the blake2b
digest of its bytes), and a :class:`~persist.indexed.format.meta.Manifest` at
``meta/rollup/<seq>`` listing them beside the location-level fields of the state. A writer
remembers the pieces of the newest rollup and the collections each holds (:class:`Pieces`):
the next rollup rewrites only the buckets one of whose collections changed (another object
in the state, or another set of names) and references the others, so its bytes follow what
changed, not how many collections there are (DESIGN.md §9).

Durability: every piece is durable before the manifest naming it is written (a manifest is
published only after ``set`` of each of its pieces returned), so a manifest never names a
piece that is not stored. A crash in between leaves orphan pieces no manifest names;
:meth:`Pieces.sweep` deletes them once they stayed unreferenced for the leaked-blob grace.

GC: a manifest also lists the pieces an older rollup still references (``dropped``), each
with the first rollup seq that no longer does. The metadata trim deletes the rollups below a
rollup ``R`` that is a grace period old; the pieces dropped at or below ``R`` go with them
(:meth:`Pieces.collect`), and are forgotten by the next manifest. Until the trim, a reader of
an older rollup finds every piece it names. Retained metadata is then the live pieces (one
rollup's worth) plus the pieces rewritten within a grace period.

A location with one bucket's worth of collections keeps writing whole ``State`` rollups (the
bytes of every persist before this), until it first grows past it; from then on it writes
manifests (an older persist refuses them with ``IncompatibleFormat``).
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from persist import crashpoints, layout
from persist.blob.base import Blob, BlobRead
from persist.errors import Corruption, ExternalError
from persist.indexed.format import meta
from persist.indexed.format.meta import (
    CollectionMeta,
    Dropped,
    Manifest,
    PieceRef,
    State,
    Trim,
)

T = TypeVar("T")

#: At most how many collections one piece holds on average: a rollup of a location with one
#: changed collection writes one piece of about this many (at ~4.5 KB of metadata per
#: collection with an inline part, ~70-140 KB) plus the manifest (~56 bytes per piece: 512
#: pieces, ~29 KB, at 10,000 collections). Smaller pieces shrink the first and grow the
#: second, and the GETs of an open (DESIGN.md §4).
COLLECTIONS_PER_PIECE = 32
#: Pieces read or written at once (a file store's fsyncs and an object store's requests
#: overlap; the decoding holds the GIL either way).
IO_THREADS = 8


def buckets_for(n: int) -> int:
    """The number of buckets for ``n`` collections: the smallest power of two giving at most
    :data:`COLLECTIONS_PER_PIECE` per bucket on average (a power of two, so growing the
    location rewrites every piece only at each doubling)."""
    need = max(1, -(-n // COLLECTIONS_PER_PIECE))
    return 1 << (need - 1).bit_length()


@functools.lru_cache(maxsize=1 << 16)
def bucket_of(name: str, buckets: int) -> int:
    """The bucket of collection ``name`` among ``buckets``: stable across processes
    (crc32 of its UTF-8 name)."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % buckets


def digest(data: bytes) -> str:
    """The name of a piece whose stored bytes are ``data``: their blake2b digest (hex)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class PieceMissing(Corruption):
    """A manifest names a piece that is not stored (trimmed under a slow reader, or lost)."""


@dataclass(frozen=True)
class Rollup:
    """A rollup as read: the state, its trim record, and (a manifest) the manifest and each
    bucket's collections."""

    state: State
    trim: Trim | None
    manifest: Manifest | None = None
    groups: dict[int, tuple[int, dict[str, CollectionMeta]]] | None = None


def _direct(read: Callable[[str], T], key: str) -> T:
    return read(key)


def read_rollup(blob: BlobRead, key: str, data: bytes, *,
                retry: Callable[[Callable[[str], bytes | None], str], bytes | None] = _direct,
                check: bool = False) -> Rollup:
    """Reads the rollup stored at ``key`` whose bytes are ``data``: a whole state, or a
    manifest and its pieces (read in parallel).

    Args:
        retry: how to read one piece (``retry(blob.get, key)``): a loader's retrying read.
        check: also check each piece's digest and that each of its collections belongs to
            its bucket (``persist verify``).

    Raises:
        PieceMissing: a piece the manifest names is not stored.
        Corruption, IncompatibleFormat: a record persist cannot trust.
        ExternalError: storage failed.
    """
    if not meta.is_manifest(key, data):
        state, trim = meta.decode_rollup(key, data)
        return Rollup(state, trim)
    manifest = meta.decode_manifest(key, data)
    refs = manifest.pieces

    def fetch(ref: PieceRef) -> bytes:
        got = retry(blob.get, ref.key)
        if got is None:
            raise PieceMissing(ref.key, f"rollup {manifest.seq} names piece {ref.key} "
                                        f"(bucket {ref.bucket}), which is not stored")
        return got

    datas = _map(fetch, refs)
    collections: dict[str, CollectionMeta] = {}
    groups: dict[int, tuple[int, dict[str, CollectionMeta]]] = {}
    for ref, got in zip(refs, datas, strict=True):
        if check:
            _check_piece(manifest, ref, got)
        piece = meta.decode_piece(ref.key, got)
        groups[ref.bucket] = (piece.version, piece.collections)
        collections.update(piece.collections)
    if len(collections) != sum(r.count for r in refs):
        raise Corruption(key, f"rollup manifest {manifest.seq}: its pieces hold "
                              f"{len(collections)} distinct collections, it counts "
                              f"{sum(r.count for r in refs)}")
    state = State(seq=manifest.seq, epoch=manifest.epoch, writer=manifest.writer,
                  wall_ms=manifest.wall_ms, next_cid=manifest.next_cid,
                  collections=collections, retired=manifest.retired,
                  log_from=manifest.log_from)
    trim = None if isinstance(manifest.trim, msgspec.UnsetType) else manifest.trim
    return Rollup(state, trim, manifest, groups)


def _check_piece(manifest: Manifest, ref: PieceRef, data: bytes) -> None:
    if layout.piece_key(digest(data)) != ref.key:
        raise Corruption(ref.key, "piece bytes do not match the digest it is named by")
    piece = meta.decode_piece(ref.key, data)
    if len(piece.collections) != ref.count or len(data) != ref.nbytes:
        raise Corruption(ref.key, f"piece holds {len(piece.collections)} collections in "
                                  f"{len(data)} bytes; rollup {manifest.seq} says "
                                  f"{ref.count} in {ref.nbytes}")
    stray = [n for n in piece.collections if bucket_of(n, manifest.buckets) != ref.bucket]
    if stray:
        raise Corruption(ref.key, f"piece of bucket {ref.bucket} holds collections of "
                                  f"other buckets: {stray[:5]}")


def _map(fn: Callable[[T], bytes], items: Iterable[T]) -> list[bytes]:
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(min(IO_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


@dataclass(frozen=True)
class _Held:
    """A piece of the newest rollup: its reference, format version and collections."""

    ref: PieceRef
    version: int
    members: dict[str, CollectionMeta]


def _same(old: dict[str, CollectionMeta], new: dict[str, CollectionMeta]) -> bool:
    if old.keys() != new.keys():
        return False
    # NB: a collection no op touched is the same object in every later state (replay copies
    # the map, not its values); equality is the fallback for one rebuilt unchanged.
    return all(new[n] is c or new[n] == c for n, c in old.items())


class Pieces:
    """What a writer knows of the newest rollup's pieces, to write the next one incrementally
    and to collect the pieces no rollup references any more (see the module doc)."""

    def __init__(self) -> None:
        """Knows no piece: the newest rollup is whole, or none exists."""
        #: The newest rollup's bucket count (0: it is a whole state, or there is none).
        self.buckets = 0
        #: That rollup's seq (0: none known).
        self.seq = 0
        self.held: dict[int, _Held] = {}
        #: Pieces older rollups reference and the newest does not: key -> the first rollup
        #: seq that does not.
        self.dropped: dict[str, int] = {}
        self._first_seen: dict[str, float] = {}
        # NB: the maintenance thread writes and collects while the commit thread may reload
        # (which calls ``loaded``): they meet only under this lock.
        self._lock = threading.Lock()

    def loaded(self, rollup: Rollup | None) -> None:
        """Takes in the rollup a load started from (None: none)."""
        with self._lock:
            if rollup is not None and rollup.state.seq < self.seq:
                # NB: a reload that listed the rollups before this writer's newest one was
                # written: what it holds is newer, and its ``dropped`` complete.
                return
            if rollup is None or rollup.manifest is None or rollup.groups is None:
                self.buckets, self.held, self.dropped = 0, {}, {}
                self.seq = 0 if rollup is None else rollup.state.seq
                return
            m = rollup.manifest
            self.buckets, self.seq = m.buckets, m.seq
            self.held = {r.bucket: _Held(r, rollup.groups[r.bucket][0],
                                         rollup.groups[r.bucket][1]) for r in m.pieces}
            self.dropped = {d.key: d.seq for d in m.dropped}

    def write(self, blob: Blob, state: State, trim: Trim | None) -> str:
        """Stores the rollup of ``state`` recording ``trim``: whole while the location fits
        one bucket and never had a manifest, else the pieces that changed (each durable
        first) and then the manifest. Returns the rollup's key.

        Raises:
            ExternalError: a write failed; no manifest was written (pieces written before it
                are orphans, rewritten or swept later).
        """
        key = layout.rollup_key(state.seq)
        buckets = buckets_for(len(state.collections))
        with self._lock:
            known, held, dropped = self.buckets, dict(self.held), dict(self.dropped)
        if buckets == 1 and known == 0:
            blob.set(key, meta.encode_rollup(state, trim))
            with self._lock:
                self.seq = max(self.seq, state.seq)
            return key
        groups: dict[int, dict[str, CollectionMeta]] = {}
        for name, c in state.collections.items():
            groups.setdefault(bucket_of(name, buckets), {})[name] = c
        now: dict[int, _Held] = {}
        fresh: list[tuple[str, bytes]] = []
        for b in sorted(groups):
            members = groups[b]
            old = held.get(b) if buckets == known else None
            if old is not None and _same(old.members, members):
                now[b] = old
                continue
            data = meta.encode_piece(members)
            ref = PieceRef(bucket=b, key=layout.piece_key(digest(data)), count=len(members),
                           nbytes=len(data))
            now[b] = _Held(ref, meta.version_of(ref.key, data), members)
            fresh.append((ref.key, data))
        _map(lambda kd: _store(blob, kd), fresh)
        crashpoints.hit("rollup.pieces_written")
        live = {h.ref.key for h in now.values()}
        dropped = {k: s for k, s in dropped.items() if k not in live}
        for h in held.values():
            if h.ref.key not in live:
                dropped.setdefault(h.ref.key, state.seq)
        version = max((h.version for h in now.values()), default=meta.MANIFEST_FORMAT_VERSION)
        manifest = Manifest(
            version=max(version, meta.MANIFEST_FORMAT_VERSION), seq=state.seq,
            epoch=state.epoch, writer=state.writer, wall_ms=state.wall_ms,
            next_cid=state.next_cid, retired=state.retired, buckets=buckets,
            pieces=tuple(now[b].ref for b in sorted(now)),
            dropped=tuple(Dropped(k, s) for k, s in sorted(dropped.items())),
            trim=msgspec.UNSET if trim is None else trim, log_from=state.log_from)
        blob.set(key, meta.encode_manifest(manifest))
        with self._lock:
            self.buckets, self.held, self.dropped = buckets, now, dropped
            self.seq = max(self.seq, state.seq)
        return key

    def collect(self, blob: Blob, upto: int) -> int:
        """Deletes the pieces no rollup from ``upto`` on references, once the rollups below
        ``upto`` are deleted (the metadata trim to ``upto``); returns how many it deleted.

        Raises:
            ExternalError: a delete failed; what was deleted stays forgotten.
        """
        with self._lock:
            ripe = sorted(k for k, s in self.dropped.items() if s <= upto)
        for key in ripe:
            blob.delete(key)
            with self._lock:
                self.dropped.pop(key, None)
        return len(ripe)

    def sweep(self, blob: Blob, grace_seconds: float, now: float | None = None) -> list[str]:
        """Deletes orphan pieces: listed, named by neither the newest rollup nor its
        ``dropped``, and so for ``grace_seconds`` (a crash between a rollup's pieces and its
        manifest, or a manifest whose write failed). Returns the keys deleted.

        Only the writer calls this, between its own rollups (the maintenance thread), so no
        rollup of its own is in flight.

        Raises:
            ExternalError: the listing or the first delete failed.
        """
        now = time.monotonic() if now is None else now
        listed = blob.list_keys(layout.PIECE_PREFIX)
        with self._lock:
            if self.buckets == 0 and not listed:
                return []
            named = {h.ref.key for h in self.held.values()} | self.dropped.keys()
        orphans = {k for k in listed if k not in named}
        self._first_seen = {k: t for k, t in self._first_seen.items() if k in orphans}
        for k in orphans:
            self._first_seen.setdefault(k, now)
        ripe = sorted(k for k, t in self._first_seen.items() if now - t >= grace_seconds)
        deleted: list[str] = []
        for k in ripe:
            try:
                blob.delete(k)
            except ExternalError:
                if not deleted:
                    raise
                break
            del self._first_seen[k]
            deleted.append(k)
        return deleted


def _store(blob: Blob, kd: tuple[str, bytes]) -> bytes:
    blob.set(kd[0], kd[1])
    return b""
