"""Runs waiting for a merge into the base that the background holds back (its rewrite budget)
do not pile up in the collection's metadata (DESIGN.md §8, ``compact.interim``): ready inline
runs are flushed into blob parts and the rest tiered meanwhile, so a rollup's piece stays
small under a long run of small appends with the since following upper; what the collection
reads as of every time in ``[since, upper)`` is unchanged by it."""

from __future__ import annotations

import uuid
from collections import Counter

import msgspec
import numpy as np
import pyarrow as pa

from persist.blob.memory import MemoryBlob
from persist.indexed.engine import Options
from persist.indexed.format.meta import CollectionMeta, PartMeta
from persist.indexed.maintenance import compact
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.state.transitions import effective_since
from persist.runtime.client import Client
from tests.runtime.test_trim import _open

BASE_ROWS = 300_000
#: Pinned (whatever the knob set): small appends ride inline, a rollup every 8 commits,
#: background compaction on, and a rewrite share of 0: the background never runs a merge of
#: ``compact.BUDGETED_ROWS`` rows or more, so the base merge (or marks step) these appends call
#: for waits for as long as the test runs; the fan-in and flush size are the defaults';
#: record batches and stats of the default size (a knob set's 4-row batches made the base
#: slow to write).
POLICY = CompactionPolicy(fanin=4, final_rows=1 << 19, base_ratio=4, max_runs=64,
                          inline_flush_bytes=1 << 20, part_target_bytes=64 << 20,
                          rewrite_share=0.0, marks_rows=1 << 18)
OPTIONS = Options(rollup_every=8, gc_grace_seconds=3600.0, inline_threshold=64 << 10,
                  background_compaction=True, compaction=POLICY, batch_rows=1 << 16,
                  stats_bytes=1024)


def _key(t: int, j: int) -> int:
    return (t * 7919 + j * 104_729) % BASE_ROWS  # keys all over the base's range


def _contents(client: Client, as_of: int) -> Counter[tuple[int, int]]:
    _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    out: Counter[tuple[int, int]] = Counter()
    for (k, v), _, d in r.snapshot(as_of).to_python():
        out[(k, v)] += d
    return Counter({kv: d for kv, d in out.items() if d})


def _ready_inline(c: CollectionMeta) -> list[int]:
    f = effective_since(c)
    return [p.nbytes for p in c.parts if p.inline is not None and p.max_time <= f]


def _ready_runs(c: CollectionMeta) -> list[PartMeta]:
    f = effective_since(c)
    _, runs = compact.layout(c, f)
    return [p for p in runs if p.max_time <= f]


def test_ready_inline_runs_do_not_wait_in_every_rollup_for_a_held_back_base_merge() -> None:
    name = uuid.uuid4().hex
    client = _open(MemoryBlob(name), name, OPTIONS)
    runtime = client._runtime
    assert runtime is not None
    try:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        keys = np.arange(BASE_ROWS, dtype=np.int64)
        w.append(pa.table({"key": keys, "value": keys,
                           "time": pa.array(np.zeros(BASE_ROWS, np.uint64)),
                           "diff": pa.array(np.ones(BASE_ROWS, np.int64))}), 1).result()
        w.allow_compaction(0)
        while client.maintain():  # an explicit round ignores the budget: the base
            pass
        c = client.state.collections["c"]
        base, runs = compact.layout(c, effective_since(c))
        assert sum(p.rows for p in base) == BASE_ROWS
        assert not runs
        model: Counter[tuple[int, int]] = Counter({(int(k), int(k)): 1 for k in keys})
        sizes: list[int] = []
        for i in range(400):
            t = i + 1
            rows = [((_key(t, j), t), t, 1) for j in range(10)]
            gone = _key(t, 0)
            if model[(gone, gone)] > 0:  # a retraction of a base row
                rows.append(((gone, gone), t, -1))
            w.append(rows, t + 1).result()
            for (k, v), _, d in rows:
                model[(k, v)] += d
            if t % 8 == 0:
                w.allow_compaction(t)  # since following upper, as a service's would
                runtime.maintain_once(background=True)  # a background round: budgeted
                c = client.state.collections["c"]
                # the waiting merge is still due (and held back) ...
                assert sum(p.rows for p in compact.plan(c, POLICY)) >= compact.BUDGETED_ROWS
                # ... and no ready inline run waits for it in the collection's metadata, and
                # the ready blob runs are tiered: fewer than fanin a level
                assert _ready_inline(c) == []
                levels = Counter(compact.level(p) for p in _ready_runs(c))
                assert all(n < POLICY.fanin for n in levels.values()), levels
                sizes.append(len(msgspec.msgpack.encode(c)))
        c = client.state.collections["c"]
        # every row appended is still there, as of every time the since allows
        assert effective_since(c) == 400
        assert _contents(client, 400) == +model
        # so the collection's metadata (what its rollup piece holds) grows with the log of the
        # rows waiting for the base merge, not with them (held inline, each round's 88 rows
        # added 3.7 KB to it): the last rounds against the first ten
        early, late = max(sizes[:10]), max(sizes[-10:])
        assert late < 3 * early, (early, late, sizes)
        # the base is untouched: the big merge is the one left to do, and it still can
        base, _ = compact.layout(c, effective_since(c))
        assert sum(p.rows for p in base) == BASE_ROWS
        while client.maintain():
            pass
        c = client.state.collections["c"]
        assert compact.plan(c, POLICY) == ()  # (a marks step: its delta is the one run)
        assert _contents(client, 400) == +model
    finally:
        client.stop()


def test_as_of_every_readable_time_the_interim_merges_change_nothing() -> None:
    """The since lags upper: held-back rounds tier the runs past it and flush the ready
    ones; every time in ``[since, upper)`` reads the model's contents."""
    name = uuid.uuid4().hex
    client = _open(MemoryBlob(name), name, OPTIONS)
    runtime = client._runtime
    assert runtime is not None
    try:
        w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        keys = np.arange(BASE_ROWS, dtype=np.int64)
        w.append(pa.table({"key": keys, "value": keys % 7,
                           "time": pa.array(np.zeros(BASE_ROWS, np.uint64)),
                           "diff": pa.array(np.ones(BASE_ROWS, np.int64))}), 1).result()
        w.allow_compaction(0)
        while client.maintain():
            pass
        history: list[tuple[int, int, int, int]] = [(int(k), int(k) % 7, 0, 1) for k in keys]
        for t in range(1, 121):
            rows = [((_key(t, j), t % 3), t, 1 if j % 3 else -1) for j in range(6)]
            w.append(rows, t + 1).result()
            history.extend((k, v, at, d) for (k, v), at, d in rows)
            if t % 5 == 0:
                w.allow_compaction(max(0, t - 12))  # the since lags
                runtime.maintain_once(background=True)
        c = client.state.collections["c"]
        for as_of in range(effective_since(c), c.upper):
            want: Counter[tuple[int, int]] = Counter()
            for k, v, at, d in history:
                if at <= as_of:
                    want[(k, v)] += d
            assert _contents(client, as_of) == Counter({kv: d for kv, d in want.items() if d})
    finally:
        client.stop()


def test_a_pile_of_ready_inline_runs_is_flushed_in_merges_that_are_never_big() -> None:
    """Inline runs piled up while the maintenance thread was busy (a long merge) are flushed
    in pieces of fewer than ``BUDGETED_ROWS`` rows, oldest first: a flush of them all would be
    big and wait for the budget too."""
    from persist.indexed.format import columnar

    parts = tuple(PartMeta(id=f"p{t}", rows=30_000, nbytes=1 << 20, min_time=t, max_time=t,
                           consolidated=False, inline=b"") for t in range(12))
    c = CollectionMeta(id=1, name="c", key_type=columnar.serialize_type(pa.int64()),
                       value_type=columnar.serialize_type(pa.int64()), since=20, upper=21,
                       parts=parts)
    chosen = compact.interim(c, POLICY)
    assert [p.id for p in chosen] == [f"p{t}" for t in range(8)]  # 240,000 rows
    assert sum(p.rows for p in chosen) < compact.BUDGETED_ROWS
    assert compact.flushes(c, chosen)
