"""The writer-lock protocol, written once over a compare-and-set primitive.

A lock is one small record ``{holder, generation, beat, lease_ms, wall_ms, released}`` kept in
some store with compare-and-set (a file under ``flock``, a dict, a DynamoDB item). All policy
(reentrance, leases, takeover, heartbeats) lives here; implementations provide ``_read`` and
``_cas`` only, and pass the shared lock conformance suite.

Safety does not depend on this lock or on any clock. Every acquisition bumps ``generation``, the
new holder immediately commits a fence at that generation to the metadata log, and every metadata
commit is a conditional create that refuses to follow a state of a higher generation (see
``persist.indexed.machine``). A holder paused past its lease and resumed can therefore never
commit after its successor took over: its next commit loses the race for the log key and then
sees the newer generation. Clocks only decide *liveness*: when a crashed holder of another
reentrance id may be replaced.

Liveness rule (clock-skew tolerant, as the DynamoDB commit protocol in the seeds): a contender
that has observed the same ``(generation, beat)`` for ``lease * max_skew_rate`` seconds of its own
monotonic clock may take over. Where all parties share one clock (``same_clock``: file and memory
locks on one machine) the holder's ``wall_ms`` is trusted too, so an expired lease is taken at once.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import msgspec

from persist.errors import ExternalError, Fenced, Indeterminate, InvalidUsage, LockHeld

LOCK_FORMAT_VERSION = 1


class LockRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The stored state of a writer lock."""

    version: int = LOCK_FORMAT_VERSION
    holder: str
    generation: int
    beat: int = 0
    lease_ms: int
    wall_ms: int
    released: bool = False


@dataclass(frozen=True)
class Lease:
    """What a holder knows about its own hold. ``generation`` is its fence token."""

    holder: str
    generation: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class WriterLock(ABC):
    """A reentrant, lease-based, fenced writer lock for one location."""

    #: True when every party reads the same wall clock (one machine).
    same_clock: bool = True

    def __init__(self, *, lease_seconds: float = 30.0, max_skew_rate: float = 2.0) -> None:
        if lease_seconds <= 0 or max_skew_rate < 1:
            raise InvalidUsage("lease_seconds must be > 0 and max_skew_rate >= 1")
        self.lease_seconds = lease_seconds
        self.max_skew_rate = max_skew_rate

    # -- the primitive -----------------------------------------------------------------------

    @abstractmethod
    def _read(self) -> LockRecord | None:
        """Returns the current record (a consistent read), or None if never taken."""

    @abstractmethod
    def _cas(self, expected: LockRecord | None, new: LockRecord) -> bool:
        """Stores ``new`` iff the stored record equals ``expected`` (None: absent). Atomic."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Releases client resources (not the lock)."""

    # -- the protocol ------------------------------------------------------------------------

    def current(self) -> LockRecord | None:
        """Returns the stored lock record (for inspection)."""
        return self._read()

    def acquire(self, reentrance_id: str, *, timeout: float = 0.0) -> Lease:
        """Takes the lock for ``reentrance_id``.

        A free or released lock is taken at once; so is one held by the same reentrance id
        (its old holder is fenced by the bumped generation). A lock held by another id is taken
        once its lease has lapsed; until then this waits up to ``timeout`` seconds.

        Returns:
            The lease, whose generation is strictly greater than any earlier holder's.

        Raises:
            LockHeld: another live holder kept the lock for the whole ``timeout``.
            ExternalError: the lock store failed.
        """
        if not reentrance_id:
            raise InvalidUsage("reentrance_id must be a non-empty string")
        deadline = time.monotonic() + timeout
        observed: tuple[int, int] | None = None
        observed_at = time.monotonic()
        while True:
            rec = self._read()
            now = time.monotonic()
            if rec is not None and (rec.generation, rec.beat) != observed:
                observed, observed_at = (rec.generation, rec.beat), now
            if rec is None or rec.released or rec.holder == reentrance_id or self._lapsed(
                rec, now - observed_at
            ):
                new = LockRecord(
                    holder=reentrance_id,
                    generation=(rec.generation if rec else 0) + 1,
                    lease_ms=int(self.lease_seconds * 1000),
                    wall_ms=_now_ms(),
                )
                try:
                    won = self._cas(rec, new)
                except Indeterminate:
                    # NB: resolved as in heartbeat: a consistent read shows whether our record
                    # landed. Raising instead would leave a lease nobody heartbeats, blocking
                    # every other writer until it lapsed.
                    won = self._read() == new
                if won:
                    return Lease(reentrance_id, new.generation)
                continue  # someone moved first; look again
            if now >= deadline:
                assert rec is not None
                raise LockHeld(
                    f"writer lock held by {rec.holder!r} (generation {rec.generation}); "
                    f"open read_only=True, use the same reentrance_id, or wait for its lease "
                    f"({rec.lease_ms / 1000:g}s) to lapse with lock_timeout"
                )
            time.sleep(min(0.05, max(0.0, deadline - now), self.lease_seconds / 10))

    def _lapsed(self, rec: LockRecord, unchanged_for: float) -> bool:
        lease = rec.lease_ms / 1000 * self.max_skew_rate
        if unchanged_for >= lease:
            return True
        return self.same_clock and (_now_ms() - rec.wall_ms) / 1000 >= lease

    def heartbeat(self, lease: Lease) -> None:
        """Extends ``lease``.

        An ambiguous failure of the write is resolved with a consistent read before the lock is
        declared lost.

        Raises:
            Fenced: another holder took the lock (this holder must stop writing).
            ExternalError: the lock store failed; the hold is neither confirmed nor lost.
        """
        rec = self._read()
        if rec is None or rec.generation != lease.generation or rec.released:
            raise Fenced(self._lost(lease, rec))
        new = msgspec.structs.replace(rec, beat=rec.beat + 1, wall_ms=_now_ms())
        try:
            ok = self._cas(rec, new)
        except Indeterminate:
            ok = False  # resolved by the read below
        if ok:
            return
        again = self._read()
        if again is not None and again.generation == lease.generation and not again.released:
            if again == new:
                return  # our write landed after all
            raise ExternalError("heartbeat raced with a concurrent update of our own record")
        raise Fenced(self._lost(lease, again))

    def release(self, lease: Lease) -> None:
        """Gives the lock up if ``lease`` still holds it; otherwise does nothing. Idempotent."""
        for _ in range(8):
            rec = self._read()
            if rec is None or rec.generation != lease.generation or rec.released:
                return
            try:
                if self._cas(rec, msgspec.structs.replace(rec, released=True, wall_ms=_now_ms())):
                    return
            except Indeterminate:
                continue  # the next read shows whether it landed

    def force_release(self) -> LockRecord | None:
        """Marks the lock released whoever holds it (operator action). Returns the old record."""
        while True:
            rec = self._read()
            if rec is None or rec.released:
                return rec
            try:
                if self._cas(rec, msgspec.structs.replace(rec, released=True, wall_ms=_now_ms())):
                    return rec
            except Indeterminate:
                continue  # the next read shows whether it landed

    @staticmethod
    def _lost(lease: Lease, rec: LockRecord | None) -> str:
        if rec is None:
            return f"writer lock of {lease.holder!r} vanished"
        return (
            f"writer lock lost: {lease.holder!r} held generation {lease.generation}, now "
            f"{'released' if rec.released else 'held by ' + repr(rec.holder)} "
            f"at generation {rec.generation}"
        )


def encode_record(rec: LockRecord) -> bytes:
    return msgspec.msgpack.encode(rec)


def decode_record(data: bytes) -> LockRecord:
    rec = msgspec.msgpack.decode(data, type=LockRecord)
    if rec.version > LOCK_FORMAT_VERSION:
        from persist.errors import IncompatibleFormat

        raise IncompatibleFormat(f"lock record version {rec.version} is newer than this persist")
    return rec
