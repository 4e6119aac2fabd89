"""The part reader: fetches and decodes a collection's parts, with a small cache.

Every read goes through one: a client's (cached, shared by its snapshots and listeners), a
compaction's, or a distributed task's (uncached: each part is read once per task). What a read
needs and how it is read is planned in :mod:`persist.indexed.read.scan`.

Reads never take a lock and never wait for the runtime: they read the immutable parts an
immutable ``State`` references.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.blob.base import BlobRead
from persist.errors import Corruption, PartMissing
from persist.indexed.format import columnar
from persist.indexed.format.meta import PartMeta

#: The decoded bytes a client's part cache holds by default (``Options.cache_bytes``).
CACHE_BYTES = 256 << 20


class PartReader:
    """Fetches and decodes parts, keeping recently used blob parts in a bounded cache.

    NB: parts are immutable and uniquely named, so caching them can never serve stale data.
    """

    def __init__(self, blob: BlobRead, *, cache_bytes: int = CACHE_BYTES) -> None:
        self.blob = blob
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._siblings: dict[str, BlobRead] = {}

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
            return columnar.decode_part(f"inline part {part.id}", part.inline, schema)
        assert part.blob_key is not None
        root, key, upto = layout.parse_ref(part.blob_key)
        # NB: cached under the blob, not the reference: a fork and its source share the entry
        # (the cut is applied on the way out).
        ck = key if root is None else f"{root}\0{key}"
        with self._lock:
            hit = self._cache.get(ck)
            if hit is not None:
                self._cache.move_to_end(ck)
                return _cut(hit[0], upto)
        data = self._store(root).get_view(key)
        if data is None:
            raise PartMissing(f"part {key!r} is gone (garbage collected); retry on a newer state")
        table = columnar.decode_part(key, data, schema)
        # NB: the decoded size, which is what the cache holds: a zstd part decodes to ~3x its
        # stored bytes, so counting those would let the cache grow to ~3x its budget.
        size = table.nbytes
        if size <= self.cache_bytes // 4:
            with self._lock:
                if ck not in self._cache:
                    self._cache[ck] = (table, size)
                    self._cached += size
                while self._cached > self.cache_bytes:
                    _, (_, s) = self._cache.popitem(last=False)
                    self._cached -= s
        return _cut(table, upto)

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
            # NB: a decoded stream has one chunk per record batch: the stats must describe them.
            have = [len(c) for c in hit[0].column(0).chunks if len(c)]
            if have != [n for n in batch_rows if n]:
                raise Corruption(key or "", f"record batches of {have} rows, its stats say "
                                            f"{list(batch_rows)}")
            pieces, at = [], 0
            for k, n in zip(keep, batch_rows, strict=True):
                if k:
                    pieces.append(hit[0].slice(at, n))
                at += n
            return _cut(pa.concat_tables(pieces) if pieces else hit[0].slice(0, 0), upto)
        if part.inline is not None:
            return columnar.decode_batches(f"inline part {part.id}", part.inline, schema, keep,
                                           batch_rows)
        assert key is not None
        data = self._store(root).get_view(key)
        if data is None:
            raise PartMissing(f"part {key!r} is gone (garbage collected); retry on a newer state")
        return _cut(columnar.decode_batches(key, data, schema, keep, batch_rows), upto)


def _cut(t: pa.Table, upto: int | None) -> pa.Table:
    """``t`` without its rows at times past ``upto`` (a fork's cut; None: all of it)."""
    if upto is None or not len(t):
        return t
    return t.filter(pc.less_equal(t.column("time"), pa.scalar(upto, pa.uint64())))


__all__ = ["CACHE_BYTES", "PartReader"]
