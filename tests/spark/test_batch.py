"""Batch reads through a real SparkSession: as-of snapshots, raw updates, definiteness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

import persist
from operators.schema import CollectionTypes
from tests.spark.support import canon, compact, fill, location, sums

pytestmark = pytest.mark.spark


def read(spark: Any, url: str, name: str, **options: Any) -> Any:
    r = spark.read.format("persist").option("collection", name)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(url)


def snapshot(url: str, name: str, as_of: int) -> pa.Table:
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load(name, key_type=pa.string(), value_type=pa.int64())
        return r.snapshot(as_of).to_arrow()


@pytest.mark.parametrize("partitions", [None, 1, 3])
def test_consolidated_equals_snapshot(spark: Any, tmp_path: Path, partitions: int | None) -> None:
    url = location(tmp_path)
    fill(url, "events", range(8))
    for as_of in (0, 3, 7):
        opts: dict[str, Any] = {"as_of": as_of}
        if partitions is not None:
            opts["numPartitions"] = partitions
        df = read(spark, url, "events", **opts)
        if partitions is not None:
            # NB: at most that many: the engine plans no more key ranges than keep the bytes
            # decoded within 1.5x those stored (these small parts ride inline: one task)
            assert 1 <= df.rdd.getNumPartitions() <= partitions
        assert canon(df.toArrow()) == canon(snapshot(url, "events", as_of))


def test_raw_mode_sums_to_snapshot(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(6))
    got = read(spark, url, "events", mode="raw", versionAsOf=4).toArrow()
    want = snapshot(url, "events", 4)
    assert set(got.column("time").to_pylist()) == {4}
    assert got.num_rows == 5 * 40  # every update at or before 4, none after
    assert sums(got) == sums(want)


def test_default_as_of_is_pinned_when_the_dataframe_is_made(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(3))
    df = read(spark, url, "events")
    first = canon(df.toArrow())
    assert first == canon(snapshot(url, "events", 2))
    fill(url, "events", range(3, 5))
    assert canon(df.toArrow()) == first  # same DataFrame, same definite answer
    assert canon(read(spark, url, "events").toArrow()) == canon(snapshot(url, "events", 4))


def test_as_of_outside_since_upper_fails_at_planning(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(4))
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(2).result()
    with pytest.raises(Exception, match="is not below its upper 4"):
        read(spark, url, "events", as_of=4).toArrow()
    with pytest.raises(Exception, match="is below its since 2"):
        read(spark, url, "events", as_of=1).toArrow()
    with pytest.raises(Exception, match="disagree"):
        read(spark, url, "events", as_of=2, versionAsOf=3).toArrow()
    with pytest.raises(Exception, match="unknown collection 'nope'"):
        read(spark, url, "nope").toArrow()


def test_definite_across_compaction(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(40), rows=25, compact=False)
    with persist.open(url, read_only=True) as client:
        parts_before = len(client.state.collections["events"].parts)
    before = canon(read(spark, url, "events", as_of=35).toArrow())
    raw_before = sums(read(spark, url, "events", as_of=35, mode="raw").toArrow())
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(35).result()
        compact(client)
        parts_after = len(client.state.collections["events"].parts)
    assert parts_after < parts_before
    assert canon(read(spark, url, "events", as_of=35).toArrow()) == before
    assert sums(read(spark, url, "events", as_of=35, mode="raw").toArrow()) == raw_before
    assert before == canon(snapshot(url, "events", 35))


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


class Tagged(msgspec.Struct, frozen=True):
    tags: dict[str, int]  # a dict field does not map to Arrow: stored as msgpack, by choice


def test_types_and_exact_arrow_schema(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    with persist.open(url) as client:
        w, _ = client.create_or_load("u", key_type=pa.uint64(), value_type=pa.large_string())
        w.append([((2**63 - 1, "a"), 0, 1), ((7, None), 0, 2)], upper=1).result()
        w2, _ = client.create_or_load("p", key_type=persist.msgpack(Tagged), value_type=pa.binary())
        w2.append([((Tagged({"a": 1}), b"\x00\xff"), 0, 1)], upper=1).result()
        w4, _ = client.create_or_load("s", key_type=Point, value_type=pa.binary())
        w4.append([((Point(1, 2), b"\x00"), 0, 1)], upper=1).result()
        w3, _ = client.create_or_load("big", key_type=pa.uint64(), value_type=pa.int64())
        w3.append([((2**63, 1), 0, 1)], upper=1).result()
    df = read(spark, url, "u")
    assert df.schema.simpleString() == "struct<key:bigint,value:string,time:bigint,diff:bigint>"
    assert sorted(df.toArrow().to_pylist(), key=str) == sorted(
        [{"key": 2**63 - 1, "value": "a", "time": 0, "diff": 1},
         {"key": 7, "value": None, "time": 0, "diff": 2}], key=str)
    got = read(spark, url, "p").toArrow()
    assert got.column("key").type == pa.binary()
    assert msgspec.msgpack.decode(got.column("key")[0].as_py(), type=Tagged) == Tagged({"a": 1})
    # a msgspec.Struct that maps is stored as an Arrow struct and read as a Spark struct
    assert read(spark, url, "s").schema["key"].dataType.simpleString() == "struct<x:bigint,y:bigint>"
    assert read(spark, url, "s").toArrow().column("key").to_pylist() == [{"x": 1, "y": 2}]
    with pytest.raises(Exception, match="does not fit Spark's long"):
        read(spark, url, "big").toArrow()
    # the batches we yield must match what Spark derives from the declared schema, exactly
    with persist.open(url, read_only=True) as client:
        for name in ("u", "p", "s"):
            types = CollectionTypes.of(client.info(name))
            assert to_arrow_schema(types.spark_schema).equals(types.arrow_schema)


def test_empty_and_unsealed_collections(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    with persist.open(url) as client:
        w, _ = client.create_or_load("e", key_type=pa.string(), value_type=pa.int64())
        with pytest.raises(Exception, match="nothing sealed"):
            read(spark, url, "e").toArrow()
        w.seal(3).result()
    assert read(spark, url, "e").count() == 0
    assert read(spark, url, "e", mode="raw").count() == 0


def test_read_as_of_a_tag(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(6))
    with persist.open(url) as client:
        client.tag("events", "q3-close", as_of=2).result()
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(5).result()
        compact(client)
    # definite as of the tag, whatever allow_compaction said after it
    got = read(spark, url, "events", tag="q3-close").toArrow()
    assert canon(got) == canon(snapshot(url, "events", 2))
    with pytest.raises(Exception, match="no tag 'nope'"):
        read(spark, url, "events", tag="nope").count()
    with pytest.raises(Exception, match="give one"):
        read(spark, url, "events", tag="q3-close", as_of=2).count()
