"""Child process for the fork-and-GC test: a source location's writer that appends, compacts
and collects garbage as fast as it can (no GC grace, a short leaked-blob grace), until a stop
file appears.

Usage: python -m tests.runtime.gc_writer URL STOP_FILE

Time ``t`` holds keys ``t * 1000 + i`` for ``i < t % 7 + 1`` (value ``t``, diff 1), so the
contents as of any time are known (:func:`expected`). Prints ``{"ready": true}`` once writing.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa

import persist
from persist.indexed.maintenance.compact import CompactionPolicy
from tests import knobs

knobs.activate_from_env()

# NB: a short GC grace, not none: readers in other processes (the forks' distributed reads,
# the forker's plan) probe the log and trust a missing entry for a moment (DESIGN.md §4).
OPTIONS = persist.Options(inline_threshold=0, gc_grace_seconds=2.0, commit_deadline_seconds=0.5,
                          leak_grace_seconds=1.0, compaction=CompactionPolicy(fanin=2))


def rows_at(t: int) -> list[tuple[tuple[int, int], int, int]]:
    """The updates the writer makes at time ``t``."""
    return [((t * 1000 + i, t), t, 1) for i in range(t % 7 + 1)]


def expected(as_of: int) -> set[tuple[int, int]]:
    """The contents as of ``as_of``: every (key, value) written at or before it."""
    return {kv for t in range(as_of + 1) for kv, _, _ in rows_at(t)}


def main() -> None:
    url, stop = sys.argv[1], sys.argv[2]
    with persist.open(url, options=OPTIONS) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        t = 0
        while not os.path.exists(stop):
            w.append(rows_at(t), upper=t + 1).result()
            if t >= 2:
                w.allow_compaction(t - 1).result()
            if t == 3:
                print(json.dumps({"ready": True}), flush=True)
            t += 1
            time.sleep(0.005)


if __name__ == "__main__":
    main()
