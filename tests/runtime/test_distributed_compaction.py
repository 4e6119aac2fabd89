"""Distributed compaction (``persist.distributed.compaction``): planned by key range, merged in
other processes, committed as one ``ReplaceParts`` of exactly the planned parts, refused with
``PartsChanged`` when they changed meanwhile."""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persist
from persist import Client, Determinate, LeaseRevoked, PartsChanged, distributed
from persist.blob.unreliable import BLOB_OPS, FaultPlan, Faults, UnreliableBlob
from persist.indexed.engine import Indexed
from persist.indexed.maintenance import compact, verify
from persist.indexed.state.transitions import effective_since
from persist.location import resolve
from persist.runtime.runtime import Runtime

ROWS = 20_000
_TYPES: dict[str, pa.DataType] = {}


def _options() -> persist.Options:
    # NB: pinned: no background compaction (each test decides when the writer merges), small
    # record batches (so a task decodes only the batches its key range reaches), stats big
    # enough for per-batch key bounds
    return persist.Options(background_compaction=False, batch_rows=1 << 11, stats_bytes=4096,
                           inline_threshold=1024)


def _batch(seed: int, t: int, n: int = ROWS) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = rng.integers(-(1 << 40), 1 << 40, n)
    keys[: n // 10] = rng.integers(0, 100, n // 10)  # repeated keys: rows that merge
    return pa.table({"key": pa.array(keys), "value": pa.array(rng.integers(0, 3, n)),
                     "time": pa.array(np.full(n, t), pa.uint64()),
                     "diff": pa.array(rng.choice([-1, 1, 2], n).astype(np.int64))})


def _fill(client: persist.Client, appends: int = 4) -> None:
    w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    _TYPES[client.state.collections["c"].key_type] = pa.int64()
    for t in range(appends):
        w.append(_batch(t, t), upper=t + 1).result()
    w.allow_compaction(appends - 1).result()


def _contents(client: persist.Client, name: str, as_of: int) -> Counter[tuple[int, int]]:
    c = client.state.collections[name]
    _, r = client.create_or_load(name, key_type=_TYPES[c.key_type], value_type=pa.int64())
    t = r.snapshot(as_of).to_arrow()
    out: Counter[tuple[int, int]] = Counter()
    for k, v, d in zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                       t.column("diff").to_pylist(), strict=True):
        out[(k, v)] += d
    return +out


def _run_encoded(data: bytes) -> bytes:
    """Another process's side: a task from its bytes, run there."""
    task = distributed.CompactionTask.from_bytes(data)
    return pickle.dumps(distributed.run_compaction_task(task))


@pytest.fixture
def pool() -> Any:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as p:
        yield p


def _run(plan: distributed.CompactionPlan, pool: Any) -> list[distributed.StagedPart]:
    outs = pool.map(_run_encoded, [t.to_bytes() for t in plan.tasks])
    return [s for o in outs for s in pickle.loads(o)]


def _blob_exists(tmp_path: Path, part: distributed.StagedPart) -> bool:
    assert part.part.blob_key is not None
    key = part.part.blob_key
    return key in resolve(str(tmp_path)).blob.list_keys(key)


def _clean(tmp_path: Path) -> None:
    report = verify.verify(resolve(str(tmp_path)).blob.read_only())
    assert report.problems == []


def test_tasks_in_other_processes_merge_the_collection_into_a_base(
        tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client)
        before = {t: _contents(client, "c", t) for t in (3,)}
        planned = {p.id for p in client.state.collections["c"].parts}
        plan = distributed.plan_compaction(url, "c", n=3)
        assert plan is not None
        assert set(plan.removed) == planned
        assert len(plan.tasks) == 3
        assert plan.frontier == 3
        staged = _run(plan, pool)
        # the tasks' outputs are key-disjoint base parts at the frontier
        bounds = sorted(compact.key_bounds(s.part) for s in staged)  # type: ignore[type-var]
        for (_, hi, _), (lo, _, _) in itertools.pairwise(bounds):
            assert hi < lo
        assert all(s.part.consolidated and s.part.min_time == s.part.max_time == 3
                   for s in staged)
        seq = distributed.commit_compaction(plan, staged, client=client)
        assert seq == client.state.seq
        c = client.state.collections["c"]
        assert not {p.id for p in c.parts} & planned
        assert {p.id for p in c.parts} == {s.part.id for s in staged}
        base, runs = compact.layout(c, effective_since(c))
        assert len(base) == len(staged)
        assert runs == ()
        assert {t: _contents(client, "c", t) for t in (3,)} == before
        # a second plan finds nothing to merge
        assert distributed.plan_compaction(url, "c", n=3) is None
    _clean(tmp_path)


def test_an_append_during_the_merge_is_kept(tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client)
        plan = distributed.plan_compaction(url, "c", n=2)
        assert plan is not None
        staged = _run(plan, pool)
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        w.append(_batch(99, 4), upper=5).result()
        w.append([((7, 7), 5, 1)], upper=6).result()
        want = _contents(client, "c", 5)
        distributed.commit_compaction(plan, staged, client=client)
        assert _contents(client, "c", 5) == want
        assert _contents(client, "c", 5)[(7, 7)] >= 1
        c = client.state.collections["c"]
        assert len(c.parts) == len(staged) + 2
    _clean(tmp_path)


def test_a_writer_compacting_the_same_parts_meanwhile_is_a_typed_refusal(
        tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client)
        plan = distributed.plan_compaction(url, "c", n=2)
        assert plan is not None
        staged = _run(plan, pool)
        want = _contents(client, "c", 3)
        assert client.maintain()  # the writer merges the planned parts itself
        parts = {p.id for p in client.state.collections["c"].parts}
        assert not parts >= set(plan.removed)
        seq = client.state.seq
        with pytest.raises(PartsChanged, match="gone"):
            distributed.commit_compaction(plan, staged, client=client)
        assert client.state.seq == seq  # nothing committed
        assert {p.id for p in client.state.collections["c"].parts} == parts
        assert _contents(client, "c", 3) == want
        assert not any(_blob_exists(tmp_path, s) for s in staged)  # discarded
    _clean(tmp_path)


def test_a_fork_reads_the_replaced_parts_through_gc(tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client)
        client.fork("c", into="f", as_of=3).result()
        want = _contents(client, "f", 3)
        plan = distributed.plan_compaction(url, "c", n=2)
        assert plan is not None
        distributed.commit_compaction(plan, _run(plan, pool), client=client)
        client.maintain()  # GC: the fork still reads the replaced parts' blobs
        assert _contents(client, "f", 3) == want == _contents(client, "c", 3)
    _clean(tmp_path)


def test_a_lapsed_lease_refuses_the_commit(tmp_path: Path, pool: Any) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client)
        plan = distributed.plan_compaction(url, "c", n=2)
        assert plan is not None
        staged = _run(plan, pool)
        plan.stager.release()  # as a sweep revokes a lapsed lease
        seq = client.state.seq
        with pytest.raises(LeaseRevoked):
            distributed.commit_compaction(plan, staged, client=client)
        assert client.state.seq == seq
    _clean(tmp_path)


def test_a_read_hold_below_the_frontier_refuses_the_commit(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client, appends=2)
        runtime = client._runtime
        assert runtime is not None
        token = runtime.holds.add("c", 0)  # a listener in this process reads as of 0
        plan = distributed.plan_compaction(url, "c", n=2)
        assert plan is not None
        assert plan.frontier == 1
        staged = [s for t in plan.tasks for s in distributed.run_compaction_task(t)]
        with pytest.raises(PartsChanged, match="holds it at 0"):
            distributed.commit_compaction(plan, staged, client=client)
        runtime.holds.remove(token)
        assert distributed.compact_distributed(url, "c", client=client) is not None


def test_a_commit_opens_the_writer_itself(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client, appends=3)
        want = _contents(client, "c", 2)
    seq = distributed.compact_distributed(url, "c", n=4)
    assert seq is not None
    with persist.open(tmp_path, options=_options()) as client:
        assert client.state.seq >= seq
        c = client.state.collections["c"]
        assert compact.layout(c, 2)[1] == ()  # every part in the base
        assert _contents(client, "c", 2) == want
    _clean(tmp_path)


def test_string_keys_merge_in_one_task(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        w, _ = client.create_or_load("s", key_type=pa.string(), value_type=pa.int64())
        _TYPES[client.state.collections["s"].key_type] = pa.string()
        for t in range(3):
            w.append([((f"k{i % 500}", i % 3), t, 1) for i in range(t, 3000, 2)],
                     upper=t + 1).result()
        w.allow_compaction(2).result()
        want = _contents(client, "s", 2)
        plan = distributed.plan_compaction(url, "s", n=4)
        assert plan is not None
        assert len(plan.tasks) == 1
        distributed.commit_compaction(
            plan, distributed.run_compaction_task(plan.tasks[0]), client=client)
        assert _contents(client, "s", 2) == want
        assert len(client.state.collections["s"].parts) == 1


def test_task_rows_bounds_the_number_of_tasks(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client)  # 4 appends of ROWS rows
        want = _contents(client, "c", 3)
        for task_rows, tasks in ((1, 4), (ROWS, 4), (2 * ROWS, 2), (3 * ROWS, 1),
                                 (1 << 40, 1)):
            plan = distributed.plan_compaction(url, "c", n=4, task_rows=task_rows)
            assert plan is not None
            assert len(plan.tasks) == tasks, task_rows
            if task_rows == 1 << 40:
                staged = distributed.run_compaction_task(plan.tasks[0])
                distributed.commit_compaction(plan, staged, client=client)
            else:
                plan.stager.release()
        assert _contents(client, "c", 3) == want
        for bad in (0, -1, True, 1.5):
            with pytest.raises(persist.InvalidUsage, match="task_rows"):
                distributed.plan_compaction(url, "c", n=4, task_rows=bad)  # type: ignore[arg-type]
    _clean(tmp_path)


def _faulty_opener(url: str, faults: Faults) -> tuple[Any, list[UnreliableBlob]]:
    """Opens writers of ``url`` over a fault-injecting store: the first one's first metadata
    commit suffers ``faults``; later ones (the reopen that settles) none."""
    blobs: list[UnreliableBlob] = []

    def open_writer() -> Client:
        loc = resolve(url)
        blob = UnreliableBlob(loc.blob, plan=FaultPlan(7, ops=BLOB_OPS, name="blob"))
        lock = loc.lock()
        lease = lock.acquire("compactor", timeout=10)
        ix = Indexed.open(blob, epoch=lease.generation, writer="compactor")
        ix.fence()
        client = Client(url, ix, runtime=Runtime(ix, lock=lock, lease=lease))
        if not blobs:  # opened: the next metadata commit is the compaction's
            blob.set_faults({"set_if_absent": faults})
        blobs.append(blob)
        return client

    return open_writer, blobs


@pytest.mark.parametrize(("faults", "landed"), [(Faults(indeterminate=1.0), True),
                                                (Faults(lost=1.0), False)],
                         ids=["written-answer-lost", "never-written"])
def test_an_unknown_outcome_is_settled_from_the_log(tmp_path: Path, faults: Faults,
                                                    landed: bool) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        _fill(client, appends=3)
        want = _contents(client, "c", 2)
        parts = {p.id for p in client.state.collections["c"].parts}
    plan = distributed.plan_compaction(url, "c", n=2)
    assert plan is not None
    staged = [s for t in plan.tasks for s in distributed.run_compaction_task(t)]
    opener, blobs = _faulty_opener(url, faults)
    if landed:
        distributed.commit_compaction(plan, staged, opener=opener)
    else:
        with pytest.raises(Determinate, match="did not land"):
            distributed.commit_compaction(plan, staged, opener=opener)
    assert len(blobs) == 2  # reopened once, to read what happened
    with persist.open(tmp_path, options=_options()) as client:
        now = {p.id for p in client.state.collections["c"].parts}
        assert now == ({s.part.id for s in staged} if landed else parts)
        assert _contents(client, "c", 2) == want
    assert all(_blob_exists(tmp_path, s) for s in staged) == landed
    _clean(tmp_path)
