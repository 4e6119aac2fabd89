"""Read-only followers: a replica's view of a location advances as the writer commits.

A follower thread polls the metadata log (one GET of the next log key per poll, see
``Machine.refresh``) with exponential backoff while idle, from ``min_poll`` up to ``max_poll``,
and publishes every new state. It holds only the read half of the blob store: a replica cannot
write, take the lock or delete anything by construction.
"""

from __future__ import annotations

import logging
import threading

from persist.errors import PersistError, RuntimeShutdown
from persist.indexed.indexed import Indexed
from persist.runtime.runtime import Published

log = logging.getLogger("persist.replica")


class Follower:
    def __init__(self, ix: Indexed, *, min_poll: float = 0.005, max_poll: float = 0.5) -> None:
        self.ix = ix
        self.published = Published(ix.state)
        self.min_poll = min_poll
        self.max_poll = max_poll
        self.polls = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="persist-follower", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Asks for a poll now (a push notification arrived, or a reader is waiting)."""
        self._wake.set()

    def sync(self) -> None:
        """Polls once, synchronously."""
        with self._lock:
            self.polls += 1
            state = self.ix.refresh()
        self.published.publish(state)

    def _run(self) -> None:
        delay = self.min_poll
        while not self._stopping.is_set():
            before = self.published.state.seq
            try:
                self.sync()
            except PersistError as e:
                log.warning("replica poll failed (will retry): %s", e)
            if self.published.state.seq != before:
                delay = self.min_poll
            else:
                delay = min(delay * 2, self.max_poll)
            if self._wake.wait(delay):
                self._wake.clear()
                delay = self.min_poll

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self.published.close(RuntimeShutdown("the replica was stopped"))
