"""The part reader: fetches and decodes a collection's parts, with a small cache.

Every read goes through one: a client's (cached, shared by its snapshots and listeners), a
compaction's, or a distributed task's (uncached: each part is read once per task). What a read
needs and how it is read is planned in :mod:`persist.indexed.read.scan`.

Reads never take a lock and never wait for the runtime: they read the immutable parts an
immutable ``State`` references.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

import crc32c
import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import BlobRead
from persist.errors import ChecksumMismatch, Corruption, PartMissing
from persist.indexed.format import columnar, parquet
from persist.indexed.format.meta import PartMeta

#: The decoded bytes a client's part cache holds by default (``Options.cache_bytes``).
CACHE_BYTES = 256 << 20


class DecodeCount:
    """Stored bytes decoded so far (thread-safe): of a Parquet part, the compressed column
    chunks of the row groups decoded; of an Arrow stream, its bytes (the record batches'
    messages when only some are decoded). A part served from a reader's cache decodes
    nothing. What a read plan's decode amplification is measured by (DESIGN.md §11a)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0

    def add(self, n: int) -> None:
        """Counts ``n`` more bytes decoded."""
        with self._lock:
            self._bytes += n

    @property
    def bytes(self) -> int:
        """Bytes decoded so far."""
        return self._bytes


#: Every part reader of this process counts into this too (the benchmark reads it).
DECODED = DecodeCount()


class PartReader:
    """Fetches and decodes parts, keeping recently used blob parts in a bounded cache.

    Part formats: a blob of format 4 is a Parquet file, verified against its
    ``PartMeta.checksum`` (:meth:`~persist.blob.base.BlobRead.get_plain`) and decoded by
    :mod:`persist.indexed.format.parquet`; others (and inline parts) are Arrow streams.

    NB: parts are immutable and uniquely named, so caching them can never serve stale data.
    """

    def __init__(self, blob: BlobRead, *, cache_bytes: int = CACHE_BYTES) -> None:
        self.blob = blob
        self.cache_bytes = cache_bytes
        #: key -> (decoded table, its size, the row count of each of its record batches)
        self._cache: OrderedDict[str, tuple[pa.Table, int, tuple[int, ...]]] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        #: What this reader decoded (:class:`DecodeCount`).
        self.decoded = DecodeCount()
        self._siblings: dict[str, BlobRead] = {}
        #: marks blob (root, key) -> its verified positions
        self._marks: OrderedDict[str, npt.NDArray[np.int64]] = OrderedDict()

    def _count(self, n: int) -> None:
        self.decoded.add(n)
        DECODED.add(n)

    def _fetch(self, part: PartMeta, root: str | None, key: str) -> memoryview:
        """The verified stored bytes of blob part ``part``, stored at ``key`` of the location
        at ``root`` (None: this one).

        Raises:
            PartMissing, Corruption, IncompatibleFormat, ExternalError: as :meth:`read`.
        """
        store = self._store(root)
        if part.parquet:
            if not isinstance(part.checksum, int):
                raise Corruption(key, "a Parquet part without a checksum in its metadata")
            data = store.get_plain(key, part.checksum, size=part.nbytes)
        else:
            data = store.get_view(key)
        if data is None:
            raise PartMissing(f"part {key!r} is gone (garbage collected); retry on a newer state")
        return data

    def _decode(self, part: PartMeta, key: str,
                data: bytes | memoryview | parquet.Stretches, schema: pa.Schema,
                keep: list[bool] | None = None, rows: tuple[int, ...] | None = None
                ) -> tuple[pa.Table, tuple[int, ...]]:
        """The decoded rows (all, or the batches ``keep`` keeps) and the row count of every
        record batch (row group) of the part."""
        if part.parquet and part.inline is None:
            decoded = parquet.decode(key, data, schema, keep=keep, rows=rows)
            self._count(decoded.nbytes)
            return decoded.table, decoded.row_groups
        assert not isinstance(data, parquet.Stretches)  # only a Parquet part is read so
        if keep is None:
            self._count(memoryview(data).nbytes)
            table = columnar.decode_part(key, data, schema)
            # NB: a decoded stream has one chunk per record batch
            return table, tuple(len(c) for c in table.column(0).chunks)
        table = columnar.decode_batches(key, data, schema, keep, rows)
        self._count(_kept_share(memoryview(data).nbytes, keep, rows))
        return table, tuple(rows or ())

    def read(self, part: PartMeta, schema: pa.Schema) -> pa.Table:
        """Returns ``part``'s decoded table, from the cache when it holds it. Thread-safe.

        Inline parts are decoded from the metadata and never cached; a blob part is cached
        after the read if its decoded size is at most a quarter of ``cache_bytes``. A fork's
        part (a reference, :func:`persist.layout.ref_key`) is read from the blob it names, in
        whichever location of the store holds it, without the rows its cut hides.

        Raises:
            PartMissing: the part's blob is gone (GC); retry on a newer state.
            Corruption: the stored part fails verification or decoding, or has another schema.
            IncompatibleFormat: a newer envelope or part format.
            ExternalError: storage failed.
        """
        if part.inline is not None:
            return self._decode(part, f"inline part {part.id}", part.inline, schema)[0]
        assert part.blob_key is not None
        root, key, upto = layout.parse_ref(part.blob_key)
        # NB: cached under the blob, not the reference: a fork and its source share the entry
        # (the cut is applied on the way out).
        ck = key if root is None else f"{root}\0{key}"
        with self._lock:
            hit = self._cache.get(ck)
            if hit is not None:
                self._cache.move_to_end(ck)
        if hit is not None:
            return _cut(self._unmarked(part, hit[0], None, None), upto)
        table, groups = self._decode(part, key, self._fetch(part, root, key), schema)
        # NB: the decoded size, which is what the cache holds: a zstd part decodes to ~3x its
        # stored bytes, so counting those would let the cache grow to ~3x its budget.
        size = table.nbytes
        if size <= self.cache_bytes // 4:
            with self._lock:
                if ck not in self._cache:
                    self._cache[ck] = (table, size, groups)
                    self._cached += size
                while self._cached > self.cache_bytes:
                    _, (_, s, _) = self._cache.popitem(last=False)
                    self._cached -= s
        return _cut(self._unmarked(part, table, None, None), upto)

    def marks(self, part: PartMeta) -> npt.NDArray[np.int64] | None:
        """The positions (in its blob's rows) that marked part ``part`` hides, verified
        (None: an unmarked part). Cached (small, immutable, uniquely named).

        Raises:
            ChecksumMismatch: the marks blob is not what was written (flipped, truncated).
            PartMissing: the marks blob is gone (GC); retry on a newer state.
            Corruption: the positions are not strictly increasing within the part's rows.
            ExternalError: storage failed.
        """
        m = part.marks
        if m is None:
            return None
        if not m.count:
            return _NO_MARKS
        root, key, _ = layout.parse_ref(m.key)
        ck = f"{root or ''}\0{key}"
        with self._lock:
            got = self._marks.get(ck)
        if got is not None:
            return got
        try:
            data = self._store(root).get_plain(key, m.crc, size=m.nbytes)
        except ChecksumMismatch as e:
            raise ChecksumMismatch(key, f"the marks of part {part.id}: {e}") from None
        if data is None:
            raise PartMissing(f"the marks {key!r} of part {part.id} are gone (garbage "
                              f"collected); retry on a newer state")
        pos = _positions(part, key, data)
        with self._lock:
            self._marks[ck] = pos
            while len(self._marks) > 1024:
                self._marks.popitem(last=False)
        return pos

    def _unmarked(self, part: PartMeta, t: pa.Table, keep: list[bool] | None,
                  batch_rows: tuple[int, ...] | None) -> pa.Table:
        """``t`` (the rows of ``part``'s blob, or its record batches ``keep`` of
        ``batch_rows`` rows) without the rows its marks hide."""
        pos = self.marks(part)
        if pos is None or not len(pos):
            return t
        total = part.rows if keep is None else sum(batch_rows or ())
        mask = np.ones(total, dtype=bool)
        mask[pos] = False
        if keep is not None:
            assert batch_rows is not None
            pieces, at = [], 0
            for k, n in zip(keep, batch_rows, strict=True):
                if k:
                    pieces.append(mask[at:at + n])
                at += n
            mask = np.concatenate(pieces) if pieces else mask[:0]
        if len(mask) != len(t):
            raise Corruption(part.blob_key or part.id,
                             f"part {part.id}: its marks cover {len(mask)} rows, its blob "
                             f"read {len(t)}")
        return t.filter(pa.array(mask))

    def _store(self, root: str | None) -> BlobRead:
        """The store holding a blob of the location at ``root`` (None: this one)."""
        if root is None:
            return self.blob
        with self._lock:
            store = self._siblings.get(root)
        if store is None:
            store = self.blob.sibling(root)
            with self._lock:
                store = self._siblings.setdefault(root, store)
        return store

    def read_batches(self, part: PartMeta, schema: pa.Schema, keep: list[bool],
                     batch_rows: tuple[int, ...]) -> pa.Table:
        """Only the record batches ``i`` of ``part`` with ``keep[i]`` (``batch_rows`` rows
        each, as its stats record): sliced from the cache when it holds the part, else decoded
        alone (the others are not decompressed; nothing is cached). Thread-safe. A fork's
        part's cut applies as in :meth:`read`.

        Raises:
            PartMissing, Corruption, IncompatibleFormat, ExternalError: as :meth:`read`;
            Corruption also when the part does not have ``len(keep)`` batches.
        """
        root, key, upto = (None, None, None) if part.blob_key is None else \
            layout.parse_ref(part.blob_key)
        ck = key if root is None else f"{root}\0{key}"
        with self._lock:
            hit = self._cache.get(ck) if ck is not None else None
        if hit is not None:
            # NB: the stats must describe the part's record batches (row groups) as stored.
            have = [n for n in hit[2] if n]
            if have != [n for n in batch_rows if n]:
                raise Corruption(key or "", f"record batches of {have} rows, its stats say "
                                            f"{list(batch_rows)}")
            pieces, at = [], 0
            for k, n in zip(keep, batch_rows, strict=True):
                if k:
                    pieces.append(hit[0].slice(at, n))
                at += n
            got = pa.concat_tables(pieces) if pieces else hit[0].slice(0, 0)
            return _cut(self._unmarked(part, got, keep, batch_rows), upto)
        if part.inline is not None:
            return self._decode(part, f"inline part {part.id}", part.inline, schema, keep,
                                batch_rows)[0]
        assert key is not None
        got = self._decode(part, key, self._fetch(part, root, key), schema, keep,
                           batch_rows)[0]
        return _cut(self._unmarked(part, got, keep, batch_rows), upto)


    def read_groups(self, part: PartMeta, schema: pa.Schema, keep: list[bool],
                    batch_rows: tuple[int, ...]) -> pa.Table:
        """As :meth:`read_batches` (never cached), but of a Parquet part that records its row
        groups (``PartStats.groups``) fetches only its tail and the row groups ``keep`` keeps,
        one ranged read per run of them, and verifies each against its checksum before a byte
        is decoded; the decode reads nothing else (:class:`~persist.indexed.format.parquet.
        Stretches`). A part that records none is fetched whole and verified as a whole.

        Raises:
            ChecksumMismatch: the tail or a fetched row group is not what was written (flipped
                bits, truncated, grown), naming the part and the stretch.
            PartMissing, Corruption, IncompatibleFormat, ExternalError: as :meth:`read`.
        """
        st = part.stats
        groups = None if isinstance(st, msgspec.UnsetType) else st.groups
        tail = None if isinstance(st, msgspec.UnsetType) else st.tail
        if (groups is None or tail is None or part.inline is not None or not part.parquet
                or part.blob_key is None):
            return self.decode_batches(part, self.fetch(part), schema, keep, batch_rows)
        root, key, upto = layout.parse_ref(part.blob_key)
        offsets = groups.offsets
        if (len(offsets) != len(keep) + 1 or len(groups.crcs) != len(keep)
                or offsets[-1] != tail.offset or tail.offset >= part.nbytes):
            raise Corruption(key, f"part {part.id}: its metadata records {len(groups.crcs)} "
                                  f"row groups ending at {offsets[-1]}, {len(keep)} batches "
                                  f"and a tail at {tail.offset}")
        store = self._store(root)
        pieces = [(tail.offset, self._stretch(store, part, key, tail.offset, part.nbytes,
                                              (tail.crc,), (tail.offset, part.nbytes)))]
        i = 0
        while i < len(keep):
            if not keep[i]:
                i += 1
                continue
            j = i
            while j < len(keep) and keep[j]:
                j += 1
            pieces.append((offsets[i], self._stretch(store, part, key, offsets[i], offsets[j],
                                                     groups.crcs[i:j], offsets[i:j + 1])))
            i = j
        data = parquet.Stretches(part.nbytes, pieces)
        got = self._decode(part, key, data, schema, keep, batch_rows)[0]
        return _cut(self._unmarked(part, got, keep, batch_rows), upto)

    @staticmethod
    def _stretch(store: BlobRead, part: PartMeta, key: str, start: int, end: int,
                 crcs: tuple[int, ...], bounds: tuple[int, ...]) -> bytes:
        """The bytes ``[start, end)`` of part ``part`` (at ``key``), one ranged read, verified
        piece by piece: ``[bounds[i], bounds[i + 1])`` has crc32c ``crcs[i]``."""
        got = store.get_range(key, start, end)
        if got is None:
            raise PartMissing(f"part {key!r} is gone (garbage collected); retry on a newer state")
        if len(got) != end - start:
            raise ChecksumMismatch(key, f"part {part.id}: bytes {start}-{end} read back as "
                                        f"{len(got)} bytes (the file was truncated)")
        view = memoryview(got)
        for crc, (a, b) in zip(crcs, itertools.pairwise(bounds), strict=True):
            have = crc32c.crc32c(view[a - start:b - start])
            if have != crc:
                raise ChecksumMismatch(key, f"part {part.id}: bytes {a}-{b} have crc32c "
                                            f"{have:#010x}, its metadata says {crc:#010x}")
        return got

    def fetch(self, part: PartMeta) -> memoryview:
        """The verified stored bytes of blob part ``part`` (not decoded, not cached): what
        :meth:`decode_batches` decodes, for a caller that decodes a part piece by piece.

        Raises:
            PartMissing, Corruption, IncompatibleFormat, ExternalError: as :meth:`read`.
        """
        assert part.blob_key is not None
        root, key, _ = layout.parse_ref(part.blob_key)
        return self._fetch(part, root, key)

    def decode_batches(self, part: PartMeta, data: memoryview, schema: pa.Schema,
                       keep: list[bool], batch_rows: tuple[int, ...]) -> pa.Table:
        """The record batches ``i`` of ``part`` with ``keep[i]``, decoded from ``data`` (its
        bytes from :meth:`fetch`); a fork's part's cut applies as in :meth:`read`.

        Raises:
            Corruption: as :meth:`read_batches`.
        """
        assert part.blob_key is not None
        _, key, upto = layout.parse_ref(part.blob_key)
        got = self._decode(part, key, data, schema, keep, batch_rows)[0]
        return _cut(self._unmarked(part, got, keep, batch_rows), upto)


_NO_MARKS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)


def _positions(part: PartMeta, key: str, data: bytes | memoryview) -> npt.NDArray[np.int64]:
    """The positions a marks blob (``data``, verified) of ``part`` holds.

    Raises:
        Corruption: not ``count`` strictly increasing positions within the part's rows.
    """
    m = part.marks
    assert m is not None
    if len(data) != 8 * m.count:
        raise Corruption(key, f"the marks of part {part.id}: {len(data)} bytes for "
                              f"{m.count} positions")
    pos = np.frombuffer(data, dtype="<i8").astype(np.int64)
    if len(pos) and (int(pos[0]) < 0 or int(pos[-1]) >= part.rows
                     or bool(np.any(np.diff(pos) <= 0))):
        raise Corruption(key, f"the marks of part {part.id} are not increasing positions "
                              f"within its {part.rows} rows")
    return pos


def encode_marks(positions: npt.NDArray[np.int64]) -> bytes:
    """The stored bytes of a marks blob holding ``positions`` (sorted, distinct)."""
    return np.ascontiguousarray(positions, dtype="<i8").tobytes()


def _cut(t: pa.Table, upto: int | None) -> pa.Table:
    """``t`` without its rows at times past ``upto`` (a fork's cut; None: all of it)."""
    if upto is None or not len(t):
        return t
    return t.filter(pc.less_equal(t.column("time"), pa.scalar(upto, pa.uint64())))


def _kept_share(nbytes: int, keep: list[bool], rows: tuple[int, ...] | None) -> int:
    """The bytes of an Arrow stream's kept record batches, estimated by their rows (the
    stream's batches are decoded from messages of about that share of its bytes)."""
    if rows is None or not sum(rows):
        return nbytes if any(keep) else 0
    kept = sum(n for k, n in zip(keep, rows, strict=False) if k)
    return nbytes * kept // sum(rows)


__all__ = ["CACHE_BYTES", "DECODED", "DecodeCount", "PartReader", "encode_marks"]
