"""Part format 4 as Spark's own Parquet reader sees it: the part files of a snapshot read with
``spark.read.parquet`` at their ``external_url`` (page checksums verified) give persist's raw
rows, with ``time`` and ``diff`` as Spark ``long``s and keys and values as the operators
declare them; a flipped byte in a data page is an error there and ``ChecksumMismatch`` on
persist's path, never a wrong sum. (The native read path builds on this.)"""

from __future__ import annotations

import datetime
import decimal
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import persist
import persist.distributed
from persist.blob.file import FileBlob
from persist.errors import ChecksumMismatch
from persist.indexed.format.evolve import Types
from persist.indexed.read.parts import PartReader
from tests.support.engine import Engine

pytestmark = pytest.mark.spark

VALUE = pa.struct([
    pa.field("amount", pa.decimal128(12, 2), nullable=False),
    pa.field("small", pa.uint16()),
    pa.field("level", pa.float64()),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("at", pa.timestamp("us", tz="UTC")),
    pa.field("local", pa.timestamp("ms")),
    pa.field("day", pa.date32()),
])


def _value(i: int) -> dict[str, Any]:
    return {"amount": decimal.Decimal(i) / 4, "small": 65_535 - i if i % 3 else None,
            "level": float("nan") if i % 7 == 0 else i / 2, "tags": [f"t{j}" for j in range(i % 3)],
            "at": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(hours=i),
            "local": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i),
            "day": datetime.date(2024, 1, 1) + datetime.timedelta(days=i % 40)}


def _write(root: Path) -> list[str]:
    """Four appends of 500 rows (string keys, record values, some retracted), as blob parts;
    the URLs of the part files."""
    with persist.open(root, options=persist.Options(inline_threshold=0, batch_rows=128,
                                                    background_compaction=False)) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=VALUE)
        for t in range(4):
            rows = [((f"k{(t * 131 + i) % 997:04d}", _value(i)), t, -1 if i % 11 == 0 else 1)
                    for i in range(500)]
            w.append(rows, upper=t + 1).result()
    scan = persist.distributed.describe(str(root), "c").snapshot(3)
    blob = FileBlob(root)
    urls = [blob.external_url(h.part.blob_key) for h in scan.parts if h.part.blob_key]
    assert len(urls) == 4
    return [u for u in urls if u is not None]


def test_spark_reads_the_part_files_as_persist_does(spark: Any, tmp_path: Path) -> None:
    urls = _write(tmp_path)
    df = spark.read.option("parquet.page.verify-checksum.enabled", "true").parquet(*urls)
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert fields["time"] == "bigint"
    assert fields["diff"] == "bigint"
    assert fields["key"] == "string"
    assert fields["value"] == ("struct<amount:decimal(12,2),small:int,level:double,"
                               "tags:array<string>,at:timestamp,local:timestamp_ntz,day:date>")
    got = df.toArrow()
    ix = Engine.open(FileBlob(tmp_path).read_only())
    c = ix.state.collections["c"]
    reader = PartReader(FileBlob(tmp_path).read_only())
    want = pa.concat_tables([reader.read(p, Types.of(c).schema) for p in c.parts])
    assert got.num_rows == want.num_rows == 2000
    assert sorted(zip(got.column("key").to_pylist(), got.column("time").to_pylist(),
                      got.column("diff").to_pylist(), strict=True)) == \
        sorted(zip(want.column("key").to_pylist(), want.column("time").to_pylist(),
                   want.column("diff").to_pylist(), strict=True))
    gv, wv = got.column("value").combine_chunks(), want.column("value").combine_chunks()
    order_g = sorted(range(len(gv)), key=lambda i: (str(got.column("key")[i]),
                                                    str(gv.field("amount")[i])))
    order_w = sorted(range(len(wv)), key=lambda i: (str(want.column("key")[i]),
                                                    str(wv.field("amount")[i])))
    for name in ("amount", "tags", "day", "at"):
        a = gv.field(name).take(order_g).to_pylist()
        b = wv.field(name).take(order_w).to_pylist()
        assert a == b, name
    assert gv.field("small").take(order_g).to_pylist() == \
        wv.field("small").take(order_w).cast(pa.int32()).to_pylist()
    # a key lookup Spark pushes down to the page index and statistics
    hits = df.where("key = 'k0007'").select("diff").toArrow().column("diff").to_pylist()
    assert sorted(hits) == sorted(
        d for k, d in zip(want.column("key").to_pylist(), want.column("diff").to_pylist(),
                          strict=True) if k == "k0007")


def test_a_flipped_byte_in_a_data_page_is_an_error_never_a_wrong_sum(
        spark: Any, tmp_path: Path) -> None:
    urls = _write(tmp_path / "loc")
    path = Path(urls[0].removeprefix("file://"))
    md = pq.ParquetFile(path).metadata
    # the first data page of the value's decimal column: one byte flipped inside its values
    col = md.row_group(0).column(1)
    raw = bytearray(path.read_bytes())
    raw[col.data_page_offset + col.total_compressed_size // 2] ^= 0x20
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(path, bad / "part")
    (bad / "part").write_bytes(bytes(raw))
    df = spark.read.option("parquet.page.verify-checksum.enabled", "true").parquet(
        str(bad / "part"))
    with pytest.raises(Exception, match=r"(?i)checksum|crc"):
        df.selectExpr("sum(value.amount)", "sum(diff)").collect()
    # persist's path: the part's own checksum fails before anything is decoded
    path.write_bytes(bytes(raw))
    with persist.open(tmp_path / "loc", read_only=True) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=VALUE)
        with pytest.raises(ChecksumMismatch):
            r.snapshot(3).to_arrow()
