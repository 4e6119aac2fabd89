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
an older rollup finds every piece it names. Before that, a piece this writer wrote that only
rollups the trim thinned named goes half a grace after its drop (:meth:`Pieces.thin`).
Retained metadata is then the live pieces (one rollup's worth), the pieces of the rollups kept
within a grace, and the pieces rewritten within half a grace.

A location with one bucket's worth of collections keeps writing whole ``State`` rollups (the
bytes of every persist before this), until it first grows past it; from then on it writes
manifests (an older persist refuses them with ``IncompatibleFormat``).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from persist import crashpoints, layout
from persist.blob.base import Blob, BlobRead
from persist.errors import Corruption, ExternalError, IncompatibleFormat, PersistError
from persist.indexed.format import meta
from persist.indexed.format.meta import (
    CollectionMeta,
    Dropped,
    Manifest,
    PieceRef,
    State,
    Trim,
)
from persist.indexed.state.refs import is_fork

T = TypeVar("T")
U = TypeVar("U")

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
    bucket's piece as held in memory."""

    state: State
    trim: Trim | None
    manifest: Manifest | None = None
    held: dict[int, Held] | None = None


def _direct(read: Callable[[str], T], key: str) -> T:
    return read(key)


def read_rollup(blob: BlobRead, key: str, data: bytes, *,
                retry: Callable[[Callable[[str], bytes | None], str], bytes | None] = _direct,
                check: bool = False, lazy: bool = False) -> Rollup:
    """Reads the rollup stored at ``key`` whose bytes are ``data``: a whole state, or a
    manifest and its pieces (read in parallel).

    Args:
        retry: how to read one piece (``retry(blob.get, key)``): a loader's retrying read.
        check: also check each piece's digest and that each of its collections belongs to
            its bucket (``persist verify``).
        lazy: read and decode each piece only when one of its collections is first used:
            the state's collections are then a :class:`Collections` (what a writer's or
            replica's :class:`Machine` loads, and reads every piece of in the background
            right after, :func:`prefetch`). What is left for the first use is what an eager
            read does here: reading the piece if nothing has yet (its envelope's crc checked),
            decoding and checking it (:meth:`Held.members`); its failure is then raised to
            that use. Without it, every piece is read, decoded and checked here.

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

    counts = None if isinstance(manifest.forked, msgspec.UnsetType) else manifest.forked
    named = {r.bucket: r.count for r in refs}
    if counts is not None and not all(0 < n <= named.get(b, 0) for b, n in counts.items()):
        raise Corruption(key, f"rollup manifest {manifest.seq} counts forks in pieces it does "
                              f"not name, or more than they hold: {counts}")

    def forked(ref: PieceRef) -> int | None:
        return None if counts is None else counts.get(ref.bucket, 0)

    held: dict[int, Held] = {}
    for ref in refs:
        if ref.bucket in held or not 0 <= ref.bucket < manifest.buckets:
            raise Corruption(key, f"rollup manifest {manifest.seq} names bucket {ref.bucket} "
                                  f"twice or outside its {manifest.buckets}")
        held[ref.bucket] = Held(ref, manifest.seq, manifest.buckets,
                                fetch=functools.partial(fetch, ref), forks=forked(ref))
    colls = Collections(manifest.buckets, held)
    if not lazy:
        datas = _map(fetch, refs)
        for ref, got in zip(refs, datas, strict=True):
            if check:
                _check_piece(manifest, ref, got, forked(ref))
            held[ref.bucket].read(bytes(got))
        collections: dict[str, CollectionMeta] = {}
        for h in held.values():
            collections.update(h.members())
        if len(collections) != sum(r.count for r in refs):
            raise Corruption(key, f"rollup manifest {manifest.seq}: its pieces hold "
                                  f"{len(collections)} distinct collections, it counts "
                                  f"{sum(r.count for r in refs)}")
    state = State(seq=manifest.seq, epoch=manifest.epoch, writer=manifest.writer,
                  wall_ms=manifest.wall_ms, next_cid=manifest.next_cid,
                  collections=colls if lazy else collections, retired=manifest.retired,
                  log_from=manifest.log_from)
    trim = None if isinstance(manifest.trim, msgspec.UnsetType) else manifest.trim
    return Rollup(state, trim, manifest, held)


def prefetch(held: Iterable[Held]) -> Future[None]:
    """Reads every piece of ``held`` not read yet, in a background thread (which reads
    :data:`IO_THREADS` at a time); a piece that fails to be read is left to its first use.
    Returns a future done when each was read or failed to be."""
    held = [h for h in held if not h.read_once]
    done: Future[None] = Future()
    if not held:
        done.set_result(None)
        return done

    def run() -> None:
        try:
            _map(lambda h: h.prefetch(), held)
        except RuntimeError:  # the interpreter is exiting: no new threads; nothing to do
            pass
        finally:
            done.set_result(None)

    threading.Thread(target=run, name="persist-pieces-prefetch", daemon=True).start()
    return done


def _check_piece(manifest: Manifest, ref: PieceRef, data: bytes, forks: int | None) -> None:
    if layout.piece_key(digest(data)) != ref.key:
        raise Corruption(ref.key, "piece bytes do not match the digest it is named by")
    _decode_piece(ref, manifest.buckets, data, f"rollup {manifest.seq}", forks)


def _decode_piece(ref: PieceRef, buckets: int, data: bytes, by: str,
                  forks: int | None = None) -> meta.Piece:
    """The piece ``ref`` names, decoded from ``data``, checked against what the rollup
    (``by``) says of it: its collections' count, its size, every collection of its bucket,
    and the forks among them (``forks``; None: not counted, :attr:`Manifest.forked`).

    Raises:
        Corruption: it is not the piece ``ref`` describes.
    """
    piece = meta.decode_piece(ref.key, data)
    if len(piece.collections) != ref.count or len(data) != ref.nbytes:
        raise Corruption(ref.key, f"piece holds {len(piece.collections)} collections in "
                                  f"{len(data)} bytes; {by} says {ref.count} in "
                                  f"{ref.nbytes}")
    if forks is not None and _forks(piece.collections) != forks:
        raise Corruption(ref.key, f"piece holds {_forks(piece.collections)} forks; {by} "
                                  f"says {forks}")
    stray = [n for n in piece.collections if bucket_of(n, buckets) != ref.bucket]
    if stray:
        raise Corruption(ref.key, f"piece of bucket {ref.bucket} holds collections of "
                                  f"other buckets: {stray[:5]}")
    return piece


def _forks(members: Mapping[str, CollectionMeta]) -> int:
    """How many of ``members`` are forks (:attr:`Manifest.forked`)."""
    return sum(1 for c in members.values() if is_fork(c))


def _map(fn: Callable[[T], U], items: Iterable[T]) -> list[U]:
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    n = min(IO_THREADS, len(items))
    # NB: one task per thread, each a stride of the items, not one per item: a future per
    # piece cost more than the reads (512 pieces of 44 MB from a warm local file store: 75 ms
    # with a future each, most of it submitting against the GIL the readers held; the reads
    # alone 30 ms serially). An object store's requests still overlap n at a time.
    with ThreadPoolExecutor(n) as pool:
        try:
            futures = [pool.submit(lambda i: [fn(x) for x in items[i::n]], i)
                       for i in range(n)]
        except RuntimeError:
            # NB: the interpreter is exiting (a writer dropped at exit rolls up as its
            # finalizer stops it): no thread can start, so this thread does it all
            return [fn(x) for x in items]
        strides = [f.result() for f in futures]
    out: list[U] = [None] * len(items)  # type: ignore[list-item]
    for i, got in enumerate(strides):
        out[i::n] = got
    return out


#: Serializes the decoding of pieces (the commit thread and the maintenance thread may use
#: collections of one piece at once): each piece is decoded once, into one set of objects,
#: which the identity checks of :class:`Pieces` and the maintenance index rely on.
_DECODING = threading.Lock()


class Held:
    """A piece of a rollup as held in memory: its reference, and its collections, read and
    decoded at the first use of one of them (a piece named by a loaded manifest) or given (a
    piece just written).

    A piece of a manifest a load read lazily has a ``fetch`` (a retrying read of its stored
    bytes, whose envelope's crc32c the read checks, raising :class:`PieceMissing` if absent);
    a background thread calls :meth:`prefetch` on every such piece right after the load. The
    first use reads the piece if that has not, decodes it and checks what an eager load
    checks (the version, the msgpack, the count and size the manifest gives, every
    collection's bucket), and raises a typed error naming the piece, its bucket and rollup
    and the collection asked for, before any of its collections is returned. A piece that
    fails stays undecoded (and, if its read failed, unread): every later use tries again and
    raises again.
    """

    __slots__ = ("_data", "_fetch", "_members", "_reading", "_version", "_where", "buckets",
                 "forks", "ref", "seq")

    def __init__(self, ref: PieceRef, seq: int, buckets: int, *,
                 fetch: Callable[[], bytes] | None = None,
                 members: dict[str, CollectionMeta] | None = None,
                 version: int | None = None, forks: int | None = None) -> None:
        """Holds piece ``ref`` of rollup ``seq`` (of ``buckets`` buckets): read by ``fetch``
        (or given to :meth:`read`) and decoded at the first use, or its decoded ``members``
        and ``version``; ``forks``: how many of its collections are forks, as its manifest
        counts them (checked when it is decoded; None: not counted)."""
        assert (fetch is None) != (members is None)
        self.ref, self.seq, self.buckets = ref, seq, buckets
        self.forks = forks
        self._fetch = fetch
        self._data: bytes | None = None
        self._members, self._version = members, version
        self._reading = threading.Lock()
        self._where: dict[Callable[[CollectionMeta], bool],
                          list[tuple[str, CollectionMeta]]] = {}

    @property
    def decoded(self) -> bool:
        """Whether the collections are decoded (or were given)."""
        return self._members is not None

    @property
    def read_once(self) -> bool:
        """Whether the bytes were read (or the collections decoded or given)."""
        return self._data is not None or self._members is not None

    def read(self, data: bytes) -> None:
        """Takes the piece's stored bytes, read by the caller (an eager load)."""
        with self._reading:
            if self._members is None and self._data is None:
                self._data = data

    def prefetch(self) -> None:
        """Reads the piece's bytes if nothing has yet; a failure is left to the first use."""
        with contextlib.suppress(PersistError):
            self._bytes()

    def _bytes(self) -> bytes | None:
        """The stored bytes (read now if not yet), or None once decoded.

        Raises:
            PieceMissing, ChecksumMismatch, ExternalError: as the read (nothing kept).
        """
        data = self._data
        if data is not None or self._members is not None:
            return data
        with self._reading:
            if self._data is None and self._members is None:
                assert self._fetch is not None
                self._data = self._fetch()
            return self._data

    def version(self) -> int:
        """The piece's format version (read alone from its bytes if not decoded).

        Raises:
            Corruption: its bytes are not a record with a version, or cannot be read.
            ExternalError: storage failed reading it.
        """
        if self._version is None:
            data = self._bytes()
            if data is None:  # decoded meanwhile
                return self.version()
            self._version = meta.version_of(self.ref.key, data)
        return self._version

    def members(self, wanted: str | None = None) -> dict[str, CollectionMeta]:
        """The piece's collections (name -> metadata), read, decoded and checked at the first
        call; ``wanted``: the collection asked for (named by the error).

        Raises:
            Corruption: the piece is not stored, its bytes fail their crc, or it does not
                decode into what its manifest says.
            IncompatibleFormat: a format version newer than this persist reads.
            ExternalError: storage failed reading it (the next use reads again).
        """
        got = self._members
        if got is not None:
            return got
        with _DECODING:
            if self._members is None:
                try:
                    data = self._bytes()
                    assert data is not None
                    self._members, self._version = self._decode(data)
                except (Corruption, IncompatibleFormat) as e:
                    asked = "" if wanted is None else f", used for collection {wanted!r}"
                    what = (f"piece of bucket {self.ref.bucket} of rollup {self.seq}{asked}")
                    if isinstance(e, IncompatibleFormat):
                        raise IncompatibleFormat(f"{what}: {e}") from e
                    raise type(e)(self.ref.key, f"{what}: {e.detail}") from e
                self._data = None
            return self._members

    def where(self, pred: Callable[[CollectionMeta], bool]) -> list[tuple[str, CollectionMeta]]:
        """The piece's collections for which ``pred`` holds, with their names (computed once
        per predicate: the piece never changes).

        Raises:
            as :meth:`members`.
        """
        got = self._where.get(pred)
        if got is None:
            if pred is is_fork and self.forks == 0 and self._members is None:
                # NB: the manifest counted none (checked when the piece is decoded): a commit
                # that retires a blob looks for forks, and an open replaying one used to
                # decode every piece for them
                return []
            got = [(n, c) for n, c in self.members().items() if pred(c)]
            self._where[pred] = got
        return got

    def counted(self) -> Held:
        """This piece, its forks counted (:attr:`Manifest.forked`): if its manifest did not
        count them (an older persist's), it is decoded and they are (once per location: every
        rollup after counts them all)."""
        if self.forks is None:
            self.forks = _forks(self.members())
        return self

    def _decode(self, data: bytes) -> tuple[dict[str, CollectionMeta], int]:
        piece = _decode_piece(self.ref, self.buckets, data, "its rollup", self.forks)
        return piece.collections, piece.version


class _Gone:
    __slots__ = ()


_GONE = _Gone()


class Collections(MutableMapping[str, CollectionMeta]):
    """The collections of a state loaded from a manifest: the rollup's pieces, each decoded
    at the first use of one of its collections (:class:`Held`), under the names changed
    since (set, added or deleted).

    A copy shares the pieces (never mutated, decoded once whichever copy uses them) and copies
    the changed names: what a commit's replay costs follows the collections changed since
    the load, not how many there are. Lookups decode the one piece a name hashes to;
    iterating decodes every piece, ``len`` none (the manifest's counts, each checked when its
    piece is decoded). Iteration order is a dict's built by an eager load and the same
    changes: the pieces' collections by bucket (changed values in place), then the names
    added, in the order they were added.

    Invariant: a name is in the map iff it is a changed name holding a collection, or it is
    in the piece of its bucket and not a deleted name.
    """

    __slots__ = ("_added", "_count", "_over", "buckets", "held")

    def __init__(self, buckets: int, held: Mapping[int, Held],
                 over: dict[str, CollectionMeta | _Gone] | None = None,
                 added: dict[str, None] | None = None, count: int | None = None) -> None:
        """The collections of ``held`` (the pieces of ``buckets`` buckets), changed by
        ``over`` (a deleted name: ``_GONE``), ``added`` the names of ``over`` in no piece;
        ``count``: how many the pieces hold (default: the sum of their references')."""
        self.buckets, self.held = buckets, held
        self._over: dict[str, CollectionMeta | _Gone] = {} if over is None else over
        self._added: dict[str, None] = {} if added is None else added
        self._count = sum(h.ref.count for h in held.values()) if count is None else count

    def _base(self, name: str) -> CollectionMeta | None:
        h = self.held.get(bucket_of(name, self.buckets))
        return None if h is None else h.members(name).get(name)

    def __getitem__(self, name: str) -> CollectionMeta:
        v = self._over.get(name)
        if v is None:
            c = self._base(name)
            if c is None:
                raise KeyError(name)
            return c
        if isinstance(v, _Gone):
            raise KeyError(name)
        return v

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        v = self._over.get(name)
        if v is None:
            return self._base(name) is not None
        return not isinstance(v, _Gone)

    def __setitem__(self, name: str, c: CollectionMeta) -> None:
        v = self._over.get(name)
        if (v is None and self._base(name) is None) or isinstance(v, _Gone):
            # NB: a new name, or one deleted and set again: last, as in a dict
            self._added[name] = None
        self._over[name] = c

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._added.pop(name, None)
        if self._base(name) is None:
            del self._over[name]
        else:
            self._over[name] = _GONE

    def __iter__(self) -> Iterator[str]:
        for name, _ in self.items():
            yield name

    def __len__(self) -> int:
        gone = sum(1 for v in self._over.values() if isinstance(v, _Gone))
        # NB: an added name's piece was decoded when it was set
        again = sum(1 for n in self._added if self._base(n) is not None)
        return self._count - gone - again + len(self._added)

    def items(self) -> Iterator[tuple[str, CollectionMeta]]:  # type: ignore[override]
        """The names and collections, in iteration order (decodes every piece, read
        :data:`IO_THREADS` at a time)."""
        over, added = self._over, self._added
        if not all(h.read_once for h in self.held.values()):
            prefetch(self.held.values())
        for b in sorted(self.held):
            members = self.held[b].members()
            if not over:
                yield from members.items()
                continue
            for name, c in members.items():
                v = over.get(name, c)
                if not isinstance(v, _Gone) and name not in added:
                    yield name, v
        for name in list(added):
            v = over[name]
            assert not isinstance(v, _Gone)
            yield name, v

    def values(self) -> Iterator[CollectionMeta]:  # type: ignore[override]
        """The collections, in iteration order (decodes every piece)."""
        for _, c in self.items():
            yield c

    def keys(self) -> Iterator[str]:  # type: ignore[override]
        """The names, in iteration order (decodes every piece)."""
        return iter(self)

    def where(self, pred: Callable[[CollectionMeta], bool]) -> list[CollectionMeta]:
        """The collections for which ``pred`` holds (a pure function of one collection, the
        same object each call: each piece's answer is kept), in no particular order: a pass
        over the pieces' answers and the names changed, not over every collection (a commit
        that retires a blob looks for forks among all, ``refs.retired_of``)."""
        return [c for _, c in self.where_items(pred)]

    def where_items(self, pred: Callable[[CollectionMeta], bool]
                    ) -> list[tuple[str, CollectionMeta]]:
        """:meth:`where`, with the names."""
        over = self._over
        # NB: a name changed since the load (set, deleted, added) is answered by its value
        # in ``over`` alone, the pieces' answers by the others
        out = [(n, c) for h in self.held.values() for n, c in h.where(pred) if n not in over]
        out.extend((n, v) for n, v in over.items() if not isinstance(v, _Gone) and pred(v))
        return out

    def copy(self) -> Collections:
        """A copy sharing the pieces (O(names changed))."""
        return Collections(self.buckets, self.held, dict(self._over), dict(self._added),
                           self._count)

    def grouped(self) -> dict[int, Held | dict[str, CollectionMeta]]:
        """The collections by bucket: a bucket no changed name hashes to as its piece
        (undecoded if no collection of it was used), the others as a map in iteration order
        (their pieces decoded); empty buckets left out."""
        touched: dict[int, list[str]] = {}
        for name in self._over:
            touched.setdefault(bucket_of(name, self.buckets), []).append(name)
        added: dict[int, list[str]] = {}
        for name in self._added:
            added.setdefault(bucket_of(name, self.buckets), []).append(name)
        out: dict[int, Held | dict[str, CollectionMeta]] = {}
        for b in sorted(set(self.held) | set(touched)):
            names = touched.get(b)
            h = self.held.get(b)
            if names is None:
                assert h is not None
                out[b] = h
                continue
            members = {} if h is None else dict(h.members())
            for name in names:
                v = self._over[name]
                if isinstance(v, _Gone) or name in self._added:
                    members.pop(name, None)
                else:
                    members[name] = v
            for name in added.get(b, ()):
                members[name] = self._over[name]  # type: ignore[assignment]
            if members:
                out[b] = members
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        done = sum(1 for h in self.held.values() if h.decoded)
        return (f"Collections({len(self._over)} changed over {len(self.held)} pieces, "
                f"{done} decoded)")


def copy_collections(colls: Mapping[str, CollectionMeta]) -> MutableMapping[str, CollectionMeta]:
    """A mutable copy of a state's collections: a :class:`Collections` shares its pieces
    (O(names changed)), any other map is copied whole into a dict."""
    if isinstance(colls, Collections):
        return colls.copy()
    return dict(colls)


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
        self.held: dict[int, Held] = {}
        #: Pieces older rollups reference and the newest does not: key -> the first rollup
        #: seq that does not.
        self.dropped: dict[str, int] = {}
        #: Pieces this writer wrote that no rollup before the one that wrote them names: key
        #: -> that rollup's seq (see :meth:`thin`).
        self._born: dict[str, int] = {}
        #: When each piece this writer dropped was dropped (``time.monotonic()``).
        self._dropped_at: dict[str, float] = {}
        #: A manifest write of this writer failed: it may be stored and name pieces this
        #: writer does not know it names, so :meth:`thin` deletes nothing any more.
        self._doubt = False
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
            # NB: what this writer knew of its own pieces' lives goes with a reload (only
            # :meth:`thin` uses it; the trim collects them as before)
            self._born, self._dropped_at = {}, {}
            if rollup is None or rollup.manifest is None or rollup.held is None:
                self.buckets, self.held, self.dropped = 0, {}, {}
                self.seq = 0 if rollup is None else rollup.state.seq
                return
            m = rollup.manifest
            self.buckets, self.seq = m.buckets, m.seq
            # NB: the very objects the loaded state's collections are in (:class:`Collections`),
            # so a bucket that state never changed is referenced without being decoded.
            self.held = dict(rollup.held)
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
        colls = state.collections
        groups: dict[int, Held | dict[str, CollectionMeta]]
        if isinstance(colls, Collections) and colls.buckets == buckets:
            # NB: the buckets no name changed since the load are its pieces, undecoded
            groups = colls.grouped()
        else:
            groups = {}
            for name, c in colls.items():
                groups.setdefault(bucket_of(name, buckets), {})[name] = c  # type: ignore[index]
        now: dict[int, Held] = {}
        fresh: list[tuple[str, bytes]] = []
        for b in sorted(groups):
            group = groups[b]
            old = held.get(b) if buckets == known else None
            if isinstance(group, Held):
                if old is not None and (old is group or old.ref.key == group.ref.key):
                    now[b] = old.counted()
                    continue
                members = group.members()
            else:
                members = group
            if old is not None and _same(old.members(), members):
                now[b] = old.counted()
                continue
            data = meta.encode_piece(members)
            ref = PieceRef(bucket=b, key=layout.piece_key(digest(data)), count=len(members),
                           nbytes=len(data))
            now[b] = Held(ref, state.seq, buckets, members=members,
                          version=meta.version_of(ref.key, data), forks=_forks(members))
            fresh.append((ref.key, data))
        _map(lambda kd: _store(blob, kd), fresh)
        crashpoints.hit("rollup.pieces_written")
        live = {h.ref.key for h in now.values()}
        held_keys = {h.ref.key for h in held.values()}
        dropped = {k: s for k, s in dropped.items() if k not in live}
        for h in held.values():
            if h.ref.key not in live:
                dropped.setdefault(h.ref.key, state.seq)
        version = max((h.version() for h in now.values()),
                      default=meta.MANIFEST_FORMAT_VERSION)
        manifest = Manifest(
            version=max(version, meta.MANIFEST_FORMAT_VERSION), seq=state.seq,
            epoch=state.epoch, writer=state.writer, wall_ms=state.wall_ms,
            next_cid=state.next_cid, retired=state.retired, buckets=buckets,
            pieces=tuple(now[b].ref for b in sorted(now)),
            dropped=tuple(Dropped(k, s) for k, s in sorted(dropped.items())),
            trim=msgspec.UNSET if trim is None else trim, log_from=state.log_from,
            forked={b: h.forks for b, h in sorted(now.items()) if h.forks})
        try:
            blob.set(key, meta.encode_manifest(manifest))
        except BaseException:
            with self._lock:
                self._doubt = True
            raise
        at = time.monotonic()
        with self._lock:
            for k, _ in fresh:
                if k not in held_keys and k not in self.dropped:
                    self._born.setdefault(k, state.seq)
            for k in dropped.keys() - self.dropped.keys():
                self._dropped_at[k] = at
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
        return self._delete_dropped(blob, ripe)

    def _delete_dropped(self, blob: Blob, keys: list[str]) -> int:
        """Deletes the dropped pieces ``keys`` in order and forgets each; returns how many."""
        for key in keys:
            blob.delete(key)
            with self._lock:
                self.dropped.pop(key, None)
                self._born.pop(key, None)
                self._dropped_at.pop(key, None)
        return len(keys)

    def thin(self, blob: Blob, rollups: Iterable[int], protect_seconds: float) -> int:
        """Deletes the dropped pieces that no stored rollup names any more, before the trim
        would (the rollups that named them were thinned, :meth:`persist.indexed.maintenance.
        gc.MetaTrim.thin`); returns how many it deleted.

        A piece qualifies when this writer wrote it first (so every rollup naming it lies from
        the one that wrote it to the one that dropped it, all this writer's), none of
        ``rollups`` (every rollup still stored from that first one on) lies in that range, and
        it was dropped ``protect_seconds`` ago (a reader that loaded the manifest naming it
        lazily reads its pieces within moments of the load; it has that long). A piece of a
        bucket an append keeps rewriting lives one rollup interval, so without this the
        pieces written within a grace made most of a busy location's retained metadata.

        Raises:
            ExternalError: a delete failed; what was deleted stays forgotten.
        """
        now = time.monotonic()
        kept = sorted(rollups)
        with self._lock:
            if self._doubt:
                return 0
            ripe: list[str] = []
            for key, end in self.dropped.items():
                start = self._born.get(key)
                at = self._dropped_at.get(key)
                if start is None or at is None or now - at < protect_seconds:
                    continue
                i = bisect.bisect_left(kept, start)
                if i == len(kept) or kept[i] >= end:
                    ripe.append(key)
        return self._delete_dropped(blob, sorted(ripe))

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
