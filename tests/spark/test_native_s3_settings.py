"""One set of S3 settings for the native read path (issue 30): ``storage_options`` alone
configure Spark's S3A reader, the session's own ``fs.s3a.*`` settings win, and S3A's failures
are persist's typed errors naming the setting to fix. A real SparkSession against each S3 test
server (moto, ministack).

NB: Hadoop caches one S3A file system per bucket and JVM, made with the settings of the first
read of that bucket: each test here reads a fresh bucket first with the settings it tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persist
from operators import PersistTable
from persist.distributed import hadoop_options, s3a_failure

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def _fill(url: str, connection: dict[str, str], appends: int = 2, rows: int = 1000) -> None:
    with persist.open(url, storage_options=dict(connection),
                      options=persist.Options(inline_threshold=0,
                                              background_compaction=False)) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(appends):
            keys = np.arange(t * rows, (t + 1) * rows, dtype=np.int64)
            w.append(pa.table({"key": keys, "value": keys % 7,
                               "time": np.full(rows, t, np.int64),
                               "diff": np.ones(rows, np.int64)}), upper=t + 1).result()


def _objects(s3_client: Any, bucket: str) -> list[str]:
    got = s3_client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in got)


def test_the_mapping_of_storage_options_to_s3a(monkeypatch: pytest.MonkeyPatch) -> None:
    got = hadoop_options("s3://b/p", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "region": "r",
                                      "addressing_style": "path", "aws_access_key_id": "a",
                                      "aws_secret_access_key": "s", "cache_bytes": 5})
    assert got["fs.s3a.endpoint"] == "http://127.0.0.1:9"
    assert got["fs.s3a.connection.ssl.enabled"] == "false"
    assert got["fs.s3a.endpoint.region"] == "r"
    assert got["fs.s3a.path.style.access"] == "true"
    assert (got["fs.s3a.access.key"], got["fs.s3a.secret.key"]) == ("a", "s")
    assert got["fs.s3a.aws.credentials.provider"].endswith("SimpleAWSCredentialsProvider")
    token = hadoop_options("s3://b/p", {"aws_access_key_id": "a", "aws_secret_access_key": "s",
                                        "aws_session_token": "t"})
    assert token["fs.s3a.session.token"] == "t"
    assert token["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    bare = hadoop_options("s3://b/p", {})
    assert not any(k in bare for k in ("fs.s3a.endpoint", "fs.s3a.access.key",
                                       "fs.s3a.aws.credentials.provider"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://s3.example")  # as boto3 reads it
    assert hadoop_options("s3://b/p", {})["fs.s3a.endpoint"] == "https://s3.example"
    assert hadoop_options("s3://b/p", {})["fs.s3a.connection.ssl.enabled"] == "true"
    assert hadoop_options("s3://b/p", {"endpoint_url": "http://a"})["fs.s3a.endpoint"] \
        == "http://a"
    assert hadoop_options("file:///tmp/x", {"endpoint_url": "http://x"}) == {}
    with pytest.raises(persist.InvalidUsage, match="twice"):
        hadoop_options("s3://b/p", {"endpoint_url": "http://a", "AWS_ENDPOINT_URL": "http://b"})
    # failures are told by class names, never message text
    assert s3a_failure("s3a://b/k", ["java.lang.RuntimeException"], {}) is None
    assert s3a_failure("s3a://b/k", ["java.io.FileNotFoundException"], {}) is None


def test_storage_options_alone_configure_spark(spark: Any, s3a: None,
                                               s3_connection: dict[str, str],
                                               bucket: str) -> None:
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection))
    df = table.toDF(consolidated=False)
    assert all(f.startswith("s3a://") for f in df.inputFiles())
    (rows, keys), = df.selectExpr("count(*)", "sum(key)").collect()
    assert (rows, keys) == (2000, sum(range(2000)))


def test_a_session_setting_wins_over_storage_options(spark: Any, s3a: None,
                                                     s3_connection: dict[str, str],
                                                     bucket: str, s3_client: Any) -> None:
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    before = _objects(s3_client, bucket)
    hadoop = spark._jsc.hadoopConfiguration()
    # the session points this bucket's S3A at a closed port: the read must use it (and fail
    # naming the setting), not the storage option's endpoint
    key = "fs.s3a.endpoint"
    hadoop.set(key, "http://127.0.0.1:9")
    for k, v in (("fs.s3a.retry.limit", "0"), ("fs.s3a.attempts.maximum", "0")):
        hadoop.set(k, v)
    try:
        table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection))
        with pytest.raises(persist.ExternalError) as got:
            table.toDF(consolidated=False)
    finally:
        for k in (key, "fs.s3a.retry.limit", "fs.s3a.attempts.maximum"):
            hadoop.unset(k)
    first = str(got.value).splitlines()[0]
    assert first.startswith("S3A could not reach the store")
    assert "endpoint_url" in first
    assert "http://127.0.0.1:9" in first
    assert _objects(s3_client, bucket) == before  # nothing written


def test_wrong_credentials_are_a_typed_error_naming_them(spark: Any, s3a: None,
                                                         s3_connection: dict[str, str],
                                                         bucket: str, s3_client: Any) -> None:
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    before = _objects(s3_client, bucket)
    # NB: the test servers accept any key: an empty one is what S3A itself refuses
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection),
                                 reader_options={"fs.s3a.access.key": "",
                                                 "fs.s3a.secret.key": ""})
    with pytest.raises(persist.Determinate) as got:
        table.toDF(consolidated=False)
    first = str(got.value).splitlines()[0]
    assert first.startswith("S3A could not authenticate")
    assert "aws_access_key_id" in first
    assert "aws_secret_access_key" in first
    assert got.value.__cause__ is None
    assert got.value.__suppress_context__
    assert _objects(s3_client, bucket) == before


def test_a_wrong_endpoint_is_a_typed_error_naming_it(spark: Any, s3a: None,
                                                     s3_connection: dict[str, str],
                                                     bucket: str, s3_client: Any) -> None:
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    before = _objects(s3_client, bucket)
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection),
                                 reader_options={"fs.s3a.endpoint": "http://127.0.0.1:9",
                                                 "fs.s3a.retry.limit": "0",
                                                 "fs.s3a.attempts.maximum": "0"})
    with pytest.raises(persist.Determinate) as got:
        table.toDF()
    first = str(got.value).splitlines()[0]
    assert first.startswith("S3A could not reach the store")
    assert "endpoint_url" in first
    assert _objects(s3_client, bucket) == before


def _probes_end() -> None:
    """Every thread of forPath's probe ends (each with its one connection)."""
    import threading

    for t in threading.enumerate():
        if t.name == "persist-s3a-probe":
            t.join(timeout=30)
            assert not t.is_alive()


def _closed_port() -> str:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_dead_endpoint_is_told_by_the_tables_probe_with_s3as_retries_on(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    """forPath asks whether anything listens at the read's endpoint before it reads the
    metadata: nothing does, and toDF says so (persist's error naming the setting), with
    S3A's retries as they are (no S3A request is made)."""
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    before = _objects(s3_client, bucket)
    closed = _closed_port()
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection),
                                 reader_options={"fs.s3a.endpoint": closed})
    with pytest.raises(persist.Determinate) as got:
        table.toDF(consolidated=False)
    first = str(got.value).splitlines()[0]
    assert first.startswith("S3A could not reach the store")
    assert "endpoint_url" in first
    assert closed in first
    assert "the probe of the endpoint" in first
    assert _objects(s3_client, bucket) == before
    # the probe's answer is used once: the next read asks S3A itself (its retries off here)
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection),
                                 reader_options={"fs.s3a.endpoint": closed,
                                                 "fs.s3a.retry.limit": "0",
                                                 "fs.s3a.attempts.maximum": "0"})
    with pytest.raises(persist.Determinate):
        table.toDF(consolidated=False)
    with pytest.raises(persist.Determinate) as again:
        table.toDF(consolidated=False)
    first = str(again.value).splitlines()[0]
    assert "endpoint_url" in first
    assert "the probe of the endpoint" not in first  # S3A's own failure
    assert _objects(s3_client, bucket) == before
    _probes_end()


def test_a_session_setting_changed_after_forpath_is_the_one_a_read_uses(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    """The probe's answer is for the settings it was asked with: the session's endpoint,
    dead at forPath and fixed before toDF, reads the collection; live at forPath and broken
    before toDF, fails as S3A fails."""
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    before = _objects(s3_client, bucket)
    hadoop = spark._jsc.hadoopConfiguration()
    keys = ("fs.s3a.endpoint", "fs.s3a.retry.limit", "fs.s3a.attempts.maximum")
    for k, v in zip(keys, (_closed_port(), "0", "0"), strict=True):
        hadoop.set(k, v)
    try:
        table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection))
        hadoop.set("fs.s3a.endpoint", s3_connection["endpoint_url"])
        (rows,), = table.toDF(consolidated=False).selectExpr("count(*)").collect()
        assert rows == 2000
    finally:
        for k in keys:
            hadoop.unset(k)
    # a fresh bucket (S3A keeps the file system of a bucket's first read)
    other = f"{bucket}-b"
    s3_client.create_bucket(Bucket=other)
    url = f"s3://{other}/loc"
    _fill(url, s3_connection)
    before = _objects(s3_client, other)
    table = PersistTable.forPath(spark, url, "c", storage_options=dict(s3_connection))
    closed = _closed_port()
    for k, v in zip(keys, (closed, "0", "0"), strict=True):
        hadoop.set(k, v)
    try:
        with pytest.raises(persist.Determinate) as got:
            table.toDF(consolidated=False)
    finally:
        for k in keys:
            hadoop.unset(k)
    first = str(got.value).splitlines()[0]
    assert "endpoint_url" in first
    assert closed in first
    assert "the probe of the endpoint" not in first  # S3A's own failure
    assert _objects(s3_client, other) == before
    _probes_end()
