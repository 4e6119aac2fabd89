"""Commands sent to the runtime thread. Each carries the Future that reports its outcome.

The queue order *is* the linearization order: a command is enqueued before the call that made it
returns its future, so it is ordered before any call made after that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist.errors import InvalidUsage
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.format.columnar import Codec
from persist.indexed.format.meta import Op, PartMeta

if TYPE_CHECKING:
    from persist.indexed.engine import Txn


class PersistFuture(concurrent.futures.Future[Any]):
    """A ``concurrent.futures.Future`` that refuses to block an asyncio event loop.

    Calling ``result()`` on an unresolved future from inside a running loop would freeze the
    loop (and every task that could resolve the future): it raises instead. Await
    ``asyncio.wrap_future(f)`` or use ``persist.aio``.

    It also cannot be cancelled: the command is already in the runtime's queue, ordered before
    every later call, and it will be committed (or refused) whatever its caller does.
    ``cancel()`` returns False, as ``concurrent.futures`` does for a call already running.
    """

    def __init__(self) -> None:
        super().__init__()
        #: Set by the runtime for a write: called by a thread about to block on this future,
        #: it may run the write itself (``Runtime._help``; the runtime module's docstring).
        self.helper: Callable[[PersistFuture], None] | None = None

    def cancel(self) -> bool:
        """Always False: the command is ordered and will commit (or be refused) regardless."""
        # NB: asyncio.wrap_future cancels the wrapped future when the awaiting task is
        # cancelled (asyncio.wait_for's timeout, a TaskGroup failing). A cancelled future would
        # make the runtime's set_result raise InvalidStateError and stop the writer; and
        # "cancelled" would be a lie, since the write may still become durable.
        return False

    def result(self, timeout: float | None = None) -> Any:
        """As ``Future.result``; blocking on an unresolved future inside a running asyncio
        loop raises InvalidUsage instead of freezing the loop."""
        if not self.done():
            forbid_in_event_loop("Future.result()")
            helper = self.helper
            if helper is not None and timeout is None:
                helper(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """As ``Future.exception``, with the same event-loop guard as :meth:`result`."""
        if not self.done():
            forbid_in_event_loop("Future.exception()")
        return super().exception(timeout)


def forbid_in_event_loop(what: str) -> None:
    """Raises InvalidUsage, naming ``what``, if called from inside a running asyncio loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise InvalidUsage(
        f"{what} blocks and was called from inside a running asyncio event loop; "
        f"use persist.aio (or asyncio.wrap_future / asyncio.to_thread) instead"
    )


@dataclass(frozen=True, eq=False)
class Apply:
    """Writes, seals and compaction frontiers for any number of collections, all or nothing.

    ``parts`` are parts already encoded and stored by another process (a Spark task): they are
    added as they are, without rewriting their data. ``holds`` set (frontier) or release (None)
    durable read holds ``(collection, hold id, frontier)``. ``versions`` names the schema
    version each collection's written table was normalized to (a collection not named: its
    current version when staged).
    """

    writes: tuple[tuple[str, pa.Table], ...] = ()
    seals: tuple[tuple[str, int], ...] = ()
    sinces: tuple[tuple[str, int], ...] = ()
    parts: tuple[tuple[str, PartMeta], ...] = ()
    holds: tuple[tuple[str, str, int | None], ...] = ()
    versions: tuple[tuple[str, int], ...] = ()
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class Register:
    """Register collection ``name`` with these codecs, or check them if it exists."""

    name: str
    key: Codec
    value: Codec
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class EvolveSchema:
    """Evolve collection ``name``'s schema to these codecs (None: keep that column), if its
    current version is ``expect`` (None: whatever it is). Commits alone: what was queued
    before it commits first, what comes after in a later commit. Resolves to the new schema
    version."""

    name: str
    key: Codec | None
    value: Codec | None
    expect: int | None = None
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class Maintenance:
    """Ops computed off-thread by compaction or GC (ReplaceParts, Forget, SetHold).

    ``written_at``: ``time.monotonic()`` before the data blobs the ops reference were written,
    if any (the commit deadline, ``Options.commit_deadline_seconds``, runs from then).
    """

    ops: tuple[Op, ...]
    written_at: float | None = None
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class Plan:
    """Ops that ``plan`` decides against the working copy when the command is staged (a fork,
    a change to a named hold, a lapse): decided where they are checked, so what they decide on
    is what they commit on. Staged all or nothing; ``plan`` may raise to refuse (the command
    alone fails). ``written_at``: as :class:`Maintenance`'s (a fork across locations counts
    the commit deadline from before its pins)."""

    plan: Callable[[Txn], Sequence[Op]]
    written_at: float | None = None
    #: Seconds from ``written_at`` to commit within, if shorter than the commit deadline (a
    #: fork across locations: the bound its pins promised the source).
    within: float | None = None
    #: Commit alone, like a schema evolution (a fork: its ``Register`` reads what the ops
    #: staged before it left, and a commit lists registrations first).
    alone: bool = False
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class Restore:
    """Put the collections back as ``op`` has them (an undo). Commits alone, like a schema
    evolution: what was queued before it commits first, what comes after is staged on the
    restored state."""

    op: meta.Restore
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class SetOptions:
    """Replaces the engine's options (``Client.set_options``). Ordered like any command:
    everything queued before it commits under the old options, everything after under the new."""

    options: Options
    future: PersistFuture = field(default_factory=PersistFuture)


@dataclass(frozen=True, eq=False)
class Stop:
    """Commit what was queued before, refuse what comes after, and end the runtime thread."""

    future: PersistFuture = field(default_factory=PersistFuture)


Command = Apply | Register | EvolveSchema | Maintenance | Plan | Restore | SetOptions | Stop
