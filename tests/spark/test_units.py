"""The operators' pure parts, without a SparkSession: bucketing, consolidation, options,
admission control and partition planning."""

from __future__ import annotations

import pickle
import uuid

import numpy as np
import pyarrow as pa
import pytest

import persist
from operators.options import ReadOptions, WriteOptions
from operators.source import PersistStreamReader
from persist.distributed import StreamCursor
from persist.errors import InvalidUsage
from persist.indexed.format.columnar import contents_at, part_schema
from persist.indexed.format.meta import PartMeta
from persist.indexed.read import buckets
from persist.indexed.read.scan import Address, CollectionInfo, group
from tests.spark.support import updates_at

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("values", [
    pa.array([f"user-{i % 997:06d}" for i in range(5000)] + ["", None]),
    pa.array([f"user-{i % 997:06d}".encode() for i in range(5000)] + [b""], pa.large_binary()),
    pa.array([i % 313 - 150 for i in range(5000)], pa.int64()),
    pa.array([i % 313 for i in range(5000)], pa.uint64()),
    pa.array([True, False, None] * 100),
])
def test_equal_keys_hash_equal_whatever_the_chunking(values: pa.Array) -> None:
    whole = buckets.hash_keys(values)
    chunked = buckets.hash_keys(pa.chunked_array([values.slice(0, 1234), values.slice(1234)]))
    assert (whole == chunked).all()
    by_value: dict[object, int] = {}
    for v, h in zip(values.to_pylist(), whole.tolist(), strict=True):
        assert by_value.setdefault(v, h) == h
    if len(set(values.to_pylist())) > 100:  # spread: no bucket gets much more than its share
        counts = np.bincount((whole % np.uint64(4)).astype(np.int64), minlength=4)
        assert counts.max() < 0.3 * len(values)


def test_float_keys_arrow_may_group_share_a_bucket() -> None:
    floats = pa.array([0.0, -0.0, float("nan"), -float("nan"), 1.5, None])
    h = buckets.hash_keys(floats)
    assert h[0] == h[1]
    assert h[2] == h[3]


def test_bucketed_consolidation_equals_contents_at() -> None:
    rows = [u for t in range(12) for u in updates_at(t, 300, keys=97)]
    schema = part_schema(pa.string(), pa.int64())
    table = pa.table({"key": [k for (k, _), _, _ in rows], "value": [v for (_, v), _, _ in rows],
                      "time": pa.array([t for _, t, _ in rows], pa.uint64()),
                      "diff": [d for _, _, d in rows]}, schema=schema)
    for as_of in (0, 5, 11):
        want = contents_at(table, as_of).to_pylist()
        got = []
        for b in range(3):
            mine = table.filter(pa.array(buckets.hash_keys(table.column("key")) % 3 == b))
            mine = mine.filter(pa.compute.less_equal(mine.column("time"), as_of))
            got += buckets.consolidate(mine, as_of).to_pylist()
        key = lambda r: (r["key"], r["value"])  # noqa: E731
        assert sorted(got, key=key) == sorted(want, key=key)


def test_options_are_read_lower_cased_and_checked() -> None:
    raw = {"path": "file:///x", "collection": "c", "versionasof": "3", "mode": "RAW",
           "maxrowspertrigger": "10", "failondataloss": "false", "storage_options.fsync": "false",
           "startingupper": "5", "readhold": "h"}
    o = ReadOptions.parse(raw)
    assert (o.as_of, o.mode, o.max_rows_per_trigger, o.fail_on_data_loss, o.starting_upper,
            o.read_hold) == (3, "raw", 10, False, 5, "h")
    assert o.target.storage_options == {"fsync": False}
    assert ReadOptions.parse({"path": "p", "collection": "c"}).starting_upper == "earliest"
    for bad, match in (({"collection": "c"}, "needs a location"), ({"path": "p"}, "collection"),
                       ({"path": "p", "collection": "c", "as_of": "x"}, "not an integer"),
                       ({"path": "p", "collection": "c", "mode": "sum"}, "consolidated"),
                       ({"path": "p", "collection": "c", "as_of": "-1"}, ">= 0")):
        with pytest.raises(InvalidUsage, match=match):
            ReadOptions.parse(bad)
    w = WriteOptions.parse({"path": "p", "collection": "c", "key_type": "large_string"})
    assert (w.key_type, w.sink_id) == (pa.large_string(), None)  # None: from the query id
    with pytest.raises(InvalidUsage, match="not an Arrow type"):
        WriteOptions.parse({"path": "p", "collection": "c", "value_type": "decimal"})
    with pytest.raises(InvalidUsage, match="not a persist offset"):
        StreamCursor.frontier({"offset": 3})


def test_exactness_rule() -> None:
    def info(since: int, holds: dict[str, int] | None = None) -> CollectionInfo:
        return CollectionInfo(Address("mem://x"), persist.indexed.format.meta.CollectionMeta(
            id=1, name="c", key_type=b"", value_type=b"", since=since, upper=20,
            holds=holds or {}))

    assert info(0).exact(0, 1)
    assert info(4).exact(0, 5)
    assert not info(5).exact(0, 5)
    assert info(4).exact(5, 9)
    assert not info(5).exact(5, 9)
    assert info(9, {"h": 4}).exact(5, 9)  # a hold keeps the range exact


def test_grouping() -> None:
    def part(rows: int, t: int) -> PartMeta:
        return PartMeta(id=uuid.uuid4().hex, rows=rows, nbytes=1, min_time=t, max_time=t)

    parts = [part(10, 0), part(10, 1), part(500, 2), part(10, 3), part(95, 4)]
    assert [sum(p.rows for p in g) for g in group(parts, 100)] == [500, 30, 95]


def test_stream_reader_pickles_without_its_metadata_view(tmp_path: object) -> None:
    url = f"file://{tmp_path}/loc"
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.append(updates_at(0, 5), upper=1).result()
        types_schema = None
    from operators.schema import CollectionTypes

    with persist.open(url, read_only=True) as client:
        types_schema = CollectionTypes.of(client.info("c")).spark_schema
    reader = PersistStreamReader(ReadOptions.parse({"path": url, "collection": "c"}),
                                 types_schema)
    assert reader.initialOffset() == {"upper": 0}
    assert reader.latestOffset({"upper": 0}, None) == {"upper": 1}
    clone = pickle.loads(pickle.dumps(reader))
    assert not clone.cursor.watching
    assert reader.cursor.watching
    parts = reader.partitions({"upper": 0}, {"upper": 1})
    got = [b for p in parts for b in clone.read(pickle.loads(pickle.dumps(p)))]
    assert sum(b.num_rows for b in got) == 5
