"""Record collections (struct keys and values, decimals, timestamps, dates, lists) through a
real SparkSession: exact Spark types, raw/consolidated/streaming reads, field selection, the
sink, and the loud refusal of a type Spark cannot hold exactly."""

from __future__ import annotations

import datetime
import decimal
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

import persist
from operators.schema import (
    CollectionTypes,
    arrow_type_for,
    from_spark,
    spark_type_of,
    to_spark,
)
from persist.errors import SchemaMismatch
from persist.indexed.format.columnar import contents_at, part_schema
from persist.indexed.read import buckets
from tests.spark.support import Collected, expected_updates, location
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

KEY = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
VALUE = pa.struct([
    pa.field("label", pa.string()),
    pa.field("amount", pa.decimal128(12, 2)),
    pa.field("at", pa.timestamp("us", tz="Europe/Paris")),
    pa.field("day", pa.date32()),
    pa.field("score", pa.float64()),
    pa.field("count", pa.int32()),
    pa.field("ok", pa.bool_()),
    pa.field("tags", pa.list_(pa.int32())),
    pa.field("inner", pa.struct([pa.field("code", pa.string()), pa.field("weight", pa.float64())])),
])
# NB: no non-nullable field in VALUE: pyspark's own ``DataFrame.toArrow`` (pyarrow's cast) fails
# on a null struct whose non-nullable child slot Spark's Arrow writer sets null. The key's ``id``
# is non-nullable (keys are never null), and test_types_map_exactly_and_back covers the rest.
#: How Spark declares VALUE (field for field; the zone becomes instants, ``timestamp``).
SPARK_VALUE = StructType([
    StructField("label", StringType()), StructField("amount", DecimalType(12, 2)),
    StructField("at", TimestampType()), StructField("day", DateType()),
    StructField("score", DoubleType()), StructField("count", IntegerType()),
    StructField("ok", BooleanType()), StructField("tags", ArrayType(IntegerType())),
    StructField("inner", StructType([StructField("code", StringType()),
                                     StructField("weight", DoubleType())])),
])


def _maybe(rng: random.Random, v: Any) -> Any:
    return None if rng.random() < 0.1 else v


def record(i: int, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any] | None]:
    key = {"id": i % 40, "name": _maybe(rng, f"user-{i % 40:03d}")}
    if rng.random() < 0.03:
        return key, None  # a null value record
    at = datetime.datetime(2024, 3, 1, tzinfo=datetime.UTC) + datetime.timedelta(
        seconds=rng.randrange(10**7), microseconds=rng.randrange(10**6))
    value = {
        "label": _maybe(rng, rng.choice(["a", "bb", "", "ünï"])),
        "amount": _maybe(rng, decimal.Decimal(rng.randrange(-10**6, 10**6)).scaleb(-2)),
        "at": _maybe(rng, at),
        "day": _maybe(rng, datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randrange(400))),
        "score": _maybe(rng, rng.choice([0.5, -0.0, 1e300, rng.random()])),
        "count": _maybe(rng, rng.randrange(-2**31, 2**31)),
        "ok": _maybe(rng, rng.random() < 0.5),
        "tags": _maybe(rng, [_maybe(rng, rng.randrange(100)) for _ in range(rng.randrange(4))]),
        "inner": _maybe(rng, {"code": _maybe(rng, "c"), "weight": float(i)}),
    }
    return key, value


def fill_records(url: str, name: str = "rec") -> list[Any]:
    """Updates at times 0..2, then at 3 a retraction of some and a second copy of others."""
    rng = random.Random(7)
    out: list[Any] = []
    with persist.open(url) as client:
        w, _ = client.create_or_load(name, key_type=KEY, value_type=VALUE)
        for t in range(3):
            batch = [(record(t * 100 + i, rng), t, 1) for i in range(100)]
            w.append(batch, upper=t + 1).result()
            out += batch
        again = [(kv, 3, -1 if j % 2 else 1) for j, (kv, _, _) in enumerate(out[::7])]
        w.append(again, upper=4).result()
        out += again
    return out


def norm(x: Any) -> Any:
    """A comparable form of a record value: datetimes as UTC instants, dicts as tuples."""
    if isinstance(x, datetime.datetime):
        return ("ts", x.astimezone(datetime.UTC).isoformat())
    if isinstance(x, dict):
        return tuple((k, norm(v)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return tuple(norm(v) for v in x)
    return x


def rows_of(table: pa.Table) -> list[Any]:
    cols = [table.column(c).to_pylist() for c in ("key", "value", "time", "diff")]
    return sorted(repr(norm(r)) for r in zip(*cols, strict=True))


def sums_of(table: pa.Table) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v, d in zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                       table.column("diff").to_pylist(), strict=True):
        kv = repr((norm(k), norm(v)))
        out[kv] = out.get(kv, 0) + d
    return {kv: d for kv, d in out.items() if d}


def snapshot(url: str, name: str, as_of: int) -> pa.Table:
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load(name, key_type=KEY, value_type=VALUE)
        return r.snapshot(as_of).to_arrow()


def read(spark: Any, url: str, name: str = "rec", **options: Any) -> Any:
    r = spark.read.format("persist").option("collection", name)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(url)


# -- without Spark jobs ---------------------------------------------------------------------


def test_types_map_exactly_and_back() -> None:
    rec = CollectionTypes("c", 1, KEY, VALUE)
    assert rec.spark_schema["value"].dataType == SPARK_VALUE
    assert rec.spark_schema["key"].dataType == StructType([
        StructField("id", LongType(), nullable=False), StructField("name", StringType())])
    # the batches' schema is exactly what pyspark checks them against
    assert rec.arrow_schema.equals(to_arrow_schema(rec.spark_schema, timezone="UTC"))
    for arrow, name in ((pa.uint8(), "smallint"), (pa.uint16(), "int"), (pa.uint32(), "bigint"),
                         (pa.uint64(), "bigint"), (pa.int8(), "tinyint"),
                         (pa.float32(), "float"), (pa.large_list(pa.large_string()),
                                                   "array<string>"),
                         (pa.timestamp("ms"), "timestamp_ntz"),
                         (pa.timestamp("s", tz="Asia/Tokyo"), "timestamp")):
        assert spark_type_of(arrow, name="c", column="value").simpleString() == name
    # every Spark type a collection reads as writes back as an Arrow type reading as it again
    spark_types: list[DataType] = [
        SPARK_VALUE, rec.spark_schema["key"].dataType, TimestampNTZType(),
        ArrayType(StructType([StructField("x", DecimalType(38, 0))]), False)]
    for dt in spark_types:
        assert spark_type_of(arrow_type_for(dt, column="value"), name="c", column="value") == dt
    # a null record hides a null in its non-nullable field's slot (Arrow's cast refuses it)
    strict = pa.struct([pa.field("w", pa.large_list(pa.field("item", pa.uint8(), False)),
                                 nullable=False)])
    col = pa.StructArray.from_arrays([pa.array([[1], None], strict.field(0).type)],
                                     fields=list(strict), mask=pa.array([False, True]))
    t = pa.table({"key": pa.array([1, 2]), "value": col, "time": pa.array([0, 0], pa.uint64()),
                  "diff": [1, 1]}, schema=part_schema(pa.int64(), strict))
    types = CollectionTypes("c", 1, pa.int64(), strict)
    cast = to_spark(t, types.arrow_schema)
    assert cast.schema.field("value").type == pa.struct([pa.field(
        "w", pa.list_(pa.field("element", pa.int16(), False)), nullable=False)])
    assert cast.column("value").to_pylist() == [{"w": [1]}, None]
    # and back, as the sink gets it from Spark: hidden nulls pass, visible ones are refused
    spark_col = cast.column("value").combine_chunks()
    back = from_spark(pa.table({"key": [1, 2], "value": spark_col}), types)
    assert back.column("value").type == strict
    assert back.column("value").to_pylist() == [{"w": [1]}, None]
    visible = pa.StructArray.from_arrays([spark_col.field(0)], fields=list(spark_col.type))
    with pytest.raises(SchemaMismatch, match=r"value\.w: null in a non-nullable field"):
        from_spark(pa.table({"key": [1, 2], "value": visible}), types)
    with pytest.raises(SchemaMismatch, match=r"map<string,int> at value\.m"):
        arrow_type_for(StructType([StructField("m", MapType(StringType(), IntegerType()))]),
                       column="value")


def test_struct_keys_bucket_and_consolidate_as_the_engine_does() -> None:
    rng = random.Random(3)
    rows = [(record(i, rng), i % 5, 1 if i % 4 else -1) for i in range(600)]
    rows += [(kv, 5, -d) for (kv, _, d) in rows[::3]]  # retractions: consolidation matters
    table = pa.table({
        "key": pa.array([k for (k, _), _, _ in rows], KEY),
        "value": pa.array([v for (_, v), _, _ in rows], VALUE),
        "time": pa.array([t for _, t, _ in rows], pa.uint64()),
        "diff": pa.array([d for _, _, d in rows], pa.int64())}, schema=part_schema(KEY, VALUE))
    whole = buckets.hash_keys(table.column("key"))
    chunked = buckets.hash_keys(pa.chunked_array([table.column("key").slice(0, 77).combine_chunks(),
                                                  table.column("key").slice(77).combine_chunks()]))
    assert (whole == chunked).all()
    by_key: dict[str, int] = {}
    for k, h in zip(table.column("key").to_pylist(), whole.tolist(), strict=True):
        assert by_key.setdefault(repr(k), h) == h  # every row of a key: one hash
    want = contents_at(table, 5)
    got = pa.concat_tables([buckets.consolidate(
        table.filter(pa.array(buckets.hash_keys(table.column("key")) % 3 == b)), 5) for b in range(3)])
    assert rows_of(got) == rows_of(want)
    spark_rows = to_spark(got, CollectionTypes("c", 1, KEY, VALUE).arrow_schema)
    assert rows_of(spark_rows) == rows_of(want)


# -- through Spark --------------------------------------------------------------------------


def test_record_reads_raw_consolidated_streaming_and_by_field(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill_records(url)
    want = snapshot(url, "rec", 3)
    assert want.num_rows < 300  # consolidation matters: retractions cancel,
    assert 2 in want.column("diff").to_pylist()  # and second copies sum
    df = read(spark, url, numPartitions=3)
    assert df.schema["value"].dataType == SPARK_VALUE
    assert df.schema["key"].dataType["id"].nullable is False
    got = df.toArrow()
    assert rows_of(got) == rows_of(want)  # consolidated: struct keys bucketed by their bytes
    raw = read(spark, url, mode="raw", as_of=3).toArrow()
    assert raw.num_rows == 300 + len(range(0, 300, 7))
    assert sums_of(raw) == sums_of(want)
    # a field: Spark selects and filters above the source
    amounts = [v["amount"] for v in want.column("value").to_pylist()
               if v is not None and v["amount"] is not None and v["amount"] > 10]
    sel = df.where("value.amount > 10").select("value.amount", "key.name").toArrow()
    assert sel.column_names == ["amount", "name"]
    assert sorted(sel.column("amount").to_pylist()) == sorted(amounts)
    total = df.select(F.sum("value.amount")).first()[0]
    assert total == sum((v["amount"] for v in want.column("value").to_pylist()
                         if v is not None and v["amount"] is not None), decimal.Decimal(0))
    # streaming: every update, with its own time
    sink = Collected()
    q = (spark.readStream.format("persist").option("collection", "rec").load(url)
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(PATIENCE)
    assert q.exception() is None
    assert rows_of(pa.concat_tables(sink.tables)) == rows_of(expected_updates(url, "rec", 0, 4))


def test_sink_writes_record_dataframes(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill_records(url)
    df = read(spark, url)
    # a new collection gets the Arrow types that read back as the DataFrame's exactly
    df.write.format("persist").mode("append").option("collection", "copy").save(url)
    with persist.open(url, read_only=True) as client:
        copy = CollectionTypes.of(client.info("copy"))
        assert copy.spark_schema == df.schema
        assert copy.key == pa.struct([pa.field("id", pa.int64(), nullable=False),
                                      pa.field("name", pa.string())])
        assert copy.value.field("at").type == pa.timestamp("us", tz="UTC")
        _, r = client.create_or_load("copy", key_type=copy.key, value_type=copy.value)
        assert rows_of(r.snapshot(3).to_arrow()) == rows_of(snapshot(url, "rec", 3))
    # into the existing collection (zone Europe/Paris): the same instants, cast on the way in
    later = df.withColumn("time", F.lit(10))
    later.write.format("persist").mode("append").option("collection", "rec").save(url)
    before, after = sums_of(snapshot(url, "rec", 3)), sums_of(snapshot(url, "rec", 10))
    assert after == {kv: 2 * d for kv, d in before.items()}
    # a DataFrame whose value type differs is refused before anything runs
    bad = later.withColumn("value", F.col("value").withField("count", F.lit("x")))
    with pytest.raises(Exception, match="reads its value as"):
        bad.write.format("persist").mode("append").option("collection", "rec").save(url)


def test_type_without_exact_spark_type_is_refused_naming_the_field(spark: Any,
                                                                   tmp_path: Path) -> None:
    url = location(tmp_path)
    value = pa.struct([pa.field("amount", pa.decimal128(12, 2)),
                       pa.field("at", pa.timestamp("ns", tz="UTC"))])
    with persist.open(url) as client:
        w, _ = client.create_or_load("ns", key_type=pa.int64(), value_type=value)
        w.append([((1, {"amount": decimal.Decimal("1.50"), "at": None}), 0, 1)],
                 upper=1).result()
    with pytest.raises(Exception, match=r"value\.at is timestamp\[ns, tz=UTC\], which has no "
                                        r"exact Spark equivalent"):
        read(spark, url, "ns").schema  # noqa: B018
