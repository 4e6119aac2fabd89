"""The requests of a native read through S3A against ``spark.read.parquet`` of the same rows
(issue 30): a loopback proxy in front of each S3 test server (moto, ministack) records every
request, and the native read's requests on the data files (GET, HEAD, LIST) stay within 1.2x
Parquet's. persist's own requests (its metadata, read to plan, and the engine's check of each
data file's tail, driver-side: told by boto3's User-Agent) are counted apart, reported, and
bounded: one metadata request per ``toDF`` (the table holds its state and probes the next log
key), one tail read per data file the first time the process reads it. The first read's
Spark requests and persist's metadata together stay within 1.2x Parquet's, and so do a later
read's planning requests (its GETs depend on S3A's block cache: not compared).

NB: each read is of files no process of the session read before (a fresh bucket): S3A keeps
one file system per bucket, and its input streams may cache what they read.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persist
from operators import PersistTable
from operators.native import LIST_FROM, _Plan
from operators.schema import CollectionTypes
from tests.spark.support import s3a_options
from tests.support.faulty_proxy import FaultyProxy, Recorder

pytestmark = [pytest.mark.spark, pytest.mark.s3]

PARTS = 4
ROWS = 50_000


def _kinds(requests: list[tuple[str, str, str]]) -> collections.Counter[str]:
    """Spark's GET, HEAD and LIST (a GET of the bucket with ``list-type``); ``meta``:
    persist's metadata (anything under the location's ``meta/``); ``persist``: persist's own
    (boto3's) other requests."""
    out: collections.Counter[str] = collections.Counter()
    for method, path, agent in requests:
        if "/meta/" in path or "%2Fmeta%2F" in path:
            out["meta"] += 1
        elif "boto" in agent.lower():
            out["persist"] += 1
        elif method == "GET" and "list-type=" in path:
            out["LIST"] += 1
        else:
            out[method] += 1
    return out


def _fill(url: str, connection: dict[str, str]) -> None:
    rng = np.random.default_rng(30)
    with persist.open(url, storage_options=dict(connection),
                      options=persist.Options(inline_threshold=0,
                                              background_compaction=False)) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(PARTS):
            keys = np.arange(t * ROWS, (t + 1) * ROWS, dtype=np.int64)
            w.append(pa.table({"key": keys, "value": rng.integers(0, 1 << 40, ROWS),
                               "time": np.full(ROWS, t, np.int64),
                               "diff": np.ones(ROWS, np.int64)}), upper=t + 1).result()


def _append(url: str, connection: dict[str, str], t: int) -> None:
    with persist.open(url, storage_options=dict(connection),
                      options=persist.Options(inline_threshold=0,
                                              background_compaction=False)) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        keys = np.arange(t * ROWS, (t + 1) * ROWS, dtype=np.int64)
        w.append(pa.table({"key": keys, "value": keys, "time": np.full(ROWS, t, np.int64),
                           "diff": np.ones(ROWS, np.int64)}), upper=t + 1).result()


def _log_entries(s3_client: Any, bucket: str) -> int:
    got = s3_client.list_objects_v2(Bucket=bucket, Prefix="loc/meta/log/")
    return len(got.get("Contents", []))


def _spark(kinds: collections.Counter[str]) -> int:
    return sum(kinds[k] for k in ("GET", "HEAD", "LIST"))


def test_a_native_read_makes_parquets_requests(spark: Any, s3a: None,
                                               s3_connection: dict[str, str],
                                               s3_client: Any) -> None:
    assert PARTS >= LIST_FROM
    native, plain = (f"persist-req-{w}-{np.random.default_rng().integers(1 << 40):x}"
                     for w in ("n", "p"))
    for b in (native, plain):
        s3_client.create_bucket(Bucket=b)
    url = f"s3://{native}/loc"
    _fill(url, s3_connection)
    files = [o["Key"] for o in s3_client.list_objects_v2(Bucket=native)["Contents"]
             if "/data/" in o["Key"]]
    assert len(files) == PARTS
    for key in files:  # the same files as plain Parquet, in a folder of their own
        s3_client.copy_object(Bucket=plain, Key="plain/" + key.rsplit("/", 1)[1],
                              CopySource={"Bucket": native, "Key": key})
    recorder = Recorder()
    reads: list[tuple[collections.Counter[str], collections.Counter[str]]] = []
    n = PARTS * ROWS
    with FaultyProxy(s3_connection["endpoint_url"], recorder, max_seconds=300) as proxy:
        via = {**s3_connection, "endpoint_url": proxy.url}
        table = PersistTable.forPath(spark, url, "c", storage_options=via)
        assert _kinds(recorder.take())["meta"] > 1  # the table's metadata, read once here
        for _ in range(2):  # the session's first read of these files, then the next
            ours = table.toDF(consolidated=False).selectExpr("count(*)", "sum(key)").collect()
            got = _kinds(recorder.take())
            theirs = (spark.read.options(**s3a_options(via)).parquet(f"s3a://{plain}/plain/")
                      .selectExpr("count(*)", "sum(key)").collect())
            want = _kinds(recorder.take())
            assert [tuple(r) for r in ours] == [tuple(r) for r in theirs] \
                == [(n, n * (n - 1) // 2)]
            reads.append((got, want))
            print(f"native: {dict(got)}; spark.read.parquet: {dict(want)}")
        # commits after forPath: the next toDF reads them (one GET of each new log entry,
        # one of the next key, which is not there yet)
        before = _log_entries(s3_client, native)
        _append(url, s3_connection, PARTS)
        added = _log_entries(s3_client, native) - before
        assert added >= 1
        recorder.take()
        assert table.toDF(consolidated=False).count() == n + ROWS
        assert _kinds(recorder.take())["meta"] == added + 1
    (first, base), (second, again) = reads
    for got, want in reads:
        assert want["meta"] == want["persist"] == 0
        # persist's metadata per toDF: the held state brought up to date, one GET of the
        # next log key (nothing changed)
        assert got["meta"] == 1
    # the first read of these files in the session: Spark's requests, and persist's metadata
    # with them, within 1.2x Parquet's
    assert first["GET"] >= PARTS
    assert base["GET"] >= PARTS
    assert _spark(first) <= 1.2 * _spark(base), (first, base)
    assert _spark(first) + first["meta"] <= 1.2 * _spark(base), (first, base)
    # the engine's check of each file's tail (footer and page index), once per process
    assert 0 < first["persist"] <= PARTS
    assert second["persist"] == 0
    # a later read: what plans it (persist's metadata, Spark's HEAD and LIST) within 1.2x
    # Parquet's. NB: its GETs are not compared: hadoop-aws 3.5's default input stream (the
    # analytics accelerator) caches blocks across reads and evicts them as it will (Parquet's
    # second read made none here, the native one 0-8).
    planned = second["meta"] + second["HEAD"] + second["LIST"]
    assert planned <= 1.2 * (again["HEAD"] + again["LIST"]), (second, again)


def test_a_native_read_through_s3as_classic_stream_makes_parquets_requests(
        spark: Any, s3a: None, s3_connection: dict[str, str], s3_client: Any) -> None:
    """S3A's classic input stream GETs every read's bytes (no block cache): a time filter
    pushed down would make Spark's reader fetch each row group's page index besides, so a read
    whose files hold no row after ``as_of`` pushes none."""
    native, plain = (f"persist-cls-{w}-{np.random.default_rng().integers(1 << 40):x}"
                     for w in ("n", "p"))
    for b in (native, plain):
        s3_client.create_bucket(Bucket=b)
    url = f"s3://{native}/loc"
    _fill(url, s3_connection)
    for key in (o["Key"] for o in s3_client.list_objects_v2(Bucket=native)["Contents"]
                if "/data/" in o["Key"]):
        s3_client.copy_object(Bucket=plain, Key="plain/" + key.rsplit("/", 1)[1],
                              CopySource={"Bucket": native, "Key": key})
    classic = {"fs.s3a.input.stream.type": "classic"}  # each bucket's file system is new
    recorder = Recorder()
    n = PARTS * ROWS
    with FaultyProxy(s3_connection["endpoint_url"], recorder, max_seconds=300) as proxy:
        via = {**s3_connection, "endpoint_url": proxy.url}
        table = PersistTable.forPath(spark, url, "c", storage_options=via,
                                     reader_options=classic)
        recorder.take()
        ours = table.toDF(consolidated=False).selectExpr("count(*)", "sum(key)").collect()
        got = _kinds(recorder.take())
        theirs = (spark.read.options(**s3a_options(via), **classic)
                  .parquet(f"s3a://{plain}/plain/").selectExpr("count(*)", "sum(key)").collect())
        want = _kinds(recorder.take())
    print(f"classic stream: native {dict(got)}; spark.read.parquet {dict(want)}")
    assert [tuple(r) for r in ours] == [tuple(r) for r in theirs] == [(n, n * (n - 1) // 2)]
    assert got["GET"] >= PARTS
    assert want["GET"] >= PARTS
    assert got["meta"] == 1
    assert _spark(got) + got["meta"] <= 1.2 * _spark(want), (got, want)


def test_a_listed_folder_missing_a_planned_file_is_part_missing(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str) -> None:
    url = f"s3://{bucket}/loc"
    _fill(url, s3_connection)
    info = persist.distributed.describe(url, "c", storage_options=dict(s3_connection))
    plan = persist.distributed.plan_native(info.snapshot(), consolidated=False)
    (piece,) = plan.files
    assert len(piece.urls) == PARTS
    gone = piece.urls[0].rsplit("/", 1)[0] + "/0123456789abcdef0123456789abcdef"
    reader = _Plan(spark, CollectionTypes.of(info),
                   {**s3a_options(s3_connection)})
    # the folder is listed (one listing for every file): a planned file not in it is never
    # skipped silently
    with pytest.raises(persist.PartMissing, match="0123456789abcdef"):
        reader._files((*piece.urls, gone))
    assert reader._files(piece.urls).count() == PARTS * ROWS
