"""Child process for the crash-point tests: a short, deterministic workload that passes every
named seam (data blobs, metadata commits, compaction, GC deletions, rollups).

Usage: ``PERSIST_CRASH_AT=<seam>:<n> python -m tests.nemesis.seam_writer LOCATION``

Prints one JSON line per write before submitting it (``{"try": t, "keys": [...]}``) and one
once it is acknowledged (``{"ack": t}``), flushing each, so the parent knows exactly what was
promised before ``crashpoints.hit`` SIGKILLed this process. Exits 0 only if the armed seam was
never reached (the parent treats that as a failure of the test's setup).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pyarrow as pa

import persist
from persist import layout
from persist.indexed.maintenance.compact import CompactionPolicy

RID = "seam-writer"
# NB: pinned, not under the session's knob set (tests/knobs.py): the crash-point tests arm
# each seam at a count this exact workload reaches (the 4th merge, the 5th rollup), which
# other knobs would move or remove (no background compaction never merges).
OPTIONS = persist.Options(
    inline_threshold=1500,
    rollup_every=3,
    gc_grace_seconds=0.0,
    compaction=CompactionPolicy(final_rows=1 << 14, inline_flush_bytes=4096),
)
WRITES = 40


def batch(t: int, rows: int) -> pa.Table:
    keys = [t * 10_000 + i for i in range(rows)]
    return pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array(keys, pa.int64()),
                     "time": pa.array([t] * rows, pa.uint64()),
                     "diff": pa.array([1] * rows, pa.int64())})


def main() -> None:
    location = sys.argv[1]
    if os.environ.get("SEAM_LOG_SHARD"):
        # NB: a test of the sharded log's trim (tests/runtime/test_trim.py) shrinks the shards
        # so this short workload empties some; the parent reads the location with the same.
        layout.LOG_SHARD = int(os.environ["SEAM_LOG_SHARD"])
    options = OPTIONS
    if os.environ.get("SEAM_GRACE"):
        # NB: a test of the rollups' thinning (tests/runtime/test_trim.py) needs a grace to
        # thin inside: with none, each trim deletes every rollup but the newest.
        options = dataclasses.replace(OPTIONS, gc_grace_seconds=float(os.environ["SEAM_GRACE"]))
    writes = int(os.environ.get("SEAM_WRITES", WRITES))
    out = sys.stdout
    with persist.open(location, reentrance_id=RID, options=options) as client:
        write, read = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for i in range(writes):
            t = read.upper
            # Every third write is big enough for its own data blob; the rest ride inline.
            rows = 400 if i % 3 == 0 else 1 + i % 7
            out.write(json.dumps({"try": t, "keys": [t * 10_000 + j for j in range(rows)]}) + "\n")
            out.flush()
            fut = write.append(batch(t, rows), t + 1)
            if i % 5 == 4:
                write.allow_compaction(max(0, t - 3))
            fut.result()
            out.write(json.dumps({"ack": t}) + "\n")
            out.flush()
            time.sleep(0.01)  # lets compaction, GC and rollups interleave with commits
        time.sleep(1.0)


if __name__ == "__main__":
    main()
