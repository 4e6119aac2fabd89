"""Reading a collection: parts (with a small cache), snapshots as of a time, time ranges.

Reads never take a lock and never wait for the runtime: they read an immutable ``State`` and
the immutable parts it references.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persist.blob.base import BlobRead
from persist.errors import Corruption, InvalidUsage, PartMissing
from persist.indexed.format import columnar, evolve
from persist.indexed.format.columnar import Codec
from persist.indexed.format.evolve import View
from persist.indexed.format.meta import CollectionMeta, PartMeta
from persist.indexed.read.filter import Bound, Filter, bind
from persist.indexed.read.prune import PruneCounts, Pruner
from persist.indexed.state.transitions import check_time, effective_since


@dataclass(frozen=True)
class Types:
    """The decoded types of a collection."""

    key: Codec
    value: Codec
    schema: pa.Schema

    @classmethod
    def of(cls, c: CollectionMeta, schema_id: int | None = None) -> Types:
        """The codecs and part schema ``c``'s metadata records (see ``Codec.from_meta``) for
        its schema version ``schema_id`` (None: the current one; an index into
        ``evolve.history(c)``)."""
        if schema_id is None or schema_id == evolve.version(c):
            k = Codec.from_meta(c.key_type, c.key_codec)
            v = Codec.from_meta(c.value_type, c.value_codec)
        else:
            k, v = evolve.codecs(evolve.history(c)[schema_id])
        return cls(k, v, columnar.part_schema(k.arrow_type, v.arrow_type))


class PartReader:
    """Fetches and decodes parts, keeping recently used blob parts in a bounded cache.

    NB: parts are immutable and uniquely named, so caching them can never serve stale data.
    """

    def __init__(self, blob: BlobRead, *, cache_bytes: int = 256 << 20) -> None:
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


def check_as_of(c: CollectionMeta, as_of: int) -> None:
    """Checks that a read of ``c`` as of ``as_of`` is definite: ``since <= as_of < upper``.

    Raises:
        InvalidUsage: ``as_of`` is not a time, or lies outside ``[since, upper)``.
    """
    check_time("as_of", as_of)
    since = effective_since(c)
    if as_of < since:
        raise InvalidUsage(
            f"read of {c.name!r} as of {as_of} is below its since {since}: history before "
            f"{since} may be compacted and is no longer distinguishable"
        )
    if as_of >= c.upper:
        raise InvalidUsage(
            f"read of {c.name!r} as of {as_of} is not below its upper {c.upper}: times "
            f">= {c.upper} are not sealed yet"
        )


class Snapshot:
    """The contents of a collection as of one time in ``[since, upper)``: definite.

    With a ``filter`` (:mod:`persist.indexed.read.filter`), exactly the rows of the unfiltered
    snapshot that match it. With a ``schema_id``, as that schema version of the collection
    (:mod:`persist.indexed.format.evolve`: parts migrated to the current version, consolidated, and
    migrated back).
    """

    def __init__(self, c: CollectionMeta, as_of: int, reader: PartReader, *,
                 filter: Filter | None = None, schema_id: int | None = None,
                 audit: bool = False) -> None:
        """Checks ``as_of`` (and ``filter`` against ``c``'s types); reads nothing yet.
        ``audit``: read what pruning skips, and raise if it held a match (``prune.Pruner``).

        Raises:
            InvalidUsage: ``as_of`` is outside ``[since, upper)``, ``filter`` is not one, or
                ``schema_id`` is not a schema version of ``c``.
            SchemaMismatch: ``filter`` names a field ``c`` lacks, or a literal does not fit.
        """
        check_as_of(c, as_of)
        self.collection = c
        self.as_of = as_of
        self.view = View.of(c, schema_id)
        self.types = Types.of(c, self.view.target)
        self._reader = reader
        self.filter = filter
        self.bound: Bound | None = None if filter is None else bind(
            filter, self.types.key.arrow_type, self.types.value.arrow_type,
            key_codec=self.types.key.name, value_codec=self.types.value.name)
        self._pruner = None if self.bound is None else Pruner(self.bound, self.view,
                                                              audit=audit)

    @property
    def schema(self) -> pa.Schema:
        """The collection's part schema: ``key, value, time, diff``."""
        return self.types.schema

    @property
    def parts(self) -> tuple[PartMeta, ...]:
        """The parts holding every update at or before ``as_of`` (for planning parallel reads)."""
        return tuple(p for p in self.collection.parts if p.min_time <= self.as_of and p.rows)

    @property
    def pruning(self) -> PruneCounts | None:
        """With a filter, what its reads fetched and what pruning skipped so far."""
        return None if self._pruner is None else self._pruner.counts

    def read_part(self, p: PartMeta) -> pa.Table:
        """One part's raw updates at or before ``as_of`` that match the filter, times forwarded
        to ``as_of``."""
        if self._pruner is None:
            return read_part_at(self._reader, p, self.view, self.as_of)
        t = self._pruner.load(self._reader, p)
        if t is None:
            return self.schema.empty_table()
        return self._matching(_at(t, p, self.schema, self.as_of))

    def _loaded(self, *, current: bool = False) -> Iterator[pa.Table]:
        """Each part that may match, migrated to the target version (``current``: to the
        current one); stats-pruned when filtered, not yet filtered row by row."""
        for p in self.parts:
            if self._pruner is not None:
                t = self._pruner.load(self._reader, p, current=current)
                if t is not None:
                    yield t
            elif current:
                yield self.view.read_current(self._reader, p)
            else:
                yield self.view.read(self._reader, p)

    def _matching(self, t: pa.Table) -> pa.Table:
        # NB: filtering rows before consolidating them is exact. Consolidation sums the diffs
        # of rows with equal (key, value), across parts; the filter is a function of (key,
        # value) alone, and equal records (persist's equality: null = null, NaN = NaN, -0.0
        # != 0.0) get the same answer from it (it compares -0.0 and 0.0 alike, but treats all
        # NaNs as one and all nulls as one). So every group of rows that consolidates together
        # is kept whole or dropped whole: the kept groups sum as they would unfiltered, and
        # filtering the consolidated result drops exactly the groups dropped here.
        if self.bound is None or not len(t):
            return t
        return t.filter(self.bound.mask(t))

    def batches(self) -> Iterator[pa.Table]:
        """Raw updates, part by part (bounded memory), times forwarded to ``as_of``, filtered.

        Their sum per (key, value) is the definite contents; the individual rows are not
        (compaction consolidates them), so use :meth:`to_arrow` where rows must match exactly.
        """
        for p in self.parts:
            yield self.read_part(p)

    def to_arrow(self) -> pa.Table:
        """The consolidated contents: one row per (key, value) with nonzero summed diff, sorted
        by (key, value); ``time`` is ``as_of``. Filtered, if the snapshot has a filter."""
        if not self.view.current:
            return self._matching(self._to_arrow_as_older())
        tables = [self._matching(t) for t in self._loaded()]
        if not tables:
            return self.schema.empty_table()
        return columnar.contents_at(pa.concat_tables(tables), self.as_of)

    def _to_arrow_as_older(self) -> pa.Table:
        # NB: consolidated at the current version, then migrated back and consolidated again
        # (dropping a field may make two records equal). Consolidating first is what makes a
        # read as of an older version definite: a record that cancels out never has to fit
        # the older version, and compaction (which migrates to the current one) cannot change
        # what this returns.
        tables = list(self._loaded(current=True))
        if not tables:
            return self.schema.empty_table()
        current = columnar.contents_at(pa.concat_tables(tables), self.as_of)
        return columnar.contents_at(self.view.from_current(current), self.as_of)

    def to_python(self) -> list[tuple[tuple[Any, Any], int, int]]:
        """``to_arrow`` as ``((key, value), time, diff)`` tuples, Python-object codecs decoded."""
        t = self.to_arrow()
        keys = self.types.key.decode_values(t.column("key"))
        values = self.types.value.decode_values(t.column("value"))
        return [((k, v), self.as_of, d) for k, v, d in
                zip(keys, values, t.column("diff").to_pylist(), strict=True)]


def read_part_at(reader: PartReader, p: PartMeta, schema: pa.Schema | View,
                 as_of: int) -> pa.Table:
    """One part's raw updates at or before ``as_of``, times forwarded to ``as_of``.

    ``schema``: the part's own schema, or a :class:`~persist.indexed.format.evolve.View` that
    migrates the part to its schema version.
    """
    if isinstance(schema, View):
        t = schema.read(reader, p)
        schema = schema.schema
    else:
        t = reader.read(p, schema)
    return _at(t, p, schema, as_of)


def _at(t: pa.Table, p: PartMeta, schema: pa.Schema, as_of: int) -> pa.Table:
    """``t`` (rows of ``p``) at or before ``as_of``, times forwarded to ``as_of``."""
    if p.max_time > as_of:
        t = t.filter(pc.less_equal(t.column("time"), pa.scalar(as_of, pa.uint64())))
    return t.set_column(2, schema.field(2), columnar.constant_times(as_of, len(t)))


def updates_between(
    c: CollectionMeta, lo: int, hi: int, reader: PartReader, *, held: bool = False,
    schema_id: int | None = None,
) -> Iterator[pa.Table]:
    """Every update with ``lo <= time < hi``, with original times, part by part, as schema
    version ``schema_id`` of ``c`` (None: the current one).

    Raises:
        InvalidUsage: ``lo - 1`` is below the collection's since: updates before ``lo`` may
            have been forwarded into the range, so the result would not be exact (unless
            ``held``: the caller holds a read hold at ``lo - 1`` that kept compaction back).
    """
    if not held and lo > 0 and lo - 1 < effective_since(c):
        raise InvalidUsage(
            f"updates of {c.name!r} from {lo} are no longer exact: since is "
            f"{effective_since(c)} (history was compacted past {lo - 1})"
        )
    view = View.of(c, schema_id)
    lo_s, hi_s = pa.scalar(lo, pa.uint64()), pa.scalar(hi, pa.uint64())
    for p in c.parts:
        if not p.rows or p.max_time < lo or p.min_time >= hi:
            continue
        t = view.read(reader, p)
        if p.min_time < lo or p.max_time >= hi:
            tc = t.column("time")
            t = t.filter(pc.and_(pc.greater_equal(tc, lo_s), pc.less(tc, hi_s)))
        if len(t):
            yield t
