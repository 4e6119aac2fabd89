"""Writes the golden files of storage format version 7 (the sharded log: entries from the
switch on at ``meta/log/s<first seq of the shard>/<seq>``). Run once; never regenerate: they
pin what every future persist must still read.

    python -m tests.golden.make_golden_v7
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa

import persist
from persist import layout
from persist.indexed.format import meta
from tests.golden.make_golden_v5 import expected_of
from tests.golden.records_v7 import fixed_sharded_manifest, fixed_sharded_state, fixed_switch

HERE = Path(__file__).parent
#: The log of the golden location ends here, its last rollup below the second shard: entries
#: are kept in two shards.
HEAD = layout.LOG_SHARD + 24


def main() -> None:
    (HERE / "v7-commit.bin").write_bytes(meta.encode(fixed_switch()))
    (HERE / "v7-state.bin").write_bytes(meta.encode(fixed_sharded_state()))
    (HERE / "v7-manifest.bin").write_bytes(meta.encode_manifest(fixed_sharded_manifest()))
    loc = HERE / "v7-location"
    shutil.rmtree(loc, ignore_errors=True)
    # NB: grace 0: every rollup is ripe at once, so the log is trimmed up to the newest one
    # and the location keeps only its tail (the switch at seq 1 is trimmed too).
    opts = persist.Options(inline_threshold=600, rollup_every=64, stats_bytes=0,
                           gc_grace_seconds=0, background_compaction=False)
    with persist.open(loc, reentrance_id="golden", options=opts) as client:
        w0, r0 = client.create_or_load("c0", key_type=pa.string(), value_type=pa.int64())
        w1, _ = client.create_or_load("c1", key_type=pa.string(), value_type=pa.int64())
        i = 0
        while client.state.seq < HEAD:
            if client.state.seq >= layout.LOG_SHARD - 40:
                client.set_options(persist.Options(
                    inline_threshold=600, rollup_every=1 << 20, stats_bytes=0,
                    gc_grace_seconds=0, background_compaction=False))
            w = w0 if i % 3 else w1
            t = i
            w.append([((f"k{i % 10}", 1), t, 1)], upper=t + 1).result()
            i += 1
            if i % 64 == 0:
                client.maintain()
        for w, r in ((w0, r0), client.create_or_load("c1", key_type=pa.string(),
                                                     value_type=pa.int64())):
            if r.upper > 3:
                w.allow_compaction(r.upper - 3).result()
        (HERE / "v7-expected.json").write_text(json.dumps(expected_of(client), indent=1,
                                                          sort_keys=True))


if __name__ == "__main__":
    main()
