"""A writer's big merges run in its merge worker process (persist.indexed.maintenance.offload):
the same output as an in-process merge, the same errors (typed), a killed worker is a merge
that did not happen (the next one starts a fresh worker), appends commit while it merges,
and closing the client ends the worker. Real processes throughout."""

from __future__ import annotations

import array
import fcntl
import os
import signal
import termios
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persist
from persist import layout
from persist.errors import DiffOverflow, MergeWorkerLost
from persist.indexed.format import evolve
from persist.indexed.format.meta import PartMeta, ReplaceParts
from persist.indexed.maintenance import compact, gc
from persist.indexed.state.holds import effective_since

ROWS = 100_000


def _policy() -> persist.CompactionPolicy:
    # NB: pinned: the default merging, output cut into ~1 MiB parts (several per merge), and
    # the whole maintenance time allowed for big merges (the knob sets vary all of these).
    return persist.CompactionPolicy(fanin=4, final_rows=1 << 19, base_ratio=4, max_runs=64,
                                    inline_flush_bytes=1 << 20, part_target_bytes=1 << 20,
                                    rewrite_share=1.0)


def _options(worker_rows: int | None = 0, **kw: Any) -> persist.Options:
    # NB: pinned: explicit maintenance only (each test says when a merge runs), blob parts
    # with batches and stats of the default sizes, every merge in the worker (rows >= 0).
    return persist.Options(background_compaction=False, inline_threshold=64 << 10,
                           batch_rows=1 << 16, stats_bytes=1024, merge_worker_rows=worker_rows,
                           compaction=_policy(), **kw)


def _table(seed: int, t: int, n: int = ROWS) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 1 << 20, n)  # collisions: the merge consolidates
    return pa.table({"key": pa.array(keys), "value": pa.array(keys % 7),
                     "time": pa.array(np.full(n, t), pa.uint64()),
                     "diff": pa.array(rng.choice([-1, 1, 2], n).astype(np.int64))})


def _load(client: persist.Client, appends: int = 4) -> tuple[Any, Any]:
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    for t in range(appends):
        w.append(_table(t, t), upper=t + 1).result()
    w.allow_compaction(appends - 1).result()
    return w, r


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("key", "ascending"), ("value", "ascending"), ("time", "ascending")])


def _want(appends: int) -> pa.Table:
    rows: dict[tuple[int, int], int] = {}
    for t in range(appends):
        tab = _table(t, t)
        for k, v, d in zip(tab["key"].to_pylist(), tab["value"].to_pylist(),
                           tab["diff"].to_pylist(), strict=True):
            rows[(k, v)] = rows.get((k, v), 0) + d
    items = sorted((k, v, d) for (k, v), d in rows.items() if d)
    return pa.table({"key": pa.array([k for k, _, _ in items], pa.int64()),
                     "value": pa.array([v for _, v, _ in items], pa.int64()),
                     "diff": pa.array([d for _, _, d in items], pa.int64())})


def _consolidated(r: Any, as_of: int) -> pa.Table:
    got = r.snapshot(as_of).to_arrow()
    return pa.table({n: got[n] for n in ("key", "value", "diff")}).sort_by(
        [("key", "ascending"), ("value", "ascending")])


def _shape(p: PartMeta) -> tuple[Any, ...]:
    """What a merge decides about a part (not its id, key or bytes)."""
    return (p.rows, p.min_time, p.max_time, p.consolidated, p.full, p.inline is None,
            compact.key_bounds(p))


def _rows(client: persist.Client, op: ReplaceParts) -> list[pa.Table]:
    ix = client._ix
    c = client.state.collections["c"]
    view = evolve.View.of(c)
    return [_sorted(view.read(ix.reader, p)) for p in op.added]


def _merge_both(client: persist.Client) -> tuple[ReplaceParts, ReplaceParts]:
    """The planned merge of ``c``, run by the worker and in-process (neither committed)."""
    ix = client._ix
    state = client.state
    [(name, parts)] = ix.plan_compaction(state)
    frontier = effective_since(state.collections[name])
    in_worker = ix.run_compaction(state, name, parts, frontier)
    started = ix.merger.started
    client.set_options(_options(worker_rows=None))
    here = ix.run_compaction(state, name, parts, frontier)
    assert ix.merger.started == started  # the second one did not use the worker
    return in_worker, here


def _in_base(client: persist.Client) -> bool:
    c = client.state.collections["c"]
    base, runs = compact.layout(c, effective_since(c))
    return bool(base) and not any(p.max_time <= effective_since(c) for p in runs)


def _data_keys(client: persist.Client) -> set[str]:
    return set(client._ix.blob.list_keys(layout.DATA_PREFIX))


def _unreferenced(client: persist.Client) -> set[str]:
    return _data_keys(client) - gc.referenced(client.state)


@pytest.mark.parametrize("into_base", [True, False], ids=["base-merge", "run-merge"])
def test_the_worker_merges_exactly_what_an_in_process_merge_does(
        tmp_path: Path, into_base: bool) -> None:
    with persist.open(tmp_path, options=_options()) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(4):
            w.append(_table(t, t), upper=t + 1).result()
        if into_base:
            w.allow_compaction(3).result()
        in_worker, here = _merge_both(client)
        assert client._ix.merger.pid is not None  # the first went to the worker
        assert in_worker.removed == here.removed
        assert in_worker.frontier == here.frontier
        assert len(in_worker.added) > 1  # cut by size
        assert [_shape(p) for p in in_worker.added] == [_shape(p) for p in here.added]
        c = client.state.collections["c"]
        assert compact.into_base(c, tuple(p for p in c.parts)) == into_base
        for a, b in zip(_rows(client, in_worker), _rows(client, here), strict=True):
            assert a.equals(b)
        # the worker's op commits like any other
        client._runtime._commit_maintenance((in_worker,), None)
        client._ix._discard(here)
        assert _unreferenced(client) == set()
        assert _consolidated(r, 3).equals(_want(4))


def test_a_diff_overflow_in_the_worker_is_a_diff_overflow(tmp_path: Path) -> None:
    big = 2**62
    opts = persist.Options(background_compaction=False, inline_threshold=0,
                           merge_worker_rows=0,
                           compaction=persist.CompactionPolicy(fanin=2, inline_flush_bytes=1))
    with persist.open(tmp_path, options=opts) as client:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append([((1, 1), 0, big), ((2, 2), 0, 1)], upper=1).result()
        w.append([((1, 1), 1, big), ((2, 2), 1, 1)], upper=2).result()
        w.allow_compaction(1).result()
        before = client.state.collections["c"].parts
        with pytest.raises(DiffOverflow, match="outside int64") as e:
            client.maintain()
        assert client._ix.merger.pid is not None  # it was the worker's merge
        assert client.state.collections["c"].parts == before
        assert _unreferenced(client) == set()  # it wrote nothing
        client.set_options(persist.Options(
            background_compaction=False, inline_threshold=0, merge_worker_rows=None,
            compaction=persist.CompactionPolicy(fanin=2, inline_flush_bytes=1)))
        client._ix._overflowed.clear()  # plan the refused merge again, in-process
        with pytest.raises(DiffOverflow) as here:
            client.maintain()
        assert str(e.value) == str(here.value)
        scan = persist.distributed.describe(str(tmp_path), "c").snapshot(1)
        raw = pa.concat_tables(t for task in scan.tasks()
                               for t in persist.distributed.read_task(task))
        assert sorted(raw["diff"].to_pylist()) == [1, 1, big, big]  # raw rows are intact
        assert client._runtime.poisoned is None


def test_a_worker_killed_mid_merge_is_a_merge_that_did_not_happen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # NB: the worker kills itself (SIGKILL) when it has written its second blob: a kill -9
    # mid-merge, after some of its parts were written
    monkeypatch.setenv("PERSIST_WORKER_CRASH_AT", "file.linked:2")
    with persist.open(tmp_path, options=_options()) as client:
        _, r = _load(client)
        before = client.state
        keys = _data_keys(client)
        with pytest.raises(MergeWorkerLost, match="killed by signal 9"):
            client.maintain()
        assert client.state.collections == before.collections  # nothing committed
        assert client._runtime.poisoned is None
        assert _consolidated(r, 3).equals(_want(4))
        # what it wrote is referenced by nothing, and the leaked-blob sweep deletes it
        leaked = _data_keys(client) - keys
        assert leaked
        assert leaked <= _unreferenced(client)
        deleted = gc.LeakSweeper(0.0).sweep(client._ix.blob, lambda: client.state, 0.0)
        assert set(deleted) == leaked
        # the next merge starts a fresh worker (not armed any more) and succeeds
        monkeypatch.delenv("PERSIST_WORKER_CRASH_AT")
        assert client.maintain()
        assert client._ix.merger.started == 2
        assert _in_base(client)
        assert _consolidated(r, 3).equals(_want(4))
        assert _unreferenced(client) == set()


def test_a_worker_killed_by_its_pid_fails_the_merge_typed_and_the_next_one_works(
        tmp_path: Path) -> None:
    with persist.open(tmp_path, options=_options()) as client:
        w, r = _load(client, appends=2)
        assert client.maintain()  # starts the worker
        pid = client._ix.merger.pid
        assert pid is not None
        for t in range(2, 4):
            w.append(_table(t, t), upper=t + 1).result()
        w.allow_compaction(3).result()
        before = client.state.collections
        # NB: stopped first, so the merge is certainly sent to it and under way when it dies
        os.kill(pid, signal.SIGSTOP)
        failed: list[BaseException] = []
        t = threading.Thread(target=lambda: _catch(client.maintain, failed))
        t.start()
        while not _sent(client):  # the job waits in the stopped worker's input
            assert t.is_alive()
            time.sleep(0.01)
        # appends keep committing while the merge is under way
        for i in range(4, 24):
            w.append(_table(i, i, 10), upper=i + 1).result()
        os.kill(pid, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
        assert len(failed) == 1
        assert isinstance(failed[0], MergeWorkerLost)
        assert "killed by signal 9" in str(failed[0])
        assert client.state.collections["c"].parts[:len(before["c"].parts)] == \
            before["c"].parts
        assert _consolidated(r, 3).equals(_want(4))
        assert client.maintain()
        assert client._ix.merger.started == 2
        assert client._ix.merger.pid != pid
        assert _in_base(client)
        assert _consolidated(r, 3).equals(_want(4))


def _sent(client: persist.Client) -> bool:
    """Whether a request waits, unread, in the merge worker's input pipe."""
    proc = client._ix.merger._proc
    n = array.array("i", [0])
    fcntl.ioctl(proc.stdin.fileno(), termios.FIONREAD, n)
    return n[0] > 0


def _catch(fn: Any, out: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as e:
        out.append(e)


def test_appends_commit_while_the_background_merges_in_the_worker(tmp_path: Path) -> None:
    opts = persist.Options(background_compaction=True, batch_rows=1 << 16, stats_bytes=1024,
                           merge_worker_rows=0, compaction=_policy())
    with persist.open(tmp_path, options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(4):
            w.append(_table(t, t), upper=t + 1).result()
        w.allow_compaction(3).result()
        t = 4
        # NB: progress, not timing: appends commit until the background has brought the bulk
        # load into the base through the worker
        while not _in_base(client):
            w.append([((-t, 0), t, 1)], upper=t + 1).result()
            t += 1
            assert t < 100_000
        assert client._ix.merger.started >= 1
        got = r.snapshot(t - 1).to_arrow()
        assert len(got) == len(_want(4)) + (t - 4)


def test_the_worker_runs_at_a_lower_cpu_priority(tmp_path: Path) -> None:
    """A merge is background work: the worker lowers its priority (``os.nice``) so that on a
    busy machine the writer's appends get the CPU first (the worker's p50 of W2's appends
    during a base merge: 4.5-5.9x the baseline at the writer's priority, 1.3-2.5x niced)."""
    from persist.indexed.maintenance import offload

    with persist.open(tmp_path, options=_options()) as client:
        _load(client, appends=2)
        assert client.maintain()
        pid = client._ix.merger.pid
        assert pid is not None
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(mine + offload.WORKER_NICE, 19)


def test_close_ends_the_worker(tmp_path: Path) -> None:
    client = persist.open(tmp_path, options=_options())
    _load(client, appends=2)
    assert client.maintain()
    pid = client._ix.merger.pid
    assert pid is not None
    client.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped


def test_a_memory_location_merges_in_process() -> None:
    with persist.open("mem://merge-worker-test", options=_options()) as client:
        _load(client, appends=2)
        assert client._ix.merger is None
        assert client.maintain()


def test_small_merges_stay_in_process(tmp_path: Path) -> None:
    with persist.open(tmp_path, options=_options(worker_rows=10 * ROWS)) as client:
        _load(client, appends=2)
        assert client.maintain()
        assert client._ix.merger.started == 0


@pytest.mark.s3
def test_an_s3_writer_merges_in_its_worker(bucket: str, aws_options: dict[str, Any]) -> None:
    url = f"s3://{bucket}/loc"
    with persist.open(url, storage_options={**aws_options, "lock": "s3"},
                      options=_options()) as client:
        _, r = _load(client, appends=2)
        assert client.maintain()
        assert client._ix.merger.started == 1  # opened the bucket from the address it was given
        assert _in_base(client)
        assert _consolidated(r, 1).equals(_want(2))
        assert _unreferenced(client) == set()


def test_a_worker_that_cannot_start_leaves_merges_in_process(tmp_path: Path) -> None:
    with persist.open(tmp_path, options=_options()) as client:
        _, r = _load(client, appends=2)
        merger = client._ix.merger
        merger.entry = "persist.no_such_module"  # the interpreter exits at once
        with pytest.raises(MergeWorkerLost, match="did not start"):
            client.maintain()
        assert merger.broken is not None
        assert not merger.usable
        assert client.maintain()  # in-process now
        assert merger.started == 1
        assert _in_base(client)
        assert _consolidated(r, 1).equals(_want(2))


def test_closing_the_worker_under_a_merge_fails_that_merge_typed(tmp_path: Path) -> None:
    with persist.open(tmp_path, options=_options()) as client:
        _, r = _load(client, appends=2)
        merger = client._ix.merger
        assert client.maintain()  # starts the worker
        pid = merger.pid
        assert pid is not None
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(2, 4):
            w.append(_table(t, t), upper=t + 1).result()
        w.allow_compaction(3).result()
        before = client.state.collections["c"].parts
        os.kill(pid, signal.SIGSTOP)  # the merge is certainly under way when it is closed
        failed: list[BaseException] = []
        t = threading.Thread(target=lambda: _catch(client.maintain, failed))
        t.start()
        while not _sent(client):
            assert t.is_alive()
            time.sleep(0.01)
        merger.close(timeout=0.1)
        t.join(60)
        assert not t.is_alive()
        assert len(failed) == 1
        assert isinstance(failed[0], MergeWorkerLost)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert client.state.collections["c"].parts == before
        assert _consolidated(r, 3).equals(_want(4))
        assert client.maintain()  # closed: in-process now
        assert merger.started == 1
        assert _in_base(client)
