"""The native write path (``operators.write``) on ``s3://``, through S3A, against each S3 test
server (moto, ministack): persist's ``storage_options`` alone configure Spark's writer; the
parts Spark wrote are adopted from the lease's staging prefix and committed once; what is
stored is what a later read verifies; a driver killed between staging and commit lands nothing
and leaks nothing past its lease."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

import operators
import persist
from persist.blob.s3 import S3Blob
from persist.indexed.maintenance import gc
from persist.indexed.state import lease
from persist.layout import lease_of
from tests.spark.test_native_write import _driver, _rows, canon
from tests.support.engine import updates_between
from tests.support.faulty_proxy import FaultyProxy

pytestmark = [pytest.mark.spark, pytest.mark.s3]

#: Rows of a write whose part files the tests expect adopted as they are (each file well
#: above the adoption's inline size).
ROWS = 200_000


def _updates(url: str, options: dict[str, str], lo: int, hi: int) -> Any:
    import pyarrow as pa

    with persist.open(url, read_only=True, storage_options=options) as client:
        return pa.concat_tables(updates_between(client, "c", lo, hi))


def _upper(url: str, options: dict[str, str]) -> int:
    with persist.open(url, read_only=True, storage_options=options) as client:
        return client.info("c").upper


def _objects(s3_client: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                    Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return sorted(keys)


def test_a_native_write_to_s3_equals_the_sinks(spark: Any, s3a: None,
                                              s3_connection: dict[str, str], bucket: str,
                                              s3_client: Any) -> None:
    opts = dict(s3_connection)
    native, sink = f"s3://{bucket}/native", f"s3://{bucket}/sink"
    # NB: files well above the inline size (16 KiB), which the adoption would re-stage as
    # persist's own parts: 60,000 of these rows sorted by the key alone made files of 16 KiB
    df = _rows(spark, ROWS)
    written = operators.write(df, native, "c", storage_options=opts)
    assert written.native
    assert written.landed
    assert written.rows == ROWS
    (df.write.format("persist").mode("append").option("collection", "c")
     .options(**{f"storage_options.{k}": v for k, v in opts.items()}).save(sink))
    assert canon(_updates(native, opts, 0, 6)) == canon(_updates(sink, opts, 0, 6))
    assert _upper(native, opts) == _upper(sink, opts) == 6
    # what is stored under data/: Spark's part files in the job's staging prefix, nothing
    # else (no _temporary/ key, no _SUCCESS, no directory marker)
    data = _objects(s3_client, bucket, "native/data/")
    assert data
    assert all(k.rsplit("/", 2)[1].startswith("staged-") and k.endswith(".parquet")
               for k in data), data
    # reads of it (persist's and Spark's own) are exact
    table = operators.PersistTable.forPath(spark, native, "c", storage_options=opts)
    raw = table.toDF(consolidated=False)
    assert {u.rsplit("/", 1)[1] for u in raw.inputFiles()} == {k.rsplit("/", 1)[1]
                                                               for k in data}
    got = sorted(map(tuple, table.toDF().collect()), key=repr)
    ref = operators.PersistTable.forPath(spark, sink, "c", storage_options=opts).toDF()
    assert got == sorted(map(tuple, ref.collect()), key=repr)
    assert got
    # a flipped byte in a stored part is caught by the checksum recorded at adoption
    victim = data[0]
    body = bytearray(s3_client.get_object(Bucket=bucket, Key=victim)["Body"].read())
    body[len(body) // 2] ^= 0x10
    s3_client.put_object(Bucket=bucket, Key=victim, Body=bytes(body))
    with pytest.raises(persist.ChecksumMismatch):  # (uncached: the reads above cached it)
        _updates(native, {**opts, "cache_bytes": "0"}, 0, 6)


def test_a_driver_killed_between_staging_and_commit_on_s3_lands_once_or_not_at_all(
        s3a: None, s3_connection: dict[str, str], bucket: str, s3_client: Any) -> None:
    opts = dict(s3_connection)
    url = f"s3://{bucket}/loc"
    killed = _driver(url, 50_000, "adopt.adopted", json.dumps(opts))
    try:
        _, err = killed.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)  # its JVM, if it outlived the driver
    assert killed.returncode == -signal.SIGKILL, err[-3000:]
    staged = _objects(s3_client, bucket, "loc/data/")
    assert staged, "the killed driver staged nothing"
    assert _upper(url, opts) == 0  # nothing landed
    # the staged objects sit under the job's live lease: a sweep leaves them alone
    blob = S3Blob(bucket, "loc", storage_options=opts)
    with persist.open(url, read_only=True, storage_options=opts) as client:
        state = client.state
    (lid,) = {lease_of(k.removeprefix("loc/")) for k in staged}
    assert lid is not None
    sweeper = gc.LeakSweeper(grace_seconds=5.0, lease_skew_seconds=0.05)
    now = time.monotonic()
    assert sweeper.sweep(blob, lambda: state, now) == []
    assert sweeper.sweep(blob, lambda: state, now + 3600) == []
    assert _objects(s3_client, bucket, "loc/data/") == staged
    # once the lease is gone (revoked, as the sweep does once it lapses), every object goes
    lease.revoke(blob, lid)
    sweeper.sweep(blob, lambda: state, now + 7200)
    sweeper.sweep(blob, lambda: state, now + 10_800)
    assert _objects(s3_client, bucket, "loc/data/") == []
    # the job run again with its token lands once
    again = _driver(url, 50_000, None, json.dumps(opts))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert out.split() == ["done", "True", "50000"]
    assert _upper(url, opts) == 5
    assert len(_updates(url, opts, 0, 5)) == 50_000
    blob.close()


def test_a_session_setting_wins_and_an_s3a_failure_is_typed_with_nothing_written(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    opts = dict(s3_connection)
    url = f"s3://{bucket}/loc"
    hadoop = spark._jsc.hadoopConfiguration()
    # the session points S3A at a closed port: the write must use it (and fail naming the
    # setting), not the storage option's endpoint
    settings = {"fs.s3a.endpoint": "http://127.0.0.1:9", "fs.s3a.retry.limit": "0",
                "fs.s3a.attempts.maximum": "0"}
    for k, v in settings.items():
        hadoop.set(k, v)
    try:
        with pytest.raises(persist.ExternalError) as got:
            operators.write(_rows(spark, 1000), url, "c", storage_options=opts)
    finally:
        for k in settings:
            hadoop.unset(k)
    first = str(got.value).splitlines()[0]
    assert first.startswith("S3A could not reach the store")
    assert "endpoint_url" in first
    assert "http://127.0.0.1:9" in first
    assert _objects(s3_client, bucket, "loc/data/") == []  # nothing staged is left
    assert _upper(url, opts) == 0  # nothing landed


class _Copies:
    """``FaultyProxy``'s ``fail``: records the source of every server-side copy S3A makes (a
    PUT with ``x-amz-copy-source``, not boto3's) and fails no request."""

    def __init__(self) -> None:
        self.sources: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, headers: Mapping[str, str]) -> bool:
        source = headers.get("x-amz-copy-source")
        if method == "PUT" and source and "boto" not in headers.get("user-agent", "").lower():
            with self._lock:
                self.sources.append(source)
        return False


def test_spark_renames_each_part_once_within_the_lease_prefix(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    copies = _Copies()
    with FaultyProxy(s3_connection["endpoint_url"], copies, max_seconds=300) as proxy:
        via = {**s3_connection, "endpoint_url": proxy.url}
        written = operators.write(_rows(spark, ROWS), f"s3://{bucket}/loc", "c",
                                  storage_options=via)
    assert written.native
    data = _objects(s3_client, bucket, "loc/data/")
    assert written.parts == len(data) == 3
    # FileOutputCommitter's algorithm 2: one copy per file, at its task's commit (algorithm 1
    # copies each twice), from the task attempt's file under the staging directory
    assert len(copies.sources) == len(data), copies.sources
    staged = data[0].rsplit("/", 1)[0]
    assert all(f"{staged}/_temporary/" in src.replace("%2F", "/") for src in copies.sources)
