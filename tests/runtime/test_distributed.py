"""The engine's API for distributed readers and writers (``persist.distributed``): plans made
on one process, tasks and staged parts serialized, read and staged in other processes, one
atomic commit with an idempotency token."""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist
from persist import InvalidUsage, MissingResource, SchemaMismatch, UnknownCollection, distributed
from persist.indexed.format.stats import STATS_BYTES


def _sums(tables: list[pa.Table]) -> Counter[tuple[Any, Any]]:
    out: Counter[tuple[Any, Any]] = Counter()
    for t in tables:
        for k, v, d in zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                           t.column("diff").to_pylist(), strict=True):
            out[(k, v)] += d
    return +out


def _fill(url: str) -> dict[tuple[Any, Any], int]:
    """Five sealed times of updates to ``c`` (string -> int64), some retracted; returns the
    contents as of time 4."""
    with persist.open(url) as client:
        w, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        for t in range(5):
            rows = [((f"k{i}", i % 7), t, 1) for i in range(t * 300, t * 300 + 500)]
            if t:
                rows += [((f"k{i}", i % 7), t, -1) for i in range(t * 300 - 300, t * 300 - 200)]
            w.append(rows, upper=t + 1).result()
        want = r.snapshot(4).to_arrow()
    return dict(_sums([want]))


def _read_encoded(data: bytes) -> list[pa.Table]:
    """Another process's side: a task from its bytes, read there."""
    return list(distributed.read_task(distributed.ReadTask.from_bytes(data)))


def _stage_in_child(stager_bytes: bytes, rows: list[tuple[tuple[str, int], int, int]]) -> bytes:
    stager: distributed.Stager = pickle.loads(stager_bytes)
    return pickle.dumps(stager.stage(rows))


@pytest.fixture
def pool() -> Any:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as p:
        yield p


def test_consolidated_tasks_read_in_other_processes_are_the_snapshot(
        tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}/loc"
    want = _fill(url)
    info = distributed.describe(url, "c")
    assert (info.upper, info.since, info.schema_version) == (5, 0, 0)
    scan = info.snapshot(4)
    tasks = scan.tasks(consolidated=True, n=3)
    # NB: as many key ranges as keep the decoding within 1.5x the bytes stored (these
    # appends overlap in key): at most 3, at least one
    assert [t.bucket for t in tasks] == list(range(len(tasks)))
    assert 1 <= len(tasks) <= 3
    outs = list(pool.map(_read_encoded, [t.to_bytes() for t in tasks]))
    keys = [set(_sums(o)) for o in outs]
    for i, j in itertools.combinations(range(len(keys)), 2):
        assert not keys[i] & keys[j]
    assert _sums([t for o in outs for t in o]) == want
    for o in outs:  # consolidated: every (key, value) once, at the as-of time
        for t in o:
            assert set(t.column("time").to_pylist()) <= {4}
    # raw tasks, grouped small: their sum is the snapshot too
    raw = scan.tasks(rows_per_task=600)
    assert len(raw) >= 1
    assert _sums([t for task in raw for t in distributed.read_task(task)]) == want


def test_sorted_parts_split_into_key_ranges_that_decode_only_their_share(
        tmp_path: Path) -> None:
    """Compaction output is sorted and cut into key-disjoint parts: consolidated tasks then get
    disjoint key ranges, each with only the parts that may hold its keys."""
    url = f"file://{tmp_path}/loc"
    policy = persist.Options().compaction
    # NB: no background compaction: maintain() below does every merge, so the parts are all
    # compaction output when it returns False (a background merge could still be running).
    # NB: no inline parts either (inline_threshold pinned): an inline remainder is read by
    # every range, and with parts this small (1.7 KB of sorted, delta-packed integers) it
    # would be most of the bytes, which the decode bound then reads once (one task)
    options = persist.Options(background_compaction=False, inline_threshold=0,
                              compaction=type(policy)(fanin=2, final_rows=1 << 30,
                                                      part_target_bytes=64 << 10))
    with persist.open(url, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(4):
            keys = list(range(t, 40_000, 4))
            w.append(pa.table({"key": keys, "value": [k % 5 for k in keys],
                               "time": [t] * len(keys), "diff": [1] * len(keys)}),
                     upper=t + 1).result()
        w.allow_compaction(3).result()
        while client.maintain():
            pass
        want = _sums([r.snapshot(3).to_arrow()])
    info = distributed.describe(url, "c")
    assert all(p.consolidated for p in info.meta.parts)
    tasks = info.snapshot(3).tasks(consolidated=True, n=4)
    assert all(t.key_range is not None for t in tasks)
    assert all(len(t.parts) < len(info.meta.parts) for t in tasks)
    outs = [_sums(list(distributed.read_task(distributed.ReadTask.from_bytes(t.to_bytes()))))
            for t in tasks]
    assert sum(len(o) for o in outs) == len(want) == 40_000
    assert sum(outs, Counter()) == want


def test_parts_are_handles_read_anywhere_with_filters_and_columns(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    want = _fill(url)
    scan = distributed.describe(url, "c").snapshot()
    assert scan.as_of == 4
    assert sum(h.rows for h in scan.parts) == scan.rows > 0
    handles = [distributed.PartHandle.from_bytes(h.to_bytes()) for h in scan.parts]
    assert handles == list(scan.parts)
    assert _sums([distributed.read_part(h) for h in handles]) == want
    f = persist.col("value") == 3
    got = _sums([distributed.read_part(h, filter=f) for h in handles])
    assert got == {kv: d for kv, d in want.items() if kv[1] == 3}
    t = distributed.read_part(handles[0], columns=["key", "diff"])
    assert t.column_names == ["key", "diff"]
    with pytest.raises(InvalidUsage, match="unknown columns"):
        distributed.read_part(handles[0], columns=["nope"])
    with pytest.raises(persist.Corruption, match="truncated"):
        distributed.PartHandle.from_bytes(b"\x01junk")


def test_a_change_range_is_exact_or_refused(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    _fill(url)
    info = distributed.describe(url, "c")
    tasks = info.changes(2, 4).tasks()
    got = [t for task in tasks for t in distributed.read_task(task)]
    assert {x for t in got for x in t.column("time").to_pylist()} == {2, 3}
    with persist.open(url, read_only=True) as client:
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert _sums(got) == +(Counter(dict(_sums([r.snapshot(3).to_arrow()])))
                               - Counter(dict(_sums([r.snapshot(1).to_arrow()]))))
    with pytest.raises(InvalidUsage, match="not sealed yet"):
        info.changes(2, 9)
    with pytest.raises(InvalidUsage, match="read raw"):
        info.changes(2, 4).tasks(consolidated=True)
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(3).result()
    with pytest.raises(InvalidUsage, match="no longer exact"):
        distributed.describe(url, "c").changes(2, 4)
    with pytest.raises(InvalidUsage, match=r"outside|since"):
        distributed.describe(url, "c").snapshot(1)


def test_every_range_of_changes_is_exact_or_refused_from_zero_too(tmp_path: Path) -> None:
    """Every range ``[lo, hi)`` of changes is either refused or sums, per (key, value), to
    exactly the updates written at times in it, once compaction forwarded all history below
    since. From ``lo == 0`` the range is exact only while ``since < hi``: the history forwarded
    to since then lies inside it, and outside it otherwise. (The listener's old range read took
    every range from 0 as exact, while the distributed planner refused it: with since at 6, it
    read ``[0, 3)`` as empty, everything written at 0, 1 and 2 having moved to time 6.)"""
    url = f"file://{tmp_path}/loc"
    since, upper = 6, 10
    # NB: every part inline and flushed into one blob by the first merge, so every time below
    # since is forwarded (what makes a wrongly accepted range read wrong, not merely lucky).
    opts = persist.Options(background_compaction=False, inline_threshold=1 << 20,
                           compaction=persist.CompactionPolicy(fanin=1 << 30, inline_flush_bytes=1,
                                                       final_rows=1 << 30))
    written: list[tuple[str, int, int, int]] = []
    with persist.open(url, options=opts) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        for t in range(upper):
            rows = [(f"k{(t + i) % 4}", i, t, 1 if (t + i) % 3 else -1) for i in range(5)]
            written += rows
            w.append([((k, v), tt, d) for k, v, tt, d in rows], upper=t + 1).result()
        w.allow_compaction(since).result()
        client.maintain()
        parts = client.state.collections["c"].parts
        assert min(p.min_time for p in parts) == since  # all history forwarded to since
        info = client.info("c")

    def read(scan: distributed.Scan) -> Counter[tuple[Any, Any]]:
        return _sums([t for task in scan.tasks() for t in distributed.read_task(task)])

    accepted = set()
    for lo in range(upper):
        for hi in range(lo + 1, upper + 1):
            want: Counter[tuple[Any, Any]] = Counter()
            for k, v, t, d in written:
                if lo <= t < hi:
                    want[(k, v)] += d
            exact = since < hi if lo == 0 else lo - 1 >= since
            assert info.exact(lo, hi) == exact
            if not exact:
                with pytest.raises(InvalidUsage, match="no longer exact"):
                    info.changes(lo, hi)
                if lo == 0:  # what taking it as exact read: nothing, all of it moved to since
                    assert +want
                    assert read(info.changes(lo, hi, held=True)) == Counter()
                continue
            accepted.add((lo, hi))
            assert read(info.changes(lo, hi)) == +want, (lo, hi)
    assert accepted == {(0, hi) for hi in range(since + 1, upper + 1)} | {
        (lo, hi) for lo in range(since + 1, upper) for hi in range(lo + 1, upper + 1)}


def test_bad_inputs_are_typed_errors(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    with pytest.raises(MissingResource, match="no persist location"):
        distributed.describe(url, "c")
    _fill(url)
    with pytest.raises(UnknownCollection):
        distributed.describe(url, "nope")
    info = distributed.describe(url, "c")
    with pytest.raises(SchemaMismatch):
        info.snapshot(filter=persist.col("value.x") == 1)
    with pytest.raises(InvalidUsage, match="n must be"):
        info.snapshot().tasks(n=0)
    with pytest.raises(InvalidUsage, match="token id"):
        distributed.Token("", 1)
    with pytest.raises(InvalidUsage, match="token seq"):
        distributed.Token("a", -1)


def test_staged_anywhere_commits_once_per_token(tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}/loc"
    with persist.open(url) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
    stager = distributed.Stager.start(url, "c", job="test")
    rows = [[((f"k{i}", j), 0, 1) for i in range(j * 2000, j * 2000 + 2000)] for j in range(3)]
    staged = [pickle.loads(b) for b in pool.map(_stage_in_child,
                                                 [pickle.dumps(stager)] * 3, rows)]
    assert all(isinstance(s, distributed.StagedPart) for s in staged)
    with persist.open(url, reentrance_id="loader") as client:
        seq = client.info("c").seq
        done = client.apply(parts={"c": staged}, seals={"c": 1},
                            token=distributed.Token("load", 1)).result()
        assert done is not None
        assert client.token("load") == 1
        assert client.token("other") is None
        assert client.landed(seq, staged)
        # a replay of the same token writes nothing, and says so
        again = stager.stage([(("late", 1), 1, 1)])
        assert client.apply(parts={"c": [again]}, seals={"c": 2},
                            token=distributed.Token("load", 1)).result() is None
        assert client.info("c").upper == 1
        stager.discard([again])
        assert not client.landed(seq + 1, [again])
        with pytest.raises(InvalidUsage, match="staged for 'c'"):
            client.apply(parts={"d": staged})
        with pytest.raises(InvalidUsage, match="records tokens"):
            client.apply(writes={"__sink_progress": []}, token=distributed.Token("x", 1))
        # the next seq lands, and the token keeps one row per id
        more = stager.stage([(("late", 1), 1, 1)])
        assert client.apply(parts={"c": [more]}, seals={"c": 2},
                            token=distributed.Token("load", 2)).result() is not None
        assert client.token("load") == 2
        _, r = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        assert len(r.snapshot(1).to_arrow()) == 6001
    stager.release([*staged, more])
    blobs = {p.name for p in (tmp_path / "loc" / "data").rglob("*") if p.is_file()}
    assert not any(again.part.id in b for b in blobs)  # the discarded replay is gone


def test_read_holds_and_watch(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    _fill(url)
    watch = distributed.Watch(url, "c", interval=3600)
    first = watch.current()
    assert distributed.set_read_hold(url, "c", "stream", 2, lock_timeout=5)
    assert watch.current() is first  # cached until the interval passes
    now = watch.current(fresh=True)
    assert now.holds == {"stream": 2}
    assert now.seq > first.seq
    assert watch.rows_per_time(now, 1, 3) == Counter({1: 600, 2: 600})
    assert distributed.set_read_hold(url, "c", "stream", None, lock_timeout=5)
    assert watch.current(fresh=True).holds == {}
    # the thin alias of ConsumerHold: a hold with a century's lease, released idempotently;
    # a frontier below since is refused (False), changing nothing
    assert distributed.set_read_hold(url, "c", "stream", None, lock_timeout=5)
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.allow_compaction(3).result()
        assert not distributed.set_read_hold(url, "c", "stream", 1, lock_timeout=5)
        # with a writer running, the request goes to it (no lock needed)
        assert distributed.set_read_hold(url, "c", "stream", 4, lock_timeout=5)
        have = client.info("c").hold("stream")
        assert have is not None
        assert (have.frontier, have.lease_seconds) == (4, 36525 * 86400.0)


def test_raw_tasks_are_balanced_by_cutting_parts_between_record_batches(
        tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    # NB: pins what the test is about, whatever the knob set: three blob parts (a 10,000-row
    # part is about 29 KB, under the default 64 KiB inline threshold, and an inline part is
    # never cut) of ten 1,000-row record batches each, whose per-batch row counts the stats
    # keep (the cut points), left unmerged by compaction.
    options = persist.Options(batch_rows=1000, inline_threshold=0, background_compaction=False,
                              stats_bytes=STATS_BYTES)
    with persist.open(url, options=options) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(3):
            keys = list(range(t * 10_000, t * 10_000 + 10_000))
            w.append(pa.table({"key": keys, "value": keys, "time": [t] * 10_000,
                               "diff": [1] * 10_000}), upper=t + 1).result()
        want = _sums([r.snapshot(2).to_arrow()])
    scan = distributed.describe(url, "c").snapshot(2)
    assert [p.blob_key is not None for p in scan.kept] == [True] * 3  # blobs, not inline
    tasks = scan.tasks(rows_per_task=15_000)
    assert len(tasks) == 2
    assert any(t.slices for t in tasks)  # the middle part is cut between its batches
    outs = [[t for t in distributed.read_task(distributed.ReadTask.from_bytes(task.to_bytes()))]
            for task in tasks]
    assert [sum(len(t) for t in o) for o in outs] == [15_000, 15_000]
    assert _sums([t for o in outs for t in o]) == want
    # a range of changes is cut the same way
    changes = distributed.describe(url, "c").changes(1, 3).tasks(rows_per_task=7_000)
    got = [t for task in changes for t in distributed.read_task(task)]
    assert len(changes) == 3
    assert sum(len(t) for t in got) == 20_000


def test_a_revoked_staging_lease_is_replaced_or_refused_never_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from persist import layout
    from persist.distributed import stage
    from persist.indexed.state import lease

    url = f"file://{tmp_path}/loc"
    with persist.open(url) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
    stager = distributed.Stager.start(url, "c", job="test", inline_bytes=0)
    blob = persist.location.resolve(url).blob
    lease.revoke(blob, stager.lease_id)
    # renewed moments ago in this process: staging skips the renewal, so the part is staged
    # under the revoked lease, and the commit refuses it (definitely nothing lands)
    early = stager.stage([(("a", 1), 0, 1)])
    assert layout.lease_of(early.part.blob_key or "") == stager.lease_id
    with persist.open(url) as client:
        with pytest.raises(persist.LeaseRevoked):
            client.apply(parts={"c": [early]}, seals={"c": 1}).result()
        assert client.info("c").upper == 0
    # past the renewal interval, staging notices the revocation and takes a lease of its own
    monkeypatch.setattr(stage, "RENEW_EVERY_SECONDS", 0.0)
    late = stager.stage([(("a", 1), 0, 1)])
    own = layout.lease_of(late.part.blob_key or "")
    assert own is not None
    assert own != stager.lease_id
    with persist.open(url) as client:
        assert client.apply(parts={"c": [late]}, seals={"c": 1}).result() is not None
    stager.release([late])
    assert lease.read(blob, own) is None


def test_a_stager_refuses_rows_below_the_upper_it_started_at(tmp_path: Path) -> None:
    # issue 21 #11: such rows can never commit (upper never moves back), so the task that
    # stages them fails at once, storing nothing, instead of the commit after the whole job
    url = f"file://{tmp_path}/loc"
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.seal(5).result()
    stager = distributed.Stager.start(url, "c", job="test", inline_bytes=0)
    blob = persist.location.resolve(url).blob
    before = blob.list_keys("data/")
    with pytest.raises(persist.InvalidUsage, match="time 4 is below its upper 5"):
        stager.stage([(("a", 1), 5, 1), (("b", 1), 4, 1)])
    with pytest.raises(persist.InvalidUsage, match="below its upper 5"):
        stager.stage(pa.table({"key": ["a"], "value": [1], "time": [0], "diff": [1]}))
    assert blob.list_keys("data/") == before
    assert stager.stage([(("a", 1), 5, 1)], at=7).max_time == 7


# -- reads shared with another engine's Parquet reader (persist.distributed.native) ----------


def test_parquet_files_and_consolidate_give_the_snapshot(tmp_path: Path) -> None:
    """The files another reader reads (here pyarrow, as a stand-in for Spark) plus the other
    parts, consolidated per key range by ``consolidate``, are the snapshot; raw, the files plus
    the other scan are every update."""
    import pyarrow.parquet as pq

    url = str(tmp_path)
    with persist.open(url, options=persist.Options(inline_threshold=0, batch_rows=100,
                                                   background_compaction=False)) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(4):
            w.append([((k * 7 % 1000, t % 2), t, 1 if k % 5 else -1) for k in range(t, 1000, 3)],
                     upper=t + 1).result()
        client.set_options(persist.Options(inline_threshold=1 << 20, batch_rows=100,
                                           background_compaction=False))
        w.append([((5, 0), 4, 1), ((3, 1), 4, -1)], upper=5).result()  # inline
        want = _sums([r.snapshot(3).to_arrow()])
    scan = distributed.describe(url, "c").snapshot(3)
    urls, rest = distributed.parquet_files(scan)
    assert len(urls) == 4
    assert not rest.kept  # the inline part is after as_of 3

    def files(us: tuple[str, ...]) -> pa.Table:
        return pa.concat_tables([pq.read_table(u.removeprefix("file://")) for u in us]) \
            if us else distributed.describe(url, "c").schema().empty_table()

    got = []
    tasks = scan.tasks(consolidated=True, n=4)
    assert len(tasks) > 1
    for task in tasks:
        task_urls, other = distributed.parquet_task(task)
        # the reader's rows unfiltered: consolidate cuts the range and the as-of time
        got.append(distributed.consolidate(other, files(task_urls)))
    assert _sums(got) == want
    # raw as of 4: the files and the other scan's tasks hold every update once
    scan4 = distributed.describe(url, "c").snapshot(4)
    urls4, rest4 = distributed.parquet_files(scan4)
    assert len(rest4.kept) == 1
    others = [t for task in rest4.tasks() for t in distributed.read_task(task)]
    assert sum(len(t) for t in [files(urls4), *others]) == scan4.rows == 1335
    with pytest.raises(InvalidUsage):
        distributed.parquet_files(distributed.describe(url, "c").changes(0, 2))
    with pytest.raises(InvalidUsage):
        distributed.parquet_task(scan.task())  # not consolidated
    with pytest.raises(InvalidUsage):
        distributed.consolidate(scan.task(), files(urls))
    with pytest.raises(SchemaMismatch):
        distributed.consolidate(tasks[0], pa.table({"key": ["x"], "value": [1], "time": [0],
                                                   "diff": [1]}))


def test_files_are_handed_out_only_with_a_verified_tail(tmp_path: Path) -> None:
    """``parquet_files`` and ``parquet_task`` check each file's tail (the footer and page index
    another reader trusts to skip rows) first: a damaged one is ``ChecksumMismatch`` naming the
    part, a part that recorded no tail is left to persist's reader."""
    import dataclasses

    import msgspec

    from persist.indexed.read import tail

    url = str(tmp_path)
    with persist.open(url, options=persist.Options(inline_threshold=0, batch_rows=100,
                                                   background_compaction=False)) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(2):
            w.append([((k, t), t, 1) for k in range(t, 600, 2)], upper=t + 1).result()
    scan = distributed.describe(url, "c").snapshot(1)
    assert len(distributed.parquet_files(scan)[0]) == 2
    (task,) = scan.tasks(consolidated=True, n=1)
    assert len(distributed.parquet_task(task)[0]) == 2
    # a part written before tails were recorded: persist reads it
    first, second = scan.kept
    assert not isinstance(first.stats, msgspec.UnsetType)
    old = msgspec.structs.replace(first, stats=msgspec.structs.replace(first.stats, tail=None))
    urls, rest = distributed.parquet_files(dataclasses.replace(scan, kept=(old, second)))
    assert len(urls) == 1
    assert rest.kept == (old,)
    # a flipped bit in a footer: refused before any other reader sees the file
    assert first.blob_key is not None
    path = tmp_path / first.blob_key
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x04
    path.write_bytes(bytes(data))
    tail.forget()
    with pytest.raises(persist.ChecksumMismatch, match=f"part {first.id}"):
        distributed.parquet_files(scan)
    with pytest.raises(persist.ChecksumMismatch, match=f"part {first.id}"):
        distributed.parquet_task(task)
    path.unlink()
    with pytest.raises(persist.PartMissing, match=first.id):
        distributed.parquet_files(scan)
