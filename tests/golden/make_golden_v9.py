"""Writes the golden files of storage format version 9 (compressed inline parts). Run once;
never regenerate: they pin what every future persist must still read.

    python -m tests.golden.make_golden_v9
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa

import persist
from persist.indexed.format import meta
from tests.golden.make_golden_v8 import expected_of
from tests.golden.records_v9 import fixed_packed_append, fixed_packed_state

HERE = Path(__file__).parent


def main() -> None:
    (HERE / "v9-commit.bin").write_bytes(meta.encode(fixed_packed_append()))
    (HERE / "v9-state.bin").write_bytes(meta.encode(fixed_packed_state()))
    loc = HERE / "v9-location"
    shutil.rmtree(loc, ignore_errors=True)
    # NB: inline appends only (the default threshold), and a retraction across them
    opts = persist.Options(gc_grace_seconds=0, background_compaction=False)
    with persist.open(loc, reentrance_id="golden", options=opts) as client:
        w, _r = client.create_or_load("c0", key_type=pa.int64(), value_type=pa.int64())
        w.append([((k, k % 7), 0, 1) for k in range(200)], upper=1).result()
        w.append([((k, 1), 1, 1) for k in range(1000, 1003)], upper=2).result()
        w.append([((5, 5), 2, -1), ((1000, 1), 2, 1)], upper=3).result()
        (HERE / "v9-expected.json").write_text(json.dumps(expected_of(client), indent=1,
                                                          sort_keys=True))
    # NB: the writer lock's files are not part of the format (a reader never opens them)
    for p in loc.glob("LOCK*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()


if __name__ == "__main__":
    main()
