"""Garbage collection: deleting blobs no live state references, and never one that is.

Three kinds of garbage, each with its own rule:

* Retired data parts: compaction replaced them at commit ``seq``; the state lists them in
  ``retired``. They are deleted ``grace`` after retirement (a reader still working from an older
  state has that long to finish; after it, it retries on a newer state), then forgotten by a
  ``Forget`` op.
* Old metadata: log entries ``<= R`` and rollups ``< R`` once rollup ``R`` is ``grace`` old.
* Leaked blobs: data written by a commit that never landed (a crash between writing a part and
  committing it). A commit that fails definitely deletes its own blobs, so these are rare. They
  are found by listing (``leaked``) and deleted only once they stayed unreferenced for a grace
  period longer than any commit may take to claim them: by the writer's maintenance thread
  (:class:`LeakSweeper`) and by the operator command ``persist verify --delete-leaked``.
"""

from __future__ import annotations

from collections.abc import Callable

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import ExternalError
from persist.indexed.format.meta import Forget, State
from persist.indexed.state import lease


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


def trim_metadata(blob: Blob, rollup_seq: int) -> int:
    """Deletes log entries ``<= rollup_seq`` and rollups ``< rollup_seq``. Returns the count.

    Only call once rollup ``rollup_seq`` has existed for the grace period.

    Raises:
        ExternalError: a listing or delete failed; what was deleted before stays deleted.
    """
    n = 0
    for key in blob.list_keys(layout.LOG_PREFIX):
        if layout.seq_of(key) <= rollup_seq:
            blob.delete(key)
            n += 1
    for key in blob.list_keys(layout.ROLLUP_PREFIX):
        if layout.seq_of(key) < rollup_seq:
            blob.delete(key)
            n += 1
    return n


def referenced(state: State) -> set[str]:
    """Every data blob ``state`` references: live parts and retired ones awaiting GC."""
    keys = {p.blob_key for c in state.collections.values() for p in c.parts if p.blob_key}
    keys.update(r.key for r in state.retired)
    return keys


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
        refs = referenced(newest_state())
        # NB: a staged part counts only once its lease is revoked (this revokes a lapsed one):
        # its grace then starts at the revocation, which no commit can come after.
        judge = lease.Judge(blob, skew_seconds=self.lease_skew_seconds)
        leaked_now = {k for k in listed if k not in refs
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

