"""The engine's API for distributed readers and writers: Spark (``operators/``), Dask, Ray,
Flink's Python API, or a fleet of plain processes.

Reading: plan on one machine, read anywhere::

    info = persist.describe("s3://bucket/loc", "events")       # metadata only, no lock
    scan = info.snapshot(41, filter=persist.col("key") > 10)    # or info.changes(lo, hi)
    for task in scan.tasks(consolidated=True, n=8):             # serializable
        ...  # ship it; on the worker:
        for table in persist.read_task(task): ...
    for handle in scan.parts:                                   # or part by part
        persist.read_part(handle, filter=...)

Writing: stage anywhere, commit once::

    stager = persist.Stager.start(url, "events", job="nightly load")   # takes a lease
    staged = stager.stage(table)            # on any machine: a serializable StagedPart
    with persist.open(url, reentrance_id="loader") as client:
        client.apply(parts={"events": staged_parts}, seals={"events": 42},
                     token=persist.Token("nightly", 7)).result()
    stager.release(staged_parts)

A staged part is invisible until a commit references it, and is kept from the leaked-blob
sweeps by its staging lease (:mod:`persist.indexed.state.lease`) for as long as the job renews it.
A commit with an idempotency token lands at most once per ``(token id, seq)``: a retried
commit whose token was already applied resolves to None and writes nothing.

Everything here stands on the metadata log and the blob store alone: no runtime, no threads,
and (except :func:`set_read_hold`) no writer lock.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from persist.blob.base import Blob, BlobRead
from persist.errors import InvalidUsage, LockHeld, MissingResource, PersistError
from persist.indexed.engine import Indexed
from persist.indexed.format import columnar, evolve, write
from persist.indexed.format.meta import CollectionMeta, State
from persist.indexed.maintenance import gc
from persist.indexed.read.filter import Filter
from persist.indexed.read.parts import PartReader
from persist.indexed.read.scan import (
    Address,
    CollectionInfo,
    PartHandle,
    ReadTask,
    Scan,
    _stripped,
    rows_per_time,
)
from persist.indexed.read.scan import read_part as _read_part
from persist.indexed.read.scan import read_task as _read_task
from persist.indexed.state import lease
from persist.indexed.state.machine import Machine
from persist.indexed.state.transitions import collection
from persist.layout import lease_of
from persist.location import resolve
from persist.runtime.client import StagedPart, Token

log = logging.getLogger("persist.distributed")

__all__ = [
    "Address",
    "CollectionInfo",
    "PartHandle",
    "ReadTask",
    "Scan",
    "StagedPart",
    "Stager",
    "Token",
    "Watch",
    "describe",
    "read_part",
    "read_task",
    "set_read_hold",
]

#: A process renews a staging lease at most this often (seconds): a lease lives
#: ``lease.DEFAULT_TTL_SECONDS`` (10 min) from its last renewal and is revoked only after it
#: lapsed, so a part staged within this long of a renewal is protected for 9 min at least, and
#: staging many small parts (a stream's micro-batches) costs no lease write each.
RENEW_EVERY_SECONDS = 60.0

#: When this process last renewed each staging lease (``time.monotonic``).
_renewed: dict[str, float] = {}

#: Staged parts up to this many encoded bytes ride inline in the commit (and the metadata);
#: larger ones get their own blob. Below the writer's default, so that a job of many tasks
#: does not make one huge metadata commit.
STAGE_INLINE_BYTES = 16 << 10


@functools.lru_cache(maxsize=16)
def _read_half(url: str, storage: tuple[tuple[str, Any], ...]) -> BlobRead:
    # NB: one read-only blob handle per location per process (workers are reused across tasks,
    # and an S3 client is expensive to build). Only the read half: a reading task cannot write.
    return resolve(url, storage_options=dict(storage)).read_half()


@functools.lru_cache(maxsize=16)
def _writable(url: str, storage: tuple[tuple[str, Any], ...]) -> Blob:
    return resolve(url, storage_options=dict(storage)).blob


def _blob(address: Address) -> BlobRead:
    return _read_half(address.url, address.storage)


def _state(address: Address, *, must_exist: bool, name: str = "") -> State:
    state = Machine(_blob(address)).load()
    if must_exist and state.seq == 0:
        raise MissingResource(
            f"no persist location at {address.url!r}: nothing was ever committed there (a "
            f"mistyped URL?)" + (f", so it has no collection {name!r}" if name else ""))
    return state


def describe(url: str, collection_name: str, *,
             storage_options: Mapping[str, Any] | None = None) -> CollectionInfo:
    """The collection ``collection_name`` at ``url`` as its latest metadata shows it, from
    which reads are planned (:meth:`CollectionInfo.snapshot`, :meth:`CollectionInfo.changes`).

    Reads the metadata log only: no lock, no runtime, never a write.

    Raises:
        MissingResource: no location exists at ``url`` (nothing was ever committed there).
        UnknownCollection: the location has no such collection (the message lists those it
            has).
        ExternalError: storage failed.
    """
    address = Address.of(url, storage_options)
    state = _state(address, must_exist=True, name=collection_name)
    return CollectionInfo(address, collection(state.collections, collection_name), state.seq)


def _reader(address: Address) -> PartReader:
    # NB: no part cache on workers: each part is read once per task.
    return PartReader(_blob(address), cache_bytes=0)


def read_part(handle: PartHandle, *, filter: Filter | None = None,
              columns: Sequence[str] | None = None, audit: bool = False) -> pa.Table:
    """The rows of ``handle``'s part that its scan covers (original times), as the scan's
    schema version; on any machine.

    Args:
        filter: only rows matching it (record batches whose stats rule it out are not
            decoded).
        columns: a subset of ``key, value, time, diff`` (default: all four, in that order).
        audit: also read what the filter's stats skip, and raise ``Corruption`` on a match.

    Raises:
        PartMissing: GC removed the part (the scan outlived the GC grace period: plan again).
        InvalidUsage: an unknown column.
        SchemaMismatch: the filter does not fit the collection's types.
        Corruption, ExternalError: the bytes are damaged; storage failed.
    """
    table = _read_part(_reader(handle.address), handle, filter=filter, audit=audit)
    if columns is None:
        return table
    unknown = [c for c in columns if c not in table.column_names]
    if unknown:
        raise InvalidUsage(f"read_part: unknown columns {unknown}; a part has "
                           f"{table.column_names}")
    return table.select(list(columns))


def read_task(task: ReadTask) -> Iterator[pa.Table]:
    """Reads one task of a scan (see :class:`~persist.indexed.read.scan.ReadTask`), on any machine.

    A consolidated task that finds a part collected re-plans its bucket on the newest state
    (its answer is definite, so the same); other tasks raise ``PartMissing``.

    Raises:
        PartMissing: GC removed a part (plan the read again).
        InvalidUsage: since passed the as-of time while the read ran.
        SchemaMismatch: the schema changed under a consolidated task's retry.
        Corruption, ExternalError: the bytes are damaged; storage failed.
    """
    def fresh() -> State:
        return Machine(_blob(task.address)).load()

    return _read_task(_reader(task.address), task, fresh)


class Watch:
    """One collection's metadata as a long-lived planner sees it (a streaming driver polling
    for new seals), refreshed incrementally at most every ``interval`` seconds.

    Raises (construction):
        MissingResource, UnknownCollection: as :func:`describe`.
    """

    def __init__(self, url: str, collection_name: str, *,
                 storage_options: Mapping[str, Any] | None = None,
                 interval: float | None = None) -> None:
        self.address = Address.of(url, storage_options)
        self.name = collection_name
        blob = _blob(self.address)
        # NB: a local location answers a poll in microseconds; S3 charges per request and
        # answers in milliseconds, so poll it less often.
        self.interval = interval if interval is not None else (0.1 if blob.is_local else 1.0)
        self._machine = Machine(blob)
        # NB: a part cache: admission control reads multi-time parts to count rows per time,
        # and the polls that follow ask again.
        self._reader = PartReader(blob)
        self._state = _state(self.address, must_exist=True, name=collection_name)
        self._at = time.monotonic()
        self._info = self._make()

    def _make(self) -> CollectionInfo:
        return CollectionInfo(self.address, collection(self._state.collections, self.name),
                              self._state.seq)

    def current(self, *, fresh: bool = False) -> CollectionInfo:
        """The collection as last seen; refreshed if ``fresh`` or ``interval`` has passed.

        Raises:
            UnknownCollection: the collection is gone (never, as collections are never
                dropped, unless the location was replaced).
        """
        now = time.monotonic()
        if fresh or now - self._at >= self.interval:
            state = self._machine.refresh(self._state)
            self._at = now
            if state is not self._state:
                self._state = state
                self._info = self._make()
        return self._info

    def rows_per_time(self, info: CollectionInfo, lo: int, hi: int) -> Counter[int]:
        """Updates per time in ``[lo, hi)`` of ``info`` (see
        :func:`persist.indexed.read.scan.rows_per_time`); multi-time parts are read once and
        cached."""
        return rows_per_time(self._reader, info, lo, hi)


def set_read_hold(url: str, collection_name: str, hold_id: str, frontier: int | None, *,
                  lock_timeout: float, storage_options: Mapping[str, Any] | None = None
                  ) -> bool:
    """Sets (or, with None, releases) durable read hold ``hold_id`` of a collection, from a
    process that is not the location's writer (a streaming reader's driver).

    Takes the writer lock briefly — acquire (waiting up to ``lock_timeout``), fence, one
    commit, release — like any writer, without starting a runtime.

    Returns:
        True once committed; False if the lock stayed busy or the frontier is already below
        the collection's since (both logged): failing to set a hold is never unsafe, only
        less protective, so the caller retries later.

    Raises:
        ExternalError, Corruption: storage failed.
    """
    loc = resolve(url, storage_options=dict(storage_options or {}))
    lock = loc.lock()
    rid = f"persist-hold:{hold_id}"
    try:
        held = lock.acquire(rid, timeout=lock_timeout)
    except LockHeld as e:
        log.warning("read hold %r on %r not moved to %s: %s (retry later; a writer holding "
                    "the lock continuously can set it with WriteHandle.hold)", hold_id,
                    collection_name, frontier, e)
        lock.close()
        return False
    try:
        ix = Indexed.open(loc.blob, epoch=held.generation, writer=rid)
        ix.fence()
        try:
            ix.set_hold(collection_name, hold_id, frontier)
        except InvalidUsage as e:
            log.warning("read hold %r on %r not set: %s", hold_id, collection_name, e)
            return False
        return True
    finally:
        lock.release(held)
        lock.close()


class Stager(msgspec.Struct, frozen=True, kw_only=True):
    """Stages batches of one collection as storage parts, on any machine, under a staging
    lease; a writer then commits them in one apply (``Client.apply(parts=...)``).

    Serializable (pickle, msgspec): made once by the job's driver (:meth:`start`), shipped to
    every worker.
    """

    address: Address
    collection: CollectionMeta
    schema_version: int
    lease_id: str
    job: str = ""
    inline_bytes: int = STAGE_INLINE_BYTES

    @classmethod
    def start(cls, url: str, collection_name: str, *, job: str = "",
              storage_options: Mapping[str, Any] | None = None,
              schema_version: int | None = None,
              inline_bytes: int = STAGE_INLINE_BYTES) -> Stager:
        """Takes a staging lease for a job writing to ``collection_name`` at ``url``.

        Args:
            job: a description, recorded with the lease (seen by operators).
            schema_version: stage rows of this schema version (None: the current one).

        Raises:
            MissingResource, UnknownCollection: as :func:`describe`.
            ExternalError: storage failed.
        """
        info = describe(url, collection_name, storage_options=storage_options)
        sid = evolve.View.of(info.meta, schema_version).target
        lid = lease.take(_writable(info.address.url, info.address.storage), job=job)
        _renewed[lid] = time.monotonic()
        return cls(address=info.address, collection=_stripped(info.meta), schema_version=sid,
                   lease_id=lid, job=job, inline_bytes=inline_bytes)

    @property
    def schema(self) -> pa.Schema:
        """The schema staged tables are normalized to (``key, value, time, diff``)."""
        return evolve.View.of(self.collection, self.schema_version).schema

    def _blob(self) -> Blob:
        return _writable(self.address.url, self.address.storage)

    def _lease(self, blob: Blob) -> str:
        """The lease to stage under: ours, renewed (at most every ``RENEW_EVERY_SECONDS``);
        or, if a sweep revoked it (the job sat idle past its lease), a fresh one of this
        call's own (released with the commit)."""
        try:
            self._renew(blob, at_most_every=RENEW_EVERY_SECONDS)
        except lease.LeaseRevoked:
            fresh = lease.take(blob, job=self.job)
            _renewed[fresh] = time.monotonic()
            log.warning("staging lease %s was revoked; staging under %s instead",
                        self.lease_id, fresh)
            return fresh
        return self.lease_id

    def _renew(self, blob: Blob, *, at_most_every: float) -> None:
        last = _renewed.get(self.lease_id)
        now = time.monotonic()
        if last is not None and now - last < at_most_every:
            return
        lease.renew(blob, self.lease_id)
        _renewed[self.lease_id] = now

    def stage(self, updates: Any, *, at: int | None = None) -> StagedPart:
        """Encodes ``updates`` as one part and stores it: invisible until a commit references
        it, and kept from the leaked-blob sweeps while its lease lives.

        Args:
            updates: a pyarrow Table/RecordBatch with ``key, value, time, diff`` (cast to the
                collection's types) or an iterable of ``((key, value), time, diff)``.
            at: every row's time is set to it.

        Raises:
            SchemaMismatch, InvalidUsage: rows that do not fit the collection.
            ExternalError: storing the part failed.
        """
        schema = self.schema
        if at is not None:
            if isinstance(at, bool) or not isinstance(at, int) or at < 0:
                raise InvalidUsage(f"stage: at must be a time (an int >= 0), not {at!r}")
            if isinstance(updates, pa.RecordBatch):
                updates = pa.Table.from_batches([updates])
            if isinstance(updates, pa.Table):
                i = updates.schema.get_field_index("time")
                if i >= 0:
                    updates = updates.set_column(i, "time", columnar.constant_times(
                        at, len(updates), updates.schema.field(i).type))
            else:
                updates = [((k, v), at, d) for (k, v), _, d in updates]
        table = columnar.from_updates(updates, schema, columnar.Codec(schema.field("key").type),
                                      columnar.Codec(schema.field("value").type))
        blob = self._blob()
        part = write.new_part(blob, self.collection, table, inline_threshold=self.inline_bytes,
                              consolidated=False, lease_id=self._lease(blob))
        return StagedPart(self.collection.name, evolve.tag(part, self.schema_version))

    def renew(self, *, at_most_every: float = 0.0) -> None:
        """Renews the job's lease (a job idle between stages, e.g. a stream between
        micro-batches, keeps its parts protected).

        Args:
            at_most_every: skip the renewal if this process renewed the lease less than this
                many seconds ago (``RENEW_EVERY_SECONDS`` is safe: see there).

        Raises:
            LeaseRevoked: a sweep revoked it (stages then take leases of their own).
            ExternalError: storage failed.
        """
        self._renew(self._blob(), at_most_every=at_most_every)

    def release(self, staged: Iterable[StagedPart] = (), *, keep_own: bool = False) -> None:
        """Releases the job's lease and the leases ``staged`` were staged under, once their
        commit is decided (failures are only logged: an unreleased lease lapses by itself,
        and what it protected is then reclaimed).

        Args:
            keep_own: release only the leases of ``staged`` other than the job's (a stream
                keeps its lease across micro-batches).
        """
        ids = leases_of(staged)
        if keep_own:
            ids.discard(self.lease_id)
        else:
            ids.add(self.lease_id)
        blob = self._blob()
        for lid in sorted(ids):
            _renewed.pop(lid, None)
            try:
                lease.release(blob, lid)
            except PersistError as e:
                log.warning("releasing staging lease %s failed (%s); it will lapse", lid, e)

    def discard(self, staged: Iterable[StagedPart]) -> None:
        """Deletes the blobs of ``staged`` parts that no commit references (after a failed
        or declined commit).

        Raises:
            ExternalError: storage failed.
        """
        keys = [s.part.blob_key for s in staged if s.part.blob_key is not None]
        if not keys:
            return
        # NB: checked against the current state anyway: a staged part some commit references
        # must never be deleted, whatever the caller believes happened.
        referenced = gc.referenced(_state(self.address, must_exist=False))
        blob = self._blob()
        for key in keys:
            if key not in referenced:
                blob.delete(key)


def leases_of(staged: Iterable[StagedPart]) -> set[str]:
    """The staging leases ``staged`` parts were staged under."""
    return {lid for s in staged if s.part.blob_key is not None
            and (lid := lease_of(s.part.blob_key)) is not None}

