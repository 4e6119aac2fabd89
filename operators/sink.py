"""The ``persist`` sink: ``df.write`` and ``df.writeStream`` append updates to a collection.

    df.write.format("persist").mode("append").option("collection", "events").save(url)
    df.writeStream.format("persist").option("collection", "events")
      .option("checkpointLocation", ckpt).start(url)

The DataFrame has the columns ``key, value, time, diff``. Two phases, as Spark's write protocol
has them:

1. Each task stages its rows as storage parts with the engine's ``persist.distributed.Stager``
   (made by the driver, pickled into every task): stored in the location's blob store (small parts ride
   back inline in the commit message instead), invisible until a commit references them, and
   kept from the leaked-blob sweeps by the job's *staging lease* however long the job runs.
   Once the commit is decided the lease is released, and what a lost task attempt left is
   reclaimed a grace later.
2. The driver commits every task's parts plus the seal in **one** apply, through the engine's
   ``persist.distributed.Committer`` (the exactly-once protocol every distributed writer
   shares): all of the job's updates land at once, or none do.

A streaming sink commits each micro-batch with the idempotency token ``(sink id, batchId)``
(``persist.distributed.Token``): the engine records it in the same atomic apply, and a replayed
micro-batch whose batchId is not above the recorded one is dropped, so a batch lands exactly
once however often Spark retries it. The committer keeps the writer open between micro-batches
(``writerIdleTimeout``), settles a commit whose outcome is unknown from the log, and commits
again on a new writer if the kept one lost its lock.

The sink id is, by default, ``<collection>@<query id>``: the streaming query's ``id``, which
Spark keeps in the checkpoint (stable across restarts from it, new for a fresh one). A Python
writer is not told the id, but every write task sees it as the Spark local property
``sql.streaming.queryId`` (checked with pyspark 4.3), so each task returns it with its staged
part. A fresh checkpoint is thereby a new sink whose batchIds start over at 0 and land. An
explicit ``sinkId`` also records the query id (in ``__sink_queries``), so a query from another
checkpoint whose batchIds go back under it fails loudly instead of being dropped as replays.

``mode("overwrite")`` (batch only) replaces a collection's contents as a diff at one new time
``T`` (its upper): the retraction of the snapshot as of ``T - 1`` plus the new rows, sealed in
one apply (:meth:`PersistBatchWriter.commit`).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import persist
from operators.options import Target, WriteOptions
from operators.partitions import describe, find
from operators.schema import (
    CollectionTypes,
    arrow_type_for,
    check_sink_schema,
    from_spark,
    merged_types,
)
from persist import InvalidUsage, LeaseRevoked, SchemaMismatch
from persist.distributed import Committer, LatestValues, Overwrite, StagedPart, Stager, Token

try:  # pyspark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - pyspark 4.0: write() gets Rows
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )

log = logging.getLogger("persist.spark")

#: Where a sink with an explicit ``sinkId`` records the streaming query (its ``id``, one per
#: checkpoint) that last committed under it. (The last batchId per sink id is the engine's
#: idempotency token, ``persist.distributed.TOKENS``.)
QUERIES = LatestValues("__sink_queries", pa.string())

#: The Spark local property that holds a streaming query's id in its write tasks.
QUERY_ID_PROPERTY = "sql.streaming.queryId"

#: A sink task cuts a part whenever the rows it buffered reach this many Arrow bytes, so its
#: memory is bounded by about one part, not by its partition.
STAGED_PART_BYTES = 128 << 20

@dataclass
class Staged(WriterCommitMessage):
    """One task's data: parts stored (or inline) but referenced by no commit yet."""

    parts: tuple[StagedPart, ...]
    #: The stager the task staged with (its job's location, collection and lease).
    stager: Stager
    #: The streaming query's id, as the task saw it (None: a batch job, or not known).
    query_id: str | None = None


def _task_query_id() -> str | None:
    """The id of the streaming query this task belongs to (None outside one)."""
    ctx = TaskContext.get()
    if ctx is None:
        return None
    qid = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    return qid or None


# -- executors ------------------------------------------------------------------------------


def stage(stager: Stager, types: CollectionTypes, batches: Iterator[Any], *,
          at: int | None = None, replay: bool = False,
          part_bytes: int = STAGED_PART_BYTES) -> Staged:
    """Stages a task's rows as parts (a Spark task's whole job) with the job's ``stager``,
    under its staging lease (renewed before each part), which keeps the leaked-blob sweeps
    away from them until the driver commits, however long that takes.

    Rows are streamed: a part is cut whenever the rows buffered reach ``part_bytes`` (Arrow
    bytes as Spark hands them over), so a task holds about one part's rows, not its whole
    partition.

    ``at``: every row's time is set to it (an overwrite lands at one time).
    ``replay``: a stream's micro-batch, which may be one that already landed, run again
    (:meth:`Stager.stage`: its commit settles rows below the upper by its token).
    """
    qid = _task_query_id()
    parts: list[StagedPart] = []
    tables: list[pa.Table] = []
    buffered = 0
    rows: list[dict[str, Any]] = []
    for b in batches:
        if isinstance(b, pa.RecordBatch):
            if b.num_rows:
                tables.append(pa.Table.from_batches([b]))
                buffered += b.nbytes
                if buffered >= part_bytes:
                    parts.append(_stage_part(stager, types, tables, at, replay))
                    tables, buffered = [], 0
        else:  # pragma: no cover - pyspark 4.0 streaming writers get Rows
            rows.append(b.asDict())
    if rows:  # pragma: no cover
        tables.append(pa.Table.from_pylist(rows))
    if tables:
        parts.append(_stage_part(stager, types, tables, at, replay))
    return Staged(tuple(parts), stager, qid)


def _stage_part(stager: Stager, types: CollectionTypes, tables: list[pa.Table],
                at: int | None, replay: bool) -> StagedPart:
    """Stages ``tables`` (Spark's rows) as one part."""
    table = pa.concat_tables(tables, promote_options="permissive")
    return stager.stage(from_spark(table, types), at=at, replay=replay)


def _stager(target: Target, types: CollectionTypes, job: str) -> Stager:
    """A stager of ``types``'s schema version for a job, with a fresh staging lease."""
    return Stager.start(target.url, target.collection, job=job,
                                storage_options=target.storage_options,
                                schema_version=types.schema_id)


# -- the driver -----------------------------------------------------------------------------


def _open(target: Target, rid: str, lock_timeout: float) -> persist.Client:
    return persist.open(target.url, reentrance_id=rid, lock_timeout=lock_timeout,
                        storage_options=target.storage_options)


def prepare(opts: WriteOptions, schema: StructType, rid: str) -> CollectionTypes:
    """Loads the collection written to, creating it if it does not exist yet.

    A new collection gets the ``key_type``/``value_type`` options, else the Arrow types of the
    DataFrame's key/value columns. With ``mergeSchema``, an existing collection whose key or
    value lacks struct fields the DataFrame has is evolved first (``Client.evolve_schema``,
    compare-and-set on the version read here): those fields are added, nullable.

    Everything that can be refused from the options and the DataFrame's schema alone is
    refused here, on the driver, before Spark runs a single task: a DataFrame whose columns do
    not fit the collection's types, and an ``upper`` option below the collection's upper (the
    commit would seal backwards). Rows at times below the upper can only be seen by the tasks
    that read them.

    Raises:
        SchemaMismatch: the DataFrame does not fit the collection (or, with mergeSchema, the
            evolution it needs is not allowed, or another evolution came first).
        InvalidUsage: the ``upper`` option is below the collection's upper.
    """
    target = opts.target
    check_sink_schema(schema, None)
    # NB: one metadata read: a stream's commit makes a fresh writer, and so runs this, every
    # micro-batch.
    found = find(target)
    if found is not None:
        c = found
        if opts.upper is not None and opts.upper < c.upper:
            raise InvalidUsage(
                f"option upper={opts.upper} is below collection {c.name!r}'s upper {c.upper}: "
                f"a write seals at or beyond the upper (its rows go at times >= "
                f"{c.upper}); nothing was written")
    else:
        fields = {f.name: f.dataType for f in schema.fields}
        key = opts.key_type or arrow_type_for(fields["key"], column="key")
        value = opts.value_type or arrow_type_for(fields["value"], column="value")
        with _open(target, rid, opts.lock_timeout) as client:
            client.create_or_load(target.collection, key_type=key, value_type=value)
            c = client.info(target.collection)
    types = CollectionTypes.of(c)
    for opt, want, have in (("key_type", opts.key_type, types.key),
                            ("value_type", opts.value_type, types.value)):
        if want is not None and want != have:
            raise SchemaMismatch(
                f"option {opt}={want}, but collection {c.name!r} exists with {opt} {have}"
            )
    if opts.merge_schema:
        key, value = merged_types(schema, types)
        if (key, value) != (types.key, types.value):
            with _open(target, rid, opts.lock_timeout) as client:
                client.evolve_schema(
                    target.collection, key_type=None if key == types.key else key,
                    value_type=None if value == types.value else value,
                    expect_version=types.schema_id).result()
                c = client.info(target.collection)
            log.info("mergeSchema: evolved %r to schema version %d", c.name, c.schema_version)
            types = CollectionTypes.of(c)
    check_sink_schema(schema, types)
    return types


def _parts(messages: list[WriterCommitMessage | None]) -> list[StagedPart]:
    return [p for m in messages if isinstance(m, Staged) for p in m.parts]


class PersistBatchWriter(DataSourceArrowWriter):
    """``df.write.format("persist")``: one atomic apply of every task's part plus the seal.

    ``mode("append")`` adds the DataFrame's updates at their times. ``mode("overwrite")``
    replaces the collection's contents, as a diff at one new time ``T`` (the collection's upper
    when the write starts): the DataFrame's rows land at ``T`` (their ``time`` column is not
    used), together with the retraction of the snapshot as of ``T - 1``, and the seal — one
    apply, so readers see the old contents or the new ones, and history before ``T`` stays
    readable.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.opts = WriteOptions.parse(options, "write")
        # NB: one reentrance id per write job, chosen on the driver and pickled to the commit:
        # a retried commit of this job re-enters the lock at once instead of waiting for the
        # lease of a crashed attempt to lapse.
        self.rid = self.opts.reentrance_id or f"persist-spark-write:{uuid.uuid4().hex}"
        self.types = prepare(self.opts, schema, self.rid)
        target = self.opts.target
        #: The job's stager, with its staging lease (taken here, on the driver; tasks renew
        #: it as they stage; released when the commit is decided).
        self.stager = _stager(target, self.types, f"spark batch write to {target.collection!r}")
        #: Overwrite: the one time everything lands at (None: append).
        self.at: int | None = None
        if overwrite:
            self.at = describe(target).upper
            if self.opts.upper is not None and self.opts.upper <= self.at:
                raise InvalidUsage(
                    f"overwrite of {target.collection!r} lands at its upper {self.at}: option "
                    f"upper={self.opts.upper} must be above it"
                )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        """A task: stages its rows as one part (see :func:`stage`); nothing is visible yet.

        Raises:
            SchemaMismatch, InvalidUsage: rows that do not fit the collection.
            ExternalError: storing the part failed.
        """
        return stage(self.stager, self.types, iterator, at=self.at)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """The driver: one apply of every staged part plus a seal to the ``upper`` option
        (default: max time + 1); no rows and no ``upper`` commits nothing. An overwrite also
        retracts the current contents and seals to ``T + 1`` by default, rows or not.

        Raises:
            PersistError: the commit failed (InvalidUsage: a time below upper, an ``upper``
                below the current one, an overwrite that another write overtook); the staged
                parts are deleted.
        """
        parts = _parts(messages)
        name = self.opts.target.collection
        upper = self.opts.upper
        if self.at is not None and upper is None:
            upper = self.at + 1
        if upper is None and parts:
            upper = max(p.max_time for p in parts) + 1
        if upper is None:
            return  # no rows, no upper: nothing to do
        # NB: the retraction's parts are staged under the writer lock, by the commit's plan
        # (the engine's Overwrite); the committer discards them with the job's if the commit
        # fails, and they are released with them once it is decided.
        over = None if self.at is None else Overwrite(
            name, self.at, self.stager, schema_version=self.types.schema_id)
        try:
            _committer(self.opts, self.rid).commit({name: parts}, seals={name: upper},
                                                   plan=over)
        finally:
            self.stager.release([*parts, *(over.staged if over is not None else [])])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: deletes its staged blobs that no commit references, and releases
        its staging lease (what a lost task left is reclaimed by the sweeps)."""
        parts = _parts(messages)
        try:
            self.stager.discard(parts)
        finally:
            self.stager.release(parts)


class PersistStreamWriter(_StreamWriterBase):
    """``df.writeStream.format("persist")``: each micro-batch lands once, atomically with its
    batchId as its idempotency token (``persist.distributed.TOKENS``)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidUsage(
                "a persist stream only appends (outputMode('append')); to replace a "
                "collection's contents use a batch write with mode('overwrite')"
            )
        self.opts = WriteOptions.parse(options, "stream-write")
        self.types = prepare(self.opts, schema,
                             self.opts.reentrance_id or f"persist-spark-create:{uuid.uuid4().hex}")
        #: The query run's stager and staging lease, taken when the writer is first shipped
        #: to tasks (Spark makes a fresh writer for every commit, which needs none: it works
        #: with the stager each task's message carries). The lease is renewed by every task
        #: that stages and by every commit; never released (a stream has no end hook), so it
        #: lapses once the query stops, and only then can what a lost task left be reclaimed.
        self._stager: Stager | None = None

    @property
    def stager(self) -> Stager:
        """The query run's stager (taking its lease on first use)."""
        if self._stager is None:
            target = self.opts.target
            self._stager = _stager(target, self.types,
                                   f"spark stream write to {target.collection!r}")
        return self._stager

    def __getstate__(self) -> dict[str, Any]:
        self.stager  # noqa: B018 - tasks stage under the query's lease, taken once, here
        return dict(self.__dict__)

    def write(self, iterator: Iterator[Any]) -> Staged:
        """A task: stages its share of the micro-batch as one part, as the batch writer does,
        with the query's id. A replayed batch that already landed has rows below the upper:
        they are staged, and its commit drops them by the batch's token."""
        return stage(self.stager, self.types, iterator, replay=True)

    def sink_for(self, query_id: str | None) -> str:
        """The sink id: the ``sinkId`` option, else ``<collection>@<query id>``.

        Raises:
            InvalidUsage: no ``sinkId`` and the tasks did not see a query id.
        """
        if self.opts.sink_id is not None:
            return self.opts.sink_id
        if query_id is None:
            raise InvalidUsage(
                f"the persist sink of {self.opts.target.collection!r} could not learn its "
                f"streaming query's id (Spark local property {QUERY_ID_PROPERTY!r}), which "
                f"names its progress record by default: set option sinkId, one per checkpoint"
            )
        return f"{self.opts.target.collection}@{query_id}"

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The driver: one apply of the staged parts, a seal to their max time + 1 and
        ``batchId`` as its token; a batchId already recorded by the same query is
        dropped (its staged parts deleted), so a replayed micro-batch lands once.

        Raises:
            InvalidUsage: an explicit ``sinkId`` that another query (another checkpoint)
                already committed a batchId at or above ``batchId`` under.
            PersistError: the commit definitely failed; the staged parts are deleted.
        """
        staged = [m for m in messages if isinstance(m, Staged)]
        if not staged:
            return  # no tasks ran: nothing to land, and nothing a replay could duplicate
        queries = {m.query_id for m in staged if m.query_id is not None}
        if len(queries) > 1:
            raise InvalidUsage(f"one micro-batch's tasks saw several query ids: {queries}")
        query = next(iter(queries), None)
        parts = _parts(messages)
        name, sink = self.opts.target.collection, self.sink_for(query)
        explicit = self.opts.sink_id is not None
        rid = self.opts.reentrance_id or f"persist-spark-sink:{sink}"

        def plan(client: persist.Client) -> dict[str, Any] | None:
            last = progress(client, sink)
            before = sink_query(client, sink) if explicit else None
            if last is not None and batchId <= last:
                if explicit and query is not None and before is not None and before != query:
                    raise InvalidUsage(
                        f"persist sink {sink!r} (option sinkId) already committed micro-batch "
                        f"{last} for streaming query {before}, and this query {query} (another "
                        f"checkpoint) is at micro-batch {batchId}: its batches would be dropped "
                        f"as replays. Give each checkpoint its own sinkId, or leave sinkId "
                        f"unset (the default is one per checkpoint); or restart the original "
                        f"query from its own checkpoint. Nothing of batch {batchId} was written"
                    )
                log.warning("persist sink %r: micro-batch %d was already committed (last %d); "
                            "dropping the replay", sink, batchId, last)
                return None
            if explicit and query is not None:
                return QUERIES.put(client, sink, query, before)
            return {}

        # NB: keep the query's lease alive between micro-batches (a revoked one is replaced by
        # tasks with leases of their own, released here once the batch is decided).
        stager = next(m.stager for m in staged)
        with contextlib.suppress(LeaseRevoked):
            stager.renew()
        try:
            _committer(self.opts, rid, keep_writer=self.opts.writer_idle_timeout).commit(
                {name: parts} if parts else None,
                seals={name: max(p.max_time for p in parts) + 1} if parts else None,
                token=Token(sink, batchId), plan=plan)
        finally:
            stager.release(parts, keep_own=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch failed: deletes its staged blobs that no commit references (and
        releases the leases of its own that a task took)."""
        staged = [m for m in messages if isinstance(m, Staged)]
        if not staged:
            return
        stager, parts = staged[0].stager, _parts(messages)
        try:
            stager.discard(parts)
        finally:
            stager.release(parts, keep_own=True)


def progress(client: persist.Client, sink_id: str) -> int | None:
    """The last batchId streaming sink ``sink_id`` committed at ``client``'s location (its
    idempotency token's last seq)."""
    return client.token(sink_id)


def sink_query(client: persist.Client, sink_id: str) -> str | None:
    """The streaming query that last committed under explicit sink ``sink_id`` (None: not
    recorded, e.g. by a persist before query ids were recorded)."""
    query: str | None = QUERIES.get(client, sink_id)
    return query


def _committer(opts: WriteOptions, rid: str, *, keep_writer: float = 0.0) -> Committer:
    """The engine's exactly-once committer for the location ``opts`` writes to, as ``rid``."""
    target = opts.target
    return Committer(target.url, reentrance_id=rid, storage_options=target.storage_options,
                     lock_timeout=opts.lock_timeout, keep_writer=keep_writer)
