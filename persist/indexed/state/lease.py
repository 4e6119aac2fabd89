"""Staging leases: how parts staged by another process are kept safe from the leaked-blob sweep
for exactly as long as the job that staged them is alive, however long that is.

A distributed writer (the Spark sink) stages parts in the location's blob store from many
processes and commits them later, in one ``Client.apply(parts=...)`` from its driver. Until that
commit the parts are unreferenced, so they look leaked. The commit deadline that protects a
writer's own blobs (DESIGN.md §9) cannot cover them: nothing bounds how long a job runs.

A **staging lease** names such a job. It is a small record at ``layout.lease_key(id)`` with an
expiry; whoever stages renews it (:func:`renew`), and every part staged under it carries the
lease id in its part id (:func:`part_id`). The rules that make it safe:

1. *Revocation is final.* Before a sweep deletes a leased part it **revokes** the lease
   (:func:`revoke`: creates ``layout.revoked_key(id)``), and only then starts its grace
   period. A revoked lease is never renewed again (:func:`renew` raises) and is never
   committed from (:func:`check_committable` raises).
2. *A commit checks its leases* (:func:`check_committable`) when the writer stages the parts,
   and the commit must then land within the writer's commit deadline (the runtime counts it
   from the check), which is shorter than any sweep's grace.

So a part is deleted only after a revocation that happened at least ``grace`` before, and a
commit that could still reference it checked the lease before that revocation and landed within
the deadline, before the deletion: the sweep's re-read of the state then sees the part
referenced. Both checks read storage, so this holds across processes (the writer's own sweep
and ``persist verify --delete-leaked``), and no clock is compared across machines for safety:
the expiry only decides *when* a silent job's lease is revoked (its liveness), judged by the
sweeping process's clock; a clock skew between machines only makes a lease look shorter or
longer. A lease is revoked when its expiry is older than ``skew_seconds`` by that clock.

A job that commits releases its lease (:func:`release`, which revokes it), so its leftover parts
(a retried task's first attempt) are reclaimed after the grace.

Revocation markers are never deleted (a few dozen bytes per job): deleting one would let a job
paused past its lease renew it and commit parts that a sweep already deleted. A lease whose
record is gone (released) can neither be renewed nor committed from either.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from enum import Enum

import msgspec

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import InvalidUsage, LeaseRevoked
from persist.indexed.state import stored

#: The format of a lease record.
LEASE_FORMAT_VERSION = 1
#: A lease lasts this long after its last renewal, by default.
DEFAULT_TTL_SECONDS = 600.0
#: A lease is judged lapsed only once its expiry is this much in the past (by the judging
#: process's clock): room for the clocks of the machines that renew it to differ.
DEFAULT_SKEW_SECONDS = 60.0


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The stored form of a staging lease (``layout.lease_key(id)``); rewritten by each
    renewal, last writer wins (renewals only ever push the expiry later)."""

    version: int = LEASE_FORMAT_VERSION
    id: str
    #: Who took it, for operators: ``host:pid`` and a free-form job description.
    holder: str
    job: str
    #: Wall-clock milliseconds (the renewer's clock) after which it may be revoked.
    expires_wall_ms: int
    renewed_wall_ms: int


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(LeaseRecord)


class LeaseState(Enum):
    """What a sweep may do with the parts of a lease."""

    #: Renewed recently enough: its parts are not leaked, whatever their age.
    LIVE = "live"
    #: Expired (past the skew allowance) or missing, not yet revoked: revoke it first.
    LAPSED = "lapsed"
    #: Revoked: its parts are unreferenced for good once the grace has passed.
    REVOKED = "revoked"


def _check_id(lease_id: object) -> str:
    if not isinstance(lease_id, str) or len(lease_id) != 32 or \
            any(ch not in "0123456789abcdef" for ch in lease_id):
        raise InvalidUsage(f"a staging lease id is 32 lowercase hex digits, not {lease_id!r}")
    return lease_id


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidUsage(f"{name} must be a number of seconds > 0, not {value!r}")
    return float(value)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _record(lease_id: str, job: str, ttl: float, now_ms: int) -> LeaseRecord:
    return LeaseRecord(id=lease_id, holder=f"{socket.gethostname()}:{os.getpid()}", job=job,
                       expires_wall_ms=now_ms + int(ttl * 1000), renewed_wall_ms=now_ms)


def take(blob: Blob, *, job: str = "", ttl_seconds: float = DEFAULT_TTL_SECONDS) -> str:
    """Takes a new staging lease and returns its id (share it with every stager of the job).

    Raises:
        InvalidUsage: ``ttl_seconds`` is not a positive number, or ``job`` not a string.
        ExternalError: storage failed (no lease was taken).
    """
    ttl = _check_seconds("ttl_seconds", ttl_seconds)
    if not isinstance(job, str):
        raise InvalidUsage(f"job must be a string, not {job!r}")
    lease_id = uuid.uuid4().hex
    blob.set(layout.lease_key(lease_id), _ENC.encode(_record(lease_id, job, ttl, _now_ms())))
    return lease_id


def renew(blob: Blob, lease_id: str, *, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
    """Pushes the lease's expiry to ``ttl_seconds`` from now (call it before staging a part, and
    at least every ``ttl_seconds / 2`` while a job is alive).

    Raises:
        LeaseRevoked: the lease was revoked (checked after writing: a revocation that races
            the renewal still wins, and the caller hears of it).
        InvalidUsage: a malformed id or ttl.
        ExternalError: storage failed.
    """
    _check_id(lease_id)
    ttl = _check_seconds("ttl_seconds", ttl_seconds)
    if _revoked(blob, lease_id):
        raise LeaseRevoked(f"staging lease {lease_id} was revoked: its parts may be reclaimed")
    old = read(blob, lease_id)
    if old is None:
        raise LeaseRevoked(f"staging lease {lease_id} no longer exists (it was released)")
    blob.set(layout.lease_key(lease_id), _ENC.encode(_record(lease_id, old.job, ttl, _now_ms())))
    if _revoked(blob, lease_id):
        raise LeaseRevoked(f"staging lease {lease_id} was revoked: its parts may be reclaimed")


def read(blob: BlobRead, lease_id: str) -> LeaseRecord | None:
    """The lease's record, or None if there is none.

    Raises:
        Corruption: the record does not decode.
        IncompatibleFormat: a newer lease format.
        ExternalError: storage failed.
    """
    return stored.read(blob, layout.lease_key(_check_id(lease_id)), _DEC,
                       what="staging lease", newest=LEASE_FORMAT_VERSION)


def _revoked(blob: BlobRead, lease_id: str) -> bool:
    return blob.get(layout.revoked_key(lease_id)) is not None


def state(blob: BlobRead, lease_id: str, *, now_ms: int | None = None,
          skew_seconds: float = DEFAULT_SKEW_SECONDS) -> LeaseState:
    """Judges lease ``lease_id`` by this process's clock (see the module docstring).

    Raises:
        ExternalError: storage failed; Corruption: an undecodable record.
    """
    if _revoked(blob, lease_id):
        return LeaseState.REVOKED
    rec = read(blob, lease_id)
    now = _now_ms() if now_ms is None else now_ms
    if rec is None or rec.expires_wall_ms + int(skew_seconds * 1000) < now:
        return LeaseState.LAPSED
    return LeaseState.LIVE


def revoke(blob: Blob, lease_id: str) -> None:
    """Revokes the lease for good (idempotent): from now on it cannot be renewed or committed
    from, and its unreferenced parts are reclaimed after a sweep's grace.

    Raises:
        ExternalError: storage failed (then it may or may not be revoked: sweep again).
    """
    blob.set_if_absent(layout.revoked_key(_check_id(lease_id)), b"revoked")


def release(blob: Blob, lease_id: str) -> None:
    """Ends a job's lease after its commit (or its abort): revokes it and removes its record
    (the revocation marker stays: see the module docstring).

    Raises:
        ExternalError: storage failed.
    """
    revoke(blob, lease_id)
    blob.delete(layout.lease_key(lease_id))


def check_committable(blob: BlobRead, lease_ids: set[str]) -> None:
    """Checks, before a commit references parts staged under ``lease_ids``, that none of the
    leases was revoked (see rule 2 of the module docstring).

    Raises:
        LeaseRevoked: one was revoked: its parts may be gone or about to go.
        ExternalError: storage failed.
    """
    for lease_id in sorted(lease_ids):
        if _revoked(blob, lease_id) or read(blob, lease_id) is None:
            raise LeaseRevoked(
                f"the parts staged under lease {lease_id} cannot be committed: the lease was "
                f"revoked (it lapsed, or its job already ended), so they may have been "
                f"reclaimed; nothing was committed, rerun the job")


@dataclass
class Judge:
    """Decides, during one sweep, which staged blobs are reclaimable (leases judged once each,
    a lapsed one revoked on the way)."""

    blob: Blob
    skew_seconds: float = DEFAULT_SKEW_SECONDS

    def __post_init__(self) -> None:
        self._seen: dict[str, LeaseState] = {}

    def reclaimable(self, key: str) -> bool:
        """True if the unreferenced staged blob ``key`` may be treated as leaked: its lease is
        revoked (this call revokes a lapsed one). A part staged without a lease (older sinks)
        never is: that is for ``persist verify --delete-leaked``."""
        lease_id = layout.lease_of(key)
        if lease_id is None:
            return False
        st = self._seen.get(lease_id)
        if st is None:
            st = state(self.blob, lease_id, skew_seconds=self.skew_seconds)
            if st is LeaseState.LAPSED:
                revoke(self.blob, lease_id)
                st = LeaseState.REVOKED
            self._seen[lease_id] = st
        return st is LeaseState.REVOKED


__all__ = ["DEFAULT_SKEW_SECONDS", "DEFAULT_TTL_SECONDS", "LEASE_FORMAT_VERSION", "Judge",
           "LeaseRecord", "LeaseRevoked", "LeaseState", "check_committable",
           "read", "release", "renew", "revoke", "state", "take"]
