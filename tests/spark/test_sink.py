"""The persist sink through a real SparkSession: atomic batch writes, idempotent streams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import StructType

import persist
from operators.sink import PersistStreamWriter, progress, stage
from persist import layout
from persist.blob.file import FileBlob
from persist.distributed import TOKENS
from persist.indexed.state import lease
from tests.spark.support import canon, expected_updates, fill, location, updates_at
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

SCHEMA = "key string, value long, time long, diff long"


def rows(times: range, n: int = 30) -> list[tuple[str, int, int, int]]:
    return [(k, v, t, d) for t in times for (k, v), _, d in updates_at(t, n)]


def write(df: Any, url: str, name: str, **options: Any) -> None:
    w = df.write.format("persist").mode("append").option("collection", name)
    for k, v in options.items():
        w = w.option(k, v)
    w.save(url)


def data_blobs(tmp_path: Path) -> set[str]:
    root = tmp_path / "loc" / "data"
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() \
        else set()


def test_batch_write_round_trip(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    first = rows(range(0, 4))
    df = spark.createDataFrame(first, SCHEMA).repartition(3)
    write(df, url, "out")  # creates the collection from the DataFrame's types
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("out", key_type=pa.string(), value_type=pa.int64())
        assert r.upper == 4  # max time + 1
        assert len(client.state.collections["out"].parts) <= 3  # one part per task at most
    back = spark.read.format("persist").option("collection", "out").option("mode", "raw")
    assert canon(expected_updates(url, "out", 0, 4)) == sorted(first)
    # a second job appends (atomically) with an explicit upper
    write(spark.createDataFrame(rows(range(4, 6)), SCHEMA), url, "out", upper=10)
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("out", key_type=pa.string(), value_type=pa.int64())
        assert r.upper == 10
    assert canon(expected_updates(url, "out", 0, 10)) == sorted(rows(range(0, 6)))
    assert back.load(url).count() == len(rows(range(0, 6)))
    # each job staged under a staging lease of its own, released once its commit was
    # decided: the leaked-blob sweeps may reclaim its leftovers from then on, never before
    blob = FileBlob(tmp_path / "loc")
    assert blob.list_keys(layout.LEASE_PREFIX) == []
    assert len(blob.list_keys(layout.REVOKED_PREFIX)) == 2


def test_batch_write_is_all_or_nothing(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "out", range(5))
    before = expected_updates(url, "out", 0, 5)
    # most tasks' rows are fine, one partition holds a time below upper: nothing lands
    bad = [*rows(range(5, 8), n=2000), ("late", 1, 2, 1)]
    with pytest.raises(Exception, match="below its upper 5"):
        write(spark.createDataFrame(bad, SCHEMA).repartition(4), url, "out")
    with persist.open(url, read_only=True) as client:
        c = client.state.collections["out"]
        assert c.upper == 5
        referenced = {p.blob_key for p in c.parts if p.blob_key}
    assert canon(expected_updates(url, "out", 0, 5)) == canon(before)
    # cleaned up: what the failed tasks' messages named is deleted by the abort. NB: a task
    # Spark had not finished cancelling may stage after the abort (seen on a loaded machine);
    # its blob is staged under the job's lease, which the abort revoked, so the leaked-blob
    # sweeps reclaim it, and nothing else may be left
    blob = FileBlob(tmp_path / "loc")
    for key in data_blobs(tmp_path) - {k.removeprefix("data/") for k in referenced}:
        lease_id = layout.lease_of(layout.DATA_PREFIX + key)
        assert lease_id is not None, key
        assert lease.state(blob, lease_id) is lease.LeaseState.REVOKED, key
    with pytest.raises(Exception, match="reads its key as string"):
        write(spark.createDataFrame([(1, 1, 9, 1)], SCHEMA.replace("key string", "key long")),
              url, "out")


def test_stream_sink_replayed_batch_lands_once(spark: Any, tmp_path: Path) -> None:
    """persist -> Spark -> persist, then Spark replays the last micro-batch (its commit log
    entry lost, as after a crash between the sink's commit and Spark's): it must not land
    twice."""
    src, dst, ckpt = location(tmp_path, "src"), location(tmp_path, "loc"), tmp_path / "ckpt"
    fill(src, "events", range(4))

    def run() -> str:
        q = (spark.readStream.format("persist").option("collection", "events")
             .option("maxRowsPerTrigger", 80).load(src)
             .writeStream.format("persist").option("collection", "copy")
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start(dst))
        q.awaitTermination(PATIENCE)
        assert q.exception() is None
        return str(q.id)

    query = run()
    want = canon(expected_updates(src, "events", 0, 4))
    assert canon(expected_updates(dst, "copy", 0, 4)) == want
    commits = sorted((ckpt / "commits").iterdir(), key=lambda p: int(p.name)
                     if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    assert int(last.name) >= 1  # 160 rows, 80 per trigger: several batches
    last.unlink()  # Spark will run this batch again on restart
    (ckpt / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    assert run() == query  # the same checkpoint: the same query id, so the same sink
    assert last.exists()  # Spark did run the batch again
    assert canon(expected_updates(dst, "copy", 0, 4)) == want
    with persist.open(dst, read_only=True) as client:
        assert progress(client, f"copy@{query}") == int(last.name)  # the default sink id
        assert client.state.collections[TOKENS.name].upper == int(last.name) + 1
        assert client.state.collections["copy"].upper == 4


def test_stream_writer_commit_is_idempotent_per_batch_id(spark: Any, tmp_path: Path) -> None:
    """The protocol without Spark's scheduling: retried commits of one batchId land once, and
    the retries' staged blobs are deleted."""
    url = location(tmp_path)
    schema = StructType.fromDDL(SCHEMA)
    options = {"path": url, "collection": "out", "sinkid": "q"}
    writer = PersistStreamWriter(options, schema, False)

    def staged(times: range) -> Any:
        table = pa.table(dict(zip(("key", "value", "time", "diff"),
                                  map(list, zip(*rows(times, 3000), strict=True)), strict=True)))
        return stage(writer.stager, writer.types, iter(table.to_batches()))

    first = staged(range(0, 2))
    assert len(first.parts) == 1
    assert first.parts[0].part.blob_key is not None  # big enough to be staged as its own blob
    # the query's lease
    assert layout.lease_of(first.parts[0].part.blob_key) == writer.stager.lease_id
    writer.commit([first], 0)
    writer.commit([staged(range(0, 2))], 0)  # a retry of batch 0 (another task attempt)
    writer.commit([staged(range(2, 3)), None], 1)
    # a fresh writer (a new driver process) sees the durable progress
    again = PersistStreamWriter(options, schema, False)
    again.commit([staged(range(2, 3))], 1)
    assert canon(expected_updates(url, "out", 0, 3)) == sorted(rows(range(0, 3), 3000))
    with persist.open(url, read_only=True) as client:
        assert progress(client, "q") == 1
        assert progress(client, "other") is None
        referenced = {p.blob_key.removeprefix("data/")
                      for p in client.state.collections["out"].parts if p.blob_key}
    assert data_blobs(tmp_path) == referenced  # the replays' blobs were deleted


def test_a_task_streams_its_rows_into_bounded_parts(spark: Any, tmp_path: Path) -> None:
    """A sink task cuts a part whenever its buffered rows reach the part size, so its memory is
    bounded by a part, not by its partition; the job's parts land together."""
    url = location(tmp_path)
    schema = StructType.fromDDL(SCHEMA)
    writer = PersistStreamWriter({"path": url, "collection": "out", "sinkid": "q"}, schema,
                                 False)
    want = rows(range(0, 3), 2000)
    table = pa.table(dict(zip(("key", "value", "time", "diff"),
                              map(list, zip(*want, strict=True)), strict=True)))
    batches = table.to_batches(max_chunksize=500)
    size = max(b.nbytes for b in batches)
    staged = stage(writer.stager, writer.types, iter(batches), part_bytes=2 * size)
    assert len(staged.parts) == -(-len(batches) // 2)  # two batches per part
    assert sum(p.rows for p in staged.parts) == len(want)
    writer.commit([staged], 0)
    assert canon(expected_updates(url, "out", 0, 3)) == sorted(want)


@pytest.mark.parametrize("marks", [True, False])
def test_sink_batches_reach_the_goal_layout(spark: Any, tmp_path: Path, marks: bool) -> None:
    """Batches the sink commits (a bulk load in several tasks, then small batches of updates)
    end up in the compacted base once the since passes them: merged into it, or, with the
    marks step, a delta plus marks on it (issue 28's goal layout after every kind of write)."""
    from collections import Counter

    from persist.indexed.read.parts import PartReader
    from tests.indexed.test_base import MARKS, check_base, check_goal, options

    url = location(tmp_path)
    schema = "key long, value long, time long, diff long"
    load = [(k, k % 5, 0, 1) for k in range(6000)]
    write(spark.createDataFrame(load, schema).repartition(3), url, "c", upper=1)
    opts = options(inline_threshold=0, compaction=MARKS if marks else {"marks_rows": 1 << 40})
    with persist.open(url, options=opts) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert len(client.state.collections["c"].parts) >= 3  # the load's tasks' parts
        w.allow_compaction(0).result()
        while client.maintain():
            pass
        check_base(client.state.collections["c"], PartReader(FileBlob(tmp_path / "loc")),
                   runs_allowed=False)
    updates = [[(7, 2, 1, -1), (7, 9, 1, 1), (6500, 1, 1, 1)],
               [(100, 0, 2, -1), (4000, 3, 2, 1), (9000, 9, 2, 1)]]
    for t, batch in enumerate(updates, start=1):
        write(spark.createDataFrame(batch, schema).repartition(2), url, "c", upper=t + 1)
    with persist.open(url, options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.allow_compaction(2).result()
        while client.maintain():
            pass
        c = client.state.collections["c"]
        reader = PartReader(FileBlob(tmp_path / "loc"))
        if marks:
            assert check_goal(c, reader)  # the base marked, the runs in its delta
        else:
            # the updates wait on top of the base, a fraction of it (the policy's ratio)
            base, runs = check_base(c, reader)
            assert not any(p.marks is not None for p in c.parts)
            assert sum(p.rows for p in runs) * 4 < sum(p.rows for p in base)
        want: Counter[tuple[int, int]] = Counter()
        for k, v, _, d in [*load, *updates[0], *updates[1]]:
            want[(k, v)] += d
        got: Counter[tuple[int, int]] = Counter()
        for (k, v), _, d in r.snapshot(2).to_python():
            got[(k, v)] += d
        assert got == Counter({kv: d for kv, d in want.items() if d})
