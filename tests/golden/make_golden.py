"""Writes the golden files of storage format version 1. Run once per format version; never
regenerate an existing version's files: they pin what every future persist must still read.

    python -m tests.golden.make_golden
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa

from persist.blob.file import FileBlob
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.golden.records import fixed_commit, fixed_state
from tests.support.engine import Engine

HERE = Path(__file__).parent


def main() -> None:
    (HERE / "v1-commit.bin").write_bytes(meta.encode(fixed_commit()))
    (HERE / "v1-state.bin").write_bytes(meta.encode(fixed_state()))
    loc = HERE / "v1-location"
    shutil.rmtree(loc, ignore_errors=True)
    opts = Options(inline_threshold=200, rollup_every=4,
                   compaction=CompactionPolicy(inline_flush_bytes=400))
    ix = Engine.open(FileBlob(loc), epoch=1, writer="golden", options=opts)
    ix.fence()
    ix.register("strings", pa.string(), pa.int64())
    ix.register("floats", pa.int64(), pa.float64())
    ix.register("bytes", pa.binary(), pa.binary())
    for t in range(12):
        ix.write({
            "strings": [((f"k{t % 5}", t), t, 1), ((f"k{(t + 1) % 5}", t - 1), t, -1)],
            "floats": [((t % 3, t / 4), t, 2)],
            "bytes": [((bytes([t]), b"\x00" * t), t, 1)],
        })
        for name in ("strings", "floats", "bytes"):
            ix.seal(name, t + 1)
        if t == 6:
            ix.allow_compaction("strings", 4)
        ix.maintain()
    expected = {}
    for name in ("strings", "floats", "bytes"):
        c = ix.state.collections[name]
        expected[name] = {
            str(t): [[repr(k), repr(v), d] for (k, v), _, d in ix.snapshot(name, t).to_python()]
            for t in range(c.since, c.upper)
        }
    (HERE / "v1-expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
