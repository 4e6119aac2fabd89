"""Named seams between durable steps where a test can kill the process.

A crash point costs one dict lookup when nothing is armed. Tests arm points in a child process
through the environment: ``PERSIST_CRASH_AT="name"`` or ``"name:N"`` kills the process with
SIGKILL the N-th time (default first) that ``hit("name")`` runs, exactly as a power cut or
``kill -9`` would between those two syscalls.

Points (see DESIGN.md, failure model): ``file.tmp_written``, ``file.tmp_synced``,
``file.linked``, ``commit.data_written``, ``commit.meta_written``, ``compact.part_written``,
``compact.marks_written`` (a marks step's delta and marks blobs written, not committed),
``gc.before_delete``, ``gc.after_delete``, ``rollup.pieces_written`` (an incremental
rollup's pieces are stored, its manifest not yet), ``rollup.written``, ``trim.log_deleted`` (a
metadata trim deleted a log entry, or a whole shard of them, more to go),
``trim.rollup_thinned`` (a superseded rollup deleted before its trim, more to go), ``file.shard_emptied``
(a file store deleted the last entry of a shard of a sharded log, or all of them, not yet its
directory), ``fork.pinned`` (a fork across
locations pinned the source's blobs, not yet committed), ``fork.committed``, ``adopt.adopted``
(a native write's part files adopted as staged parts, not yet committed),
``distributed.compaction.task`` and ``distributed.compaction.staged`` (a distributed
compaction's task started, staged a part), ``distributed.compaction.committed``.

A writer's merge worker process (:mod:`persist.indexed.maintenance.offload`) does not inherit
``PERSIST_CRASH_AT`` (the writer hits ``compact.part_written`` itself once the worker's merge is
written); ``PERSIST_WORKER_CRASH_AT``, same syntax, arms the worker's points instead (say
``file.linked:2``: killed mid-merge, after writing two blobs).
"""

from __future__ import annotations

import os
import signal

_armed: dict[str, int] = {}


def _load() -> None:
    spec = os.environ.get("PERSIST_CRASH_AT", "")
    for item in filter(None, spec.split(",")):
        name, _, count = item.partition(":")
        _armed[name.strip()] = int(count) if count else 1


_load()


def hit(name: str) -> None:
    """Marks that execution passed the seam ``name``; dies here if a test armed it."""
    if not _armed or name not in _armed:
        return
    _armed[name] -= 1
    if _armed[name] <= 0:
        os.kill(os.getpid(), signal.SIGKILL)


def arm(name: str, count: int = 1) -> None:
    """Arms ``name`` in this process (tests that fork use the environment instead)."""
    _armed[name] = count
