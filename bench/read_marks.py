"""Issue 28 read target (c), the experiment: can Spark read a compacted base *once*, minus the
positions of the base rows the runs supersede ("marks", as Paimon's deletion vectors), unioned
with a consolidated *delta* run read raw, at >= 0.6x ``spark.read.parquet`` raw?

    python -m bench.read_marks [--rows 5000000] [--share 100] [--rounds 3]

W9's stage (c) collection (as ``bench.read_base``): ``rows`` random int64 keys in appends of
1 M, compacted into the base, then ``rows / share`` retractions of existing rows and as many
new rows, appended and not merged. The marks and the delta are computed here, before timing,
as a compaction step would write them, by ``persist.indexed.read.marks.find`` over the base
files' rows and the runs' rows: per base file, the row positions whose key a run holds; the
delta, the consolidated rows of those keys, one Parquet file. Checked once per plan: its rows'
count and an order-free hash sum equal the client's consolidated read.

Each round reads every case in a rotated order into Spark's ``noop`` sink (wall time includes
building the plan on the driver); prints the medians of wall time and of the JVM's CPU (user +
system, with its Python workers), each ratio ``Parquet / case``, and the load average.

Cases:

* ``parquet``: ``spark.read.parquet`` of the bulk load's files plus one file of the updates.
* ``layered``: today's plan (``PersistTable.toDF()``: anti + semi joins against the runs' keys).
* ``floor``: the base's files read with ``_metadata.row_index`` selected and a filter on it
  that keeps every row, plus the delta: what any plan that filters on positions pays (not an
  answer: the marked rows are kept).
* ``floor_files``: the same, one scan of each base file, unioned.
* ``anti``: one scan of each base file, a broadcast ``left_anti`` join on
  ``_metadata.row_index`` against that file's marks (a DataFrame from Arrow), unioned.
* ``bitmap``: one scan of all base files (``operators.marks.unmarked``); each file's marks as
  a bitmap (an ``array<bigint>`` literal of ``ceil(rows / 64)`` words, handed to the JVM as
  one byte array) picked by the file's name, and the filter ``getbit(element_at(CASE
  _metadata.file_name WHEN <name> THEN <its words> ... END, row_index / 64 + 1),
  row_index % 64) = 0`` (a file with no words: kept).
* ``bitmap_files``: the same filter, one scan of each base file with its own literal, unioned.

Measured alongside (not cases: the plans cost seconds on the driver before Spark reads a row):
``_metadata.row_index NOT IN (<its marks>)`` per file as a SQL string (Spark's ``InSet``) took
14-25 s to build for 50 k positions, and the same list through ``Column.isin`` one py4j call
per literal.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.read_base import run, stage_c
from bench.workloads.w9_spark import spark_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--share", type=int, default=100, help="updates: rows / share of each kind")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="parquet,layered,floor,anti,bitmap,bitmap_files")
    a = ap.parse_args()
    import persist
    import persist.distributed.native as native
    from persist.indexed.read import marks as marks_mod

    with tempfile.TemporaryDirectory(prefix="read-marks-") as tmp:
        root = Path(tmp)
        url, updated, updates, last = stage_c(root, a.rows, a.share)
        as_of = last + 1
        with persist.open(url, read_only=True) as client:
            _, r = client.create_or_load("bench", key_type=pa.int64(), value_type=pa.int64())
            contents = r.snapshot(as_of).to_arrow()

        # what a compaction step would write: marks per base file, and the delta
        scan = persist.distributed.describe(url, "bench").snapshot(as_of)
        # NB: the layered piece names the base's files; planned with RUNS_SHARE at 1 so
        # that runs beyond today's 2% (--share below 50) still split off a base
        share, native.RUNS_SHARE = native.RUNS_SHARE, 1.0
        try:
            plan = persist.distributed.plan_native(scan)
        finally:
            native.RUNS_SHARE = share
        (piece,) = plan.files
        assert piece.runs is not None, "not a layered plan"
        # the engine's form of rows (uint64 times, as persist's readers return them)
        engine = pa.schema([pa.field(f.name, pa.uint64() if f.name == "time" else f.type)
                            for f in updates.schema])
        t = time.perf_counter()
        rows = [pq.read_table(u.removeprefix("file://")).cast(engine) for u in piece.urls]
        found, delta = marks_mod.find(rows, updates.cast(engine), as_of)
        t_marks = time.perf_counter() - t
        marks: dict[str, np.ndarray] = dict(zip(piece.urls, found, strict=True))
        delta = delta.cast(updates.schema)
        delta_file = root / "delta.parquet"
        pq.write_table(delta, delta_file, compression="zstd")
        print(f"base: {len(piece.urls)} files; marks: "
              f"{sum(len(m) for m in marks.values()):,} positions (found in {t_marks:.2f} s "
              f"by persist.indexed.read.marks.find, reading the files); delta: "
              f"{delta.num_rows:,} rows; answer: {contents.num_rows:,} rows")

        with spark_session(fast_start=False) as spark:
            from pyspark.sql import functions as F

            from operators import PersistTable
            from operators.marks import unmarked

            table = PersistTable.forPath(spark, url, "bench")
            schema = "key long, value long, time long, diff long"

            def base(urls: list[str]) -> Any:
                return spark.read.schema(schema).parquet(*urls)

            def with_delta(df: Any) -> Any:
                d = spark.read.schema(schema).parquet(str(delta_file))
                return (df.select("key", "value", F.lit(as_of).cast("long").alias("time"), "diff")
                        .unionByName(d.select("key", "value", F.lit(as_of).cast("long").alias("time"),
                                              "diff")))

            from pyspark.sql.classic.column import Column

            jvm = spark._jvm
            rows_of = {u: pq.ParquetFile(u.removeprefix("file://")).metadata.num_rows
                       for u in piece.urls}
            pos = F.col("_metadata.row_index")

            def words(u: str) -> np.ndarray:
                return marks_mod.bitmap(marks[u], rows_of[u])

            def longs(a: np.ndarray) -> Any:
                # NB: one byte array over py4j, made a long[] in the JVM: an array literal
                # built by pyspark's lit() is one py4j call per element
                bb = jvm.java.nio.ByteBuffer.wrap(bytearray(a.astype(">i8").tobytes()))
                lb = jvm.java.nio.LongBuffer.allocate(len(a))
                lb.put(bb.asLongBuffer())
                return Column(jvm.org.apache.spark.sql.functions.lit(lb.array()))

            def union(dfs: list[Any]) -> Any:
                return with_delta(functools.reduce(lambda x, y: x.unionByName(y), dfs))

            def floor() -> Any:
                return with_delta(base(list(piece.urls)).where(pos >= 0))

            def floor_files() -> Any:
                return union([base([u]).where(pos >= 0) for u in piece.urls])

            def bitmap() -> Any:
                return with_delta(unmarked(spark, base(list(piece.urls)),
                                           {u: words(u) for u in piece.urls}))

            def anti() -> Any:
                dfs = []
                for u in piece.urls:
                    m = F.broadcast(spark.createDataFrame(pa.table({"_i": marks[u]})))
                    df = base([u]).select("*", pos.alias("_pos"))
                    dfs.append(df.join(m, df["_pos"] == m["_i"], "left_anti").drop("_pos"))
                return union(dfs)

            def bitmap_files() -> Any:
                dfs = []
                for u in piece.urls:
                    word = F.element_at(longs(words(u)), F.shiftright(pos, 6).cast("int") + 1)
                    dfs.append(base([u]).where(
                        F.getbit(word, pos.bitwiseAND(63).cast("int")) == 0))
                return union(dfs)

            all_cases = {"parquet": lambda: spark.read.parquet(str(updated)),
                         "layered": table.toDF, "floor": floor, "anti": anti,
                         "bitmap": bitmap, "bitmap_files": bitmap_files,
                         "floor_files": floor_files}
            cases = {k: all_cases[k] for k in a.cases.split(",")}

            def digest(df: Any) -> tuple[int, int]:
                got = df.select(F.count("*"), F.sum(
                    F.xxhash64("key", "value", F.col("time").cast("long"), "diff") % 1_000_003)).first()
                return int(got[0]), int(got[1])

            want = digest(table.toDF())
            assert want[0] == contents.num_rows, (want, contents.num_rows)
            for k in ("anti", "bitmap", "bitmap_files"):
                if k in cases:
                    assert digest(cases[k]()) == want, k
            print("anti and the bitmap cases checked against the layered read (row count, hash sum)")

            for factory in cases.values():
                run(factory)
            res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
            order = list(cases)
            loads = []
            for r_ in range(a.rounds):
                loads.append(os.getloadavg()[0])
                n = r_ % len(order)
                for k in order[n:] + order[:n]:
                    res[k].append(run(cases[k]))
            loads.append(os.getloadavg()[0])
            print(f"load (1 min) during the rounds: {min(loads):.1f}-{max(loads):.1f}")
            for j, what in ((0, "wall s"), (1, "JVM CPU s")):
                med = {k: statistics.median(x[j] for x in v) for k, v in res.items()}
                print(what, {k: round(v, 2) for k, v in med.items()})
                print("  Parquet / case:", {k: round(med["parquet"] / v, 3)
                                             for k, v in med.items()})


if __name__ == "__main__":
    main()
