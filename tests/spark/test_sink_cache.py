"""The streaming sink keeps its writer open between micro-batches (the engine's kept writers,
``persist.distributed.Writers``): batches still land exactly once, a kept writer whose lock
was taken over is replaced without loss or duplicates, and an idle one releases the location's
lock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import persist
from operators.options import WriteOptions
from operators.sink import PersistStreamWriter, progress, stage
from persist.distributed import TOKENS, WRITERS
from tests.spark.support import canon, expected_updates, fill, location, updates_at
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

SCHEMA = StructType([StructField("key", StringType()), StructField("value", LongType()),
                     StructField("time", LongType()), StructField("diff", LongType())])


def run_copy(spark: Any, src: str, dst: str, ckpt: Path, **options: Any) -> str:
    """persist -> Spark -> persist, one micro-batch per sealed time (40 rows each), until
    the source's upper; returns the query id."""
    w = (spark.readStream.format("persist").option("collection", "events")
         .option("maxRowsPerTrigger", 40).load(src)
         .writeStream.format("persist").option("collection", "copy")
         .option("checkpointLocation", str(ckpt)))
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(dst)
    q.awaitTermination(PATIENCE)
    assert q.exception() is None
    return str(q.id)


def append(url: str, times: range) -> None:
    """Appends 40 updates at each of ``times`` to ``events``, sealing after each."""
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t in times:
            w.append(updates_at(t, 40), upper=t + 1).result()


def side_write(dst: str, rid: str, *, lock_timeout: float = 0.0) -> None:
    """Another writer of ``dst`` (as ``rid``) commits to a collection of its own."""
    with persist.open(dst, reentrance_id=rid, lock_timeout=lock_timeout) as client:
        w, r = client.create_or_load("side", key_type=pa.string(), value_type=pa.int64())
        w.append([(("x", 1), r.upper, 1)], upper=r.upper + 1).result()


def assert_copied(src: str, dst: str, upper: int, sink: str, last_batch: int) -> None:
    assert canon(expected_updates(dst, "copy", 0, upper)) == \
        canon(expected_updates(src, "events", 0, upper))
    with persist.open(dst, read_only=True) as client:
        assert progress(client, sink) == last_batch
        assert client.state.collections["copy"].upper == upper


def test_a_stream_lands_every_batch_once_on_its_kept_writer(spark: Any, tmp_path: Path) -> None:
    """Several micro-batches, committed through one kept writer, land once each; the writer
    holds the lock while kept, and a restarted query replaying its last batch drops it."""
    src, dst, ckpt = location(tmp_path, "src"), location(tmp_path, "dst"), tmp_path / "ckpt"
    fill(src, "events", range(6))
    query = run_copy(spark, src, dst, ckpt, writerIdleTimeout=30)
    # NB: kept in Spark's Python worker, so the location's lock is busy for a while
    with pytest.raises(persist.LockHeld):
        persist.open(dst, reentrance_id="probe", lock_timeout=0).stop()
    assert_copied(src, dst, 6, f"copy@{query}", 5)
    last = ckpt / "commits" / "5"
    last.unlink()  # Spark will run batch 5 again on restart: a replay on the kept writer
    (ckpt / "commits" / ".5.crc").unlink(missing_ok=True)
    append(src, range(6, 8))
    assert run_copy(spark, src, dst, ckpt, writerIdleTimeout=30) == query
    assert last.exists()
    assert_copied(src, dst, 8, f"copy@{query}", 7)


def test_a_kept_writer_fenced_meanwhile_is_replaced(spark: Any, tmp_path: Path) -> None:
    """Another process opens the location under the sink's reentrance id (taking the lock
    over at once, fencing the kept writer, which need not have noticed yet) and commits: the
    next micro-batch's commit fails on the kept writer, nothing of it lands, and it lands
    once on a new writer; the other writer's commit stays."""
    src, dst, ckpt = location(tmp_path, "src"), location(tmp_path, "dst"), tmp_path / "ckpt"
    fill(src, "events", range(3))
    opts = {"sinkId": "s", "reentranceId": "sink-rid", "writerIdleTimeout": 60}
    run_copy(spark, src, dst, ckpt, **opts)
    side_write(dst, "sink-rid")  # a takeover: same id, no wait
    append(src, range(3, 6))
    run_copy(spark, src, dst, ckpt, **opts)
    assert_copied(src, dst, 6, "s", 5)
    with persist.open(dst, read_only=True) as client:
        assert client.info("side").upper == 1
        assert client.state.collections[TOKENS.name].upper == 6  # one token per batch


def test_an_idle_writer_releases_the_lock(spark: Any, tmp_path: Path) -> None:
    """Once the stream has been idle for writerIdleTimeout, its writer is closed: another
    writer (another id) gets the lock, and the stream then goes on with a new writer."""
    src, dst, ckpt = location(tmp_path, "src"), location(tmp_path, "dst"), tmp_path / "ckpt"
    fill(src, "events", range(3))
    query = run_copy(spark, src, dst, ckpt, writerIdleTimeout=1)
    # NB: kept forever (heartbeats), the lock would make this wait out the lock timeout and
    # fail with LockHeld; closed after 1 s idle, it is free well within it
    side_write(dst, "other", lock_timeout=60)
    append(src, range(3, 5))
    run_copy(spark, src, dst, ckpt, writerIdleTimeout=1)
    assert_copied(src, dst, 5, f"copy@{query}", 4)


# -- the protocol in this process, without Spark's scheduling --------------------------------


def _staged(writer: PersistStreamWriter, t: int) -> Any:
    rows = [(k, v, tt, d) for (k, v), tt, d in updates_at(t, 40)]
    table = pa.table(dict(zip(("key", "value", "time", "diff"),
                              map(list, zip(*rows, strict=True)), strict=True)))
    return stage(writer.stager, writer.types, iter(table.to_batches()))


def test_commits_reuse_the_kept_writer_and_survive_a_takeover(tmp_path: Path) -> None:
    url = location(tmp_path)
    options = {"path": url, "collection": "out", "sinkid": "q", "writeridletimeout": "60"}
    key = (url, (), "persist-spark-sink:q")
    writer = PersistStreamWriter(options, SCHEMA, False)
    try:
        PersistStreamWriter(options, SCHEMA, False).commit([_staged(writer, 0)], 0)
        assert WRITERS.idle() == [key]
        kept = WRITERS.take(key)
        assert kept is not None
        WRITERS.keep(key, kept, 60)
        PersistStreamWriter(options, SCHEMA, False).commit([_staged(writer, 1)], 1)
        again = WRITERS.take(key)
        assert again is kept  # the same writer, not a new open
        WRITERS.keep(key, again, 60)
        # a takeover under the sink's id (a restarted driver): the kept writer is fenced
        with persist.open(url, reentrance_id="persist-spark-sink:q") as other:
            w, _ = other.create_or_load("side", key_type=pa.string(), value_type=pa.int64())
            w.append([(("x", 1), 0, 1)], upper=1).result()
        PersistStreamWriter(options, SCHEMA, False).commit([_staged(writer, 2)], 2)
        PersistStreamWriter(options, SCHEMA, False).commit([_staged(writer, 2)], 2)  # replay
        replaced = WRITERS.take(key)
        assert replaced is not None
        assert replaced is not kept
        assert kept.stopped
        WRITERS.keep(key, replaced, 60)
        with pytest.raises(persist.LockHeld):
            persist.open(url, reentrance_id="probe", lock_timeout=0).stop()
    finally:
        WRITERS.close()
    want = sorted((k, v, t, d) for t in range(3) for (k, v), _, d in updates_at(t, 40))
    assert canon(expected_updates(url, "out", 0, 3)) == want
    with persist.open(url, reentrance_id="probe", lock_timeout=0) as client:  # released
        assert progress(client, "q") == 2
        assert client.info("side").upper == 1


def test_writer_idle_timeout_zero_keeps_nothing(tmp_path: Path) -> None:
    url = location(tmp_path)
    options = {"path": url, "collection": "out", "sinkid": "q", "writeridletimeout": "0"}
    writer = PersistStreamWriter(options, SCHEMA, False)
    writer.commit([_staged(writer, 0)], 0)
    assert WRITERS.idle() == []
    with persist.open(url, reentrance_id="other", lock_timeout=0) as client:
        assert progress(client, "q") == 0
    with pytest.raises(persist.InvalidUsage, match="it applies to stream write"):
        WriteOptions.parse({"path": url, "collection": "out", "writeridletimeout": "1"})
    with pytest.raises(persist.InvalidUsage, match="must be >= 0"):
        WriteOptions.parse({**options, "writeridletimeout": "-1"}, "stream-write")
