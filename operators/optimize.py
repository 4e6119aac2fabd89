"""``PersistTable.optimize()``: a collection compacted by a Spark job, as Delta's ``OPTIMIZE``.

    from operators import PersistTable
    done = PersistTable.forPath(spark, url, "events").optimize()   # None: nothing to merge

The engine plans the merge (:func:`persist.distributed.plan_compaction`: the parts at or before
the effective since, cut into key ranges: ``partitions`` of them, or with None one per core of
the session and per :data:`TASK_ROWS` rows at most); each range runs as one Spark task
(``sparkContext.parallelize(task bytes).map(...)``) that merges with persist's own merge of
sorted runs (:func:`persist.distributed.run_compaction_task`, never Spark's ``groupBy``) and
stages its base parts under the plan's staging lease; the driver commits them in one
``ReplaceParts`` of exactly the planned parts (:func:`persist.distributed.commit_compaction`),
refused with ``PartsChanged`` if any changed meanwhile (nothing lost: rerun). This module only
translates: every rule is the engine's.

The commit opens the location's writer as ``reentrance_id`` (waiting up to ``lock_timeout``
for its lock): run it where no other writer holds the location, or give the writer's own
reentrance id (it takes the lock over, fencing that writer, as a restarted writer does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import persist
from persist.distributed import StagedPart, run_encoded_task


@dataclass(frozen=True)
class Optimized:
    """What :meth:`PersistTable.optimize` did."""

    #: The seq of its commit.
    seq: int
    #: Parts replaced and added.
    removed: int
    added: int
    #: Rows the replaced parts held, and the merged parts hold.
    rows_in: int
    rows_out: int
    #: Spark tasks (key ranges) it ran.
    tasks: int


#: With ``partitions=None``, a task per this many planned rows at most (and at most the
#: session's default parallelism): a tiny collection is merged by one task, not one per core.
TASK_ROWS = 1 << 20


def optimize(spark: Any, url: str, collection: str, *, storage_options: dict[str, Any],
             partitions: int | None, reentrance_id: str, lock_timeout: float,
             part_target_bytes: int) -> Optimized | None:
    """The job (see the module docstring); arguments as :meth:`PersistTable.optimize`."""
    n = partitions or max(1, int(spark.sparkContext.defaultParallelism))
    plan = persist.distributed.plan_compaction(url, collection, n=n,
                                               storage_options=storage_options,
                                               part_target_bytes=part_target_bytes,
                                               job="spark optimize",
                                               task_rows=1 if partitions else TASK_ROWS)
    if plan is None:
        return None
    try:
        data = [t.to_bytes() for t in plan.tasks]
        # NB: the task function is persist's own (Spark pickles it by reference): a worker
        # imports persist, not this connector and Spark's SQL modules
        outs = spark.sparkContext.parallelize(data, len(data)).map(run_encoded_task).collect()
        # NB: a retried task stages again; collect() returns one attempt's output per task,
        # and the lease's sweep reclaims what the other attempts staged
        staged = [StagedPart.from_bytes(b) for out in outs for b in out]
    except BaseException:
        plan.stager.release()
        raise
    seq = persist.distributed.commit_compaction(plan, staged, reentrance_id=reentrance_id,
                                                lock_timeout=lock_timeout)
    return Optimized(seq=seq, removed=len(plan.removed), added=len(staged), rows_in=plan.rows,
                     rows_out=sum(s.rows for s in staged), tasks=len(plan.tasks))
