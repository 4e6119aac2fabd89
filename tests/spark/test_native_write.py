"""The native write path (``operators.write``): Spark's own Parquet writer writes the part
files, persist adopts and commits them once. Same result as the ``persist`` sink; exactly once
under a token; types it cannot take go through the sink; bad rows refused with nothing
written; a driver killed between staging and commit lands nothing and leaks nothing past its
lease."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import operators
import persist
from persist.blob.file import FileBlob
from persist.indexed.maintenance import gc
from persist.indexed.maintenance.verify import verify
from persist.indexed.state import lease
from tests.spark.support import compact, expected_updates, fill, location, sums
from tests.support.patience import PATIENCE

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def _rows(spark: Any, n: int = 150_000, *, shift: int = 0) -> Any:
    """Updates with repeated keys, null values, retractions and several times."""
    return spark.range(0, n, numPartitions=3).selectExpr(
        "id % 1013 as key",
        "case when id % 11 = 0 then null else cast(id % 89 as string) end as value",
        f"id % 6 + {shift} as time",
        "case when id % 4 = 0 then -1L else 2L end as diff")


def canon(table: Any) -> list[tuple[Any, ...]]:
    """Rows of ``table`` (key, value, time, diff) in a canonical order (nulls included)."""
    cols = [table.column(c).to_pylist() for c in ("key", "value", "time", "diff")]
    return sorted(zip(*cols, strict=True), key=repr)


def _files(url: str) -> list[Path]:
    return sorted(p for p in Path(url.removeprefix("file://"), "data").rglob("*") if p.is_file())


def _upper(url: str, name: str = "c") -> int:
    with persist.open(url, read_only=True) as client:
        return client.info(name).upper


def test_a_native_write_equals_the_sinks_and_its_files_are_persist_parts(
        spark: Any, tmp_path: Path) -> None:
    native, sink = location(tmp_path, "native"), location(tmp_path, "sink")
    df = _rows(spark)
    written = operators.write(df, native, "c")
    assert written.native
    assert written.landed
    assert written.rows == 150_000
    df.write.format("persist").mode("append").option("collection", "c").save(sink)
    assert canon(expected_updates(native, "c", 0, 6)) == canon(expected_updates(sink, "c", 0, 6))
    assert _upper(native) == _upper(sink) == 6
    # consolidated reads (which rely on the parts' order) agree too
    a = spark.read.format("persist").option("collection", "c").load(native).collect()
    b = spark.read.format("persist").option("collection", "c").load(sink).collect()
    assert sorted(map(tuple, a), key=repr) == sorted(map(tuple, b), key=repr)
    assert a
    # what is stored: Spark's Parquet files in the job's staging directory, nothing else
    files = _files(native)
    assert files
    assert all(f.suffix == ".parquet" and f.parent.name.startswith("staged-")
                         for f in files)
    for f in files:
        md = pq.ParquetFile(f).metadata
        assert md.row_group(0).column(0).compression == "ZSTD"
        assert md.row_group(0).column(0).has_column_index
        assert all(md.row_group(i).num_rows <= 1 << 16 for i in range(md.num_row_groups))
    # the native read hands Spark these very files (their tails were recorded at adoption and
    # verified at planning) and reads what the sink's collection holds
    raw = operators.PersistTable.forPath(spark, native, "c").toDF(consolidated=False)
    assert {Path(u.removeprefix("file://")).name for u in raw.inputFiles()} == {
        f.name for f in files}
    got = operators.PersistTable.forPath(spark, native, "c").toDF().collect()
    assert sorted(map(tuple, got), key=repr) == sorted(map(tuple, b), key=repr)


def test_an_unsorted_native_write_reads_the_same(spark: Any, tmp_path: Path) -> None:
    native, sink = location(tmp_path, "native"), location(tmp_path, "sink")
    df = _rows(spark, 60_000)
    assert operators.write(df, native, "c", sort=False).native
    df.write.format("persist").mode("append").option("collection", "c").save(sink)
    assert canon(expected_updates(native, "c", 0, 6)) == canon(expected_updates(sink, "c", 0, 6))
    a = spark.read.format("persist").option("collection", "c").load(native).collect()
    b = spark.read.format("persist").option("collection", "c").load(sink).collect()
    assert sorted(map(tuple, a), key=repr) == sorted(map(tuple, b), key=repr)
    with persist.open(native) as client:  # compaction merges (and sorts) the unordered parts
        compact(client)
    c = spark.read.format("persist").option("collection", "c").load(native).collect()
    assert sorted(map(tuple, c), key=repr) == sorted(map(tuple, b), key=repr)


def test_a_flipped_bit_in_a_natively_written_part_is_caught(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    operators.write(_rows(spark, 20_000), url, "c")
    victim = _files(url)[0]
    data = bytearray(victim.read_bytes())
    data[len(data) - 40] ^= 0x10  # in the footer
    victim.write_bytes(bytes(data))
    with pytest.raises(persist.ChecksumMismatch):
        expected_updates(url, "c", 0, 6)


def test_a_retry_with_the_same_token_lands_once(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    df = _rows(spark, 30_000)
    first = operators.write(df, url, "c", token=("load", 1))
    again = operators.write(df, url, "c", token=("load", 1))
    assert first.landed
    assert not again.landed
    assert again.rows == 0
    assert canon(expected_updates(url, "c", 0, 6)) == canon(df.toArrow())
    later = operators.write(_rows(spark, 30_000, shift=6), url, "c", token=("load", 2))
    assert later.landed
    assert _upper(url) == 12
    assert len(expected_updates(url, "c", 0, 12)) == 60_000
    # the replay's files were deleted: only the two landed writes' parts are stored
    with persist.open(url, read_only=True) as client:
        stored = gc.referenced(client.state)
    assert {str(f) for f in _files(url)} == {str(Path(url.removeprefix("file://"), k))
                                             for k in stored}


@pytest.mark.parametrize(("value", "why"), [("cast(id as double)", "value double"),
                                             ("cast(id as timestamp)", "value timestamp")])
def test_types_the_native_path_cannot_take_go_through_the_sink(
        spark: Any, tmp_path: Path, value: str, why: str) -> None:
    url, ref = location(tmp_path, "a"), location(tmp_path, "b")
    df = spark.range(0, 5000, numPartitions=2).selectExpr(
        "id % 50 as key", f"{value} as value", "id % 3 as time", "1L as diff")
    written = operators.write(df, url, "c")
    assert not written.native
    assert why in (written.why or "")
    df.write.format("persist").mode("append").option("collection", "c").save(ref)
    assert canon(expected_updates(url, "c", 0, 3)) == canon(expected_updates(ref, "c", 0, 3))
    with pytest.raises(persist.InvalidUsage, match="native path cannot take it"):
        operators.write(df.selectExpr("key", "value", "time + 3 as time", "diff"), url, "c",
                        native=True)
    with pytest.raises(persist.InvalidUsage, match="with a token needs the native path"):
        operators.write(df.selectExpr("key", "value", "time + 3 as time", "diff"), url, "c",
                        token=("t", 1))
    assert _upper(url) == 3  # neither refused write changed anything


@pytest.mark.parametrize(("time_expr", "match"), [
    ("case when id = 7 then null else id % 3 + 6 end", "null time"),
    ("id % 3 - 1", "time -1"),
])
def test_bad_rows_are_refused_and_nothing_is_left(spark: Any, tmp_path: Path, time_expr: str,
                                                  match: str) -> None:
    url = location(tmp_path)
    operators.write(_rows(spark, 1000), url, "c")
    before = _files(url)
    df = spark.range(0, 20_000, numPartitions=2).selectExpr(
        "id % 50 as key", "cast(id as string) as value", f"{time_expr} as time", "1L as diff")
    with pytest.raises(persist.InvalidUsage, match=match):
        operators.write(df, url, "c")
    assert _upper(url) == 6
    assert _files(url) == before  # the refused write's staged files were deleted


def _driver(dst: str, rows: int, crash: str | None,
            storage_options: str | None = None) -> subprocess.Popen[str]:
    """The kill test's driver process (tests/spark/native_write_driver.py) writing to ``dst``
    (``storage_options``: JSON, for an ``s3://`` location), crashing at ``crash``."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PERSIST_CRASH_AT", None)
    if crash is not None:
        env["PERSIST_CRASH_AT"] = crash
    args = [dst, str(rows)] + ([storage_options] if storage_options is not None else [])
    return subprocess.Popen([sys.executable, "-m", "tests.spark.native_write_driver", *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_driver_killed_between_staging_and_commit_lands_nothing_and_leaks_nothing(
        tmp_path: Path) -> None:
    url = location(tmp_path)
    root = tmp_path / "loc"
    killed = _driver(url, 50_000, "adopt.adopted")
    try:
        _, err = killed.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)  # its JVM, if it outlived the driver
    assert killed.returncode == -signal.SIGKILL, err[-3000:]
    staged = _files(url)
    assert staged, "the killed driver staged nothing"
    assert _upper(url) == 0  # nothing landed
    # the staged files sit under the job's live lease: a sweep leaves them alone
    blob = FileBlob(root)
    with persist.open(url, read_only=True) as client:
        state = client.state
    (lid,) = {_lease(k) for k in blob.list_keys("data/")}
    sweeper = gc.LeakSweeper(grace_seconds=5.0, lease_skew_seconds=0.05)
    now = time.monotonic()
    assert sweeper.sweep(blob, lambda: state, now) == []
    assert sweeper.sweep(blob, lambda: state, now + 3600) == []
    assert _files(url) == staged
    # once the lease is gone (revoked, as the sweep does once it lapses), every file goes
    lease.revoke(blob, lid)
    sweeper.sweep(blob, lambda: state, now + 7200)
    sweeper.sweep(blob, lambda: state, now + 10_800)
    assert _files(url) == []
    # the job run again with its token lands once
    again = _driver(url, 50_000, None)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert out.split() == ["done", "True", "50000"]
    assert _upper(url) == 5
    assert len(expected_updates(url, "c", 0, 5)) == 50_000


def _lease(key: str) -> str:
    from persist.layout import lease_of

    lid = lease_of(key)
    assert lid is not None, key
    return lid


def test_a_stream_writes_natively_in_foreach_batch_once_per_batch(spark: Any,
                                                                  tmp_path: Path) -> None:
    src, dst, ckpt = location(tmp_path, "src"), location(tmp_path, "dst"), tmp_path / "ckpt"
    fill(src, "events", range(6))
    landed: list[bool] = []

    def handle(batch: Any, batch_id: int) -> None:
        # a replayed micro-batch (here: the same batch written twice) lands once by its token
        for _ in range(2):
            landed.append(operators.write(batch, dst, "copy", token=("copy", batch_id)).landed)

    q = (spark.readStream.format("persist").option("collection", "events")
         .option("maxRowsPerTrigger", 80).load(src)
         .writeStream.foreachBatch(handle).option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    q.awaitTermination(PATIENCE)
    assert q.exception() is None
    assert len(landed) >= 4
    assert landed[0::2] == [True] * (len(landed) // 2)
    assert landed[1::2] == [False] * (len(landed) // 2)
    assert canon(expected_updates(dst, "copy", 0, 6)) == canon(expected_updates(src, "events",
                                                                                 0, 6))
    assert _upper(dst, "copy") == 6


def test_persist_table_write_is_the_same_call_either_way(spark: Any, tmp_path: Path) -> None:
    url, ref = location(tmp_path, "a"), location(tmp_path, "b")
    longs = _rows(spark, 20_000)
    doubles = spark.range(0, 5000, numPartitions=2).selectExpr(
        "id % 50 as key", "cast(id as double) as value", "id % 3 as time", "1L as diff")
    for name, df in (("longs", longs), ("doubles", doubles)):
        operators.write(df.where("time < 2"), url, name)
        df.where("time < 2").write.format("persist").mode("append").option("collection",
                                                                       name).save(ref)
    table = operators.PersistTable.forPath(spark, url, "longs")
    native = table.write(longs.where("time >= 2"), token=("t", 1))
    assert native.native
    assert native.landed
    assert not table.write(longs.where("time >= 2"), token=("t", 1)).landed  # once
    sink = operators.PersistTable.forPath(spark, url, "doubles").write(doubles.where("time >= 2"))
    assert not sink.native
    assert "double" in (sink.why or "")
    for name, df, hi in (("longs", longs, 6), ("doubles", doubles, 3)):
        df.where("time >= 2").write.format("persist").mode("append").option("collection",
                                                                        name).save(ref)
        assert canon(expected_updates(url, name, 0, hi)) == canon(expected_updates(ref, name,
                                                                                   0, hi))
        assert _upper(url, name) == hi
    with pytest.raises(persist.InvalidUsage, match="native path cannot take it"):
        operators.PersistTable.forPath(spark, url, "doubles").write(doubles, native=True)


def _parts(url: str) -> list[Any]:
    """The blob parts of collection ``c`` (the inline ones carry no order)."""
    with persist.open(url, read_only=True) as client:
        return [p for p in client._ix.state.collections["c"].parts if p.blob_key is not None]


def _clean(url: str) -> None:
    """``persist verify`` finds nothing wrong (it sorts every part recorded sorted and checks
    its rows are in that order)."""
    report = verify(FileBlob(Path(url.removeprefix("file://"))).read_only(), url=url)
    assert report.problems == []


def _consolidated(spark: Any, url: str) -> list[tuple[Any, ...]]:
    """Every path's consolidated read of ``c`` at its latest time, checked to agree: the
    client's, the native read's (persist's merge of sorted runs) and the Python source's."""
    native = sorted(map(tuple, operators.PersistTable.forPath(spark, url, "c").toDF()
                        .select("key", "value", "diff").collect()), key=repr)
    source = sorted(map(tuple, spark.read.format("persist").option("collection", "c").load(url)
                        .select("key", "value", "diff").collect()), key=repr)
    exact = sorted(((k, v, d) for (k, v), d in sums(expected_updates(url, "c", 0, _upper(url)))
                    .items()), key=repr)
    assert native == source == exact
    return exact


def test_unique_keys_sorted_by_key_alone_are_recorded_sorted(spark: Any, tmp_path: Path) -> None:
    """Spark sorts by the key alone (the default): with one row per key in each partition the
    files are in the full order, checked at adoption and recorded sorted."""
    url = location(tmp_path)
    df = spark.range(0, 120_000, numPartitions=3).selectExpr(
        "(id * 7919) % 1000003 as key",  # unique, not in order
        "case when id % 5 = 0 then null else cast(id % 89 as string) end as value",
        "id % 4 as time", "case when id % 7 = 0 then -1L else 1L end as diff")
    assert operators.write(df, url, "c").native
    parts = _parts(url)
    assert parts
    assert all(p.sorted is True for p in parts)
    _clean(url)
    assert canon(expected_updates(url, "c", 0, 4)) == canon(df.toArrow())
    assert len(_consolidated(spark, url)) == 120_000


@pytest.mark.parametrize("sort", [True, "key"])
def test_keys_sorted_with_values_out_of_order_are_not_recorded_sorted_and_read_exactly(
        spark: Any, tmp_path: Path, sort: Any) -> None:
    """Many rows per key, sorted by the key alone: the values within a key stay in the
    input's order, which is not persist's, so no order is recorded; every read path (the
    client, the native consolidated read, the Python source, compaction) is exact all the
    same, and a three-column sort of the same rows is recorded sorted."""
    url, full = location(tmp_path, "key"), location(tmp_path, "full")
    df = _rows(spark)
    assert operators.write(df, url, "c", sort=sort).native
    parts = _parts(url)
    assert parts
    assert all(p.sorted is msgspec.UNSET for p in parts)
    _clean(url)
    assert canon(expected_updates(url, "c", 0, 6)) == canon(df.toArrow())
    want = _consolidated(spark, url)
    assert want
    assert operators.write(df, full, "c", sort="full").native
    assert all(p.sorted is True for p in _parts(full))
    _clean(full)
    assert _consolidated(spark, full) == want
    # Spark's distributed compaction of the unordered parts is exact too
    opt = location(tmp_path, "opt")
    assert operators.write(df, opt, "c", sort=sort).native
    assert all(p.sorted is msgspec.UNSET for p in _parts(opt))
    with persist.open(opt) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.string())
        w.allow_compaction(5).result()
    table = operators.PersistTable.forPath(spark, opt, "c")
    assert table.optimize(partitions=3) is not None
    assert all(p.ordered for p in _parts(opt))
    _clean(opt)
    for got in (table.toDF(), spark.read.format("persist").option("collection", "c").load(opt)):
        assert sorted(map(tuple, got.select("key", "value", "diff").collect()), key=repr) == want
    with persist.open(url) as client:  # rewrites (and sorts) the unordered parts
        compact(client)
    assert all(p.ordered for p in _parts(url))  # compaction sorted what it rewrote
    _clean(url)
    assert _consolidated(spark, url) == want


def test_a_bad_sort_is_refused_before_anything_is_written(spark: Any, tmp_path: Path) -> None:
    url = location(tmp_path)
    with pytest.raises(persist.InvalidUsage, match="sort must be"):
        operators.write(_rows(spark, 100), url, "c", sort="value")  # type: ignore[arg-type]
    assert not Path(url.removeprefix("file://")).exists()
