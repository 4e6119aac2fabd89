"""The thread-safe, synchronous client: ``persist.open`` and the collection handles.

Writes return ``concurrent.futures.Future``s resolved once the change is durable; reads run in
the caller's thread against the newest published state and never wait behind a commit.
"""

from __future__ import annotations

import atexit
import collections
import datetime
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from persist import layout
from persist.errors import (
    Corruption,
    Fenced,
    InvalidUsage,
    PartsChanged,
    ReadOnly,
    RuntimeShutdown,
    SchemaMismatch,
    Timeout,
)
from persist.indexed.engine import Indexed, Options, Txn, check_types
from persist.indexed.format import columnar, evolve
from persist.indexed.format.columnar import Codec
from persist.indexed.format.evolve import Types
from persist.indexed.format.meta import CollectionMeta, PartMeta, ReplaceParts, State
from persist.indexed.format.transfer import StagedPart, Token, check_inline
from persist.indexed.maintenance import restore as restoring
from persist.indexed.read.filter import Filter, col
from persist.indexed.read.prune import PruneCounts
from persist.indexed.read.scan import Address, CollectionInfo, SnapshotRead, read_task, retrying
from persist.indexed.state import history, holds, refs
from persist.indexed.state import lease as staging
from persist.indexed.state.transitions import check_time, collection, effective_since
from persist.runtime import branches
from persist.runtime import commands as cmd
from persist.runtime.commands import PersistFuture, forbid_in_event_loop
from persist.runtime.notify import Notifier
from persist.runtime.replica import Follower
from persist.runtime.runtime import LocalHolds, Published, Runtime

_live: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:  # pragma: no cover - exercised at interpreter exit
    for c in list(_live):
        c.stop()


class Client:
    """A handle on one open location. Thread-safe; also a context manager."""

    def __init__(
        self,
        url: str,
        ix: Indexed,
        *,
        runtime: Runtime | None = None,
        follower: Follower | None = None,
        notifier: Notifier | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        #: Where the location is, as other processes open it (distributed reads and writes).
        self.address = Address.of(url, storage_options)
        # NB: token applies read the last seq and then apply; one at a time, each until its
        # commit resolved, so none decides on a record another is about to replace.
        self._token_lock = threading.Lock()
        self._ix = ix
        self._runtime = runtime
        self._follower = follower
        self._notifier = notifier
        published = runtime.published if runtime else follower.published if follower else None
        assert published is not None
        self._published: Published = published
        # NB: the finalizer holds the runtime, not the client, so dropping the last reference to
        # the client (and its handles) stops the runtime and releases the lock.
        self._finalizer = weakref.finalize(self, _shutdown, runtime, follower, notifier)
        _live.add(self)

    # -- properties ----------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """True for a replica (opened with ``read_only``): it holds no lock and cannot write."""
        return self._runtime is None

    @property
    def state(self) -> State:
        """The newest state this client knows (committed by it, or followed as a replica)."""
        return self._published.state

    @property
    def collections(self) -> list[str]:
        """The names of the collections in the newest state this client has seen, sorted."""
        return sorted(self.state.collections)

    @property
    def lock_lost(self) -> Fenced | None:
        """Set if this writer's lock was taken over (every later command fails)."""
        return self._runtime.lock_lost if self._runtime else None

    @property
    def stats(self) -> dict[str, Any]:
        """Counters: the writer's commits (and push notifier), or a replica's polls, storage
        requests and push subscription."""
        if self._runtime is not None:
            out = self._runtime.describe()
            if self._notifier is not None:
                out["notify"] = self._notifier.describe()
            return out
        return self._follower.describe() if self._follower is not None else {}

    # -- collections -------------------------------------------------------------------------

    def create_or_load(
        self, name: str, *, key_type: Any, value_type: Any
    ) -> tuple[WriteHandle, ReadHandle]:
        """Registers collection ``name`` with its types (or loads it, checking them).

        ``key_type``/``value_type`` are pyarrow types (string, binary, int64, float64, a
        struct, ...), a ``msgspec.Struct`` subclass whose fields map to Arrow (stored as that
        struct, read back as instances), or ``persist.msgpack(T)`` (opaque msgpack of class
        ``T``, by choice). A Struct opens a collection of the same structure whatever its
        class is named; the handles write and decode with the class given here.

        An evolved collection (:meth:`evolve_schema`) opens with the types of any of its schema
        versions: the handles then read and write as that version (``schema_version``), every
        part migrated to it (see :mod:`persist.indexed.format.evolve`).

        Raises:
            SchemaMismatch: a type persist cannot store (naming the field and the fix), or it
                exists with other types (none of its schema versions': naming the fields that
                differ).
            UnknownCollection: on a replica, when the writer has not created it.
        """
        if not isinstance(name, str) or not name:
            raise InvalidUsage(f"a collection name must be a non-empty str, not {name!r}")
        k, v = Codec.of(key_type, "key"), Codec.of(value_type, "value")
        if self._runtime is not None:
            forbid_in_event_loop("create_or_load()")
            self._runtime.submit(cmd.Register(name, k, v)).result()
        elif name not in self.state.collections:
            self._sync()
        sid = check_types(collection(self.state.collections, name), k, v)
        return WriteHandle(self, name, k, v, sid), ReadHandle(self, name, k, v, sid)

    def evolve_schema(self, name: str, *, key_type: Any = None, value_type: Any = None,
                      expect_version: int | None = None) -> PersistFuture:
        """Evolves collection ``name``'s schema to ``key_type``/``value_type`` (None: keep that
        one), atomically, without rewriting any data.

        Allowed (at any depth): adding a nullable field, dropping a field, making a field
        nullable, widening int8->16->32->64 (uint likewise), float32->float64,
        string->large_string, binary->large_binary, list->large_list, and a decimal's
        precision up with the same scale (``persist.indexed.format.records.evolution_problems``).
        Linearized like a write: what was submitted before commits under the old schema, what
        comes after under the new one. Handles keep the version they were opened with; open
        the collection again with the new types to read and write as the new version.

        Args:
            key_type, value_type: as for :meth:`create_or_load`.
            expect_version: compare-and-set: evolve only if this is still the current version.

        Returns:
            A future resolved with the new schema version once it is durable (the current
            version, with nothing committed, if the types are already the current ones). It
            fails with SchemaMismatch (nothing changed) for a change that is not allowed
            (naming each field and why) or a version other than ``expect_version``, and with
            UnknownCollection for a name not registered.

        Raises:
            ReadOnly: a replica.
            SchemaMismatch: a type persist does not store.
            InvalidUsage: ``expect_version`` is not a version number.
        """
        runtime = self._writer()
        if not isinstance(name, str) or not name:
            raise InvalidUsage(f"a collection name must be a non-empty str, not {name!r}")
        if expect_version is not None and (isinstance(expect_version, bool) or not isinstance(
                expect_version, int) or expect_version < 0):
            raise InvalidUsage(f"expect_version must be a schema version (an int >= 0) or "
                               f"None, not {expect_version!r}")
        k = None if key_type is None else Codec.of(key_type, "key")
        v = None if value_type is None else Codec.of(value_type, "value")
        return runtime.submit(cmd.EvolveSchema(name, k, v, expect_version))

    def apply(
        self,
        *,
        writes: Mapping[str, Any] | None = None,
        seals: Mapping[str, int] | None = None,
        sinces: Mapping[str, int] | None = None,
        parts: Mapping[str, Sequence[StagedPart | PartMeta]] | None = None,
        holds: Mapping[str, Mapping[str, int | None]] | None = None,
        token: Token | None = None,
    ) -> PersistFuture:
        """Writes, seals and advances since for several collections atomically: all or nothing.

        Args:
            writes: updates per collection (as accepted by :meth:`WriteHandle.write`).
            seals: the new ``upper`` per collection.
            sinces: the new ``since`` per collection.
            parts: parts per collection that other processes staged in this location's blob
                store (``persist.distributed.Stager.stage``), added as they are: a Spark job's
                tasks stage their data this way and the driver commits it with one apply.
                Each must be bound to this location, the collection and the types of one of
                its schema versions; an inline one must hold what its metadata says (checked
                before anything is submitted). Every row must be at a time >= the
                collection's upper.
            holds: durable read holds per collection, ``{hold id: frontier}``; a frontier of
                None releases the hold. See :meth:`WriteHandle.hold`.
            token: apply at most once per token (``persist.distributed.Token``): if a seq at
                or above ``token.seq`` was already applied under ``token.id``, nothing is
                written and the future resolves to None (the caller discards its staged
                parts). Else the token is recorded in the same atomic commit (in
                :data:`TOKENS`). Token applies of one client run one at a time.

        Returns:
            A future resolved (with the commit's sequence number; None: a token already
            applied) once durable.

        Raises:
            InvalidUsage: a part that is neither inline nor under ``data/``, or staged for
                another collection or at another location; a malformed token (the future
                fails instead for anything decided against the state: times below upper, ...).
            SchemaMismatch: a part staged with types none of the collection's versions has.
            Corruption: an inline part that is not what its metadata says (a staged part's
                bytes are verified when they are decoded).
            UnknownCollection: parts for a collection that does not exist.
        """
        if token is None:
            return self._apply(writes=writes, seals=seals, sinces=sinces, parts=parts,
                               holds=holds)
        if not isinstance(token, Token):
            raise InvalidUsage(f"token must be a persist.distributed.Token, not "
                               f"{type(token).__name__}")
        for name in TOKENS.names:
            if name in (writes or {}) or name in (seals or {}) or name in (sinces or {}):
                raise InvalidUsage(f"collection {name!r} records tokens: apply cannot also "
                                   f"write, seal or compact it")
        self._writer()
        self._token_lock.acquire()
        try:
            last = TOKENS.get(self, token.id)
            if last is not None and token.seq <= last:
                done = PersistFuture()
                done.set_result(None)
                self._token_lock.release()
                return done
            book = TOKENS.put(self, token.id, token.seq, last)
            fut = self._apply(writes={**(writes or {}), **book["writes"]},
                              seals={**(seals or {}), **book["seals"]},
                              sinces={**(sinces or {}), **book["sinces"]}, parts=parts,
                              holds=holds)
        except BaseException:
            self._token_lock.release()
            raise
        fut.add_done_callback(lambda _: self._token_lock.release())
        return fut

    def token(self, token_id: str) -> int | None:
        """The last seq applied under token ``token_id`` (None: never), as of this client's
        newest state.

        Raises:
            Corruption: the token collection holds several seqs for ``token_id``.
        """
        last: int | None = TOKENS.get(self, token_id)
        return last

    # -- forks, tags, named holds, restore -------------------------------------------------------

    def fork(self, name: str, *, into: str, as_of: int | None = None) -> PersistFuture:
        """Forks collection ``name`` as of ``as_of`` (default: its latest sealed time) into a
        new writable collection ``into``, in one metadata commit and without copying data:
        its parts reference the blobs of ``name``'s (rows past ``as_of`` hidden), so its
        contents as of every time in ``[since, as_of]`` are ``name``'s, and its upper is
        ``as_of + 1``. The two then evolve independently; a shared blob is deleted only once
        neither reads it (DESIGN.md §9). For a fork into another location of the same store
        see :func:`persist.fork`.

        Returns:
            A future resolved with the commit's seq; it fails with ``InvalidUsage`` if
            ``into`` exists or ``as_of`` is not in ``[since, upper)``, ``UnknownCollection``
            if ``name`` does not exist (nothing changes).

        Raises:
            ReadOnly: a replica. InvalidUsage: a name that is not a non-empty string.
        """
        return self._writer().submit(cmd.Plan(branches.fork_plan(name, into, as_of), alone=True))

    def register_fork(self, planned: CollectionMeta, *, into: str, pinned_at: float,
                      within: float | None = None) -> PersistFuture:
        """Registers ``planned``, a fork of another location's collection whose blobs it
        references (:func:`persist.fork` plans it and pins those blobs first), as ``into``.
        It commits within this writer's commit deadline of ``pinned_at`` (a
        ``time.monotonic()`` taken before the pins were made), and within ``within`` seconds
        of it if that is shorter (the bound the pins recorded: this writer's options may have
        changed since), or not at all: the source's GC releases an unread pin only after
        twice that bound.

        Returns:
            A future resolved with the commit's seq; it fails with ``CommitDeadline`` (too
            late, nothing committed), or ``InvalidUsage`` if ``into`` exists.
        """
        if within is not None and not (isinstance(within, (int, float)) and within >= 0):
            raise InvalidUsage(f"within must be a number of seconds >= 0, not {within!r}")
        return self._writer().submit(cmd.Plan(branches.adopt_plan(planned, into),
                                              written_at=pinned_at, within=within,
                                              alone=True))

    def tag(self, name: str, tag: str, *, as_of: int) -> PersistFuture:
        """Tags time ``as_of`` of collection ``name``: reads as of it stay definite for as
        long as the tag exists, whatever ``allow_compaction`` says (a tag is a named hold with
        no lease: compaction forwards no time past it). Read it with
        ``read.snapshot(read.tag(tag))``; delete it with :meth:`untag`.

        Returns:
            A future resolved with the commit's seq; it fails with ``InvalidUsage`` if
            ``as_of`` is below since or not below upper, or ``tag`` names another tag or
            hold; ``UnknownCollection`` if ``name`` does not exist (nothing changes).
        """
        return self._writer().submit(cmd.Plan(branches.hold_plan(name, "tag", tag, as_of)))

    def untag(self, name: str, tag: str) -> PersistFuture:
        """Deletes tag ``tag`` of ``name`` (its history may then be compacted). The future
        fails with ``UnknownHold`` if there is no such tag."""
        return self._writer().submit(cmd.Plan(branches.hold_plan(name, "untag", tag)))

    def hold(self, name: str, hold_id: str, at: int, *,
             lease: datetime.timedelta | float) -> branches.HoldHandle:
        """Takes (or takes again) the named consumer hold ``hold_id`` on ``name`` at time
        ``at``, with ``lease`` (a ``timedelta`` or seconds), and waits until it is durable:
        from then on ``since`` never passes the hold while it lives. The consumer advances it
        as it reads (:meth:`HoldHandle.advance`, which renews it) or renews it
        (:meth:`HoldHandle.renew`) at least once per lease; if it does not, the writer
        commits its lapse, and its next advance fails with ``HoldLapsed``.

        Raises:
            InvalidUsage: ``at`` is below the collection's since, ``lease`` is not positive,
                ``hold_id`` names a tag.
            UnknownCollection: no collection ``name``.
            ReadOnly: a replica (a consumer in another process uses
                ``persist.distributed.ConsumerHold``).
        """
        lease_ms = holds.lease_ms_of(lease)
        forbid_in_event_loop("hold()")
        runtime = self._writer()
        runtime.submit(cmd.Plan(branches.hold_plan(name, "take", hold_id, at,
                                                   lease_ms=lease_ms))).result()
        return branches.HoldHandle(runtime.submit,
                                   lambda: collection(self.state.collections, name), name,
                                   hold_id)

    def holds(self, name: str | None = None) -> list[holds.HoldInfo]:
        """Every hold (tags, consumer holds, plain read holds; lapsed ones too) of collection
        ``name``, or of every collection, as of this client's newest state.

        Raises:
            UnknownCollection: no collection ``name``.
        """
        state = self.state
        names = sorted(state.collections) if name is None else [name]
        return [h for n in names for h in holds.listing(collection(state.collections, n))]

    def restore(self, seq: int) -> restoring.RestorePlan:
        """Puts the location's collections back as they were at commit ``seq``, in one new
        commit (an undo: **frontiers may move backwards**, collections registered since then
        disappear, holds and tags return to what they were; listeners of a rewound
        collection fail, streams must restart). Blobs only the current state reads are
        retired, those the restored one reads un-retired; the GC is paused meanwhile.

        Returns:
            The plan it carried out (what changed).

        Raises:
            InvalidUsage: ``seq`` is not restorable (its log was trimmed, or blobs it reads
                were deleted: the message says which), or not before the current seq.
            ReadOnly: a replica.
        """
        forbid_in_event_loop("restore()")
        runtime = self._writer()
        with runtime.exclusive():
            plan = restoring.plan(self._ix.blob, self.state, seq, url=self.url)
            if plan.op is None:
                raise InvalidUsage(f"cannot restore {self.url} to seq {seq}: "
                                   + "; ".join(plan.problems))
            runtime.submit(cmd.Restore(plan.op)).result()
        return plan

    def info(self, name: str) -> CollectionInfo:
        """Collection ``name`` as this client's newest state shows it, from which distributed
        reads are planned (see :mod:`persist.distributed`).

        Raises:
            UnknownCollection: no such collection.
        """
        state = self.state
        return CollectionInfo(self.address, collection(state.collections, name), state.seq)

    def replace_parts(self, name: str, removed: Sequence[str],
                      staged: Sequence[StagedPart], *, frontier: int,
                      collection_id: int) -> PersistFuture:
        """Commits a distributed compaction (:mod:`persist.distributed.compaction`): parts
        ``removed`` of collection ``name`` (id ``collection_id``) are replaced by ``staged``,
        their merge with times forwarded to ``frontier``, in one ``ReplaceParts`` op decided on
        the state it commits on.

        Returns:
            A future resolved with the commit's seq; it fails with ``PartsChanged`` (nothing
            committed) if a part of ``removed`` is no longer in the collection, the collection
            was replaced, or its effective since or an in-process read hold is now below
            ``frontier``; ``LeaseRevoked`` if a staging lease of ``staged`` was revoked.

        Raises:
            InvalidUsage, SchemaMismatch, UnknownCollection, Corruption: a staged part that
                is not this collection's (as ``apply(parts=...)``).
        """
        runtime = self._writer()
        state = self.state
        added = tuple(self._part_of(state, name, p) for p in staged)
        gone = tuple(removed)
        leases = {lid for p in added if p.blob_key is not None
                  and (lid := layout.lease_of(p.blob_key)) is not None}
        blob = self._ix.blob

        def plan(txn: Txn) -> tuple[ReplaceParts]:
            c = collection(txn.collections, name)
            have = {p.id for p in c.parts}
            missing = [r for r in gone if r not in have]
            hold = runtime.holds.frontier(name)
            why = (f"collection {name!r} was replaced" if c.id != collection_id
                   else f"parts it read are gone: {missing[:5]}" if missing
                   else f"its since {effective_since(c)} is below the frontier {frontier}"
                   if effective_since(c) < frontier
                   else f"a read in this process holds it at {hold}, below the frontier "
                        f"{frontier}" if hold is not None and hold < frontier else None)
            if why is not None:
                raise PartsChanged(f"a compaction of {name!r} planned against other parts was "
                                   f"not committed ({why}); plan it again")
            staging.check_committable(blob, leases)
            return (ReplaceParts(name=name, removed=gone, added=added, frontier=frontier),)

        return runtime.submit(cmd.Plan(plan, written_at=time.monotonic()))

    def landed(self, since_seq: int, staged: Sequence[StagedPart | PartMeta]) -> bool:
        """Whether a commit after ``since_seq`` (up to this client's state) added any of
        ``staged``: how a writer whose commit's outcome was unknown learns what happened,
        after reopening (which fences the old commit, so it can no longer land).

        NB: reads the log rather than the state: compaction may already have replaced them.

        Raises:
            ExternalError, Corruption: reading the log failed.
        """
        ids = {s.part.id if isinstance(s, StagedPart) else s.id for s in staged}
        return self._ix.added_since(since_seq, self.state.seq, ids)

    def _apply(
        self,
        *,
        writes: Mapping[str, Any] | None = None,
        seals: Mapping[str, int] | None = None,
        sinces: Mapping[str, int] | None = None,
        parts: Mapping[str, Sequence[StagedPart | PartMeta]] | None = None,
        holds: Mapping[str, Mapping[str, int | None]] | None = None,
        versions: Mapping[str, int] | None = None,
        codecs: Mapping[str, tuple[Codec, Codec]] | None = None,
    ) -> PersistFuture:
        """:meth:`apply`, with the writes of the collections ``versions`` names normalized to
        those schema versions (a handle's) instead of the current ones, and those ``codecs``
        names by those key and value codecs (a handle's: the classes it was opened with,
        which may be named otherwise than the ones registered)."""
        runtime = self._writer()
        state = self.state
        tables = []
        written: list[tuple[str, int]] = []
        for name, updates in (writes or {}).items():
            sid = (versions or {}).get(name)
            if sid is None:
                sid = evolve.version(collection(state.collections, name))
            tables.append((name, _normalize(state, name, updates, sid,
                                            (codecs or {}).get(name))))
            written.append((name, sid))
        staged = tuple((name, self._part_of(state, name, p)) for name, ps in (parts or {}).items()
                       for p in ps)
        return runtime.submit(cmd.Apply(
            writes=tuple(tables),
            versions=tuple(written),
            seals=tuple((seals or {}).items()),
            sinces=tuple((sinces or {}).items()),
            parts=staged,
            holds=tuple((name, hold_id, frontier) for name, hs in (holds or {}).items()
                        for hold_id, frontier in hs.items()),
        ))

    def _part_of(self, state: State, name: str, p: StagedPart | PartMeta) -> PartMeta:
        """The part ``p`` adds to collection ``name``, checked before anything is submitted: a
        staged part must be bound to this location, to ``name`` and to the types of one of its
        schema versions; an inline part must hold the rows its metadata describes.

        Raises:
            UnknownCollection: no collection ``name``.
            InvalidUsage: a part staged elsewhere, or stored outside ``data/``.
            SchemaMismatch: a part staged with other types.
            Corruption: an inline payload that is not what its metadata says.
        """
        if isinstance(p, StagedPart):
            part = p.check(name, self.url, state.collections)
            _check_staged_part(name, part)
            return part
        _check_staged_part(name, p)
        if p.inline is not None:
            c = collection(state.collections, name)
            check_inline(p, evolve.View.of(c, evolve.part_version(p)).schema)
        return p

    def _writer(self) -> Runtime:
        if self._runtime is None:
            raise ReadOnly(f"{self.url} was opened read_only=True; it cannot write")
        return self._runtime

    def _sync(self, *, full: bool = False, to_read: str | None = None) -> State:
        """Brings a replica's view up to date now (the writer's view is always current).

        ``full`` also checks for a log trimmed past the replica (after a part vanished).
        ``to_read``: what needs the newer state (a read that found a part of its state gone).

        Raises:
            RuntimeShutdown: (``to_read``) the client stopped, or its runtime went fail-stop:
                its state no longer follows the location's, so a read cannot plan again.
        """
        if to_read is not None and (self.stopped or (
                self._runtime is not None and self._runtime.poisoned is not None)):
            raise RuntimeShutdown(
                f"{to_read} of {self.url} found a part of its state gone (garbage collected "
                f"since): this client is stopped, and a stopped client reads only the last "
                f"state it had; reopen the location to read a newer one")
        if self._follower is not None:
            self._follower.sync(full=full)
        return self.state

    def _wait_for(self, pred: Callable[[State], bool], timeout: float | None) -> State | None:
        if self._follower is not None:
            self._follower.poke()
        return self._published.wait_for(pred, timeout)

    @property
    def options(self) -> Options:
        """The engine options in force (as last replaced by :meth:`set_options`)."""
        return self._ix.options

    def set_options(self, options: Options) -> PersistFuture:
        """Replaces this writer's engine options while it runs.

        Linearized like a write: every command submitted before this call commits under the
        old options, every command after it under the new ones. Options are
        behaviour-preserving, so no read or write can tell, except by cost. ``cache_bytes`` is
        fixed at open, and so is everything passed as ``storage_options`` (a file location's
        ``map_min_bytes``, for one): reopen to change those.

        Returns:
            A future resolved (with the sequence number in force) once the options apply.

        Raises:
            InvalidUsage: ``options`` is not a ``persist.Options`` (the future fails with it
                if ``cache_bytes`` differs).
            ReadOnly: a replica (its options only size its cache and its trust in the log).
        """
        runtime = self._writer()
        if not isinstance(options, Options):
            raise InvalidUsage(f"options must be a persist.Options, not {options!r}")
        return runtime.submit(cmd.SetOptions(options))

    def maintain(self) -> bool:
        """Runs one round of compaction, GC and rollup now and waits for it. They also run in
        the background after commits; this is for tests, demos and operators.

        Returns:
            True if anything was done.
        """
        forbid_in_event_loop("maintain()")
        return self._writer().maintain_once()

    # -- stopping ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Commits or fails everything queued, stops the threads, releases the lock.

        A writer that committed anything but its open's fence since its last rollup writes one
        of its final state first (one metadata write), so the next open replays no log.

        Idempotent. After it every write, and every wait for a newer state (``wait_for_upper``,
        ``snapshot(timeout=...)``, a listener past the last upper), fails with
        RuntimeShutdown. Reads answer from the last state the client had, deliberately:
        frontiers never move back, so its ``upper`` and ``since`` stay true, and a snapshot
        below that upper is definite, the same in every later state. A read that finds a part
        of that state collected since (by another writer's GC) raises RuntimeShutdown rather
        than plan again: a stopped client learns no newer state.
        """
        if self._finalizer.alive:
            self._finalizer()

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` ran (explicitly, by ``with``, or when the client was dropped)."""
        return not self._finalizer.alive

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writer"
        return f"<persist.Client {self.url} {mode} seq={self.state.seq}>"


def _shutdown(
    runtime: Runtime | None, follower: Follower | None, notifier: Notifier | None
) -> None:
    if runtime is not None:
        runtime.stop()
    if notifier is not None:  # after the runtime: its last commits are still pushed
        notifier.close()
    if follower is not None:
        follower.stop()


def _check_staged_part(name: str, p: PartMeta) -> None:
    if not isinstance(p, PartMeta):
        raise InvalidUsage(f"parts for {name!r} must be StagedParts or PartMeta records, not "
                           f"{type(p).__name__}")
    if (p.inline is None) == (p.blob_key is None):
        raise InvalidUsage(f"part {p.id} for {name!r} must be either inline or in a blob")
    if p.blob_key is not None and not p.blob_key.startswith(layout.DATA_PREFIX):
        raise InvalidUsage(f"part {p.id} for {name!r} is stored outside {layout.DATA_PREFIX!r}")
    if p.marks is not None:
        raise InvalidUsage(f"part {p.id} for {name!r} carries marks: only compaction's marks "
                           f"step writes a marked part")


def _normalize(state: State, name: str, updates: Any, schema_id: int | None = None,
               codecs: tuple[Codec, Codec] | None = None) -> pa.Table:
    c = collection(state.collections, name)
    types = Types.of(c, schema_id)
    from persist.indexed.format.columnar import from_updates

    key, value = codecs if codecs is not None else (types.key, types.value)
    return from_updates(updates, types.schema, key, value)


class LatestValues:
    """A bookkeeping collection that holds the latest value of each key (a str), written in
    the same commit as what it records.

    Each :meth:`put` writes the new value at the collection's upper, retracts the previous one
    at the same time, seals past it and moves since up to it: compaction then cancels every
    retraction against its addition, so the collection keeps one row per key however many
    puts it saw, and a read as of ``upper - 1`` finds the latest values.

    Idempotency tokens are kept in one (:data:`TOKENS`: token id -> last seq applied); the
    Spark sink records the streaming query behind each explicit sink id in another.
    """

    def __init__(self, name: str, value_type: pa.DataType, *,
                 legacy: Sequence[str] = ()) -> None:
        """A bookkeeping collection ``name`` of ``value_type`` values.

        Args:
            legacy: names an older persist gave the same collection: a location that has one
                keeps using it (its records stay where they are).
        """
        self.name = name
        self.value_type = value_type
        self.legacy = tuple(legacy)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the collection may have at a location: its own, then its legacy ones."""
        return (self.name, *self.legacy)

    def collection(self, state: State) -> str:
        """The collection's name at the location whose state is ``state``: the first legacy
        name the location has, else :attr:`name` (whether it exists yet or not)."""
        return next((n for n in self.legacy if n in state.collections), self.name)

    def get(self, client: Client, key: str) -> Any | None:
        """The latest value of ``key`` as of ``client``'s newest state (None: never put).

        Raises:
            SchemaMismatch: the location has a collection of that name with other types.
            Corruption: several live values for ``key`` (written other than by :meth:`put`).
        """
        name = self.collection(client.state)
        c = client.state.collections.get(name)
        if c is None or c.upper == 0:
            return None
        # NB: a handle on the existing collection, without create_or_load's trip through the
        # runtime thread (a streaming sink asks at every micro-batch).
        k, v = Codec.of(pa.string(), "key"), Codec.of(self.value_type, "value")
        read = ReadHandle(client, name, k, v, check_types(c, k, v))
        found = read.snapshot(c.upper - 1, filter=col("key") == key).to_arrow()
        if len(found) == 0:
            return None
        if len(found) > 1 or found.column("diff")[0].as_py() != 1:
            raise Corruption(name, f"{key!r} has {len(found)} values, with diffs "
                                   f"{found.column('diff').to_pylist()}: one, with diff 1, "
                                   f"was expected")
        return found.column("value")[0].as_py()

    def put(self, client: Client, key: str, value: Any,
            previous: Any | None) -> dict[str, dict[str, Any]]:
        """The ``Client.apply`` arguments (``writes``, ``seals`` and ``sinces``, each for this
        collection only) that make ``value`` the latest value of ``key``, to merge into the
        apply of what it records. Registers the collection first (a commit of its own) if the
        location has none.

        Args:
            previous: the current value of ``key``, as :meth:`get` returned it under the
                writer lock (nothing else changes it meanwhile); None: it has none. When it is
                ``value``, nothing needs writing and the mappings are empty.

        Raises:
            ReadOnly: ``client`` is a replica.
            SchemaMismatch: the location has a collection of that name with other types.
        """
        if previous is not None and previous == value:
            return {"writes": {}, "seals": {}, "sinces": {}}
        name = self.collection(client.state)
        if name not in client.state.collections:
            client.create_or_load(name, key_type=pa.string(), value_type=self.value_type)
        t = client.state.collections[name].upper
        rows: list[tuple[tuple[str, Any], int, int]] = [((key, value), t, 1)]
        if previous is not None:
            rows.append(((key, previous), t, -1))
        return {"writes": {name: rows}, "seals": {name: t + 1}, "sinces": {name: t}}


#: Where ``Client.apply(token=...)`` records idempotency tokens: token id -> the last seq
#: applied under it. ``__sink_progress`` is the name persist gave it before it was the
#: engine's (it was introduced by the Spark sink): a location that has it keeps using it.
TOKENS = LatestValues("__persist_tokens", pa.int64(), legacy=("__sink_progress",))


class _Handle:
    def __init__(self, client: Client, name: str, key: Codec, value: Codec,
                 schema_id: int = 0) -> None:
        self.client = client
        self.name = name
        self.key_codec = key
        self.value_codec = value
        self._schema_id = schema_id

    @property
    def schema_version(self) -> int:
        """The schema version this handle reads and writes as: the one whose types it was
        opened with (:meth:`Client.evolve_schema`; 0 for a collection never evolved)."""
        return self._schema_id

    def _meta(self) -> CollectionMeta:
        return collection(self.client.state.collections, self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} of {self.client.url}>"


class WriteHandle(_Handle):
    """Writes to one collection. Every method returns a future resolved once durable."""

    def write(self, updates: Any) -> PersistFuture:
        """Adds updates ``((key, value), time, diff)`` (an iterable of tuples, or an Arrow
        table/batch with columns key, value, time, diff). Every time must be >= upper.

        The returned future fails with InvalidUsage if a time is below upper when the write is
        applied (in call order), with RuntimeShutdown after stop.
        """
        return self.client._apply(writes={self.name: updates},
                                  versions={self.name: self._schema_id},
                                  codecs={self.name: (self.key_codec, self.value_codec)})

    def seal(self, upper: int) -> PersistFuture:
        """Advances ``upper`` to ``upper``: every time below it becomes final (never backwards)."""
        return self.client.apply(seals={self.name: upper})

    def append(self, updates: Any, upper: int) -> PersistFuture:
        """``write`` then ``seal`` as one atomic, durable step."""
        return self.client._apply(writes={self.name: updates}, seals={self.name: upper},
                                  versions={self.name: self._schema_id},
                                  codecs={self.name: (self.key_codec, self.value_codec)})

    def allow_compaction(self, since: int) -> PersistFuture:
        """Advances ``since``: reads as of times below it are no longer needed (never backwards,
        never beyond upper)."""
        return self.client.apply(sinces={self.name: since})

    def hold(self, hold_id: str, frontier: int | None) -> PersistFuture:
        """Sets (or, with ``frontier`` None, releases) the durable read hold ``hold_id``.

        While a hold at ``f`` exists, compaction never forwards times past ``f`` whatever
        ``since`` says, so reads as of ``f`` (and the exact updates after it) stay possible for
        a reader in another process, across restarts. Moving a hold forwards releases history;
        setting it below the collection's effective since fails (that history is gone).

        The returned future fails with InvalidUsage if ``frontier`` is below the effective since
        when the hold is applied, or if ``hold_id`` is a tag or a named consumer hold (those
        move through :meth:`Client.tag` and :meth:`Client.hold`'s handle; ``None`` releases
        any hold). A consumer that needs its hold kept only while it lives takes a named one
        with a lease (:meth:`Client.hold`).
        """
        return self.client.apply(holds={self.name: {hold_id: frontier}})

    @property
    def holds(self) -> dict[str, int]:
        """The durable read holds on this collection: hold id -> frontier."""
        return dict(self._meta().holds)


@dataclass(frozen=True)
class ListenUpdates:
    """Updates with times in ``[lower, upper)`` (original times), in one Arrow table."""

    batch: pa.Table
    lower: int
    upper: int


@dataclass(frozen=True)
class ListenProgress:
    """Every update at a time below ``upper`` has been delivered."""

    upper: int


ListenEvent = ListenUpdates | ListenProgress


class ReadHandle(_Handle):
    """Reads one collection: frontiers, definite snapshots, and a listen stream."""

    @property
    def since(self) -> int:
        """The effective since (``since`` held back by read holds): the lowest readable time."""
        return effective_since(self._meta())

    @property
    def upper(self) -> int:
        """Every time below this is sealed; reads as of ``[since, upper)`` are definite."""
        return self._meta().upper

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the collection's updates as this handle's schema version reads
        them: ``key, value, time, diff``."""
        return Types.of(self._meta(), self._schema_id).schema

    @property
    def tags(self) -> dict[str, int]:
        """The collection's tags: name -> the time each pins (see :meth:`Client.tag`)."""
        return holds.tags(self._meta())

    def tag(self, name: str) -> int:
        """The time tag ``name`` pins: ``read.snapshot(read.tag("q3-close"))`` reads as of it.

        Raises:
            UnknownHold: no such tag (the message lists the collection's tags).
        """
        return holds.tag_time(self._meta(), name)

    def history(self) -> list[history.Seal]:
        """The collection's recent seals, oldest first: each one's upper, commit time (the
        writer's clock), seq, and the rows added since the previous seal with the sums of
        their positive and negative diffs (see :mod:`persist.indexed.state.history`)."""
        return history.entries(self._meta())

    def as_of_timestamp(self, when: datetime.datetime | str | int | float) -> int:
        """The time to read as of to see the collection as it was at wall-clock ``when`` (an
        aware datetime, ISO-8601 with a zone, or epoch seconds): the last time sealed at or
        before it. ``read.snapshot(read.as_of_timestamp("2026-11-25T09:00Z"))``.

        Raises:
            InvalidUsage: not a timestamp; before the oldest recorded seal; or before since.
        """
        return history.as_of_at(self._meta(), when)

    def snapshot(self, as_of: int, *, timeout: float | None = None,
                 filter: Filter | None = None) -> ClientSnapshot:
        """The definite contents as of ``as_of`` (``since <= as_of < upper``).

        With ``timeout``, an ``as_of`` not yet sealed is waited for up to that many seconds.
        With ``filter`` (``persist.col("value.amount") > 10``, see
        :mod:`persist.indexed.read.filter`), exactly the rows of the unfiltered snapshot that match
        it; parts and record batches whose stats show they hold no match are not read.

        Raises:
            InvalidUsage: ``as_of`` is below since, or (without a timeout) not below upper;
                ``filter`` is not a filter.
            SchemaMismatch: ``filter`` names a field the collection lacks, or compares one with
                a literal that does not fit it (naming the field).
            Timeout: ``upper`` did not pass ``as_of`` within ``timeout``.
        """
        check_time("snapshot as_of", as_of)
        if timeout is not None and as_of >= self.upper:
            forbid_in_event_loop("snapshot(timeout=...)")
            got = self.client._wait_for(
                lambda s: collection(s.collections, self.name).upper > as_of, timeout
            )
            if got is None:
                raise Timeout(
                    f"{self.name!r} did not seal past {as_of} within {timeout}s "
                    f"(upper is {self.upper})"
                )
        return ClientSnapshot(self, as_of, filter=filter)

    def wait_for_upper(self, beyond: int, *, timeout: float | None = None) -> int:
        """Blocks until the collection's upper passes ``beyond``; returns the upper then.

        Args:
            beyond: a time; returns once ``upper > beyond`` (at once if it already is).
            timeout: seconds to wait at most; None waits as long as it takes.

        Raises:
            InvalidUsage: ``beyond`` is not a time, or called inside a running asyncio loop.
            Timeout: upper did not pass ``beyond`` within ``timeout``.
            RuntimeShutdown: the client stopped while waiting.
        """
        check_time("wait_for_upper beyond", beyond)
        if self.upper > beyond:
            return self.upper
        forbid_in_event_loop("wait_for_upper()")
        got = self.client._wait_for(
            lambda s: collection(s.collections, self.name).upper > beyond, timeout)
        if got is None:
            raise Timeout(f"{self.name!r} did not seal past {beyond} within {timeout}s "
                          f"(upper is {self.upper})")
        return collection(got.collections, self.name).upper

    def listen(self, as_of: int, *, poll: float = 1.0) -> Listener:
        """Every update at times > ``as_of``, in seal order, each followed by progress.

        Iterating blocks until the collection is sealed further; ``close()`` ends it.
        """
        return Listener(self, as_of, poll=poll)


class ClientSnapshot:
    """A snapshot planned on the client's newest state (:meth:`CollectionInfo.snapshot`) and
    read through the client's part cache (:class:`~persist.indexed.read.scan.SnapshotRead`):
    if GC removed a part mid-read, it plans again on a newer state and reads again.

    NB: retrying is sound because the answer is definite: every state with ``as_of`` in
    ``[since, upper)`` has the same consolidated contents. Parts read before stay in the
    client's cache (they are immutable), so a retry fetches only what compaction wrote since.
    """

    def __init__(self, read: ReadHandle, as_of: int, *, filter: Filter | None = None) -> None:
        client = read.client
        self._handle = read
        self.as_of = as_of
        self.filter = filter
        scan = client.info(read.name).snapshot(
            as_of, filter=filter, schema_version=read.schema_version,
            audit=client._ix.options.audit_pruning)
        self._read = SnapshotRead(scan, client._ix.reader,
                                  lambda: client._sync(full=True, to_read="a snapshot"))

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the snapshot's rows: ``key, value, time, diff``."""
        return self._read.schema

    @property
    def parts(self) -> tuple[PartMeta, ...]:
        """The parts (``PartMeta``) this snapshot reads, as of the state it was taken on."""
        return self._read.parts

    @property
    def pruning(self) -> PruneCounts | None:
        """With a filter: what this snapshot's reads fetched and what pruning skipped (over
        every read so far), else None."""
        return self._read.pruning

    def to_arrow(self) -> pa.Table:
        """Consolidated contents: one row per (key, value) with a nonzero diff, sorted."""
        forbid_in_event_loop("snapshot reads")
        return self._read.to_arrow()

    def to_python(self) -> list[tuple[tuple[Any, Any], int, int]]:
        """The consolidated contents as ``((key, value), as_of, diff)`` tuples, sorted, with
        keys and values decoded to Python objects (msgpack-coded ones to their class)."""
        forbid_in_event_loop("snapshot reads")
        # NB: decoded with the handle's classes, which may be named otherwise than the ones
        # registered (a Struct is identified by its structure)
        handle = self._handle
        return columnar.rows(self._read.to_arrow(), handle.key_codec, handle.value_codec,
                             self.as_of)

    def batches(self) -> Iterator[pa.Table]:
        """Raw updates part by part (times forwarded to as_of); bounded memory.

        Each part is fetched when reached; a part that GC removed in the meantime raises
        PartMissing (the raw rows of a newer state differ, so this cannot retry silently).
        """
        forbid_in_event_loop("snapshot reads")
        yield from self._read.batches()


class Listener(Iterator[ListenEvent]):
    """Iterator of ListenUpdates / ListenProgress for one collection."""

    def __init__(self, read: ReadHandle, as_of: int, *, poll: float) -> None:
        # NB: no attribute may be read by __del__ before it is set, and nothing is held until
        # the arguments are known good.
        self._holds: LocalHolds | None = None
        self._token: int | None = None
        check_time("listen as_of", as_of)
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not poll > 0:
            raise InvalidUsage(f"listen poll must be a positive number of seconds, not {poll!r}")
        self._read = read
        self._lo = as_of + 1
        self._poll = poll
        self._pending: collections.deque[ListenEvent] = collections.deque()
        runtime = read.client._runtime
        self._holds = runtime.holds if runtime is not None else None
        # NB: hold first, then check: compaction reads the holds after publishing the state it
        # plans on, so either it sees this hold or this check sees its newer since.
        self._token = self._holds.add(read.name, as_of) if self._holds is not None else None
        c = read._meta()
        #: A restore that rewinds the collection after this (an undo) ends the stream.
        self._restored = refs.restored_at(c)
        if as_of < effective_since(c):
            if self._holds is not None and self._token is not None:
                self._holds.remove(self._token)
            self._token = None
            raise InvalidUsage(
                f"listen on {read.name!r} as of {as_of} is below its since {effective_since(c)}"
            )
        self._closed = False
        self._failed: InvalidUsage | None = None
        self._lock = threading.Lock()

    @property
    def frontier(self) -> int:
        """Every update at a time below this has been delivered."""
        return self._lo

    def __iter__(self) -> Listener:
        return self

    def __next__(self) -> ListenEvent:
        forbid_in_event_loop("Listener iteration")
        while not self._pending:
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise StopIteration
            self._fill(self._poll)
        return self._pending.popleft()

    def poll(self, timeout: float) -> list[ListenEvent]:
        """Returns what arrived within ``timeout`` seconds (possibly nothing)."""
        if self._failed is not None:
            raise self._failed
        if not self._pending and not self._closed:
            self._fill(timeout)
        out = list(self._pending)
        self._pending.clear()
        return out

    def _fill(self, timeout: float) -> None:
        name, lo = self._read.name, self._lo
        try:
            state = self._read.client._wait_for(
                lambda s: collection(s.collections, name).upper > lo, timeout
            )
        except RuntimeShutdown:
            self.close()
            raise
        if state is None:
            return
        if refs.restored_at(collection(state.collections, name)) != self._restored:
            self._failed = InvalidUsage(
                f"listener on {name!r} cannot continue from {lo}: the location was restored to "
                f"an earlier state (an undo; its frontiers may have moved backwards), so the "
                f"history it was following was rewritten; restart it from a snapshot")
            self.close()
            raise self._failed
        client = self._read.client
        held = self._token is not None

        def read(newer: State | None) -> tuple[CollectionMeta, list[pa.Table]]:
            c = collection((newer or state).collections, name)
            scan = CollectionInfo(client.address, c).changes(
                lo, c.upper, schema_version=self._read.schema_version, held=held)
            # NB: the whole range is read before any of it is queued, so a retry on a newer
            # state (GC removed a part under us) never repeats an update.
            return c, list(read_task(client._ix.reader, scan.task()))

        try:
            c, tables = retrying(read, lambda: client._sync(full=True, to_read="a listener"))
        except SchemaMismatch as e:
            # An update that does not fit this listener's (older) schema version: it
            # cannot be delivered, and skipping it would be silent loss.
            self._failed = e
            self.close()
            raise
        except InvalidUsage as e:
            # A replica cannot hold back the writer's compaction: once since passes this
            # listener, the updates it still owes may have been merged; fail, never guess.
            since = effective_since(collection(client.state.collections, name))
            self._failed = InvalidUsage(
                f"listener on {name!r} cannot continue from {lo}: the writer advanced since "
                f"to {since}, past what this listener has delivered; restart it from a "
                f"snapshot at or after since"
            )
            self.close()
            raise self._failed from e
        hi = c.upper
        for t in tables:
            self._pending.append(ListenUpdates(t, lo, hi))
        self._pending.append(ListenProgress(hi))
        self._lo = hi
        if self._holds is not None and self._token is not None:
            self._holds.update(self._token, hi - 1)

    def close(self) -> None:
        """Ends the stream: iteration stops after what was already delivered, and the
        in-memory compaction hold is released. Idempotent."""
        with self._lock:
            self._closed = True
            if self._holds is not None and self._token is not None:
                self._holds.remove(self._token)
                self._token = None

    def __del__(self) -> None:
        holds, token = getattr(self, "_holds", None), getattr(self, "_token", None)
        if holds is not None and token is not None:
            holds.remove(token)
