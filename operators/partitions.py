"""Input partitions and what a Spark task does with one: read storage parts, yield Arrow.

The driver plans (:func:`snapshot_parts`, :func:`range_parts`, :func:`group`) from metadata
alone; each partition then carries everything its task needs — the location, the collection's
types, the parts (inline parts with their bytes) and the time bounds — so a task reads straight
from the blob store with no client, no lock and no call back to the driver, and its output
depends only on its partition (Spark pickles partitions to executors, and a streaming read runs
on another process than the one planning offsets).

Three kinds:

* :class:`SnapshotPartition` (batch, ``mode=raw``): a group of parts, every update at or before
  ``as_of`` with its time forwarded to ``as_of``.
* :class:`BucketPartition` (batch, ``mode=consolidated``): every part, only keys of one hash
  bucket, consolidated (see :mod:`operators.buckets`).
* :class:`RangePartition` (streaming): a group of parts, the updates with ``lo <= time < hi``.

A batch partition may carry a pushed filter (:mod:`operators.filters`). The driver plans only
the parts whose stats may hold a match (:func:`prune`); each task decodes only the record
batches of its parts whose per-batch stats may match and keeps exactly the rows that match
(``Bound.mask``). Both decisions are the engine's (:class:`persist.indexed.prune.Pruner`, which
knows how stats written under an older schema version apply). When auditing, every part and
batch pruning skipped is read anyway (each skipped part by one task) and a matching row in one
fails the read with :class:`~persist.errors.Corruption`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from operators import buckets, filters
from operators.options import Target
from operators.schema import CollectionTypes, to_spark
from persist.blob.base import BlobRead
from persist.errors import InvalidUsage, MissingResource, SchemaMismatch
from persist.indexed.filter import Filter
from persist.indexed.machine import Machine
from persist.indexed.meta import CollectionMeta, PartMeta, State
from persist.indexed.prune import Pruner
from persist.indexed.read import PartMissing, PartReader, read_part_at
from persist.indexed.state import collection, effective_since
from persist.location import resolve

log = logging.getLogger("persist.spark")

#: Rows per RecordBatch handed to Spark.
BATCH_ROWS = 1 << 17


class SnapshotPartition(InputPartition):
    """Raw updates of ``parts`` as of ``as_of`` (times forwarded to it); with a ``filter``,
    exactly those that match it.

    ``audited``: pruning is audited; ``audit`` is this task's share of the parts the driver's
    pruning skipped, each re-read and checked, as are the batches the task's own pruning
    skips.
    """

    def __init__(self, target: Target, types: CollectionTypes, as_of: int,
                 parts: tuple[PartMeta, ...], *, filter: Filter | None = None,
                 audit: tuple[PartMeta, ...] = (), audited: bool = False) -> None:
        super().__init__(None)
        self.target = target
        self.types = types
        self.as_of = as_of
        self.parts = parts
        self.filter = filter
        self.audit = audit
        self.audited = audited


class BucketPartition(InputPartition):
    """The consolidated contents as of ``as_of`` of the keys in ``bucket`` of ``buckets``;
    with a ``filter``, exactly its rows that match (checking ``audit`` as
    :class:`SnapshotPartition` does).

    ``audited``: pruning is audited (as in :class:`SnapshotPartition`); ``audit`` is the
    bucket's share of the parts the driver's pruning skipped, re-planned by a retry on a newer
    state.
    """

    def __init__(self, target: Target, types: CollectionTypes, as_of: int,
                 parts: tuple[PartMeta, ...], bucket: int, buckets: int, *,
                 filter: Filter | None = None, audit: tuple[PartMeta, ...] = (),
                 audited: bool = False) -> None:
        super().__init__(None)
        self.target = target
        self.types = types
        self.as_of = as_of
        self.parts = parts
        self.bucket = bucket
        self.buckets = buckets
        self.filter = filter
        self.audit = audit
        self.audited = audited


class RangePartition(InputPartition):
    """The updates of ``parts`` with ``lo <= time < hi`` (a micro-batch's share)."""

    def __init__(self, target: Target, types: CollectionTypes, lo: int, hi: int,
                 parts: tuple[PartMeta, ...]) -> None:
        super().__init__(None)
        self.target = target
        self.types = types
        self.lo = lo
        self.hi = hi
        self.parts = parts


# -- planning (driver) ----------------------------------------------------------------------


def snapshot_parts(c: CollectionMeta, as_of: int) -> tuple[PartMeta, ...]:
    """The parts that hold every update at or before ``as_of``."""
    return tuple(p for p in c.parts if p.rows and p.min_time <= as_of)


def range_parts(c: CollectionMeta, lo: int, hi: int) -> tuple[PartMeta, ...]:
    """The parts that may hold updates with ``lo <= time < hi``."""
    return tuple(p for p in c.parts if p.rows and p.max_time >= lo and p.min_time < hi)


def pruner(f: Filter | None, types: CollectionTypes, *, audit: bool = False) -> Pruner | None:
    """The engine's pruning of reads of ``types`` (migrated to its schema version) by ``f``;
    None without a filter. ``audit``: its reads also check what it skips."""
    if f is None:
        return None
    return Pruner(filters.bound(f, types), types.reads, audit=audit)


def prune(parts: Sequence[PartMeta], f: Filter | None, types: CollectionTypes
          ) -> tuple[tuple[PartMeta, ...], tuple[PartMeta, ...]]:
    """``parts`` split into those that may hold a row matching ``f`` and those whose stats
    prove that none does (``PartMeta.stats``, see :class:`persist.indexed.prune.Pruner`). A
    part without stats (inline parts, parts written before stats) is kept; without a filter
    every part is.

    Sound for consolidated reads too: the filter reads only ``(key, value)``, so a part
    holding no matching row contributes nothing to a matching group's sum.
    """
    pr = pruner(f, types)
    if pr is None:
        return tuple(parts), ()
    kept: list[PartMeta] = []
    skipped: list[PartMeta] = []
    for p in parts:
        (kept if pr.part_may_match(p) else skipped).append(p)
    return tuple(kept), tuple(skipped)


def share(parts: Sequence[PartMeta], i: int, n: int) -> tuple[PartMeta, ...]:
    """Task ``i`` of ``n``'s share of ``parts`` (every part in exactly one share)."""
    return tuple(p for j, p in enumerate(parts) if j % n == i)


def exact(c: CollectionMeta, lo: int, hi: int) -> bool:
    """Whether the updates with ``lo <= time < hi`` can still be read exactly from ``c``.

    Compaction forwards times below the effective since to it. From ``lo > 0`` the batch is
    exact while ``lo - 1 >= since`` (nothing earlier was forwarded into it). From ``lo == 0``
    nothing was delivered before, so forwarded history belongs in the batch: it is exact while
    ``since < hi`` (history arrives at time ``since``, summing to the snapshot as of since).
    """
    since = effective_since(c)
    return since < hi if lo == 0 else lo - 1 >= since


def group(parts: Sequence[PartMeta], rows: int) -> list[tuple[PartMeta, ...]]:
    """Parts grouped into partitions: big parts alone, small ones together up to ``rows``."""
    out: list[tuple[PartMeta, ...]] = []
    pending: list[PartMeta] = []
    pending_rows = 0
    for p in sorted(parts, key=lambda p: (p.min_time, p.id)):
        if p.rows >= rows:
            out.append((p,))
            continue
        if pending and pending_rows + p.rows > rows:
            out.append(tuple(pending))
            pending, pending_rows = [], 0
        pending.append(p)
        pending_rows += p.rows
    if pending:
        out.append(tuple(pending))
    return out


# -- reading (executors) ----------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _blob(url: str, storage: tuple[tuple[str, object], ...]) -> BlobRead:
    # NB: one read-only blob handle per location per worker process (Python workers are
    # reused across tasks): an S3 client is expensive to build. Only the read half: a reading
    # task cannot write by construction.
    return resolve(url, storage_options=dict(storage)).read_half()


def blob_of(target: Target) -> BlobRead:
    """The read half of ``target``'s store, one per location per process (cached, shared)."""
    return _blob(target.url, target.storage)


def _reader(target: Target) -> PartReader:
    # NB: no part cache on executors: each part is read once per task.
    return PartReader(blob_of(target), cache_bytes=0)


def load_state(target: Target, *, must_exist: bool = False) -> State:
    """The location's current metadata, read from its log (no lock, no threads).

    Args:
        must_exist: a read: nothing ever committed at the URL (``seq == 0``, most likely a
            mistyped URL) is an error, not an empty location. Writes create locations.

    Raises:
        MissingResource: ``must_exist`` and no location exists at ``target.url``.
    """
    state = Machine(blob_of(target)).load()
    if must_exist and state.seq == 0:
        raise MissingResource(
            f"no persist location at {target.url!r}: nothing was ever committed there (a "
            f"mistyped URL?), so it has no collection {target.collection!r}"
        )
    return state


def _fresh(target: Target) -> CollectionMeta:
    return collection(load_state(target, must_exist=True).collections, target.collection)


def _batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    yield from table.to_batches(max_chunksize=BATCH_ROWS)


def read_snapshot(p: SnapshotPartition) -> Iterator[pa.RecordBatch]:
    """A raw partition's task: every update of its parts at or before ``as_of``, times set to
    ``as_of``, in Spark's layout.

    Raises:
        PartMissing: GC removed a part (no retry: raw rows are not definite).
        InvalidUsage: a value does not fit Spark's long.
    """
    reader = _reader(p.target)
    schema, target = p.types.reads, p.types.arrow_schema
    pr = pruner(p.filter, p.types, audit=p.audited)
    try:
        if pr is not None:
            _audit(pr, reader, p.audit)
        for part in p.parts:
            if pr is None:
                t = read_part_at(reader, part, schema, p.as_of)
            else:
                loaded = _load(pr, reader, part, p.as_of)
                if loaded is None:
                    continue
                t = loaded
            if len(t):
                yield from _batches(to_spark(t, target, time=p.as_of))
    except PartMissing as e:
        # NB: no retry on a newer state here: raw rows are not definite (compaction
        # consolidates them), so this task's rows would not fit the other tasks' rows.
        raise PartMissing(
            f"{e}: the raw read of {p.target.collection!r} as of {p.as_of} outlived the "
            f"GC grace period; run the query again (a consolidated read retries by itself)"
        ) from e


def _load(pr: Pruner, reader: PartReader, part: PartMeta, as_of: int) -> pa.Table | None:
    """``part``'s rows at or before ``as_of`` that match ``pr``'s filter (None: its stats rule
    it out), decoding only the record batches whose stats may match.

    NB: exact before consolidating (see :mod:`operators.filters`): a filter on ``(key, value)``
    keeps or drops every row of a ``(key, value)`` group alike.
    """
    t = pr.load(reader, part)
    if t is None:
        return None
    if part.max_time > as_of and len(t):
        t = t.filter(pc.less_equal(t.column("time"), pa.scalar(as_of, pa.uint64())))
    return t.filter(pr.bound.mask(t)) if len(t) else t


def _audit(pr: Pruner, reader: PartReader, parts: Sequence[PartMeta]) -> None:
    """Re-reads ``parts`` (which the driver's pruning skipped) through an auditing ``pr``,
    which checks that none holds a row matching its filter.

    Raises:
        Corruption: one does (its stats do not describe its data), naming the part.
        PartMissing: GC removed one.
    """
    for part in parts:
        # NB: the engine decides again on the same stats and filter as the driver did, so the
        # part is skipped again, and an auditing pruner reads what it skips.
        pr.load(reader, part)


def read_bucket(p: BucketPartition) -> Iterator[pa.RecordBatch]:
    """A consolidated partition's task: its bucket's contents as of ``as_of``, in Spark's layout.

    A part removed by GC is retried on the newest state (up to 4 tries): the answer is
    definite, so it is the same.

    Raises:
        PartMissing: every try found a part gone.
        InvalidUsage: since passed ``as_of`` meanwhile, or a value does not fit Spark's long.
    """
    parts, audit = p.parts, p.audit
    for attempt in range(4):
        try:
            table = _bucket_table(p, parts, audit)
            break
        except PartMissing:
            # NB: retrying on a newer state is sound: the consolidated contents as of as_of are
            # definite, so every state with as_of >= since yields this bucket's same rows.
            if attempt == 3:
                raise
            c = _fresh(p.target)
            if p.as_of < effective_since(c):
                raise InvalidUsage(
                    f"read of {p.target.collection!r} as of {p.as_of}: since passed it "
                    f"({effective_since(c)}) while the query ran; read as of a later time"
                ) from None
            if CollectionTypes.of(c).schema_id != p.types.schema_id:
                raise SchemaMismatch(
                    f"read of {p.target.collection!r}: its schema evolved while the query ran "
                    f"(now version {CollectionTypes.of(c).schema_id}); run the query again"
                ) from None
            parts, skipped = prune(snapshot_parts(c, p.as_of), p.filter, p.types)
            audit = share(skipped, p.bucket, p.buckets) if p.audited else ()
    yield from _batches(to_spark(table, p.types.arrow_schema, time=p.as_of))


def bucket_snapshot(p: BucketPartition) -> pa.Table:
    """The consolidated contents of ``p`` (its bucket, as of ``as_of``) in the part schema,
    read on the calling process (the overwrite's retraction, :mod:`operators.sink`).

    Raises:
        PartMissing: GC removed a part.
    """
    return _bucket_table(p, p.parts, p.audit)


def _bucket_table(p: BucketPartition, parts: tuple[PartMeta, ...],
                  audit: tuple[PartMeta, ...]) -> pa.Table:
    reader = _reader(p.target)
    schema = p.types.reads
    as_of = pa.scalar(p.as_of, pa.uint64())
    n, me = np.uint64(p.buckets), np.uint64(p.bucket)
    pr = pruner(p.filter, p.types, audit=p.audited)
    if pr is not None:
        _audit(pr, reader, audit)
    tables: list[pa.Table] = []
    hashes: list[npt.NDArray[np.uint64]] = []
    for part in parts:
        if pr is None:
            t = schema.read(reader, part)
            if part.max_time > p.as_of:
                t = t.filter(pc.less_equal(t.column("time"), as_of))
        else:
            loaded = _load(pr, reader, part, p.as_of)
            if loaded is None:
                continue
            t = loaded
        h = buckets.hash_keys(t.column("key"))
        if p.buckets > 1:
            # NB: filter each part to this bucket as it is read, so a task holds 1/n of the
            # data; the key hashes are kept for the consolidation.
            mine = h % n == me
            t, h = t.filter(pa.array(mine)), h[mine]
        tables.append(t)
        hashes.append(h)
    if not tables:
        return schema.schema.empty_table()
    return buckets.consolidate(pa.concat_tables(tables), p.as_of,
                               key_hashes=np.concatenate(hashes))


def read_range(p: RangePartition) -> Iterator[pa.RecordBatch]:
    """A streaming partition's task: its parts' updates with ``lo <= time < hi``, original
    times, in Spark's layout. The whole range is read before the first batch is yielded.

    Raises:
        PartMissing: GC removed a part (no retry; a restart re-plans from the checkpoint).
        InvalidUsage: a time, key or value does not fit Spark's long.
    """
    try:
        tables = list(_range_tables(p, p.parts))
    except PartMissing as e:
        # NB: no retry on a newer state: compaction may have merged this partition's parts
        # with other partitions' parts, and reading the merged part would duplicate their rows.
        # Parts outlive their replacement by the GC grace period (minutes), so only a
        # micro-batch that ran that long gets here; a restart re-plans it from the checkpoint.
        raise PartMissing(
            f"{e}: the micro-batch [{p.lo}, {p.hi}) of {p.target.collection!r} outlived the GC "
            f"grace period; restart the query (it resumes from its checkpoint)"
        ) from e
    for t in tables:
        yield from _batches(to_spark(t, p.types.arrow_schema))


def _range_tables(p: RangePartition, parts: tuple[PartMeta, ...]) -> Iterator[pa.Table]:
    reader = _reader(p.target)
    lo, hi = pa.scalar(p.lo, pa.uint64()), pa.scalar(p.hi, pa.uint64())
    for part in parts:
        t = p.types.read(reader, part)
        if part.min_time < p.lo or part.max_time >= p.hi:
            tc = t.column("time")
            t = t.filter(pc.and_(pc.greater_equal(tc, lo), pc.less(tc, hi)))
        if len(t):
            yield t
