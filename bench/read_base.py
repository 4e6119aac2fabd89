"""Issue 28 item 2: the native consolidated read of a compacted base with fresh updates on
top, against ``spark.read.parquet`` raw of the same rows: by default after compaction's marks
step (since moved past the updates, ``maintain()``: the base's files read once minus their
marks, the delta raw, ``FileRead.marks``); with ``--no-marks`` the updates left as a run,
applied by key (``FileRead.runs``), against the plan that sums every row by key range
(``RUNS_SHARE`` below 0).

    python -m bench.read_base [--rows 5000000] [--share 100] [--rounds 3] [--no-marks]

W9's stage (c) collection: ``rows`` random int64 keys in appends of 1 M, compacted into the
base (since at the last time, ``maintain()`` until idle), then ``rows / share`` retractions of
existing rows and as many new rows, appended and not merged. Each round reads the three cases
in a rotated order into Spark's ``noop`` sink; prints the medians of wall time and of the JVM's
CPU (user + system, with its Python workers) and each ratio ``Parquet / case``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from bench.common import make_batch
from bench.workloads.w9_spark import _jvm_cpu, prepare, spark_session


def stage_c(root: Path, rows: int, share: int, *, marks: bool = False
            ) -> tuple[str, Path, pa.Table, int]:
    """W9's stage (c) collection under ``root``: ``rows`` random keys in appends of 1 M
    compacted into the base, then ``rows / share`` retractions and as many new rows appended
    at time ``last + 1`` and not merged; ``marks``: then since moved to ``last + 1`` and
    ``maintain()`` until idle, which takes compaction's marks step (DESIGN.md §8: the updates
    and the base rows of their keys summed into a delta, those base rows marked). Returns the
    location's URL, a directory of the same rows as Parquet files (for
    ``spark.read.parquet``), the updates and ``last``."""
    import persist

    part = 1_000_000
    url, parquet = prepare(root, rows, part)
    last = (rows + part - 1) // part - 1
    with persist.open(url, options=persist.Options(background_compaction=False)) as client:
        w, _ = client.create_or_load("bench", key_type=pa.int64(), value_type=pa.int64())
        w.allow_compaction(last).result()
        while client.maintain():
            pass
        fresh = max(1, rows // share)
        old = make_batch(9000, min(part, rows), time_lo=0).slice(0, fresh)
        new = make_batch(7777, fresh, time_lo=last + 1)
        gone = pa.table({"key": old["key"], "value": old["value"],
                         "time": pa.array([last + 1] * fresh, pa.int64()),
                         "diff": pa.array([-1] * fresh, pa.int64())}, schema=new.schema)
        updates = pa.concat_tables([gone, new])
        w.append(updates, upper=last + 2).result()
        if marks:
            w.allow_compaction(last + 1).result()
            started, cpu = time.perf_counter(), time.process_time()
            steps = 0
            while client.maintain():
                steps += 1
            print(f"marks step: {steps} maintain() call(s) True, "
                  f"{time.perf_counter() - started:.2f} s wall, "
                  f"{time.process_time() - cpu:.2f} s CPU")
    updated = root / "parquet-updated"
    updated.mkdir()
    for f in sorted(Path(parquet).iterdir()):
        (updated / f.name).symlink_to(f)
    pq.write_table(updates, updated / "part-updates.parquet", compression="zstd")
    return url, updated, updates, last


def run(factory: Any) -> tuple[float, float]:
    """Wall and JVM CPU seconds of writing ``factory()``'s DataFrame to Spark's noop sink."""
    c, t = _jvm_cpu(), time.perf_counter()
    factory().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t, _jvm_cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--share", type=int, default=100, help="updates: rows / share of each kind")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-marks", action="store_true",
                    help="leave the updates unmerged (the layered read against the sum)")
    a = ap.parse_args()
    import persist
    import persist.distributed.native as native

    with tempfile.TemporaryDirectory(prefix="read-base-") as tmp:
        root = Path(tmp)
        url, updated, _, _ = stage_c(root, a.rows, a.share, marks=not a.no_marks)
        lay = persist.distributed.describe(url, "bench").snapshot().layers
        print(f"base: {len(lay.base)} parts, {lay.base_rows:,} rows; runs: {len(lay.runs)} "
              f"parts, {lay.run_rows:,} rows; layered: {persist.distributed.layered(lay)}; "
              f"a paired delta: {lay.delta is not None}")
        with spark_session(fast_start=False) as spark:
            from operators import PersistTable

            table = PersistTable.forPath(spark, url, "bench")
            share = native.RUNS_SHARE

            def summed() -> Any:
                native.RUNS_SHARE = -1.0
                try:
                    return table.toDF()
                finally:
                    native.RUNS_SHARE = share

            cases = ({"parquet": lambda: spark.read.parquet(str(updated)),
                      "summed": summed, "layered": table.toDF} if a.no_marks else
                     {"parquet": lambda: spark.read.parquet(str(updated)),
                      "marks": table.toDF})

            for factory in cases.values():
                run(factory)
            # NB: the persist read checked once against the client's snapshot (row count and
            # the diffs' sum): a fast wrong answer is no answer
            with persist.open(url, read_only=True) as client:
                _, r = client.create_or_load("bench", key_type=pa.int64(),
                                             value_type=pa.int64())
                want = r.snapshot(r.upper - 1).to_arrow()
            got = table.toDF().selectExpr("count(*)", "sum(diff)").collect()[0]
            if (got[0], got[1]) != (len(want), pa.compute.sum(want["diff"]).as_py()):
                raise SystemExit(f"toDF() read {tuple(got)} rows/diffs, the client "
                                 f"{len(want)}")
            res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
            names = list(cases)
            loads: list[float] = []
            for r in range(a.rounds):
                m = r % len(names)
                for k in names[m:] + names[:m]:
                    res[k].append(run(cases[k]))
                loads.append(os.getloadavg()[0])
            for j, what in ((0, "wall s"), (1, "JVM CPU s")):
                med = {k: statistics.median(x[j] for x in v) for k, v in res.items()}
                print(what, {k: round(v, 2) for k, v in med.items()}, "Parquet / case:",
                      {k: round(med["parquet"] / v, 3) for k, v in med.items()})
            print("per round, Parquet / case by wall:",
                  [{k: round(res["parquet"][r][0] / v[r][0], 2) for k, v in res.items()}
                   for r in range(a.rounds)], "load average after each round:",
                  [round(x, 1) for x in loads])


if __name__ == "__main__":
    main()
