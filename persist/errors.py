"""The persist error tree, sorted by what the caller should do about it.

    PersistError
    ├── InvalidUsage            a caller bug; nothing changed (write below upper, seal backwards, ...)
    │   ├── UnknownCollection   no collection by that name
    │   ├── UnknownHold         no tag or named hold by that name on the collection
    │   ├── SchemaMismatch      re-registration with other types, or updates of the wrong shape
    │   ├── ReadOnly            a read-only handle was asked to write
    │   └── DiffOverflow        the diffs of one (key, value) sum outside int64: no exact answer
    ├── ExternalError           storage (or the lock service) misbehaved
    │   ├── Determinate         definitely did not happen; safe to retry
    │   │   ├── MissingResource the bucket or DynamoDB table does not exist
    │   │   ├── CommitDeadline  not sent: its data blobs are older than the commit deadline
    │   │   ├── PartMissing     a part the read state references was collected: read again
    │   │   ├── LeaseRevoked    a staging lease was revoked: its parts cannot be committed
    │   │   ├── MergeWorkerLost a writer's merge worker process died: the merge did not happen
    │   │   └── PartsChanged    a distributed compaction's parts changed since its plan: not committed
    │   └── Indeterminate       may or may not have happened; the runtime goes fail-stop
    ├── LockHeld                another writer holds the location's lock
    ├── Fenced                  a newer writer took over; this writer can never commit again
    ├── HoldLapsed              a consumer's named hold lapsed (or was released): it holds nothing
    ├── RuntimeShutdown         the runtime stopped (or poisoned itself) before the command ran
    ├── Timeout                 waited for a frontier that did not arrive in time
    ├── Corruption              stored bytes fail their checksum / framing / decoding
    │   └── ChecksumMismatch
    └── IncompatibleFormat      stored by a newer persist than this one

Boto3 and OS errors are translated into this tree only at the blob/lock edge, always with
``raise ... from e`` so the original stays attached.
"""

from __future__ import annotations


class PersistError(Exception):
    """Root of every error persist raises on purpose."""


class InvalidUsage(PersistError, ValueError):
    """The caller asked for something the contract forbids. Nothing was changed."""


class UnknownCollection(InvalidUsage, KeyError):
    """No collection with that name exists at this location."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0]) if self.args else "unknown collection"


class UnknownHold(InvalidUsage, KeyError):
    """No tag or named hold by that name exists on the collection."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown hold"


class SchemaMismatch(InvalidUsage):
    """Types differ from those the collection was registered with, or input is malformed."""


class ReadOnly(InvalidUsage):
    """A read-only handle (a replica) was asked to write, seal, compact or delete."""


class DiffOverflow(InvalidUsage):
    """The diffs of one ``(key, value)`` (at one time, for compaction) sum to a multiplicity
    outside int64, so no exact answer exists: persist never wraps the sum. Each diff fitted
    int64 when written; only their sum does not.

    Nothing was changed: a read raised it; a compaction that met it wrote nothing (the state
    and the writer are as they were; the background logs a warning, once per refused merge,
    and ``Client.maintain`` raises it). What to do: append updates that bring the sum back within int64 (a retraction of
    the excess), after which reads as of later times are exact again; reads as of earlier
    times, and raw (unconsolidated) reads, are unaffected. The message names the sum and, for
    a flat key, the ``(key, value)``.
    """


class ExternalError(PersistError):
    """Storage or the lock service failed."""


class Determinate(ExternalError):
    """The operation definitely did not take effect; it is safe to retry."""


class MissingResource(Determinate):
    """What the location names does not exist: no location at that URL (a read-only open of a
    place nothing was ever committed to), or its bucket or DynamoDB table.

    Retrying will not help until it is created (a writer creates a location;
    ``persist.lock.dynamodb.create_table`` makes a table; buckets are created outside persist).
    """

    @classmethod
    def nothing_committed(cls, url: str, hint: str = "") -> MissingResource:
        """The error for ``url`` where nothing was ever committed: one message on every face
        (``persist.open(read_only=True)``, the ``persist`` command), since a mistyped URL
        looks exactly like that. ``hint``: what to do instead, appended after a semicolon."""
        return cls(f"no persist location at {url!r}: nothing was ever committed there (a "
                   f"mistyped URL?)" + (f"; {hint}" if hint else ""))


class CommitDeadline(Determinate):
    """A commit was not sent: data blobs it references were written longer ago than the
    writer's commit deadline (``Options.commit_deadline_seconds``), so a leaked-blob sweep may
    have deleted them. Nothing was committed; retrying writes the data again."""


class PartMissing(Determinate):
    """A part referenced by the state being read is gone: GC removed it after the grace period.
    Retry on a newer state."""


class LeaseRevoked(Determinate):
    """The staging lease was revoked (it lapsed, or its job released it): parts staged under it
    may be reclaimed, so they cannot be committed. Nothing was committed; rerun the job."""


class MergeWorkerLost(Determinate):
    """A merge sent to the writer's merge worker process did not happen: the worker died
    (killed, out of memory), could not start, or failed unexpectedly. Nothing was committed;
    parts it may have written are referenced by no commit (the leaked-blob sweep deletes them).
    The next merge starts a new worker."""


class PartsChanged(Determinate):
    """A distributed compaction was not committed: a part its plan read is no longer in the
    collection (a writer's own compaction replaced it, a restore undid it), or the collection
    can no longer take the plan's merge (a hold below the frontier it forwarded to). Nothing
    was committed and its staged parts were discarded; plan again."""


class Indeterminate(ExternalError):
    """The operation may or may not have taken effect (for example a timeout after sending)."""


class LockHeld(PersistError):
    """Another writer (with a different reentrance id) holds the writer lock."""


class Fenced(PersistError):
    """A newer writer took over the location; this handle can never commit again."""


class HoldLapsed(PersistError):
    """A consumer's named hold no longer holds anything: the writer found its lease not renewed
    in time and committed its lapse (or an operator released it). Compaction may have passed
    its frontier since, so what it protected may be gone: advancing or renewing it is refused.
    Nothing was changed; release it, and start the consumer again from a read at or after
    the collection's since (taking a new hold)."""


class RuntimeShutdown(PersistError):
    """The runtime was stopped, or stopped itself after an indeterminate failure."""


class Timeout(PersistError, TimeoutError):
    """A wait (for a frontier, a lock) ran out of time."""


class Corruption(PersistError):
    """Stored bytes are not what persist wrote: bad framing, truncation, undecodable content."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"corrupt blob {key!r}: {detail}")
        self.key = key
        self.detail = detail


class ChecksumMismatch(Corruption):
    """The crc32c of a stored value does not match its contents (or it sits under another key)."""


class IncompatibleFormat(PersistError):
    """Stored data uses a format version newer than this persist understands."""


__all__ = [
    "ChecksumMismatch",
    "CommitDeadline",
    "Corruption",
    "Determinate",
    "DiffOverflow",
    "ExternalError",
    "Fenced",
    "HoldLapsed",
    "IncompatibleFormat",
    "Indeterminate",
    "InvalidUsage",
    "LeaseRevoked",
    "LockHeld",
    "MergeWorkerLost",
    "MissingResource",
    "PartMissing",
    "PartsChanged",
    "PersistError",
    "ReadOnly",
    "RuntimeShutdown",
    "SchemaMismatch",
    "Timeout",
    "UnknownCollection",
    "UnknownHold",
]
