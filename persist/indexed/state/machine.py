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
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import Corruption, Determinate, Fenced, PersistError
from persist.indexed.format import meta
from persist.indexed.format.meta import Commit, State, Trim
from persist.indexed.state import pieces
from persist.indexed.state.transitions import apply

T = TypeVar("T")

#: Attempts per read while loading the state (see ``Machine._read``).
_LOAD_READ_ATTEMPTS = 3
#: How long, by default, a retired data blob and the metadata a newer rollup made obsolete
#: are kept before GC deletes them (``Options.gc_grace_seconds``): a reader of an older state
#: has this long to finish, and a follower that synced less than half of it ago trusts a
#: missing next log entry to mean "no newer commit".
GC_GRACE_SECONDS = 300.0


class CommitConflict(Determinate):
    """Another commit of a lower or equal epoch landed first: the writer's state is stale.
    Nothing was written; reload and re-plan."""


@dataclass(frozen=True)
class Loaded:
    """What the last load found besides the state: where it started, and what a writer's
    metadata trim needs (:class:`persist.indexed.maintenance.gc.MetaTrim`)."""

    #: The seq of the rollup the state was loaded from (0: none, the log from its start).
    rollup: int
    #: That rollup's record of the trim (None: it has none).
    trim: Trim | None
    #: The rollups the load listed, ascending.
    rollups: tuple[int, ...]
    #: When that LIST returned (``time.monotonic()``, and the wall clock in ms): every
    #: rollup listed was written before then.
    listed_at: float
    listed_ms: int


class Machine:
    """Reads and writes the metadata log of one location."""

    def __init__(self, blob: BlobRead, *, gc_grace_seconds: float = GC_GRACE_SECONDS,
                 lazy: bool = False) -> None:
        """Reads (and, given a :class:`Blob`, writes) the metadata of the location of ``blob``.

        Args:
            gc_grace_seconds: the writer's grace (see :data:`GC_GRACE_SECONDS`).
            lazy: load a state whose collections decode each piece of a manifest at the first
                use of one of its collections (:class:`persist.indexed.state.pieces.
                Collections`), read by a background thread after the load
                (:attr:`prefetch`) or at that use, whichever comes first: a piece missing,
                failing its crc or corrupt then raises at that use, not in :meth:`load`.
                Writers and replicas load so; a caller that must find every problem in the
                load (``persist verify``, the CLI) does not.
        """
        self.blob = blob
        self.gc_grace_seconds = gc_grace_seconds
        self.lazy = lazy
        self._last_sync = float("-inf")
        #: What the last successful :meth:`load` found (None: none yet).
        self.loaded: Loaded | None = None
        #: The newest rollup's pieces, for the next incremental rollup (:mod:`.pieces`).
        self.pieces = pieces.Pieces()
        #: The background read of the pieces of the manifest the last lazy load started from
        #: (None: none started), done once each was read or failed to be.
        self.prefetch: Future[None] | None = None
        #: The pieces of the first lazy load, until :meth:`start_prefetch` reads them.
        self._unread: list[pieces.Held] = []
        self._loads = 0

    # -- reading -------------------------------------------------------------------------

    def load(self, *, scan: bool | None = None) -> State:
        """Reads the current state: the newest rollup plus every later commit.

        Retries a few times when a concurrent GC deletes log entries under it.

        Args:
            scan: LIST the log after the rollup (``start_after`` its entry) to find the
                entries to replay, so an entry missing in the middle (a gap: storage lost it)
                is caught instead of read as the end of the log. Default: when this machine
                can write. A writer must scan: it commits the entry after the state it loaded,
                and would fork history into such a gap. A reader probes forward from the
                rollup with GETs instead, as ``refresh`` does. Either way the cost is the
                entries since the rollup, never the whole log (thousands of keys on a busy
                location, which trims only a grace period after a rollup).

        Raises:
            Corruption, IncompatibleFormat: storage holds bytes persist cannot trust.
            ExternalError: storage failed.
        """
        if scan is None:
            scan = isinstance(self.blob, Blob)
        last: PersistError | None = None
        for attempt in range(5):
            started = time.monotonic()
            try:
                state, self.loaded, rollup = self._load_once(scan)
                self.pieces.loaded(rollup)
                self._loads += 1
                if self.lazy and rollup is not None and rollup.held is not None:
                    self._unread = list(rollup.held.values())
                    if self._loads > 1:  # a reload: read them now (the open does, after it)
                        self.start_prefetch()
                self._last_sync = started
                return state
            except _GapError as e:
                last = e
                # NB: a trim in progress (or a rollup replaced between our two LISTs): give
                # the deleting writer a moment before listing again.
                time.sleep(0.005 * attempt)
        assert last is not None
        raise Corruption(layout.LOG_PREFIX, f"metadata log has a gap that persists: {last}")

    def start_prefetch(self) -> None:
        """Starts reading, in the background, the pieces of the manifest the last lazy load
        started from that nothing read yet (:func:`pieces.prefetch`). The open of a writer or
        replica calls it once it is open (reading them during the open would take the GIL
        from it); a reload, at once. A reader that used a piece only after a trim deleted
        it (a grace period after a newer rollup rewrote its bucket) would find it missing.
        """
        unread, self._unread = self._unread, []
        if unread:
            self.prefetch = pieces.prefetch(unread)

    def _load_once(self, scan: bool) -> tuple[State, Loaded, pieces.Rollup | None]:
        listed = time.monotonic()
        rollups = self._read(self.blob.list_keys, layout.ROLLUP_PREFIX)
        loaded = Loaded(rollup=0, trim=None,
                        rollups=tuple(layout.seq_of(k) for k in rollups),
                        listed_at=time.monotonic(), listed_ms=int(time.time() * 1000))
        state = State()
        rollup: pieces.Rollup | None = None
        if rollups:
            key = rollups[-1]
            data = self._read(self.blob.get, key)
            if data is None:
                raise _GapError(f"rollup {key} vanished")
            try:
                rollup = pieces.read_rollup(self.blob, key, data, retry=self._read,
                                            lazy=self.lazy)
            except pieces.PieceMissing as e:
                raise _GapError(f"rollup {key}: {e}") from e
            # NB: a record's version is stamped when it is encoded (the lowest that can carry
            # it) and says nothing about the state in memory; replaying a commit drops it too
            # (``apply``). Dropped here as well, so a state reads the same however it was
            # reached (a writer's, a replica's, one loaded from a rollup with no log after it).
            # So is the record's trim progress (not part of the state): kept in ``loaded``.
            state, trim = rollup.state, rollup.trim
            state = msgspec.structs.replace(state, version=meta.BASE_FORMAT_VERSION)
            loaded = Loaded(rollup=state.seq, trim=trim, rollups=loaded.rollups,
                            listed_at=loaded.listed_at, listed_ms=loaded.listed_ms)
        if not scan:
            # NB: the miss that ends the probe is the end of the log unless GC trimmed past a
            # rollup newer than the one we listed; that rollup must then have been written
            # after our LIST and have aged a whole grace period (see ``refresh``). A load
            # faster than half the grace cannot see that; a slower one LISTs the rollups again.
            while True:
                key = layout.log_key(state.seq + 1, meta.log_from(state))
                data = self._read(self.blob.get, key)
                if data is None:
                    break
                state = apply(state, meta.decode_commit(key, data))
            if time.monotonic() - listed > self.gc_grace_seconds / 2:
                rollups = self._read(self.blob.list_keys, layout.ROLLUP_PREFIX)
                if rollups and layout.seq_of(rollups[-1]) > state.seq:
                    raise _GapError(f"rollup {rollups[-1]} appeared beyond seq {state.seq}")
            return state, loaded, rollup
        # NB: keys sort by seq across the switch to a sharded log (format 7), so this lists
        # the entries after the rollup in order; on a sharded log a file store reads only the
        # names of the shards from the rollup's on (DESIGN.md §7).
        after = layout.log_key(state.seq, meta.log_from(state))
        logs = self._read(lambda p: self.blob.list_keys(p, start_after=after), layout.LOG_PREFIX)
        for key in logs:
            if key != layout.log_key(state.seq + 1, meta.log_from(state)):
                raise _GapError(f"expected seq {state.seq + 1}, found {key}")
            data = self._read(self.blob.get, key)
            if data is None:
                raise _GapError(f"log entry {key} vanished")
            state = apply(state, meta.decode_commit(key, data))
        return state, loaded, rollup

    def _read(self, read: Callable[[str], T], key: str) -> T:
        """``read(key)``, retried briefly on a definite failure.

        NB: a load is one LIST and up to ``rollup_every`` GETs, all of which must succeed; an
        open that fails on any one of them is retried by its caller from scratch. Retrying the
        one read instead keeps opening robust against a storage that fails a small fraction of
        requests (reads have no effect, so retrying them is always safe).
        """
        for attempt in range(_LOAD_READ_ATTEMPTS):
            try:
                return read(key)
            except Determinate:
                if attempt + 1 == _LOAD_READ_ATTEMPTS:
                    raise
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")

    def refresh(self, state: State, *, verify: bool = False, expect_seq: int = 0) -> State:
        """Brings ``state`` up to date cheaply by probing the next log keys.

        One GET per new entry plus one for the missing key that ends the chain. A missing key
        normally means "no newer commit", but it can also mean that GC trimmed the log past
        ``state`` (entries ``<= R`` go once a rollup ``R`` is ``gc_grace`` old). Trimming needs a
        newer rollup, so the probe is *verified* with one LIST of the rollups, and the state is
        reloaded from the newest rollup when one lies beyond it.

        NB: a miss observed at time ``t`` cannot be trimmed before ``t + gc_grace`` (the entry,
        then a rollup covering it, must be written after ``t``, and then age for the grace), so
        misses are trusted without a LIST for ``gc_grace/2`` after the last confirmed position.
        That trust rests on the *writer's* grace, which a reader only assumes (its own options);
        followers therefore also pass ``verify`` on a schedule of their own, which bounds how
        long a reader misconfigured with a longer grace than the writer's can lag.

        Args:
            state: the state to advance (never moved backwards).
            verify: LIST the rollups even inside the trust window.
            expect_seq: a sequence number known to be committed (a push notification). The
                probe stops there; if it ends below it, that entry vanished under us: verify
                and reload.

        Raises:
            Corruption, IncompatibleFormat: storage holds bytes persist cannot trust.
            ExternalError: storage failed.
        """
        verify = verify or time.monotonic() - self._last_sync > self.gc_grace_seconds / 2
        while True:
            if state.seq >= expect_seq > 0 and not verify:
                # NB: told this far by a push: skip the GET that would confirm nothing newer
                # exists (the next commit is pushed too), halving a pushed replica's requests.
                return state
            probed_at = time.monotonic()
            key = layout.log_key(state.seq + 1, meta.log_from(state))
            data = self.blob.get(key)
            if data is None:
                break
            state = apply(state, meta.decode_commit(key, data))
        if verify or state.seq < expect_seq:
            rollups = self.blob.list_keys(layout.ROLLUP_PREFIX)
            if rollups and layout.seq_of(rollups[-1]) > state.seq:
                return self.load()
        # NB: the time *before* the GET that missed: the entry was absent at least then.
        self._last_sync = probed_at
        return state

    # -- writing -------------------------------------------------------------------------

    def commit(self, commit: Commit, log_from: int | None) -> None:
        """Durably commits ``commit`` as the entry after its predecessor (whose state's log is
        sharded from ``log_from`` on, :func:`persist.indexed.format.meta.log_from`), or refuses.

        Raises:
            InvalidUsage: the record would not decode (a bug upstream); nothing was written.
            Fenced: a writer of a higher epoch committed ``commit.seq`` first.
            CommitConflict: someone else committed ``commit.seq`` first (stale state).
            Determinate: definitely not committed.
            Indeterminate: may have been committed; the caller must go fail-stop.
        """
        blob = self._writable()
        key = layout.log_key(commit.seq, log_from)
        data = meta.encode_commit_checked(key, commit)
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

    def write_rollup(self, state: State, trim: Trim | None = None) -> str:
        """Stores the rollup of ``state``, recording the metadata trim's progress ``trim`` (the
        state at a seq is unique, so writing it again changes at most the record of the trim,
        which no reader of the state reads): whole, or incrementally as a manifest and the
        pieces that changed since the newest rollup (:mod:`.pieces`)."""
        return self.pieces.write(self._writable(), state, trim)

    def _writable(self) -> Blob:
        if not isinstance(self.blob, Blob):
            from persist.errors import ReadOnly

            raise ReadOnly("this location was opened read-only")
        return self.blob


class _GapError(Corruption):
    def __init__(self, detail: str) -> None:
        super().__init__(layout.LOG_PREFIX, detail)
