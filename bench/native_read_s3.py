"""The native raw read through S3A against ``spark.read.parquet`` of the same files (issue 30).

    PYSPARK_PYTHON=.venv/bin/python python -m bench.native_read_s3 [--s3 moto|ministack]
        [--rows 2000000] [--parts 4] [--rounds 5]

An S3 test server on loopback (``tests/support/s3_servers.py``), one ``local[2]`` session with
the S3A JARs (``./dev jars s3a``). A collection of ``--rows`` rows in ``--parts`` appends (one
part file each, ``inline_threshold=0``); the same files copied server-side into a folder of
their own, read as plain Parquet. Each round runs, in a rotated order:

* *native*: ``PersistTable.forPath(...).toDF(consolidated=False)`` written to Spark's ``noop``
  sink (the plan, Spark's listing and every row decoded);
* *anew*: the same from a new ``PersistTable.forPath`` (the metadata read anew: a LIST of the
  rollups, the newest one, a GET per log entry after it; what every ``toDF`` read before the
  table held its metadata);
* *toDF*: the plan alone (``toDF`` without running it: persist's metadata, the tails, Spark's
  file index);
* *parquet*: ``spark.read.parquet`` of the copied folder to the ``noop`` sink.

Printed: each case's median seconds and rate, native/parquet (of rates), and then the
requests of two reads of each, the first and the second of the session, recorded by a
loopback proxy (``tests/support/faulty_proxy.py``) in front of the server on fresh buckets
(S3A keeps one file system per bucket, built with the first read's endpoint): by kind (GET,
HEAD, LIST, persist's metadata, persist's own requests on data files) and by object.

``--stream`` sets the session's ``fs.s3a.input.stream.type``: hadoop-aws 3.5's ``default`` is
the analytics accelerator, which caches blocks across reads in the JVM (timed rounds after
the warm-up then read little from the server); ``classic`` GETs every read's bytes.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def kind(method: str, path: str, agent: str) -> str:
    """``meta`` (persist's metadata), ``persist`` (persist's own other requests, told by
    boto3's User-Agent), else Spark's ``GET``/``HEAD``/``LIST``."""
    if "/meta/" in path or "%2Fmeta%2F" in path:
        return "meta"
    if "boto" in agent.lower():
        return "persist"
    if method == "GET" and "list-type=" in path:
        return "LIST"
    return method


def report(what: str, requests: list[tuple[str, str, str]]) -> collections.Counter[str]:
    kinds = collections.Counter(kind(*r) for r in requests)
    data = sum(kinds[k] for k in ("GET", "HEAD", "LIST"))
    print(f"  {what}: {dict(kinds)}; Spark's GET+HEAD+LIST {data}, all {sum(kinds.values())}")
    by = collections.Counter(f"{kind(*r):7s} {r[1].split('?')[0][-60:]}"
                             + (" ?" + r[1].split("?")[1][:50] if "?" in r[1] else "")
                             for r in requests)
    for k, n in sorted(by.items()):
        print(f"      {n:3d}  {k}")
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--s3", choices=("moto", "ministack"), default="moto")
    ap.add_argument("--stream", choices=("default", "classic", "analytics", "prefetch"),
                    default="default", help="fs.s3a.input.stream.type of the session")
    a = ap.parse_args()
    from tests.support import s3_servers

    with tempfile.TemporaryDirectory(prefix="persist-bench-s3-") as tmp, \
            s3_servers.start(a.s3, Path(tmp)) as server:
        run(a, server.connection())


def _fill(url: str, s3: dict[str, str], rows: int, parts: int) -> None:
    import numpy as np
    import pyarrow as pa

    import persist

    rng = np.random.default_rng(30)
    each = rows // parts
    with persist.open(url, storage_options=dict(s3),
                      options=persist.Options(inline_threshold=0,
                                              background_compaction=False)) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(parts):
            keys = np.arange(t * each, (t + 1) * each, dtype=np.int64)
            w.append(pa.table({"key": keys, "value": rng.integers(0, 1 << 40, each),
                               "time": np.full(each, t, np.int64),
                               "diff": np.ones(each, np.int64)}), upper=t + 1).result()


def _copy(client: Any, src: str, dst: str, *, data_only: bool) -> None:
    """Every object of bucket ``src`` (only the data files, into ``plain/``, if
    ``data_only``) copied server-side into bucket ``dst``."""
    for o in client.list_objects_v2(Bucket=src).get("Contents", []):
        key = o["Key"]
        if data_only and "/data/" not in key:
            continue
        to = "plain/" + key.rsplit("/", 1)[1] if data_only else key
        client.copy_object(Bucket=dst, Key=to, CopySource={"Bucket": src, "Key": key})


def run(a: argparse.Namespace, s3: dict[str, str]) -> None:
    from pyspark.sql import SparkSession

    from operators import PersistTable
    from persist.blob import aws
    from persist.distributed import hadoop_options
    from tests.support import jars
    from tests.support.faulty_proxy import FaultyProxy, Recorder

    opts, _ = aws.AwsOptions.split(s3)
    client = aws.client("s3", opts)
    tag = uuid.uuid4().hex[:8]
    native_b, plain_b = f"bench-n-{tag}", f"bench-p-{tag}"
    for b in (native_b, plain_b):
        client.create_bucket(Bucket=b)
    url = f"s3://{native_b}/loc"
    _fill(url, s3, a.rows, a.parts)
    _copy(client, native_b, plain_b, data_only=True)

    spark = (jars.with_jars(SparkSession.builder, "s3a").master("local[2]")
             .appName("persist-native-read-s3-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.hadoop.fs.s3a.input.stream.type", a.stream).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        table = PersistTable.forPath(spark, url, "c", storage_options=s3)
        s3a = hadoop_options(f"s3://{plain_b}", s3)

        def native() -> None:
            table.toDF(consolidated=False).write.format("noop").mode("overwrite").save()

        def anew() -> None:
            (PersistTable.forPath(spark, url, "c", storage_options=s3)
             .toDF(consolidated=False).write.format("noop").mode("overwrite").save())

        def plan() -> None:
            table.toDF(consolidated=False)

        def parquet() -> None:
            (spark.read.options(**s3a).parquet(f"s3a://{plain_b}/plain/")
             .write.format("noop").mode("overwrite").save())

        n = table.toDF(consolidated=False).count()
        m = spark.read.options(**s3a).parquet(f"s3a://{plain_b}/plain/").count()
        assert n == m == a.rows // a.parts * a.parts, (n, m)
        cases = {"native": native, "anew": anew, "toDF": plan, "parquet": parquet}
        for fn in cases.values():  # warm-up: JIT, codegen
            fn()
        times: dict[str, list[float]] = {k: [] for k in cases}
        names = list(cases)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t = time.perf_counter()
                cases[name]()
                times[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{n} rows in {a.parts} files, {a.rounds} rounds, {a.s3} (S3A, input stream "
              f"{a.stream})")
        for k, v in med.items():
            print(f"{k:8s} median {v:6.3f} s  {n / v / 1e6:5.2f} M rows/s  "
                  f"(rounds: {', '.join(f'{x:.3f}' for x in times[k])})")
        print(f"native / parquet rate: {med['parquet'] / med['native']:.2f}x (target >= 0.9); "
              f"anew / parquet {med['parquet'] / med['anew']:.2f}x")

        # the requests, through a recording proxy, on fresh buckets
        recorder = Recorder()
        n2, p2 = f"bench-n2-{tag}", f"bench-p2-{tag}"
        for b in (n2, p2):
            client.create_bucket(Bucket=b)
        _copy(client, native_b, n2, data_only=False)
        _copy(client, plain_b, p2, data_only=False)
        with FaultyProxy(s3["endpoint_url"], recorder, max_seconds=600) as proxy:
            via = {**s3, "endpoint_url": proxy.url}
            t2 = PersistTable.forPath(spark, f"s3://{n2}/loc", "c", storage_options=via)
            s3a2 = hadoop_options(f"s3://{p2}", via)
            recorder.take()
            print("requests (through a recording proxy):")
            for i in ("first", "second"):
                t2.toDF(consolidated=False).write.format("noop").mode("overwrite").save()
                got = report(f"native, {i} read", recorder.take())
                (spark.read.options(**s3a2).parquet(f"s3a://{p2}/plain/")
                 .write.format("noop").mode("overwrite").save())
                want = report(f"parquet, {i} read", recorder.take())
                d = sum(got[k] for k in ("GET", "HEAD", "LIST"))
                b = sum(want[k] for k in ("GET", "HEAD", "LIST"))
                print(f"  {i}: native/parquet GET+HEAD+LIST {d}/{b} = {d / b:.2f}x; "
                      f"all requests {sum(got.values())}/{sum(want.values())} = "
                      f"{sum(got.values()) / sum(want.values()):.2f}x")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
