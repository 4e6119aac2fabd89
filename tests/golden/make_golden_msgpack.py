"""Writes the golden location of msgpack-coded collections, as the persist before
``persist.msgpack`` wrote them (a class that did not map to an Arrow struct was stored as
msgpack silently; persist 0.1 stored every class so). Run once; never regenerate.

    python -m tests.golden.make_golden_msgpack

It also holds a version-1 float key whose NaNs were written and retracted with different
payloads: that persist consolidated them apart (two rows, +1 and -1), and the stored parts keep
them so; a reader must now cancel them (DESIGN §4: NaN equals NaN, any payload).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pyarrow as pa

from persist.blob.file import FileBlob
from persist.indexed.engine import Options
from persist.indexed.format import records
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.golden.records_msgpack import NAN_A, NAN_B, Event, Point
from tests.support.engine import Engine

HERE = Path(__file__).parent


def main() -> None:
    loc = HERE / "msgpack-location"
    shutil.rmtree(loc, ignore_errors=True)
    opts = Options(inline_threshold=200, rollup_every=4,
                   compaction=CompactionPolicy(inline_flush_bytes=400))
    ix = Engine.open(FileBlob(loc), epoch=1, writer="golden", options=opts)
    ix.fence()
    ix.register("events", pa.string(), Event)
    with mock.patch.object(records, "struct_type_of", return_value=None):  # as persist 0.1
        ix.register("points", Point, pa.int64())
    ix.register("nans", pa.float64(), pa.int64())
    for t in range(12):
        ix.write({
            "events": [((f"e{t % 4}", Event("click", {"n": t})), t, 1),
                       ((f"e{(t + 1) % 4}", Event("click", {"n": t - 1})), t, -1)],
            "points": [((Point(t % 3, -t), t), t, 1)],
            "nans": [((NAN_A, 1), t, 1)] if t % 2 == 0 else [((NAN_B, 1), t, -1)],
        })
        for name in ("events", "points", "nans"):
            ix.seal(name, t + 1)
        if t == 6:
            ix.allow_compaction("events", 4)
        ix.maintain()
    expected = {}
    for name in ("events", "points"):
        c = ix.state.collections[name]
        expected[name] = {
            str(t): [[repr(k), repr(v), d] for (k, v), _, d in ix.snapshot(name, t).to_python()]
            for t in range(c.since, c.upper)
        }
    (HERE / "msgpack-expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
