"""Writes the golden files of storage format version 6 (incremental rollups: a manifest at
``meta/rollup/<seq>``, its collections in pieces at ``meta/piece/<digest>``). Run once; never
regenerate: they pin what every future persist must still read.

    python -m tests.golden.make_golden_v6
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa

import persist
from persist.indexed.format import meta
from persist.indexed.state import pieces
from tests.golden.make_golden_v5 import expected_of
from tests.golden.records_v6 import fixed_manifest, fixed_piece

HERE = Path(__file__).parent
#: Collections of the golden location (two per piece while it is written: 8 buckets).
COLLECTIONS = 12


def main() -> None:
    (HERE / "v6-manifest.bin").write_bytes(meta.encode_manifest(fixed_manifest()))
    (HERE / "v6-piece.bin").write_bytes(meta.encode_piece(fixed_piece()))
    loc = HERE / "v6-location"
    shutil.rmtree(loc, ignore_errors=True)
    pieces.COLLECTIONS_PER_PIECE = 2
    opts = persist.Options(inline_threshold=600, rollup_every=4, stats_bytes=0,
                           gc_grace_seconds=3600, background_compaction=False)
    with persist.open(loc, reentrance_id="golden", options=opts) as client:
        for i in range(COLLECTIONS):
            w, _ = client.create_or_load(f"c{i}", key_type=pa.string(), value_type=pa.int64())
            w.append([((f"k{i}", i), 0, 1)], upper=1).result()
        client.maintain()  # the first manifest: every piece
        w, _ = client.create_or_load("c0", key_type=pa.string(), value_type=pa.int64())
        for t in range(1, 5):
            w.append([((f"k{t}", t), t, 1)], upper=t + 1).result()
        client.maintain()  # the second: c0's piece rewritten, the others referenced
        (HERE / "v6-expected.json").write_text(json.dumps(expected_of(client), indent=1,
                                                          sort_keys=True))

if __name__ == "__main__":
    main()
