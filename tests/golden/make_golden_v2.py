"""Writes the golden files of storage format version 2 (records). Run once; never regenerate:
they pin what every future persist must still read.

    python -m tests.golden.make_golden_v2
"""

from __future__ import annotations

import datetime
import decimal
import json
import shutil
from pathlib import Path

import pyarrow as pa

from persist.blob.file import FileBlob
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.golden.records_v2 import KEY, Item, Order, fixed_commit, fixed_state
from tests.support.engine import Engine

HERE = Path(__file__).parent
UTC = datetime.UTC


def order(t: int) -> Order:
    return Order(t % 4, decimal.Decimal(t) / 4, datetime.datetime(2024, 1, 1, t % 24, tzinfo=UTC),
                 None if t % 3 == 0 else datetime.date(2024, 1, 1 + t % 28),
                 [Item(f"s{i}", i - t) for i in range(t % 3)],
                 score=None if t % 5 == 0 else (float("nan") if t == 7 else t / 2))


def key(t: int) -> dict[str, object]:
    return {"region": "eu" if t % 2 else "us", "ids": None if t == 5 else [t % 3, -1][: t % 3],
            "at": datetime.datetime(2024, 1, 1, tzinfo=UTC) if t % 2 else None,
            "price": decimal.Decimal("1.125") if t % 4 == 1 else None}


def main() -> None:
    (HERE / "v2-commit.bin").write_bytes(meta.encode(fixed_commit()))
    (HERE / "v2-state.bin").write_bytes(meta.encode(fixed_state()))
    loc = HERE / "v2-location"
    shutil.rmtree(loc, ignore_errors=True)
    opts = Options(inline_threshold=600, rollup_every=4,
                   compaction=CompactionPolicy(inline_flush_bytes=1200))
    ix = Engine.open(FileBlob(loc), epoch=1, writer="golden", options=opts)
    ix.fence()
    ix.register("orders", pa.int64(), Order)
    ix.register("keyed", KEY, pa.list_(pa.float32()))
    ix.register("plain", pa.string(), pa.int64())
    for t in range(12):
        ix.write({
            "orders": [((t % 5, order(t)), t, 1), ((t % 5, order(t - 1)), t, -1)],
            "keyed": [((key(t), [t / 2, None]), t, 1), ((key(t - 2), []), t, 2)],
            "plain": [((f"k{t % 3}", t), t, 1)],
        })
        for name in ("orders", "keyed", "plain"):
            ix.seal(name, t + 1)
        if t == 6:
            ix.allow_compaction("orders", 4)
        ix.maintain()
    expected = {}
    for name in ("orders", "keyed", "plain"):
        c = ix.state.collections[name]
        expected[name] = {
            str(t): [[repr(k), repr(v), d] for (k, v), _, d in ix.snapshot(name, t).to_python()]
            for t in range(c.since, c.upper)
        }
    (HERE / "v2-expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
