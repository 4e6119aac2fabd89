"""Writes the golden files of storage format version 5 (forks, named holds, restores). Run
once; never regenerate: they pin what every future persist must still read.

    python -m tests.golden.make_golden_v5
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
from tests.golden.records_v5 import fixed_commit, fixed_restore, fixed_state

HERE = Path(__file__).parent


def expected_of(client: persist.Client) -> dict[str, Any]:
    """Every collection's snapshots at every readable time, its tags and holds."""
    out: dict[str, Any] = {}
    for name in client.collections:
        _, r = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
        out[name] = {
            "since": r.since, "upper": r.upper, "tags": r.tags,
            "holds": [[h.name, h.kind, h.frontier, h.lease_seconds, h.lapsed]
                      for h in client.holds(name)],
            "snapshots": {str(t): [[k, v, d] for (k, v), _, d in r.snapshot(t).to_python()]
                          for t in range(r.since, r.upper)}}
    return out


def main() -> None:
    (HERE / "v5-commit.bin").write_bytes(meta.encode(fixed_commit()))
    (HERE / "v5-restore.bin").write_bytes(meta.encode(fixed_restore()))
    (HERE / "v5-state.bin").write_bytes(meta.encode(fixed_state()))
    loc = HERE / "v5-location"
    shutil.rmtree(loc, ignore_errors=True)
    # NB: no part stats (stats_bytes=0) and no background work, as the other golden
    # locations: what is pinned is references, holds and restores.
    opts = persist.Options(inline_threshold=600, rollup_every=4, stats_bytes=0,
                           gc_grace_seconds=3600, background_compaction=False,
                           compaction=CompactionPolicy(fanin=2, inline_flush_bytes=1200))
    with persist.open(loc, reentrance_id="golden", options=opts) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(6):
            w.append([((f"k{t % 4}", t), t, 1), ((f"k{(t + 3) % 4}", t - 1), t, -1)]
                     + [((f"bulk{t}-{i}", i), t, 1) for i in range(40 * (t % 2))],
                     upper=t + 1).result()
        client.maintain()  # merged parts reaching past 3: the fork cuts them
        client.tag("events", "q3-close", as_of=2).result()
        client.hold("events", "billing-export", 1, lease=6 * 3600)
        stopped = client.hold("events", "stopped", 1, lease=0.001)
        while not stopped.lapsed:  # the writer commits the lapse
            client.maintain()
        client.fork("events", into="events-copy", as_of=3).result()
        fw, _ = client.create_or_load("events-copy", key_type=pa.string(),
                                      value_type=pa.int64())
        fw.append([(("fork-only", 9), 4, 1)], upper=5).result()
        before = client.state.seq
        w.append([(("undone", 1), 6, 1)], upper=7).result()
        client.create_or_load("dropped", key_type=pa.string(), value_type=pa.int64())
        client.restore(before)
        w.allow_compaction(4).result()
        client.maintain()
        (HERE / "v5-expected.json").write_text(json.dumps(expected_of(client), indent=1,
                                                          sort_keys=True))
    # NB: the writer lock is not part of the format (the other golden locations have none)
    for name in ("LOCK", "LOCK.mutex", "LOCK.chain"):
        path = loc / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


if __name__ == "__main__":
    main()
