"""The asyncio face: the same surface as the sync client, with awaitables and async iterators.

One core, one thin wrapper: every write is ``await asyncio.wrap_future(<sync future>)``, and
everything that may block (opening, registering, reading storage, waiting for a seal) runs in a
worker thread, so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from persist.indexed.format.meta import PartMeta
from persist.indexed.format.transfer import StagedPart, Token
from persist.indexed.maintenance.restore import RestorePlan
from persist.indexed.read.filter import Filter
from persist.indexed.state.history import Seal
from persist.indexed.state.holds import HoldInfo
from persist.runtime import branches
from persist.runtime import client as sync
from persist.runtime.client import ListenEvent


class AsyncClient:
    """The asyncio face of :class:`persist.runtime.client.Client`, wrapping ``sync``.

    Each method mirrors the sync one of the same name and raises what it raises; where they
    differ, the method says so. What this face lacks (``state``, ``stats``, ``lock_lost``,
    ``set_options``, ``maintain``, ``token``, ``landed``, ``info``: reads of the state in
    memory or calls made by the distributed plumbing, not by a service) is on ``sync``.
    Thread-safe, as the sync client is. An async context manager: leaving it awaits
    :meth:`stop`.
    """

    def __init__(self, client: sync.Client) -> None:
        self.sync = client

    @property
    def read_only(self) -> bool:
        """Mirrors ``Client.read_only``: True for a replica (opened ``read_only=True``)."""
        return self.sync.read_only

    @property
    def collections(self) -> list[str]:
        """Mirrors ``Client.collections``: the registered names, sorted, as of the newest state
        this client knows. Never blocks."""
        return self.sync.collections

    async def create_or_load(
        self, name: str, *, key_type: Any, value_type: Any
    ) -> tuple[AsyncWriteHandle, AsyncReadHandle]:
        """Mirrors ``Client.create_or_load``, run in a worker thread (it commits or syncs).

        Returns:
            The async write and read handles of collection ``name``.

        Raises:
            InvalidUsage: ``name`` is not a non-empty str.
            SchemaMismatch: it exists with other types, or a type is not storable.
            UnknownCollection: on a replica, when the writer has not created it.
            Fenced, RuntimeShutdown, ExternalError: registering failed.
        """
        w, r = await asyncio.to_thread(
            self.sync.create_or_load, name, key_type=key_type, value_type=value_type
        )
        return AsyncWriteHandle(w), AsyncReadHandle(r)

    async def apply(
        self,
        *,
        writes: Mapping[str, Any] | None = None,
        seals: Mapping[str, int] | None = None,
        sinces: Mapping[str, int] | None = None,
        parts: Mapping[str, Sequence[StagedPart | PartMeta]] | None = None,
        holds: Mapping[str, Mapping[str, int | None]] | None = None,
        token: Token | None = None,
    ) -> int | None:
        """Mirrors ``Client.apply``, every argument included.

        The apply is submitted from a worker thread (a token apply reads the token's record
        and waits for the token applies before it; staged parts are checked); only the commit
        is awaited. Cancelling the await does not cancel the commit: it is queued and may
        still land.

        Returns:
            The commit's sequence number, once durable; None if ``token`` was already applied
            (nothing was written).

        Raises:
            ReadOnly: a replica.
            UnknownCollection, SchemaMismatch, InvalidUsage: malformed or misdirected input,
                a part staged elsewhere or a malformed token (nothing submitted), or a change
                the state forbids (times below upper, ...).
            Corruption: an inline staged part that is not what its metadata says.
            LeaseRevoked: a staged part's lease was revoked (nothing committed).
            Fenced, RuntimeShutdown, ExternalError: the commit failed as the future reports.
        """
        future = await asyncio.to_thread(self.sync.apply, writes=writes, seals=seals,
                                         sinces=sinces, parts=parts, holds=holds, token=token)
        seq: int | None = await asyncio.wrap_future(future)
        return seq

    async def evolve_schema(self, name: str, *, key_type: Any = None, value_type: Any = None,
                            expect_version: int | None = None) -> int:
        """Mirrors ``Client.evolve_schema``: evolves ``name``'s schema without rewriting data,
        linearized like a write. Cancelling the await does not cancel the evolution.

        Returns:
            The new schema version, once durable (the current one if nothing changes).

        Raises:
            ReadOnly: a replica.
            SchemaMismatch: a change that is not allowed, an unsupported type, or a current
                version other than ``expect_version``; nothing changed.
            InvalidUsage: ``expect_version`` is not a version number.
            UnknownCollection: no such collection.
            Fenced, RuntimeShutdown, ExternalError: the commit failed as the future reports.
        """
        version: int = await asyncio.wrap_future(self.sync.evolve_schema(
            name, key_type=key_type, value_type=value_type, expect_version=expect_version))
        return version

    async def fork(self, name: str, *, into: str, as_of: int | None = None) -> int:
        """Mirrors ``Client.fork``: a new collection ``into`` whose contents up to ``as_of``
        are ``name``'s, in one commit without copying data.

        Returns:
            The commit's seq, once durable.

        Raises:
            ReadOnly: a replica. InvalidUsage: ``into`` exists, or ``as_of`` is not readable.
            UnknownCollection: no collection ``name``.
        """
        seq: int = await asyncio.wrap_future(self.sync.fork(name, into=into, as_of=as_of))
        return seq

    async def tag(self, name: str, tag: str, *, as_of: int) -> int:
        """Mirrors ``Client.tag``: pins time ``as_of`` of ``name`` under ``tag``; the seq.

        Raises:
            InvalidUsage: ``as_of`` is below since or not below upper, or ``tag`` names another
                hold. UnknownCollection: no collection ``name``. ReadOnly: a replica.
        """
        seq: int = await asyncio.wrap_future(self.sync.tag(name, tag, as_of=as_of))
        return seq

    async def untag(self, name: str, tag: str) -> int:
        """Mirrors ``Client.untag``: deletes tag ``tag`` of ``name``; the seq.

        Raises:
            UnknownHold: no such tag. ReadOnly: a replica.
        """
        seq: int = await asyncio.wrap_future(self.sync.untag(name, tag))
        return seq

    async def hold(self, name: str, hold_id: str, at: int, *,
                   lease: datetime.timedelta | float) -> AsyncHoldHandle:
        """Mirrors ``Client.hold``: takes (or takes again) the named consumer hold ``hold_id``
        on ``name`` at ``at`` with ``lease``, and returns its handle once the hold is durable.

        Raises:
            InvalidUsage: ``at`` is below since, ``lease`` is not positive, ``hold_id`` names a
                tag. UnknownCollection: no collection ``name``. ReadOnly: a replica.
        """
        handle = await asyncio.to_thread(self.sync.hold, name, hold_id, at, lease=lease)
        return AsyncHoldHandle(handle)

    def holds(self, name: str | None = None) -> list[HoldInfo]:
        """Mirrors ``Client.holds``: every hold of ``name`` (or of every collection) as of the
        newest state in memory (no storage read).

        Raises:
            UnknownCollection: no collection ``name``.
        """
        return self.sync.holds(name)

    async def restore(self, seq: int) -> RestorePlan:
        """Mirrors ``Client.restore`` (in a worker thread): the location's collections put
        back as they were at commit ``seq`` in one new commit; the plan it carried out.

        Raises:
            InvalidUsage: ``seq`` is not restorable (the message says why). ReadOnly: a replica.
        """
        return await asyncio.to_thread(self.sync.restore, seq)

    async def stop(self) -> None:
        """Mirrors ``Client.stop`` (commit or fail what is queued, stop, release the lock), run
        in a worker thread. Idempotent."""
        await asyncio.to_thread(self.sync.stop)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


class AsyncWriteHandle:
    """The asyncio face of ``WriteHandle`` (``sync``): each method awaits the sync one's future.

    Every method returns the commit's sequence number once durable and raises what the sync
    future fails with (InvalidUsage, Fenced, RuntimeShutdown, ExternalError; ReadOnly and
    SchemaMismatch before anything is submitted). Cancelling an await does not cancel the
    write.
    """

    def __init__(self, handle: sync.WriteHandle) -> None:
        self.sync = handle
        self.name = handle.name

    @property
    def schema_version(self) -> int:
        """Mirrors ``WriteHandle.schema_version``: the schema version it writes as."""
        return self.sync.schema_version

    async def write(self, updates: Any) -> int:
        """Mirrors ``WriteHandle.write``: adds updates at times >= upper."""
        seq: int = await asyncio.wrap_future(self.sync.write(updates))
        return seq

    async def seal(self, upper: int) -> int:
        """Mirrors ``WriteHandle.seal``: advances upper (never backwards)."""
        seq: int = await asyncio.wrap_future(self.sync.seal(upper))
        return seq

    async def append(self, updates: Any, upper: int) -> int:
        """Mirrors ``WriteHandle.append``: write then seal as one atomic step."""
        seq: int = await asyncio.wrap_future(self.sync.append(updates, upper))
        return seq

    async def allow_compaction(self, since: int) -> int:
        """Mirrors ``WriteHandle.allow_compaction``: advances since (never backwards, never
        beyond upper)."""
        seq: int = await asyncio.wrap_future(self.sync.allow_compaction(since))
        return seq

    async def hold(self, hold_id: str, frontier: int | None) -> int:
        """Mirrors ``WriteHandle.hold``: sets (``frontier`` None: releases) the durable read
        hold ``hold_id``."""
        seq: int = await asyncio.wrap_future(self.sync.hold(hold_id, frontier))
        return seq

    @property
    def holds(self) -> dict[str, int]:
        """Mirrors ``WriteHandle.holds``: the durable read holds, hold id -> frontier."""
        return self.sync.holds


class AsyncHoldHandle:
    """The asyncio face of a consumer's named hold (``Client.hold``'s ``HoldHandle``,
    ``sync``): advanced and renewed by the consumer, released when done. Each method awaits
    the sync one's future and raises what it fails with (``HoldLapsed`` once the lease
    lapsed or the hold was released, ``InvalidUsage`` for an advance backwards).
    """

    def __init__(self, handle: branches.HoldHandle) -> None:
        self.sync = handle
        self.collection = handle.collection
        self.name = handle.name

    @property
    def info(self) -> HoldInfo:
        """Mirrors ``HoldHandle.info``: the hold as the newest state in memory shows it."""
        return self.sync.info

    @property
    def frontier(self) -> int:
        """Mirrors ``HoldHandle.frontier``: the time it holds at."""
        return self.sync.frontier

    @property
    def lapsed(self) -> bool:
        """Mirrors ``HoldHandle.lapsed``: True once its lapse (or release) is committed."""
        return self.sync.lapsed

    async def advance(self, frontier: int) -> int:
        """Mirrors ``HoldHandle.advance``: moves the hold to ``frontier`` and renews its
        lease; the commit's seq."""
        seq: int = await asyncio.wrap_future(self.sync.advance(frontier))
        return seq

    async def renew(self) -> int:
        """Mirrors ``HoldHandle.renew``: renews the lease where the hold is."""
        seq: int = await asyncio.wrap_future(self.sync.renew())
        return seq

    async def release(self) -> int | None:
        """Mirrors ``HoldHandle.release``: releases the hold (idempotent)."""
        seq: int | None = await asyncio.wrap_future(self.sync.release())
        return seq

    def __repr__(self) -> str:
        return f"<AsyncHoldHandle {self.name!r} on {self.collection!r}>"


class AsyncReadHandle:
    """The asyncio face of ``ReadHandle`` (``sync``): frontiers, snapshots and listen.

    Storage reads and waits run in worker threads. ``schema`` is only on ``sync``.
    """

    def __init__(self, handle: sync.ReadHandle) -> None:
        self.sync = handle
        self.name = handle.name

    @property
    def schema_version(self) -> int:
        """Mirrors ``ReadHandle.schema_version``: the schema version it reads as."""
        return self.sync.schema_version

    @property
    def since(self) -> int:
        """Mirrors ``ReadHandle.since``: the effective since (held back by read holds)."""
        return self.sync.since

    @property
    def upper(self) -> int:
        """Mirrors ``ReadHandle.upper``, as of the newest state this client knows."""
        return self.sync.upper

    @property
    def tags(self) -> dict[str, int]:
        """Mirrors ``ReadHandle.tags``: tag name -> the time it pins."""
        return self.sync.tags

    def tag(self, name: str) -> int:
        """Mirrors ``ReadHandle.tag``: the time tag ``name`` pins.

        Raises:
            UnknownHold: no such tag.
        """
        return self.sync.tag(name)

    def history(self) -> list[Seal]:
        """Mirrors ``ReadHandle.history``: the recent seals (from the state in memory)."""
        return self.sync.history()

    def as_of_timestamp(self, when: datetime.datetime | str | int | float) -> int:
        """Mirrors ``ReadHandle.as_of_timestamp``: the time to read as of at ``when``.

        Raises:
            InvalidUsage: not a timestamp; before the oldest recorded seal; or before since.
        """
        return self.sync.as_of_timestamp(when)

    def snapshot(self, as_of: int, *, filter: Filter | None = None) -> AsyncSnapshot:
        """Mirrors ``ReadHandle.snapshot`` (without ``timeout``; see :meth:`wait_for_upper`):
        checked at the call, like the sync one; awaiting its methods reads in a worker thread.
        ``filter`` keeps exactly the matching rows (``ReadHandle.snapshot``).

        Raises:
            InvalidUsage: ``as_of`` is not a time or lies outside ``[since, upper)``, or
                ``filter`` is not a filter.
            SchemaMismatch: ``filter`` does not fit the collection's types (naming the field).
        """
        return AsyncSnapshot(self.sync.snapshot(as_of, filter=filter))

    async def wait_for_upper(self, beyond: int, timeout: float | None = None) -> int:
        """Mirrors ``ReadHandle.wait_for_upper`` (waits in a worker thread): returns the upper
        once it passes ``beyond``; with ``timeout`` None it waits as long as it takes.

        Raises:
            InvalidUsage: ``beyond`` is not a time.
            Timeout: upper did not pass ``beyond`` within ``timeout``.
            RuntimeShutdown: the client stopped while waiting.
        """
        upper: int = await asyncio.to_thread(self.sync.wait_for_upper, beyond, timeout=timeout)
        return upper

    async def listen(self, as_of: int, *, poll: float = 0.5) -> AsyncIterator[ListenEvent]:
        """Mirrors ``ReadHandle.listen`` as an async iterator; ``poll`` defaults to 0.5 s.

        The listener is created at the first ``__anext__`` (so InvalidUsage for ``as_of``
        below since surfaces there, not at the call); each wait of up to ``poll`` seconds runs
        in a worker thread. ``aclose()`` (or the generator's finalization; a ``break`` alone
        does not close it) closes the listener and releases its hold.

        Raises:
            InvalidUsage: ``as_of`` is below since, or since passed what was delivered.
            RuntimeShutdown: the client stopped.
        """
        listener = self.sync.listen(as_of, poll=poll)
        try:
            while True:
                for event in await asyncio.to_thread(listener.poll, poll):
                    yield event
        finally:
            listener.close()


class AsyncSnapshot:
    """A ``ClientSnapshot`` (taken, and checked, when created) read in worker threads.

    Raises (on each await):
        PartMissing: GC removed parts on every retry.
    """

    def __init__(self, snapshot: sync.ClientSnapshot) -> None:
        """Wraps ``snapshot``; reading happens on await."""
        self.sync = snapshot
        self.as_of = snapshot.as_of

    async def to_arrow(self) -> pa.Table:
        """Mirrors ``ClientSnapshot.to_arrow``: consolidated contents, sorted."""
        table: pa.Table = await asyncio.to_thread(self.sync.to_arrow)
        return table

    async def to_python(self) -> list[tuple[tuple[Any, Any], int, int]]:
        """Mirrors ``ClientSnapshot.to_python``: ``((key, value), as_of, diff)`` tuples."""
        rows: list[tuple[tuple[Any, Any], int, int]] = await asyncio.to_thread(
            self.sync.to_python)
        return rows
