"""Writes the golden files of storage format version 4 (Parquet parts). Run once; never
regenerate: they pin what every future persist must still read.

    python -m tests.golden.make_golden_v4
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

from persist.blob.file import FileBlob
from persist.errors import SchemaMismatch
from persist.indexed.engine import Options
from persist.indexed.format import evolve, meta
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.golden.records_v4 import (
    EVOLVED0,
    EVOLVED1,
    READING,
    fixed_commit,
    fixed_state,
    plain,
)
from tests.support.engine import Engine

HERE = Path(__file__).parent
#: ``far``'s times: at and above 2**63 (a uint64 time column in the file).
FAR = 2**64 - 8


def expected_of(ix: Engine) -> dict[str, Any]:
    """Every collection's consolidated snapshots at every readable time, as every schema
    version reads them (:func:`records_v4.plain` values; a version that cannot hold a record:
    the error's type)."""
    out: dict[str, Any] = {}
    for name, c in sorted(ix.state.collections.items()):
        out[name] = {}
        for v in range(evolve.version(c) + 1):
            by_time: dict[str, Any] = {}
            for t in range(c.since, c.upper):
                try:
                    got = ix.snapshot(name, t, schema_id=v).to_arrow()
                except SchemaMismatch:
                    by_time[str(t)] = "SchemaMismatch"
                    continue
                by_time[str(t)] = {col: plain(got.column(col)) for col in ("key", "value",
                                                                            "diff")}
            out[name][str(v)] = by_time
    return out


def reading(i: int) -> dict[str, Any]:
    """The value of ``readings`` number ``i``: NaN, -0.0, nulls, a seconds timestamp that fits
    milliseconds and (from 20 on) one that does not."""
    return {"level": [math.nan, -0.0, 0.0, 1.5, None][i % 5],
            "amount": decimal.Decimal(f"{i}.{i % 10}"),
            "at": (datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i)
                   if i < 20 else None),
            "tags": [f"t{j}" for j in range(i % 3)],
            "probe": None if i % 4 == 0 else {"serial": 2**32 - 1 - i,
                                              "label": None if i % 2 else f"p{i}"}}


def main() -> None:
    (HERE / "v4-commit.bin").write_bytes(meta.encode(fixed_commit()))
    (HERE / "v4-state.bin").write_bytes(meta.encode(fixed_state()))
    loc = HERE / "v4-location"
    shutil.rmtree(loc, ignore_errors=True)
    # NB: small record batches (several row groups per part), stats on, some parts inline
    opts = Options(inline_threshold=1000, rollup_every=4, stats_bytes=1024, batch_rows=4,
                   compaction=CompactionPolicy(fanin=3, inline_flush_bytes=3000))
    ix = Engine.open(FileBlob(loc), epoch=1, writer="golden", options=opts)
    ix.fence()
    ix.register("plain", pa.string(), pa.int64())
    ix.register("readings", pa.int64(), READING)
    ix.register("evolved", pa.int64(), EVOLVED0)
    ix.register("far", pa.string(), pa.int64())
    for t in range(8):
        rows = 40 if t % 2 else 3  # big ones get a Parquet part of their own
        ix.write({
            "plain": [((f"k{(t * 7 + i) % 23}", i), t, 1 if i % 5 else -1) for i in range(rows)],
            "readings": [((i % 6, reading(t * 3 + i)), t, 1) for i in range(rows // 2 + 1)],
            "evolved": [((i, {"a": t * i}), t, 1) for i in range(rows)],
        })
        for name in ("plain", "readings", "evolved"):
            ix.seal(name, t + 1)
        ix.maintain()
        if t == 4:
            ix.evolve_schema("evolved", value_type=EVOLVED1)
            ix.write({"evolved": [((i, {"a": 2**40 + i, "b": f"b{i}"}), 5, 1)
                                  for i in range(30)]})
    # a Parquet part whose times are beyond 2**63 (stored as uint64), another at seconds that
    # do not fit in milliseconds
    beyond = ix.normalize("readings", [((99, reading(99)), 8, 1), ((98, reading(98)), 8, 1)])
    value = beyond.column("value").combine_chunks()
    at = pa.array([2**62, -(2**62)], pa.timestamp("s"))  # beyond milliseconds
    fields = [value.field(i) if f.name != "at" else at for i, f in enumerate(READING)]
    beyond = beyond.set_column(1, beyond.schema.field(1), pa.StructArray.from_arrays(
        fields, fields=list(READING)))
    ix.write({"far": [((f"f{i}", i), FAR + i % 3, 1) for i in range(30)],
              "readings": beyond})
    ix.seal("far", FAR + 4)
    ix.allow_compaction("far", FAR + 2)
    ix.seal("readings", 9)
    ix.allow_compaction("plain", 4)
    ix.maintain()
    # an inline part (an Arrow stream, as in every format) beside the Parquet parts
    ix.write({"plain": [(("k0", 1), 8, 1), (("zz", 2), 8, 1)]})
    ix.seal("plain", 9)
    (HERE / "v4-expected.json").write_text(json.dumps(expected_of(ix), indent=1,
                                                      sort_keys=True))


if __name__ == "__main__":
    main()
