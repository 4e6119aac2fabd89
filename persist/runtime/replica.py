"""Read-only replicas: a view of a location that follows its writer, and can never affect it.

A replica holds only the read half of the blob store (:class:`~persist.blob.base.BlobRead`): it
cannot write, take the writer lock, compact or delete anything, by construction. Its
:class:`Follower` thread reads the metadata log (``Machine.refresh``: one GET per new commit
plus one for the key that ends the chain) and publishes every new state, so ``upper``/``since``
advance, snapshots see new data and listeners wake.

When to poll:

* Polling with backoff always works, on any store and across machines: after a poll that found
  a commit the next comes ``min_poll`` later, then the interval grows by half (``backoff``)
  up to ``max_poll``.
* Push (``notify=True``, see :mod:`persist.runtime.notify`): while subscribed to the current
  writer's notifier, every push makes the follower poll at once and the polls in between become
  a slow safety net (``push_poll``). A push is only a hint; every state still comes from the log.
* A reader that waits (a listener, ``snapshot(timeout=)``) wakes the follower for one poll
  (unless push is live: then the push will say when).

Log GC: the writer trims log entries once a newer rollup is ``gc_grace`` old, so "the next log
key is missing" can also mean "trimmed past us". The follower verifies with one LIST of the
rollups every ``verify_interval`` (1 s while the writer is active, 10 s while it is idle, 60 s
while push is live), and at once when a pushed seq is missing or a reader hit a vanished part;
it then reloads from the newest rollup. A replica whose options assume a longer ``gc_grace``
than the writer's thus lags by at most that interval, never serves a wrong state.

Every storage request goes through a :class:`CountingRead`, so ``describe()`` reports the cost.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from typing_extensions import override

from persist import layout
from persist.blob.base import BlobRead
from persist.errors import PersistError, RuntimeShutdown
from persist.indexed.engine import Indexed, Options
from persist.indexed.format.meta import State
from persist.runtime.notify import Subscriber
from persist.runtime.runtime import Published

log = logging.getLogger("persist.replica")

#: After seeing a commit, the writer counts as active for this long (verification is faster).
_ACTIVE_FOR = 10.0


class CountingRead(BlobRead):
    """The read half of a store that counts its requests (what a replica costs)."""

    def __init__(self, inner: BlobRead) -> None:
        self._inner = inner
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local
        self._lock = threading.Lock()
        self._counts = {"get_meta": 0, "get_data": 0, "list": 0}

    @property
    def counts(self) -> dict[str, int]:
        """Requests so far: metadata GETs, data-part GETs, LISTs."""
        with self._lock:
            return dict(self._counts)

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        with self._lock:
            self._counts["get_data" if key.startswith(layout.DATA_PREFIX) else "get_meta"] += 1
        return self._inner._get(key)

    @override
    def _get_range(self, key: str, start: int, end: int | None) -> bytes | memoryview | None:
        with self._lock:
            self._counts["get_data" if key.startswith(layout.DATA_PREFIX) else "get_meta"] += 1
        return self._inner._get_range(key, start, end)

    @override
    def _list(self, prefix: str) -> list[str]:
        with self._lock:
            self._counts["list"] += 1
        return self._inner._list(prefix)

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        with self._lock:
            self._counts["list"] += 1
        return self._inner._list_after(prefix, start_after)

    @override
    def _external_url(self, key: str) -> str | None:
        return self._inner._external_url(key)

    @override
    def locator(self) -> tuple[str, str] | None:
        return self._inner.locator()

    @override
    def sibling(self, root: str) -> BlobRead:
        return self._inner.sibling(root)

    @override
    def close(self) -> None:
        self._inner.close()


def open_replica(
    blob: BlobRead,
    *,
    options: Options | None = None,
    poll_interval: tuple[float, float] = (0.005, 0.5),
    notify: bool = False,
) -> tuple[Indexed, Follower]:
    """Loads a location through ``blob`` (a read half) and starts following its writer."""
    counted = CountingRead(blob)
    ix = Indexed.open(counted, options=options)
    return ix, Follower(ix, min_poll=poll_interval[0], max_poll=poll_interval[1], notify=notify,
                        requests=counted)


class Follower:
    """Keeps a read-only :class:`Indexed` up to date with the writer and publishes its states.

    Thread-safe: ``sync`` may be called from reader threads while the follower thread runs.
    """

    #: How much the polling interval grows after each poll that found nothing.
    #: NB: 1.5, not 2: with writes 10-100 ms apart, a commit waits for the poll after it, and
    #: doubling from 5 ms left gaps of 20-40 ms there (write -> listener p50 28-33 ms at load
    #: 8-11; with 1.5, 22-24 ms, for 35-40 % more GETs while the writer is active). The idle
    #: cost is max_poll's either way (docs/replicas.md, "Measured latency and cost").
    backoff = 1.5

    def __init__(
        self,
        ix: Indexed,
        *,
        min_poll: float = 0.005,
        max_poll: float = 0.5,
        notify: bool = False,
        push_poll: float = 5.0,
        verify_interval: tuple[float, float, float] = (1.0, 10.0, 60.0),
        requests: CountingRead | None = None,
    ) -> None:
        """Starts following in a daemon thread (and subscribing to pushes with ``notify``).

        Args:
            ix: a read-only engine (its blob is a read half).
            min_poll, max_poll: the polling backoff, in seconds.
            notify: subscribe to the writer's push notifications when it advertises them.
            push_poll: seconds between safety polls while a push subscription is live.
            verify_interval: seconds between LISTs of the rollups that detect a log trimmed past
                this replica: while the writer is active, while it is idle, and while a push
                subscription is live (a pushed seq that the log lacks triggers one at once).
            requests: the counting blob under ``ix``, for ``describe()``.
        """
        self.ix = ix
        self.published = Published(ix.state)
        self.min_poll = min_poll
        self.max_poll = max_poll
        self.push_poll = max(push_poll, max_poll)
        self.verify_interval = verify_interval
        self.polls = 0
        self.verifies = 0
        self._requests = requests
        self._pushed = 0
        self._last_verify = time.monotonic()
        self._last_progress = float("-inf")
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()
        self.subscriber: Subscriber | None = None
        if notify:
            self.subscriber = Subscriber(
                ix.store, on_push=self._on_push, on_change=self._on_push_change,
                min_epoch=lambda: self.published.state.epoch,
            )
        self._thread = threading.Thread(target=self._run, name="persist-follower", daemon=True)
        self._thread.start()

    # -- being told to poll ----------------------------------------------------------------------

    @property
    def push_live(self) -> bool:
        """True while subscribed to the notifier of the writer that committed our state."""
        sub = self.subscriber
        epoch = sub.epoch if sub is not None else None
        return epoch is not None and epoch >= self.published.state.epoch

    def poke(self) -> None:
        """A reader is waiting for a newer state: poll now (unless a push will say when)."""
        if not self.push_live:
            self._wake.set()

    def _on_push(self, seq: int) -> None:
        if seq > self.published.state.seq:
            with self._push_lock:
                self._pushed = max(self._pushed, seq)
            self._wake.set()

    def _on_push_change(self, live: bool) -> None:
        # NB: a lost subscription may be a writer handover: poll now, then back to backoff.
        if not live:
            self._wake.set()

    # -- polling ------------------------------------------------------------------------------

    def sync(self, *, full: bool = False) -> State:
        """Polls once, synchronously, and publishes what it found.

        Args:
            full: also verify that the log was not trimmed past this replica (one LIST). Readers
                pass it after a part vanished under them.
        """
        with self._push_lock:
            expect, self._pushed = self._pushed, 0
        with self._lock:
            now = time.monotonic()
            every = self.verify_interval[2 if self.push_live else
                                         0 if now - self._last_progress < _ACTIVE_FOR else 1]
            verify = full or now - self._last_verify >= every
            before = self.ix.state
            self.polls += 1
            try:
                state = self.ix.machine.refresh(before, verify=verify, expect_seq=expect)
            except BaseException:
                with self._push_lock:  # keep the hint for the next attempt
                    self._pushed = max(self._pushed, expect)
                raise
            self.ix.state = state
            if verify:
                self.verifies += 1
                self._last_verify = now
            if state.seq > before.seq:
                self._last_progress = now
        if state.seq < expect:
            # NB: a pushed seq the log does not have even after verifying: not ours to trust.
            log.debug("pushed seq %d is not in the log (at %d); ignoring it", expect, state.seq)
        self.published.publish(state)
        sub = self.subscriber
        if sub is not None and sub.epoch is not None and sub.epoch < state.epoch:
            sub.drop()  # subscribed to a writer that has been fenced: find the new one
        return state

    def _run(self) -> None:
        delay = self.min_poll
        while not self._stopping.is_set():
            before = self.published.state.seq
            try:
                self.sync()
            except PersistError as e:
                log.warning("replica poll failed (will retry): %s", e)
            except Exception:  # never let a bug stop the replica from following silently
                log.exception("replica poll failed (will retry)")
            if self.push_live:
                delay = self.push_poll
            elif self.published.state.seq != before:
                delay = self.min_poll
            else:
                delay = min(delay * self.backoff, self.max_poll)
            if self._wake.wait(delay):
                self._wake.clear()

    # -- reporting and stopping -----------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Counters: polls, LIST verifications, storage requests by kind, push status."""
        out: dict[str, Any] = {
            "seq": self.published.state.seq,
            "polls": self.polls,
            "verifies": self.verifies,
            "requests": self._requests.counts if self._requests is not None else {},
        }
        sub = self.subscriber
        if sub is not None:
            out["push"] = {"live": self.push_live, "pushes": sub.pushes,
                           "connects": sub.connects, "adverts_read": sub.adverts_read}
        return out

    def stop(self) -> None:
        """Stops following (idempotent). Waiting readers get RuntimeShutdown."""
        self._stopping.set()
        self._wake.set()
        if self.subscriber is not None:
            self.subscriber.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self.published.close(RuntimeShutdown("the replica was stopped"))
