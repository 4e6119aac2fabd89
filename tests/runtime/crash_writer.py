"""Child process for the crash tests: writes forever, reporting every attempt and every ack.

Usage: python -m tests.runtime.crash_writer LOCATION SEED

Stdout lines (JSON): {"ready": true} once the location is open, {"attempt": t, "keys": [...]}
before a write is submitted and {"ack": t} once its future resolved (durable). The parent SIGKILLs this process at random.
"""

from __future__ import annotations

import json
import random
import sys

import pyarrow as pa

import persist
from persist.indexed.maintenance.compact import CompactionPolicy
from tests import knobs

# NB: the parent test runs under a knob set (tests/knobs.py); so does this process.
knobs.activate_from_env()

OPTIONS = persist.Options(
    inline_threshold=512,
    rollup_every=8,
    gc_grace_seconds=0.0,
    compaction=CompactionPolicy(final_rows=4096, inline_flush_bytes=2048),
)


def main() -> None:
    location, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    client = persist.open(location, reentrance_id="crash-writer", options=OPTIONS)
    handles = {n: client.create_or_load(n, key_type=pa.int64(), value_type=pa.int64())
               for n in ("c", "d")}
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    while True:
        t = handles["c"][1].upper
        rows = rng.randint(1, 300)
        keys = [t * 1000 + i for i in range(rows)]
        out.write(json.dumps({"attempt": t, "keys": keys}) + "\n")
        out.flush()
        batch = pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array(keys, pa.int64()),
                          "time": pa.array([t] * rows, pa.uint64()),
                          "diff": pa.array([1] * rows, pa.int64())})
        if rng.random() < 0.3:
            fut = client.apply(writes={"c": batch, "d": batch}, seals={"c": t + 1, "d": t + 1})
        else:
            fut = handles["c"][0].append(batch, t + 1)
        if t > 20 and rng.random() < 0.2:
            handles["c"][0].allow_compaction(t - 20)
        fut.result()
        out.write(json.dumps({"ack": t}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
