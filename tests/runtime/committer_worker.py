"""Child process for the committer fleet test: one of several plain processes (no Spark) that
stage batches and commit them to one location through ``persist.distributed.Committer``.

Usage: python -m tests.runtime.committer_worker LOCATION WORKER FIRST LAST

Commits batches ``FIRST .. LAST - 1`` of worker ``WORKER`` to collection ``events``: stages the
batch's rows (:func:`batch`) as one part, commits it under token ``(fleet-<WORKER>, batch)``
and then prints ``ack <batch> landed`` (or ``ack <batch> replay`` when the token was applied
before: a batch that landed before this process's predecessor could acknowledge it). Prints
``done`` at the end. ``PERSIST_CRASH_AT`` arms crash points (``committer.landed``: SIGKILL
between a commit landing and its acknowledgement).
"""

from __future__ import annotations

import sys

import pyarrow as pa

from persist.distributed import Committer, Stager, Token

#: Generous: three processes take turns at one writer lock, and a killed holder's lock is only
#: taken over once its successor starts.
LOCK_TIMEOUT = 300.0


def rid(worker: int) -> str:
    """The worker's reentrance id and token id: the same across its restarts."""
    return f"fleet-{worker}"


def batch(worker: int, b: int) -> pa.Table:
    """Batch ``b`` of ``worker``: every other batch is small (staged inline, riding in the
    commit), the others big enough to get a blob of their own. Keys are unique per batch."""
    n = 40 if b % 2 else 3000
    keys = [f"w{worker}-b{b}-r{i}" for i in range(n)]
    return pa.table({"key": keys, "value": pa.array([b] * n, pa.int64()),
                     "time": pa.array([b] * n, pa.uint64()),
                     "diff": pa.array([1] * n, pa.int64())})


def main() -> None:
    url, worker, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    stager = Stager.start(url, "events", job=f"fleet worker {worker}")
    committer = Committer(url, reentrance_id=rid(worker), lock_timeout=LOCK_TIMEOUT)
    for b in range(first, last):
        staged = [stager.stage(batch(worker, b))]
        landed = committer.commit({"events": staged}, token=Token(rid(worker), b))
        stager.release(staged, keep_own=True)
        print(f"ack {b} {'landed' if landed else 'replay'}", flush=True)
    stager.release()
    print("done", flush=True)


if __name__ == "__main__":
    main()
