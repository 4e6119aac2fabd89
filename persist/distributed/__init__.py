"""``persist.distributed``: the engine's API for processes that are not a location's writer:
Spark's executors (``operators/``), Dask, Ray, Flink's Python API, or a fleet of plain scripts.

Reading: plan on one machine, read anywhere (:mod:`persist.distributed.read`)::

    from persist import distributed as pd
    info = pd.describe("s3://bucket/loc", "events")            # metadata only, no lock
    scan = info.snapshot(41, filter=persist.col("key") > 10)    # or info.changes(lo, hi)
    for task in scan.tasks(consolidated=True, n=8):             # serializable
        ...  # ship it; on the worker:
        for table in pd.read_task(task): ...
    for handle in scan.parts:                                   # or part by part
        pd.read_part(handle, filter=...)
    urls, rest = pd.parquet_files(scan)    # or let another engine's Parquet reader read
                                          # the Parquet parts (persist.distributed.native)
    scan.layers                            # the base (settled parts) and the runs on top:
                                          # what a consolidated read passes and what it sums
    df = pd.read_native(url, "events", build)   # ... with each piece's residual (time bound,
                                          # key range, whether to sum), planned again if GC
                                          # removed a file meanwhile

Writing: stage anywhere, commit once (:mod:`persist.distributed.stage`,
:mod:`persist.distributed.commit`)::

    stager = pd.Stager.start(url, "events", job="nightly load")    # takes a staging lease
    staged = [stager.stage(table)]         # on any machine: serializable StagedParts
    with pd.Committer(url, reentrance_id="loader") as committer:
        committer.commit({"events": staged}, seals={"events": 42},
                         token=pd.Token("nightly", 7))   # lands once, however often retried
    stager.release(staged)

Or let another engine's Parquet writer write the part files (:mod:`persist.distributed.adopt`;
Spark's native write, ``operators.write``)::

    st = pd.staging(stager)                # a directory under the stager's lease: st.url
    ...                                    # Spark writes its Parquet files there
    staged = pd.adopt(st)                  # one read of each file: crc32c, footer, times
    committer.commit({"events": staged}, seals=..., token=...)
    pd.clean_staging(st)                   # what no commit references

A staged part is invisible until a commit references it, kept from the leaked-blob sweeps by its
staging lease (:mod:`persist.indexed.state.lease`) while the job renews it, and bound to the
location, collection and types it was staged for. The :class:`Committer` is the exactly-once
protocol every distributed writer shares: commit with an idempotency token, settle an unknown
outcome from the log, keep a writer across commits, reopen after a lost lock (its module says
how). ``Client.apply(parts=..., token=...)`` is the one-commit primitive under it.

Everything here stands on the metadata log and the blob store alone: no runtime, no threads and
no writer lock, except where a commit (the ``Committer``) or a hold with no writer running
(:class:`ConsumerHold`) needs one. Every record it hands out is frozen and serializable.

Compacting: plan by key range, merge anywhere, replace once
(:mod:`persist.distributed.compaction`; Spark's ``PersistTable.optimize()``)::

    plan = pd.plan_compaction(url, "events", n=8)      # None: nothing to merge
    staged = [s for t in plan.tasks for s in pd.run_compaction_task(t)]   # on any machine
    pd.commit_compaction(plan, staged)   # PartsChanged if a planned part changed meanwhile

Named holds (:mod:`persist.distributed.holds`): a consumer in another process takes a hold with
a lease (:class:`ConsumerHold`), advances and renews it; the writer commits it through a
request it answers (or, with no writer running, the consumer commits it under the lock).
:func:`set_read_hold` is its older one-call form (a hold with a century's lease), kept as a thin
alias.
"""

from persist.distributed.adopt import Staging, adopt, clean_staging, native_types, staging
from persist.distributed.commit import WRITERS, Committer, Overwrite, Writers
from persist.distributed.compaction import (
    CompactionPlan,
    CompactionTask,
    commit_compaction,
    compact_distributed,
    plan_compaction,
    run_compaction_task,
    run_encoded_task,
)
from persist.distributed.holds import ConsumerHold, set_read_hold
from persist.distributed.native import (
    RUNS_SHARE,
    FileMarks,
    FileRead,
    KeyBounds,
    NativePlan,
    Residual,
    consolidate,
    key_bounds,
    layered,
    null_keys,
    parquet_files,
    parquet_task,
    plan_native,
    read_native,
    settled,
)
from persist.distributed.read import Watch, describe, read_part, read_task
from persist.distributed.s3a import SOURCES as S3A_SOURCES
from persist.distributed.s3a import hadoop_options, s3a_failure
from persist.distributed.stage import Stager, check_type
from persist.distributed.stream import StreamCursor
from persist.indexed.format.transfer import StagedPart, Token
from persist.indexed.read.scan import (
    Address,
    CollectionInfo,
    Layers,
    PartHandle,
    ReadTask,
    Scan,
)
from persist.runtime.client import TOKENS, LatestValues

__all__ = [
    "RUNS_SHARE",
    "S3A_SOURCES",
    "TOKENS",
    "WRITERS",
    "Address",
    "CollectionInfo",
    "Committer",
    "CompactionPlan",
    "CompactionTask",
    "ConsumerHold",
    "FileMarks",
    "FileRead",
    "KeyBounds",
    "LatestValues",
    "Layers",
    "NativePlan",
    "Overwrite",
    "PartHandle",
    "ReadTask",
    "Residual",
    "Scan",
    "StagedPart",
    "Stager",
    "Staging",
    "StreamCursor",
    "Token",
    "Watch",
    "Writers",
    "adopt",
    "check_type",
    "clean_staging",
    "commit_compaction",
    "compact_distributed",
    "consolidate",
    "describe",
    "hadoop_options",
    "key_bounds",
    "layered",
    "native_types",
    "null_keys",
    "parquet_files",
    "parquet_task",
    "plan_compaction",
    "plan_native",
    "read_native",
    "read_part",
    "read_task",
    "run_compaction_task",
    "run_encoded_task",
    "s3a_failure",
    "set_read_hold",
    "settled",
    "staging",
]
