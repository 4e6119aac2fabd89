"""Helpers shared by the Spark tests: filling collections, comparing Arrow results."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

import persist
from persist.errors import InvalidUsage
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.support.engine import updates_between


def session_builder(app: str, *, jars: tuple[str, ...] = ()) -> Any:
    """A ``SparkSession.Builder`` with the test sessions' settings: local[2], C1 JIT and serial
    GC (the JVM starts about twice as fast: ~8 s instead of ~17 s, measured), no UI, two
    shuffle partitions, loopback only. Shared by the test session and the driver processes the kill test starts.

    ``jars``: sets of :mod:`tests.support.jars` to put on the classpath (``"s3a"``: Spark's own
    readers reach ``s3a://``), fetched with Maven first if this machine has not yet.

    Raises:
        tests.support.jars.JarsUnavailable: a set of ``jars`` cannot be fetched here.
    """
    from pyspark.sql import SparkSession

    from tests.support import jars as jar_sets

    builder = SparkSession.builder
    if jars:
        builder = jar_sets.with_jars(builder, *jars)
    return (
        builder.master("local[2]")
        .appName(app)
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )


def s3a_options(connection: dict[str, str]) -> dict[str, str]:
    """Hadoop S3A settings that reach the S3 server of ``connection`` (a test server's
    ``storage_options``), as options of one read (``spark.read.options(**...)``; Spark passes a
    file source's options into the Hadoop configuration of that read) or, prefixed with
    ``spark.hadoop.``, of a whole session. Path-style access: the test servers serve buckets by
    path, not by host name."""
    endpoint = connection["endpoint_url"]
    return {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": connection["region_name"],
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https:")).lower(),
        "fs.s3a.access.key": connection["aws_access_key_id"],
        "fs.s3a.secret.key": connection["aws_secret_access_key"],
        "fs.s3a.aws.credentials.provider":
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }


def location(tmp_path: Path, name: str = "loc") -> str:
    return f"file://{tmp_path / name}"


def updates_at(t: int, n: int, *, keys: int = 50, retract_every: int = 3) -> list[Any]:
    """``n`` updates at time ``t`` over ``keys`` keys, some retracting earlier ones."""
    out: list[Any] = []
    for i in range(n):
        k = (t * 7 + i) % keys
        diff = -1 if i % retract_every == 2 else 1
        out.append(((f"k{k:03d}", k * 10 + t % 3), t, diff))
    return out


#: Engine options that never compact: every append stays its own part.
NO_COMPACTION = persist.Options(compaction=CompactionPolicy(fanin=1 << 30, inline_flush_bytes=1 << 62))


def fill(url: str, name: str, times: Iterable[int], rows: int = 40, *,
         compact: bool = True, **kw: Any) -> None:
    """Appends ``rows`` updates at each of ``times``, sealing after each."""
    with persist.open(url, options=None if compact else NO_COMPACTION) as client:
        w, _ = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
        for t in times:
            w.append(updates_at(t, rows, **kw), upper=t + 1).result()


def compact(client: persist.Client) -> None:
    """Runs compaction until there is nothing left to do.

    NB: ``Client.maintain`` races the runtime's own background maintenance (both may plan the
    same merge; the loser's commit is refused with InvalidUsage): retry until quiet.
    """
    for _ in range(100):
        try:
            if not client.maintain():
                return
        except InvalidUsage:
            time.sleep(0.02)


def canon(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows of ``table`` (key, value, time, diff) as sorted tuples: order-free comparison."""
    cols = [table.column(c).to_pylist() for c in ("key", "value", "time", "diff")]
    return sorted(zip(*cols, strict=True))


def sums(table: pa.Table) -> dict[tuple[Any, Any], int]:
    """Diffs summed per (key, value), zeros dropped."""
    out: dict[tuple[Any, Any], int] = {}
    for k, v, d in zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                       table.column("diff").to_pylist(), strict=True):
        out[(k, v)] = out.get((k, v), 0) + d
    return {kv: d for kv, d in out.items() if d}


class Collected:
    """A ``foreachBatch`` target that keeps every micro-batch as an Arrow table."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, pa.Table]] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        table = df.toArrow()
        with self._lock:
            self.batches.append((batch_id, table))

    @property
    def tables(self) -> list[pa.Table]:
        with self._lock:
            return [t for _, t in self.batches]

    def all(self) -> pa.Table:
        tables = [t for t in self.tables if t.num_rows]
        if not tables:
            return pa.table({"key": pa.array([], pa.string()), "value": pa.array([], pa.int64()),
                             "time": pa.array([], pa.int64()), "diff": pa.array([], pa.int64())})
        return pa.concat_tables(tables)

    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables)


def expected_updates(url: str, name: str, lo: int, hi: int) -> pa.Table:
    """Every update of ``name`` with ``lo <= time < hi`` (exact, original times)."""
    with persist.open(url, read_only=True) as client:
        schema = client._ix.state.collections[name]
        tables = updates_between(client, name, lo, hi)
        del schema
    if not tables:
        return pa.table({"key": pa.array([], pa.string()), "value": pa.array([], pa.int64()),
                         "time": pa.array([], pa.uint64()), "diff": pa.array([], pa.int64())})
    return pa.concat_tables(tables)
