"""Garbage collection: deleting blobs no live state references, and never one that is.

Three kinds of garbage, each with its own rule:

* Retired data parts: compaction replaced them at commit ``seq``; the state lists them in
  ``retired``. They are deleted ``grace`` after retirement (a reader still working from an older
  state has that long to finish; after it, it retries on a newer state), then forgotten by a
  ``Forget`` op.
* Old metadata: log entries ``<= R`` and rollups ``< R`` once rollup ``R`` is ``grace`` old,
  deleted by sequence number (:class:`MetaTrim`), never by listing the log; before that, the
  superseded rollups nothing needs (:meth:`MetaTrim.thin`).
* Leaked blobs: data written by a commit that never landed (a crash between writing a part and
  committing it). A commit that fails definitely deletes its own blobs, so these are rare. They
  are found by listing (``leaked``) and deleted only once they stayed unreferenced for a grace
  period longer than any commit may take to claim them: by the writer's maintenance thread
  (:class:`LeakSweeper`) and by the operator command ``persist verify --delete-leaked``.

A blob may be read by several collections (forks, :mod:`persist.indexed.state.refs`): the state
retires it only once none reads it, and every path here counts every collection's references.
A fork in *another* location reads this location's blobs under a pin
(:mod:`persist.indexed.state.pins`): the retired-blob GC asks :class:`PinGuard` right before it
deletes, and the sweeps count a pinned blob as referenced.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import ExternalError, MissingResource, PersistError
from persist.indexed.format.meta import Forget, RollupAt, State, Trim
from persist.indexed.state import lease, pins, refs
from persist.indexed.state.machine import Loaded, Machine

log = logging.getLogger("persist.gc")


def collectable(state: State, *, now_ms: int, grace_ms: int) -> tuple[str, ...]:
    """Retired blob keys whose grace period has passed."""
    return tuple(r.key for r in state.retired if now_ms - r.wall_ms >= grace_ms)


def delete_retired(blob: Blob, keys: tuple[str, ...]) -> Forget:
    """Deletes retired blobs; returns the ``Forget`` of those deleted.

    Stops at the first failed delete, keeping what it did: a round that fails one delete in a
    hundred must still make progress (the rest are retried by the next round).

    Raises:
        ExternalError: only if the first delete fails.
    """
    from persist import crashpoints

    done: list[str] = []
    for key in keys:
        crashpoints.hit("gc.before_delete")
        try:
            blob.delete(key)
        except ExternalError:
            if not done:
                raise
            break
        crashpoints.hit("gc.after_delete")
        done.append(key)
    return Forget(keys=tuple(done))


#: Log entries a trim deletes per call at most: the first trim of a location an older persist
#: left with a long log (or of a log no short-lived writer trimmed) goes on in later rounds
#: instead of holding one round for minutes (one DELETE per entry on S3).
TRIM_BATCH = 4096
#: A superseded rollup is thinned (:meth:`MetaTrim.thin`) only once its successor is this old
#: (or a quarter of the grace, if less): a reader that listed the rollups before the successor
#: was written has that long to read the one it found newest.
THIN_PROTECT_SECONDS = 5.0
#: The thinning keeps the first rollup of each of this many windows of a grace period.
THIN_WINDOWS = 16


@dataclass
class _Rollup:
    """A rollup the trim knows of: written no later than ``wall_ms`` (a writer's wall clock)
    and no later than ``mono`` (this process's monotonic clock); ``own``: this writer wrote
    it, so its age is its monotonic age alone."""

    wall_ms: int
    mono: float
    own: bool


class MetaTrim:
    """A writer's trim of old metadata, by sequence number: once rollup ``R`` is ``grace``
    old, the log entries ``<= R`` and the rollups ``< R`` are deleted, each by its key.

    What it needs is in the state, never in a listing of the log: ``trimmed`` (every log entry
    ``<= trimmed`` is gone, so a trim to ``R`` deletes ``trimmed+1 .. R``) and the rollups
    that may exist with when each was written. Each rollup records both (:class:`Trim`), so a
    later writer goes on where this one stopped, whoever wrote the rollups and however short
    its life: the rollups come from the LIST of rollups every load makes anyway, their times
    from the newest rollup's record.

    A rollup's age: for one this writer wrote, the time since its write returned on the
    monotonic clock (the rule of every persist before this); for one it found, the longer of
    the time since the load that listed it (it existed then) and the wall-clock time since
    its record says it was written (a writer's clock: a rollup whose writer stopped is
    trimmed by the next writer that finds it old enough, as retired blobs are collected by
    their ``Retired.wall_ms``). A rollup the record does not name (written by an older
    persist, or by a writer fenced after its successor listed) counts from that listing.

    Unknown progress (``trimmed`` None: the newest rollup has no record, written by an older
    persist, or no load yet) is found by one LIST of the log (:meth:`survey`); the writer then
    writes a rollup at once, recording it, so that LIST is made once per location.
    """

    def __init__(self) -> None:
        """Knows nothing: the first :meth:`observe` (or :meth:`survey`) tells it."""
        self.trimmed: int | None = None
        self.rollups: dict[int, _Rollup] = {}
        #: Whether this writer's first trim swept the shard below its progress (see
        #: :meth:`trim`).
        self._swept = False
        # NB: the maintenance thread trims while the commit thread may reload (after a failed
        # commit), which observes: the two meet only under this lock, never across a request.
        self._lock = threading.Lock()

    def observe(self, loaded: Loaded | None) -> None:
        """Takes in what a load found: the rollups it listed, and the trim progress the newest
        one records (the rollups this writer already knows keep what it knows of them)."""
        if loaded is None:
            return
        rec = loaded.trim
        times = {} if rec is None else {r.seq: r.wall_ms for r in rec.rollups}
        with self._lock:
            if rec is not None:
                times[loaded.rollup] = rec.written_ms
                self.trimmed = max(self.trimmed or 0, rec.trimmed)
            elif not loaded.rollups and self.trimmed is None:
                # NB: no rollup at all: no trim ever ran (each keeps the rollup it trimmed
                # to), so the log is whole from seq 1.
                self.trimmed = 0
            for seq in loaded.rollups:
                if seq not in self.rollups:
                    self.rollups[seq] = _Rollup(
                        wall_ms=min(times.get(seq, loaded.listed_ms), loaded.listed_ms),
                        mono=loaded.listed_at, own=False)

    def survey(self, blob: BlobRead) -> None:
        """Finds unknown progress with one LIST of the log and one of the rollups (a location
        an older persist trimmed, or a writer made without a load).

        Raises:
            ExternalError: a listing failed (progress stays unknown).
        """
        logs = blob.list_keys(layout.LOG_PREFIX)
        rollups = blob.list_keys(layout.ROLLUP_PREFIX)
        now, now_ms = time.monotonic(), _now_ms()
        with self._lock:
            for key in rollups:
                self.rollups.setdefault(layout.seq_of(key), _Rollup(now_ms, now, own=False))
            # NB: entries below the first listed are gone for good (a seq is never created
            # again below the head); with none listed, every one up to the newest rollup is.
            first = layout.seq_of(logs[0]) if logs else max(self.rollups, default=0) + 1
            self.trimmed = first - 1

    def written(self, seq: int, wall_ms: int) -> None:
        """This writer has just written rollup ``seq`` (its write returned now)."""
        with self._lock:
            self.rollups[seq] = _Rollup(wall_ms=wall_ms, mono=time.monotonic(), own=True)

    def record(self, seq: int, written_ms: int) -> Trim | None:
        """What rollup ``seq``, written at ``written_ms``, records (None: progress unknown)."""
        with self._lock:
            if self.trimmed is None:
                return None
            older = tuple(RollupAt(s, r.wall_ms) for s, r in sorted(self.rollups.items())
                          if s < seq)
            return Trim(written_ms=written_ms, trimmed=self.trimmed, rollups=older)

    def ripe(self, grace_seconds: float) -> int | None:
        """The newest rollup at least ``grace_seconds`` old, if any (see the class doc)."""
        now, now_ms = time.monotonic(), _now_ms()
        with self._lock:
            ripe = [s for s, r in self.rollups.items() if _age(r, now, now_ms) >= grace_seconds]
        return max(ripe, default=None)

    def known(self) -> list[int]:
        """The rollups this trim knows to be stored (listed by a load or written since), and
        not deleted by it yet."""
        with self._lock:
            return sorted(self.rollups)

    def thinnable(self, grace_seconds: float) -> list[int]:
        """The superseded rollups nothing needs any more, ascending (see :meth:`thin`)."""
        now, now_ms = time.monotonic(), _now_ms()
        protect = min(THIN_PROTECT_SECONDS, grace_seconds / 4)
        width_ms = max(1, int(grace_seconds * 1000 / THIN_WINDOWS))
        with self._lock:
            seqs = sorted(self.rollups)
            shards: set[int] = set()
            windows: set[int] = set()
            out: list[int] = []
            for s, succ in itertools.pairwise(seqs):
                shard, window = s // layout.LOG_SHARD, self.rollups[s].wall_ms // width_ms
                # NB: the first rollup of a shard's worth of seqs, or of a window of the
                # grace, stays: a restore replays at most two shards of log from one, and
                # the trim always has one ripening (so the log it keeps lags a grace by a
                # window at most).
                first = shard not in shards or window not in windows
                shards.add(shard)
                windows.add(window)
                if not first and _age(self.rollups[succ], now, now_ms) >= protect:
                    out.append(s)
        return out

    def thin(self, blob: Blob, grace_seconds: float) -> int:
        """Deletes the superseded rollups nothing needs before their trim; returns how many.

        A rollup older than the newest is needed by (a) a reader that listed the rollups
        while it was the newest and is about to read it: so one goes only once its successor
        is :data:`THIN_PROTECT_SECONDS` old (a quarter of the grace, if less; a reader that
        finds it gone lists again, as after a trim), (b) a restore, which replays from the
        newest rollup at or below its seq: so the first of each :data:`persist.layout.
        LOG_SHARD` seqs stays, and (c) the trim, which trims to a rollup a grace old: so the
        first of each sixteenth of the grace stays. Everything else is a copy of what the log
        and the rollups kept already hold, and 100 short sessions inside one grace left 1,200
        of them for every open to list (DESIGN.md §9). The log is not touched; the pieces only
        thinned manifests named go by :meth:`persist.indexed.state.pieces.Pieces.thin`.

        Raises:
            ExternalError: a delete failed; what was deleted stays deleted.
        """
        from persist import crashpoints

        n = 0
        for seq in self.thinnable(grace_seconds):
            self._delete_rollup(blob, seq)
            n += 1
            crashpoints.hit("trim.rollup_thinned")
        return n

    def trim(self, blob: Blob, upto: int, log_from: int | None = None) -> int:
        """Deletes the log entries ``trimmed+1 .. upto`` (at most :data:`TRIM_BATCH`, in
        order; of a log sharded from ``log_from`` on, :func:`persist.layout.log_key`; a whole
        shard in one :meth:`~persist.blob.base.Blob.delete_shard`) and then, once the log is
        trimmed to ``upto``, the known rollups ``< upto``; returns how many keys it deleted.
        Progress is kept delete by delete (shard by shard).

        Only call with a rollup ``upto`` at least a grace period old (:meth:`ripe`).

        Raises:
            ExternalError: a delete failed; what was deleted before stays deleted.
        """
        from persist import crashpoints

        start = self.trimmed
        assert start is not None, "survey first"
        n = 0
        if not self._swept and log_from is not None and start >= log_from \
                and start % layout.LOG_SHARD == layout.LOG_SHARD - 1:
            # NB: the trim is at a shard's end: a writer killed between deleting that last
            # entry and removing the shard's directory (``file.shard_emptied``), or whose
            # ``rmdir`` failed, left the directory empty, and the progress recorded (or surveyed
            # past it) never deletes that entry again. Deleting it again (absent: a no-op)
            # removes the directory on a file store; once per writer, one request elsewhere.
            blob.delete(layout.log_key(start, log_from))
        self._swept = True
        seq, end = start + 1, min(upto, start + TRIM_BATCH)
        while seq <= end:
            size = layout.LOG_SHARD
            if log_from is not None and seq >= log_from and seq % size == 0 \
                    and seq + size - 1 <= end:
                # NB: a whole shard in one call (Blob.delete_shard: a file store removes its
                # directory at once, releasing the GIL once for it rather than per entry, which
                # competed with the commit path); what a trim of a backlog mostly deletes
                keys = [layout.log_key(s, log_from) for s in range(seq, seq + size)]
                shard = layout.log_shard_done(keys[-1])
                assert shard is not None
                blob.delete_shard(shard, keys)
                last = seq + size - 1
            else:
                blob.delete(layout.log_key(seq, log_from))
                last = seq
            with self._lock:
                self.trimmed = max(self.trimmed or 0, last)
            n += last - seq + 1
            seq = last + 1
            crashpoints.hit("trim.log_deleted")
        if start + TRIM_BATCH < upto:
            return n
        with self._lock:
            older = sorted(s for s in self.rollups if s < upto)
        for seq in older:
            self._delete_rollup(blob, seq)
            n += 1
        return n

    def _delete_rollup(self, blob: Blob, seq: int) -> None:
        """Deletes rollup ``seq`` and forgets it (a trim's or a thinning's)."""
        blob.delete(layout.rollup_key(seq))
        with self._lock:
            self.rollups.pop(seq, None)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _age(r: _Rollup, now: float, now_ms: int) -> float:
    """How long ago rollup ``r`` was written at least, in seconds (see :class:`MetaTrim`)."""
    age = now - r.mono
    return age if r.own else max(age, (now_ms - r.wall_ms) / 1000)


def referenced(state: State) -> set[str]:
    """Every data blob of this location ``state`` references: read by a live part of any
    collection (a fork's included), or retired and awaiting GC."""
    keys = refs.referenced(state.collections.values())
    keys.update(r.key for r in state.retired)
    return keys


class PinGuard:
    """Which of this location's retired blobs a fork in another location still reads, asked
    right before the GC deletes them (rule 2 of :mod:`persist.indexed.state.pins`), and the
    releaser of pins nothing reads any more (rule 3).

    Each judgement LISTs the pins and, for each, loads its destination's newest state. A pin is *dead* when that state reads none of its keys; it is released
    (deleted) once it was seen dead at two judgements at least ``release_grace_seconds`` apart
    (twice this location's commit deadline), and at least twice the commit bound the pin
    records (its forker's), and until then it protects its keys. Judgements
    are reused for ``recheck_seconds`` while the candidates stay the same: a pin protects only
    keys that were live when it was verified, so no new pin can protect a key a judgement found
    unprotected.
    """

    def __init__(self, release_grace_seconds: float, recheck_seconds: float = 5.0,
                 tidy_seconds: float = 60.0) -> None:
        """A guard releasing dead pins after ``release_grace_seconds``, judging again at most
        every ``recheck_seconds`` for the same candidates, and every ``tidy_seconds`` when
        there are none (a pin of blobs its source still reads is released too, once dead)."""
        self.release_grace_seconds = release_grace_seconds
        self.recheck_seconds = recheck_seconds
        self.tidy_seconds = tidy_seconds
        self._dead_since: dict[str, float] = {}
        self._judged: frozenset[str] = frozenset()
        self._protected: set[str] = set()
        self._next = float("-inf")
        self._next_tidy = float("-inf")

    def protected(self, blob: Blob, keys: Sequence[str], now: float) -> set[str]:
        """The keys of ``keys`` (retired blobs about to be deleted) that a pin still protects;
        releases the pins found dead for the release grace on the way.

        Args:
            blob: this location's store.
            keys: the candidates (may be empty: then pins are only tidied, now and then).
            now: the current time on a monotonic clock, in seconds.

        Raises:
            ExternalError: listing or reading the pins failed (delete nothing then).
        """
        want = frozenset(keys)
        if not want and now < self._next_tidy:
            return set()
        if want and now < self._next and want <= self._judged:
            return self._protected & want
        me = blob.locator()
        protected: set[str] = set()
        seen: set[str] = set()
        for p in pins.listing(blob):
            seen.add(p.id)
            if me is None or self._read_by(blob, me[1], p):
                self._dead_since.pop(p.id, None)
                protected.update(want.intersection(p.keys))
                continue
            first = self._dead_since.setdefault(p.id, now)
            # NB: the forker's own bound, if longer than ours (a destination with a longer
            # commit deadline): its commit may still land until then.
            bound = p.commit_within
            grace = max(self.release_grace_seconds, 0.0 if bound is None else 2 * bound)
            if now - first < grace:
                protected.update(want.intersection(p.keys))
                continue
            log.info("releasing pin %s of location %s (%d blobs): it has read none of them "
                     "for %.3gs", p.id, p.location, len(p.keys), now - first)
            pins.delete(blob, p.id)
            del self._dead_since[p.id]
        self._dead_since = {k: v for k, v in self._dead_since.items() if k in seen}
        self._judged, self._protected = want, protected
        self._next = now + self.recheck_seconds
        self._next_tidy = now + max(self.tidy_seconds, self.recheck_seconds)
        return protected & want

    @staticmethod
    def _read_by(blob: Blob, me: str, p: pins.Pin) -> bool:
        """Whether pin ``p``'s destination's newest state reads one of its keys (a blob of
        the location at root ``me``). Unknown (storage failed) counts as read."""
        try:
            # NB: scan (LIST the log after the rollup), never probe: a probe trusts a miss for half
            # of this process's grace, and a destination writer with a shorter one may have
            # trimmed it, which would make its state look empty and the pin dead.
            state = Machine(blob.sibling(p.location).read_only()).load(scan=True)
        except MissingResource:
            return False
        except PersistError as e:
            log.warning("pin %s: cannot read its destination %s (%s); it keeps protecting "
                        "its blobs", p.id, p.location, e)
            return True
        return bool(refs.foreign(state.collections.values()).get(me, set())
                    .intersection(p.keys))


def leaked(blob: BlobRead, state: State) -> list[str]:
    """Data blobs stored but referenced by neither ``state`` nor its retired list.

    NB: a blob written moments ago by a live writer for a commit still in flight shows up here
    too; only delete what is older than the grace period.
    """
    refs = referenced(state)
    return [k for k in blob.list_keys(layout.DATA_PREFIX) if k not in refs]


class LeakSweeper:
    """Deletes leaked data blobs once each has stayed unreferenced for ``grace`` seconds.

    Run by the writer (the only process that commits to its location) every so often. Each
    :meth:`sweep` lists the data blobs, *then* reads the writer's newest state, and notes when
    each unreferenced blob was first seen so; one still unreferenced ``grace`` seconds later is
    deleted. Parts staged by other processes (:func:`persist.layout.is_staged`) are left alone
    while their staging lease lives (:mod:`persist.indexed.state.lease`): one is a candidate only
    once its lease is revoked, and a part staged without a lease never is.

    Invariant (why it is safe): a blob is deleted only if it was listed, hence written, at least
    ``grace`` ago and no state since referenced it. The only commits that could still claim it
    are this writer's own, and those refuse to reference a blob older than the commit deadline,
    which ``grace`` exceeds by at least the deadline again (``Options.leak_grace_seconds``).
    """

    def __init__(self, grace_seconds: float,
                 lease_skew_seconds: float = lease.DEFAULT_SKEW_SECONDS) -> None:
        """A sweeper deleting blobs unreferenced for ``grace_seconds``; it revokes a staging
        lease once its expiry is ``lease_skew_seconds`` past (see :mod:`persist.indexed.state.lease`)."""
        self.grace_seconds = grace_seconds
        self.lease_skew_seconds = lease_skew_seconds
        self._first_seen: dict[str, float] = {}

    def sweep(self, blob: Blob, newest_state: Callable[[], State], now: float) -> list[str]:
        """Lists, compares and deletes; returns the keys deleted.

        Args:
            blob: the location's store.
            newest_state: returns the writer's newest state; called after the listing.
            now: the current time on a monotonic clock, in seconds.

        Raises:
            ExternalError: the listing failed (nothing deleted), or the first delete failed;
                a later failed delete ends the sweep, keeping what it did.
        """
        listed = blob.list_keys(layout.DATA_PREFIX)
        # NB: a pinned blob is referenced (a fork elsewhere reads it): listed after the data,
        # so a pin made in between counts too.
        held = referenced(newest_state()) | pins.pinned(blob).keys()
        # NB: a staged part counts only once its lease is revoked (this revokes a lapsed one):
        # its grace then starts at the revocation, which no commit can come after.
        judge = lease.Judge(blob, skew_seconds=self.lease_skew_seconds)
        leaked_now = {k for k in listed if k not in held
                      and (not layout.is_staged(k) or judge.reclaimable(k))}
        self._first_seen = {k: t for k, t in self._first_seen.items() if k in leaked_now}
        for key in leaked_now:
            self._first_seen.setdefault(key, now)
        ripe = sorted(k for k, t in self._first_seen.items() if now - t >= self.grace_seconds)
        deleted: list[str] = []
        for key in ripe:
            try:
                blob.delete(key)
            except ExternalError:
                if not deleted:
                    raise
                break
            del self._first_seen[key]
            deleted.append(key)
        return deleted

