"""Native reads without Spark (``persist.distributed.native``): the plan another engine's
Parquet reader follows, its residual applied by pyarrow as a stand-in for that reader, the
fast path that skips consolidation, and the one plan-retry budget."""

from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import persist
from persist import distributed
from persist.blob.file import FileBlob
from persist.indexed.engine import Options
from persist.indexed.format import stats
from persist.indexed.format.meta import PartMeta
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read import split
from tests.support.engine import Engine

#: No background merging, blob parts, small row groups, a merge of everything into key-disjoint
#: parts of about 2,000 rows when a test compacts.
PINNED = Options(inline_threshold=0, batch_rows=500, stats_bytes=1024,
                 background_compaction=False,
                 compaction=CompactionPolicy(final_rows=1 << 30, fanin=2,
                                             inline_flush_bytes=1 << 62,
                                             part_target_bytes=16 << 10))


def _engine(root: Path, options: Options = PINNED) -> Engine:
    ix = Engine.open(FileBlob(root), epoch=1, writer="w", options=options)
    assert isinstance(ix, Engine)
    ix.fence()
    return ix


def _updates(rng: np.random.Generator, n: int, t: int, keys: Any) -> pa.Table:
    return pa.table({"key": keys, "value": pa.array(rng.integers(0, 3, n)),
                     "time": pa.array(np.full(n, t, dtype=np.uint64)),
                     "diff": pa.array(rng.choice(np.array([1, 1, -1]), n))})


def _sums(tables: list[pa.Table]) -> dict[tuple[Any, Any], int]:
    """Summed diffs per ``(key, value)``, zeros dropped; NaN keys as one key (``"nan"``)."""
    out: Counter[tuple[Any, Any]] = Counter()
    for t in tables:
        for k, v, d in zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                           t.column("diff").to_pylist(), strict=True):
            out[("nan" if isinstance(k, float) and math.isnan(k) else k, v)] += d
    return {kv: d for kv, d in out.items() if d}


def _where(t: pa.Table, r: distributed.Residual) -> pa.Table:
    """A stand-in for another engine's reader applying a residual: ``time <= as_of`` and the
    key bounds in the order they are meant in (NaN above every number, a null key matching no
    comparison), times forwarded."""
    keep = pc.less_equal(t.column("time"), pa.scalar(r.as_of, t.schema.field("time").type))
    k = r.keys
    if k is not None:
        key = t.column("key")
        nan = pc.is_nan(key) if pa.types.is_floating(key.type) else None
        if k.hi is not None:
            keep = pc.and_(keep, pc.fill_null(pc.less(key, k.hi), False))
        if k.lo is not None:
            above = pc.greater_equal(key, k.lo)
            if nan is not None:
                above = pc.or_(above, nan)
            above = pc.fill_null(above, False)
            if k.nulls:
                above = pc.or_(above, pc.is_null(key))
            keep = pc.and_(keep, above)
    out = t.filter(keep)
    return out.set_column(2, "time", pa.array([r.as_of] * len(out), pa.uint64()))


def _read(plan: distributed.NativePlan) -> list[pa.Table]:
    """Every piece of ``plan`` read as another engine reads it."""
    out: list[pa.Table] = []
    schema = plan.info.schema()
    for f in plan.files:
        # each file's length, as persist wrote it (what a reader given statuses trusts)
        assert f.sizes == tuple(Path(u.removeprefix("file://")).stat().st_size
                                for u in f.urls)
        files = pa.concat_tables([pq.read_table(u.removeprefix("file://")).cast(schema)
                                  for u in f.urls])
        rows = _where(files, f.residual)
        if f.runs is not None:
            # the runs applied by key, as an engine's anti join against the runs' keys does
            # (an equi-join: a null key never matches, so null-key rows are summed)
            assert not f.residual.consolidate
            keys = distributed.consolidate(f.runs, schema.empty_table()).column("key")
            hit = pc.fill_null(pc.is_in(rows.column("key"), value_set=keys.combine_chunks(),
                                        skip_nulls=True), True)
            out.append(rows.filter(pc.invert(hit)))
            out.append(distributed.consolidate(f.runs, rows.filter(hit)))
            continue
        if f.residual.consolidate:
            assert f.rest is not None
            if f.residual.keys is None or f.residual.keys.exact:
                # the reader's own aggregation over exactly the range: persist consolidates
                # only the other parts
                out.append(rows)
                out.append(distributed.consolidate(f.rest, schema.empty_table()))
            else:
                out.append(distributed.consolidate(f.rest, rows))
        else:
            out.append(rows)
    out += [t for task in plan.tasks for t in distributed.read_task(task)]
    return out


def _client(root: Path, as_of: int) -> dict[tuple[Any, Any], int]:
    """The contents as of ``as_of``, summed here from the raw updates (no consolidation of
    the engine's involved)."""
    scan = distributed.describe(str(root), "c").snapshot(as_of)
    return _sums(list(distributed.read_task(scan.task())))


@pytest.mark.parametrize("kind", ["int", "float", "string"])
def test_a_plan_and_its_residuals_give_the_snapshot(tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng(5)
    types = {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}
    ix = _engine(tmp_path)
    ix.register("c", types[kind], pa.int64())
    for t in range(4):
        n = 3000
        ints = rng.integers(-300, 300, n)
        if kind == "int":
            keys = pa.array(ints)
        elif kind == "float":
            f = ints.astype(np.float64) / 7
            f[rng.random(n) < 0.02] = np.nan
            keys = pa.array(f, mask=rng.random(n) < 0.02)
        else:
            keys = pa.array([f"k{i:+04d}é" for i in ints], mask=rng.random(n) < 0.02)
        ix.write({"c": _updates(rng, n, t, keys)})
        ix.seal("c", t + 1)
    for as_of in (1, 3):
        want = _client(tmp_path, as_of)
        scan = distributed.describe(str(tmp_path), "c").snapshot(as_of)
        plan = distributed.plan_native(scan, consolidated=True, n=4)
        assert len(plan.files) > 1  # key ranges, with bounds to push down
        assert all(f.residual.consolidate and f.residual.as_of == as_of for f in plan.files)
        assert sum(1 for f in plan.files if f.residual.keys and f.residual.keys.nulls) <= 1
        assert _sums(_read(plan)) == want
        raw = distributed.plan_native(scan, consolidated=False)
        assert [f.residual for f in raw.files] == [distributed.Residual(as_of, None, False)]
        assert _sums(_read(raw)) == want
        none = distributed.plan_native(scan, files=False)
        assert not none.files
        assert _sums(_read(none)) == want


def test_key_bounds_say_when_they_are_not_exact(tmp_path: Path) -> None:
    """A bound with no literal of the key's type (a truncated string bound that is not UTF-8)
    is left out, and the piece says it is inexact: the reader reads more, the engine cuts."""
    url = str(tmp_path)
    with persist.open(url) as client:
        client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
    with pytest.raises(persist.InvalidUsage, match="nothing sealed"):
        distributed.read_native(url, "c", lambda plan: plan)
    with persist.open(url) as client:
        w, _ = client.create_or_load("c", key_type=pa.string(), value_type=pa.int64())
        w.append([(("a", 1), 0, 1)], upper=1).result()
    t = distributed.describe(url, "c").snapshot(0).task(consolidated=True)
    for lo, hi, want in (
        (b"b", b"d", distributed.KeyBounds("b", "d", nulls=False, exact=True)),
        (b"\xff\xfe", None, distributed.KeyBounds(None, None, nulls=True, exact=False)),
        (None, b"\xc3", distributed.KeyBounds(None, None, nulls=False, exact=False)),
        (b"a", None, distributed.KeyBounds("a", None, nulls=True, exact=True)),
    ):
        ranged = msgspec.structs.replace(t, key_range=split.KeyRange(lo, hi))
        assert distributed.key_bounds(ranged) == want
    assert distributed.key_bounds(t) is None


def test_the_as_of_time_must_fit_a_signed_long(tmp_path: Path) -> None:
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    ix.seal("c", (1 << 63) + 1)
    scan = distributed.describe(str(tmp_path), "c").snapshot(1 << 63)
    with pytest.raises(persist.InvalidUsage, match="does not fit a signed 64-bit time"):
        distributed.plan_native(scan)


# -- the fast path: parts that need no consolidation ----------------------------------------


def _compacted(root: Path, rng: np.random.Generator) -> Engine:
    """Four times of int-keyed updates compacted into key-disjoint consolidated parts at one
    time (3), several of them."""
    ix = _engine(root)
    ix.register("c", pa.int64(), pa.int64())
    for t in range(4):
        ix.write({"c": _updates(rng, 4000, t, pa.array(rng.integers(0, 5000, 4000)))})
    ix.seal("c", 4)
    ix.allow_compaction("c", 3)
    ix.maintain()
    return ix


def test_key_disjoint_consolidated_parts_at_one_time_are_read_without_summing(
        tmp_path: Path) -> None:
    ix = _compacted(tmp_path, np.random.default_rng(8))
    parts = ix.state.collections["c"].parts
    assert len(parts) > 2
    assert all(p.consolidated and p.min_time == p.max_time == 3 for p in parts)
    scan = distributed.describe(str(tmp_path), "c").snapshot(3)
    assert distributed.settled(scan)
    plan = distributed.plan_native(scan, consolidated=True, n=4)
    assert [f.residual for f in plan.files] == [distributed.Residual(3, None, False)]
    got = _read(plan)
    assert _sums(got) == _client(tmp_path, 3)
    # no (key, value) twice, no zero: already the contents
    rows = pa.concat_tables(got)
    assert len(rows) == len(_sums(got))
    assert pc.all(pc.not_equal(rows.column("diff"), 0)).as_py()


def test_overlapping_or_multi_time_parts_are_summed(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    ix = _compacted(tmp_path, rng)
    # one more part at time 4 whose keys overlap the base: not settled as of 4, still as of 3
    ix.write({"c": _updates(rng, 50, 4, pa.array(rng.integers(0, 5000, 50)))})
    ix.seal("c", 5)
    info = distributed.describe(str(tmp_path), "c")
    assert distributed.settled(info.snapshot(3))
    assert not distributed.settled(info.snapshot(4))
    plan = distributed.plan_native(info.snapshot(4), consolidated=True)
    # a base with a small run on top: the base's files raw, the run applied by key
    lay = info.snapshot(4).layers
    assert distributed.layered(lay)
    (piece,) = plan.files
    assert piece.runs is not None
    assert {p.id for p in piece.runs.parts} == {p.id for p in lay.runs}
    assert piece.residual == distributed.Residual(4, None, False)
    assert plan.tasks == ()
    assert _sums(_read(plan)) == _client(tmp_path, 4)
    # runs beyond RUNS_SHARE of the base: every row summed by key range
    ix.write({"c": _updates(rng, 8000, 5, pa.array(rng.integers(0, 5000, 8000)))})
    ix.seal("c", 6)
    info = distributed.describe(str(tmp_path), "c")
    assert not distributed.layered(info.snapshot(5).layers)
    plan = distributed.plan_native(info.snapshot(5), consolidated=True)
    assert all(f.residual.consolidate and f.runs is None for f in plan.files)
    assert _sums(_read(plan)) == _client(tmp_path, 5)


def _part(i: int, keys: pa.Array, *, budget: int = 1024, time: int = 1) -> PartMeta:
    t = pa.table({"key": keys, "value": pa.array([0] * len(keys), pa.int64())})
    return PartMeta(id=f"p{i}", rows=len(keys), nbytes=1, min_time=time, max_time=time,
                    consolidated=True, blob_key=f"data/p{i}",
                    stats=stats.compute(t, [len(keys)], budget))


def _points(keys: list[Any]) -> set[Any]:
    """The points of the key order ``keys`` occupy: NaN one point, null one, -0.0 = 0.0."""
    out: set[Any] = set()
    for k in keys:
        if k is None:
            out.add("null")
        elif isinstance(k, float) and math.isnan(k):
            out.add("nan")
        else:
            out.add(k + 0.0 if isinstance(k, float) else k)
    return out


_floats = st.one_of(st.none(), st.floats(allow_nan=True, width=64),
                    st.sampled_from([0.0, -0.0, 1.0, -1.0]))
_strings = st.one_of(st.none(), st.text(max_size=40),
                     st.sampled_from(["a" * 40, "a" * 40 + "b", "\U0010ffff" * 20]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.tuples(st.just(pa.int64()), st.lists(st.lists(st.integers(-5, 5) | st.none(),
                                                      min_size=1, max_size=4),
                                             min_size=2, max_size=4)),
    st.tuples(st.just(pa.float64()), st.lists(st.lists(_floats, min_size=1, max_size=4),
                                               min_size=2, max_size=4)),
    st.tuples(st.just(pa.string()), st.lists(st.lists(_strings, min_size=1, max_size=4),
                                              min_size=2, max_size=4)),
), st.sampled_from([0, 64, 1024]))
def test_disjoint_is_never_wrong(case: tuple[pa.DataType, list[list[Any]]], budget: int
                                 ) -> None:
    """Whatever the keys and the stats budget, parts proved disjoint share no key."""
    key_type, key_lists = case
    parts = [_part(i, pa.array(ks, key_type), budget=budget) for i, ks in enumerate(key_lists)]
    if split.disjoint(parts, key_type):
        seen: set[Any] = set()
        for ks in key_lists:
            pts = _points(ks)
            assert not pts & seen, (key_lists, budget)
            seen |= pts


def test_disjoint_proves_sorted_runs_and_refuses_what_stats_cannot_prove() -> None:
    i64 = pa.int64()

    def parts(*runs: list[Any], t: pa.DataType = i64, budget: int = 1024) -> list[PartMeta]:
        return [_part(i, pa.array(r, t), budget=budget) for i, r in enumerate(runs)]

    assert split.disjoint(parts([1, 2], [3, 4], [10]), i64)
    assert split.disjoint(parts([3, 4], [1, 2]), i64)  # in any order
    assert not split.disjoint(parts([1, 3], [3, 4]), i64)  # equal bounds on both sides
    assert not split.disjoint(parts([1, 5], [2, 3]), i64)
    assert split.disjoint(parts([1, 2], [3, None]), i64)  # one part holds the nulls
    assert not split.disjoint(parts([1, None], [3, None]), i64)  # two do
    assert not split.disjoint(parts([1, 2], [3, 4], budget=0), i64)  # no bounds: unknown
    f64 = pa.float64()
    assert not split.disjoint(parts([-1.0, -0.0], [0.0, 1.0], t=f64), f64)
    assert split.disjoint(parts([-1.0, -0.5], [0.0, float("nan")], t=f64), f64)
    assert not split.disjoint(parts([float("nan")], [float("nan")], t=f64), f64)
    s = pa.string()
    assert split.disjoint(parts(["a", "b"], ["c"], t=s), s)
    # truncated bounds round outward: two long keys sharing a 32-byte prefix are not proved
    assert not split.disjoint(parts(["x" * 40 + "a"], ["x" * 40 + "b"], t=s), s)
    rec = pa.struct([("a", pa.int64())])
    one = [_part(0, pa.array([{"a": 1}], rec))]
    assert split.disjoint(one, rec)
    assert not split.disjoint([*one, _part(1, pa.array([{"a": 2}], rec))], rec)
    # settled: also one time each, at or before as_of, every part consolidated
    ok = parts([1, 2], [3, 4])
    assert split.settled(ok, 1, i64)
    assert not split.settled(ok, 0, i64)
    multi = [ok[0], PartMeta(id="m", rows=2, nbytes=1, min_time=0, max_time=1,
                             consolidated=True, blob_key="data/m", stats=ok[1].stats)]
    assert not split.settled(multi, 1, i64)
    raw = [ok[0], PartMeta(id="r", rows=2, nbytes=1, min_time=1, max_time=1,
                           blob_key="data/r", stats=ok[1].stats)]
    assert not split.settled(raw, 1, i64)


# -- one plan-retry budget ------------------------------------------------------------------


def test_a_file_gone_after_the_plan_is_planned_again_by_the_engine(tmp_path: Path) -> None:
    """The other engine's error when it lists a file that is gone is whatever it is: the
    engine learns of the missing part from its own check of the plan, and plans again."""
    rng = np.random.default_rng(4)
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    ix.write({"c": _updates(rng, 500, 0, pa.array(rng.integers(0, 100, 500)))})
    ix.seal("c", 1)
    url = str(tmp_path)
    calls: list[distributed.NativePlan] = []
    aside = tmp_path.parent / f"{tmp_path.name}-aside"

    def build(plan: distributed.NativePlan) -> str:
        calls.append(plan)
        path = Path(plan.files[0].urls[0].removeprefix("file://"))
        if len(calls) == 1:
            shutil.move(path, aside)  # GC removed it between the plan and the listing
            assert plan.missing() == (plan.file_parts[0].blob_key,)
            raise RuntimeError("[SOMETHING] the other engine's own words")
        shutil.move(aside, path)  # the newer plan no longer needs what went
        return "read"

    assert distributed.read_native(url, "c", build, consolidated=False) == "read"
    assert len(calls) == 2

    def fails(plan: distributed.NativePlan) -> str:
        raise RuntimeError("not about files")

    with pytest.raises(RuntimeError, match="not about files"):  # nothing missing: as it is
        distributed.read_native(url, "c", fails)

    def always_gone(plan: distributed.NativePlan) -> str:
        raise persist.PartMissing("gone")

    with pytest.raises(persist.PartMissing, match=r"disappearing .*\(8 plans\)"):
        distributed.read_native(url, "c", always_gone)


def test_read_task_skips_summing_settled_parts_and_reads_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's side of the fast path: a consolidated task over settled parts is read
    without consolidating (here proved by a consolidation that would fail), and answers as the
    raw updates summed; over parts that are not settled it consolidates as before."""
    from persist.indexed.read import buckets

    rng = np.random.default_rng(10)
    ix = _compacted(tmp_path, rng)
    want = _client(tmp_path, 3)
    scan = distributed.describe(str(tmp_path), "c").snapshot(3)
    real = buckets.consolidate

    def refused(*args: Any, **kwargs: Any) -> pa.Table:
        raise AssertionError("consolidate called")

    monkeypatch.setattr(buckets, "consolidate", refused)
    for n in (1, 4):
        tasks = scan.tasks(consolidated=True, n=n)
        assert len(tasks) == n
        got = [t for task in tasks for t in distributed.read_task(task)]
        assert _sums(got) == want
        assert sum(len(t) for t in got) == len(want)
        assert all(t.column("time").to_pylist() == [3] * len(t) for t in got)
    filtered = distributed.describe(str(tmp_path), "c").snapshot(
        3, filter=persist.col("key") < 2500)
    got = [t for task in filtered.tasks(consolidated=True, n=2)
           for t in distributed.read_task(task)]
    assert _sums(got) == {kv: d for kv, d in want.items() if kv[0] < 2500}
    monkeypatch.setattr(buckets, "consolidate", real)
    ix.write({"c": _updates(rng, 50, 4, pa.array(rng.integers(0, 5000, 50)))})
    ix.seal("c", 5)
    monkeypatch.setattr(buckets, "consolidate", refused)
    with pytest.raises(AssertionError, match="consolidate called"):
        list(distributed.read_task(distributed.describe(str(tmp_path), "c").snapshot(4)
                                   .task(consolidated=True)))


def test_later_rows_says_whether_a_file_holds_rows_after_as_of(tmp_path: Path) -> None:
    ix = _engine(tmp_path)
    ix.register("c", pa.int64(), pa.int64())
    rng = np.random.default_rng(30)
    n = 400
    times = np.where(np.arange(n) % 2 == 0, 0, 5).astype(np.uint64)  # one part, times 0 and 5
    ix.write({"c": pa.table({"key": pa.array(np.arange(n), pa.int64()),
                             "value": pa.array(rng.integers(0, 3, n)),
                             "time": pa.array(times), "diff": pa.array(np.ones(n, np.int64))})})
    ix.seal("c", 6)
    info = distributed.describe(str(tmp_path), "c")
    for as_of, later in ((2, True), (5, False)):
        plan = distributed.plan_native(info.snapshot(as_of), consolidated=False)
        assert plan.files
        assert plan.later_rows is later
        assert len(plan.file_parts) == 1
        assert plan.file_parts[0].max_time == 5
        got = _read(plan)
        assert sum(t.num_rows for t in got) == (n // 2 if later else n)
        if not later:  # no time filter at all: every row of the files is the answer
            files = [pq.read_table(u.removeprefix("file://")) for f in plan.files
                     for u in f.urls]
            assert sum(t.num_rows for t in files) == n
        assert _sums(got) == _client(tmp_path, as_of)
