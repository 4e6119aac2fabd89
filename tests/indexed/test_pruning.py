"""Pruned reads: a filtered snapshot returns exactly the matching rows of the unfiltered one
(random nested records and filters, with the audit on, through compaction, reopen and a
replica), actually skips parts and record batches, trims string bounds safely, and compaction
cuts its output into bounded, key-disjoint parts without re-merging them forever."""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import persist
from persist.blob.file import FileBlob
from persist.errors import Corruption, InvalidUsage
from persist.indexed.engine import Options, Txn
from persist.indexed.format import columnar, stats
from persist.indexed.format.meta import AddPart, PartMeta
from persist.indexed.format.write import new_part
from persist.indexed.maintenance import compact
from persist.indexed.maintenance.compact import CompactionPolicy
from persist.indexed.read.filter import Filter, col
from tests.indexed.test_filter import filters, model
from tests.indexed.test_records import arrow_types, canon, collections, values, written
from tests.support.engine import Engine
from tests.support.recording import RecordingBlob

# -- pruned == unpruned, filtered ----------------------------------------------------------------


def rows_of(t: pa.Table) -> list[Any]:
    return [tuple(canon(x) for x in r.values()) for r in t.to_pylist()]


def check_filtered(ix: Engine, f: Filter, as_of: int) -> None:
    """The filtered snapshot is the unfiltered one, filtered in Python; and its raw batches
    consolidate to it."""
    whole = ix.snapshot("r", as_of).to_arrow()
    want = [r for r in rows_of(whole)]
    keep = [model(f, r) is True for r in whole.to_pylist()]
    want = [r for r, k in zip(want, keep, strict=True) if k]
    snap = ix.snapshot("r", as_of, filter=f)
    assert rows_of(snap.to_arrow()) == want, f
    counts = snap.pruning
    assert counts is not None
    event(f"parts pruned: {'some' if counts.parts_pruned else 'none'}")
    event(f"batches skipped: {'some' if counts.batches_skipped else 'none'}")
    raw = list(ix.snapshot("r", as_of, filter=f).batches())
    if raw:
        again = columnar.contents_at(pa.concat_tables(raw), as_of)
        assert rows_of(again) == want


SETTINGS = st.fixed_dictionaries({
    "inline_threshold": st.sampled_from([0, 0, 300]),
    "stats_bytes": st.sampled_from([0, 60, 300, 1024]),
    "batch_rows": st.sampled_from([1, 2, 3, 1 << 16]),
    "part_target_bytes": st.sampled_from([1, 150, 64 << 20]),
})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), collections(), SETTINGS)
def test_pruned_reads_are_the_unpruned_reads_filtered(
    data: st.DataObject, c: tuple[pa.DataType, pa.DataType, list[Any]], knobs: dict[str, Any],
) -> None:
    kt, vt, rows = c
    fs = [data.draw(filters(kt, vt)) for _ in range(3)]
    keys = [k for (k, _), _, _ in rows if isinstance(k, (int, str))]
    if keys and kt in (pa.int64(), pa.string()):
        # and a key range: what sorted (compacted) parts and their batches prune best
        lo, hi = sorted(data.draw(st.lists(st.sampled_from(keys), min_size=2, max_size=2)))
        fs.append((col("key") >= lo) & (col("key") <= hi))
    opts = Options(inline_threshold=knobs["inline_threshold"], stats_bytes=knobs["stats_bytes"],
                   batch_rows=knobs["batch_rows"], rollup_every=3, audit_pruning=True,
                   compaction=CompactionPolicy(fanin=2, inline_flush_bytes=600,
                                               part_target_bytes=knobs["part_target_bytes"]))
    with tempfile.TemporaryDirectory() as d:
        loc = Path(d)
        ix = written(loc, kt, vt, rows, opts)
        for f in fs:
            for as_of in range(4):
                check_filtered(ix, f, as_of)
        ix.allow_compaction("r", 2)
        ix.maintain()
        for f in fs:
            check_filtered(ix, f, 2)
            check_filtered(ix, f, 3)
        again = Engine.open(FileBlob(loc), epoch=2, writer="w2", options=opts)
        replica = Engine.open(FileBlob(loc).read_only(), options=opts)
        for f in fs:
            check_filtered(again, f, 3)
            check_filtered(replica, f, 2)


@st.composite
def keyed_collections(draw: st.DrawFn) -> tuple[pa.DataType, pa.DataType, list[Any]]:
    """An int64 or string key from a wide range (so parts and batches cover distinct key
    ranges) and a random value type; up to 80 rows over times 0-3."""
    kt = draw(st.sampled_from([pa.int64(), pa.string()]))
    vt = draw(arrow_types(2))
    keys = st.integers(-40, 40) if kt == pa.int64() else st.text("abcé\U0010ffff", max_size=3)
    vals = draw(st.lists(values(vt), min_size=1, max_size=6))
    rows = draw(st.lists(st.tuples(st.none() | keys, st.sampled_from(vals), st.integers(0, 3),
                                   st.sampled_from([1, -1, 2])), max_size=80))
    return kt, vt, [((k, v), t, d) for k, v, t, d in rows]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), keyed_collections(), SETTINGS)
def test_pruned_reads_of_wide_key_ranges(
    data: st.DataObject, c: tuple[pa.DataType, pa.DataType, list[Any]], knobs: dict[str, Any],
) -> None:
    """The same property where pruning has more to do: many distinct keys, sorted parts."""
    test_pruned_reads_are_the_unpruned_reads_filtered.hypothesis.inner_test(  # type: ignore[attr-defined]
        data, c, knobs)


# -- pruning skips ---------------------------------------------------------------------------------


def pinned(**kw: Any) -> Options:
    """Options with every knob these tests count by pinned (whatever the session's knob set):
    stats of the default budget, 64 Ki-row batches, default merging; ``kw`` on top (a
    ``compaction`` given as a dict of policy fields)."""
    policy = {"fanin": 4, "final_rows": 1 << 19, "inline_flush_bytes": 1 << 20,
              "part_target_bytes": 64 << 20, **kw.pop("compaction", {})}
    base: dict[str, Any] = {"inline_threshold": 0, "stats_bytes": 1024, "batch_rows": 1 << 16,
                            "audit_pruning": True, "background_compaction": False}
    return Options(**{**base, **kw}, compaction=CompactionPolicy(**policy))


VT = pa.struct([("amount", pa.int64()), ("city", pa.string())])


def bulk(n: int, t: int, start: int = 0) -> pa.Table:
    keys = np.arange(start, start + n, dtype=np.int64)
    cities = pa.array(["Oslo", "Bergen", "Tromsø"])
    value = pa.StructArray.from_arrays(
        [pa.array(keys * 10), cities.take(pa.array(keys % 3))], fields=list(VT))
    return pa.table({"key": keys, "value": value, "time": np.full(n, t, dtype=np.uint64),
                     "diff": np.ones(n, dtype=np.int64)})


def test_a_key_range_read_fetches_only_the_parts_that_hold_it(tmp_path: Path) -> None:
    store = RecordingBlob(FileBlob(tmp_path))
    opts = pinned(audit_pruning=False, compaction={"part_target_bytes": 64 << 10})
    ix = Engine.open(store, epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), VT)
    for t in range(4):
        ix.write({"r": bulk(20_000, t, start=t * 20_000)})
        ix.seal("r", t + 1)
    ix.maintain()
    parts = ix.state.collections["r"].parts
    assert len(parts) > 20  # 80,000 rows of ~40 bytes cut into 64 KiB parts
    f = (col("key") >= 41_000) & (col("key") < 41_010)
    store.reset()
    snap = ix.snapshot("r", 3, filter=f)
    got = snap.to_arrow()
    assert got.column("key").to_pylist() == list(range(41_000, 41_010))
    assert snap.pruning is not None
    assert snap.pruning.parts_read == len(store.keys_read("data/")) <= 2
    assert snap.pruning.parts_pruned == len(parts) - snap.pruning.parts_read
    # a filter on a value field prunes by its bounds too
    store.reset()
    snap = ix.snapshot("r", 3, filter=col("value.amount") > 799_000)
    assert snap.to_arrow().column("key").to_pylist() == list(range(79_901, 80_000))
    assert snap.pruning is not None
    assert len(store.keys_read("data/")) <= snap.pruning.parts_read <= 2  # (read parts are cached)
    # nothing to prune: everything is read, and the answer is the same
    snap = ix.snapshot("r", 3, filter=col("value.city") == "Bergen")
    assert len(snap.to_arrow()) == len([k for k in range(80_000) if k % 3 == 1])
    assert snap.pruning is not None
    assert (snap.pruning.parts_read, snap.pruning.parts_pruned) == (len(parts), 0)


def test_record_batches_that_cannot_match_are_not_decoded(tmp_path: Path) -> None:
    opts = pinned(batch_rows=1000)
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), VT)
    ix.write({"r": bulk(10_000, 0)})  # one part of ten 1,000-row batches, keys in order
    ix.seal("r", 1)
    (part,) = ix.state.collections["r"].parts
    assert isinstance(part.stats, stats.PartStats)
    assert part.stats.batch_rows == (1000,) * 10
    snap = ix.snapshot("r", 0, filter=col("key").isin([2500, 2501, 7777]))
    assert snap.to_arrow().column("key").to_pylist() == [2500, 2501, 7777]
    assert snap.pruning is not None
    assert (snap.pruning.parts_read, snap.pruning.batches_read,
            snap.pruning.batches_skipped) == (1, 2, 8)
    # the raw path prunes the same way
    snap = ix.snapshot("r", 0, filter=col("key") < 1500)
    assert sum(len(b) for b in snap.batches()) == 1500
    assert snap.pruning is not None
    assert snap.pruning.batches_skipped == 8


def test_the_audit_catches_stats_that_lie(tmp_path: Path) -> None:
    """A part whose stats do not describe its data: without the audit the read believes them
    (and silently misses a row); with it, the read fails loudly naming the part."""
    opts = pinned(audit_pruning=False)
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    c = ix.register("r", pa.int64(), pa.int64())
    table = columnar.from_updates([((k, k), 0, 1) for k in range(10)], columnar.part_schema(
        pa.int64(), pa.int64()), columnar.Codec(pa.int64()), columnar.Codec(pa.int64()))
    part = new_part(ix.blob, c, table, inline_threshold=0, consolidated=False)
    assert isinstance(part.stats, stats.PartStats)
    lie = msgspec.structs.replace(part.stats, leaves=(stats.LeafStats("key", 0, 0, 100, 200),))
    txn = Txn(ix.state)
    txn.stage(AddPart(name="r", part=msgspec.structs.replace(part, stats=lie)))
    ix.commit(txn)
    ix.seal("r", 1)
    assert ix.snapshot("r", 0, filter=col("key") == 3).to_python() == []  # believed
    ix.set_options(pinned(audit_pruning=True))
    with pytest.raises(Corruption, match="pruning skipped the part, but it holds a row"):
        ix.snapshot("r", 0, filter=col("key") == 3).to_arrow()
    assert ix.snapshot("r", 0, filter=col("key") == 300).to_python() == []  # a true prune


def test_parts_without_stats_are_read(tmp_path: Path) -> None:
    opts = pinned(stats_bytes=0)
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), VT)
    ix.write({"r": bulk(100, 0)})
    ix.seal("r", 1)
    # NB: a Parquet part's stats then hold only its tail checksum, no field entries
    parts = ix.state.collections["r"].parts
    assert all(not isinstance(p.stats, msgspec.UnsetType) and p.stats.leaves == ()
               and p.stats.tail is not None for p in parts)
    snap = ix.snapshot("r", 0, filter=col("key") == 5)
    assert snap.to_arrow().column("key").to_pylist() == [5]
    assert snap.pruning is not None
    assert snap.pruning.parts_pruned == 0


def test_a_client_prunes_and_audits(tmp_path: Path) -> None:
    opts = Options(inline_threshold=0, stats_bytes=1024, batch_rows=1 << 16)
    with persist.open(str(tmp_path), options=opts) as client:
        assert client.options.audit_pruning  # the suite's base options (tests/knobs.py)
        w, r = client.create_or_load("r", key_type=pa.int64(), value_type=VT)
        for t in range(3):
            w.append(bulk(1000, t, start=t * 1000), upper=t + 1).result()
        snap = r.snapshot(2, filter=col("key") >= 2990)
        assert [k for (k, _), _, _ in snap.to_python()] == list(range(2990, 3000))
        assert snap.pruning is not None
        assert snap.pruning.parts_pruned >= 1


# -- string bounds ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=12) | st.sampled_from([b"\xff" * 9, b"a\xff\xff\xff",
                                                           b"\xff\xfe\xff"]),
                min_size=1, max_size=8),
       st.integers(0, 10))
def test_trimmed_string_bounds_enclose_every_value(vals: list[bytes], prefix: int) -> None:
    lo, hi = min(vals), max(vals)
    tlo, thi = stats._lower(lo, prefix), stats._upper(hi, prefix)
    assert isinstance(tlo, bytes)
    assert len(tlo) <= prefix
    assert tlo <= lo
    if thi is None:  # only when the prefix is all 0xFF: nothing short is above it
        assert len(hi) > prefix
        assert hi[:prefix] == b"\xff" * prefix
    else:
        assert isinstance(thi, bytes)
        assert thi >= hi
        assert len(thi) <= max(prefix, len(hi))


def test_long_strings_prune_by_their_prefix_and_match_exactly(tmp_path: Path) -> None:
    stem = "x" * 40  # longer than a part's string prefix (32 bytes)
    vt = pa.string()
    opts = pinned()
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), vt)
    ix.write({"r": [((1, stem + "a"), 0, 1), ((2, stem + "m"), 0, 1)]})
    ix.write({"r": [((3, "\U0010ffff" * 10 + "z"), 0, 1), ((4, "é"), 0, 1)]})
    ix.seal("r", 1)
    p1, _p2 = ix.state.collections["r"].parts
    assert isinstance(p1.stats, stats.PartStats)
    leaf = p1.stats.leaves[1]
    assert leaf.lo == stem.encode()[:32]
    assert leaf.hi == stem.encode()[:31] + b"y"  # the prefix, last byte incremented
    for f, want in [(col("value") == stem + "m", [2]), (col("value") > stem + "b", [2, 3, 4]),
                    (col("value") < stem, []), (col("value") >= "\U0010ffff", [3]),
                    (col("value") <= stem + "a", [1])]:
        got = [k for (k, _), _, _ in ix.snapshot("r", 0, filter=f).to_python()]
        assert got == want, f


# -- bounded, key-ordered compaction output -------------------------------------------------------


def test_compaction_cuts_key_disjoint_parts_of_the_target_size(tmp_path: Path) -> None:
    target = 20_000
    opts = pinned(compaction={"fanin": 2, "part_target_bytes": target})
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), pa.int64())
    # keys 0..499, each written 8 times (8 values) in interleaved order: a key's 8 rows must
    # land in one part. At time 1, past the since (0): tiered runs, not a base (test_base.py)
    rows = [((k, v), 1, 1) for v in range(8) for k in range(500)]
    for i in range(0, len(rows), 1000):
        ix.write({"r": rows[i:i + 1000]})
    ix.seal("r", 2)
    before = ix.snapshot("r", 1).to_arrow()
    ix.maintain()
    parts = ix.state.collections["r"].parts
    assert len(parts) > 3
    schema = columnar.part_schema(pa.int64(), pa.int64())
    tables = [ix.reader.read(p, schema) for p in parts]
    full = [t for p, t in zip(parts, tables, strict=True) if p.full is True]
    assert len(full) == len(parts) - 1
    row_bytes = before.nbytes / len(before)
    for t in full:  # at least the target, and at most one key (8 rows) more
        # NB: by rows: a decoded part may carry validity bitmaps the merged table had not
        size = len(t) * row_bytes
        assert target <= size + row_bytes <= target + 9 * row_bytes
    ranges = sorted((t.column("key")[0].as_py(), t.column("key")[-1].as_py()) for t in tables)
    for (_, hi), (lo, _) in itertools.pairwise(ranges):
        assert hi < lo  # disjoint: no key in two parts
    assert sum(len(t) for t in tables) == 4000
    assert rows_of(ix.snapshot("r", 1).to_arrow()) == rows_of(before)


def test_split_output_is_never_merged_again(tmp_path: Path) -> None:
    """The planner terminates: after any number of small appends, merging until nothing is
    planned takes a bounded number of rounds, never tiers a full part, and each merge leaves
    fewer runs that can be tiered (the rows at the since, 0, join the base instead)."""
    opts = pinned(compaction={"fanin": 2, "part_target_bytes": 600})
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), pa.int64())
    policy = opts.compaction
    for t in range(60):
        ix.write({"r": [((t * 7 + i, t), t, 1) for i in range(7)]})
        ix.seal("r", t + 1)
        rounds = 0
        def tierable() -> list[PartMeta]:
            return [p for p in compact.layout(ix.state.collections["r"], 0)[1]
                    if p.full is not True]

        while chosen := compact.plan(ix.state.collections["r"], policy):
            assert all(p.full is not True for p in chosen if p.max_time > 0)
            mergeable = tierable()
            txn = Txn(ix.state)
            txn.stage(ix.run_compaction(ix.state, "r", chosen))
            ix.commit(txn)
            after = tierable()
            assert len(after) < len(mergeable)
            rounds += 1
            assert rounds < 20
    parts = ix.state.collections["r"].parts
    assert sum(1 for p in parts if p.full is True) > 10
    got = ix.snapshot("r", 59).to_arrow()
    assert got.column("key").to_pylist() == list(range(420))


def test_split_by_key_keeps_tied_keys_together() -> None:
    """-0.0 and 0.0 (and NaNs) sort as ties; a cut never falls between tied keys."""
    keys = pa.array([-1.0, -0.0, 0.0, -0.0, 0.0, math.nan, math.nan, 2.0])
    t = pa.table({"key": keys, "value": pa.array(range(8)),
                  "time": pa.array([0] * 8, pa.uint64()), "diff": pa.array([1] * 8)})
    assert compact.key_starts(t.column("key")).tolist() == [1, 5, 7]
    pieces = compact.split_by_key(t, 1)
    assert [len(p) for p in pieces] == [1, 4, 2, 1]
    assert compact.split_by_key(t, None) == [t]
    assert compact.split_by_key(t.slice(0, 0), 1) == []


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"stats_bytes": -1}, {"stats_bytes": (64 << 10) + 1},
                                 {"batch_rows": 0}, {"audit_pruning": 1},
                                 {"stats_bytes": 1.5}])
def test_bad_pruning_options_are_invalid_usage(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidUsage, match=next(iter(bad))):
        Options(**bad)


@pytest.mark.parametrize("bad", [0, -5, 1.0, True])
def test_a_bad_part_target_is_invalid_usage(bad: Any) -> None:
    with pytest.raises(InvalidUsage, match="part_target_bytes"):
        CompactionPolicy(part_target_bytes=bad)


# -- parts written under older schema versions ---------------------------------------------------


def test_stats_of_older_schema_versions_are_used_only_where_values_survive(
        tmp_path: Path) -> None:
    """A field dropped and added again is a new field: the old part's stats of its namesake
    must not prune (its rows read as null now); a widened field keeps its values, so its old
    stats still prune."""
    v0 = pa.struct([("a", pa.int64()), ("c", pa.int32())])
    v1 = pa.struct([("c", pa.int64())])                              # a dropped, c widened
    v2 = pa.struct([("c", pa.int64()), ("a", pa.string())])          # a new field named a
    opts = pinned()
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=opts)
    ix.fence()
    ix.register("r", pa.int64(), v0)
    ix.write({"r": [((k, {"a": k, "c": k}), 0, 1) for k in range(10)]})
    ix.seal("r", 1)
    ix.evolve_schema("r", value_type=v1)
    ix.evolve_schema("r", value_type=v2)
    ix.write({"r": [((k, {"c": k, "a": "x"}), 1, 1) for k in range(10, 15)]})
    ix.seal("r", 2)

    def keys(f: Filter, schema_id: int | None = None) -> tuple[list[int], Any]:
        snap = ix.snapshot("r", 1, filter=f, schema_id=schema_id)
        return [r["key"] for r in snap.to_arrow().to_pylist()], snap.pruning

    got, counts = keys(col("value.a").is_null())
    assert got == list(range(10))           # the old a is gone: null, not its old values
    assert counts.parts_pruned == 1         # the new part has no null a
    got, counts = keys(col("value.a") == "x")
    assert got == list(range(10, 15))
    assert counts.parts_pruned == 1         # the old part: a is null in every migrated row
    got, counts = keys(col("value.c") >= 12)
    assert got == [12, 13, 14]
    assert counts.parts_pruned == 1         # the old part's stats of c (int32) still hold
    # read as version 0, where a is an int64: dropping a took its values from every reader,
    # so both parts read a as null, and neither needs fetching to know it
    got, counts = keys(col("value.a") < 3, schema_id=0)
    assert got == []
    assert counts.parts_pruned == 2
    got, counts = keys(col("value.a").is_null() & (col("value.c") < 3), schema_id=0)
    assert got == [0, 1, 2]
    assert counts.parts_pruned == 1


def test_batch_stats_that_do_not_describe_the_batches(tmp_path: Path) -> None:
    """Batch stats that do not add up to the part are ignored (the part is read whole); ones
    that add up but place the batches wrongly are Corruption, never a wrong answer."""
    ix = Engine.open(FileBlob(tmp_path), epoch=1, writer="w", options=pinned(batch_rows=1000))
    ix.fence()
    for name, fails in (("short", False), ("shifted", True)):
        c = ix.register(name, pa.int64(), VT)
        part = new_part(ix.blob, c, ix.normalize(name, bulk(10_000, 0)), inline_threshold=0,
                        consolidated=False, batch_rows=1000)
        assert isinstance(part.stats, stats.PartStats)
        sizes = (1000,) * 9 if name == "short" else (999, 1001, *(1000,) * 8)
        bad = msgspec.structs.replace(part.stats, batch_rows=sizes)
        txn = Txn(ix.state)
        txn.stage(AddPart(name=name, part=msgspec.structs.replace(part, stats=bad)))
        ix.commit(txn)
        ix.seal(name, 1)
        for cached in (False, True):
            reader = ix.reader if cached else Engine.open(FileBlob(tmp_path)).reader
            if cached:
                ix.snapshot(name, 0).to_arrow()  # the part is now in the engine's cache
            snap = ix.snapshot(name, 0, filter=col("key") == 5, reader=reader, audit=False)
            if fails:
                with pytest.raises(Corruption, match="stats say"):
                    snap.to_arrow()
            else:
                assert snap.to_arrow().column("key").to_pylist() == [5]
                assert snap.pruning is not None
                assert snap.pruning.batches_skipped == 0
