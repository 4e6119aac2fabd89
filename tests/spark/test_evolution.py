"""Schema evolution through Spark: the source reads the current schema (older parts migrated:
added fields null, widened types cast), a running stream stops at an evolution, and the sink
evolves the collection first with ``mergeSchema`` (and refuses a mismatching DataFrame without
it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import persist
from operators.options import WriteOptions
from operators.schema import CollectionTypes, merged_types
from persist.indexed.format import evolve
from tests.spark.support import Collected, location
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

V0 = pa.struct([pa.field("id", pa.int32(), nullable=False), pa.field("name", pa.string())])
V1 = pa.struct([pa.field("id", pa.int64(), nullable=False), pa.field("tag", pa.string()),
                pa.field("name", pa.string())])


def fill(url: str) -> None:
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=V0)
        w.append([((k, {"id": k, "name": f"n{k}"}), 0, 1) for k in range(5)], upper=1).result()
        client.evolve_schema("c", value_type=V1).result()
        w1, _ = client.create_or_load("c", key_type=pa.int64(), value_type=V1)
        w1.append([((5, {"id": 2**40, "tag": "t", "name": None}), 1, 1),
                   ((0, {"id": 0, "tag": None, "name": "n0"}), 1, -1)], upper=2).result()


def test_the_source_reads_the_current_schema(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url)
    df = spark.read.format("persist").option("collection", "c").load(url)
    value = df.schema["value"].dataType
    assert [f.name for f in value.fields] == ["id", "tag", "name"]
    assert value["id"].dataType == LongType()
    got = sorted((r["key"], r["value"].asDict(), r["diff"]) for r in df.collect())
    # the record written before the evolution and retracted after it cancelled
    assert got == [(k, {"id": k, "tag": None, "name": f"n{k}"}, 1) for k in range(1, 5)] + \
        [(5, {"id": 2**40, "tag": "t", "name": None}, 1)]
    raw = spark.read.format("persist").option("collection", "c").option("mode", "raw") \
        .load(url).where("value.tag is null").count()
    assert raw == 6
    # a running stream reads every update as the current schema...
    sink = Collected()
    q = (spark.readStream.format("persist").option("collection", "c").load(url)
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="100 milliseconds").start())
    try:
        deadline = time.monotonic() + PATIENCE
        while sum(t.num_rows for t in sink.tables) < 7 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(t.num_rows for t in sink.tables) == 7
        # ... and stops, asking for a restart, once the schema evolves under it
        v2 = pa.struct([*V1, pa.field("x", pa.int8())])
        with persist.open(url) as client:
            client.evolve_schema("c", value_type=v2).result()
            w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=v2)
            w.append([((6, {"id": 6, "tag": None, "name": None, "x": 1}), 2, 1)],
                     upper=3).result()
        with pytest.raises(Exception, match="evolved to version 2 since this stream started "
                                            "with version 1"):
            q.awaitTermination(PATIENCE)
    finally:
        q.stop()
    # a DataFrame made before an evolution is refused, saying why
    stale = spark.read.format("persist").option("collection", "c").load(url)
    with persist.open(url) as client:
        client.evolve_schema("c", value_type=pa.struct([*V1, pa.field("x", pa.int16())]))
    with pytest.raises(Exception, match="created before an evolution"):
        stale.collect()


def test_merge_schema_appends_dataframes_with_new_fields(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url)
    df = spark.read.format("persist").option("collection", "c").load(url)
    wider = df.withColumn("time", F.lit(5)).withColumn(
        "value", F.col("value").withField("score", F.lit(7)))
    # without mergeSchema: a clear error, nothing written
    with pytest.raises(Exception, match=r"reads its value as struct<id:bigint,tag:string,"
                                        r"name:string>.*mergeSchema=true"):
        wider.write.format("persist").mode("append").option("collection", "c").save(url)
    with persist.open(url, read_only=True) as client:
        assert evolve.version(client.state.collections["c"]) == 1
        assert client.state.collections["c"].upper == 2
    # with it: the collection evolves first (score added, nullable), then the rows land
    (wider.write.format("persist").mode("append").option("collection", "c")
     .option("mergeSchema", "true").save(url))
    with persist.open(url, read_only=True) as client:
        c = client.state.collections["c"]
        assert evolve.version(c) == 2
        value = CollectionTypes.of(client.info("c")).value
        assert value.field("score").nullable
        assert value.field("score").type == pa.int32()
    back = spark.read.format("persist").option("collection", "c").load(url)
    rows = sorted((r["key"], r["value"]["score"] or -1, r["diff"]) for r in back.collect())
    # every old record twice now: once without a score (null), once with 7
    assert rows == sorted([(k, -1, 1) for k in range(1, 6)] + [(k, 7, 1) for k in range(1, 6)])
    # mergeSchema with nothing new changes nothing
    (back.withColumn("time", F.lit(6)).write.format("persist").mode("append")
     .option("collection", "c").option("mergeSchema", "true").save(url))
    with persist.open(url, read_only=True) as client:
        assert evolve.version(client.state.collections["c"]) == 2
        assert client.state.collections["c"].upper == 7
    # a DataFrame of an older shape is not the current schema: refused, even with mergeSchema
    with pytest.raises(Exception, match=r"reads its value as struct<id:bigint,tag:string,"
                                        r"name:string,score:int>"):
        (df.withColumn("time", F.lit(8)).write.format("persist").mode("append")
         .option("collection", "c").option("mergeSchema", "true").save(url))


def test_merged_types_add_only_new_nullable_fields() -> None:
    stored = pa.struct([pa.field("id", pa.int64(), nullable=False),
                        pa.field("items", pa.list_(pa.struct([pa.field("sku", pa.string())])))])
    types = CollectionTypes("c", 1, pa.int64(), stored)
    value = StructType([
        StructField("id", LongType(), nullable=False),
        StructField("new", StringType(), nullable=False),
        StructField("items", ArrayType(StructType([StructField("sku", StringType()),
                                                   StructField("qty", IntegerType())]))),
    ])
    frame = StructType([StructField("key", LongType()), StructField("value", value),
                        StructField("time", LongType()), StructField("diff", LongType())])
    key, merged = merged_types(frame, types)
    assert key == pa.int64()
    assert merged == pa.struct([
        pa.field("id", pa.int64(), nullable=False), pa.field("new", pa.string()),
        pa.field("items", pa.list_(pa.struct([pa.field("sku", pa.string()),
                                              pa.field("qty", pa.int32())])))])
    # a DataFrame that lacks a stored field (or reorders them) merges nothing there
    lacking = StructType([StructField("new", StringType()), StructField("id", LongType())])
    frame = StructType([StructField("key", LongType()), StructField("value", lacking),
                        StructField("time", LongType()), StructField("diff", LongType())])
    assert merged_types(frame, types)[1] == stored
    assert WriteOptions.parse({"path": "/x", "collection": "c", "mergeschema": "true"},
                              "stream-write").merge_schema is True
