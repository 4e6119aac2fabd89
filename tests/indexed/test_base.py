"""The compacted base (DESIGN.md §8): compaction reaches its goal layout after every kind of
write, and never changes what a collection reads as of any time in ``[since, upper)``.

The goal layout, checked on the stored rows themselves (not only on the metadata): the base
parts are consolidated blob parts, each at one time at or before the since, whose ``key`` stats
bounds are the exact minimum and maximum of their keys and are disjoint from every other base
part's; compaction is idle (nothing planned) when maintenance returns False.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, given, settings

import persist
from persist import distributed
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.indexed.engine import Options
from persist.indexed.format import columnar, evolve
from persist.indexed.format.meta import CollectionMeta, PartMeta
from persist.indexed.maintenance import compact
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.parts import PartReader
from persist.indexed.state.holds import effective_since
from tests.support.engine import Engine


def policy(**kw: Any) -> CompactionPolicy:
    """The compaction knobs these tests count by, pinned (whatever the session's knob set):
    small targets so that small data makes several base parts."""
    # NB: inline_flush_bytes counts stored bytes: 10,000 sequential keys are a 1,832-byte
    # compressed inline part (metadata format 9)
    base: dict[str, Any] = {"fanin": 4, "final_rows": 1 << 19, "base_ratio": 4, "max_runs": 16,
                            "inline_flush_bytes": 1024, "part_target_bytes": 16 << 10,
                            "rewrite_share": 1.0}
    return CompactionPolicy(**{**base, **kw})


def options(**kw: Any) -> Options:
    pol = policy(**kw.pop("compaction", {}))
    # NB: pinned too: record batches of the default size (the bulk test's 1.2 M rows in 4-row
    # batches, a knob set's, took minutes to write and to merge)
    base: dict[str, Any] = {"stats_bytes": 1024, "batch_rows": 1 << 16,
                            "background_compaction": False}
    return Options(**{**base, **kw}, compaction=pol)


def table(keys: Any, values: Any, t: int, diffs: Any = None) -> pa.Table:
    keys = np.asarray(keys, dtype=np.int64)
    diffs = np.ones(len(keys), np.int64) if diffs is None else np.asarray(diffs, np.int64)
    return pa.table({"key": pa.array(keys), "value": pa.array(np.asarray(values, np.int64)),
                     "time": pa.array(np.full(len(keys), t), pa.uint64()),
                     "diff": pa.array(diffs)})


def check_base(c: CollectionMeta, reader: PartReader, *, runs_allowed: bool = True
               ) -> tuple[tuple[PartMeta, ...], tuple[PartMeta, ...]]:
    """Asserts the goal layout of ``c`` (see the module docstring) on its stored rows;
    returns ``(base, runs)``."""
    f = effective_since(c)
    base, runs = compact.layout(c, f)
    view = evolve.View.of(c)
    prev_hi: int | None = None
    for p in base:
        assert p.blob_key is not None
        assert p.consolidated
        assert p.min_time == p.max_time <= f
        t = view.read(reader, p)
        keys = t.column("key").to_numpy()
        hidden = p.marks.count if p.marks is not None else 0  # a marks step's hidden rows
        assert len(keys) == p.rows - hidden > 0
        lo, hi, nulls = compact.key_bounds(p)  # type: ignore[misc]
        if hidden:  # NB: the stats are of the blob's rows, the marked ones included
            assert lo <= int(keys.min())
            assert int(keys.max()) <= hi
            assert nulls == 0
        else:
            assert (lo, hi, nulls) == (int(keys.min()), int(keys.max()), 0)  # exact
        assert prev_hi is None or prev_hi < lo  # disjoint, in key order
        prev_hi = hi
        assert columnar.consolidate(t).equals(t)  # sorted, consolidated, no zero diffs
        assert pc.unique(t.column("time")).to_pylist() == [p.min_time]
    if not runs_allowed:
        assert runs == ()
    return base, runs


def contents(ix: Engine, name: str, as_of: int) -> Counter[tuple[int, int]]:
    out: Counter[tuple[int, int]] = Counter()
    for (k, v), _, d in ix.snapshot(name, as_of).to_python():
        out[(k, v)] += d
    return Counter({kv: d for kv, d in out.items() if d})


def maintain(ix: Engine) -> None:
    """Maintenance until idle, then compaction must plan nothing."""
    while ix.maintain():
        pass
    assert ix.plan_compaction(ix.state) == []


def engine(blob: Any = None, **kw: Any) -> Engine:
    ix = Engine.open(blob or MemoryBlob(uuid.uuid4().hex), epoch=1, writer="w",
                     options=options(**kw))
    ix.fence()
    return ix


# -- every kind of write ends up in the base -----------------------------------------------


def test_small_appends_reach_a_base_with_few_runs_on_top() -> None:
    ix = engine()
    ix.register("c", pa.int64(), pa.int64())
    rng = np.random.default_rng(1)
    for t in range(120):
        keys = rng.integers(0, 5000, 40)
        ix.write({"c": table(keys, rng.integers(0, 3, 40), t)})
        ix.seal("c", t + 1)
        ix.allow_compaction("c", t)
        maintain(ix)
    c = ix.state.collections["c"]
    base, runs = check_base(c, ix.reader)
    assert len(base) > 1  # 4,800 updates cut at 16 KiB
    # what waits on top is a fraction of the base it overlaps (the policy's ratio)
    assert sum(p.rows for p in runs) * 4 < sum(p.rows for p in base)
    assert len(runs) < 4 * 4
    want: Counter[tuple[int, int]] = Counter()
    rng = np.random.default_rng(1)
    for _ in range(120):
        keys, values = rng.integers(0, 5000, 40), rng.integers(0, 3, 40)
        want.update(zip(keys.tolist(), values.tolist(), strict=True))
    assert contents(ix, "c", 119) == want


def test_bulk_appends_and_full_parts_are_merged_into_the_base() -> None:
    """Appends big enough to be written as key-disjoint ``full`` pieces (which compaction
    used to leave alone forever) end up in the base, in one maintenance round."""
    ix = engine(compaction={"part_target_bytes": 4 << 20})
    ix.register("c", pa.int64(), pa.int64())
    rng = np.random.default_rng(2)
    n = 600_000  # >= final_rows and two pieces of >= PARALLEL_ROWS
    for t in range(2):
        ix.write({"c": table(rng.integers(-(1 << 62), 1 << 62, n), rng.integers(0, 9, n), t)})
        ix.seal("c", t + 1)
    parts = ix.state.collections["c"].parts
    assert len(parts) == 4
    assert all(p.full is True for p in parts)
    before = ix.snapshot("c", 1).to_arrow()
    ix.allow_compaction("c", 1)
    assert ix.maintain()
    assert not ix.maintain()
    assert ix.plan_compaction(ix.state) == []
    base, _ = check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    assert len(base) >= 2
    assert sum(p.rows for p in base) == 2 * n
    assert all(p.full is not True for p in base)
    after = ix.snapshot("c", 1).to_arrow()
    assert columnar.consolidate(columnar.forward(after, 1)).equals(
        columnar.consolidate(columnar.forward(before, 1)))


def test_a_merge_rewrites_only_the_base_parts_the_new_runs_overlap() -> None:
    # NB: pinned: no inline parts (an inline run has no stats: its key range is unknown, so it
    # overlaps every base part and waits until it holds a quarter of the whole base)
    ix = engine(inline_threshold=0)
    ix.register("c", pa.int64(), pa.int64())
    keys = np.arange(0, 20_000, 2)
    ix.write({"c": table(keys, keys % 7, 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    maintain(ix)
    base0, _ = check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    assert len(base0) > 4
    # updates to a narrow key range: they overlap one or two base parts only
    lo, hi, _ = compact.key_bounds(base0[2])  # type: ignore[misc]
    upd = np.arange(lo, hi + 1)  # odd keys are new, even ones get a second value
    ix.write({"c": table(upd, upd % 5, 1)})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    maintain(ix)
    base1, _ = check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    kept = {p.id for p in base0} & {p.id for p in base1}
    assert kept == {p.id for p in base0} - {base0[2].id}  # the others untouched
    assert {p.min_time for p in base1 if p.id not in kept} == {1}
    want = Counter({(int(k), int(k % 7)): 1 for k in keys})
    want.update((int(k), int(k % 5)) for k in upd)
    assert contents(ix, "c", 1) == want


def test_runs_past_the_since_stay_runs_until_the_since_passes_them() -> None:
    ix = engine()
    ix.register("c", pa.int64(), pa.int64())
    for t in range(3):
        keys = np.arange(t, 9000, 3)
        ix.write({"c": table(keys, keys, t)})
        ix.seal("c", t + 1)
    maintain(ix)  # since 0: only the rows at 0 may join a base
    c = ix.state.collections["c"]
    base, runs = check_base(c, ix.reader)
    assert all(p.max_time == 0 for p in base)
    assert runs
    assert all(p.max_time > 0 for p in runs)
    ix.allow_compaction("c", 2)
    maintain(ix)
    check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    assert contents(ix, "c", 2) == Counter({(k, k): 1 for k in range(9000)})


def test_old_schema_versions_are_migrated_into_the_base() -> None:
    ix = engine()
    ix.register("c", pa.int64(), pa.int32())
    keys = np.arange(10_000)
    ix.write({"c": pa.table({"key": pa.array(keys), "value": pa.array(keys % 9, pa.int32()),
                             "time": pa.array(np.zeros(len(keys)), pa.uint64()),
                             "diff": pa.array(np.ones(len(keys), np.int64))})})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    maintain(ix)
    old, _ = check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    assert all(evolve.part_version(p) == 0 for p in old)
    assert ix.evolve_schema("c", value_type=pa.int64()) == 1
    # a base of version 0 stays the base (same key type): nothing to rewrite yet
    assert ix.plan_compaction(ix.state) == []
    ix.write({"c": table(keys[::2], keys[::2] % 9, 1, diffs=-np.ones(5000))})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    maintain(ix)
    base, _ = check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    assert all(evolve.part_version(p) == 1 for p in base)
    assert contents(ix, "c", 1) == Counter({(int(k), int(k % 9)): 1 for k in keys[1::2]})


def test_a_fork_keeps_its_borrowed_base_and_merges_into_its_own() -> None:
    """A fork's borrowed base parts are base parts of the fork (nothing rewritten at the
    fork); its own appends merge into the base parts they overlap, writing blobs of its own,
    and the source and the fork each read their own contents."""
    # NB: pinned: blob parts only (with key stats), and a ratio at which 100 updates are
    # merged into the ~500-row base part they overlap at once
    opts = options(inline_threshold=0, compaction={"base_ratio": 16})
    with persist.open(f"mem://{uuid.uuid4().hex}", options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        keys = np.arange(20_000)
        w.append(table(keys, keys % 3, 0), upper=1).result()
        w.allow_compaction(0).result()
        while client.maintain():
            pass
        w.append(table(keys[:100], keys[:100] % 3, 1, diffs=-np.ones(100)), upper=2).result()
        client.fork("c", into="f", as_of=0).result()
        f_meta = client.state.collections["f"]
        src = client.state.collections["c"]
        reader = PartReader(client._writer().ix.store)
        fbase, _fruns = check_base(f_meta, reader, runs_allowed=False)
        sbase, _ = check_base(src, reader)
        assert [p.blob_key for p in fbase] == [p.blob_key for p in sbase]
        fw, fr = client.create_or_load("f", key_type=pa.int64(), value_type=pa.int64())
        fw.append(table(keys[-100:], keys[-100:] % 3, 1, diffs=-np.ones(100)),
                  upper=2).result()
        fw.allow_compaction(1).result()
        w.allow_compaction(1).result()
        while client.maintain():
            pass
        f_meta = client.state.collections["f"]
        check_base(f_meta, reader, runs_allowed=False)
        check_base(client.state.collections["c"], reader, runs_allowed=False)
        assert sorted(fr.snapshot(1).to_python()) == sorted(
            ((int(k), int(k % 3)), 1, 1) for k in keys[:-100])
        assert sorted(r.snapshot(1).to_python()) == sorted(
            ((int(k), int(k % 3)), 1, 1) for k in keys[100:])
        # the fork's untouched base parts are still the source's blobs
        assert {p.blob_key for p in f_meta.parts} & {p.blob_key for p in sbase}


def test_staged_batches_reach_the_base(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    with persist.open(url, options=options()) as client:
        client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    stager = distributed.Stager.start(url, "c", job="test", inline_bytes=0)
    rng = np.random.default_rng(5)
    batches = [rng.permutation(np.arange(j, 30_000, 3)) for j in range(3)]
    staged = [stager.stage(table(b, b % 4, 0)) for b in batches]
    with persist.open(url, options=options()) as client:
        client.apply(parts={"c": staged}, seals={"c": 1}, sinces={"c": 0}).result()
        assert client.maintain()
        while client.maintain():
            pass
        reader = PartReader(FileBlob(f"{tmp_path}/loc"))
        base, _ = check_base(client.state.collections["c"], reader, runs_allowed=False)
        assert sum(p.rows for p in base) == 30_000
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert sorted(r.snapshot(0).to_python()) == [((k, k % 4), 0, 1) for k in range(30_000)]


def test_a_base_part_keeps_its_key_bounds_whatever_the_stats_budget() -> None:
    ix = engine(stats_bytes=0)
    ix.register("c", pa.int64(), pa.int64())
    keys = np.arange(5000)
    ix.write({"c": table(keys, keys, 0)})
    ix.seal("c", 1)
    maintain(ix)
    base, _ = check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    assert base
    assert all(p.stats is not msgspec.UNSET for p in base)


def test_a_collection_without_exact_key_bounds_has_no_base_and_still_compacts() -> None:
    ix = engine(compaction={"fanin": 2})
    ix.register("s", pa.string(), pa.int64())
    for t in range(4):
        ix.write({"s": [((f"k{i}", t), t, 1) for i in range(500)]})
        ix.seal("s", t + 1)
    ix.allow_compaction("s", 3)
    maintain(ix)
    c = ix.state.collections["s"]
    assert compact.layout(c, 3) == ((), c.parts)
    # tiered into one run, cut at the part target: every piece but one full (not tiered again)
    assert all(p.consolidated for p in c.parts)
    assert sum(p.full is not True for p in c.parts) == 1


# -- every kind of write on a marked base (compaction's marks step, format 8) ----------------


#: The marks step on any base (``marks_rows`` 1): ready runs that do not call for a merge
#: become a consolidated delta plus marks on the base parts (DESIGN.md §8).
MARKS = {"marks_rows": 1}


def check_goal(c: CollectionMeta, reader: PartReader) -> tuple[PartMeta, ...]:
    """The goal layout of ``c`` under :data:`MARKS` (every ready run of the current schema
    version is merged or marked), with or without a marks step's output (:func:`check_base`),
    once maintenance is idle: nothing waits at or before the since but, if the base is
    marked, the one delta its marks name (a consolidated blob part at one time, which the
    read plan pairs with the marked base; a run in compaction's layout) and runs of fewer
    than ``1 / delta_ratio`` of its rows (the next step waits for more). Returns the marked
    base parts."""
    f = effective_since(c)
    base, runs = check_base(c, reader)
    ready = [p for p in runs if p.rows and p.min_time <= f]
    marked = tuple(b for b in base if b.marks is not None)
    if not marked:
        assert ready == []
        return ()
    [named] = {b.marks.delta for b in marked}  # type: ignore[union-attr]
    waiting = [p for p in ready if p.id != named]
    [delta] = [p for p in (*base, *ready) if p.id == named]
    # runs wait beside the delta until they hold 1 / delta_ratio of its rows (the next step)
    ratio = compact.CompactionPolicy().delta_ratio
    assert sum(p.rows for p in waiting) * ratio < delta.rows
    assert delta.blob_key is not None
    assert delta.consolidated
    assert delta.min_time == delta.max_time <= f
    t = evolve.View.of(c).read(reader, delta)
    assert columnar.consolidate(t).equals(t)
    return marked


def paired(info: Any, as_of: int) -> None:
    """The read plan takes the marked base and its delta as one base (nothing summed but the
    runs that wait for the next step: fewer than ``1 / delta_ratio`` of the delta's rows)."""
    lay = info.snapshot(as_of).layers
    assert lay.delta is not None
    assert lay.delta in lay.base
    ratio = compact.CompactionPolicy().delta_ratio
    assert sum(p.rows for p in lay.runs) * ratio < lay.delta.rows


def marked_engine(blob: Any = None, n: int = 6000, **kw: Any) -> Engine:
    """An engine with the marks step on, holding collection ``c``: ``n`` keys at time 0,
    brought into the base."""
    pol = {**MARKS, **kw.pop("compaction", {})}
    # NB: the n keys as a blob part whatever the inline threshold asked for, so that they
    # start the base (a compressed inline part of 6000 sequential keys is 1,840 bytes: below
    # the tests' inline_flush_bytes, it would stay inline)
    ix = engine(blob, **{**kw, "inline_threshold": 0}, compaction=pol)
    ix.register("c", pa.int64(), pa.int64())
    keys = np.arange(n)
    ix.write({"c": table(keys, keys % 7, 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    maintain(ix)
    check_base(ix.state.collections["c"], ix.reader, runs_allowed=False)
    ix.set_options(options(**{"inline_threshold": 0, **kw}, compaction=pol))
    return ix


@pytest.mark.parametrize("inline", [0, 1 << 20])
def test_small_appends_on_a_marked_base_keep_the_goal_layout(inline: int) -> None:
    """Small appends (inline or blob parts), the since following each: marks steps (the
    delta re-made, marks accumulating) until the runs call for a base merge, which drops the
    marks; the goal layout after every round, and the contents at every time."""
    ix = marked_engine(inline_threshold=inline)
    rng = np.random.default_rng(3)
    want = Counter({(int(k), int(k % 7)): 1 for k in range(6000)})
    marked_rounds = 0
    for t in range(1, 25):
        keys = rng.integers(0, 7000, 40)
        old = [(int(k), int(k % 7)) for k in keys[:10] if k < 6000 and want[(int(k), int(k % 7))]]
        vals = rng.integers(0, 3, 40)
        rows = [(k, v, -1) for k, v in old] + [(int(k), int(v), 1) for k, v in zip(keys, vals,
                                                                                    strict=True)]
        ix.write({"c": table([r[0] for r in rows], [r[1] for r in rows], t,
                             [r[2] for r in rows])})
        for k, v, d in rows:
            want[(k, v)] += d
        ix.seal("c", t + 1)
        ix.allow_compaction("c", t)
        maintain(ix)
        if check_goal(ix.state.collections["c"], ix.reader):
            marked_rounds += 1
            paired(ix.info("c"), t)
        assert contents(ix, "c", t) == Counter({kv: d for kv, d in want.items() if d})
    assert marked_rounds >= 10  # most rounds took the marks step, not a merge


def test_a_bulk_append_on_a_marked_base_is_merged_into_the_base() -> None:
    ix = marked_engine(compaction={"part_target_bytes": 4 << 20})
    ix.write({"c": table([1, 2, 6001], [9, 9, 9], 1)})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    maintain(ix)
    assert check_goal(ix.state.collections["c"], ix.reader)
    before = contents(ix, "c", 1)
    rng = np.random.default_rng(4)
    n = 600_000  # >= final_rows and two pieces of >= PARALLEL_ROWS: full parts
    keys = rng.integers(-(1 << 62), 1 << 62, n)
    ix.write({"c": table(keys, np.zeros(n, np.int64), 2)})
    ix.seal("c", 3)
    assert sum(p.full is True for p in ix.state.collections["c"].parts) >= 2
    ix.allow_compaction("c", 2)
    maintain(ix)
    c = ix.state.collections["c"]
    assert check_goal(c, ix.reader) == ()  # merged: no marks left
    base, _ = check_base(c, ix.reader, runs_allowed=False)
    assert all(p.full is not True for p in base)
    assert sum(p.rows for p in base) == sum(before.values()) + n
    after = contents(ix, "c", 2)
    assert after - Counter({(int(k), 0): 1 for k in keys}) == before


def test_staged_batches_on_a_marked_base_keep_the_goal_layout(tmp_path: Path) -> None:
    """Batches staged by a distributed writer (what the Spark sink and the native write
    commit), applied with the since past them, take the marks step."""
    url = f"file://{tmp_path}/loc"
    opts = options(inline_threshold=0, compaction=MARKS)
    with persist.open(url, options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        keys = np.arange(9000)
        w.append(table(keys, keys % 4, 0), upper=1).result()
        w.allow_compaction(0).result()
        while client.maintain():
            pass
    stager = distributed.Stager.start(url, "c", job="test", inline_bytes=0)
    staged = [stager.stage(table(np.array([k, k + 1]), np.array([9, 9]), 1,
                                 np.array([1, 1]))) for k in (10, 4000, 9500)]
    staged.append(stager.stage(table(np.array([20, 21]), np.array([0, 1]), 1,
                                     np.array([-1, -1]))))
    with persist.open(url, options=opts) as client:
        client.apply(parts={"c": staged}, seals={"c": 2}, sinces={"c": 1}).result()
        while client.maintain():
            pass
        reader = PartReader(FileBlob(f"{tmp_path}/loc"))
        assert check_goal(client.state.collections["c"], reader)
        paired(distributed.describe(url, "c"), 1)
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        want = Counter({(int(k), int(k % 4)): 1 for k in range(9000)})
        for k in (10, 11, 4000, 4001, 9500, 9501):
            want[(k, 9)] += 1
        want[(20, 0)] -= 1
        want[(21, 1)] -= 1
        got: Counter[tuple[int, int]] = Counter()
        for (k, v), _, d in r.snapshot(1).to_python():
            got[(k, v)] += d
        assert got == Counter({kv: d for kv, d in want.items() if d})


def test_a_fork_of_a_marked_base_reaches_its_own_goal_layout(tmp_path: Path) -> None:
    """A fork borrows the marked base and its delta; its own appends take its own marks step
    (or merge), while the source keeps its layout and contents."""
    url = f"file://{tmp_path}/loc"
    opts = options(inline_threshold=0, compaction=MARKS)
    with persist.open(url, options=opts) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        keys = np.arange(8000)
        w.append(table(keys, keys % 3, 0), upper=1).result()
        w.allow_compaction(0).result()
        while client.maintain():
            pass
        # a retraction and a new value inside the base's key range: a delta that overlaps
        w.append(table([5, 6, 9000], [5 % 3, 9, 1], 1, [-1, 1, 1]), upper=2).result()
        w.allow_compaction(1).result()
        while client.maintain():
            pass
        reader = PartReader(client._writer().ix.store)
        assert check_goal(client.state.collections["c"], reader)
        paired(distributed.describe(url, "c"), 1)
        client.fork("c", into="f", as_of=1).result()
        fw, fr = client.create_or_load("f", key_type=pa.int64(), value_type=pa.int64())
        # borrowed as it was: the fork's marks name the fork's own copy of the delta
        assert check_goal(client.state.collections["f"], reader)
        paired(distributed.describe(url, "f"), 1)
        fw.append(table([7, 7000, 9999], [7 % 3, 7000 % 3, 0], 2, [-1, -1, 1]),
                  upper=3).result()
        fw.allow_compaction(2).result()
        while client.maintain():
            pass
        f_meta = client.state.collections["f"]
        check_goal(f_meta, reader)
        check_goal(client.state.collections["c"], reader)
        src = {(int(k), int(k % 3)) for k in keys} - {(5, 2)} | {(6, 9), (9000, 1)}
        assert {kv for kv, _, d in r.snapshot(1).to_python() if d == 1} == src
        mine = src - {(7, 1), (7000, 1)} | {(9999, 0)}
        assert sorted(fr.snapshot(2).to_python()) == sorted((kv, 2, 1) for kv in mine)


def test_schema_evolution_on_a_marked_base_migrates_it_into_the_base() -> None:
    """A marks step never mixes schema versions: a run of a newer version on a marked base of
    an older one waits as a run (read by key over the base) until the base merge is due,
    which migrates the base (and drops its marks)."""
    ix = engine(inline_threshold=0, compaction=MARKS)
    ix.register("c", pa.int64(), pa.int32())
    keys = np.arange(10_000)
    ix.write({"c": pa.table({"key": pa.array(keys), "value": pa.array(keys % 9, pa.int32()),
                             "time": pa.array(np.zeros(len(keys)), pa.uint64()),
                             "diff": pa.array(np.ones(len(keys), np.int64))})})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    maintain(ix)
    ix.write({"c": pa.table({"key": pa.array([3, 20_000]), "value": pa.array([3, 1], pa.int32()),
                             "time": pa.array([1, 1], pa.uint64()),
                             "diff": pa.array([-1, 1], pa.int64())})})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    maintain(ix)
    assert check_goal(ix.state.collections["c"], ix.reader)  # a marks step at version 0
    assert ix.evolve_schema("c", value_type=pa.int64()) == 1
    ix.write({"c": table([4, 30_000], [4, 2], 2, [-1, 1])})
    ix.seal("c", 3)
    ix.allow_compaction("c", 2)
    maintain(ix)  # nothing planned: no marks step across versions, no merge due yet
    c = ix.state.collections["c"]
    base, runs = check_base(c, ix.reader)
    assert [evolve.part_version(p) for p in runs if p.min_time == 2] == [1]
    assert {evolve.part_version(p) for p in base} == {0}
    want = Counter({(int(k), int(k % 9)): 1 for k in keys if k not in (3, 4)})
    want.update({(20_000, 1): 1, (30_000, 2): 1})
    assert contents(ix, "c", 2) == want
    # half the keys retracted: the base merge is due, and migrates every part
    gone = keys[5::2]
    ix.write({"c": table(gone, gone % 9, 3, -np.ones(len(gone)))})
    ix.seal("c", 4)
    ix.allow_compaction("c", 3)
    maintain(ix)
    c = ix.state.collections["c"]
    assert check_goal(c, ix.reader) == ()
    base, _ = check_base(c, ix.reader, runs_allowed=False)
    assert all(evolve.part_version(p) == 1 for p in base)
    for k in gone:
        del want[(int(k), int(k % 9))]
    assert contents(ix, "c", 3) == want


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(persist.InvalidUsage, match="base_ratio"):
        CompactionPolicy(base_ratio=0)
    with pytest.raises(persist.InvalidUsage, match="max_runs"):
        CompactionPolicy(max_runs=0)


# -- compaction never changes what a collection reads -----------------------------------------


steps = st.lists(st.one_of(
    st.tuples(st.just("write"), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 2),
                                                   st.sampled_from([1, 1, -1, 2])),
                                         min_size=0, max_size=60)),
    st.tuples(st.just("since"), st.integers(0, 3)),
    st.tuples(st.just("maintain"), st.just(0)),
), min_size=1, max_size=25).map(lambda s: [*s, ("since", 1 << 20), ("maintain", 0)])


def _model_contents(model: list[tuple[int, int, int, int]], at: int) -> Counter[tuple[int, int]]:
    """The contents as of ``at`` of the updates ``model`` (key, value, time, diff)."""
    want: Counter[tuple[int, int]] = Counter()
    for k, v, t, d in model:
        if t <= at:
            want[(k, v)] += d
    return Counter({k: d for k, d in want.items() if d})


def _play(ix: Engine, steps: list[tuple[str, Any]],
          compacted: Callable[[], None]) -> list[tuple[int, int, int, int]]:
    """Plays ``steps`` (writes, since advances, compactions) on collection ``c`` of ``ix``;
    each compaction step calls ``compacted`` and checks that the contents as of every time
    in ``[since, upper)`` stayed as they were. Returns the model (key, value, time, diff)."""
    model: list[tuple[int, int, int, int]] = []
    t = 0
    for op, arg in steps:
        c = ix.state.collections["c"]
        if op == "write":
            rows = [(k, v, t, d) for k, v, d in arg]
            if rows:
                ix.write({"c": table([r[0] for r in rows], [r[1] for r in rows], t,
                                     [r[3] for r in rows])})
            model.extend(rows)
            t += 1
            ix.seal("c", t)
        elif op == "since" and c.upper > 0:
            ix.allow_compaction("c", max(c.since, min(c.since + arg, c.upper - 1)))
        else:
            before = {a: contents(ix, "c", a) for a in range(c.since, c.upper)}
            compacted()
            c = ix.state.collections["c"]
            assert {a: contents(ix, "c", a) for a in range(c.since, c.upper)} == before
    return model


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, target=st.sampled_from([128, 512, 1 << 20]),
       flush=st.sampled_from([0, 512, 1 << 20]), ratio=st.sampled_from([1, 4]),
       stats_bytes=st.sampled_from([0, 1024]), batch_rows=st.sampled_from([4, 1 << 16]),
       marks_rows=st.sampled_from([1, 1 << 40]))
def test_compaction_never_changes_the_contents_at_any_readable_time(
        steps: list[tuple[str, Any]], target: int, flush: int, ratio: int,
        stats_bytes: int, batch_rows: int, marks_rows: int) -> None:
    # NB: 4-row record batches make runs a base merge reads batch by batch (compact._Lazy);
    # marks_rows 1: the marks step wherever ready runs do not call for a merge
    ix = engine(stats_bytes=stats_bytes, inline_threshold=256, batch_rows=batch_rows,
                compaction={"part_target_bytes": target, "inline_flush_bytes": flush,
                            "base_ratio": ratio, "final_rows": 64, "fanin": 2,
                            "marks_rows": marks_rows})
    ix.register("c", pa.int64(), pa.int64())

    def compacted() -> None:
        while ix.maintain():
            pass
        base, runs = check_base(ix.state.collections["c"], ix.reader)
        marked = sum(1 for p in base if p.marks is not None)
        event(f"base parts: {min(len(base), 3)}, runs: {min(len(runs), 3)}, "
              f"marked: {min(marked, 2)}")

    model = _play(ix, steps, compacted)
    c = ix.state.collections["c"]
    for a in range(c.since, c.upper):
        assert contents(ix, "c", a) == _model_contents(model, a)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, flush=st.sampled_from([0, 512, 1 << 20]), ratio=st.sampled_from([1, 4]),
       marks=st.sampled_from([1, 1 << 30]))
def test_merges_meanwhile_a_held_back_base_merge_change_nothing(
        steps: list[tuple[str, Any]], flush: int, ratio: int, marks: int) -> None:
    """Background rounds whose base merge or marks step waits for the rewrite budget
    (``compact.interim``: ready inline runs flushed into blobs, runs tiered) never change the
    contents as of any time in ``[since, upper)``; no ready inline run is left after one, and
    the merge that waited still reaches the goal layout."""
    ix = engine(inline_threshold=256,
                compaction={"part_target_bytes": 512, "inline_flush_bytes": flush,
                            "base_ratio": ratio, "final_rows": 64, "fanin": 2,
                            "rewrite_share": 0.0, "marks_rows": marks})
    ix.register("c", pa.int64(), pa.int64())

    def held_back() -> None:
        # NB: every merge of 8 rows or more counts as big (its budget: none, share 0)
        parts = ix.state.collections["c"].parts
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(compact, "BUDGETED_ROWS", 8)
            ix.compact(lambda: ix.state, lambda ops, at: ix.commit_ops(ops, at), budgeted=True)
        event(f"held back, parts changed: {ix.state.collections['c'].parts != parts}")
        c = ix.state.collections["c"]
        f = effective_since(c)
        _, runs = compact.layout(c, f)
        if compact.plan(c, ix.options.compaction):
            assert not [p for p in runs if p.inline is not None and p.max_time <= f
                        and p.rows < 64]
        check_base(c, ix.reader)

    model = _play(ix, steps, held_back)
    maintain(ix)
    c = ix.state.collections["c"]
    check_base(c, ix.reader)
    for a in range(c.since, c.upper):
        assert contents(ix, "c", a) == _model_contents(model, a)
