"""``PersistedSource``: a persist collection as a Spark batch or streaming source.

    spark.read.format("persist").option("collection", "events").option("as_of", 41)
         .load("file:///data/loc")
    spark.readStream.format("persist").option("collection", "events").load("s3://bucket/prefix")

Frontiers are Spark offsets. A streaming offset ``{"upper": u}`` means "every update at a time
below ``u`` has been delivered"; a micro-batch from ``{"upper": a}`` to ``{"upper": b}`` is every
update with ``a <= time < b``. The stream's rules (offsets, exactness, data loss, the consumer
hold, admission) are the engine's stream cursor's (:class:`persist.distributed.StreamCursor`);
the stream reader here translates Spark's calls to it.

Where work happens (Spark runs a Python data source in several processes):

* the DataSource (``schema()``) and the readers are built in short-lived planning processes on
  the driver; they read the metadata log only (``persist.distributed.describe``), never data, and plan with
  the engine's public API (``CollectionInfo.snapshot``/``changes``, ``Scan.tasks``);
* a streaming reader's offset methods run in one long-lived driver process, whose cursor keeps
  a cached view of the metadata (refreshed at most every ``refreshInterval``);
* executors read the engine's tasks straight from the blob store (:mod:`operators.partitions`).

Like any other engine reading persist, this module uses only the public ``persist`` names
(``tests/test_layering.py`` enforces it): which parts a read needs, and whether it is exact,
is the engine's to say.

Spark pickles readers into every task, so nothing that holds a connection or a cache is pickled
with them (see ``__getstate__``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

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
        # NB: checked against the frontiers now, where the user acts
        as_of = c.resolve_as_of(as_of)
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
        kept, skipped = scan.counts
        if skipped:
            log.info("read of %r as of %d: pushed filters prune %d of %d parts (%s)",
                     c.name, self.as_of, skipped, skipped + kept,
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
        """The partitions, planned on first call (after any pushed filters): the engine's key
        ranges (consolidated) or groups of parts (raw; one empty partition if there are none),
        only of the parts the pushed filters' stats do not exclude.

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
        InvalidUsage: the engine's range checks (:meth:`CollectionInfo.check_changes`: times
            not sealed yet, an empty range, or history compacted into it), named in the
            feed's options.
    """
    assert opts.starting_version is not None
    lo = opts.starting_version
    hi = c.upper if opts.ending_version is None else opts.ending_version + 1
    try:
        c.check_changes(lo, hi)
    except InvalidUsage as e:
        raise InvalidUsage(f"change feed from startingVersion {lo} to endingVersion "
                           f"{hi - 1}: {e}") from None
    return lo, hi


def _with_change_type(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` with :data:`CHANGE_TYPE` appended from the sign of ``diff``."""
    for b in batches:
        kind = pc.if_else(pc.greater(b.column("diff"), 0), "insert", "delete")
        yield pa.RecordBatch.from_arrays(
            [*b.columns, kind.cast(pa.string())],
            schema=b.schema.append(pa.field(CHANGE_TYPE, pa.string(), nullable=False)))


# -- streaming -----------------------------------------------------------------------------


class PersistStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A collection's updates, micro-batch by micro-batch, as its upper advances.

    Spark's side of the engine's stream cursor (:class:`persist.distributed.StreamCursor`:
    offsets as frontiers, exactness, the data-loss policy, the consumer hold's lifecycle,
    admission by rows): each method translates Spark's offsets and read limits and delegates.
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.target = opts.target
        self.types = _types_for(describe(self.target), schema)
        t = self.target
        self.cursor = persist.distributed.StreamCursor(
            t.url, t.collection, storage_options=t.storage_options,
            schema_version=self.types.schema_id, start=_start(opts.starting_upper),
            refresh_interval=opts.refresh_interval, fail_on_data_loss=opts.fail_on_data_loss,
            hold=opts.read_hold, hold_lease=opts.read_hold_lease,
            hold_lock_timeout=opts.read_hold_lock_timeout)

    def initialOffset(self) -> dict[str, int]:
        """``earliest`` (the default): ``{"upper": 0}``, all retained history — everything
        compacted arrives at time ``since`` in the first batch, the snapshot as of since —
        then every change. ``latest``: the current upper. A number: that frontier."""
        return self.cursor.offset(self.cursor.initial())

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        """The end of the next micro-batch: a sealed frontier, never part of a time.

        NB: the defaults keep pyspark 4.0/4.1 working, which call ``latestOffset()`` without
        arguments (and so without admission control or data-loss checks here).
        """
        lo = None if start is None else self.cursor.frontier(start)
        rows = int(limit.max_rows) if isinstance(limit, ReadMaxRows) else None
        return self.cursor.offset(self.cursor.latest(lo, rows))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerTrigger`` rows per micro-batch if set, else everything available."""
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        """The collection's upper (for progress reporting), ignoring read limits and
        Trigger.AvailableNow."""
        return self.cursor.offset(self.cursor.reported())

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the upper sealed right now, then stop."""
        self.cursor.stop_at_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The micro-batch ``[start, end)`` (:meth:`StreamCursor.tasks`: the hold moved up to
        ``start - 1`` first; lost data skipped with failOnDataLoss=false).

        Raises:
            InvalidUsage: a malformed offset, ``end`` beyond the collection's upper (a
                checkpoint of another location), or lost data with failOnDataLoss.
            SchemaMismatch: the collection's schema evolved since the query started (restart
                it to read the new schema, as Delta asks).
        """
        lo, hi = self.cursor.frontier(start), self.cursor.frontier(end)
        return partitions_of(self.cursor.tasks(lo, hi, rows_per_task=self.opts.partition_rows),
                             self.types)

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
        self.cursor.commit(self.cursor.frontier(end))


def _start(starting: str | int) -> Literal["earliest", "latest"] | int:
    """The option ``startingOffsets`` (``ReadOptions.starting_upper``) as the cursor's start."""
    if starting == "earliest":
        return "earliest"
    if starting == "latest":
        return "latest"
    return int(starting)
