"""Distributed writes, the second half: committing staged parts exactly once.

The protocol any distributed writer follows (Spark's sink, Dask, Ray, a fleet of scripts), each
step an engine part:

1. **Stage under a lease.** Workers stage parts with a :class:`~persist.distributed.stage.Stager`
   (:mod:`persist.distributed.stage`): stored, invisible, and kept from the leaked-blob sweeps
   while the job's staging lease lives.
2. **Commit with a token.** One process commits the staged parts, with whatever else belongs to
   the same step (seals, writes, holds), in one ``Client.apply`` carrying an idempotency
   :class:`~persist.indexed.format.transfer.Token` ``(id, seq)``: the token is recorded in the
   same atomic commit (in :data:`~persist.runtime.client.TOKENS`), and an apply whose seq is not
   above the last one recorded under its id writes nothing. A replay (a retried job, a
   restarted process that lost its acknowledgement) therefore lands nothing twice.
3. **Settle an unknown outcome from the log.** A commit can fail without saying whether it
   landed (the runtime goes fail-stop after an indeterminate storage error). The committer then
   opens the location again under the same reentrance id, which fences the old writer so that
   its commit can no longer land, and reads what happened: the token's record, or, without a
   token, whether a commit since added the staged parts (``Client.landed``, from the log).
4. **Keep a writer across commits.** Opening a writer (lock, fence commit, runtime) is most of
   a small commit's cost. With ``keep_writer``, the writer stays open in this process between
   commits (:class:`Writers`), holding the location's lock, until it has been idle that long.
5. **Reopen after a lost lock.** A kept writer may have lost its lock (another process took the
   location over under the same reentrance id, fencing it) without noticing yet. A commit that
   fails on a kept writer is settled as in 3 if its outcome is unknown, and otherwise runs once
   more on a freshly opened writer: nothing of it landed.

Once a commit is decided without them (declined, a replay of its token, or failed), the staged
parts are discarded: their blobs deleted, unless a commit references them. Releasing the staging
lease stays with the stager's owner (a stream keeps its lease across commits).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow.compute as pc

from persist import crashpoints
from persist.distributed.read import read_task
from persist.distributed.stage import Stager, discard
from persist.errors import Determinate, InvalidUsage, LockHeld, PersistError
from persist.indexed.format.transfer import StagedPart, Token
from persist.indexed.read.scan import Address
from persist.location import open as open_location
from persist.runtime.client import Client

log = logging.getLogger("persist.distributed")

#: How long a committer waits for a writer lock held by another process, by default (seconds).
LOCK_TIMEOUT = 60.0

#: A kept writer's key: its location (URL and storage options) and its reentrance id.
WriterKey = tuple[str, tuple[tuple[str, Any], ...], str]

#: What a commit's ``plan`` returns: more ``Client.apply`` arguments, or None to decline.
Plan = Callable[[Client], "Mapping[str, Any] | None"]

_ARGS = ("parts", "writes", "seals", "sinces", "holds")

#: An overwrite retracts the old contents one key range of about this many rows at a time, so
#: the committing process holds about one range of them, never all.
RETRACT_ROWS = 2_000_000


class Overwrite:
    """Overwrite as retraction: a commit ``plan`` (:meth:`Committer.commit`) that replaces
    collection ``name``'s contents at time ``at`` (its upper when the job started): under the
    writer lock, the snapshot as of ``at - 1`` with its diffs negated is staged at time ``at``,
    and committed with the job's own parts (which the job staged at ``at``), so the collection
    as of ``at`` holds exactly the new rows.

        over = Overwrite("events", at, stager, schema_version=sid)
        try:
            committer.commit({"events": new_parts}, seals={"events": at + 1}, plan=over)
        finally:
            stager.release([*new_parts, *over.staged])

    Its plan runs under the writer lock (the committer's client is the writer), so no other
    write moves the collection meanwhile; its own background compaction may replace parts, but
    replaced parts outlive their replacement by the GC grace period. The retraction is read one
    key range at a time (about :data:`RETRACT_ROWS` rows), so this process holds about one
    range of the old contents. The parts it staged are in :attr:`staged` (release them with
    the job's: the committer discards them with the job's if the commit fails).
    """

    def __init__(self, name: str, at: int, stager: Stager, *, schema_version: int,
                 rows_per_range: int | None = None) -> None:
        self.name = name
        self.at = at
        self.stager = stager
        self.schema_version = schema_version
        self.rows_per_range = rows_per_range
        #: Every part a plan call staged (a retried commit plans again).
        self.staged: list[StagedPart] = []

    def __call__(self, client: Client) -> dict[str, Any]:
        """The plan: the retraction's parts, as ``Client.apply`` arguments.

        Raises:
            InvalidUsage: another write moved the upper past ``at`` since the overwrite
                started, or the schema evolved meanwhile (nothing was written: run it again).
        """
        more = self.retraction(client)
        self.staged.extend(more)
        return {"parts": {self.name: more}}

    def retraction(self, client: Client) -> list[StagedPart]:
        """The snapshot as of ``at - 1`` negated, at time ``at``, as staged parts (none when
        ``at`` is 0 or the snapshot is empty).

        Raises:
            InvalidUsage: as :meth:`__call__`.
        """
        name, at = self.name, self.at
        c = client.info(name)
        if c.upper != at:
            raise InvalidUsage(
                f"overwrite of {name!r} planned at its upper {at}, but another write moved "
                f"the upper to {c.upper} meanwhile: nothing was written; run the overwrite again"
            )
        if c.schema_version != self.schema_version:
            raise InvalidUsage(
                f"overwrite of {name!r} planned with schema version {self.schema_version}, "
                f"but the collection was evolved to {c.schema_version} meanwhile: nothing was "
                f"written; run the overwrite again")
        if at == 0:
            return []
        scan = c.snapshot(at - 1, schema_version=self.schema_version)
        per = RETRACT_ROWS if self.rows_per_range is None else max(1, self.rows_per_range)
        n = max(1, -(-scan.rows // per))
        out: list[StagedPart] = []
        for task in scan.tasks(consolidated=True, n=n):
            for snap in read_task(task):
                if len(snap) == 0:
                    continue
                negated = snap.set_column(3, snap.schema.field(3), pc.negate(snap.column("diff")))
                out.append(self.stager.stage(negated, at=at))
        return out


class Writers:
    """Writer clients kept open between commits in this process, one per location and
    reentrance id (:data:`WRITERS` is the process's).

    NB: a process-wide registry, not a committer's own: a Spark driver makes a fresh sink
    writer, and so a fresh committer, for every micro-batch, but runs a query's commits in one
    reused Python worker, so only what lives in the module survives from one commit to the next.

    The price is the location's writer lock, held while a writer is kept: other writers of the
    location wait for it. So a kept writer is closed once it has sat idle for its timeout (a
    daemon timer), and at interpreter exit.

    Invariant: a writer is either idle here (its timer armed) or checked out by one commit
    (:meth:`take` until :meth:`keep`); the timer only ever closes an idle one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[WriterKey, tuple[Client, threading.Timer]] = {}

    def take(self, key: WriterKey) -> Client | None:
        """Checks out ``key``'s idle writer: None if there is none, or if it went away (it
        stopped, or its lock was taken over; it is closed then)."""
        with self._lock:
            entry = self._idle.pop(key, None)
        if entry is None:
            return None
        client, timer = entry
        timer.cancel()
        if client.stopped or client.lock_lost is not None:
            log.info("persist committer: the kept writer of %s went away (%s); opening a new "
                     "one", key[0], client.lock_lost or "stopped")
            client.stop()
            return None
        return client

    def keep(self, key: WriterKey, client: Client, idle: float) -> None:
        """Returns a checked-out ``client`` as ``key``'s idle writer, closed once it has been
        idle for ``idle`` seconds (at once if ``idle`` is 0 or it went away)."""
        if idle <= 0 or client.stopped or client.lock_lost is not None:
            client.stop()
            return
        timer = threading.Timer(idle, self._expire, (key, client))
        timer.daemon = True
        with self._lock:
            old = self._idle.pop(key, None)
            self._idle[key] = (client, timer)
            timer.start()
        if old is not None and old[0] is not client:  # pragma: no cover - concurrent commits
            old[1].cancel()
            old[0].stop()

    def _expire(self, key: WriterKey, client: Client) -> None:
        with self._lock:
            entry = self._idle.get(key)
            if entry is None or entry[0] is not client:
                return  # taken (or replaced) meanwhile
            del self._idle[key]
        log.info("persist committer: closing the idle writer of %s (releasing its lock)", key[0])
        client.stop()

    def idle(self) -> list[WriterKey]:
        """The keys of the writers kept idle now."""
        with self._lock:
            return list(self._idle)

    def close(self, key: WriterKey | None = None) -> None:
        """Closes the idle writer of ``key`` (None: every idle writer), releasing its lock."""
        with self._lock:
            if key is None:
                entries = list(self._idle.values())
                self._idle.clear()
            else:
                entry = self._idle.pop(key, None)
                entries = [] if entry is None else [entry]
        for client, timer in entries:
            timer.cancel()
            client.stop()


#: This process's kept writers.
WRITERS = Writers()
# NB: persist stops its live clients at exit too; closing here first also cancels the timers.
atexit.register(WRITERS.close)


class _MaybeLanded(Exception):
    """An apply was sent and failed without saying whether it landed."""

    def __init__(self, seq: int, cause: PersistError) -> None:
        super().__init__(str(cause))
        #: The state's seq the apply was planned on (what settling looks after).
        self.seq = seq
        self.cause = cause


class Committer:
    """Commits to the location at ``url`` as writer ``reentrance_id``, each commit exactly
    once: the protocol of :mod:`persist.distributed.commit` (its steps 2 to 5).

    Cheap to make (it opens nothing until a commit), and picklable as far as its arguments are;
    not for concurrent commits from several threads (they would wait for each other's lock).
    A context manager: leaving it (or :meth:`close`) closes its kept writer.

    Args:
        url, storage_options: the location, as for ``persist.open``.
        reentrance_id: the writer identity every commit opens under: the same one after a
            restart, so that the restarted process takes the lock over at once (fencing the old
            one's commits) and settles what they did.
        lock_timeout: seconds to wait for the lock while another writer (another id) holds it.
        keep_writer: keep the writer open this many seconds after a commit, for the next one
            (0: close it after each commit). It holds the location's lock meanwhile.
        writers: where kept writers live (default: this process's :data:`WRITERS`).
        opener: how to open the location as writer ``reentrance_id`` (default: ``persist.open``
            with the arguments above); pass one to open with more arguments (engine options,
            a lock lease) or over another store. It must open the location at ``url``.

    Raises (construction):
        InvalidUsage: a reentrance id that is not a non-empty str, or a negative timeout.
    """

    def __init__(self, url: str, *, reentrance_id: str,
                 storage_options: Mapping[str, Any] | None = None,
                 lock_timeout: float = LOCK_TIMEOUT, keep_writer: float = 0.0,
                 writers: Writers | None = None,
                 opener: Callable[[], Client] | None = None) -> None:
        if not isinstance(reentrance_id, str) or not reentrance_id:
            raise InvalidUsage(f"a committer's reentrance_id must be a non-empty str, not "
                               f"{reentrance_id!r}")
        for what, value in (("lock_timeout", lock_timeout), ("keep_writer", keep_writer)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidUsage(f"{what} must be a number of seconds >= 0, not {value!r}")
        self.address = Address.of(url, storage_options)
        self.reentrance_id = reentrance_id
        self.lock_timeout = float(lock_timeout)
        self.keep_writer = float(keep_writer)
        self._writers = writers if writers is not None else WRITERS
        self._opener = opener

    @property
    def key(self) -> WriterKey:
        """The key its kept writer has in :class:`Writers`."""
        return (self.address.url, self.address.storage, self.reentrance_id)

    def commit(
        self,
        parts: Mapping[str, Sequence[StagedPart]] | None = None,
        *,
        writes: Mapping[str, Any] | None = None,
        seals: Mapping[str, int] | None = None,
        sinces: Mapping[str, int] | None = None,
        holds: Mapping[str, Mapping[str, int | None]] | None = None,
        token: Token | None = None,
        plan: Plan | None = None,
    ) -> bool:
        """Commits ``parts`` (staged parts per collection) with ``writes``, ``seals``,
        ``sinces`` and ``holds`` in one ``Client.apply``, exactly once.

        Args:
            token: the commit's idempotency token: if its seq is not above the last one
                recorded under its id, nothing is written (a replay). Without one, a commit
                whose outcome is unknown is settled by its staged parts alone (so it must have
                some; else the unknown outcome is raised).
            plan: called with the open writer before the apply (again if the apply is retried
                on a new writer), for what can only be decided under the writer lock: it
                returns more ``Client.apply`` arguments (any of ``parts``, ``writes``,
                ``seals``, ``sinces``, ``holds``), merged in (staged parts appended, other
                mappings joined; a collection both name is refused), or None to decline
                (nothing is committed).

        Returns:
            True if this call's commit landed (now, or in an attempt whose outcome was
            unknown); False if ``plan`` declined or the token was already applied. Either way
            the outcome is final; on False the staged parts were discarded.

        Raises:
            InvalidUsage, SchemaMismatch: arguments the apply refuses (nothing landed): a part
                staged elsewhere, times below upper, a ``plan`` result that clashes, ...
            LockHeld: another writer held the lock for ``lock_timeout``.
            Determinate: the commit did not land (its unknown outcome was settled so).
            PersistError: anything else that failed before the apply was sent (the staged
                parts were then discarded); or an unknown outcome that could not be settled
                (no token and no staged parts, or reopening failed: the staged parts are kept,
                as the commit may yet land).
        """
        if token is not None and not isinstance(token, Token):
            raise InvalidUsage(f"token must be a persist.distributed.Token, not "
                               f"{type(token).__name__}")
        base = {"parts": parts, "writes": writes, "seals": seals, "sinces": sinces,
                "holds": holds}
        #: Every part staged for this commit (the caller's, and any a plan staged): what is
        #: discarded if it does not land, and what settles an unknown outcome without a token.
        staged = [p for ps in (parts or {}).values() for p in ps]
        return self._commit(_Attempt(self, base, token, plan, staged))

    def _commit(self, attempt: _Attempt) -> bool:
        kept = self._writers.take(self.key) if self.keep_writer > 0 else None
        if kept is None:
            return self._commit_on(attempt, None)
        try:
            done = attempt.run(kept)
        except _MaybeLanded as m:
            kept.stop()
            landed, fresh = self._settle(attempt, m)
            if landed:
                self._put_back(fresh)
                return True
            log.info("persist committer: a commit to %s on a kept writer failed (%s) and did "
                     "not land; retrying on a new writer", self.address.url, m.cause)
            return self._commit_on(attempt, fresh)
        except PersistError as e:
            kept.stop()
            log.info("persist committer: a commit to %s on a kept writer failed (%s: %s), "
                     "nothing landed; retrying on a new writer", self.address.url,
                     type(e).__name__, e)
            return self._commit_on(attempt, None)
        except BaseException:
            kept.stop()
            raise
        self._put_back(kept)
        return done

    def _commit_on(self, attempt: _Attempt, client: Client | None) -> bool:
        """The commit on ``client``, a writer just opened (None: open one now).

        NB: the staged parts are discarded only where the outcome is known not to have
        landed: a commit still in flight (an unknown outcome that could not be settled, an
        interrupt) may yet reference them.
        """
        if client is None:
            try:
                client = self._open()
            except PersistError:
                attempt.discard()  # nothing was sent
                raise
        try:
            done = attempt.run(client)
        except _MaybeLanded as m:
            client.stop()
            landed, fresh = self._settle(attempt, m)
            self._put_back(fresh)
            if landed:
                return True
            attempt.discard()
            raise Determinate(f"a commit to {self.address.url} failed ({m.cause}) and, read "
                              f"back from the log, did not land") from m.cause
        except PersistError:
            client.stop()
            attempt.discard()  # definitely nothing landed
            raise
        except BaseException:
            client.stop()
            raise
        self._put_back(client)
        return done

    def _open(self) -> Client:
        if self._opener is not None:
            return self._opener()
        return open_location(self.address.url, reentrance_id=self.reentrance_id,
                             lock_timeout=self.lock_timeout,
                             storage_options=self.address.storage_options)

    def _put_back(self, client: Client) -> None:
        if self.keep_writer > 0:
            self._writers.keep(self.key, client, self.keep_writer)
        else:
            client.stop()

    def _settle(self, attempt: _Attempt, m: _MaybeLanded) -> tuple[bool, Client]:
        """Opens the location again (fencing the writer whose commit's outcome ``m`` left
        unknown, so it can no longer land) and reads whether that commit landed.

        Returns:
            Whether it landed, and the new writer (the caller's to keep or close).

        Raises:
            PersistError: the outcome cannot be read: ``m.cause`` if there is neither a token
                nor a staged part to look for; or reopening or reading failed.
        """
        if attempt.token is None and not attempt.staged:
            raise m.cause
        client = self._open()
        try:
            if attempt.token is not None:
                last = client.token(attempt.token.id)
                landed = last is not None and last >= attempt.token.seq
            else:
                landed = client.landed(m.seq, attempt.staged)
        except BaseException:
            client.stop()
            raise
        if landed:
            log.warning("persist committer: a commit to %s reported %s, but it landed (read "
                        "back from the log)", self.address.url, m.cause)
            crashpoints.hit("committer.landed")
        return landed, client

    def close(self) -> None:
        """Closes this committer's kept writer, if one is idle (releasing the lock)."""
        self._writers.close(self.key)

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<persist.distributed.Committer {self.address.url} as {self.reentrance_id!r}>"


class _Attempt:
    """One commit's arguments, run on a writer once per attempt."""

    def __init__(self, committer: Committer, base: dict[str, Any], token: Token | None,
                 plan: Plan | None, staged: list[StagedPart]) -> None:
        self.committer = committer
        self.base = base
        self.token = token
        self.plan = plan
        self.staged = staged

    def run(self, client: Client) -> bool:
        """One commit on the open writer ``client``.

        Returns:
            True if it landed; False if the plan declined or the token was applied before
            (the staged parts are then discarded).

        Raises:
            _MaybeLanded: the apply was sent and failed with an unknown outcome.
            PersistError: nothing landed.
        """
        args = dict(self.base)
        if self.plan is not None:
            more = self.plan(client)
            if more is None:
                self.discard()
                return False
            args = _merged(args, more)
            self.staged.extend(p for ps in (more.get("parts") or {}).values() for p in ps)
        seq = client.state.seq
        try:
            applied = client.apply(**args, token=self.token).result()
        except (Determinate, InvalidUsage, LockHeld):
            raise  # definitely nothing landed
        except PersistError as e:
            raise _MaybeLanded(seq, e) from e
        if applied is None:
            assert self.token is not None
            log.warning("persist committer: token %r seq %d was applied before (a replay): "
                        "nothing written", self.token.id, self.token.seq)
            self.discard()
            return False
        crashpoints.hit("committer.landed")
        return True

    def discard(self) -> None:
        """Deletes the blobs of the staged parts no commit references (the commit is decided
        without them)."""
        discard(self.committer.address, self.staged)


def _merged(base: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` apply arguments with a plan's ``more`` merged in.

    Raises:
        InvalidUsage: an argument ``Client.apply`` does not take, or a collection both give
            a write, seal, since or hold for.
    """
    unknown = sorted(set(more) - set(_ARGS))
    if unknown:
        raise InvalidUsage(f"a commit plan returned {unknown}; it may return {list(_ARGS)}")
    out = dict(base)
    for arg, extra in more.items():
        if not extra:
            continue
        have = dict(out.get(arg) or {})
        for name, value in extra.items():
            if arg == "parts":
                have[name] = [*have.get(name, ()), *value]
            elif name in have:
                raise InvalidUsage(f"a commit plan's {arg} for {name!r} clashes with the "
                                   f"commit's own")
            else:
                have[name] = value
        out[arg] = have
    return out


__all__ = ["LOCK_TIMEOUT", "WRITERS", "Committer", "Writers"]
