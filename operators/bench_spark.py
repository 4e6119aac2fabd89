"""Measures the persist Spark source against Parquet, and seal -> micro-batch latency.

    .venv/bin/python -m operators.bench_spark [--rows 10000000] [--dir /tmp/persist-bench]

1. Throughput: the same ``rows`` records (int64 key and value, int64 time and diff; one part or
   file per million rows) are read in one SparkSession through ``spark.read.parquet`` and
   through the persist source (``mode=raw`` and ``mode=consolidated``), each fully
   materialized by the ``noop`` sink; the best of ``--repeat`` runs is reported as rows/s.
2. Latency: a streaming query (default trigger, ``foreachBatch``) reads a collection while
   this process seals one small append every ``--gap`` seconds; for each seal, the time from
   ``append(...).result()`` returning (durable, sealed) to the ``foreachBatch`` call holding
   that time returning, and to Spark's commit log entry for that batch being written (its
   file's mtime: the micro-batch is then committed).

Prints a Markdown table. Numbers depend on the machine and its load: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import persist

CHUNK = 1_000_000


def _chunk(i: int, n: int) -> pa.Table:
    keys = np.arange(i * CHUNK, i * CHUNK + n, dtype=np.int64)
    return pa.table({
        "key": keys,
        "value": keys * 7 % 1_000_003,
        "time": np.full(n, i, dtype=np.int64),
        "diff": np.ones(n, dtype=np.int64),
    })


def prepare(root: Path, rows: int) -> tuple[str, str]:
    """Writes ``rows`` records to a persist location and to a Parquet directory."""
    shutil.rmtree(root, ignore_errors=True)
    url, parquet = f"file://{root}/persist", root / "parquet"
    parquet.mkdir(parents=True)
    with persist.open(url) as client:
        w, _ = client.create_or_load("bench", key_type=pa.int64(), value_type=pa.int64())
        for i in range((rows + CHUNK - 1) // CHUNK):
            t = _chunk(i, min(CHUNK, rows - i * CHUNK))
            w.append(t, upper=i + 1).result()
            pq.write_table(t, parquet / f"part-{i:05d}.parquet", compression="zstd")
    return url, str(parquet)


def session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = repo + os.pathsep + os.environ.get("PYTHONPATH", "")
    from pyspark.sql import SparkSession

    import operators

    spark = (
        SparkSession.builder.master("local[2]").appName("persist-bench")
        .config("spark.driver.memory", "4g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    operators.register(spark)
    return spark


def best_rate(df_factory: Any, rows: int, repeat: int) -> tuple[float, float]:
    """(best rows/s, its seconds) of fully materializing the DataFrame ``repeat`` times."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        df_factory().write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - started)
    return rows / best, best


def throughput(spark: Any, url: str, parquet: str, rows: int, repeat: int) -> list[tuple[str, float, float]]:
    def persist_df(**opts: Any) -> Any:
        r = spark.read.format("persist").option("collection", "bench")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load(url)

    cases = [
        ("spark.read.parquet", lambda: spark.read.parquet(parquet)),
        ("persist, mode=raw", lambda: persist_df(mode="raw")),
        ("persist, mode=consolidated (default buckets)", lambda: persist_df()),
        ("persist, mode=consolidated, numPartitions=2", lambda: persist_df(numPartitions=2)),
    ]
    best_rate(cases[0][1], rows, 1)  # warm the JVM (JIT, codegen) and the Python workers
    best_rate(cases[1][1], rows, 1)
    out = []
    for name, factory in cases:
        rate, secs = best_rate(factory, rows, repeat)
        out.append((name, rate, secs))
        print(f"{name}: {rate / 1e6:.2f} M rows/s ({secs:.2f} s)", file=sys.stderr)
    return out


def latency(spark: Any, root: Path, seals: int, gap: float) -> tuple[list[float], list[float]]:
    """Seconds from each seal to (its micro-batch processed, its micro-batch committed)."""
    url, ckpt = f"file://{root}/stream", root / "ckpt"
    sealed: dict[int, float] = {}
    batch_of: dict[int, int] = {}
    processed: dict[int, float] = {}
    lock = threading.Lock()

    def on_batch(df: Any, batch_id: int) -> None:
        # NB: one Spark job (toArrow), no shuffle: the callback should cost little next to
        # the micro-batch itself
        times = set(df.toArrow().column("time").to_pylist())
        now = time.time()
        with lock:
            for t in times:
                batch_of.setdefault(int(t), batch_id)
                processed.setdefault(int(t), now)

    with persist.open(url) as client:
        w, _ = client.create_or_load("s", key_type=pa.int64(), value_type=pa.int64())
        w.append(_chunk(0, 100), upper=1).result()
        q = (spark.readStream.format("persist").option("collection", "s").load(url)
             .writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", str(ckpt)).start())
        deadline = time.monotonic() + 120
        while 0 not in processed and time.monotonic() < deadline:
            time.sleep(0.05)
        for t in range(1, seals + 1):
            time.sleep(gap)
            table = _chunk(t, 100).set_column(2, "time", pa.array([t] * 100, pa.int64()))
            w.append(table, upper=t + 1).result()
            sealed[t] = time.time()
        while len(processed) < seals + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # let the last commit log entry land
        q.stop()
    done = [t for t in range(1, seals + 1) if t in processed]
    committed = [(ckpt / "commits" / str(batch_of[t])).stat().st_mtime - sealed[t]
                 for t in done if (ckpt / "commits" / str(batch_of[t])).exists()]
    return [processed[t] - sealed[t] for t in done], committed


def _summary(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
    return (f"p50 {statistics.median(xs) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
            f"max {xs[-1] * 1000:.0f} ms")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/persist-bench"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seals", type=int, default=20)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between seals")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    url, parquet = prepare(args.dir, args.rows)
    print(f"wrote {args.rows:,} records twice in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    spark = session()
    try:
        rates = throughput(spark, url, parquet, args.rows, args.repeat)
        lat = latency(spark, args.dir, args.seals, args.gap)
    finally:
        spark.stop()
    print(f"\n| read of {args.rows:,} records (best of {args.repeat}) | rows/s | seconds |")
    print("|---|---|---|")
    for name, rate, secs in rates:
        print(f"| {name} | {rate / 1e6:.2f} M | {secs:.2f} |")
    processed, committed = lat
    if processed:
        print(f"\nseal -> micro-batch processed (foreachBatch returned), {len(processed)} seals "
              f"{args.gap:g} s apart: {_summary(processed)}")
    if committed:
        print(f"seal -> micro-batch committed (checkpoint commit log written): "
              f"{_summary(committed)}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
