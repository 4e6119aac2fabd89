"""Durable read holds set from a Spark streaming query.

A hold is a ``SetHold`` op in the metadata log, and only the holder of a location's writer lock
commits to the log. A Spark query reading a collection is not its writer, so it takes the lock
briefly — acquire (waiting up to a timeout), fence, one commit, release — exactly like any other
writer, without starting a runtime (no maintenance threads in the query's driver).

Invariant: failing to set a hold is never unsafe, only less protective: the stream still checks
that every micro-batch is exact (``failOnDataLoss``). So a busy lock makes this log a warning
and return False, and the caller retries at its next commit.
"""

from __future__ import annotations

import logging

from operators.options import Target
from persist.errors import InvalidUsage, LockHeld
from persist.indexed.indexed import Indexed
from persist.location import resolve

log = logging.getLogger("persist.spark")


def set_hold(target: Target, hold_id: str, frontier: int | None, *,
             lock_timeout: float) -> bool:
    """Sets (or, with None, releases) read hold ``hold_id`` on ``target``'s collection.

    Returns:
        True once committed; False if the writer lock stayed busy for ``lock_timeout`` seconds
        or the frontier is already below the collection's since (logged as warnings).

    Raises:
        ExternalError, Corruption: storage failed.
    """
    loc = resolve(target.url, storage_options=target.storage_options)
    lock = loc.lock()
    rid = f"persist-spark-hold:{hold_id}"
    try:
        lease = lock.acquire(rid, timeout=lock_timeout)
    except LockHeld as e:
        log.warning("read hold %r on %r not moved to %s: %s (will retry at the next commit; "
                    "a writer holding the lock continuously can set it with "
                    "WriteHandle.hold)", hold_id, target.collection, frontier, e)
        lock.close()
        return False
    try:
        ix = Indexed.open(loc.blob, epoch=lease.generation, writer=rid)
        ix.fence()
        try:
            ix.set_hold(target.collection, hold_id, frontier)
        except InvalidUsage as e:
            log.warning("read hold %r on %r not set: %s", hold_id, target.collection, e)
            return False
        return True
    finally:
        lock.release(lease)
        lock.close()
