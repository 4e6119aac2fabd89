"""W9's rows for issue 30 (Spark on S3 both ways), each against its floor in one run.

* **Writes from Spark** (:func:`writes`): one DataFrame (``spark.read.parquet`` of local zstd
  files) written by persist's ``operators.write`` (the native path: Spark's Parquet writer,
  sorted within partitions by the key, each file's full order checked at adoption, adopted
  and committed), in the floor column by
  ``df.sortWithinPartitions("key", "value", "time").write.parquet`` (zstd: the issue's target,
  the same writer), and in the *sink* column by the ``persist`` sink (``df.write.format
  ("persist")``, rows handed to Python workers): on local files (W9's rows) and on each S3
  server (``--w9-s3-rows``). Targets: native >= 0.9x the sorted Parquet write, >= 1.5x the
  sink.
* **Reads through S3A** (:func:`reads`), per S3 test server on loopback (moto, ministack):
  ``PersistTable.toDF(consolidated=False)`` to the ``noop`` sink against ``spark.read.parquet``
  of the same part files copied into a folder of their own (target >= 0.9x), and the requests
  of a first and a later read of each on fresh buckets, recorded by a loopback proxy (every
  request: Spark's GET, HEAD, LIST and persist's own; target <= 1.2x Parquet's).
* **A mistyped S3 setting** (:func:`typed_error`): ``fs.s3a.endpoint`` pointing at a closed
  port (S3A's retries off on both sides, ``fs.s3a.retry.limit`` and
  ``fs.s3a.attempts.maximum`` 0), the seconds from ``toDF`` to persist's typed error, against
  the seconds ``spark.read.parquet`` with the same setting takes to fail; each on a fresh bucket
  (Hadoop keeps one S3A file system per bucket, made with the first read's settings), and
  nothing written (checked).

The S3 rows need the S3A JARs (``./dev jars s3a``, resolved with Maven once per machine) on
W9's session (:func:`spark_jars`); without them they are skipped with the reason. ``--quick``
runs them on moto only, at ``--w9-s3-rows`` of the quick run, one round.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench.common import make_batch, remove, rotate, settle, timed
from bench.results import WorkloadResult
from bench.workloads.context import Context

#: The S3 test servers W9 runs against (``tests/support/s3_servers.py``); ``--quick``: moto.
SERVERS = ("moto", "ministack")
#: The column of the persist sink beside the native write (not a system: no status).
SINK = "sink"
WRITE_SORTED = ("Spark write records/s, {where} (operators.write; floor: the same DataFrame "
                "sortWithinPartitions(key, value, time).write.parquet; sink: the persist sink)")
S3_READ = ("native raw read through S3A records/s, {server} (floor: spark.read.parquet of the "
           "same files through S3A)")
S3_REQUESTS = ("requests of a {which} native raw read through S3A, {server} (GET+HEAD+LIST, "
               "persist's included; floor: spark.read.parquet's)")
TYPED_ERROR = ("mistyped fs.s3a.endpoint, {server}: s to persist's typed error (floor: s to "
               "spark.read.parquet's error)")


def spark_jars() -> tuple[str | None, str | None]:
    """``spark.jars`` for the S3A connector (hadoop-aws and the AWS SDK bundle), or None and
    why it cannot be had here."""
    try:
        from tests.support import jars
    except ImportError as e:
        return None, f"tests.support is not importable ({e})"
    try:
        return jars.spark_jars("s3a"), None
    except jars.JarsUnavailable as e:
        return None, f"the S3A JARs are not available ({e}); ./dev jars s3a fetches them"


def _source(spark: Any, root: Path, rows: int, files: int = 3) -> Any:
    """A DataFrame of ``rows`` W9 records (``spark.read.parquet`` of ``files`` local zstd
    files: ``files`` partitions)."""
    out = root / f"source-{rows}"
    if not out.exists():
        out.mkdir(parents=True)
        each = -(-rows // files)
        for i in range(files):
            n = min(each, rows - i * each)
            pq.write_table(make_batch(9500 + i, n, time_lo=i), out / f"part-{i}.parquet",
                           compression="zstd")
    return spark.read.parquet(str(out))


def writes(ctx: Context, res: WorkloadResult, spark: Any, df: Any, rows: int, *, where: str,
           url: Callable[[str], str], storage_options: dict[str, str] | None,
           s3a: dict[str, str], repeats: int, cleanup: Callable[[], None]) -> None:
    """``df`` written natively, as sorted Parquet (floor) and by the sink, one warm-up each,
    then ``repeats`` rounds, order rotated: :data:`WRITE_SORTED` for ``where``. ``url(tag)``:
    a fresh location (``s3://`` or ``file://``); Spark's Parquet write goes to its ``s3a://``
    spelling with the ``s3a`` options."""
    import operators

    storage = storage_options or {}

    def native(tag: str) -> None:
        w = operators.write(df, url(f"native-{tag}"), "c", storage_options=storage)
        if not w.native:
            raise RuntimeError(f"W9 write: operators.write took the sink ({w.why})")

    def parquet(tag: str) -> None:
        target = url(f"parquet-{tag}")
        target = ("s3a://" + target[len("s3://"):] if target.startswith("s3://")
                  else target.removeprefix("file://"))
        (df.sortWithinPartitions("key", "value", "time").write.options(**s3a)
         .option("compression", "zstd").parquet(target))

    def sink(tag: str) -> None:
        (df.write.format("persist").mode("append").option("collection", "c")
         .options(**{f"storage_options.{k}": v for k, v in storage.items()})
         .save(url(f"sink-{tag}")))

    cases: list[tuple[str, Callable[[str], None]]] = [
        ("persist", native), ("floor", parquet), (SINK, sink)]
    for _, f in cases:
        f("warm")
    cleanup()
    metric = WRITE_SORTED.format(where=where)
    for r in range(repeats):
        for column, f in rotate(cases, r):
            ctx.log(f"W9 write {where} round {r + 1}/{repeats}: {column}")
            settle()
            with timed() as t:
                f(str(r))
            res.add(metric, "rec/s", "higher", column, rows / t.seconds)
        cleanup()


@contextlib.contextmanager
def _server(name: str) -> Iterator[dict[str, str]]:
    from tests.support import s3_servers

    with tempfile.TemporaryDirectory(prefix=f"persist-w9-{name}-") as tmp, \
            s3_servers.start(name, Path(tmp)) as server:
        yield server.connection()


def _client(s3: dict[str, str]) -> Any:
    from persist.blob import aws

    opts, _ = aws.AwsOptions.split(s3)
    return aws.client("s3", opts)


def _bucket(client: Any, what: str) -> str:
    name = f"w9-{what}-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


def _objects(client: Any, bucket: str) -> list[str]:
    got = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in got)


def reads(ctx: Context, res: WorkloadResult, spark: Any, s3: dict[str, str], server: str, *,
          rows: int, parts: int, repeats: int) -> None:
    """The native raw read through S3A against ``spark.read.parquet`` of the same files
    (:data:`S3_READ`), and the requests of a first and a later read of each
    (:data:`S3_REQUESTS`)."""
    from bench.native_read_s3 import _copy, _fill, kind
    from operators import PersistTable
    from persist.distributed import hadoop_options
    from tests.support.faulty_proxy import FaultyProxy, Recorder

    client = _client(s3)
    native_b, plain_b = _bucket(client, "n"), _bucket(client, "p")
    url = f"s3://{native_b}/loc"
    _fill(url, s3, rows, parts)
    _copy(client, native_b, plain_b, data_only=True)
    n = rows // parts * parts
    table = PersistTable.forPath(spark, url, "c", storage_options=s3)
    s3a = hadoop_options(f"s3://{plain_b}", s3)

    def native() -> Any:
        return table.toDF(consolidated=False)

    def parquet() -> Any:
        return spark.read.options(**s3a).parquet(f"s3a://{plain_b}/plain/")

    if not native().count() == parquet().count() == n:
        raise RuntimeError(f"W9 S3 reads: the native read and Parquet's disagree on {n} rows")
    cases = [("persist", native), ("floor", parquet)]
    for _, f in cases:  # warm-up
        f().write.format("noop").mode("overwrite").save()
    metric = S3_READ.format(server=server)
    for r in range(repeats):
        for column, f in rotate(cases, r):
            settle()
            with timed() as t:
                f().write.format("noop").mode("overwrite").save()
            res.add(metric, "rec/s", "higher", column, n / t.seconds)

    # the requests, through a recording proxy, on fresh buckets (S3A keeps one file system
    # per bucket: a fresh one is a first read)
    recorder = Recorder()
    n2, p2 = _bucket(client, "n2"), _bucket(client, "p2")
    _copy(client, native_b, n2, data_only=False)
    _copy(client, plain_b, p2, data_only=False)
    with FaultyProxy(s3["endpoint_url"], recorder, max_seconds=600) as proxy:
        via = {**s3, "endpoint_url": proxy.url}
        t2 = PersistTable.forPath(spark, f"s3://{n2}/loc", "c", storage_options=via)
        s3a2 = hadoop_options(f"s3://{p2}", via)
        recorder.take()
        for which in ("first", "later"):
            t2.toDF(consolidated=False).write.format("noop").mode("overwrite").save()
            ours = [kind(*q) for q in recorder.take()]
            (spark.read.options(**s3a2).parquet(f"s3a://{p2}/plain/")
             .write.format("noop").mode("overwrite").save())
            theirs = [kind(*q) for q in recorder.take()]
            metric = S3_REQUESTS.format(which=which, server=server)
            res.add(metric, "requests", "lower", "persist", len(ours))
            res.add(metric, "requests", "lower", "floor", len(theirs))
            ctx.log(f"W9 S3 requests, {which} read on {server}: native "
                    f"{sorted(ours)}; parquet {sorted(theirs)}")


def typed_error(ctx: Context, res: WorkloadResult, spark: Any, s3: dict[str, str],
                server: str, *, repeats: int) -> None:
    """:data:`TYPED_ERROR`: each round on fresh buckets (a tiny collection, its files copied
    as plain Parquet), persist's ``toDF`` and ``spark.read.parquet`` with a closed port as
    ``fs.s3a.endpoint``; persist's error must be typed, name ``endpoint_url`` on its first
    line, and leave the bucket as it was."""
    import socket

    import persist
    from bench.native_read_s3 import _copy, _fill
    from operators import PersistTable
    from persist.distributed import hadoop_options

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    wrong = {"fs.s3a.endpoint": closed, "fs.s3a.retry.limit": "0",
             "fs.s3a.attempts.maximum": "0"}
    client = _client(s3)
    seed = _bucket(client, "e")
    _fill(f"s3://{seed}/loc", s3, 1000, 2)
    metric = TYPED_ERROR.format(server=server)
    opened: list[float] = []  # forPath's share: persist's metadata, before Spark is asked
    for r in range(repeats):
        native_b, plain_b = _bucket(client, "en"), _bucket(client, "ep")
        _copy(client, seed, native_b, data_only=False)
        _copy(client, seed, plain_b, data_only=True)
        before = _objects(client, native_b)

        def ours(b: str = native_b) -> None:
            t0 = time.perf_counter()
            table = PersistTable.forPath(spark, f"s3://{b}/loc", "c", storage_options=s3,
                                         reader_options=wrong)
            opened.append(time.perf_counter() - t0)
            try:
                table.toDF(consolidated=False)
            except persist.PersistError as e:
                first = str(e).splitlines()[0]
                if "endpoint_url" not in first:
                    raise RuntimeError(f"W9: the typed error does not name endpoint_url: "
                                       f"{first}") from e
                return
            raise RuntimeError("W9: toDF with a mistyped endpoint did not fail")

        def theirs(b: str = plain_b) -> None:
            try:
                (spark.read.options(**{**hadoop_options(f"s3://{b}", s3), **wrong})
                 .parquet(f"s3a://{b}/plain/"))
            except Exception:
                return
            raise RuntimeError("W9: spark.read.parquet with a mistyped endpoint did not fail")

        for column, f in rotate([("persist", ours), ("floor", theirs)], r):
            t0 = time.perf_counter()
            f()
            res.add(metric, "s", "lower", column, time.perf_counter() - t0)
        if _objects(client, native_b) != before:
            raise RuntimeError("W9: a failed read changed the bucket")
    res.notes.append(f"mistyped setting on {server}: persist's time includes forPath (its "
                     f"metadata read through boto3, before Spark is asked anything): median "
                     f"{statistics.median(opened):.3f} s")


def run(ctx: Context, res: WorkloadResult, spark: Any, root: Path, *, local_rows: int,
        rows: int, parts: int, repeats: int, quick: bool, why: str | None) -> None:
    """Every issue-30 row (see the module docstring); ``why``: why the S3 rows cannot run
    (no S3A JARs), or None."""
    if SINK not in res.extra:
        res.extra.append(SINK)
        res.columns[SINK] = "persist sink (df.write.format('persist'))"
    out = root / "writes-sorted"
    local = spark.read.parquet(str(root / "parquet"))
    writes(ctx, res, spark, local, local_rows, where="local files",
           url=lambda tag: f"file://{out}/{tag}", storage_options=None, s3a={},
           repeats=repeats, cleanup=lambda: remove(out))
    remove(out)
    if why is not None:
        res.notes.append(f"issue 30's S3 rows: not run: {why}")
        return
    servers = SERVERS[:1] if quick else SERVERS
    for server in servers:
        ctx.log(f"W9: issue 30 on {server} (S3A): reads, requests, a mistyped setting, writes")
        with _server(server) as s3:
            reads(ctx, res, spark, s3, server, rows=rows, parts=parts, repeats=repeats)
            typed_error(ctx, res, spark, s3, server, repeats=repeats)
            client = _client(s3)
            bucket = _bucket(client, "w")
            from persist.distributed import hadoop_options

            def clean(b: str = bucket, c: Any = client) -> None:
                for key in _objects(c, b):
                    c.delete_object(Bucket=b, Key=key)

            writes(ctx, res, spark, _source(spark, root, rows), rows, where=f"to {server}",
                   url=lambda tag, b=bucket: f"s3://{b}/{tag}", storage_options=s3,
                   s3a=hadoop_options(f"s3://{bucket}", s3), repeats=repeats, cleanup=clean)
    if quick:
        res.notes.append("issue 30 on S3: --quick runs moto only, one round")
    res.notes.append(
        f"issue 30: writes: operators.write (native) against the same DataFrame sorted within "
        f"partitions and written by df.write.parquet (zstd; floor) and against the persist sink "
        f"(sink column), one warm-up each, {repeats} round(s) rotated; local: W9's rows, S3: "
        f"{rows:,} rows in 3 partitions to a bucket of each server. S3A reads: {rows:,} rows in "
        f"{parts} part files, PersistTable.toDF(consolidated=False) against spark.read.parquet "
        f"of the same files copied to a folder, to the noop sink (hadoop-aws's default input "
        f"stream caches blocks across reads: warm reads); requests: every request of a first "
        f"and a later read on fresh buckets, through a recording proxy. Mistyped setting: "
        f"fs.s3a.endpoint a closed port, S3A's retries off on both sides")


def main(argv: list[str] | None = None) -> int:
    """Issue 30's rows of W9 alone, in one session (what ``bench.run --workloads W9`` runs
    after W9's other rows): ``python -m bench.workloads.w9_s3 [--rows N] [--s3-rows N]
    [--repeats N] [--quick]``. Prints the rows and their targets."""
    import argparse

    from bench.common import fresh_dir
    from bench.report import render_targets, render_workload, targets
    from bench.workloads import w9_spark

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__
                                 else None)
    ap.add_argument("--rows", type=int, default=5_000_000, help="local write rows (W9's)")
    ap.add_argument("--part-rows", type=int, default=1_000_000)
    ap.add_argument("--s3-rows", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="persist-w9-s3-"))
    ctx = Context(argparse.Namespace(repeats=a.repeats, peer_repeats=1), work,
                  ["persist", "floor"])
    res = WorkloadResult(w9_spark.WID, "issue 30's rows of W9")
    res.columns["floor"] = "floor (spark.read.parquet / df.write.parquet)"
    root = fresh_dir(work, "w9")
    try:
        ctx.log(f"writing {a.rows:,} records to persist and to Parquet")
        w9_spark.prepare(root, a.rows, a.part_rows)
        jars, why = spark_jars()
        with w9_spark.spark_session(fast_start=a.quick,
                                    conf=None if jars is None else {"spark.jars": jars}) as spark:
            run(ctx, res, spark, root, local_rows=a.rows, rows=a.s3_rows, parts=4,
                repeats=a.repeats, quick=a.quick, why=why)
    finally:
        remove(work)
    print(render_workload(res, ["persist", "floor"]))
    print(render_targets(targets({w9_spark.WID: res})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
