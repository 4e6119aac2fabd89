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

    def read(self, part: PartMeta, schema: pa.Schema) -> pa.Table:
        """Returns ``part``'s decoded table, from the cache when it holds it. Thread-safe.

        Inline parts are decoded from the metadata and never cached; a blob part is cached
        after the read if its decoded size is at most a quarter of ``cache_bytes``.

        Raises:
            PartMissing: the part's blob is gone (GC); retry on a newer state.
            Corruption: the stored part fails verification or decoding, or has another schema.
            IncompatibleFormat: a newer envelope or part format.
            ExternalError: storage failed.
        """
        if part.inline is not None:
            return columnar.decode_part(f"inline part {part.id}", part.inline, schema)
        key = part.blob_key
        assert key is not None
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit[0]
        data = self.blob.get_view(key)
        if data is None:
            raise PartMissing(f"part {key!r} is gone (garbage collected); retry on a newer state")
        table = columnar.decode_part(key, data, schema)
        # NB: the decoded size, which is what the cache holds: a zstd part decodes to ~3x its
        # stored bytes, so counting those would let the cache grow to ~3x its budget.
        size = table.nbytes
        if size <= self.cache_bytes // 4:
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = (table, size)
                    self._cached += size
                while self._cached > self.cache_bytes:
                    _, (_, s) = self._cache.popitem(last=False)
                    self._cached -= s
        return table

    def read_batches(self, part: PartMeta, schema: pa.Schema, keep: list[bool],
                     batch_rows: tuple[int, ...]) -> pa.Table:
        """Only the record batches ``i`` of ``part`` with ``keep[i]`` (``batch_rows`` rows
        each, as its stats record): sliced from the cache when it holds the part, else decoded
        alone (the others are not decompressed; nothing is cached). Thread-safe.

        Raises:
            PartMissing, Corruption, IncompatibleFormat, ExternalError: as :meth:`read`;
            Corruption also when the part does not have ``len(keep)`` batches.
        """
        key = part.blob_key
        with self._lock:
            hit = self._cache.get(key) if key is not None else None
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
            return pa.concat_tables(pieces) if pieces else hit[0].slice(0, 0)
        if part.inline is not None:
            return columnar.decode_batches(f"inline part {part.id}", part.inline, schema, keep,
                                           batch_rows)
        assert key is not None
        data = self.blob.get_view(key)
        if data is None:
            raise PartMissing(f"part {key!r} is gone (garbage collected); retry on a newer state")
        return columnar.decode_batches(key, data, schema, keep, batch_rows)


__all__ = ["CACHE_BYTES", "PartReader"]
