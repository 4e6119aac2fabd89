"""No silent failure through Spark: every option is validated, a mistyped location says so,
the sink's default identity follows the query's checkpoint, and overwrite is a diff."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import StructType

import persist
from operators.sink import PersistBatchWriter, progress, sink_query, stage
from persist.distributed import commit as commit_mod
from tests.spark.support import canon, expected_updates, fill, location, sums, updates_at
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

SCHEMA = "key string, value long, time long, diff long"


def fails(match: str, action: Any) -> str:
    """Runs ``action``; it must raise with ``match`` (a plain substring) in its message."""
    with pytest.raises(Exception, match=re.escape(match)) as info:
        action()
    return str(info.value)


def test_options_are_validated_and_missing_locations_named(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(3), rows=5)

    def read(**options: Any) -> Any:
        r = spark.read.format("persist").option("collection", "events")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load(url)

    # batch read: an unknown option fails when the DataFrame is created, listing the rest
    msg = fails("unknown option 'colection'", lambda: read(colection="events"))
    assert "did you mean 'collection'?" in msg
    assert "numPartitions" in msg
    fails("no time zone", lambda: read(timestampAsOf="2024-01-01").count())
    fails("before its oldest recorded seal",
          lambda: read(timestampAsOf="2000-01-01T00:00Z").count())
    fails("give one", lambda: read(timestampAsOf="2024-01-01T00:00Z", as_of=1))
    fails("needs startingVersion", lambda: read(readChangeFeed="true"))
    fails("set readChangeFeed=true", lambda: read(startingVersion=0))
    msg = fails("option 'startingtimestamp'", lambda: read(readChangeFeed="true",
                                                            startingTimestamp="2024-01-01"))
    assert "startingVersion and endingVersion" in msg
    fails("unknown option 'startingupper' for a persist batch read",
          lambda: read(startingUpper=1).count())
    # stream read: a made-up option at load(), a batch-only one when the query starts
    fails("unknown option 'maxrowspertriger'", lambda: spark.readStream.format("persist")
          .option("collection", "events").option("maxRowsPerTriger", 1).load(url))
    q = (spark.readStream.format("persist").option("collection", "events").option("as_of", 1)
         .load(url).writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True))

    def run() -> None:
        query = q.start()
        query.awaitTermination(PATIENCE)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

    fails("unknown option 'as_of' for a persist stream read (it applies to batch read)", run)
    # writes: per mode
    df = spark.createDataFrame([("a", 1, 5, 1)], SCHEMA)
    msg = fails("unknown option 'sinkid' for a persist batch write (it applies to stream write)",
                lambda: df.write.format("persist").mode("append").option("collection", "out")
                .option("sinkId", "s").save(url))
    assert "lockTimeout" in msg
    # a mistyped location: no location there, named, never "unknown collection"
    missing = location(tmp_path, "no-such-loc")
    fails(f"no persist location at {missing!r}", lambda: spark.read.format("persist")
          .option("collection", "events").load(missing))
    fails(f"no persist location at {missing!r}", lambda: spark.readStream.format("persist")
          .option("collection", "events").load(missing))
    # ... while a write to a new location creates it
    df.write.format("persist").mode("append").option("collection", "out").save(missing)
    assert read().count() > 0
    with persist.open(missing, read_only=True) as client:
        assert client.state.collections["out"].upper == 6


def test_stream_sink_identity_follows_the_checkpoint(spark: Any, tmp_path: Path) -> None:
    src, dst = location(tmp_path, "src"), location(tmp_path, "dst")
    fill(src, "events", range(4))

    def run(ckpt: str, collection: str, **options: Any) -> Any:
        r = spark.readStream.format("persist").option("collection", "events")
        w_opts = {k: v for k, v in options.items() if k == "sinkId"}
        for k, v in options.items():
            if k != "sinkId":
                r = r.option(k, v)
        w = (r.load(src).writeStream.format("persist").option("collection", collection)
             .option("checkpointLocation", str(tmp_path / ckpt)))
        for k, v in w_opts.items():
            w = w.option(k, v)
        q = w.trigger(availableNow=True).start(dst)
        with contextlib.suppress(Exception):
            q.awaitTermination(PATIENCE)
        return q

    # the default sink id: a fresh checkpoint is a new sink, its batchIds from 0 land
    q1 = run("ck1", "copy")
    assert q1.exception() is None
    fill(src, "events", range(4, 6))
    q2 = run("ck2", "copy", startingUpper=4)
    assert q2.exception() is None
    assert q2.id != q1.id
    assert canon(expected_updates(dst, "copy", 0, 6)) == canon(expected_updates(src, "events",
                                                                                0, 6))
    with persist.open(dst, read_only=True) as client:
        assert progress(client, f"copy@{q1.id}") == 0
        assert progress(client, f"copy@{q2.id}") == 0

    # an explicit sinkId reused from another checkpoint with batchIds going back: an error
    q3 = run("ck3", "copy2", sinkId="s", maxRowsPerTrigger=100)
    assert q3.exception() is None
    with persist.open(dst, read_only=True) as client:
        last = progress(client, "s")
        assert last is not None
        assert last >= 1
        assert sink_query(client, "s") == str(q3.id)
    fill(src, "events", range(6, 8))
    q4 = run("ck4", "copy2", sinkId="s", startingUpper=6)
    err = str(q4.exception())
    assert "already committed micro-batch" in err
    assert "Give each checkpoint its own sinkId" in err
    with persist.open(dst, read_only=True) as client:
        assert client.state.collections["copy2"].upper == 6  # nothing of q4 landed
    # a restart from q3's own checkpoint goes on, with no duplicates
    q5 = run("ck3", "copy2", sinkId="s", maxRowsPerTrigger=100)
    assert q5.exception() is None
    assert q5.id == q3.id
    assert canon(expected_updates(dst, "copy2", 0, 8)) == canon(expected_updates(src, "events",
                                                                                 0, 8))


def test_overwrite_replaces_contents_as_a_diff(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(5))

    def snapshot(as_of: int) -> dict[Any, int]:
        with persist.open(url, read_only=True) as client:
            _, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
            return sums(r.snapshot(as_of).to_arrow())

    before = snapshot(4)
    new = [("k001", 10, 0, 2), ("fresh", 7, 99, 1), ("fresh", 7, 3, 1), ("gone", 1, 0, 0)]
    (spark.createDataFrame(new, SCHEMA).repartition(2).write.format("persist")
     .mode("overwrite").option("collection", "events").save(url))
    with persist.open(url, read_only=True) as client:
        assert client.state.collections["events"].upper == 6  # landed at 5, sealed 6
    assert snapshot(5) == {("k001", 10): 2, ("fresh", 7): 2}  # the rows' times are not used
    assert snapshot(4) == before  # history intact
    got = (spark.read.format("persist").option("collection", "events").option("as_of", 5)
           .load(url).toArrow())
    assert sums(got) == snapshot(5)
    assert set(got.column("time").to_pylist()) == {5}
    # an empty overwrite truncates
    spark.createDataFrame([], SCHEMA).write.format("persist").mode("overwrite") \
        .option("collection", "events").save(url)
    assert snapshot(6) == {}
    assert snapshot(5) == {("k001", 10): 2, ("fresh", 7): 2}


def test_overwrite_retraction_in_buckets(spark: Any, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The retraction built bucket by bucket (tiny buckets here) is exactly the negated
    snapshot, and it lands with the new rows in one commit; without Spark's scheduling."""
    url = location(tmp_path)
    # NB: sorted blob parts of several row groups, so the consolidated plan can split them by
    # key (inline parts are read by every task: the decode bound plans one task for those)
    options = persist.Options(inline_threshold=0, batch_rows=8, background_compaction=False)
    with persist.open(url, options=options) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in range(6):
            w.append(updates_at(t, 60), upper=t + 1).result()
    monkeypatch.setattr(commit_mod, "RETRACT_ROWS", 25)
    buckets: list[int] = []
    real = persist.distributed.read_task

    def counted(task: Any) -> Any:
        buckets.append(task.bucket)
        return real(task)

    monkeypatch.setattr(commit_mod, "read_task", counted)
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        before = sums(r.snapshot(5).to_arrow())
    writer = PersistBatchWriter({"path": url, "collection": "events"},
                                StructType.fromDDL(SCHEMA), True)
    assert writer.at == 6
    table = pa.table({"key": ["x", "y"], "value": [1, 2], "time": [0, 0], "diff": [1, 3]})
    writer.commit([stage(writer.stager, writer.types, iter(table.to_batches()), at=6)])
    assert len(buckets) > 3
    assert buckets == list(range(len(buckets)))
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        assert r.upper == 7
        assert sums(r.snapshot(6).to_arrow()) == {("x", 1): 1, ("y", 2): 3}
        assert sums(r.snapshot(5).to_arrow()) == before


def test_timestamp_as_of_and_the_change_feed(spark: Any, tmp_path: Path) -> None:
    """timestampAsOf reads what was sealed by a wall-clock time; the change feed equals the
    client's updates of the range, with Delta's _change_type."""
    url = location(tmp_path)
    for t in range(3):  # apart in wall-clock time: a seal's time is recorded to the millisecond
        fill(url, "events", [t], rows=20)
        time.sleep(0.01)
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        seals = r.history()
        want_then = sums(r.snapshot(1).to_arrow())
    assert [s.upper for s in seals] == [1, 2, 3]
    then = (spark.read.format("persist").option("collection", "events")
            .option("timestampAsOf", seals[1].committed_at.isoformat()).load(url))
    assert {(x.key, x.value): x.diff for x in then.collect()} == want_then

    def feed(**bounds: Any) -> list[tuple[Any, ...]]:
        r = (spark.read.format("persist").option("collection", "events")
             .option("readChangeFeed", "true"))
        for k, v in bounds.items():
            r = r.option(k, v)
        df = r.load(url)
        assert df.columns == ["key", "value", "time", "diff", "_change_type"]
        return sorted(tuple(x) for x in df.collect())

    def expected(lo: int, hi: int) -> list[tuple[Any, ...]]:
        return sorted((k, v, t, d, "insert" if d > 0 else "delete")
                      for k, v, t, d in canon(expected_updates(url, "events", lo, hi)))

    got = feed(startingVersion=1, endingVersion=1)
    assert got == expected(1, 2)
    assert {row[4] for row in got} == {"insert", "delete"}  # the fill retracts some rows
    assert feed(startingVersion=0) == expected(0, 3)
    fails("not sealed yet", lambda: feed(startingVersion=1, endingVersion=3))
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(2).result()
    fails("no longer exact", lambda: feed(startingVersion=2))


def test_catalog_tables_fail_where_the_user_acts(spark: Any, tmp_path: Path) -> None:
    """pyspark 4.3 passes a Python data source no options when a catalog table is read or
    written: CREATE TABLE is refused at once, and a table saveAsTable registered fails its
    first read saying why (never ``known: []`` or a silent empty result)."""
    url = location(tmp_path)
    fill(url, "events", range(2), rows=5)
    fails("cannot be catalog tables on this pyspark", lambda: spark.sql(
        f"CREATE TABLE persist_t1 USING persist OPTIONS (path '{url}', collection 'events')"))
    df = spark.createDataFrame([("a", 1, 5, 1)], SCHEMA)
    df.write.format("persist").option("collection", "events").mode("append") \
        .saveAsTable("persist_t2", path=url)
    try:
        fails("a catalog table (saveAsTable) cannot name it",
              lambda: spark.table("persist_t2").collect())
    finally:
        spark.sql("DROP TABLE IF EXISTS persist_t2")
