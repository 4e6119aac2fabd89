"""The runtime: one thread per open location that linearizes and group-commits every change.

Loop::

    take the next command (blocking), then every command already queued behind it (a group)
    -> stage each against a working copy of the state; a refused command fails alone
    -> one durable step for the whole group (Indexed.commit: <= one data blob per collection,
       one metadata commit)
    -> publish the new state, resolve every future of the group, wake listeners

No timer: an idle runtime commits a lone write at once, and while a commit is in flight new
commands queue up and become the next group. That is the whole group-commit mechanism.

Who runs a group: whoever holds the *turn* (``Runtime._turn``), and commands leave the queue
only under it, so groups are staged in queue order whoever runs them. Usually the runtime
thread; but a thread that blocks on the future of its own write (``PersistFuture.result``)
while that write is still queued takes the turn if it is free and runs the queue's head itself
(``Runtime._help``): the writes at the head, up to and including its own. That saves the two
thread handoffs of a lone acknowledged write (waking the runtime thread, then waking the
caller: 60-70 µs each of a ~1.2 ms local append, measured), and changes nothing else: a caller
that does not wait (pipelined writes, the asyncio face) leaves its writes to the runtime
thread, which groups them as before, and only writes are run so (maintenance results, options,
schema changes, restores and stops stay with the runtime thread).

Failure handling:

* Definite failure (nothing landed): the group's futures fail with the error; the state stays.
* Indeterminate (it may have landed), or any unexpected error: fail-stop. The group's futures
  and every later command fail with RuntimeShutdown; reopening the location reads the truth.
* Fenced (a newer writer took over): the same fail-stop, with Fenced as the cause.

Two helper threads do the rest off the commit path: *maintenance* (compaction, GC, rollups; its
results come back as ``Maintenance`` commands so they are linearized like everything else) and
the lock *heartbeat*.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from persist import layout, metrics
from persist.errors import (
    CommitDeadline,
    Corruption,
    Determinate,
    ExternalError,
    Fenced,
    HoldLapsed,
    InvalidUsage,
    PersistError,
    RuntimeShutdown,
)
from persist.indexed.engine import Indexed, Txn
from persist.indexed.format import evolve
from persist.indexed.format.meta import (
    AddPart,
    AllowCompaction,
    Op,
    Seal,
    SetHold,
    State,
)
from persist.indexed.maintenance import compact, pending
from persist.indexed.state import lease as staging
from persist.indexed.state.transitions import collection, effective_since
from persist.lock.base import Lease, WriterLock
from persist.runtime import commands as cmd
from persist.runtime.branches import HoldDesk

log = logging.getLogger("persist.runtime")

#: The side thread trims the metadata log once a maintenance round has been under way this
#: long (:meth:`Runtime._metadata_beside`).
METADATA_BESIDE_SECONDS = 1.0


class Published:
    """The newest committed state, readable from any thread, with a condition to wait on."""

    def __init__(self, state: State) -> None:
        self._state = state
        self._cond = threading.Condition()
        self.closed: BaseException | None = None

    @property
    def state(self) -> State:
        """The newest published state (a frozen snapshot; safe to read from any thread)."""
        return self._state

    def publish(self, state: State) -> None:
        """Makes ``state`` the newest, unless a newer seq was published already; wakes every
        waiter either way."""
        with self._cond:
            if state.seq >= self._state.seq:
                self._state = state
            self._cond.notify_all()

    def close(self, why: BaseException) -> None:
        """Marks the publisher stopped because of ``why``: current and later waits raise
        RuntimeShutdown."""
        with self._cond:
            self.closed = why
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[State], bool], timeout: float | None) -> State | None:
        """Waits until ``pred(state)``; returns that state, or None on timeout.

        Raises:
            RuntimeShutdown: the runtime (or follower) stopped while waiting.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if pred(self._state):
                    return self._state
                if self.closed is not None:
                    raise RuntimeShutdown(f"stopped while waiting: {self.closed}")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining if remaining is not None else 1.0)


class LocalHolds:
    """In-process read holds (listeners): compaction must not forward times past them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds: dict[int, tuple[str, int]] = {}
        self._next = 0

    def add(self, name: str, frontier: int) -> int:
        """Holds collection ``name`` back at ``frontier``; returns the token of the hold."""
        with self._lock:
            self._next += 1
            self._holds[self._next] = (name, frontier)
            return self._next

    def update(self, token: int, frontier: int) -> None:
        """Moves hold ``token`` to ``frontier``."""
        with self._lock:
            name, _ = self._holds[token]
            self._holds[token] = (name, frontier)

    def remove(self, token: int) -> None:
        """Releases hold ``token`` (idempotent)."""
        with self._lock:
            self._holds.pop(token, None)

    def frontier(self, name: str) -> int | None:
        """The lowest hold on collection ``name``, or None if it has none."""
        with self._lock:
            fs = [f for n, f in self._holds.values() if n == name]
        return min(fs) if fs else None


class Runtime:
    """Owns the Indexed engine of a writable location and the threads that drive it."""

    def __init__(
        self,
        ix: Indexed,
        *,
        lock: WriterLock | None,
        lease: Lease | None,
        on_lock_lost: Callable[[Fenced], None] | None = None,
        maintenance: bool = True,
        max_group: int = 4096,
        maintenance_linger: float = 0.05,
        maintenance_interval: float = 0.02,
    ) -> None:
        self.ix = ix
        self.lock = lock
        self.lease = lease
        self.on_lock_lost = on_lock_lost
        self.published = Published(ix.state)
        self._holds_desk = HoldDesk(poll_seconds=0.1 if ix.store.is_local else 1.0)
        self.holds = LocalHolds()
        self.max_group = max_group
        self.maintenance_linger = maintenance_linger
        self.maintenance_interval = maintenance_interval
        self.lock_lost: Fenced | None = None
        self._queue = _CommandQueue()
        #: Held by whoever takes commands from the queue and runs them as a group (the module
        #: docstring): the runtime thread, or a caller waiting on its own write.
        self._turn = threading.Lock()
        #: Set (under the turn) once the loop has seen a Stop or ended: nobody runs a group.
        self._closed = False
        self._poisoned: BaseException | None = None
        self._stopping = threading.Event()
        #: Set by stop before ``_stopping``: no maintenance round starts, one under way ends
        #: at its next step, and commits what it wrote while the loop still runs.
        self._maint_stop = threading.Event()
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._maint_wake = threading.Event()
        self._maint_lock = threading.Lock()
        #: When the maintenance round under way started (``time.monotonic()``; None: none).
        self._round_started: float | None = None
        self.stats = {"commits": 0, "commands": 0, "groups_max": 0}
        self._thread = threading.Thread(target=self._run, name="persist-runtime", daemon=True)
        self._thread.start()
        self._maint_thread: threading.Thread | None = None
        self._meta_thread: threading.Thread | None = None
        if maintenance:
            self._maint_thread = threading.Thread(
                target=self._maintain, name="persist-maintenance", daemon=True
            )
            self._maint_thread.start()
            self._meta_thread = threading.Thread(
                target=self._metadata_beside, name="persist-metadata", daemon=True)
            self._meta_thread.start()
        self._hb_thread: threading.Thread | None = None
        if lock is not None and lease is not None:
            self._hb_thread = threading.Thread(
                target=self._heartbeat, name="persist-heartbeat", daemon=True
            )
            self._hb_thread.start()
        metrics.track(self)
        log.info("writer %r (generation %s) running at seq %d", ix.writer,
                 lease.generation if lease else "-", ix.state.seq)

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, command: cmd.Command) -> cmd.PersistFuture:
        """Enqueues ``command``; its future reports the outcome. Never blocks."""
        if self._poisoned is not None:
            command.future.set_exception(self._shutdown_error())
            return command.future
        # NB: check-and-put under the stop lock, or a command could slip in behind the Stop
        # after the loop drained the queue and never resolve.
        with self._stop_lock:
            if self._stopping.is_set():
                command.future.set_exception(RuntimeShutdown("the runtime was stopped"))
            else:
                if isinstance(command, cmd.Apply):
                    command.future.helper = self._help
                self._queue.put(command)
        return command.future

    def _help(self, future: cmd.PersistFuture) -> None:
        """A caller about to block on ``future`` (its write's) runs the writes at the head of
        the queue itself, up to its own, if nobody holds the turn (the module docstring).
        Returns at once if somebody does: the runtime thread then commits them."""
        if not self._turn.acquire(blocking=False):
            return
        try:
            while not future.done() and not self._closed:
                group = self._queue.take(self._group_size(), only=cmd.Apply)
                if not group:
                    return
                try:
                    self._step(group)
                except BaseException as e:  # a bug: fail-stop, as the loop would
                    self._poison(e)
                    raise
        finally:
            self._turn.release()
            if not self._queue.empty():
                self._queue.kick()  # the runtime thread left them to this caller (``_run``)

    def _group_size(self) -> int:
        # NB: options are read at each use: Client.set_options may have replaced them since
        # the last group. With group commit off, a group is one command.
        return self.max_group if self.ix.options.group_commit else 1

    def _shutdown_error(self) -> RuntimeShutdown:
        why = self._poisoned
        err = RuntimeShutdown(
            f"the runtime stopped after an unrecoverable error ({type(why).__name__}: {why}); "
            f"reopen the location to recover its state from storage"
        )
        err.__cause__ = why
        return err

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                seen = self._queue.wait()
                if not self._turn.acquire(blocking=False):
                    # NB: a caller is running the queue's head (``_help``). Waiting for the
                    # turn would wake this thread again when it ends, for nothing after a lone
                    # write; the caller kicks the queue instead if it leaves commands behind.
                    self._queue.wait_past(seen)
                    continue
                try:
                    size = self._group_size()
                    group = self._queue.take(size)
                    if not group:
                        continue  # a caller waiting on its write ran them (``_help``)
                    # NB: compaction and GC results need not be durable soon. Holding a group
                    # of only those briefly lets them ride in the next user commit instead of
                    # costing a commit (an fsync) of their own, which a write arriving a
                    # moment later would have to wait behind. Any command (Stop too) ends the
                    # wait. The turn is held meanwhile: a caller waiting on that write leaves
                    # it to this thread.
                    if size > 1 and self.maintenance_linger > 0 and all(
                        isinstance(c, cmd.Maintenance) for c in group
                    ) and self._queue.wait_for_more(self.maintenance_linger):
                        group += self._queue.take(size - len(group))
                    if self._step(group):
                        self._closed = True
                        break
                finally:
                    self._turn.release()
        finally:
            with self._turn:
                self._closed = True
                self._drain_after_stop()

    def _step(self, group: list[cmd.Command]) -> bool:
        """Commits one group. Returns True when a Stop was seen."""
        stop = None
        if self._poisoned is not None:
            for c in group:
                if isinstance(c, cmd.Stop):
                    stop = c
                else:
                    c.future.set_exception(self._shutdown_error())
            return stop is not None
        txn = Txn(self.ix.state)
        accepted: list[cmd.Command] = []
        for c in group:
            if stop is not None:
                c.future.set_exception(RuntimeShutdown("the runtime was stopped"))
                continue
            if isinstance(c, cmd.Stop):
                stop = c
                continue
            if isinstance(c, cmd.SetOptions):
                # NB: a group boundary: what was staged before it commits under the old
                # options, what comes after is staged and committed under the new ones (the
                # queue order is the linearization, for options as for writes).
                accepted = self._commit_before(txn, accepted)
                if self._refuse_if_poisoned(c):
                    continue
                try:
                    self.ix.set_options(c.options)
                except InvalidUsage as e:
                    c.future.set_exception(e)
                else:
                    c.future.set_result(self.ix.state.seq)
                    self._maint_wake.set()  # a new policy may have merges to plan
                txn = Txn(self.ix.state)
                continue
            if isinstance(c, (cmd.EvolveSchema, cmd.Restore)) or (
                    isinstance(c, cmd.Plan) and c.alone):
                # NB: an evolution (a restore, a fork) commits alone (see ``Txn.stage``): what
                # was staged before it commits first, and what comes after it is staged
                # against the new version (the restored state, the new collection).
                accepted = self._commit_before(txn, accepted)
                if self._refuse_if_poisoned(c):
                    continue
                self._alone(c)
                txn = Txn(self.ix.state)
                continue
            if self._poisoned is not None:  # a commit earlier in this group failed for good
                c.future.set_exception(self._shutdown_error())
                continue
            try:
                self._stage(txn, c)
                accepted.append(c)
            except (InvalidUsage, CommitDeadline, staging.LeaseRevoked, ExternalError,
                    HoldLapsed) as e:
                c.future.set_exception(e)
            except Exception as e:  # a bug in staging must not kill the loop silently
                log.exception("staging a command failed")
                c.future.set_exception(e)
        if accepted:
            self._commit(txn, accepted)
        return stop is not None

    def _commit_before(self, txn: Txn, accepted: list[cmd.Command]) -> list[cmd.Command]:
        """A group boundary: commits what was staged before it; returns a fresh group."""
        if accepted:
            self._commit(txn, accepted)
        return []

    def _refuse_if_poisoned(self, c: cmd.Command) -> bool:
        """Fails ``c`` if the runtime went fail-stop (True: skip it)."""
        if self._poisoned is None:
            return False
        c.future.set_exception(self._shutdown_error())
        return True

    def _alone(self, c: cmd.EvolveSchema | cmd.Restore | cmd.Plan) -> None:
        """Stages and commits one schema evolution (restore, fork) alone; an evolution's
        future gets the new version."""
        txn = Txn(self.ix.state)
        try:
            if isinstance(c, cmd.EvolveSchema):
                staged = txn.evolve(c.name, c.key, c.value, c.expect)
            elif isinstance(c, cmd.Restore):
                txn.stage(c.op)
            else:
                self._stage(txn, c)
        except (InvalidUsage, CommitDeadline, ExternalError, HoldLapsed) as e:
            c.future.set_exception(e)
            return
        except Exception as e:  # a bug in staging must not kill the loop silently
            log.exception("staging a command failed")
            c.future.set_exception(e)
            return
        if isinstance(c, cmd.EvolveSchema) and not staged:
            # already the current schema: nothing to commit
            c.future.set_result(evolve.version(collection(txn.collections, c.name)))
            return
        self._commit(txn, [c])

    def _stage(self, txn: Txn, c: cmd.Command) -> None:
        if isinstance(c, cmd.Apply):
            versions = dict(c.versions)
            leases = {lid for _, p in c.parts if p.blob_key is not None
                      and (lid := layout.lease_of(p.blob_key)) is not None}
            if leases:
                # NB: rule 2 of persist.indexed.state.lease: no lease revoked now, and the commit
                # lands within the deadline counted from here, before any sweep's grace from a
                # revocation after this check can end.
                staging.check_committable(self.ix.blob, leases)
                txn.wrote_blobs(time.monotonic())
            with txn.atomically():
                for name, part in c.parts:
                    txn.stage(AddPart(name=name, part=part))
                for name, table in c.writes:
                    txn.stage_write(name, table, versions.get(name))
                for name, hold_id, frontier in c.holds:
                    txn.stage(SetHold(name=name, hold_id=hold_id, frontier=frontier))
                for name, upper in c.seals:
                    txn.stage(Seal(name=name, upper=upper))
                for name, since in c.sinces:
                    txn.stage(AllowCompaction(name=name, since=since))
        elif isinstance(c, cmd.Plan):
            if c.written_at is not None:
                # NB: half the deadline only for a plan that joins a group (as a merge does,
                # below); one committed alone writes no other data blobs after this check
                self.ix.check_deadline(c.written_at, fraction=1.0 if c.alone else 0.5)
                written_at = c.written_at
                if c.within is not None:
                    age = time.monotonic() - c.written_at
                    if age > c.within:
                        raise CommitDeadline(
                            f"not committing: the fork's pins were made {age:.3g}s ago, past "
                            f"the {c.within:g}s they promised the source to commit within; "
                            f"nothing was committed, retry")
                    # NB: a bound shorter than the deadline counts as blobs written that much
                    # earlier, so the commit's own check holds it to the bound too
                    written_at -= max(0.0, self.ix.options.commit_deadline_seconds - c.within)
                txn.wrote_blobs(written_at)
            with txn.atomically():
                for op in c.plan(txn):
                    txn.stage(op)
        elif isinstance(c, (cmd.EvolveSchema, cmd.Restore)):
            raise AssertionError("schema evolutions and restores are committed alone")
        elif isinstance(c, cmd.Register):
            txn.register(c.name, c.key, c.value)
        elif isinstance(c, cmd.Maintenance):
            if c.written_at is not None:
                # NB: refuse it alone here (a merge waited too long in the queue) rather than
                # fail the whole group at the commit's own check; compaction plans again. Only
                # with half the deadline left: the commit checks again after writing the
                # group's own data blobs, and a merge admitted with little time to spare used
                # to fail every user write of its group with CommitDeadline there (the knob
                # matrix's nemesis under load; tests/runtime/test_commit_deadline.py).
                self.ix.check_deadline(c.written_at, fraction=0.5)
                txn.wrote_blobs(c.written_at)
            with txn.atomically():
                for op in c.ops:
                    txn.stage(op)

    def _commit(self, txn: Txn, accepted: list[cmd.Command]) -> None:
        started = time.perf_counter()
        try:
            state = self.ix.commit(txn)
        except Determinate as e:
            # Nothing landed. The state may be stale (CommitConflict): reload before going on.
            metrics.commit_failed(e)
            for c in accepted:
                c.future.set_exception(e)
            # NB: retry the reload briefly: a storage blip that failed the commit often fails
            # the next read too, and stopping the writer for it would force a reopen.
            for attempt in range(6):
                try:
                    state = self.ix.reload()
                    break
                except Determinate as reload_error:
                    if attempt == 5:
                        self._poison(reload_error)
                        return
                    time.sleep(min(1.0, 0.02 * 2**attempt))
                except PersistError as reload_error:
                    self._poison(reload_error)
                    return
            if state.epoch > self.ix.epoch:
                # A newer writer committed: never stage later commands against its state.
                self._poison(Fenced(
                    f"writer {self.ix.writer!r} (generation {self.ix.epoch}) was fenced: "
                    f"{state.writer!r} (generation {state.epoch}) committed seq {state.seq}"
                ))
                return
            self.published.publish(state)
            return
        except Exception as e:  # Indeterminate, Fenced, bugs: fail-stop
            metrics.commit_failed(e)
            self._poison(e)
            for c in accepted:
                c.future.set_exception(e if isinstance(e, PersistError) else self._shutdown_error())
            return
        metrics.commit_done(time.perf_counter() - started, len(accepted))
        self.stats["commits"] += 1
        self.stats["commands"] += len(accepted)
        self.stats["groups_max"] = max(self.stats["groups_max"], len(accepted))
        self.published.publish(state)
        for c in accepted:
            if isinstance(c, cmd.EvolveSchema):  # committed alone: its version is the newest
                c.future.set_result(evolve.version(state.collections[c.name]))
            else:
                c.future.set_result(state.seq)
        self._maint_wake.set()
        log.debug("committed seq %d: %d commands in %.2f ms", state.seq, len(accepted),
                  (time.perf_counter() - started) * 1000)

    def _poison(self, why: BaseException) -> None:
        with self._stop_lock:
            first = self._poisoned is None
            if first:
                self._poisoned = why
        if not first:
            return
        if isinstance(why, Fenced):
            # NB: a documented, normal flow (README, "Blue/green deployments"): another
            # process opened the location as this writer, or took the lock after this one's
            # lease lapsed. Nothing was lost: commits this runtime acknowledged stand, and
            # later ones raise Fenced. A WARNING, not an ERROR, so a planned switch does not
            # page anyone.
            log.warning("persist writer %r stops: another writer took over the location "
                        "(expected during a blue/green switch, when the new deployment opens "
                        "it with the same reentrance_id; otherwise a second writer of this "
                        "location exists). Acknowledged writes stand; writes through this "
                        "client now raise Fenced. %s", self.ix.writer, why)
        else:
            log.error("persist runtime is going fail-stop: %s: %s", type(why).__name__, why)
        metrics.fail_stop(why)
        self.published.close(self._shutdown_error())
        if isinstance(why, Fenced):
            metrics.lock_lost()
            # Lost the lock (heartbeat) or the log (a commit was fenced): tell the user.
            self.lock_lost = why
            if self.on_lock_lost is not None:
                try:
                    self.on_lock_lost(why)
                except Exception:
                    log.exception("on_lock_lost callback failed")

    def _drain_after_stop(self) -> None:
        while True:
            taken = self._queue.take(1)
            if not taken:
                return
            c = taken[0]
            if isinstance(c, cmd.Stop):
                c.future.set_result(None)
            else:
                c.future.set_exception(RuntimeShutdown("the runtime was stopped"))

    # -- maintenance: compaction, GC, rollups ---------------------------------------------------

    def _maintain(self) -> None:
        while not self._maint_stop.is_set():
            self._maint_wake.wait(timeout=1.0)
            # NB: at most one round per interval, however often commits wake us. A round right
            # after every commit competes for the GIL with the writer preparing its next append
            # (adding its CPU to that append's latency), and merges the few parts one commit
            # made; a round per interval merges what the interval accumulated, in one go.
            if self._maint_stop.wait(self.maintenance_interval):
                return
            self._maint_wake.clear()
            if self._maint_stop.is_set() or self._poisoned is not None:
                return
            try:
                self.maintain_once(background=True)
            except (ExternalError, RuntimeShutdown, Fenced) as e:
                if self._maint_stop.is_set() or self._poisoned is not None:
                    log.debug("maintenance step ended by shutdown: %s", e)
                    return
                log.warning("maintenance step failed (will retry): %s", e)
                time.sleep(0.1)
            except InvalidUsage as e:  # raced with a concurrent change; plan again
                log.debug("maintenance step refused: %s", e)
            except Exception:
                log.exception("maintenance step failed")
                time.sleep(1.0)

    def maintain_once(self, *, background: bool = False) -> bool:
        """Runs one round of compaction, GC and rollup. Returns True if it did anything.

        ``background``: a round of the maintenance thread, which skips compaction when
        ``Options.background_compaction`` is off (an explicit ``Client.maintain`` compacts).

        NB: serialized by a lock: the background thread and ``Client.maintain`` would otherwise
        plan the same merge twice, and the second would be refused (its parts are gone).
        """
        with self._maint_lock:
            self._round_started = time.monotonic()
            try:
                return self._maintain_round(background)
            finally:
                self._round_started = None

    def _metadata_beside(self) -> None:
        """Trims the metadata log while a maintenance round has been under way for
        :data:`METADATA_BESIDE_SECONDS` (a merge, which the round waits on, can take seconds to
        minutes): a round's trim comes after its merges, and waiting for them let the log kept
        grow by every commit the merge took (W12: merges of up to 3.4 s at a 30 s grace). No
        rollup: one written beside a merge carries every inline part pending meanwhile, which
        the round flushes only after it (W12 then wrote pieces of 10 MB). The engine's metadata
        lock serializes this trim with the round's rollup and trim."""
        while not self._maint_stop.wait(METADATA_BESIDE_SECONDS / 2):
            started = self._round_started
            if started is None or time.monotonic() - started < METADATA_BESIDE_SECONDS:
                continue
            if self._poisoned is not None:
                return
            try:
                self.ix.trim_beside()
            except ExternalError as e:
                log.warning("metadata trim beside a merge failed (will retry): %s", e)
            except Exception:
                log.exception("metadata trim beside a merge failed")

    def _maintain_round(self, background: bool) -> bool:
        # NB: the engine's round (its steps independent; it raises the first error after all
        # had their turn), then the named holds' desk, whatever the round raised.
        first: BaseException | None = None
        # NB: a background round looks at a budget of the collections a load marked (the
        # module docstring of persist.indexed.maintenance.pending); an explicit one at all
        self.ix.work.allow(pending.VISIT_BUDGET if background else None)
        try:
            try:
                did = self.ix.maintain_round(
                    lambda: self.published.state, self._commit_maintenance,
                    held=self.holds.frontier,
                    compaction=not background or self.ix.options.background_compaction,
                    budgeted=background, idle=self._queue.empty,
                    stop=self._maint_stop.is_set)
            except (ExternalError, InvalidUsage, Corruption) as e:
                first, did = e, False
            try:
                did = self._serve_holds() or did
            except (ExternalError, InvalidUsage) as e:
                first = first or e
        finally:
            self.ix.work.allow(None)
        # NB: collections a load marked are still to be looked at: the next round at once
        did = did or self.ix.work.behind
        if did:
            self._maint_wake.set()  # more may be ready (cascading merges)
        if first is not None:
            raise first
        return did

    def _commit_maintenance(self, ops: Sequence[Op], written_at: float | None) -> None:
        """A maintenance round's ops, committed through the queue (linearized like every
        command), waited for."""
        self.submit(cmd.Maintenance(tuple(ops), written_at=written_at)).result()

    def _serve_holds(self) -> bool:
        # NB: named holds: lapses the writer decides, requests other processes make.
        return self._holds_desk.round(self.ix.blob, lambda: self.published.state,
                                      self.submit, self.ix.lapsing)

    @property
    def maintaining(self) -> bool:
        """Whether a maintenance round is under way (the background's or ``Client.maintain``)."""
        return self._maint_lock.locked()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Holds the lock a maintenance round holds and the engine's metadata lock: meanwhile
        no round runs, so the GC deletes nothing (a restore un-retires blobs under it), and no
        rollup or trim runs beside one (a restore replays the log)."""
        with self._maint_lock, self.ix.metadata_lock():
            yield

    # -- the lock heartbeat --------------------------------------------------------------------

    def _heartbeat(self) -> None:
        assert self.lock is not None
        assert self.lease is not None
        interval = self.lock.lease_seconds / 3
        while not self._stopping.wait(interval):
            try:
                self.lock.heartbeat(self.lease)
                metrics.heartbeat(True)
            except Fenced as e:
                self._poison(e)
                return
            except PersistError as e:
                metrics.heartbeat(False)
                log.warning("lock heartbeat failed (will retry): %s", e)

    # -- stopping --------------------------------------------------------------------------------

    def stop(self, timeout: float | None = 30.0) -> None:
        """Ends maintenance (a round under way ends at its next step and commits what it
        wrote), then commits what is queued, fails what comes after, releases the lock.
        Idempotent.

        NB: maintenance ends first, while the loop still commits. Stopping the loop first
        refused the commit of a merge whose part was already written, and the blob was left
        for ``persist verify`` to call leaked after a clean stop (issue 27). A round checks
        the stop between merges and steps, so this waits for at most one merge.
        """
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self._maint_stop.set()
            self._maint_wake.set()
        me = threading.current_thread()
        for t in (self._maint_thread, self._meta_thread):
            if t is not None and t is not me:
                t.join(timeout)
        if self._maint_lock.acquire(timeout=-1 if timeout is None else timeout):
            self._maint_lock.release()  # an explicit round (Client.maintain) ended too
        # NB: after maintenance, which merges in it: no merge is left under way (unless the
        # joins above timed out: that merge then fails, and nothing of it is committed).
        self.ix.close()
        with self._stop_lock:
            if not self._stopping.is_set():
                self._queue.put(cmd.Stop())
                self._stopping.set()
        self._thread.join(timeout)
        if not self._thread.is_alive() and self._poisoned is None:
            # NB: every commit has ended (the loop drained the queue), and the lock is still
            # held: the rollup is of the final state, and no other writer's can follow it yet
            try:
                self.ix.rollup_at_stop()
            except Exception as e:
                # NB: any error: the rollup only spares the next open a replay, and nothing may
                # keep the stop from releasing the lock. A client dropped at interpreter exit
                # is stopped by its finalizer, when no thread can start any more (a rollup of
                # several pieces raised RuntimeError there).
                log.warning("rolling up at the stop failed (the next open replays the log "
                            "instead): %s: %s", type(e).__name__, e)
        for t in (self._maint_thread, self._meta_thread, self._hb_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout)
        self.published.close(RuntimeShutdown("the runtime was stopped"))
        if self.lock is not None and self.lease is not None and self._poisoned is None:
            try:
                self.lock.release(self.lease)
            except PersistError as e:
                log.warning("releasing the writer lock failed: %s", e)
        if self.lock is not None:
            self.lock.close()
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        """True once the runtime thread has ended (stopped, or stopped itself)."""
        return self._stopped.is_set()

    @property
    def poisoned(self) -> BaseException | None:
        """The error that made the runtime fail-stop, or None while it is healthy."""
        return self._poisoned

    def gauges(self) -> metrics.WriterGauges | None:
        """The scrape-time gauges of this writer, from its newest published state
        (:class:`persist.metrics.GaugeSource`); None once stopped."""
        if self.stopped:
            return None
        state = self.published.state
        policy = self.ix.options.compaction
        return metrics.WriterGauges(
            writer=self.ix.writer,
            retired_blobs=len(state.retired),
            collections=tuple(
                metrics.CollectionGauges(collection=name, since=effective_since(c),
                                         upper=c.upper, parts=len(c.parts),
                                         backlog=len(compact.plan(c, policy)))
                for name, c in state.collections.items()
            ),
        )

    def describe(self) -> dict[str, Any]:
        """Counters of what the runtime did (commits, groups, maintenance), for diagnostics."""
        return dict(self.stats)


class _CommandQueue:
    """The runtime's queue of commands: FIFO, a put never blocks, and taking is separate from
    waiting, so that commands leave it only under the runtime's turn (the module docstring)."""

    def __init__(self) -> None:
        self._items: collections.deque[cmd.Command] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        #: Counts puts and kicks: what ``wait_past`` waits to change.
        self._events = 0

    def put(self, command: cmd.Command) -> None:
        with self._ready:
            self._items.append(command)
            self._events += 1
            self._ready.notify()

    def kick(self) -> None:
        """Wakes a thread in ``wait_past`` (commands were left for it)."""
        with self._ready:
            self._events += 1
            self._ready.notify()

    def wait(self) -> int:
        """Blocks until a command is queued; returns the count of events seen then."""
        with self._ready:
            self._ready.wait_for(lambda: bool(self._items))
            return self._events

    def wait_for_more(self, timeout: float) -> bool:
        """Blocks until a command is queued or ``timeout`` seconds passed (False)."""
        with self._ready:
            return self._ready.wait_for(lambda: bool(self._items), timeout)

    def wait_past(self, seen: int) -> None:
        """Blocks until a put or a kick after the ``seen`` count of events."""
        with self._ready:
            self._ready.wait_for(lambda: self._events != seen)

    def take(self, limit: int, *, only: type | None = None) -> list[cmd.Command]:
        """Up to ``limit`` commands from the head (with ``only``, stopping at the first that
        is not of that type)."""
        out: list[cmd.Command] = []
        with self._ready:
            items = self._items
            while items and len(out) < limit and (only is None or isinstance(items[0], only)):
                out.append(items.popleft())
        return out

    def empty(self) -> bool:
        return not self._items
