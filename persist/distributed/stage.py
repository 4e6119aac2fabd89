"""Distributed writes, the first half: staging parts anywhere, under a staging lease.

A job's driver takes a lease with :meth:`Stager.start` and ships the ``Stager`` to its workers;
each :meth:`Stager.stage` stores one part in the location's blob store (or inline, when small)
and returns a :class:`~persist.indexed.format.transfer.StagedPart`, bound to the location,
collection and types it was staged for. Nothing is visible until a commit references it
(``Client.apply(parts=...)``, or a :class:`~persist.distributed.commit.Committer`), and the
leaked-blob sweeps leave it alone while its lease lives (:mod:`persist.indexed.state.lease`).
See :mod:`persist.distributed`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import pyarrow as pa

from persist.blob.base import Blob
from persist.distributed.read import describe
from persist.distributed.stores import load_state, writable
from persist.errors import InvalidUsage, PersistError
from persist.indexed.format import columnar, evolve, records, write
from persist.indexed.format.meta import CollectionMeta
from persist.indexed.format.transfer import StagedPart, canonical_location
from persist.indexed.maintenance import gc
from persist.indexed.read.scan import Address, stripped
from persist.indexed.state import lease
from persist.layout import lease_of

log = logging.getLogger("persist.distributed")

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
        lid = lease.take(writable(info.address), job=job)
        _renewed[lid] = time.monotonic()
        return cls(address=info.address, collection=stripped(info.meta), schema_version=sid,
                   lease_id=lid, job=job, inline_bytes=inline_bytes)

    @property
    def schema(self) -> pa.Schema:
        """The schema staged tables are normalized to (``key, value, time, diff``)."""
        return evolve.View.of(self.collection, self.schema_version).schema

    def _blob(self) -> Blob:
        return writable(self.address)

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

    def stage(self, updates: Any, *, at: int | None = None, replay: bool = False) -> StagedPart:
        """Encodes ``updates`` as one part and stores it: invisible until a commit references
        it, and kept from the leaked-blob sweeps while its lease lives.

        Args:
            updates: a pyarrow Table/RecordBatch with ``key, value, time, diff`` (cast to the
                collection's types) or an iterable of ``((key, value), time, diff)``.
            at: every row's time is set to it.
            replay: the rows may be a replay of a batch that already landed (a stream's
                micro-batch run again after a restart), so rows below the upper are staged
                and left to the commit, whose token drops a batch that landed and refuses one
                that did not.

        Raises:
            SchemaMismatch, InvalidUsage: rows that do not fit the collection, or (unless
                ``replay``) a time below the collection's upper when the stager started (it
                can never commit).
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
        if not replay and len(table) and (lo := columnar.min_time(table.column("time"))) < self.collection.upper:
            # NB: upper never moves back, so rows below the upper this stager was started at
            # can never commit: refuse them in the task that stages them, not at the commit
            # after the whole job ran (issue 21 #11).
            raise InvalidUsage(
                f"stage: a row of {self.collection.name!r} at time {lo} is below its upper "
                f"{self.collection.upper}: times below upper are sealed")
        blob = self._blob()
        part = write.new_part(blob, self.collection, table, inline_threshold=self.inline_bytes,
                              consolidated=False, lease_id=self._lease(blob))
        return StagedPart(location=self.address.url, collection=self.collection.name,
                          collection_id=self.collection.id,
                          schema=evolve.history(self.collection)[self.schema_version],
                          part=evolve.tag(part, self.schema_version))

    def lease_for_staging(self) -> str:
        """The lease to stage a part under now (for a caller that writes its own parts, a
        distributed compaction's task): the job's, renewed at most every
        :data:`RENEW_EVERY_SECONDS`; or, if a sweep revoked it, a fresh one (refused at the
        commit if the parts it protects were reclaimed meanwhile).

        Raises:
            ExternalError: storage failed.
        """
        return self._lease(self._blob())

    def renew(self, *, at_most_every: float | None = None) -> None:
        """Renews the job's lease (a job idle between stages, e.g. a stream between
        micro-batches, keeps its parts protected).

        Args:
            at_most_every: skip the renewal if this process renewed the lease less than this
                many seconds ago; None: :data:`RENEW_EVERY_SECONDS`, which is always safe (see
                there); 0 renews now.

        Raises:
            LeaseRevoked: a sweep revoked it (stages then take leases of their own).
            ExternalError: storage failed.
        """
        every = RENEW_EVERY_SECONDS if at_most_every is None else at_most_every
        self._renew(self._blob(), at_most_every=every)

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
        discard(self.address, staged)


def discard(address: Address, staged: Iterable[StagedPart]) -> None:
    """Deletes the blobs of the ``staged`` parts of the location at ``address`` that no commit
    references (after a failed or declined commit); parts staged at another location are left
    alone.

    Raises:
        ExternalError: storage failed.
    """
    here = canonical_location(address.url)
    keys = [s.part.blob_key for s in staged if s.part.blob_key is not None
            and canonical_location(s.location) == here]
    if not keys:
        return
    # NB: checked against the current state anyway: a staged part some commit references
    # must never be deleted, whatever the caller believes happened.
    referenced = gc.referenced(load_state(address, must_exist=False))
    blob = writable(address)
    for key in keys:
        if key not in referenced:
            blob.delete(key)


def leases_of(staged: Iterable[StagedPart]) -> set[str]:
    """The staging leases ``staged`` parts were staged under."""
    return {lid for s in staged if s.part.blob_key is not None
            and (lid := lease_of(s.part.blob_key)) is not None}


def check_type(t: pa.DataType, path: str = "value") -> None:
    """Checks that persist stores Arrow type ``t`` as a key or value (``path``: ``key`` or
    ``value``, which the message names).

    Public for engines that map a type system of their own to Arrow (Spark's schema options, a
    Dask dataframe's dtypes): they refuse a type persist cannot store before a job runs, with
    the message ``create_or_load`` would give.

    Raises:
        SchemaMismatch: naming the field path and the type, e.g.
            ``value.items[].price: halffloat is not supported``.
    """
    records.check_type(t, path)


__all__ = ["RENEW_EVERY_SECONDS", "STAGE_INLINE_BYTES", "Stager", "check_type", "discard",
           "leases_of"]
