"""Writes the golden files of storage format version 3 (schema evolution). Run once; never
regenerate: they pin what every future persist must still read.

    python -m tests.golden.make_golden_v3
"""

from __future__ import annotations

import decimal
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

from persist.blob.file import FileBlob
from persist.errors import SchemaMismatch
from persist.indexed.engine import Options, Txn
from persist.indexed.format import evolve, meta
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.golden.records_v3 import (
    KEY0,
    KEY1,
    Item,
    Item1,
    Order0,
    Order1,
    Order2,
    fixed_commit,
    fixed_state,
)
from tests.support.engine import Engine

HERE = Path(__file__).parent


def expected_of(ix: Engine) -> dict[str, Any]:
    """Every collection's snapshots at every readable time, as every schema version reads
    them (a version that cannot hold a record: the error's type)."""
    out: dict[str, Any] = {}
    for name, c in sorted(ix.state.collections.items()):
        out[name] = {}
        for v in range(evolve.version(c) + 1):
            by_time: dict[str, Any] = {}
            for t in range(c.since, c.upper):
                try:
                    got = ix.snapshot(name, t, schema_id=v).to_python()
                except SchemaMismatch:
                    by_time[str(t)] = "SchemaMismatch"
                    continue
                by_time[str(t)] = [[repr(k), repr(val), d] for (k, val), _, d in got]
            out[name][str(v)] = by_time
    return out


def main() -> None:
    (HERE / "v3-commit.bin").write_bytes(meta.encode(fixed_commit()))
    (HERE / "v3-state.bin").write_bytes(meta.encode(fixed_state()))
    loc = HERE / "v3-location"
    shutil.rmtree(loc, ignore_errors=True)
    # NB: no part stats (stats_bytes=0): this location pins evolution, and parts without
    # stats keep it independent of how stats are stored.
    opts = Options(inline_threshold=600, rollup_every=4, stats_bytes=0,
                   compaction=CompactionPolicy(fanin=3, inline_flush_bytes=1200))
    ix = Engine.open(FileBlob(loc), epoch=1, writer="golden", options=opts)
    ix.fence()
    ix.register("orders", pa.int64(), Order0)
    ix.register("keyed", KEY0, pa.int64())
    ix.register("plain", pa.string(), pa.int64())

    def write(t: int, version: int) -> None:
        if version == 0:
            order: Any = Order0(t, f"n{t}" if t % 2 else None, [Item(f"s{t}", t - 3)])
            old: Any = Order0(t - 1, None, [])
        elif version == 1:
            # NB: at time 8 an id and a quantity that version 0 cannot hold
            order = Order1(2**33 if t == 8 else t, decimal.Decimal(t) / 4,
                           None if t % 3 else f"n{t}",
                           [Item1("s", 70_000 if t == 8 else t, None if t % 2 else "x")])
            old = Order1(t - 1, None, None, [])
        else:
            order = Order2(t, decimal.Decimal("1.50"), [Item1("z", t, "y")])
            old = Order2(t - 2, None, [])
        key = {"region": "eu" if t % 2 else "us"}
        if evolve.version(ix.state.collections["keyed"]) == 1:
            key["zone"] = None if t % 3 else t
        ix.write({"orders": [((t % 4, order), t, 1), ((t % 4, old), t, -1)],
                  "keyed": [((key, t), t, 1)],
                  "plain": [((f"k{t % 3}", t), t, 1)]})
        for name in ("orders", "keyed", "plain"):
            ix.seal(name, t + 1)
        ix.maintain()

    for t in range(4):
        write(t, 0)
    ix.evolve_schema("orders", value_type=Order1)
    for t in range(4, 7):
        write(t, 1)
    ix.evolve_schema("keyed", key_type=KEY1)
    # an old-schema writer (version 0 of orders) after the evolution: migrated on commit
    txn = Txn(ix.state)
    txn.stage_write("orders", ix.normalize("orders", [((9, Order0(9, "old", [])), 7, 1)],
                                           schema_id=0), schema_id=0)
    ix.commit(txn)
    for t in range(7, 9):
        write(t, 1)
    ix.allow_compaction("orders", 3)
    ix.evolve_schema("orders", value_type=Order2)
    for t in range(9, 12):
        write(t, 2)
    (HERE / "v3-expected.json").write_text(json.dumps(expected_of(ix), indent=1,
                                                      sort_keys=True))


if __name__ == "__main__":
    main()
