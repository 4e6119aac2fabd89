"""Distributed compaction (``PersistTable.optimize()``) against ``Client.maintain()`` and Spark's
own aggregate-sort-write pipeline, over the same rows.

    python -m bench.compaction_optimize [--appends 5] [--rows 1000000] [--rounds 3] [--daemon]

W9's shape: ``--appends`` appends of ``--rows`` random int64 keys (``key, value`` int64, one
time per append), background compaction off, since advanced to the last time. Each round (after one
warm-up round, not counted), in this order, each on a fresh copy of the same location (a copy of its directory):

* ``maintain``: ``Client.maintain()`` until idle, its merge in this process (no merge worker:
  ``merge_worker_rows=None``; wall and this process's CPU);
* ``optimize``: ``PersistTable.forPath(spark, url, "w9").optimize(partitions=2)`` on a
  ``local[2]`` SparkSession (wall; the merge runs in Spark's Python workers, so this process's
  CPU is only the driver's plan and commit). It runs at least 65 s after the round before's
  last Python task (waiting if the rest of the round took less), so Spark has reaped its idle
  Python workers (after 60 s) and forks fresh ones, which import persist and pyarrow (with
  ``--daemon`` they are forked from :mod:`operators.daemon`, which imported them already):
  what a call to ``optimize()`` costs in a session that ran no Python task in the last
  minute;
* ``optimize_warm``: the same again right after (on a fresh copy), in the Python workers the
  first one left alive: what a call costs with live workers;
* ``spark``: the same rows as zstd Parquet files (one per append, written by pyarrow
  beforehand), ``spark.read.parquet -> groupBy(key, value).sum(diff) -> filter(sum != 0) ->
  sortWithinPartitions(key, value) -> write.parquet(zstd)`` (wall).

Prints the medians and the ratios ``spark / optimize`` (target >= 3) and ``optimize /
maintain`` (target <= 2), both also for ``optimize_warm``, and the layouts the two persist
runs leave.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import persist
from bench.compaction_base import _layout, _table

#: Seconds without a Python task before ``optimize`` (Spark reaps idle Python workers after 60).
IDLE_S = 65.0


def _build(root: Path, appends: int, rows: int) -> tuple[Path, Path]:
    """The location (``root/loc``) and the same rows as Parquet files (``root/parquet``)."""
    rng = np.random.default_rng(7)
    opts = persist.Options(background_compaction=False, rollup_every=1 << 20,
                           gc_grace_seconds=3600.0)
    loc, files = root / "loc", root / "parquet"
    files.mkdir(parents=True)
    with persist.open(loc, options=opts) as client:
        write, _ = client.create_or_load("w9", key_type=pa.int64(), value_type=pa.int64())
        for t in range(appends):
            keys = rng.integers(-(1 << 62), 1 << 62, rows, dtype=np.int64)
            table = _table(keys, rng.integers(0, 1 << 40, rows), t, np.ones(rows, np.int64))
            write.append(table, upper=t + 1).result()
            pq.write_table(table.set_column(2, "time", table.column("time").cast(pa.int64())),
                           files / f"{t}.parquet", compression="zstd")
        write.allow_compaction(appends - 1).result()
    return loc, files


def _maintain(loc: Path) -> tuple[float, float, dict[str, Any]]:
    # NB: the merge in this process (merge_worker_rows=None): maintain() in one process, as
    # the target compares, and its CPU in this process's process_time()
    opts = persist.Options(background_compaction=False, rollup_every=1 << 20,
                           gc_grace_seconds=3600.0, merge_worker_rows=None)
    with persist.open(loc, options=opts) as client:
        w0, c0 = time.perf_counter(), time.process_time()
        while client.maintain():
            pass
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        return wall, cpu, _layout(client, "w9")


def _optimize(spark: Any, loc: Path) -> tuple[float, float, dict[str, Any]]:
    from operators import PersistTable

    w0, c0 = time.perf_counter(), time.process_time()
    done = PersistTable.forPath(spark, f"file://{loc}", "w9").optimize(partitions=2)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    assert done is not None
    with persist.open(loc, options=persist.Options(background_compaction=False)) as client:
        return wall, cpu, _layout(client, "w9")


def _spark(spark: Any, files: Path, out: Path) -> float:
    from pyspark.sql import functions as F

    w0 = time.perf_counter()
    (spark.read.parquet(str(files))
     .groupBy("key", "value").agg(F.sum("diff").alias("diff"))
     .filter(F.col("diff") != 0)
     .sortWithinPartitions("key", "value")
     .write.option("compression", "zstd").mode("overwrite").parquet(str(out)))
    return time.perf_counter() - w0


#: What :func:`measure` times, in the order of a round.
CASES = ("maintain", "optimize", "optimize_warm", "spark")


def measure(spark: Any, root: Path, loc: Path, files: Path, rounds: int, *,
            idle_s: float = IDLE_S, log: Callable[[str], None] | None = None,
            ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """One warm-up round (not counted), then ``rounds`` rounds of :data:`CASES` in that order,
    each on a fresh copy of ``loc`` (under ``root``; Spark's pipeline reads ``files``), the
    fresh-worker ``optimize`` held until ``idle_s`` after the round before's last Python task.
    Returns the seconds of each case (``maintain_cpu``: this process's CPU in ``maintain()``;
    ``optimize_driver_cpu``: the driver's in ``optimize()``) and the layouts the two persist
    runs left."""
    times: dict[str, list[float]] = {"maintain": [], "maintain_cpu": [], "optimize": [],
                                     "optimize_driver_cpu": [], "optimize_warm": [],
                                     "spark": []}
    layouts: dict[str, Any] = {}
    last_python = time.monotonic()
    # NB: round 0 is a warm-up, not counted: Spark's first job starts its Python workers
    # (which import persist and pyarrow), and the JVM compiles as it goes
    for r in range(rounds + 1):
        if r == 1:
            times = {k: [] for k in times}
        for what in CASES:
            if log is not None:
                log(f"compaction round {r}/{rounds} (0: warm-up): {what}")
            copy = root / f"{what}-{r}"
            if what == "spark":
                times["spark"].append(_spark(spark, files, copy))
                shutil.rmtree(copy, ignore_errors=True)
                continue
            shutil.copytree(loc, copy)
            if what == "optimize":
                # NB: Spark reaps Python workers idle for 60 s: this call gets fresh ones
                time.sleep(max(0.0, idle_s - (time.monotonic() - last_python)))
            if what == "maintain":
                wall, cpu, layouts["maintain"] = _maintain(copy)
                times["maintain_cpu"].append(cpu)
            elif what == "optimize":
                wall, cpu, layouts["optimize"] = _optimize(spark, copy)
                times["optimize_driver_cpu"].append(cpu)
            else:
                wall, _, _ = _optimize(spark, copy)
                last_python = time.monotonic()
            times[what].append(wall)
            shutil.rmtree(copy)
    return times, layouts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--daemon", action="store_true",
                    help="the session forks its Python workers from operators.daemon")
    args = ap.parse_args()
    # NB: Spark's Python workers run the tasks: this Python, with this checkout importable
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))
    import operators
    from tests.spark.support import session_builder

    root = Path(tempfile.mkdtemp())
    loc, files = _build(root, args.appends, args.rows)
    builder = session_builder("bench-optimize")
    if args.daemon:
        builder = builder.config("spark.python.daemon.module", "operators.daemon")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    operators.register(spark)
    try:
        times, layouts = measure(spark, root, loc, files, args.rounds)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    print(json.dumps({"rows": args.appends * args.rows, "rounds": args.rounds,
                      "samples_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
                      "median_s": med,
                      "spark_over_optimize": round(med["spark"] / med["optimize"], 2),
                      "optimize_over_maintain": round(med["optimize"] / med["maintain"], 2),
                      "spark_over_optimize_warm": round(med["spark"] / med["optimize_warm"], 2),
                      "optimize_warm_over_maintain": round(
                          med["optimize_warm"] / med["maintain"], 2),
                      "load_average": [round(x, 1) for x in os.getloadavg()],
                      "layouts": layouts}, indent=1))


if __name__ == "__main__":
    main()
