"""Writes the golden files of storage format version 8 (marks: a marked base part and the
delta of compaction's marks step). Run once; never regenerate: they pin what every future
persist must still read.

    python -m tests.golden.make_golden_v8
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

import persist
from persist.indexed.format import meta
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.golden.records_v8 import fixed_marked_state, fixed_marks_step

HERE = Path(__file__).parent


def expected_of(client: persist.Client) -> dict[str, Any]:
    """Every collection's (int64 keys and values) snapshots at every readable time."""
    out: dict[str, Any] = {}
    for name in client.collections:
        _, r = client.create_or_load(name, key_type=pa.int64(), value_type=pa.int64())
        out[name] = {"since": r.since, "upper": r.upper,
                     "snapshots": {str(t): [[k, v, d] for (k, v), _, d
                                            in r.snapshot(t).to_python()]
                                   for t in range(r.since, r.upper)}}
    return out


def main() -> None:
    (HERE / "v8-commit.bin").write_bytes(meta.encode(fixed_marks_step()))
    (HERE / "v8-state.bin").write_bytes(meta.encode(fixed_marked_state()))
    loc = HERE / "v8-location"
    shutil.rmtree(loc, ignore_errors=True)
    # NB: small base parts and a marks step on any base, so a few hundred rows make one
    opts = persist.Options(inline_threshold=0, stats_bytes=1024, gc_grace_seconds=0,
                           background_compaction=False, batch_rows=64,
                           compaction=CompactionPolicy(part_target_bytes=4 << 10,
                                                       marks_rows=1))
    with persist.open(loc, reentrance_id="golden", options=opts) as client:
        w, _r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        w.append([((k, k % 5), 0, 1) for k in range(600)], upper=1).result()
        w.allow_compaction(0).result()
        while client.maintain():
            pass
        w.append([((7, 2), 1, -1), ((8, 1), 1, 1), ((900, 0), 1, 1)], upper=2).result()
        w.allow_compaction(1).result()
        while client.maintain():
            pass
        w.append([((9, 4), 2, -1), ((901, 1), 2, 1)], upper=3).result()
        (HERE / "v8-expected.json").write_text(json.dumps(expected_of(client), indent=1,
                                                          sort_keys=True))


if __name__ == "__main__":
    main()
