"""The native write path against the ``persist`` sink and ``df.write.parquet`` (issue 30 #3).

    PYSPARK_PYTHON=.venv/bin/python python -m bench.native_write [--rows 3000000] [--rounds 3]
        [--s3 moto|ministack] [--keys N] [--cases native,full,...] [--reads]

One ``local[2]`` SparkSession (default JIT). The source is ``--rows`` rows (``key`` long,
``value`` string, ``time`` long, ``diff`` long) written once as zstd Parquet and read back with
``spark.read.parquet`` in 3 partitions, as issue 30 measured. The key is ``(id * 7919) %
2147483647``: unique (up to 2**31 - 1 rows) and not in order; ``--keys N`` makes it ``id %
N`` instead (rows / N rows per key, values within a key out of persist's order). Each round runs, in a rotated order, to fresh local directories:

* *native*: ``operators.write(df, url, "c")`` (Spark's Parquet writer sorting by the key
  alone, adopted with its order checked, and committed);
* *full*: the same with ``sort="full"`` (Spark's three-column ``sortWithinPartitions``);
* *unsorted*: the same with ``sort=False`` (no ``sortWithinPartitions``);
* *sink*: ``df.write.format("persist").mode("append")`` (the Python sink);
* *parquet*: ``df.sortWithinPartitions("key", "value", "time").write.parquet`` with zstd;
* *spark*: the native write's Spark job alone (``operators.native_write._write_parquet``: its
  select, sort, writer settings and commit algorithm 2, to a plain directory), none of
  persist's steps (lease, adoption, commit, cleaning): native minus spark is persist's share,
  spark against parquet the writer settings';
* *groups*: *parquet* with the native write's row groups (``parquet.block.row.count.limit``
  65,536 rows) and nothing else changed;
* *noop*: ``df.write.format("noop")`` (reading the source only);
* *sortkey*, *sortfull*: the native write's select and its sort (by the key alone, by
  ``key, value, time``) into the ``noop`` sink: the sorts alone.

Beside each case's wall seconds the run prints the CPU seconds Spark's JVM spent in it (its
``/proc`` times; the driver's Python and the sink's Python workers not included), which the
machine's load moves less than the wall time.

With ``--s3 SERVER`` every case writes to ``s3://`` (``s3a://`` for Spark) on a fresh bucket of
an S3 test server this run starts (``tests/support/s3_servers.py``: moto or ministack on
loopback), the session carrying the S3A JARs (``./dev jars s3a``) and the *parquet* case the
same S3A settings as write options; the source stays a local file.

``--cases`` runs only those (comma-separated; the ratios printed need native, sink and
parquet). ``--reads`` then writes the source once by each of *native*, *full* and *unsorted*
and times, rotated over the same rounds, a consolidated native read of each collection
(``PersistTable.toDF()`` into Spark's ``noop`` sink): what a part not recorded sorted costs
its readers until compaction rewrites it.

Printed: the median seconds and M rows/s of each case, the ratios native/sink and
native/parquet (of rates), the median time the driver spent adopting the files (persist's
one read of each: crc32c, footer, the columns decoded, the order check), and how many of each
sorted write's parts were recorded sorted.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: The native write's row group (``parquet.block.row.count.limit``), as persist cuts batches.
BATCH_ROWS = 1 << 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--s3", choices=("moto", "ministack"), default=None)
    ap.add_argument("--keys", type=int, default=None)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--reads", action="store_true")
    a = ap.parse_args()
    if a.s3 is None:
        run(a, None)
        return
    from tests.support import s3_servers

    with tempfile.TemporaryDirectory(prefix="persist-bench-s3-") as tmp, \
            s3_servers.start(a.s3, Path(tmp)) as server:
        run(a, server.connection())


def run(a: argparse.Namespace, s3: dict[str, str] | None) -> None:
    """The benchmark, on local files (``s3`` None) or on the S3 server ``s3`` reaches."""

    from pyspark.sql import SparkSession

    import operators
    import operators.native_write as nw

    write_parquet = nw._write_parquet  # the Spark job alone (before it is wrapped below)

    # the native write's steps, timed where operators.native_write calls them: persist's
    # (lease and staging directory, adoption, commit, cleaning and release) and Spark's job
    steps: dict[str, float] = {}

    def timing(owner: Any, name: str, step: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return real(*args, **kw)
            finally:
                steps[step] = steps.get(step, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapper)

    timing(nw.Stager, "start", "lease")
    timing(nw, "staging", "lease")
    timing(nw, "_write_parquet", "spark")
    timing(nw, "adopt", "adopt")
    timing(nw.Committer, "commit", "commit")
    timing(nw, "clean_staging", "clean")
    timing(nw.Stager, "release", "clean")
    native_steps: list[dict[str, float]] = []

    root = Path(tempfile.mkdtemp(prefix="persist-native-write-"))
    builder = SparkSession.builder
    s3a: dict[str, str] = {}
    bucket = ""
    if s3 is not None:
        import uuid

        from persist.blob import aws
        from persist.distributed import hadoop_options
        from tests.support import jars

        builder = jars.with_jars(builder, "s3a")
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        opts, _ = aws.AwsOptions.split(s3)
        aws.client("s3", opts).create_bucket(Bucket=bucket)
        s3a = hadoop_options(f"s3://{bucket}", s3)
    spark = (builder.master("local[2]").appName("persist-native-write-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .config("spark.sql.shuffle.partitions", "3").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    operators.register(spark)
    try:
        src = str(root / "src")
        key = "(id * 7919) % 2147483647" if a.keys is None else f"id % {a.keys}"
        (spark.range(0, a.rows, numPartitions=3)
         .selectExpr(f"{key} as key", "cast(id % 100000 as string) as value",
                     "id % 10 as time", "1L as diff")
         .write.option("compression", "zstd").parquet(src))
        df = spark.read.parquet(src)
        assert df.rdd.getNumPartitions() >= 1

        def url(out: Path) -> str:
            return f"s3://{bucket}/{out.name}" if s3 is not None else f"file://{out}"

        def native(out: Path) -> None:
            steps.clear()
            operators.write(df, url(out), "c", storage_options=s3)
            native_steps.append(dict(steps))

        def full(out: Path) -> None:
            operators.write(df, url(out), "c", sort="full", storage_options=s3)

        def unsorted(out: Path) -> None:
            operators.write(df, url(out), "c", sort=False, storage_options=s3)

        def sink(out: Path) -> None:
            (df.write.format("persist").mode("append").option("collection", "c")
             .options(**{f"storage_options.{k}": v for k, v in (s3 or {}).items()})
             .save(url(out)))

        def parquet(out: Path) -> None:
            (df.sortWithinPartitions("key", "value", "time").write.options(**s3a)
             .option("compression", "zstd")
             .parquet(url(out).replace("s3://", "s3a://", 1) if s3 is not None else str(out)))

        def spark_only(out: Path) -> None:
            target = url(out)
            write_parquet(df, SimpleNamespace(url=target, batch_rows=BATCH_ROWS), "key", s3a)

        def groups(out: Path) -> None:
            (df.sortWithinPartitions("key", "value", "time").write.options(**s3a)
             .option("compression", "zstd")
             .option("parquet.block.row.count.limit", str(BATCH_ROWS))
             .parquet(url(out).replace("s3://", "s3a://", 1) if s3 is not None else str(out)))

        def noop(out: Path) -> None:
            df.write.format("noop").mode("overwrite").save()

        def sorts(by: list[str]) -> Any:
            def case(out: Path) -> None:
                rows = df.select("key", "value", "time", "diff")
                (rows.sortWithinPartitions(*[rows[c].asc_nulls_last() for c in by])
                 .write.format("noop").mode("overwrite").save())
            return case

        cases = {"native": native, "full": full, "unsorted": unsorted, "sink": sink,
                 "parquet": parquet, "spark": spark_only, "groups": groups, "noop": noop,
                 "sortkey": sorts(["key"]), "sortfull": sorts(["key", "value", "time"])}
        if a.cases is not None:
            cases = {k: cases[k] for k in a.cases.split(",")}
        for name, fn in (("native", native), ("full", full)):  # the parts' recorded order
            if name in cases:
                out = root / f"order-{name}"
                fn(out)
                ordered = sorted_parts(url(out), s3)
                print(f"{name}: {ordered[0]} of {ordered[1]} blob parts recorded sorted")
                shutil.rmtree(out, ignore_errors=True)
        for name, fn in cases.items():  # warm-up: JIT, codegen, Python workers
            fn(root / f"warm-{name}")
            shutil.rmtree(root / f"warm-{name}", ignore_errors=True)
        native_steps.clear()
        print(f"load average {load()} at the start of the rounds")
        times: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        jvm = jvm_cpu(spark)
        names = list(cases)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                out = root / f"{name}-{r}"
                c = jvm()
                t = time.perf_counter()
                cases[name](out)
                times[name].append(time.perf_counter() - t)
                cpu[name].append(jvm() - c)
                shutil.rmtree(out, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{a.rows} rows, {a.rounds} rounds, on "
              f"{'local files' if s3 is None else a.s3 + ' (S3A)'}, keys "
              f"{'unique' if a.keys is None else a.keys}; load average "
              f"{load()} at the end")
        for k, v in med.items():
            print(f"{k:8s} median {v:6.2f} s  {a.rows / v / 1e6:5.2f} M rows/s  "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in times[k])}); JVM CPU median "
                  f"{statistics.median(cpu[k]):6.2f} s")

        def ratio(label: str, slow: str, fast: str, note: str = "") -> None:
            if slow in med and fast in med:  # rates: fast's over slow's
                print(f"{label}: {med[slow] / med[fast]:.2f}x{note}")

        ratio("native / sink rate", "sink", "native", " (target >= 1.5)")
        ratio("native / parquet rate", "parquet", "native", " (target >= 0.9)")
        ratio("native / native sort='full' rate", "full", "native")
        ratio("native sort='full' / sink rate", "sink", "full")
        ratio("native sort='full' / parquet rate", "parquet", "full")
        ratio("native sort=False / sink rate", "sink", "unsorted")
        if {"native", "spark", "parquet", "groups"} <= set(med):
            print(f"persist's steps (native - spark): {med['native'] - med['spark']:.2f} s; "
                  f"the native write's Spark job / parquet: {med['spark'] / med['parquet']:.2f}x "
                  f"the time; parquet with 64 Ki-row row groups / parquet: "
                  f"{med['groups'] / med['parquet']:.2f}x")
        if native_steps:
            print(f"the native write's steps, medians of {len(native_steps)} rounds (s): "
                  + ", ".join(f"{k} {statistics.median(d.get(k, 0.0) for d in native_steps):.3f}"
                              for k in ("spark", "lease", "adopt", "commit", "clean"))
                  + "; persist's in all "
                  f"{statistics.median(sum(v for k, v in d.items() if k != 'spark') for d in native_steps):.3f}")
        if a.reads:
            reads(spark, a, {"native": native, "full": full, "unsorted": unsorted}, root, url,
                  s3)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def jvm_cpu(spark: Any) -> Any:
    """A function giving the CPU seconds (user + system) Spark's JVM has used so far."""
    import psutil  # type: ignore[import-untyped]  # NB: no stubs in the bench extra

    pid = spark.sparkContext._gateway.proc.pid
    proc = psutil.Process(pid)
    java = [p for p in [proc, *proc.children(recursive=True)] if "java" in p.name()]
    target = java[0] if java else proc

    def cpu() -> float:
        t = target.cpu_times()
        return float(t.user + t.system)

    return cpu


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    import os

    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def sorted_parts(url: str, s3: dict[str, str] | None) -> tuple[int, int]:
    """How many of collection ``c``'s blob parts at ``url`` are recorded sorted, of how many."""
    import persist

    with persist.open(url, read_only=True, storage_options=s3) as client:
        parts = [p for p in client._ix.state.collections["c"].parts if p.blob_key is not None]
    return sum(p.sorted is True for p in parts), len(parts)


def reads(spark: Any, a: argparse.Namespace, writes: dict[str, Any], root: Path, url: Any,
          s3: dict[str, str] | None) -> None:
    """Times a consolidated native read of the source written by each of ``writes``."""
    import operators

    urls = {}
    for name, fn in writes.items():
        out = root / f"read-{name}"
        fn(out)
        urls[name] = url(out)
    times: dict[str, list[float]] = {k: [] for k in urls}
    names = list(urls)

    def read(u: str) -> None:
        (operators.PersistTable.forPath(spark, u, "c", storage_options=s3).toDF()
         .write.format("noop").mode("overwrite").save())

    for name in names:  # warm-up
        read(urls[name])
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            read(urls[name])
            times[name].append(time.perf_counter() - t)
    for k, v in times.items():
        print(f"consolidated read of {k:8s}'s parts ({sorted_parts(urls[k], s3)[0]} sorted): "
              f"median {statistics.median(v):6.2f} s (rounds: "
              f"{', '.join(f'{x:.2f}' for x in v)})")
    print(f"load average {load()}")


if __name__ == "__main__":
    main()
