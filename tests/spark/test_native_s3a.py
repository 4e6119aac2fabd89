"""Spark's own Parquet reader on ``s3a://``, against each S3 test server (moto, ministack): the
ground the native read path of issue 22 stands on.

The shared session carries the S3A connector (hadoop-aws at pyspark's Hadoop version and the
AWS SDK bundle, fetched with Maven: tests/support/jars.py); each read is pointed at its server
with per-read Hadoop options (tests/spark/support.py::s3a_options). Files are written by
pyarrow with page checksums, as persist's v4 parts will be, and read with
``parquet.page.verify-checksum.enabled``: a flipped byte in a data page is then an error, where
an unverified read returns a wrong sum.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.spark.support import s3a_options

pytestmark = [pytest.mark.spark, pytest.mark.s3]

VERIFY = "parquet.page.verify-checksum.enabled"


def _parquet(table: pa.Table, **kw: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, write_page_checksum=True, **kw)
    return buf.getvalue()


def _keys(lo: int, hi: int) -> pa.Table:
    keys = pa.array(range(lo, hi), pa.int64())
    return pa.table({"key": keys, "value": pa.array([k % 97 for k in range(lo, hi)], pa.int64()),
                     "diff": pa.array([1] * (hi - lo), pa.int64())})


def test_spark_reads_pyarrow_parquet_from_each_s3_server(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    for i in range(3):  # three files, like three parts, zstd, several row groups each
        s3_client.put_object(Bucket=bucket, Key=f"parts/p{i}",
                             Body=_parquet(_keys(i * 50_000, (i + 1) * 50_000),
                                           compression="zstd", row_group_size=20_000))
    df = (spark.read.options(**s3a_options(s3_connection)).option(VERIFY, "true")
          .parquet(f"s3a://{bucket}/parts/"))
    (rows, keys, diffs), = df.selectExpr("count(*)", "sum(key)", "sum(diff)").collect()
    assert (rows, keys, diffs) == (150_000, sum(range(150_000)), 150_000)
    assert [r.key for r in df.where("key = 123456").collect()] == [123_456]  # pushed down


def _flipped_in_a_data_page(data: bytes) -> bytes:
    """``data`` (one column chunk, one data page, no dictionary) with one byte of the page's
    values flipped, well past the page header."""
    meta = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    assert meta.dictionary_page_offset is None
    at = meta.data_page_offset + meta.total_compressed_size // 2
    out = bytearray(data)
    out[at] ^= 0x10
    return bytes(out)


def test_a_flipped_byte_in_a_data_page_is_an_error_not_a_wrong_sum(
        spark: Any, s3a: None, s3_connection: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    table = pa.table({"key": pa.array(range(10_000), pa.int64())})
    # NB: uncompressed and plain-encoded: the flipped byte changes one value and nothing else
    # notices, so the unverified read below shows what verification prevents
    good = _parquet(table, compression="none", use_dictionary=False)
    bad = _flipped_in_a_data_page(good)
    with pytest.raises(OSError, match="CRC"):  # pyarrow, verifying, agrees the page is bad
        pq.read_table(io.BytesIO(bad), page_checksum_verification=True)
    s3_client.put_object(Bucket=bucket, Key="flipped/p0", Body=bad)
    reader = spark.read.options(**s3a_options(s3_connection))
    unverified = reader.option(VERIFY, "false").parquet(f"s3a://{bucket}/flipped/")
    assert unverified.selectExpr("sum(key)").first()[0] != sum(range(10_000))  # silently wrong
    verified = reader.option(VERIFY, "true").parquet(f"s3a://{bucket}/flipped/")
    with pytest.raises(Exception, match="CRC checksum verification failed"):
        verified.selectExpr("sum(key)").collect()
