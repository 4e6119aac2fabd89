"""W9 Spark: the persist Spark source (``PersistedSource``) against ``spark.read.parquet`` of the
same rows, and seal -> micro-batch latency.

1. **Reads.** The same ``--w9-rows`` records (``bench.common.make_batch``, one persist append and
   one zstd Parquet file per ``--w9-part-rows``) are read in one ``local[2]`` SparkSession
   through ``spark.read.parquet``, through the persist source (``mode=raw``,
   ``mode=consolidated``, and consolidated with ``numPartitions=2``) and through the native
   path (``operators.PersistTable``: raw, consolidated, one column, point lookups raw and
   consolidated), each fully materialized by the ``noop`` sink; plus the bytes a native
   consolidated read decodes over those stored (from the part files' row-group statistics). One warm-up read of Parquet and of persist raw (JIT, codegen, the Python
   workers), then ``--w9-repeats`` rounds, the order of the cases rotated every round.
   Parquet is reported in the *floor* column: plain files read by Spark's own vectorized
   reader, no table format in between, are the floor of a Spark read.
2. **Latency.** A streaming query (default trigger, ``foreachBatch``) reads a collection while
   this process seals one small append every ``--w9-gap`` seconds (``--w9-seals`` of them); for
   each seal, the time from ``append(...).result()`` returning (durable, sealed) to the
   ``foreachBatch`` call holding that time returning, and to Spark's commit-log entry for that
   batch being written (its file's mtime: the micro-batch is then committed). persist only: a
   Parquet directory has no change feed.

3. **First micro-batch.** In a fresh SparkSession (its own JVM), the time from
   ``readStream...load()`` of the session's first streaming query (the persist source, default
   trigger, ``noop`` sink) to its first micro-batch's commit-log entry; against the same with a
   Python source that stores nothing (the *python source* column: Spark's own cost). Target:
   <= 3 s (issue 16). Each fresh Python worker Spark starts for it (planning, the stream reader,
   the read task) imports the source's module, so this is where import costs show.

4. **Issue 30** (:mod:`bench.workloads.w9_s3`): the native write against the same DataFrame
   sorted within partitions and written by ``df.write.parquet`` and against the persist sink,
   on local files and on each S3 test server; the native raw read through S3A against
   ``spark.read.parquet`` through S3A, and the requests of each; the time to persist's typed
   error for a mistyped S3 setting against Spark's. Each as a ratio in the targets.

5. **Issue 28's compaction** (:mod:`bench.workloads.w9_base`): distributed compaction
   (``optimize()``) against Spark's aggregate-sort-write pipeline and ``maintain()`` in one
   process; lifetime write amplification; W2's append p50 while the background brings a bulk
   load into the base, and the time that takes. Each as a ratio in the targets.

``--quick`` starts the JVM with C1 only and the serial GC (about twice as fast to start); the full
run keeps the default JIT, so Spark's own reader runs at its steady-state speed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import fresh_dir, make_batch, percentile, remove, rotate, settle, timed
from bench.results import WorkloadResult
from bench.workloads import w9_base, w9_s3
from bench.workloads.context import Context

WID = "W9"
TITLE = "Spark read path"
REPO = Path(__file__).resolve().parents[2]

FIRST_BATCH = "first micro-batch, first stream of a fresh session (s; target <= 3)"
FIRST_START = "first stream: load() to start() returned (s)"
#: W9's own column for the first micro-batch: a Python stream source that stores nothing.
PYSOURCE = "python source"
RAW = "raw read records/s"
CONSOLIDATED = "consolidated read records/s (mode=consolidated)"
CONSOLIDATED_2 = "consolidated read records/s, numPartitions=2"
#: One key's rows: persist consolidated with its filter pushed (filterPushdown=true), Parquet
#: with Spark's own pushdown (row-group stats), the same key.
LOOKUP = "point lookup on the key (ms)"
#: The native read path (``operators.PersistTable``: Spark's own Parquet reader over the part
#: files), each against ``spark.read.parquet`` of the same rows in the floor column.
NATIVE_RAW = "native raw read records/s (PersistTable, consolidated=False)"
NATIVE_CONSOLIDATED = "native consolidated read records/s (floor: Parquet raw)"
NATIVE_ONE_COLUMN = "native one-column read records/s (value; floor: Parquet's one column)"
NATIVE_LOOKUP = "native point lookup, raw (ms)"
NATIVE_LOOKUP_CONSOLIDATED = "native point lookup, consolidated (ms)"
NATIVE_DECODED = "native consolidated read: bytes decoded / stored"
#: Spark's own consolidation of the same rows (``groupBy(key, value).sum(diff)`` of the
#: Parquet files, zero sums dropped), in the floor column: what stage (a)'s aggregation costs
#: whoever runs it (no target).
SPARK_SUM = ("Spark's own consolidation of the same Parquet, groupBy(key, value).sum(diff) "
             "records/s (floor column)")
#: Issue 28: the native consolidated read at each stage of a collection's life, against
#: ``spark.read.parquet`` raw of the same rows (floor column); (a) is NATIVE_CONSOLIDATED.
STAGE_BASE = "native consolidated, (b) compacted base records/s (floor: Parquet raw)"
STAGE_UPDATES = "native consolidated, (c) base + 1% updates records/s (floor: Parquet raw)"
COMPACT_WALL = "compaction into the base: maintain() until False, wall (s)"
COMPACT_CPU = "compaction into the base: maintain() until False, CPU (s)"
TASK_CPU = "native consolidated read CPU, compacted, partitions={} (JVM s)"
TASKS = (1, 2, 8)
#: The W9 rows written from Spark: persist's ``operators.write`` (the native path, sorted
#: within partitions as it stores parts), ``df.write.parquet`` (zstd) in the floor column, and
#: Delta's ``df.write.format("delta")`` (its own session: :mod:`bench.systems.delta_spark`).
WRITE = "Spark write records/s (W9's rows from spark.read.parquet)"
#: Applying stage (c)'s 1% updates: persist's one append of them; Delta's one MERGE.
UPDATES_APPLIED = "1% updates applied: persist append, Delta MERGE (s)"
NO_READER = {
    "iceberg": "not measured: reading Iceberg from Spark needs the iceberg-spark-runtime JAR "
               "(not installed)",
}


def java() -> str | None:
    """The java that spark-submit will run (``$JAVA_HOME/bin/java``, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        exe = Path(home) / "bin" / "java"
        return str(exe) if os.access(exe, os.X_OK) else None
    return shutil.which("java")


def unavailable() -> str | None:
    """Why W9 cannot run here (pyspark >= 4.0 or Java missing), or None."""
    try:
        importlib.import_module("pyspark")
        # NB: the Python Data Source API the persist source is built on arrived in pyspark 4.0
        importlib.import_module("pyspark.sql.datasource")
    except ImportError as e:
        return f"pyspark >= 4.0 is not installed ({e}); install the 'spark' extra"
    if java() is None:
        where = "JAVA_HOME has no bin/java" if os.environ.get("JAVA_HOME") else "no java on PATH"
        return f"Java is not installed ({where}); PySpark needs Java 17+"
    return None


def prepare(root: Path, rows: int, part_rows: int) -> tuple[str, str]:
    """Writes ``rows`` records to a persist location and, the same tables, to a Parquet
    directory (one append / one file per ``part_rows``). Returns (persist URL, Parquet dir)."""
    import persist

    url, parquet = f"file://{root}/persist", root / "parquet"
    parquet.mkdir(parents=True)
    with persist.open(url) as client:
        w, _ = client.create_or_load("bench", key_type=pa.int64(), value_type=pa.int64())
        for i in range((rows + part_rows - 1) // part_rows):
            t = make_batch(9000 + i, min(part_rows, rows - i * part_rows), time_lo=i)
            w.append(t, upper=i + 1).result()
            pq.write_table(t, parquet / f"part-{i:05d}.parquet", compression="zstd")
    return url, str(parquet)


@contextlib.contextmanager
def spark_session(*, fast_start: bool, conf: dict[str, str] | None = None) -> Iterator[Any]:
    """A ``local[2]`` SparkSession with the persist format registered; the JVM ends on exit.
    ``conf``: more Spark settings.

    Raises:
        RuntimeError: the JVM did not start (the message says why), or a Spark session
            already runs in this process.
    """
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                            "PYTHONPATH", "SPARK_LOCAL_IP")}
    # NB: Python workers are separate processes started by the JVM with its environment: they
    # see PYTHONPATH (captured when the JVM starts), not this process's sys.path.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = saved["PYTHONPATH"]
    os.environ["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    # loopback only (as spark.driver.host), and no warning that the hostname resolves to it
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        import operators

        # NB: getOrCreate would hand back a session already running in this process (with its
        # settings, not these), and the exit below would end the JVM under its owner's feet
        # (a test suite's shared session: every later Spark call refused).
        if SparkContext._active_spark_context is not None:
            raise RuntimeError("a Spark session already runs in this process: the bench starts "
                               "and ends a JVM of its own, so run it in a process of its own")
        b = (SparkSession.builder.master("local[2]").appName("persist-bench")
             .config("spark.driver.memory", "4g")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             # NB: a Python source that implements pushFilters (the persist source does, or
             # will) fails every read unless this is on (pyspark 4.1+)
             .config("spark.sql.python.filterPushdown.enabled", "true"))
        if fast_start:
            b = b.config("spark.driver.extraJavaOptions",
                         "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        for name, value in (conf or {}).items():
            b = b.config(name, value)
        try:
            spark = b.getOrCreate()
        except Exception as e:  # py4j / pyspark raise assorted types when the JVM fails
            first = (str(e).strip().splitlines() or [""])[0]
            raise RuntimeError(f"Spark did not start: {type(e).__name__}: {first}") from e
        try:
            spark.sparkContext.setLogLevel("ERROR")
            # NB: without register's worker check: its probe job would warm the Python
            # workers that the first-micro-batch measurement counts cold (as for the sources
            # it is compared with)
            operators.register(spark, check=False)
            yield spark
        finally:
            spark.stop()
            _end_jvm()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _end_jvm() -> None:
    """Ends the JVM that pyspark launched (``stop()`` leaves it running until this process
    exits, with its heap, beside whatever the suite runs next)."""
    from pyspark import SparkContext

    gw = SparkContext._gateway
    if gw is None:
        return
    SparkContext._gateway = None
    SparkContext._jvm = None
    proc = getattr(gw, "proc", None)
    with contextlib.suppress(Exception):
        gw.shutdown()
    if proc is not None:
        # NB: Spark's gateway exits when its stdin reaches EOF (that is how it dies with us).
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
            proc.wait()


def _materialize(factory: Callable[[], Any]) -> float:
    """Seconds to read the DataFrame fully (the ``noop`` sink: every row produced, none kept)."""
    with timed() as t:
        factory().write.format("noop").mode("overwrite").save()
    return t.seconds


def _memory_source(rows: int, partitions: int) -> type:
    """A Python batch source that yields ``rows`` int64 rows (``key, value, time, diff``) from
    Arrow arrays built in memory, in ``partitions`` tasks: the fastest any Python data source
    can hand rows to Spark, the ceiling of persist's reads. Defined here so that Spark pickles
    it by value (workers never import bench code)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class MemoryReader(DataSourceReader):  # type: ignore[misc]
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import numpy as np
            import pyarrow as pa

            n = rows // partitions + (partition.value < rows % partitions)
            col = pa.array(np.arange(n, dtype=np.int64))
            t = pa.table({"key": col, "value": col, "time": col, "diff": col})
            yield from t.to_batches(max_chunksize=1 << 17)

    class MemorySource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bench_memory"

        def schema(self) -> str:
            return "key long, value long, time long, diff long"

        def reader(self, schema: Any) -> DataSourceReader:
            return MemoryReader()

    return MemorySource


def reads(ctx: Context, res: WorkloadResult, spark: Any, url: str, parquet: str, *,
          rows: int, repeats: int, with_parquet: bool) -> None:
    from operators import PersistTable

    def persist_df(**opts: Any) -> Any:
        r = spark.read.format("persist").option("collection", "bench")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load(url)

    table = PersistTable.forPath(spark, url, "bench")
    # NB: (where each measurement is reported: (column, metric) pairs, what reads): one
    # Parquet read is the floor of several rows (the native rows' ratios), measured once
    cases: list[tuple[tuple[tuple[str, str], ...], Callable[[], Any]]] = [
        ((("persist", RAW),), lambda: persist_df(mode="raw")),
        ((("persist", CONSOLIDATED),), lambda: persist_df(mode="consolidated")),
        ((("persist", CONSOLIDATED_2),),
         lambda: persist_df(mode="consolidated", numPartitions=2)),
        ((("persist", NATIVE_RAW),), lambda: table.toDF(consolidated=False)),
        ((("persist", NATIVE_CONSOLIDATED),), lambda: table.toDF()),
        ((("persist", NATIVE_ONE_COLUMN),),
         lambda: table.toDF(consolidated=False).select("value")),
    ]
    # NB: the same number of tasks as persist's raw read by default (one per 4 M rows)
    spark.dataSource.register(_memory_source(rows, max(1, -(-rows // 4_000_000))))
    if PYSOURCE not in res.extra:
        res.extra.append(PYSOURCE)
        res.columns[PYSOURCE] = "python source (stores nothing)"
    cases.append((((PYSOURCE, RAW), (PYSOURCE, NATIVE_RAW)),
                  lambda: spark.read.format("bench_memory").load()))
    if with_parquet:
        cases.insert(0, ((("floor", RAW), ("floor", NATIVE_RAW), ("floor", NATIVE_CONSOLIDATED)),
                         lambda: spark.read.parquet(parquet)))
        key = int(spark.read.parquet(parquet).select("key").first()[0])
        cases += [
            ((("floor", NATIVE_ONE_COLUMN),), lambda: spark.read.parquet(parquet).select("value")),
            ((("persist", LOOKUP),), lambda: persist_df(mode="consolidated",
                                                        filterPushdown="true")
             .where(f"key = {key}")),
            ((("persist", NATIVE_LOOKUP),),
             lambda: table.toDF(consolidated=False).where(f"key = {key}")),
            ((("persist", NATIVE_LOOKUP_CONSOLIDATED),),
             lambda: table.toDF().where(f"key = {key}")),
            ((("floor", LOOKUP), ("floor", NATIVE_LOOKUP), ("floor", NATIVE_LOOKUP_CONSOLIDATED)),
             lambda: spark.read.parquet(parquet).where(f"key = {key}")),
            ((("floor", SPARK_SUM),), lambda: _spark_sum(spark, parquet)),
        ]
    warm = [cases[0][1], cases[1][1], table.toDF]
    for factory in warm:  # warm the JVM (JIT, codegen) and the Python workers
        _materialize(factory)
    for r in range(repeats):
        for targets, factory in rotate(cases, r):
            ctx.log(f"W9 read round {r + 1}/{repeats}: {targets[0][0]}, {targets[0][1]}")
            settle()
            seconds = _materialize(factory)
            for column, metric in targets:
                if metric in (LOOKUP, NATIVE_LOOKUP, NATIVE_LOOKUP_CONSOLIDATED):
                    res.add(metric, "ms", "lower", column, 1000 * seconds)
                else:
                    res.add(metric, "rec/s", "higher", column, rows / seconds)
    amplification, planned = native_decoded(table)
    res.add(NATIVE_DECODED, "x", "lower", "persist", amplification)
    res.notes.append(
        f"native consolidated bytes decoded / stored: the compressed bytes of the row groups "
        f"that Spark's pushed key range and time filters keep (by the Parquet footers' "
        f"min/max, as Parquet's row-group filter decides; the page index may skip more) in "
        f"the {planned} key range(s) toDF() planned, over the bytes of the part files")


def _spark_sum(spark: Any, parquet: str) -> Any:
    """:data:`SPARK_SUM`'s DataFrame."""
    from pyspark.sql import functions as F

    return (spark.read.parquet(parquet).groupBy("key", "value")
            .agg(F.sum("diff").alias("diff")).filter(F.col("diff") != 0))


def _parts(client: Any) -> tuple[int, int]:
    """(parts, consolidated parts) of collection ``bench`` in ``client``'s state."""
    parts = client.state.collections["bench"].parts
    return len(parts), sum(1 for p in parts if p.consolidated)


def _jvm_cpu() -> float:
    """CPU seconds (user + system) of the Spark JVM and its live child processes so far."""
    import psutil
    from pyspark import SparkContext

    gw = SparkContext._gateway
    proc = psutil.Process(gw.proc.pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            c = p.cpu_times()
            total += c.user + c.system
    return total


def stages(ctx: Context, res: WorkloadResult, spark: Any, url: str, parquet: str, root: Path,
           *, rows: int, part_rows: int, repeats: int) -> None:
    """Issue 28's stages, after ``reads`` measured (a), the bulk load as appended: (b) since
    moved to the last time and ``Client.maintain()`` called until it returns False, background
    compaction off (its wall and CPU time; this process's CPU, where the runtime thread
    merges), then the native
    consolidated read against ``spark.read.parquet`` raw; the read's JVM CPU at 1, 2 and 8
    key ranges; (c) 1% fresh updates appended (retractions of existing rows and as many new
    rows), since moved past them and ``maintain()`` until idle (compaction's marks step:
    DESIGN.md §8), and the same read against Parquet raw of those rows too."""
    import persist
    from operators import PersistTable

    def versus(metric: str, n: int, native: Callable[[], Any], floor: Callable[[], Any]) -> None:
        cases = [("persist", native), ("floor", floor)]
        for factory in (floor, native):
            _materialize(factory)
        for r in range(repeats):
            for column, factory in rotate(cases, r):
                ctx.log(f"W9 stage round {r + 1}/{repeats}: {column}, {metric}")
                settle()
                res.add(metric, "rec/s", "higher", column, n / _materialize(factory))

    last = (rows + part_rows - 1) // part_rows - 1  # the bulk load's last time
    # NB: background compaction off, so that the merge runs inside the timed maintain() calls
    # (with it on, the since commit starts it before them)
    # NB: and the merge in this process (merge_worker_rows=None): a merge worker's CPU is
    # not in this process's process_time()
    with persist.open(url, options=persist.Options(background_compaction=False,
                                                   merge_worker_rows=None)) as client:
        w, _ = client.create_or_load("bench", key_type=pa.int64(), value_type=pa.int64())
        before = _parts(client)
        w.allow_compaction(last).result()
        settle()
        calls = 0
        cpu0 = time.process_time()
        with timed() as t:
            while client.maintain():
                calls += 1
        cpu = time.process_time() - cpu0
        after = _parts(client)
    res.add(COMPACT_WALL, "s", "lower", "persist", t.seconds)
    res.add(COMPACT_CPU, "s", "lower", "persist", cpu)
    res.notes.append(
        f"stages (issue 28): (a) is the native consolidated row, the bulk load as appended "
        f"({before[0]} parts, {before[1]} consolidated, when (b) began); (b) since moved to "
        f"{last} (the last time), then maintain() until it returned False ({calls} call(s) "
        f"returned True; CPU: this process's, where the runtime thread merges): {after[0]} "
        f"parts, {after[1]} consolidated")
    table = PersistTable.forPath(spark, url, "bench")
    versus(STAGE_BASE, rows, table.toDF, lambda: spark.read.parquet(parquet))
    for n in TASKS:
        factory = functools.partial(table.toDF, partitions=n)
        _materialize(factory)
        for _ in range(repeats):
            settle()
            c0 = _jvm_cpu()
            _materialize(factory)
            res.add(TASK_CPU.format(n), "s", "lower", "persist", _jvm_cpu() - c0)
    # (c) 1% fresh updates: retract 1% of the rows (from the first append), add as many new
    fresh = max(1, rows // 100)
    old = make_batch(9000, min(part_rows, rows), time_lo=0).slice(0, fresh)
    new = make_batch(7777, fresh, time_lo=last + 1)
    gone = pa.table({"key": old["key"], "value": old["value"],
                     "time": pa.array([last + 1] * fresh, pa.int64()),
                     "diff": pa.array([-1] * fresh, pa.int64())}, schema=new.schema)
    updates = pa.concat_tables([gone, new])
    with persist.open(url, options=persist.Options(background_compaction=False)) as client:
        w, _ = client.create_or_load("bench", key_type=pa.int64(), value_type=pa.int64())
        with timed() as t:
            w.append(updates, upper=last + 2).result()
        # NB: since past the updates, and maintain() until idle: compaction's marks step
        # (DESIGN.md §8) sums them with the base rows of their keys into a delta and marks
        # those base rows, rather than rewriting the base (the updates are 2% of it, below
        # the base merge's 1 / base_ratio)
        w.allow_compaction(last + 1).result()
        steps = 0
        with timed() as marked:
            while client.maintain():
                steps += 1
        now = _parts(client)
        marked_parts = sum(1 for p in client.state.collections["bench"].parts
                           if p.marks is not None)
    res.add(UPDATES_APPLIED, "s", "lower", "persist", t.seconds)
    updated = root / "parquet-updated"
    updated.mkdir()
    for f in sorted(Path(parquet).iterdir()):
        (updated / f.name).symlink_to(f)
    pq.write_table(updates, updated / "part-updates.parquet", compression="zstd")
    table = PersistTable.forPath(spark, url, "bench")
    versus(STAGE_UPDATES, rows + 2 * fresh, table.toDF,
           lambda: spark.read.parquet(str(updated)))
    res.notes.append(
        f"stage (c): {fresh:,} retractions of existing rows and {fresh:,} new rows at time "
        f"{last + 1}, appended after (b), since moved to {last + 1} and maintain() until idle "
        f"({steps} call(s) True, {marked.seconds:.2f} s: the marks step; {now[0]} parts, "
        f"{now[1]} consolidated, {marked_parts} marked; background compaction off); floor: "
        f"Parquet raw "
        f"of the {rows + 2 * fresh:,} rows (the updates as one more file); read CPU: user + "
        f"system of the Spark JVM and its children (psutil) around one noop read of the "
        f"compacted base per round, toDF(partitions=n)")


def writes(ctx: Context, res: WorkloadResult, spark: Any, parquet: str, root: Path, *,
           rows: int, repeats: int, with_parquet: bool) -> None:
    """W9's rows read with ``spark.read.parquet`` and written by persist's ``operators.write``
    (a new collection each round) and, in the floor column, by ``df.write.parquet`` (zstd), one
    warm-up write each, then ``repeats`` rounds, order rotated: :data:`WRITE`."""
    import operators

    src = spark.read.parquet(parquet)
    out = root / "writes"

    def persist_write(tag: str) -> None:
        w = operators.write(src, f"file://{out}/persist-{tag}", "bench")
        if not w.native:
            raise RuntimeError(f"W9 write: operators.write took the sink ({w.why})")

    def parquet_write(tag: str) -> None:
        src.write.option("compression", "zstd").parquet(str(out / f"parquet-{tag}"))

    cases: list[tuple[str, Callable[[str], None]]] = [("persist", persist_write)]
    if with_parquet:
        cases.append(("floor", parquet_write))
    for _, f in cases:
        f("warm")
    for r in range(repeats):
        for column, f in rotate(cases, r):
            ctx.log(f"W9 write round {r + 1}/{repeats}: {column}")
            settle()
            with timed() as t:
                f(str(r))
            res.add(WRITE, "rec/s", "higher", column, rows / t.seconds)
        remove(out)
    remove(out)
    res.notes.append(
        f"writes: {repeats} round(s) after one warm-up each, order rotated; persist: "
        "operators.write(df, url, c), the native path (Spark's Parquet writer, sorted within "
        "partitions by key, value, time, adopted and committed by the driver), a new "
        "collection each round; floor: df.write.parquet, zstd, unsorted; the source df is "
        "spark.read.parquet of W9's rows")


def delta_peer(ctx: Context, res: WorkloadResult, parquet: str, root: Path, *,
               repeats: int, quick: bool) -> None:
    """Delta's Spark writer and reader on W9's rows, in their own environment and JVM
    (:mod:`bench.systems.delta_spark`), beside persist's; skipped with the reason where that
    environment is missing or the peer fails."""
    from bench.systems import delta_spark

    why = delta_spark.unavailable()
    if why is not None:
        res.skip("delta", why)
        return
    ctx.log(f"W9: Delta's peer (pyspark {delta_spark.PYSPARK}, delta-spark "
            f"{delta_spark.DELTA}, its own JVM)")
    settle()
    try:
        doc = delta_spark.measure(parquet, root / "delta-peer", rounds=repeats, quick=quick)
    except delta_spark.PeerError as e:
        res.skip("delta", str(e))
        return
    delta_spark.add_to(res, doc, write=WRITE, reads=(RAW, NATIVE_RAW), updated=STAGE_UPDATES,
                       merge=UPDATES_APPLIED)


def native_decoded(table: Any) -> tuple[float, int]:
    """The bytes a native consolidated read (``table.toDF()``) decodes over those stored:
    each key range's files' row groups whose key and time statistics its pushed filters do
    not rule out. Returns (that ratio, the ranges planned)."""
    import persist.distributed as pd

    info = table.info()
    scan = info.snapshot()
    tasks = scan.tasks(consolidated=True)
    stored = decoded = 0
    seen: set[str] = set()
    for task in tasks:
        urls, _ = pd.parquet_task(task)
        r = task.key_range
        for u in urls:
            meta = pq.ParquetFile(u.removeprefix("file://")).metadata
            if u not in seen:
                seen.add(u)
                stored += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                st = rg.column(0).statistics  # key
                lo, hi = (st.min, st.max) if st is not None and st.has_min_max else (None, None)
                keep = r is None or lo is None or (
                    (r.hi is None or lo < r.hi) and (r.lo is None or hi >= r.lo))
                decoded += rg.total_byte_size if keep else 0
    return (decoded / stored if stored else 0.0), len(tasks)


def latency(spark: Any, root: Path, seals: int, gap: float) -> tuple[list[float], list[float]]:
    """Seconds from each seal to (its micro-batch processed, its micro-batch committed)."""
    import persist

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

    def wait_for(n: int, deadline: float, q: Any) -> None:
        while len(processed) < n and time.monotonic() < deadline:
            if not q.isActive:
                raise RuntimeError(f"W9 streaming query stopped: {q.exception()}")
            time.sleep(0.05)

    with persist.open(url) as client:
        w, _ = client.create_or_load("s", key_type=pa.int64(), value_type=pa.int64())
        w.append(make_batch(9900, 100, time_lo=0), upper=1).result()
        q = (spark.readStream.format("persist").option("collection", "s").load(url)
             .writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", str(ckpt)).start())
        try:
            deadline = time.monotonic() + 120
            wait_for(1, deadline, q)
            for t in range(1, seals + 1):
                time.sleep(gap)
                w.append(make_batch(9900 + t, 100, time_lo=t), upper=t + 1).result()
                sealed[t] = time.time()
            wait_for(seals + 1, deadline, q)
            # NB: foreachBatch returns before Spark writes the batch's commit-log entry: wait
            # for the last one (not a fixed sleep)
            with lock:
                last = ckpt / "commits" / str(max(batch_of.values(), default=0))
            while not last.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            q.stop()
    done = [t for t in range(1, seals + 1) if t in processed]
    committed = [(ckpt / "commits" / str(batch_of[t])).stat().st_mtime - sealed[t]
                 for t in done if (ckpt / "commits" / str(batch_of[t])).exists()]
    return [processed[t] - sealed[t] for t in done], committed


def _nothing_source() -> type:
    """A Python stream source that stores nothing: one row at offset 1, then no more. What a
    persist stream costs beyond it is persist's.

    NB: the classes are defined in this function so that cloudpickle sends them by value: by
    reference, every Spark worker would import this module (pyarrow.parquet, numpy, bench.*)
    and the floor would pay imports of its own.
    """
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.types import LongType, StructField, StructType

    class NothingReader(DataSourceStreamReader):  # type: ignore[misc]
        def initialOffset(self) -> dict[str, int]:
            return {"o": 0}

        def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
            return {"o": 1}

        def partitions(self, start: Any, end: Any) -> list[Any]:
            return [InputPartition(0)]

        def read(self, partition: Any) -> Iterator[tuple[int, int]]:
            yield (1, 1)

    class NothingSource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "w9nothing"

        def schema(self) -> Any:
            return StructType([StructField("key", LongType()), StructField("diff", LongType())])

        def streamReader(self, schema: Any) -> Any:
            return NothingReader()

    return NothingSource


def _first_batch(stream: Callable[[], Any], ckpt: Path) -> tuple[float, float]:
    """Creates the streaming DataFrame (``stream()``: Spark asks the source its schema) and
    starts a query of it into the ``noop`` sink; returns the seconds from the call until
    ``start()`` returned and until the first micro-batch's commit-log entry existed.

    Raises:
        RuntimeError: the query stopped, or no micro-batch committed within 120 s.
    """
    first = ckpt / "commits" / "0"
    t0 = time.perf_counter()
    q = stream().writeStream.format("noop").option("checkpointLocation", str(ckpt)).start()
    started = time.perf_counter() - t0
    try:
        # NB: polled every 5 ms: the resolution of the number, next to seconds measured
        while not first.exists():
            if not q.isActive:
                raise RuntimeError(f"W9 first-batch query stopped: {q.exception()}")
            if time.perf_counter() - t0 > 120:
                raise RuntimeError("W9 first-batch query: no micro-batch within 120 s")
            time.sleep(0.005)
        return started, time.perf_counter() - t0
    finally:
        q.stop()


def _first_stream(spark: Any, column: str, url: str) -> Callable[[], Any]:
    """What creates the streaming DataFrame of ``column`` (persist, or :data:`PYSOURCE`)."""
    if column == "persist":
        return lambda: (spark.readStream.format("persist").option("collection", "first")
                        .load(url))
    spark.dataSource.register(_nothing_source())
    return lambda: spark.readStream.format("w9nothing").load()


def first_micro_batch(ctx: Context, res: WorkloadResult, root: Path, *, fast_start: bool,
                      repeats: int) -> None:
    """Seconds to the first micro-batch of the first streaming query of a fresh session (its
    own JVM: no Python worker is warm), from the ``readStream...load()`` that creates its
    DataFrame (Spark asks the source its schema there) to its first commit-log entry; persist
    against a source that stores nothing (:func:`_nothing_source`; not with ``fast_start``, the
    quick run), ``repeats`` rounds, order rotated. Adds :data:`FIRST_BATCH` and
    :data:`FIRST_START`; skips them (with the reason) if Spark does not start."""
    import persist

    url = f"file://{root}/first"
    with persist.open(url) as client:
        w, _ = client.create_or_load("first", key_type=pa.int64(), value_type=pa.int64())
        w.append(make_batch(9990, 100, time_lo=0), upper=1).result()
    columns = ["persist"]
    if fast_start:
        # NB: --quick is a smoke run: each column is a fresh JVM (~20 s idle, ~50 s at load 12),
        # so only persist's runs; the comparison with Spark's own Python source is the full run's
        res.notes.append(f"first micro-batch: --quick measures persist only, not '{PYSOURCE}'")
    else:
        columns.append(PYSOURCE)
        res.extra.append(PYSOURCE)
        res.columns[PYSOURCE] = "python source (stores nothing)"
    for r in range(repeats):
        for column in rotate(columns, r):
            ctx.log(f"W9 first micro-batch round {r + 1}/{repeats}: {column}, fresh session")
            settle()
            try:
                with spark_session(fast_start=fast_start) as spark:
                    started, first = _first_batch(_first_stream(spark, column, url),
                                                  root / f"first-ckpt-{r}-{column}")
            except RuntimeError as e:
                res.skip("persist", f"first micro-batch not measured: {e}")
                return
            res.add(FIRST_BATCH, "s", "lower", column, first)
            res.add(FIRST_START, "s", "lower", column, started)
    res.notes.append(
        f"first micro-batch: {repeats} round(s), each in a fresh local[2] session (its own JVM, "
        "so every Python worker starts cold), from readStream...load() of the session's first "
        "streaming query (default trigger, noop sink) to its first commit-log entry (and to "
        "start() returning); persist: a collection of 100 records sealed at upper 1; "
        f"'{PYSOURCE}': a Python stream source that stores nothing (one row), Spark's own cost "
        "of a Python source; target <= 3 s (issue 16)")


#: W9's column for the sink overhead: the same stream into Spark's ``noop`` sink.
NOOP = "noop sink"
SINK_OVERHEAD = "persist sink per micro-batch over noop (ms; target <= 20)"
SINK_ADD_BATCH = "micro-batch addBatch, median (ms)"
#: Sealed times (one 40-row micro-batch each) the sink-overhead stream reads.
SINK_BATCHES = 16


#: A Python stream sink that stores nothing: Spark's own cost of any Python sink.
PYSINK = "python sink (stores nothing)"
#: What persist's sink adds over a Python sink that stores nothing.
SINK_OVER_PYSINK = "persist sink per micro-batch over a Python sink that stores nothing (ms)"


def _nothing_sink() -> type:
    """A Python data source whose stream writer stores nothing (each task returns an empty
    message, the commit does nothing). Defined here so that Spark pickles it by value."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

    class NothingWriter(DataSourceStreamWriter):  # type: ignore[misc]
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[Any], batchId: int) -> None:
            pass

    class NothingSink(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bench_nothing_sink"

        def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
            return NothingWriter()

    return NothingSink


def _add_batch_ms(spark: Any, src: str, sink: str, root: Path, tag: str) -> list[float]:
    """``addBatch`` (ms) of each micro-batch but the first (warm-up) of an availableNow
    stream of ``src``'s collection ``sink`` into ``sink``: one micro-batch per sealed time
    (``maxRowsPerTrigger`` 40, the rows of one time)."""
    w = (spark.readStream.format("persist").option("collection", "sink")
         .option("maxRowsPerTrigger", 40).load(src)
         .writeStream.format(sink).option("checkpointLocation", str(root / f"ckpt-{tag}")))
    if sink == "persist":
        q = w.option("collection", "copy").trigger(availableNow=True) \
            .start(f"file://{root}/sink-{tag}")
    else:
        q = w.trigger(availableNow=True).start()
    q.awaitTermination(300)
    if q.exception() is not None:
        raise RuntimeError(f"W9 sink stream into {sink} failed: {q.exception()}")
    return [float(p["durationMs"]["addBatch"]) for p in q.recentProgress[1:]
            if "addBatch" in p["durationMs"]]


def sink_overhead(ctx: Context, res: WorkloadResult, spark: Any, root: Path, *,
                  repeats: int, batches: int = SINK_BATCHES) -> None:
    """What the persist sink adds to a micro-batch: the median ``addBatch`` (Spark's write
    job plus the sink's commit, from ``query.recentProgress``) of a persist -> persist
    stream minus that of the same stream into the ``noop`` sink, ``batches`` micro-batches
    of 40 rows each, ``repeats`` rounds, order rotated. Adds :data:`SINK_OVERHEAD` (target
    <= 20 ms, issue 16) and :data:`SINK_ADD_BATCH` for both sinks."""
    import persist

    src = f"file://{root}/sink-src"
    with persist.open(src) as client:
        w, _ = client.create_or_load("sink", key_type=pa.int64(), value_type=pa.int64())
        for t in range(batches):
            w.append(make_batch(9800 + t, 40, time_lo=t), upper=t + 1).result()
    spark.dataSource.register(_nothing_sink())
    ms: dict[str, list[float]] = {"noop": [], "persist": [], "bench_nothing_sink": []}
    for r in range(repeats):
        for sink in rotate(["noop", "persist", "bench_nothing_sink"], r):
            ctx.log(f"W9 sink overhead round {r + 1}/{repeats}: {sink} sink")
            ms[sink] += _add_batch_ms(spark, src, sink, root / "sink", f"{sink}-{r}")
    if not ms["noop"] or not ms["persist"]:
        res.notes.append("sink overhead: no micro-batch progress reported")
        return
    res.extra.append(NOOP)
    res.columns[NOOP] = "noop sink (the same stream)"
    noop, mine = statistics.median(ms["noop"]), statistics.median(ms["persist"])
    res.add(SINK_ADD_BATCH, "ms", "lower", "persist", mine)
    res.add(SINK_ADD_BATCH, "ms", "lower", NOOP, noop)
    res.add(SINK_OVERHEAD, "ms", "lower", "persist", mine - noop)
    if ms["bench_nothing_sink"]:
        nothing = statistics.median(ms["bench_nothing_sink"])
        res.extra.append(PYSINK)
        res.columns[PYSINK] = PYSINK
        res.add(SINK_ADD_BATCH, "ms", "lower", PYSINK, nothing)
        res.add(SINK_OVER_PYSINK, "ms", "lower", "persist", mine - nothing)
    res.notes.append(
        f"sink overhead: a persist -> persist stream (availableNow, one 40-row micro-batch "
        f"per sealed time, {batches} times, the first batch dropped as warm-up) against "
        f"the same stream into the noop sink; median addBatch (query.recentProgress) of "
        f"{repeats} round(s); the sink keeps its writer open between micro-batches "
        f"(writerIdleTimeout); target <= 20 ms over noop (issue 16)")


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    rows, part_rows, repeats = a.w9_rows, a.w9_part_rows, a.w9_repeats
    seals, gap = a.w9_seals, a.w9_gap
    res = WorkloadResult(
        WID, f"{TITLE}: {rows:,} records through PersistedSource vs spark.read.parquet, and "
        f"seal -> micro-batch latency ({seals} seals {gap:g} s apart)",
        params={"rows": rows, "part_rows": part_rows, "repeats": repeats, "seals": seals,
                "gap_s": gap, "fast_start": bool(a.quick)})
    res.columns["floor"] = "floor (spark.read.parquet)"
    for peer, reason in NO_READER.items():
        res.skip(peer, reason)
    why = unavailable()
    if why is None and "persist" not in ctx.systems:
        why = "persist not selected (--systems): nothing to compare Parquet with"
    if why is not None:
        for name in ctx.systems:
            res.skip(name, why)
        return [res]
    root = fresh_dir(ctx.work, "w9")
    try:
        ctx.log(f"W9: writing {rows:,} records to persist and to Parquet")
        url, parquet = prepare(root, rows, part_rows)
        settle()
        first_micro_batch(ctx, res, root, fast_start=bool(a.quick), repeats=repeats)
        ctx.log("W9: starting Spark")
        s3a_jars, no_s3 = (w9_s3.spark_jars() if "floor" in ctx.systems
                           else (None, "floor not selected"))
        with contextlib.ExitStack() as stack:
            try:
                spark = stack.enter_context(spark_session(
                    fast_start=bool(a.quick),
                    conf=None if s3a_jars is None else {"spark.jars": s3a_jars}))
            except RuntimeError as e:
                for name in ctx.systems:
                    res.skip(name, str(e))
                return [res]
            ctx.log("W9: Spark is up; warm-up reads")
            reads(ctx, res, spark, url, parquet, rows=rows, repeats=repeats,
                  with_parquet="floor" in ctx.systems)
            if "floor" in ctx.systems:
                ctx.log("W9: issue 28 stages (compaction into the base, updates)")
                stages(ctx, res, spark, url, parquet, root, rows=rows, part_rows=part_rows,
                       repeats=repeats)
            ctx.log("W9: writes from Spark")
            writes(ctx, res, spark, parquet, root, rows=rows, repeats=repeats,
                   with_parquet="floor" in ctx.systems)
            if "floor" in ctx.systems:
                ctx.log("W9: issue 30 (writes sorted, S3A reads and writes)")
                w9_s3.run(ctx, res, spark, root, local_rows=rows, rows=a.w9_s3_rows, parts=4,
                          repeats=repeats, quick=bool(a.quick), why=no_s3)
                ctx.log("W9: issue 28 (distributed compaction against Spark and maintain())")
                w9_base.run_spark(ctx, res, spark, root, rows=rows, part_rows=part_rows,
                                  repeats=repeats, quick=bool(a.quick))
            ctx.log(f"W9: seal -> micro-batch latency, {seals} seals")
            processed, committed = latency(spark, root, seals, gap)
            # NB: --quick runs 4 micro-batches a stream (the first is warm-up), enough to
            # report the row; 16 in the full run
            sink_overhead(ctx, res, spark, root, repeats=repeats,
                          batches=4 if a.quick else SINK_BATCHES)
        # NB: after W9's own session ended: its JVM does not share the cores with them
        if "floor" in ctx.systems:
            ctx.log("W9: issue 28 (write amplification, appends during the base merge)")
            w9_base.run_local(ctx, res, rows=rows, part_rows=part_rows, repeats=repeats,
                              quick=bool(a.quick))
        # NB: after W9's own session ended: the peer's JVM does not share the cores with it
        if "delta" in ctx.systems:
            delta_peer(ctx, res, parquet, root, repeats=repeats, quick=bool(a.quick))
    finally:
        remove(root)
    for label, xs in (("processed", processed), ("committed", committed)):
        if xs:
            res.add(f"seal -> micro-batch {label}, median (ms)", "ms", "lower", "persist",
                    statistics.median(xs) * 1000)
            res.add(f"seal -> micro-batch {label}, p95 (ms)", "ms", "lower", "persist",
                    percentile(xs, 95) * 1000)
    if len(processed) < seals:
        res.notes.append(f"only {len(processed)} of {seals} seals reached a micro-batch within "
                         "the 120 s deadline")
    res.notes.append("floor column: spark.read.parquet of the same rows (zstd Parquet, one file "
                     "per persist append); p/floor on the raw row = persist mode=raw / Parquet, "
                     "in the same session")
    res.notes.append("processed: from append(...).result() returning to foreachBatch returning "
                     "for the micro-batch holding that time; committed: to Spark's commit-log "
                     "entry for it (default trigger); persist only (Parquet has no change feed)")
    res.notes.append(f"reads: {repeats} round(s) (--w9-repeats) after one warm-up read each of "
                     "Parquet, persist raw and the native consolidated read; the noop sink "
                     "materializes every row; the native rows read through operators.PersistTable "
                     "(Spark's own Parquet reader over the v4 part files, page checksums "
                     "verified), each against spark.read.parquet of the same rows in the floor "
                     "column (consolidated: against Parquet's raw read); native point lookup, "
                     "raw: the key filter pushed into the part files' scan (sorted by key, page "
                     "index); consolidated: the key filter after persist's per-range "
                     "consolidation")
    res.notes.append("python source on the raw row: a Python data source handing the same "
                     "number of int64 rows to Spark from Arrow arrays already in memory, in as "
                     "many tasks as persist's raw read: the most any Python source reaches "
                     "through pyspark's Arrow hand-off, i.e. the ceiling of persist's reads; "
                     "point lookup: persist consolidated with filterPushdown=true vs Parquet "
                     "with Spark's own pushdown, the same key")
    return [res]
