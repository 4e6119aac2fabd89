"""The writer-lock protocol, written once over a compare-and-set primitive.

A lock is one small record ``{holder, generation, beat, lease_ms, wall_ms, released}`` (plus
the holder's host and process) kept in some store with compare-and-set (a chain of files created
by ``link(2)``, a dict, an S3 object, a DynamoDB item). All policy
(reentrance, leases, takeover, heartbeats) lives here; implementations provide ``_read`` and
``_cas`` only, and pass the shared lock conformance suite.

Safety does not depend on this lock or on any clock. Every acquisition bumps ``generation``, the
new holder immediately commits a fence at that generation to the metadata log, and every metadata
commit is a conditional create that refuses to follow a state of a higher generation (see
``persist.indexed.state.machine``). A holder paused past its lease and resumed can therefore never
commit after its successor took over: its next commit loses the race for the log key and then
sees the newer generation. Clocks only decide *liveness*: when a crashed holder of another
reentrance id may be replaced.

Liveness rule (clock-skew tolerant, as the DynamoDB commit protocol in the seeds): a contender
that has observed the same ``(generation, beat)`` for ``lease * max_skew_rate`` seconds of its own
monotonic clock may take over. Where all parties share one clock (``same_clock``: file and memory
locks on one machine) the holder's ``wall_ms`` is trusted too, so an expired lease is taken at once.
A holder that is a process of the contender's own machine (same boot and pid namespace) and is
gone (no such pid, or the pid now has another start time) has lapsed at once: a crashed script's
rerun does not wait out the lease.

No wait depends on another process's liveness: every loop (acquire, heartbeat, release, and
each implementation's retries) runs against a ``time.monotonic()`` deadline passed down to
``_read``/``_cas``, and ends in ``LockHeld``, ``Timeout`` or an ``ExternalError``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import msgspec

from persist.errors import (
    Determinate,
    ExternalError,
    Fenced,
    IncompatibleFormat,
    Indeterminate,
    InvalidUsage,
    LockHeld,
    Timeout,
)

log = logging.getLogger("persist.lock")

LOCK_FORMAT_VERSION = 1

#: Seconds one lock operation keeps retrying a failing store when its caller gave no longer
#: bound (``acquire`` uses ``max(timeout, store_timeout)``).
STORE_TIMEOUT = 5.0
#: The lease a writer claims by default, in seconds (heartbeated every third of it).
LEASE_SECONDS = 30.0
#: How much faster than a contender's clock a holder's may run, by default (see the module
#: docstring).
MAX_SKEW_RATE = 2.0


class LockRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The stored state of a writer lock (format version 1).

    ``host``, ``host_id``, ``pid`` and ``pid_start`` name the holder's process; they were added
    to version 1 with defaults, so a record of an older persist decodes with them empty (and
    no process check is made), and an older persist decoding a newer record skips them
    (msgspec ignores unknown fields).
    """

    version: int = LOCK_FORMAT_VERSION
    holder: str
    generation: int
    beat: int = 0
    lease_ms: int
    wall_ms: int
    released: bool = False
    #: The holder's host name (for people; never compared).
    host: str = ""
    #: The holder's machine boot and pid namespace ("" if unknown): two records with the same
    #: non-empty ``host_id`` name processes of one process table.
    host_id: str = ""
    #: The holder's process id (0 if unknown).
    pid: int = 0
    #: The holder's start time (``/proc/<pid>/stat`` field 22), so a reused pid is not mistaken
    #: for the holder.
    pid_start: int = 0


@dataclass(frozen=True)
class Lease:
    """What a holder knows about its own hold. ``generation`` is its fence token."""

    holder: str
    generation: int


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- who holds the lock -------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessIdentity:
    """How a lock record names the process holding it (see :class:`LockRecord`)."""

    host: str
    host_id: str
    pid: int
    pid_start: int


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """Returns ``(state, start time)`` of process ``pid`` from ``/proc``, None if not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    # NB: field 2 (the command) may hold spaces and parentheses: count from the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    return rest[0].decode(), int(rest[19])


_IDENTITY: ProcessIdentity | None = None


def this_process() -> ProcessIdentity:
    """Returns this process's identity (recomputed after a fork). ``host_id`` is "" where
    ``/proc`` is unavailable (not Linux), which turns the dead-holder check off."""
    global _IDENTITY
    pid = os.getpid()
    if _IDENTITY is not None and _IDENTITY.pid == pid:
        return _IDENTITY
    host_id, start = "", 0
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        # NB: the pid namespace too: containers on one kernel share the boot id, not pids.
        host_id = f"{boot}/{os.readlink('/proc/self/ns/pid')}"
        stat = _proc_stat(pid)
        start = stat[1] if stat is not None else 0
    except (OSError, ValueError, IndexError):
        host_id = ""
    _IDENTITY = ProcessIdentity(socket.gethostname(), host_id if start else "", pid, start)
    return _IDENTITY


def holder_gone(rec: LockRecord) -> bool:
    """True only if ``rec`` names a process of this machine's process table that is gone.

    Gone means: no such pid, a pid now running another process (another start time), or a
    zombie. False whenever that cannot be known (another machine or container, an older record
    without a pid, no ``/proc``): the lease then decides.
    """
    me = this_process()
    if not rec.host_id or rec.host_id != me.host_id or rec.pid <= 0:
        return False
    try:
        stat = _proc_stat(rec.pid)
    except (OSError, ValueError, IndexError):
        return False
    if stat is None:
        # NB: /proc mounted with hidepid hides other users' processes: ask the kernel.
        try:
            os.kill(rec.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    state, start = stat
    return start != rec.pid_start or state in ("Z", "X")


class WriterLock(ABC):
    """A reentrant, lease-based, fenced writer lock for one location.

    Invariant: every successful :meth:`acquire` returns a generation strictly greater than any
    earlier one; exactly one acquirer wins each generation.
    Invariant: no method waits on another process's liveness; every wait and retry ends by a
    deadline in a typed error.
    """

    #: True when every party reads the same wall clock (one machine).
    same_clock: bool = True

    def __init__(self, *, lease_seconds: float = LEASE_SECONDS,
                 max_skew_rate: float = MAX_SKEW_RATE,
                 store_timeout: float = STORE_TIMEOUT) -> None:
        """Args:
            lease_seconds: the lease a holder claims.
            max_skew_rate: tolerated clock rate difference (see the module docstring).
            store_timeout: seconds an operation retries a failing store (at least).

        Raises:
            InvalidUsage: a parameter is out of range.
        """
        if lease_seconds <= 0 or max_skew_rate < 1 or store_timeout <= 0:
            raise InvalidUsage("lease_seconds and store_timeout must be > 0 and "
                               "max_skew_rate >= 1")
        self.lease_seconds = lease_seconds
        self.max_skew_rate = max_skew_rate
        self.store_timeout = store_timeout

    # -- the primitive -----------------------------------------------------------------------

    @abstractmethod
    def _read(self, *, deadline: float | None = None) -> LockRecord | None:
        """Returns the current record (a consistent read), or None if never taken.

        ``deadline`` (a ``time.monotonic()`` instant) ends retries of a failing store; at least
        one attempt is always made.

        Raises:
            ExternalError: the store failed.
            Corruption: the stored record is unreadable.
        """

    @abstractmethod
    def _cas(self, expected: LockRecord | None, new: LockRecord, *,
             deadline: float | None = None) -> bool:
        """Stores ``new`` iff the stored record equals ``expected`` (None: absent). Atomic.

        Returns:
            True if ``new`` was stored; False if it was not, because the stored record was
            not ``expected`` (another party moved first).

        Raises:
            Indeterminate: ``new`` may or may not have been stored (resolve with ``_read``).
            ExternalError: the store failed; nothing was stored.
        """

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Releases client resources (not the lock)."""

    # -- the protocol ------------------------------------------------------------------------

    def current(self) -> LockRecord | None:
        """Returns the stored lock record (for inspection), or None if never taken.

        Raises:
            ExternalError: the store failed for ``store_timeout`` seconds.
        """
        return self._read(deadline=time.monotonic() + self.store_timeout)

    def acquire(self, reentrance_id: str, *, timeout: float = 0.0) -> Lease:
        """Takes the lock for ``reentrance_id``.

        A free or released lock is taken at once; so is one held by the same reentrance id
        (its old holder is fenced by the bumped generation), whatever that holder is doing, and
        one whose holder is a process of this machine that is gone. A lock held by another id
        is taken once its lease has lapsed; until then this waits up to ``timeout`` seconds.
        A failing store is retried for ``max(timeout, store_timeout)`` seconds.

        Returns:
            The lease, whose generation is strictly greater than any earlier holder's.

        Raises:
            LockHeld: another live holder kept the lock for the whole ``timeout``.
            ExternalError: the lock store failed until the deadline (Indeterminate if the
                last write of our record may have landed).
        """
        if not reentrance_id:
            raise InvalidUsage("reentrance_id must be a non-empty string")
        start = time.monotonic()
        held_until = start + timeout
        deadline = start + max(timeout, self.store_timeout)
        observed: tuple[int, int] | None = None
        observed_at = start
        failure: ExternalError | None = None
        me = this_process()
        while True:
            rec = self._read(deadline=deadline)
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
                    host=me.host,
                    host_id=me.host_id,
                    pid=me.pid,
                    pid_start=me.pid_start,
                )
                try:
                    won = self._cas(rec, new, deadline=deadline)
                except Indeterminate as e:
                    # NB: resolved as in heartbeat: a consistent read shows whether our record
                    # landed. Raising instead would leave a lease nobody heartbeats, blocking
                    # every other writer until it lapsed.
                    failure = e
                    won = self._resolve(new, e, deadline)
                    if not won:
                        log.warning("writer lock: taking generation %d for %r was ambiguous "
                                    "and did not land; trying again: %s",
                                    new.generation, reentrance_id, e)
                if won:
                    return Lease(reentrance_id, new.generation)
                now = time.monotonic()
                if now >= deadline:
                    if failure is not None:
                        raise Indeterminate(
                            f"could not take the writer lock for {reentrance_id!r} within "
                            f"{deadline - start:g}s: the lock store kept failing ({failure})"
                        ) from failure
                    raise LockHeld(
                        f"could not take the writer lock for {reentrance_id!r} within "
                        f"{deadline - start:g}s: other writers kept moving it first"
                    )
                if failure is not None:
                    time.sleep(min(0.05, deadline - now))
                continue  # someone moved first, or the store failed; look again
            if now >= held_until:
                raise LockHeld(
                    f"writer lock held by {rec.holder!r} (generation {rec.generation}"
                    f"{self._where(rec)}); open read_only=True, use the same reentrance_id, "
                    f"or wait for its lease ({rec.lease_ms / 1000:g}s) to lapse with "
                    f"lock_timeout"
                )
            time.sleep(min(0.05, max(0.0, held_until - now), self.lease_seconds / 10))

    def _resolve(self, new: LockRecord, error: Indeterminate, deadline: float) -> bool:
        """True if ``new`` is stored after an ambiguous write of it (one consistent read)."""
        try:
            return self._read(deadline=deadline) == new
        except Determinate as e:
            raise Indeterminate(f"writer lock write unresolved ({error}); reading it back "
                                f"failed: {e}") from e

    @staticmethod
    def _where(rec: LockRecord) -> str:
        return f", process {rec.pid} on {rec.host}" if rec.pid and rec.host else ""

    def _lapsed(self, rec: LockRecord, unchanged_for: float) -> bool:
        if holder_gone(rec):
            log.info("writer lock: holder %r (process %d on %s) is gone; taking over",
                     rec.holder, rec.pid, rec.host)
            return True
        lease = rec.lease_ms / 1000 * self.max_skew_rate
        if unchanged_for >= lease:
            return True
        return self.same_clock and (_now_ms() - rec.wall_ms) / 1000 >= lease

    def heartbeat(self, lease: Lease) -> None:
        """Extends ``lease``, within a third of the lease (the heartbeat interval).

        An ambiguous failure of the write is resolved with a consistent read before the lock is
        declared lost.

        Raises:
            Fenced: another holder took the lock (this holder must stop writing).
            ExternalError: the lock store failed; the hold is neither confirmed nor lost.
        """
        deadline = time.monotonic() + self.lease_seconds / 3
        rec = self._read(deadline=deadline)
        if rec is None or rec.generation != lease.generation or rec.released:
            raise Fenced(self._lost(lease, rec))
        new = msgspec.structs.replace(rec, beat=rec.beat + 1, wall_ms=_now_ms())
        failure: Indeterminate | None = None
        try:
            ok = self._cas(rec, new, deadline=deadline)
        except Indeterminate as e:
            ok, failure = False, e  # resolved by the read below
        if ok:
            return
        again = self._read(deadline=deadline)
        if again is not None and again.generation == lease.generation and not again.released:
            if again == new:
                return  # our write landed after all
            if failure is not None:
                raise Determinate(f"heartbeat of generation {lease.generation} did not land: "
                                  f"{failure}") from failure
            raise ExternalError("heartbeat raced with a concurrent update of our own record")
        raise Fenced(self._lost(lease, again))

    def release(self, lease: Lease) -> None:
        """Gives the lock up if ``lease`` still holds it; otherwise does nothing. Idempotent.

        Gives up (with a warning; the lease then lapses) after ``store_timeout`` seconds of
        ambiguous store failures.

        Raises:
            ExternalError: the store failed definitely.
        """
        deadline = time.monotonic() + self.store_timeout
        for _ in range(8):
            rec = self._read(deadline=deadline)
            if rec is None or rec.generation != lease.generation or rec.released:
                return
            try:
                if self._cas(rec, msgspec.structs.replace(rec, released=True, wall_ms=_now_ms()),
                             deadline=deadline):
                    return
            except Indeterminate as e:
                if time.monotonic() >= deadline:
                    log.warning("writer lock: release of generation %d unconfirmed: %s",
                                lease.generation, e)
                    return
                continue  # the next read shows whether it landed

    def force_release(self) -> LockRecord | None:
        """Marks the lock released whoever holds it (operator action).

        Returns:
            The record it replaced (None, or a released record, if there was nothing to do).

        Raises:
            ExternalError: the store failed for ``store_timeout`` seconds (Indeterminate if
                the last write may have landed).
        """
        deadline = time.monotonic() + self.store_timeout
        failure: Indeterminate | None = None
        while True:
            rec = self._read(deadline=deadline)
            if rec is None or rec.released:
                return rec
            if time.monotonic() >= deadline:
                if failure is not None:
                    raise Indeterminate(f"force release of the writer lock unconfirmed within "
                                        f"{self.store_timeout:g}s: {failure}") from failure
                raise Timeout(f"force release of the writer lock: the record kept changing "
                              f"for {self.store_timeout:g}s (held by {rec.holder!r})")
            try:
                if self._cas(rec, msgspec.structs.replace(rec, released=True, wall_ms=_now_ms()),
                             deadline=deadline):
                    return rec
            except Indeterminate as e:
                failure = e
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
    """Returns the msgpack bytes of ``rec`` (what file and S3 locks store, in an envelope)."""
    return msgspec.msgpack.encode(rec)


def decode_record(data: bytes) -> LockRecord:
    """Decodes a record written by :func:`encode_record` (fields unknown to it are skipped).

    Raises:
        IncompatibleFormat: the record has a newer format version.
        ValueError: ``data`` is not a lock record (msgspec.DecodeError).
    """
    rec = msgspec.msgpack.decode(data, type=LockRecord)
    if rec.version > LOCK_FORMAT_VERSION:
        raise IncompatibleFormat(f"lock record version {rec.version} is newer than this persist")
    return rec
