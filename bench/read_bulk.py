"""W9's stage (a), the native consolidated read right after a bulk load, beside Spark's own
consolidation of the same rows: what the stage's ratio is made of.

    python -m bench.read_bulk [--rows 5000000] [--part-rows 1000000] [--rounds 3]

W9's bulk load (:func:`bench.workloads.w9_spark.prepare`: ``--rows`` records in appends of
``--part-rows``, background compaction on, the since left at 0, and the same rows as zstd
Parquet files), read in one ``local[2]`` session (:func:`bench.workloads.w9_spark.
spark_session`, default JIT) to the ``noop`` sink, one warm-up each, then ``--rounds`` rounds,
order rotated, medians:

* ``parquet``: ``spark.read.parquet`` raw (W9's floor);
* ``persist``: ``PersistTable.toDF()`` (stage (a): the layout the load left, its plan);
* ``spark_sum``: ``spark.read.parquet -> groupBy(key, value).agg(sum(diff)) -> filter(!= 0)``:
  Spark's own consolidation of the same rows, what a consolidated read without a base costs
  whoever does it.

Prints each case's seconds and records/s, the ratios to ``parquet``, the layout the read
planned (parts, base parts, runs, whether settled) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import remove, rotate, settle, timed


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import functions as F

    from bench.workloads import w9_spark
    from operators import PersistTable

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--part-rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    load0 = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="persist-read-bulk-"))
    try:
        url, parquet = w9_spark.prepare(root, a.rows, a.part_rows)
        with w9_spark.spark_session(fast_start=False) as spark:
            table = PersistTable.forPath(spark, url, "bench")
            lay = table.info().snapshot().layers
            layout = {"parts": len(table.info().snapshot().kept), "base_parts": len(lay.base),
                      "runs": len(lay.runs), "settled": lay.settled,
                      "base_rows": sum(p.rows for p in lay.base),
                      "run_rows": sum(p.rows for p in lay.runs)}

            def spark_sum() -> Any:
                return (spark.read.parquet(parquet).groupBy("key", "value")
                        .agg(F.sum("diff").alias("diff")).filter(F.col("diff") != 0))

            cases = [("parquet", lambda: spark.read.parquet(parquet)),
                     ("persist", table.toDF), ("spark_sum", spark_sum)]
            seconds: dict[str, list[float]] = {c: [] for c, _ in cases}
            for _, f in cases:  # warm-up
                f().write.format("noop").mode("overwrite").save()
            for r in range(a.rounds):
                for name, f in rotate(cases, r):
                    settle()
                    with timed() as t:
                        f().write.format("noop").mode("overwrite").save()
                    seconds[name].append(t.seconds)
    finally:
        remove(root)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(json.dumps({
        "rows": a.rows, "rounds": a.rounds, "layout": layout,
        "seconds": {k: [round(x, 3) for x in v] for k, v in seconds.items()},
        "records_per_s": {k: round(a.rows / v) for k, v in med.items()},
        "over_parquet": {k: round(med["parquet"] / v, 3) for k, v in med.items()},
        "load_before": [round(x, 1) for x in load0],
        "load_after": [round(x, 1) for x in os.getloadavg()]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
