"""Bodies of the child processes in the multi-process race tests (importable under spawn)."""

from __future__ import annotations

from typing import Any

from persist.errors import LockHeld


def create_racer(bucket: str, prefix: str, options: dict[str, Any], me: int, rounds: int,
                 barrier: Any, results: Any) -> None:
    """Each round, all processes call ``set_if_absent`` on one key at once."""
    from persist.blob.s3 import S3Blob

    blob = S3Blob(bucket, prefix, storage_options=options)
    for r in range(rounds):
        barrier.wait()
        won = blob.set_if_absent(f"meta/log/{r:05d}", f"writer {me}".encode())
        results.put((r, me, won))


def lock_racer(url: str, options: dict[str, Any], me: int, rounds: int, barrier: Any,
               results: Any) -> None:
    """Each round, all processes try to take a fresh location's lock at once."""
    from persist.location import resolve

    for r in range(rounds):
        lock = resolve(f"{url}/{r:05d}", storage_options=options).lock()
        barrier.wait()
        try:
            lease = lock.acquire(f"proc-{me}")
            results.put((r, me, lease.generation))
        except LockHeld:
            results.put((r, me, None))
    # NB: every process stays alive until all have raced the last round: a lock whose holder
    # is a process of this machine that is gone has lapsed at once (persist.lock.base), so a
    # last-round winner that exited while a slower contender was still in its acquire loop
    # was taken over at generation 2 (a fresh-clone CI run on 2026-11-30)
    barrier.wait()
