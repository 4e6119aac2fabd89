"""Distributed compaction: a collection's merge planned on one machine, run as key-range tasks
anywhere, committed once.

::

    from persist import distributed as pd
    plan = pd.plan_compaction(url, "events", n=8)      # None: nothing to merge
    staged = [s for task in plan.tasks for s in pd.run_compaction_task(task)]  # anywhere
    seq = pd.commit_compaction(plan, staged, reentrance_id="optimize")

**The plan** (:func:`plan_compaction`) reads the metadata only. It takes every part of the
collection whose rows are all at or before the effective since ``f`` (the frontier the merge
forwards to: the since, or a lower durable hold), unless they already are a base of
key-disjoint consolidated parts (``compact.layout``), and cuts the key range into ``n`` ranges
of about equal rows (from the parts' per-batch key bounds; fewer when they hold fewer than
``task_rows`` rows each). It takes a staging lease.

**A task** (:func:`run_compaction_task`, on any machine) reads its key range of each planned
part: of a sorted Parquet part only the row groups the range reaches, fetched alone (a ranged
read per run of them, plus the file's tail) and each verified against the checksum its
metadata records before a byte is decoded (``PartStats.groups``,
:meth:`persist.indexed.read.parts.PartReader.read_groups`), so ``n`` tasks fetch the planned
parts about once between them; a part that records no row groups is fetched whole and
verified whole. It forwards times to ``f``, merges with persist's consolidation (sums per
``(key, value, time)``, zero diffs dropped; ``DiffOverflow`` if a sum leaves int64), cuts the
result by key into parts of about ``part_target_bytes`` and stages each under the plan's lease.
Every output part is a base part: consolidated, at the one time ``f``, with exact key bounds,
and key-disjoint from every other (the ranges are disjoint). A task that is run twice (a
retried Spark task) stages twice; only the parts the commit is given count, and the lease's
sweep reclaims the rest.

**The commit** (:func:`commit_compaction`) opens the location's writer (or takes one) and
commits one ``ReplaceParts`` of exactly the planned parts by the staged ones
(``Client.replace_parts``), decided on the state it commits on: if any planned part is gone (a
writer's own compaction replaced it, a restore), the collection was replaced, or its since or a
read hold of the writer's process is now below ``f``, it is refused with ``PartsChanged`` and
the staged parts are discarded. A concurrent append is no conflict: its parts were not planned
and stay. An unknown outcome is settled from the log (whether a commit added a staged part)
after reopening, which fences the old writer.

Safety: staged parts are invisible and kept from the sweeps while the lease lives; a killed
driver or task leaves only staged blobs, reclaimed once the lease lapses; a lapsed lease is
``LeaseRevoked`` at the commit (nothing committed); the replaced parts are retired like any
merge's, so forks and holds that read them keep them until GC's grace (DESIGN.md §9).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import msgspec
import numpy as np
import pyarrow as pa

from persist import crashpoints
from persist.distributed.read import describe
from persist.distributed.stage import Stager, discard
from persist.distributed.stores import read_half, writable
from persist.errors import Determinate, InvalidUsage, LockHeld, PersistError
from persist.indexed.format import columnar, evolve, sorting, stats, write
from persist.indexed.format.meta import CollectionMeta, PartMeta
from persist.indexed.format.transfer import StagedPart, Travelling
from persist.indexed.maintenance import compact
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import Address
from persist.indexed.state.transitions import effective_since

log = logging.getLogger("persist.distributed")

#: The format of a :class:`CompactionTask` record. 2: a part may be a compressed inline part
#: (metadata format 9), which a persist that predates it cannot decode.
TASK_VERSION = 2
#: Output parts of a distributed compaction are cut at about this many Arrow bytes (the
#: writer's default base part target).
PART_TARGET_BYTES = 64 << 20


class CompactionTask(Travelling, msgspec.Struct, frozen=True, kw_only=True):
    """One key range of a distributed compaction: run anywhere by :func:`run_compaction_task`.

    Serializable: :meth:`to_bytes` / :meth:`from_bytes`, and pickle, both checksummed.
    """

    version: int = TASK_VERSION
    #: Its index in the plan's tasks.
    index: int
    #: Stages the output under the plan's lease (carries the location and the collection's
    #: types and schema history).
    stager: Stager
    #: The planned parts (every task reads its range of each).
    parts: tuple[PartMeta, ...]
    #: Times are forwarded to this (the plan's effective since).
    frontier: int
    #: The key range: ``lower <= key < upper`` (None: unbounded); null keys go to the task
    #: with no upper bound (the last).
    lower: int | None
    upper: int | None
    part_target_bytes: int = PART_TARGET_BYTES
    stats_bytes: int = stats.STATS_BYTES
    batch_rows: int = columnar.BATCH_ROWS

    KIND: ClassVar[str] = "persist.CompactionTask"
    NEWEST: ClassVar[int] = TASK_VERSION
    NEWER: ClassVar[str] = "plan and run with the same persist version"


class CompactionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A distributed compaction of one collection: its tasks, and what its commit replaces."""

    address: Address
    collection: str
    collection_id: int
    #: The ids of the planned parts: exactly what the commit replaces.
    removed: tuple[str, ...]
    frontier: int
    tasks: tuple[CompactionTask, ...]
    #: The plan's staging lease (released by :func:`commit_compaction`).
    stager: Stager
    #: The rows the planned parts hold.
    rows: int


def plan_compaction(url: str, collection_name: str, *, n: int = 2,
                    storage_options: Mapping[str, Any] | None = None,
                    part_target_bytes: int = PART_TARGET_BYTES,
                    stats_bytes: int = stats.STATS_BYTES, job: str = "compaction",
                    task_rows: int = 1) -> CompactionPlan | None:
    """Plans a compaction of ``collection_name`` at ``url`` as up to ``n`` key-range tasks
    (see the module docstring), from its latest metadata; takes a staging lease.

    Args:
        task_rows: fewer tasks when the planned parts hold fewer than ``n * task_rows`` rows
            (about that many rows each, at least one task): a task's fixed cost (a worker's
            start, its imports, a staged part's commit record) is not worth paying for a
            range of a few rows.

    Returns:
        The plan, or None if there is nothing to merge (the parts at or before the effective
        since already are a base, or there are fewer than two of them and none needs merging).

    Raises:
        InvalidUsage: ``n`` or a size that is not an int >= 1.
        MissingResource, UnknownCollection: as :func:`persist.distributed.describe`.
        ExternalError: storage failed.
    """
    for what, value in (("n", n), ("part_target_bytes", part_target_bytes),
                        ("task_rows", task_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidUsage(f"plan_compaction: {what} must be an int >= 1, not {value!r}")
    info = describe(url, collection_name, storage_options=storage_options)
    c = info.meta
    f = effective_since(c)
    ready = tuple(p for p in c.parts if not p.rows or p.max_time <= f)
    if not _worth_merging(c, ready, f):
        return None
    n = max(1, min(n, sum(p.rows for p in ready) // task_rows))
    cuts = _cuts(ready, n) if compact.has_base(c) else []
    bounds = [None, *cuts, None]
    stager = Stager.start(url, collection_name, job=job, storage_options=storage_options)
    tasks = tuple(CompactionTask(index=i, stager=stager, parts=ready, frontier=f,
                                 lower=bounds[i], upper=bounds[i + 1],
                                 part_target_bytes=part_target_bytes, stats_bytes=stats_bytes)
                  for i in range(len(bounds) - 1))
    return CompactionPlan(address=info.address, collection=c.name, collection_id=c.id,
                          removed=tuple(p.id for p in ready), frontier=f, tasks=tasks,
                          stager=stager, rows=sum(p.rows for p in ready))


def _worth_merging(c: CollectionMeta, ready: tuple[PartMeta, ...], f: int) -> bool:
    """Whether merging ``ready`` changes anything: not when they already are a base (every one
    a key-disjoint consolidated part at one time), or one consolidated part."""
    if not ready:
        return False
    if compact.has_base(c):
        base, _ = compact.layout(c, f)
        ids = {b.id for b in base}
        return any(p.id not in ids for p in ready)
    return len(ready) > 1 or not ready[0].consolidated


def _cuts(parts: Sequence[PartMeta], n: int) -> list[int]:
    """Up to ``n - 1`` increasing key values that cut the keys of ``parts`` into ranges of
    about equal rows, from their per-batch key bounds (a part without them counts as its rows
    at its lowest key)."""
    weighted: list[tuple[int, int]] = []
    for p in parts:
        st = p.stats
        b = None if st is msgspec.UNSET else next(
            (b for b in st.batches if b.path == "key"), None)
        if (st is not msgspec.UNSET and b is not None and len(b.lo) == len(st.batch_rows)
                and all(isinstance(x, int) for x in b.lo)):
            weighted.extend((int(lo), int(r)) for lo, r in zip(b.lo, st.batch_rows, strict=True))  # type: ignore[arg-type]
            continue
        kb = compact.key_bounds(p)
        if kb is not None and kb[0] is not None:
            weighted.append((kb[0], p.rows))
    if n < 2 or not weighted:
        return []
    weighted.sort()
    total = sum(r for _, r in weighted)
    out: list[int] = []
    acc = 0
    share = total / n
    for value, rows in weighted:
        if acc >= share * (len(out) + 1) and (not out or value > out[-1]):
            out.append(value)
            if len(out) == n - 1:
                break
        acc += rows
    return out


def run_compaction_task(task: CompactionTask) -> list[StagedPart]:
    """Runs ``task`` on this machine: its key range of the planned parts, merged and staged
    (see the module docstring).

    Returns:
        The staged base parts (none if every row in the range cancelled out).

    Raises:
        DiffOverflow: a sum of diffs leaves int64 (nothing is staged).
        LeaseRevoked: never here (a revoked lease makes this stage under a fresh one, refused
            at the commit if the plan's lapsed).
        ExternalError, Corruption, PartMissing: reading a part or staging failed (a part
            collected since the plan: plan again).
    """
    crashpoints.hit("distributed.compaction.task")
    stager = task.stager
    c = stager.collection
    view = evolve.View.of(c)
    reader = PartReader(read_half(stager.address), cache_bytes=0)
    lower = None if task.lower is None else (task.lower, "left")
    upper = None if task.upper is None else (task.upper, "left")
    pieces: list[pa.Table] = []
    for p in task.parts:
        if not p.rows:
            continue
        # NB: only the row groups of its key range are fetched (each verified): N tasks read
        # the planned parts about once between them, not N times
        lz = compact.LazyRun.of(reader, view, p, fetch=False) if compact.has_base(c) else None
        if lz is not None:
            t = lz.read(reader, view, task.frontier, lower, upper)
        else:
            t = _range(columnar.forward(view.read(reader, p), task.frontier), c, task)
        if len(t):
            pieces.append(t)
    if not pieces:
        return []
    merged = columnar.consolidate(pa.concat_tables(pieces))
    blob = writable(stager.address)
    out: list[StagedPart] = []
    try:
        for piece in compact.split_by_key(merged, task.part_target_bytes):
            part = write.new_part(blob, c, piece, inline_threshold=0, consolidated=True,
                                  stats_bytes=max(task.stats_bytes, compact.KEY_STATS_BYTES),
                                  batch_rows=task.batch_rows, lease_id=stager.lease_for_staging())
            out.append(StagedPart(location=stager.address.url, collection=c.name,
                                  collection_id=c.id,
                                  schema=evolve.history(c)[view.target],
                                  part=evolve.tag(part, view.target)))
            crashpoints.hit("distributed.compaction.staged")
    except BaseException:
        discard(stager.address, out)
        raise
    return out


def run_encoded_task(data: bytes) -> list[bytes]:
    """:func:`run_compaction_task` of a task given as its bytes (:meth:`CompactionTask.
    to_bytes`), its staged parts returned as theirs (:meth:`StagedPart.to_bytes`): what a
    job's worker runs (``PersistTable.optimize()``'s Spark tasks). It lives here so a worker
    imports persist only, not the connector (and Spark's SQL modules) around it.

    Raises:
        As :func:`run_compaction_task`; IncompatibleFormat, Corruption: ``data`` is not a
        task of this persist's format.
    """
    return [s.to_bytes() for s in run_compaction_task(CompactionTask.from_bytes(data))]


def _range(table: pa.Table, c: CollectionMeta, task: CompactionTask) -> pa.Table:
    """The rows of ``table`` in ``task``'s key range (all of them for a key type without a
    base: its plan has one task)."""
    if not compact.has_base(c) or (task.lower is None and task.upper is None):
        return table
    table = sorting.sort_updates(table)
    k = compact.sorted_keys(table)
    a = 0 if task.lower is None else int(np.searchsorted(k, task.lower, side="left"))
    if task.upper is None:
        return table.slice(a)  # with the null keys (sorted last)
    b = int(np.searchsorted(k, task.upper, side="left"))
    return table.slice(a, max(0, b - a))


def commit_compaction(plan: CompactionPlan, staged: Iterable[StagedPart], *,
                      client: Any = None, reentrance_id: str = "persist-compaction",
                      lock_timeout: float = 60.0,
                      opener: Callable[[], Any] | None = None) -> int:
    """Commits ``plan``'s merge: its planned parts replaced by ``staged`` (every task's
    output), in one commit, exactly once; then releases the plan's lease.

    Args:
        client: a writer ``persist.Client`` of the plan's location to commit on (kept open);
            None: open one as ``reentrance_id`` (waiting up to ``lock_timeout`` seconds for
            the lock) and stop it after, or call ``opener`` for it.

    Returns:
        The seq of the commit.

    Raises:
        PartsChanged: a planned part changed since the plan (see the module docstring):
            nothing committed, the staged parts discarded.
        LeaseRevoked: the plan's lease lapsed: nothing committed, staged parts discarded.
        LockHeld: another writer held the lock (staged parts discarded).
        Determinate: the commit's outcome was unknown and, read back, it did not land.
        PersistError: an unknown outcome that could not be settled: on the caller's
            ``client`` (fail-stop now: reopen, then ``Client.landed`` tells), or reopening
            failed. The staged parts are kept (the commit may have landed); the lease's sweep
            reclaims them otherwise.
    """
    parts = list(staged)

    def give_up() -> None:
        discard(plan.address, parts)
        plan.stager.release(parts)

    def opened() -> Any:
        if opener is not None:
            return opener()
        from persist import open as open_location

        return open_location(plan.address.url, reentrance_id=reentrance_id,
                             lock_timeout=lock_timeout,
                             storage_options=plan.address.storage_options)

    own = client is None
    try:
        writer = opened() if own else client
    except (Determinate, InvalidUsage, LockHeld):
        give_up()
        raise
    try:
        seq = writer.state.seq
        try:
            landed: int = writer.replace_parts(
                plan.collection, plan.removed, parts, frontier=plan.frontier,
                collection_id=plan.collection_id).result()
        except (Determinate, InvalidUsage):
            give_up()  # definitely nothing landed
            raise
        except PersistError as e:
            if not parts or not own:
                # NB: the caller's writer went fail-stop and still holds the lock: the caller
                # settles (reopening fences it); the staged parts stay for a commit in flight
                raise
            writer.stop()
            writer = opened()
            own = True
            if not writer.landed(seq, parts):
                give_up()
                raise Determinate(f"a compaction of {plan.collection!r} at "
                                  f"{plan.address.url} failed ({e}) and, read back from the "
                                  f"log, did not land") from e
            log.warning("persist compaction: a commit to %s reported %s, but it landed",
                        plan.address.url, e)
            landed = writer.state.seq
    finally:
        if own:
            writer.stop()
    crashpoints.hit("distributed.compaction.committed")
    plan.stager.release(parts)
    return landed


def compact_distributed(url: str, collection_name: str, *,
                        run: Callable[[Sequence[CompactionTask]], Iterable[Iterable[StagedPart]]]
                        | None = None, n: int = 2, client: Any = None,
                        reentrance_id: str = "persist-compaction",
                        storage_options: Mapping[str, Any] | None = None,
                        part_target_bytes: int = PART_TARGET_BYTES) -> int | None:
    """Plans, runs and commits a distributed compaction of ``collection_name``.

    Args:
        run: runs the tasks, returning each one's staged parts (a Spark job, a process
            pool); None: one after the other, here.
        client, reentrance_id: as :func:`commit_compaction`.

    Returns:
        The seq of the commit, or None if there was nothing to merge.

    Raises:
        As :func:`plan_compaction`, :func:`run_compaction_task` (the lease is then released:
        what the tasks staged is reclaimed) and :func:`commit_compaction`.
    """
    plan = plan_compaction(url, collection_name, n=n, storage_options=storage_options,
                           part_target_bytes=part_target_bytes)
    if plan is None:
        return None
    try:
        if run is None:
            staged = [s for t in plan.tasks for s in run_compaction_task(t)]
        else:
            staged = [s for out in run(plan.tasks) for s in out]
    except BaseException:
        plan.stager.release()
        raise
    return commit_compaction(plan, staged, client=client, reentrance_id=reentrance_id)


__all__ = [
    "PART_TARGET_BYTES",
    "CompactionPlan",
    "CompactionTask",
    "commit_compaction",
    "compact_distributed",
    "plan_compaction",
    "run_compaction_task",
    "run_encoded_task",
]
