"""The ``persist`` sink: ``df.write`` and ``df.writeStream`` append updates to a collection.

    df.write.format("persist").mode("append").option("collection", "events").save(url)
    df.writeStream.format("persist").option("collection", "events")
      .option("checkpointLocation", ckpt).start(url)

The DataFrame has the columns ``key, value, time, diff``. Two phases, as Spark's write protocol
has them:

1. Each task encodes its rows as one storage part and stores it in the location's blob store
   itself (small parts ride back inline in the commit message instead), exactly as the writer
   would have (:func:`persist.indexed.write.new_part`). Nothing is visible yet: a part no
   commit references is invisible (and ``persist verify --delete-leaked`` reclaims it).
2. The driver takes the writer lock and commits every task's part plus the seal in **one**
   ``Client.apply``: all of the job's updates land at once, or none do.

A streaming sink also records, in the same atomic apply, the micro-batch's ``batchId`` in the
collection ``__sink_progress`` (key: the ``sinkId``, value: the last committed batchId). A
replayed micro-batch whose batchId is not above the recorded one is dropped, so a batch lands
exactly once however often Spark retries it.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import persist
from operators.options import Target, WriteOptions
from operators.partitions import blob_of, load_state
from operators.schema import CollectionTypes, arrow_type_for, check_sink_schema
from persist import layout
from persist.blob.base import Blob
from persist.errors import Determinate, InvalidUsage, LockHeld, PersistError, SchemaMismatch
from persist.indexed import gc, meta, write
from persist.indexed.columnar import Codec, from_updates
from persist.indexed.meta import AddPart, CollectionMeta, PartMeta
from persist.location import resolve

try:  # pyspark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - pyspark 4.0: write() gets Rows
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )

log = logging.getLogger("persist.spark")

#: The collection where streaming sinks record their last committed batchId.
PROGRESS = "__sink_progress"

#: Tasks' parts up to this size ride inline in the commit message (and the metadata commit);
#: larger ones go to their own blob. Kept below the writer's default so that a job of many
#: tasks does not make one huge metadata commit.
INLINE_BYTES = 16 << 10


@dataclass
class Staged(WriterCommitMessage):
    """One task's data: a part stored (or inline) but referenced by no commit yet."""

    part: PartMeta | None


# -- executors ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _writable(url: str, storage: tuple[tuple[str, object], ...]) -> Blob:
    return resolve(url, storage_options=dict(storage)).blob


def stage(target: Target, types: CollectionTypes, batches: Iterator[Any]) -> Staged:
    """Encodes a task's rows as one part and stores it (a Spark task's whole job)."""
    tables: list[pa.Table] = []
    rows: list[dict[str, Any]] = []
    for b in batches:
        if isinstance(b, pa.RecordBatch):
            if b.num_rows:
                tables.append(pa.Table.from_batches([b]))
        else:  # pragma: no cover - pyspark 4.0 streaming writers get Rows
            rows.append(b.asDict())
    if rows:  # pragma: no cover
        tables.append(pa.Table.from_pylist(rows))
    if not tables:
        return Staged(None)
    table = pa.concat_tables(tables, promote_options="permissive")
    schema = types.part_schema
    updates = from_updates(table, schema, Codec(schema.field("key").type),
                           Codec(schema.field("value").type))
    c = CollectionMeta(id=types.cid, name=types.name, key_type=types.key_type,
                       value_type=types.value_type)
    part = write.new_part(_writable(target.url, target.storage), c, updates,
                          inline_threshold=INLINE_BYTES, consolidated=False, staged=True)
    return Staged(part)


# -- the driver -----------------------------------------------------------------------------


def _open(target: Target, rid: str, lock_timeout: float) -> persist.Client:
    return persist.open(target.url, reentrance_id=rid, lock_timeout=lock_timeout,
                        storage_options=target.storage_options)


def prepare(opts: WriteOptions, schema: StructType, rid: str) -> CollectionTypes:
    """Loads the collection written to, creating it if it does not exist yet.

    A new collection gets the ``key_type``/``value_type`` options, else the Arrow types of the
    DataFrame's key/value columns.

    Raises:
        SchemaMismatch: the DataFrame does not fit the collection.
    """
    target = opts.target
    check_sink_schema(schema, None)
    c = load_state(target).collections.get(target.collection)
    if c is None:
        fields = {f.name: f.dataType for f in schema.fields}
        key = opts.key_type or arrow_type_for(fields["key"], column="key")
        value = opts.value_type or arrow_type_for(fields["value"], column="value")
        with _open(target, rid, opts.lock_timeout) as client:
            client.create_or_load(target.collection, key_type=key, value_type=value)
            c = client.state.collections[target.collection]
    types = CollectionTypes.of(c)
    for opt, want, have in (("key_type", opts.key_type, types.key),
                            ("value_type", opts.value_type, types.value)):
        if want is not None and want != have:
            raise SchemaMismatch(
                f"option {opt}={want}, but collection {c.name!r} exists with {opt} {have}"
            )
    check_sink_schema(schema, types)
    return types


def _parts(messages: list[WriterCommitMessage | None]) -> list[PartMeta]:
    return [m.part for m in messages if isinstance(m, Staged) and m.part is not None]


def discard(target: Target, parts: list[PartMeta]) -> None:
    """Deletes staged blobs that no commit references (after a failed or skipped commit)."""
    keys = [p.blob_key for p in parts if p.blob_key is not None]
    if not keys:
        return
    # NB: check against the current state anyway: a staged part that some commit references
    # must never be deleted, whatever the caller believes happened.
    referenced = gc.referenced(load_state(target))
    blob = _writable(target.url, target.storage)
    for key in keys:
        if key not in referenced:
            blob.delete(key)


Plan = Callable[[persist.Client], "dict[str, Any] | None"]


def commit_once(
    target: Target, rid: str, lock_timeout: float, parts: list[PartMeta], plan: Plan,
    landed: Callable[[persist.Client, int], bool],
) -> bool:
    """Opens the location as writer ``rid``, commits ``plan(client)`` in one apply, closes.

    ``plan`` returns the ``Client.apply`` arguments, or None when there is nothing to commit
    (the staged parts are then discarded). If the commit's outcome is unknown (the runtime
    went fail-stop), the location is reopened under the same reentrance id — which fences any
    commit still in flight, so it can no longer land — and ``landed`` decides what happened.

    Returns:
        True if this call's data is committed (now or by an earlier attempt), False if ``plan``
        declined.

    Raises:
        PersistError: the commit definitely failed; the staged parts were discarded.
    """
    seq: int | None = None
    try:
        with _open(target, rid, lock_timeout) as client:
            kwargs = plan(client)
            if kwargs is None:
                discard(target, parts)
                return False
            seq = client.state.seq
            client.apply(**kwargs).result()
            return True
    except (Determinate, InvalidUsage, LockHeld):
        discard(target, parts)  # definitely nothing landed
        raise
    except PersistError as e:
        if seq is None:
            discard(target, parts)
            raise
        with _open(target, rid, lock_timeout) as client:
            if landed(client, seq):
                log.warning("persist commit to %r reported %s but landed", target.collection, e)
                return True
        discard(target, parts)
        raise


def _added_since(target: Target, client: persist.Client, seq: int, ids: set[str]) -> bool:
    """Whether a commit after ``seq`` (up to ``client``'s state) added any of the parts ``ids``.

    NB: reads the log rather than the state: compaction may already have replaced the parts.
    """
    blob = blob_of(target)
    for s in range(seq + 1, client.state.seq + 1):
        data = blob.get(layout.log_key(s))
        if data is None:
            continue
        entry = meta.decode_commit(layout.log_key(s), data)
        if any(isinstance(op, AddPart) and op.part.id in ids for op in entry.ops):
            return True
    return False


class PersistBatchWriter(DataSourceArrowWriter):
    """``df.write.format("persist")``: one atomic apply of every task's part plus the seal."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidUsage(
                "persist collections are append-only: write with mode('append'), and express "
                "deletions as updates with negative diffs"
            )
        self.opts = WriteOptions.parse(options)
        # NB: one reentrance id per write job, chosen on the driver and pickled to the commit:
        # a retried commit of this job re-enters the lock at once instead of waiting for the
        # lease of a crashed attempt to lapse.
        self.rid = self.opts.reentrance_id or f"persist-spark-write:{uuid.uuid4().hex}"
        self.types = prepare(self.opts, schema, self.rid)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        """A task: stages its rows as one part (see :func:`stage`); nothing is visible yet.

        Raises:
            SchemaMismatch, InvalidUsage: rows that do not fit the collection.
            ExternalError: storing the part failed.
        """
        return stage(self.opts.target, self.types, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """The driver: one apply of every staged part plus a seal to the ``upper`` option
        (default: max time + 1); no rows and no ``upper`` commits nothing.

        Raises:
            PersistError: the commit failed (InvalidUsage: a time below upper, an ``upper``
                below the current one); the staged parts are deleted.
        """
        parts = _parts(messages)
        name = self.opts.target.collection
        upper = self.opts.upper
        if upper is None and parts:
            upper = max(p.max_time for p in parts) + 1
        if upper is None:
            return  # no rows, no upper: nothing to do

        def plan(client: persist.Client) -> dict[str, Any]:
            return {"parts": {name: parts}, "seals": {name: upper}}

        ids = {p.id for p in parts}
        commit_once(self.opts.target, self.rid, self.opts.lock_timeout, parts, plan,
                    lambda client, seq: _added_since(self.opts.target, client, seq, ids))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: deletes its staged blobs that no commit references."""
        discard(self.opts.target, _parts(messages))


class PersistStreamWriter(_StreamWriterBase):
    """``df.writeStream.format("persist")``: each micro-batch lands once, atomically with its
    batchId in ``__sink_progress``."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidUsage("persist collections are append-only: use outputMode('append')")
        self.opts = WriteOptions.parse(options)
        # NB: the sink id names one logical writer, so it is also the default reentrance id: a
        # restarted query re-enters the lock its crashed predecessor held.
        self.rid = self.opts.reentrance_id or f"persist-spark-sink:{self.opts.sink_id}"
        self.types = prepare(self.opts, schema, self.rid)

    def write(self, iterator: Iterator[Any]) -> Staged:
        """A task: stages its share of the micro-batch as one part, as the batch writer does."""
        return stage(self.opts.target, self.types, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The driver: one apply of the staged parts, a seal to their max time + 1 and
        ``batchId`` in ``__sink_progress``; a batchId already recorded is dropped (its staged
        parts deleted), so a replayed micro-batch lands once.

        Raises:
            PersistError: the commit definitely failed; the staged parts are deleted.
        """
        parts = _parts(messages)
        name, sink = self.opts.target.collection, self.opts.sink_id

        def plan(client: persist.Client) -> dict[str, Any] | None:
            last = progress(client, sink)
            if last is not None and batchId <= last:
                log.warning("persist sink %r: micro-batch %d was already committed (last %d); "
                            "dropping the replay", sink, batchId, last)
                return None
            client.create_or_load(PROGRESS, key_type=pa.string(), value_type=pa.int64())
            t = client.state.collections[PROGRESS].upper
            rows: list[tuple[tuple[str, int], int, int]] = [((sink, batchId), t, 1)]
            if last is not None:
                rows.append(((sink, last), t, -1))
            seals = {PROGRESS: t + 1}
            if parts:
                seals[name] = max(p.max_time for p in parts) + 1
            # NB: since follows upper on the progress collection, so compaction cancels each
            # retraction against its addition and the collection stays one row per sink.
            return {"parts": {name: parts} if parts else None, "writes": {PROGRESS: rows},
                    "seals": seals, "sinces": {PROGRESS: t}}

        def landed(client: persist.Client, seq: int) -> bool:
            last = progress(client, sink)
            return last is not None and last >= batchId

        commit_once(self.opts.target, self.rid, self.opts.lock_timeout, parts, plan, landed)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch failed: deletes its staged blobs that no commit references."""
        discard(self.opts.target, _parts(messages))


def progress(client: persist.Client, sink_id: str) -> int | None:
    """The last batchId streaming sink ``sink_id`` committed at ``client``'s location."""
    c = client.state.collections.get(PROGRESS)
    if c is None or c.upper == 0:
        return None
    _, read = client.create_or_load(PROGRESS, key_type=pa.string(), value_type=pa.int64())
    t = read.snapshot(c.upper - 1).to_arrow()
    mine = t.filter(pc.equal(t.column("key"), pa.scalar(sink_id, pa.string())))
    if len(mine) == 0:
        return None
    return int(pc.max(mine.column("value")).as_py())
