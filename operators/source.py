"""``PersistedSource``: a persist collection as a Spark batch or streaming source.

    spark.read.format("persist").option("collection", "events").option("as_of", 41)
         .load("file:///data/loc")
    spark.readStream.format("persist").option("collection", "events").load("s3://bucket/prefix")

Frontiers are Spark offsets. A streaming offset ``{"upper": u}`` means "every update at a time
below ``u`` has been delivered"; a micro-batch from ``{"upper": a}`` to ``{"upper": b}`` is every
update with ``a <= time < b``: the exact difference between the snapshots as of ``a - 1`` and
``b - 1``. Offsets only ever land on frontiers the writer sealed (``b <= upper``), so a batch
never holds part of a time, and replaying a batch after a restart reads the same updates.

Where work happens (Spark runs a Python data source in several processes):

* the DataSource (``schema()``) and the readers are built in short-lived planning processes on
  the driver; they read the metadata log only (``persist.distributed.describe``), never data, and plan with
  the engine's public API (``CollectionInfo.snapshot``/``changes``, ``Scan.tasks``);
* a streaming reader's offset methods run in one long-lived driver process, which keeps a
  cached view of the metadata (``persist.distributed.Watch``, refreshed at most every ``refreshInterval``);
* executors read the engine's tasks straight from the blob store (:mod:`operators.partitions`).

Like any other engine reading persist, this module uses only the public ``persist`` names
(``tests/test_layering.py`` enforces it): which parts a read needs, and whether it is exact,
is the engine's to say.

Spark pickles readers into every task, so nothing that holds a connection or a cache is pickled
with them (see ``__getstate__``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StringType, StructField, StructType

import persist
from operators import filters
from operators.filters import Pushed
from operators.options import ReadOptions
from operators.partitions import TaskPartition, describe, partitions_of
from operators.partitions import read as read_partition
from operators.schema import MAX_LONG, CollectionTypes
from persist import InvalidUsage, SchemaMismatch
from persist.distributed import CollectionInfo

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter
    from pyspark.sql.streaming.datasource import ReadLimit

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.0/4.1

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in: without it Spark never calls prepareForTriggerAvailableNow."""

    class ReadMaxRows:  # type: ignore[no-redef]
        max_rows: int

    class ReadAllAvailable:  # type: ignore[no-redef]
        pass


log = logging.getLogger("persist.spark")

#: The column a change feed adds: ``insert`` for an update with a positive diff, ``delete``
#: for a negative one (Delta's names; persist has no pre/post images, an update is its diffs).
CHANGE_TYPE = "_change_type"


def change_feed_schema(schema: StructType) -> StructType:
    """``schema`` (a collection's ``key, value, time, diff``) with :data:`CHANGE_TYPE`."""
    return StructType([*schema.fields, StructField(CHANGE_TYPE, StringType(), False)])


def _types_for(c: CollectionInfo, schema: StructType, *, change_feed: bool = False
               ) -> CollectionTypes:
    types = CollectionTypes.of(c)
    if change_feed and schema.fieldNames()[-1:] == [CHANGE_TYPE]:
        schema = StructType(schema.fields[:-1])
    if schema != types.spark_schema:
        raise SchemaMismatch(
            f"collection {c.name!r} reads as {types.spark_schema.simpleString()} (schema "
            f"version {types.schema_id}); a user-given schema must be exactly that, not "
            f"{schema.simpleString()}, and a DataFrame created before an evolution of the "
            f"collection's schema must be created again"
        )
    return types


# -- batch --------------------------------------------------------------------------------


class _PushFilters:
    """``pushFilters`` of :class:`PersistBatchReader`: a descriptor yielding :class:`_Push`.

    NB: pyspark 4.1-4.3 refuses to plan any read (``DATA_SOURCE_PUSHDOWN_DISABLED``) of a
    reader that overrides ``pushFilters`` while ``spark.sql.python.filterPushdown.enabled`` is
    false: it checks ``reader.pushFilters.__func__ is DataSourceReader.pushFilters``. That
    protects sources that rely on their filters being applied; persist does not (Spark then
    applies every filter itself, and nothing is pruned), so the bound callable below answers
    that check with the base method, and reads work either way. With the flag on, Spark calls
    it. (A pyspark that checks differently fails loudly with its own message, not wrongly.)
    """

    def __get__(self, reader: PersistBatchReader | None, owner: type | None = None) -> Any:
        return self if reader is None else _Push(reader)


class _Push:
    """``reader.pushFilters`` as Spark sees it (see :class:`_PushFilters`)."""

    def __init__(self, reader: PersistBatchReader) -> None:
        self._reader = reader
        # NB: an instance attribute: as a class attribute the function would bind to self.
        self.__func__ = getattr(DataSourceReader, "pushFilters", None)  # None before 4.1

    def __call__(self, spark_filters: list[Filter]) -> list[Filter]:
        """Pushes ``spark_filters`` (see :meth:`PersistBatchReader.push_filters`)."""
        return self._reader.push_filters(spark_filters)


class PersistBatchReader(DataSourceReader):
    """Reads a collection as of one time: consolidated (default) or raw updates.

    Planning (here, on the driver) checks ``as_of`` against the collection's frontiers and
    plans partitions from metadata; tasks read parts (:mod:`operators.partitions`).
    """

    def __init__(self, opts: ReadOptions, schema: StructType, pinned_as_of: int | None) -> None:
        c = describe(opts.target)
        self.types = _types_for(c, schema, change_feed=opts.change_feed)
        #: A change feed's times ``[lo, hi)`` (None: a snapshot read).
        self.changes: tuple[int, int] | None = None
        if opts.change_feed:
            self.changes = _feed_range(c, opts)
        if opts.tag is not None:
            as_of: int | None = c.tag(opts.tag)
        elif opts.timestamp_as_of is not None:
            as_of = c.as_of_timestamp(opts.timestamp_as_of)
        elif opts.change_feed:
            as_of = self.changes[1] - 1 if self.changes else None
        else:
            as_of = opts.as_of if opts.as_of is not None else pinned_as_of
        if as_of is None:
            if c.upper == 0:
                raise InvalidUsage(
                    f"collection {c.name!r} has nothing sealed yet (upper is 0): there is no "
                    f"time to read as of"
                )
            as_of = c.upper - 1
        c.snapshot(as_of)  # checks as_of against the frontiers now, where the user acts
        if as_of > MAX_LONG:
            raise InvalidUsage(f"as_of {as_of} does not fit Spark's long")
        self.as_of = as_of
        self.mode = opts.mode
        self.opts = opts
        #: What :meth:`pushFilters` accepted (nothing until Spark pushes filters).
        self.pushed = Pushed(None, ())
        #: The collection's metadata as of construction: planning happens on the driver, after
        #: Spark pushed its filters (or did not), when it first asks for the partitions.
        self._meta: CollectionInfo | None = c
        self._planned: list[InputPartition] | None = None

    def _plan(self, opts: ReadOptions, c: CollectionInfo) -> list[InputPartition]:
        sid = self.types.schema_id
        if self.changes is not None:
            lo, hi = self.changes
            scan = c.changes(lo, hi, schema_version=sid)
            return partitions_of(scan.tasks(rows_per_task=opts.partition_rows), self.types)
        scan = c.snapshot(self.as_of, filter=self.pushed.filter, schema_version=sid,
                          audit=opts.audit_pruning)
        if scan.skipped_parts:
            log.info("read of %r as of %d: pushed filters prune %d of %d parts (%s)",
                     c.name, self.as_of, len(scan.skipped_parts),
                     len(scan.skipped_parts) + len(scan.kept),
                     "audited" if opts.audit_pruning else "not audited")
        if self.mode == "consolidated":
            tasks = scan.tasks(consolidated=True, n=opts.num_partitions)
        else:
            tasks = scan.tasks(rows_per_task=opts.partition_rows)
        return partitions_of(tasks, self.types)

    def __getstate__(self) -> dict[str, Any]:
        # NB: the reader is pickled into every task; the metadata and the plan (with inline
        # parts' bytes) are only needed by partitions() on the driver.
        state = dict(self.__dict__)
        state["_planned"] = None
        state["_meta"] = None
        return state

    #: Spark's filter pushdown (pyspark >= 4.1): see :class:`_PushFilters`.
    pushFilters = _PushFilters()

    def push_filters(self, spark_filters: list[Filter]) -> list[Filter]:
        """Takes every filter of ``spark_filters`` persist applies exactly (on ``key``,
        ``value`` and their fields, see :mod:`operators.filters`) and returns the others,
        which Spark applies after the scan. Parts whose stats exclude the accepted filters are
        not read; every row read is kept only if it matches.

        With ``filterPushdown=false``, or ``auto`` on a pyspark that would reuse this read's
        plan for other queries (:func:`operators.filters.pushdown_safe`), takes none.

        Raises:
            InvalidUsage: called on a reader unpickled in a task (planning is the driver's).
        """
        if self._meta is None:
            raise InvalidUsage("filters are pushed on the driver, not in a task")
        self._planned = None
        if self.changes is not None:  # a change feed applies no persist filter: Spark does
            self.pushed = Pushed(None, ())
            return list(spark_filters)
        setting = self.opts.filter_pushdown
        if setting == "false" or (setting == "auto" and not filters.pushdown_safe()):
            self.pushed = Pushed(None, ())
            return list(spark_filters)
        if not filters.pushdown_safe():
            log.warning(
                "filterPushdown=true on a pyspark that reuses a pushed read plan for later "
                "queries of the same DataFrame that push no filter (see docs/spark.md, "
                "'Filters and pruning'): load() the collection again for each filtered query")
        self.pushed, rest = filters.push(spark_filters, self._meta, self.types.schema_id)
        return rest

    def partitions(self) -> Sequence[InputPartition]:
        """The partitions, planned on first call (after any pushed filters): key-hash buckets
        (consolidated) or groups of parts (raw; one empty partition if there are none), only
        of the parts the pushed filters' stats do not exclude.

        Raises:
            InvalidUsage: called on a reader unpickled in a task (the plan stays on the driver).
        """
        if self._planned is None:
            if self._meta is None:
                raise InvalidUsage("partitions() is planned on the driver, not in a task")
            self._planned = self._plan(self.opts, self._meta)
        return self._planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """A task: reads its engine task straight from the blob store (see
        :func:`operators.partitions.read`); a change feed's rows get ``_change_type``.

        Raises:
            InvalidUsage: not a partition of persist's.
        """
        if not isinstance(partition, TaskPartition):
            raise InvalidUsage(f"not a persist partition: {partition!r}")
        if partition.task.kind == "changes":
            return _with_change_type(read_partition(partition))
        return read_partition(partition)


def _feed_range(c: CollectionInfo, opts: ReadOptions) -> tuple[int, int]:
    """A change feed's times ``[lo, hi)``: ``startingVersion`` to ``endingVersion``
    inclusive (default: everything sealed).

    Raises:
        InvalidUsage: the range reaches times not sealed yet, or starts where history was
            compacted (the updates before it may have been forwarded into it).
    """
    assert opts.starting_version is not None
    lo = opts.starting_version
    hi = c.upper if opts.ending_version is None else opts.ending_version + 1
    if hi > c.upper:
        raise InvalidUsage(
            f"change feed of {c.name!r} to endingVersion {hi - 1}: times from its upper "
            f"{c.upper} on are not sealed yet")
    if lo >= hi:
        raise InvalidUsage(f"change feed of {c.name!r} from startingVersion {lo}: nothing is "
                           f"sealed at or after it (upper {c.upper})")
    since = c.since
    if not c.exact(lo, hi):
        raise InvalidUsage(
            f"change feed of {c.name!r} from startingVersion {lo} is no longer exact: its "
            f"since is {since} (updates before {lo} may have been compacted into it); start "
            f"at {since + 1} or later, or keep a read hold (option readHold on a stream)")
    return lo, hi


def _with_change_type(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` with :data:`CHANGE_TYPE` appended from the sign of ``diff``."""
    for b in batches:
        kind = pc.if_else(pc.greater(b.column("diff"), 0), "insert", "delete")
        yield pa.RecordBatch.from_arrays(
            [*b.columns, kind.cast(pa.string())],
            schema=b.schema.append(pa.field(CHANGE_TYPE, pa.string(), nullable=False)))


# -- streaming -----------------------------------------------------------------------------


def _upper(offset: Mapping[str, Any]) -> int:
    try:
        u = offset["upper"]
    except (KeyError, TypeError):
        raise InvalidUsage(f"not a persist offset: {offset!r}; expected {{'upper': N}}") from None
    if not isinstance(u, int) or isinstance(u, bool) or u < 0:
        raise InvalidUsage(f"not a persist offset: {offset!r}; expected {{'upper': N}}")
    return u


def _offset(upper: int) -> dict[str, int]:
    return {"upper": upper}


class PersistStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A collection's updates, micro-batch by micro-batch, as its upper advances."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.target = opts.target
        self.types = _types_for(describe(self.target), schema)
        self._watch: persist.distributed.Watch | None = None
        #: Trigger.AvailableNow: the upper to stop at.
        self._stop_at: int | None = None
        #: The frontier of our durable read hold as last asked for by this process, and the
        #: hold (a named consumer hold with a lease) once taken.
        self._held: int | None = None
        self._hold: persist.distributed.ConsumerHold | None = None
        self._renewed = 0.0
        self._memo: tuple[CollectionInfo, int, int, int, int] | None = None
        self._hold_tried = False
        self._warned: tuple[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # NB: the reader is pickled into every task (read() needs only its partition); the
        # metadata view and its part cache stay in the driver process.
        state = dict(self.__dict__)
        state["_watch"] = None
        state["_memo"] = None
        return state

    def _current(self, *, fresh: bool = False) -> CollectionInfo:
        if self._watch is None:
            t = self.target
            self._watch = persist.distributed.Watch(t.url, t.collection, storage_options=t.storage_options,
                                        interval=self.opts.refresh_interval)
            return self._watch.current()
        return self._watch.current(fresh=fresh)

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        """``earliest`` (the default): ``{"upper": 0}``, all retained history — everything
        compacted arrives at time ``since`` in the first batch, the snapshot as of since —
        then every change. ``latest``: the current upper. A number: that frontier."""
        c = self._current(fresh=True)
        start = self.opts.starting_upper
        upper = 0 if start == "earliest" else c.upper if start == "latest" else int(start)
        self._hold_tried = True
        self._hold_for(upper, c)
        return _offset(upper)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        """The end of the next micro-batch: a sealed frontier, never part of a time.

        NB: the defaults keep pyspark 4.0/4.1 working, which call ``latestOffset()`` without
        arguments (and so without admission control or data-loss checks here).
        """
        c = self._current()
        self._keep_hold()
        target = c.upper if self._stop_at is None else min(c.upper, self._stop_at)
        if start is None:
            return _offset(target)
        lo = _upper(start)
        if not self._hold_tried:
            # NB: once per process (a restart resumes here, not in initialOffset); if the lock
            # is busy, commit() retries rather than every 10 ms poll waiting for the lock.
            self._hold_tried = True
            self._hold_for(lo, c)
        if lo > 0 and lo - 1 < c.since:
            self._data_loss(c, lo)
        if target <= lo or (lo == 0 and c.since >= target):
            # NB: from 0 the first batch must reach past since to include forwarded history.
            return _offset(lo)
        if isinstance(limit, ReadMaxRows):
            return _offset(self._admit(c, lo, target, int(limit.max_rows)))
        return _offset(target)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerTrigger`` rows per micro-batch if set, else everything available."""
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        """The collection's upper (for progress reporting), ignoring read limits and
        Trigger.AvailableNow."""
        return _offset(self._current().upper)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the upper sealed right now, then stop."""
        self._stop_at = self._current(fresh=True).upper

    def _admit(self, c: CollectionInfo, lo: int, target: int, max_rows: int) -> int:
        """The largest end in ``(lo, target]`` whose batch holds at most ``max_rows`` rows,
        cut only between times; a single time with more rows is taken whole."""
        if self._memo is not None:
            mc, mlo, mtarget, mmax, end = self._memo
            if mc is c and (mlo, mtarget, mmax) == (lo, target, max_rows):
                return end
        counts = self._rows_per_time(c, lo, target)
        end = target
        taken = 0
        for t in sorted(counts):
            if taken and taken + counts[t] > max_rows:
                end = t  # everything before t fits; t itself does not
                break
            taken += counts[t]
        self._memo = (c, lo, target, max_rows, end)
        return end

    def _rows_per_time(self, c: CollectionInfo, lo: int, target: int) -> Counter[int]:
        assert self._watch is not None
        return self._watch.rows_per_time(c, lo, target)

    # -- micro-batches ---------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The micro-batch ``[start, end)``: groups of the parts that may hold its times.

        Moves the read hold (if any) up to ``start - 1`` first. If since passed ``start - 1``,
        the batch is no longer exact: with failOnDataLoss=false it starts at ``since + 1``
        instead (from 0, it is empty).

        Raises:
            InvalidUsage: a malformed offset, ``end`` beyond the collection's upper (a
                checkpoint of another location), or lost data with failOnDataLoss.
            SchemaMismatch: the collection's schema evolved since the query started (restart
                it to read the new schema, as Delta asks).
        """
        lo, hi = _upper(start), _upper(end)
        if lo >= hi:
            return []
        c = self._current()
        if c.upper < hi:
            c = self._current(fresh=True)
            if c.upper < hi:
                raise InvalidUsage(
                    f"micro-batch [{lo}, {hi}) of {c.name!r} ends beyond its upper {c.upper}: "
                    f"the checkpoint belongs to another location or collection"
                )
        if c.schema_version != self.types.schema_id:
            raise SchemaMismatch(
                f"the schema of {c.name!r} evolved to version {c.schema_version} since this "
                f"stream started with version {self.types.schema_id}: restart the query (from "
                f"its checkpoint) to read the new schema")
        if self._holding_below(lo - 1) and lo - 1 >= c.since:
            # NB: Spark plans a batch only once the one before it committed (a replay after a
            # restart starts where the last committed batch ended), so nothing below lo is
            # needed again. commit(end) alone would lag a batch: Spark commits a source's
            # offsets lazily, and never the last batch of a Trigger.AvailableNow run.
            self._set_hold(lo - 1)
        if not c.exact(lo, hi):
            self._data_loss(c, lo)
            if lo == 0:
                return []
            lo = c.since + 1
            if lo >= hi:
                return []
        scan = c.changes(lo, hi, schema_version=self.types.schema_id, held=True)
        return partitions_of(scan.tasks(rows_per_task=self.opts.partition_rows), self.types)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """A task: reads its range from the blob store (see
        :func:`operators.partitions.read`).

        Raises:
            InvalidUsage: not a streaming partition of persist's.
        """
        if not isinstance(partition, TaskPartition) or partition.task.kind != "changes":
            raise InvalidUsage(f"not a persist streaming partition: {partition!r}")
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark processed every update below ``end``: move the read hold up to it."""
        self._memo = None
        u = _upper(end)
        if self._holding_below(u - 1):
            self._set_hold(u - 1)

    def _holding_below(self, frontier: int) -> bool:
        """Whether a read hold is asked for and ours is (as far as we know) below frontier."""
        return (self.opts.read_hold is not None and frontier >= 0
                and (self._held is None or frontier > self._held))

    # -- data loss and the read hold -------------------------------------------------------

    def _data_loss(self, c: CollectionInfo, lo: int) -> None:
        since = c.since
        msg = (
            f"persist stream of {c.name!r} lost data: its next micro-batch starts at upper {lo}, "
            f"but history up to {since} (since) was compacted, so the updates at times in "
            f"[{lo}, {since}] are no longer distinguishable."
        )
        if self.opts.fail_on_data_loss:
            raise InvalidUsage(
                f"{msg} Set a readHold to keep since from passing a running stream, or set "
                f"failOnDataLoss=false to skip ahead to upper {since + 1}."
            )
        if self._warned != (lo, since):  # once, not at every poll
            self._warned = (lo, since)
            log.warning("%s Skipping ahead to upper %d (failOnDataLoss=false).", msg, since + 1)

    def _hold_for(self, upper: int, c: CollectionInfo) -> None:
        """Establishes the read hold for a stream that has delivered everything below
        ``upper``: at ``upper - 1`` (or, from 0, at the current since). A live hold of ours
        already there is adopted; a lapsed one (the query was stopped longer than its lease)
        is taken again if since has not passed the stream (else the data-loss check
        reports it)."""
        if self.opts.read_hold is None:
            return
        since = c.since
        frontier = upper - 1 if upper > 0 else since
        if frontier < since or (self._held is not None and self._held >= frontier):
            return  # already lost (the data-loss check reports it), or already held
        have = c.hold(self.opts.read_hold)
        if have is not None and have.kind == "hold" and not have.lapsed \
                and have.frontier == frontier:
            self._hold = self._consumer()
            self._held = frontier
            return
        self._take(frontier)

    def _consumer(self) -> persist.distributed.ConsumerHold:
        assert self.opts.read_hold is not None
        t = self.target
        return persist.distributed.ConsumerHold(
            t.url, t.collection, self.opts.read_hold,
            lease_ms=max(1, round(self.opts.read_hold_lease * 1000)),
            storage_options=t.storage_options, timeout=self.opts.read_hold_lock_timeout)

    def _take(self, frontier: int) -> None:
        """Takes the hold at ``frontier``, waiting up to ``readHoldLockTimeout`` for it to be
        committed (by this process under the lock, or by the running writer)."""
        assert self.opts.read_hold is not None
        t = self.target
        try:
            self._hold = persist.distributed.ConsumerHold.take(
                t.url, t.collection, self.opts.read_hold, frontier,
                lease=self.opts.read_hold_lease, storage_options=t.storage_options,
                timeout=self.opts.read_hold_lock_timeout)
        except persist.Timeout as e:
            # NB: failing to set a hold is never unsafe, only less protective: the hold stays
            # behind (or absent), and the next batch tries again.
            log.warning("read hold %r on %r not set to %s: %s (the next batch tries again)",
                        self.opts.read_hold, t.collection, frontier, e)
            return
        self._held = frontier
        self._renewed = time.monotonic()

    def _set_hold(self, frontier: int) -> None:
        """Moves the hold up to ``frontier`` (and renews it) without waiting for the writer.

        Raises:
            HoldLapsed: the hold lapsed while the query ran (it was not renewed within
                readHoldLease): what it protected may be compacted; restart the query.
        """
        if self._hold is None:
            self._take(frontier)
            return
        self._hold.advance(frontier, wait=False)
        self._held = frontier
        self._renewed = time.monotonic()

    def _keep_hold(self) -> None:
        """Renews the hold of an idle stream (every quarter of its lease), and reports a
        lapse an earlier request found.

        Raises:
            HoldLapsed: as :meth:`_set_hold`.
        """
        if self._hold is None:
            return
        if time.monotonic() - self._renewed > self.opts.read_hold_lease / 4:
            self._renewed = time.monotonic()
            self._hold.renew(wait=False)
