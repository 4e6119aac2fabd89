"""The metadata log: loading state, following it, and the one compare-and-set that commits.

Commit protocol: a writer at ``state.seq == n`` commits by *creating* ``meta/log/<n+1>`` with
``set_if_absent``. Exactly one writer can create a given key, so two writers can never both
commit version ``n+1``. A writer that loses reads the winner: a higher epoch means it was
fenced (a newer lock holder claimed the log); the identical bytes mean its own earlier,
indeterminate attempt landed.

A new lock holder claims the log with a *fence commit* (no ops, its new epoch) right after it
acquires the lock. From then on every older writer's next create fails (the key exists) and
the entry it reads back carries a higher epoch, so it is Fenced: safety rests on the storage
CAS, never on the lock lease or a clock.
"""

from __future__ import annotations

import time

from persist.blob.base import Blob, BlobRead
from persist.errors import Corruption, Determinate, Fenced, PersistError
from persist.indexed import meta
from persist.indexed.meta import Commit, State
from persist.indexed.state import apply


class CommitConflict(Determinate):
    """Another commit of a lower or equal epoch landed first: the writer's state is stale.
    Nothing was written; reload and re-plan."""


class Machine:
    """Reads and writes the metadata log of one location."""

    def __init__(self, blob: BlobRead, *, gc_grace_seconds: float = 300.0) -> None:
        self.blob = blob
        self.gc_grace_seconds = gc_grace_seconds
        self._last_sync = float("-inf")

    # -- reading -------------------------------------------------------------------------

    def load(self) -> State:
        """Reads the current state: the newest rollup plus every later commit.

        Retries a few times when a concurrent GC deletes log entries under it.

        Raises:
            Corruption, IncompatibleFormat: storage holds bytes persist cannot trust.
            ExternalError: storage failed.
        """
        last: PersistError | None = None
        for _ in range(5):
            try:
                state = self._load_once()
                self._last_sync = time.monotonic()
                return state
            except _GapError as e:
                last = e
        assert last is not None
        raise Corruption(meta.LOG_PREFIX, f"metadata log has a gap that persists: {last}")

    def _load_once(self) -> State:
        rollups = self.blob.list_keys(meta.ROLLUP_PREFIX)
        state = State()
        if rollups:
            key = rollups[-1]
            data = self.blob.get(key)
            if data is None:
                raise _GapError(f"rollup {key} vanished")
            state = meta.decode_state(key, data)
        logs = [k for k in self.blob.list_keys(meta.LOG_PREFIX) if meta.seq_of(k) > state.seq]
        for key in logs:
            if meta.seq_of(key) != state.seq + 1:
                raise _GapError(f"expected seq {state.seq + 1}, found {key}")
            data = self.blob.get(key)
            if data is None:
                raise _GapError(f"log entry {key} vanished")
            state = apply(state, meta.decode_commit(key, data))
        return state

    def refresh(self, state: State) -> State:
        """Brings ``state`` up to date cheaply by probing the next log keys.

        NB: GC deletes a log entry only ``gc_grace`` after a rollup covering it was written, so
        a follower that last synced less than ``gc_grace/2`` ago can trust a missing next key to
        mean "no newer commit". Otherwise it pays for a full ``load`` (two LISTs).
        """
        if time.monotonic() - self._last_sync > self.gc_grace_seconds / 2:
            return self.load()
        while True:
            key = meta.log_key(state.seq + 1)
            data = self.blob.get(key)
            if data is None:
                self._last_sync = time.monotonic()
                return state
            state = apply(state, meta.decode_commit(key, data))

    # -- writing -------------------------------------------------------------------------

    def commit(self, commit: Commit) -> None:
        """Durably commits ``commit`` as the entry after its predecessor, or refuses.

        Raises:
            Fenced: a writer of a higher epoch committed ``commit.seq`` first.
            CommitConflict: someone else committed ``commit.seq`` first (stale state).
            Determinate: definitely not committed.
            Indeterminate: may have been committed; the caller must go fail-stop.
        """
        blob = self._writable()
        key = meta.log_key(commit.seq)
        data = meta.encode(commit)
        if blob.set_if_absent(key, data):
            return
        existing = blob.get(key)
        if existing == data:
            return  # an earlier attempt of ours that reported failure did land
        if existing is None:
            raise CommitConflict(f"{key} existed and then vanished; reload")
        winner = meta.decode_commit(key, existing)
        if winner.epoch > commit.epoch:
            raise Fenced(
                f"writer {commit.writer!r} (generation {commit.epoch}) was fenced: "
                f"{winner.writer!r} (generation {winner.epoch}) committed seq {commit.seq}"
            )
        raise CommitConflict(
            f"seq {commit.seq} was committed by {winner.writer!r} (generation {winner.epoch}) "
            f"before {commit.writer!r} (generation {commit.epoch}); reload"
        )

    def write_rollup(self, state: State) -> str:
        """Stores the whole ``state`` (idempotent: state at a seq is unique)."""
        key = meta.rollup_key(state.seq)
        self._writable().set(key, meta.encode(state))
        return key

    def _writable(self) -> Blob:
        if not isinstance(self.blob, Blob):
            from persist.errors import ReadOnly

            raise ReadOnly("this location was opened read-only")
        return self.blob


class _GapError(Corruption):
    def __init__(self, detail: str) -> None:
        super().__init__(meta.LOG_PREFIX, detail)
