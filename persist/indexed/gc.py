"""Garbage collection: deleting blobs no live state references, and never one that is.

Three kinds of garbage, each with its own rule:

* Retired data parts: compaction replaced them at commit ``seq``; the state lists them in
  ``retired``. They are deleted ``grace`` after retirement (a reader still working from an older
  state has that long to finish; after it, it retries on a newer state), then forgotten by a
  ``Forget`` op.
* Old metadata: log entries ``<= R`` and rollups ``< R`` once rollup ``R`` is ``grace`` old.
* Leaked blobs: data written by a commit that never landed (a crash, a fenced writer). They are
  found by listing (``leaked``) and deleted only when older than ``grace`` by an operator command
  (``persist verify --delete-leaked``), since a live writer may be about to commit them.
"""

from __future__ import annotations

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.errors import ExternalError
from persist.indexed.meta import Forget, State


def collectable(state: State, *, now_ms: int, grace_ms: int) -> tuple[str, ...]:
    """Retired blob keys whose grace period has passed."""
    return tuple(r.key for r in state.retired if now_ms - r.wall_ms >= grace_ms)


def delete_retired(blob: Blob, keys: tuple[str, ...]) -> Forget:
    """Deletes retired blobs; returns the ``Forget`` of those deleted.

    Stops at the first failed delete, keeping what it did: a round that fails one delete in a
    hundred must still make progress (the rest are retried by the next round). Raises only if
    the first delete fails.
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
