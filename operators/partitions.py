"""Input partitions and what a Spark task does with one: read an engine read task, yield Arrow
in Spark's layout.

The engine plans every read (:mod:`persist.distributed`: ``CollectionInfo.snapshot`` /
``changes``, ``Scan.tasks``) and reads every task (``persist.distributed.read_task``): which parts a read
needs, how filters prune them, how consolidated reads split keys and retry after GC, and when a
range is exact are its rules, stated once there. A partition here is one such task (picklable:
Spark ships it to an executor) plus the Spark types its rows are converted to.

Three kinds, by the task's kind:

* ``snapshot`` (batch, ``mode=raw``): a group of parts, every update at or before ``as_of``
  with its time forwarded to ``as_of``;
* ``consolidated`` (batch, ``mode=consolidated``): the contents of one key range;
* ``changes`` (streaming micro-batches and the batch change feed): the updates with
  ``lo <= time < hi``, original times.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

import persist
from operators.options import Target
from operators.schema import CollectionTypes, to_spark
from persist import MissingResource

log = logging.getLogger("persist.spark")

#: Rows per RecordBatch handed to Spark.
BATCH_ROWS = 1 << 17


class TaskPartition(InputPartition):
    """One engine read task (:class:`persist.distributed.ReadTask`) and the Spark types of its rows."""

    def __init__(self, task: persist.distributed.ReadTask, types: CollectionTypes) -> None:
        super().__init__(None)
        self.task = task
        self.types = types


def partitions_of(tasks: list[persist.distributed.ReadTask], types: CollectionTypes
                  ) -> list[InputPartition]:
    """Spark's partitions for ``tasks``, one each."""
    return [TaskPartition(t, types) for t in tasks]


def describe(target: Target) -> persist.distributed.CollectionInfo:
    """``target``'s collection as the location's latest metadata shows it (no lock).

    Raises:
        MissingResource: no location at the URL (a mistyped URL?).
        UnknownCollection: no such collection (the message lists those there are).
    """
    return persist.distributed.describe(target.url, target.collection,
                            storage_options=target.storage_options)


def find(target: Target) -> persist.distributed.CollectionInfo | None:
    """``target``'s collection as :func:`describe` shows it; None if it does not exist yet
    (a sink creates it)."""
    try:
        return describe(target)
    except (MissingResource, persist.UnknownCollection):
        return None


def _batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    yield from table.to_batches(max_chunksize=BATCH_ROWS)


def read(p: TaskPartition) -> Iterator[pa.RecordBatch]:
    """A task: its engine task's rows in Spark's layout (snapshot and consolidated rows at
    ``as_of``; change rows at their own times).

    Raises:
        PartMissing: GC removed a part the task needed (a consolidated task first retries on
            the newest state; raw and change tasks do not: their rows are not definite, and
            a restarted stream re-plans from its checkpoint).
        InvalidUsage: a time, key or value does not fit Spark's long.
    """
    task = p.task
    time = None if task.kind == "changes" else task.as_of
    target = p.types
    try:
        tables = persist.distributed.read_task(task)
        if task.kind == "changes":
            # NB: the whole range is read before the first batch is yielded, so a part that
            # vanishes fails the task before Spark saw any of its rows.
            tables = iter(list(tables))
        for t in tables:
            yield from _batches(to_spark(t, target.arrow_schema, time=time))
    except persist.PartMissing as e:
        what = (f"the micro-batch [{task.lo}, {task.hi})" if task.kind == "changes"
                else f"the read as of {task.as_of}")
        raise persist.PartMissing(
            f"{e}: {what} of {task.collection.name!r} outlived the GC grace period; run it "
            f"again (a streaming query resumes from its checkpoint)") from e
