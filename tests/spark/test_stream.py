"""Streaming reads through a real SparkSession: micro-batches by sealed frontier."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from tests.spark.support import (
    Collected,
    canon,
    compact,
    expected_updates,
    fill,
    location,
    updates_at,
)
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark


def stream(spark: Any, url: str, name: str, **options: Any) -> Any:
    r = spark.readStream.format("persist").option("collection", name)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(url)


def run_available_now(spark: Any, url: str, name: str, ckpt: Path, sink: Collected,
                      **options: Any) -> None:
    q = (stream(spark, url, name, **options).writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    q.awaitTermination(PATIENCE)
    if q.exception() is not None:
        raise q.exception()


def committed_offsets(ckpt: Path) -> list[int]:
    """The end offsets ({"upper": N}) of every batch in a checkpoint's offset log."""
    out = []
    for f in sorted((ckpt / "offsets").iterdir(), key=lambda p: int(p.name)
                    if p.name.isdigit() else -1):
        if f.name.isdigit():
            out.append(json.loads(f.read_text().splitlines()[-1])["upper"])
    return out


def test_available_now_over_several_seals_then_restart(spark: Any, tmp_path: Path) -> None:
    url, ckpt = location(tmp_path), tmp_path / "ckpt"
    fill(url, "events", range(5))
    first = Collected()
    run_available_now(spark, url, "events", ckpt, first)
    assert canon(first.all()) == canon(expected_updates(url, "events", 0, 5))
    fill(url, "events", range(5, 9))
    second = Collected()
    run_available_now(spark, url, "events", ckpt, second)
    # the restart resumes exactly at upper 5: no duplicates, no gaps
    assert canon(second.all()) == canon(expected_updates(url, "events", 5, 9))
    assert committed_offsets(ckpt)[-1] == 9


def test_processing_time_trigger_picks_up_new_seals(spark: Any, tmp_path: Path) -> None:
    url, ckpt = location(tmp_path), tmp_path / "ckpt"
    fill(url, "events", range(2))
    sink = Collected()
    q = (stream(spark, url, "events", startingUpper="latest").writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(ckpt)).trigger(processingTime="200 milliseconds")
         .start())
    try:
        deadline = time.monotonic() + PATIENCE
        # NB: the query starts asynchronously; "latest" is fixed when its first trigger runs
        while q.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with persist.open(url) as client:
            w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
            for t in range(2, 5):
                w.append(updates_at(t, 40), upper=t + 1).result()
                while sink.rows() < (t - 1) * 40 and time.monotonic() < deadline:
                    time.sleep(0.05)
    finally:
        q.stop()
    assert q.exception() is None
    # startingUpper=latest: nothing before 2, then every seal, each batch whole times
    assert canon(sink.all()) == canon(expected_updates(url, "events", 2, 5))
    for table in sink.tables:
        assert len(set(table.column("time").to_pylist())) <= 1 or table.num_rows == 0


def test_max_rows_per_trigger_never_splits_a_time(spark: Any, tmp_path: Path) -> None:
    url, ckpt = location(tmp_path), tmp_path / "ckpt"
    sizes = {0: 10, 1: 10, 2: 35, 3: 5, 4: 5, 5: 5, 6: 20}
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        for t, n in sizes.items():
            w.append(updates_at(t, n), upper=t + 1).result()
        # one part spanning several times: counted per time, not as a whole
        w.append([u for t in (7, 8, 9) for u in updates_at(t, 8)], upper=10).result()
        sizes.update({7: 8, 8: 8, 9: 8})
    sink = Collected()
    run_available_now(spark, url, "events", ckpt, sink, maxRowsPerTrigger=20)
    assert canon(sink.all()) == canon(expected_updates(url, "events", 0, 10))
    for table in sink.tables:
        times = table.column("time").to_pylist()
        for t in set(times):
            assert times.count(t) == sizes[t]  # whole times only
        assert table.num_rows <= 20 or len(set(times)) == 1  # only a lone time may exceed
    assert [t.num_rows for t in sink.tables if t.num_rows] == [20, 35, 15, 20, 16, 8]


def test_fail_on_data_loss_and_skip_ahead(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(3))
    first = Collected()
    run_available_now(spark, url, "events", tmp_path / "a", first)
    fill(url, "events", range(3, 8))
    with persist.open(url) as client:
        w, _ = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(5).result()  # the stream stands at upper 3: needs since <= 2
    with pytest.raises(Exception, match="lost data") as e:
        run_available_now(spark, url, "events", tmp_path / "a", Collected())
    assert "failOnDataLoss=false" in str(e.value)
    skipped = Collected()
    run_available_now(spark, url, "events", tmp_path / "a", skipped, failOnDataLoss="false")
    # skipped ahead: exactly the updates after since (5), nothing at or before
    assert canon(skipped.all()) == canon(expected_updates(url, "events", 6, 8))


def test_read_hold_keeps_since_behind_the_stream(spark: Any, tmp_path: Path) -> None:
    url, ckpt = location(tmp_path), tmp_path / "ckpt"
    fill(url, "events", range(3))
    first = Collected()
    run_available_now(spark, url, "events", ckpt, first, readHold="q1", readHoldLease=3600)
    with persist.open(url) as client:
        w, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        # NB: Spark never commits the last batch of an availableNow run to the source, so the
        # hold stands at the start of that batch: behind the stream, never ahead of it
        assert 0 <= w.holds["q1"] <= 2
        # a named consumer hold, with the query's lease
        (h,) = client.holds("events")
        assert (h.name, h.kind, h.lease_seconds, h.lapsed) == ("q1", "hold", 3600, False)
        for t in range(3, 8):
            w.append(updates_at(t, 40), upper=t + 1).result()
        w.allow_compaction(7).result()
        assert r.since <= 2  # held back by the stream
        compact(client)
    second = Collected()
    run_available_now(spark, url, "events", ckpt, second, readHold="q1")
    assert canon(second.all()) == canon(expected_updates(url, "events", 3, 8))
    with persist.open(url) as client:
        w, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        assert w.holds == {"q1": 2}  # the second run started at upper 3
        w.hold("q1", None).result()  # the query is dropped for good: release
        assert r.since == 7


def test_earliest_after_compaction_starts_with_the_snapshot(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    fill(url, "events", range(6))
    with persist.open(url) as client:
        w, r = client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(3).result()
        compact(client)
        snap3 = r.snapshot(3).to_arrow()
    sink = Collected()
    run_available_now(spark, url, "events", tmp_path / "ckpt", sink)
    got = sink.all()
    at_or_before = got.filter(pa.compute.less_equal(got.column("time"), 3))
    summed: dict[Any, int] = {}
    for k, v, d in zip(*(at_or_before.column(c).to_pylist() for c in ("key", "value", "diff")),
                       strict=True):
        summed[(k, v)] = summed.get((k, v), 0) + d
    assert {kv: d for kv, d in summed.items() if d} == {
        (k, v): d for k, v, d in zip(*(snap3.column(c).to_pylist()
                                       for c in ("key", "value", "diff")), strict=True)}
    after = got.filter(pa.compute.greater(got.column("time"), 3))
    assert canon(after) == canon(expected_updates(url, "events", 4, 6))
