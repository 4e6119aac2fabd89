"""Key-range splits (``persist.indexed.read.split``): every row lands in exactly one range of a plan
(NaN, -0.0, nulls and truncated string bounds included), batches a range skips never hold one
of its rows, per-range consolidation is the whole consolidation, and a sorted part split two
ways is decoded about half by each task."""

from __future__ import annotations

import decimal
import itertools
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from persist.blob.memory import MemoryBlob
from persist.errors import InvalidUsage
from persist.indexed.format import columnar, stats
from persist.indexed.format.meta import CollectionMeta, PartMeta
from persist.indexed.format.write import new_part
from persist.indexed.read import split
from persist.indexed.read.parts import PartReader
from persist.indexed.read.split import KeyRange
from tests.support.legacy import legacy_part

AS_OF = 3

# -- keys, as the physical values stats store (ints, floats, bytes) ------------------------------

_LONG = "x" * 20  # longer than a batch bound's 16-byte prefix: truncated bounds


def _ints() -> st.SearchStrategy[Any]:
    return st.integers(-4, 4) | st.integers(-(1 << 63), (1 << 63) - 1)


def _strings() -> st.SearchStrategy[Any]:
    chars = st.sampled_from(["", "a", "b", "é", "\uffff", "\U0001f600", _LONG, _LONG + "é"])
    return st.lists(chars, max_size=3).map("".join)


def _binaries() -> st.SearchStrategy[Any]:
    chunks = st.sampled_from([b"", b"\x00", b"a", b"\xff", b"\xff" * 17, b"\x7f\x80"])
    return st.lists(chunks, max_size=3).map(b"".join)


def _floats() -> st.SearchStrategy[Any]:
    return (st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, -2.5])
            | st.floats(allow_nan=True, width=64))


def _decimals() -> st.SearchStrategy[Any]:
    # NB: unscaled values beyond 2**64 have stats bounds clamped or unknown
    return st.integers(-3, 3) | st.integers(-(10**20) + 1, 10**20 - 1)


#: name -> (key type, physical key strategy, physical values -> Arrow array)
KEY_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int64": (pa.int64(), _ints()),
    "string": (pa.string(), _strings()),
    "large_string": (pa.large_string(), _strings()),
    "binary": (pa.binary(), _binaries()),
    "float64": (pa.float64(), _floats()),
    "date32": (pa.date32(), st.integers(-(1 << 31), (1 << 31) - 1) | st.integers(-3, 3)),
    "timestamp": (pa.timestamp("ns", tz="UTC"),
                  st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-3, 3)),
    "decimal": (pa.decimal128(20, 3), _decimals()),
}


def key_array(values: list[Any], t: pa.DataType) -> pa.Array:
    """Physical key values (None: null) as an array of ``t``."""
    if pa.types.is_date32(t):
        return pa.array(values, pa.int32()).cast(t)
    if pa.types.is_timestamp(t):
        return pa.array(values, pa.int64()).cast(t)
    if pa.types.is_decimal(t):
        return pa.array([None if v is None else decimal.Decimal(v).scaleb(
            -t.scale, decimal.Context(prec=60)) for v in values], t)
    return pa.array(values, t)


def table_of(rows: list[tuple[Any, int, int, int]], t: pa.DataType) -> pa.Table:
    keys, vals, times, diffs = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.Table.from_arrays(
        [key_array(list(keys), t), pa.array(vals, pa.int64()), pa.array(times, pa.uint64()),
         pa.array(diffs, pa.int64())], schema=columnar.part_schema(t, pa.int64()))


def collection(t: pa.DataType) -> CollectionMeta:
    return CollectionMeta(id=1, name="r", key_type=columnar.serialize_type(t),
                          value_type=columnar.serialize_type(pa.int64()))


def canon(t: pa.Table) -> list[str]:
    """The rows of ``t`` as a sorted multiset (repr tells -0.0 from 0.0 and keeps NaN)."""
    cols = []
    for c in t.column_names:
        col = t.column(c)
        # NB: physical: dates and timestamps beyond Python's range
        if pa.types.is_date32(col.type):
            col = col.cast(pa.int32())
        elif pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        cols.append(col.to_pylist())
    return sorted(repr(r) for r in zip(*cols, strict=True))


def batches_of(table: pa.Table, p: PartMeta) -> list[pa.Table]:
    s = p.stats
    assert isinstance(s, stats.PartStats)
    out, at = [], 0
    for n in s.batch_rows:
        out.append(table.slice(at, n))
        at += n
    return out


# -- the properties ------------------------------------------------------------------------------


@st.composite
def collections(draw: st.DrawFn) -> tuple[pa.DataType, list[tuple[pa.Table, bool]], Any]:
    """A key type, parts (``(table, sorted)``: mostly compaction-like sorted parts, some raw
    ones) and the strategy of its non-null keys."""
    name = draw(st.sampled_from(sorted(KEY_TYPES)))
    t, keys = KEY_TYPES[name]
    event(name)
    nullable = draw(st.sampled_from([False, False, True]))
    drawn = keys | st.none() if nullable else keys
    all_sorted = draw(st.booleans())
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        size = draw(st.sampled_from([10, 40, 150]))
        rows = draw(st.lists(st.tuples(drawn, st.integers(0, 2), st.integers(0, 3),
                                       st.integers(-2, 2)), min_size=size // 3, max_size=size))
        table = table_of(rows, t)
        consolidated = all_sorted or draw(st.booleans())
        if consolidated:
            table = columnar.consolidate(table)
        if len(table):
            parts.append((table, consolidated))
    return t, parts, keys


def written(blob: MemoryBlob, t: pa.DataType, parts: list[tuple[pa.Table, bool]],
            knobs: dict[str, int]) -> list[PartMeta]:
    """The parts stored: consolidated ones and every other unconsolidated one as persist
    writes them (sorted, format 4), the rest unsorted as an older persist did."""
    out = []
    for i, (table, consolidated) in enumerate(parts):
        if consolidated or i % 2:
            out.append(new_part(blob, collection(t), table, consolidated=consolidated, **knobs))
        else:
            out.append(legacy_part(blob, collection(t), table, batch_rows=knobs["batch_rows"],
                                   stats_bytes=knobs["stats_bytes"]))
    return out


KNOBS = st.fixed_dictionaries({
    "inline_threshold": st.sampled_from([0, 0, 0, 300]),
    "stats_bytes": st.sampled_from([0, 40, 300, 1024, 8192]),
    "batch_rows": st.sampled_from([1, 2, 3, 5, 64]),
})


def check_ranges(ranges: list[KeyRange], metas: list[PartMeta], t: pa.DataType,
                 reader: PartReader) -> None:
    """Every row in exactly one range; what a range skips holds none of its rows; a range's
    rows read through ``split.load`` are its rows of the whole part; per-range consolidation
    is the whole's."""
    schema = columnar.part_schema(t, pa.int64())
    assert ranges[0].lo is None
    assert ranges[-1].hi is None
    for a, b in itertools.pairwise(ranges):
        assert a.hi is not None
        assert a.hi == b.lo
    per_range: list[list[pa.Table]] = [[] for _ in ranges]
    wholes = []
    decoded_bytes = 0.0
    for p in metas:
        decoded_rows = 0
        whole = reader.read(p, schema)
        wholes.append(whole)
        hits = np.zeros(len(whole), dtype=np.int64)
        for i, r in enumerate(ranges):
            m = np.asarray(split.mask(whole.column("key"), r).to_numpy(zero_copy_only=False),
                           dtype=bool)
            hits += m
            if not split.part_in(p, r, t):
                assert not m.any(), (r, p.stats)
            keep = split.batches_in(p, r, t)
            if keep is not None:
                pieces = batches_of(whole, p)
                assert len(keep) == len(pieces)
                for k, piece in zip(keep, pieces, strict=True):
                    if not k:
                        assert not split.mask(piece.column("key"), r).to_numpy(
                            zero_copy_only=False).any(), (r, p.stats)
            got, decoded = split.load(reader, p, schema, r)
            assert canon(got) == canon(split.rows_in(whole, r))
            assert decoded <= p.rows
            decoded_rows += decoded
            per_range[i].append(got)
        assert (hits == 1).all(), "a row in no range or in two"
        if p.rows:
            decoded_bytes += p.nbytes / p.rows * decoded_rows
    # the planner's count of what the ranges decode is what they do decode
    assert split.decoded_bytes(metas, ranges, t) == int(decoded_bytes)
    if not wholes:
        return
    want = columnar.contents_at(pa.concat_tables(wholes), AS_OF)
    pieces = [columnar.contents_at(pa.concat_tables(ts), AS_OF) for ts in per_range]
    assert canon(pa.concat_tables(pieces)) == canon(want)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(collections(), KNOBS, st.sampled_from([2, 2, 3, 5, 1]))
def test_planned_ranges_split_every_row_exactly_once(
    c: tuple[pa.DataType, list[tuple[pa.Table, bool]], Any], knobs: dict[str, int], n: int,
) -> None:
    t, parts, _ = c
    blob = MemoryBlob()
    metas = written(blob, t, parts, knobs)
    ranges = split.plan(metas, n, t)
    event(f"plan: {'none' if ranges is None else len(ranges)}")
    if ranges is None:
        assert n > 1
        return
    assert 1 <= len(ranges) <= n
    if len(ranges) > 1:
        assert split.decoded_bytes(metas, ranges, t) <= split.MAX_AMPLIFICATION * sum(
            p.nbytes for p in metas if p.rows)
    check_ranges(ranges, metas, t, PartReader(blob))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(collections(), KNOBS, st.data())
def test_any_ranges_split_every_row_exactly_once(
    c: tuple[pa.DataType, list[tuple[pa.Table, bool]], Any], knobs: dict[str, int],
    data: st.DataObject,
) -> None:
    """Boundaries not from a plan: key values, and (bytes) truncated, non-UTF-8 prefixes."""
    t, parts, keys = c
    blob = MemoryBlob()
    metas = written(blob, t, parts, knobs)
    bound = keys.filter(lambda v: not (isinstance(v, float) and v != v))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        bound = bound.map(lambda s: s.encode()[:data.draw(st.integers(0, 24))])
    drawn = data.draw(st.lists(bound, max_size=4))
    bounds = sorted(set(drawn))
    ranges = [KeyRange(a, b) for a, b in zip([None, *bounds], [*bounds, None], strict=True)]
    check_ranges(ranges, metas, t, PartReader(blob))


# -- the order, by hand --------------------------------------------------------------------------


def test_order_of_specials_and_zeros() -> None:
    col = pa.array([None, math.nan, -0.0, 0.0, -math.inf, math.inf, 1.0], pa.float64())
    ranges = [KeyRange(None, 0.0), KeyRange(0.0, math.inf), KeyRange(math.inf, None)]
    got = [split.mask(col, r).to_pylist() for r in ranges]
    assert got == [
        [False, False, False, False, True, False, False],
        [False, False, True, True, False, False, True],  # -0.0 and 0.0 together
        [True, True, False, False, False, True, False],  # inf, then NaN, then null
    ]
    strings = pa.array(["a", "é", "\uffff", None], pa.string())
    # b"\xc3" is a truncated "é": no string, still a boundary between "a" and "é"
    assert split.mask(strings, KeyRange(None, b"\xc3")).to_pylist() == [True, False, False,
                                                                         False]
    assert split.mask(strings, KeyRange(b"\xc3", None)).to_pylist() == [False, True, True, True]


def test_key_range_refuses_nan_and_empty_ranges() -> None:
    with pytest.raises(InvalidUsage):
        KeyRange(math.nan, None)
    with pytest.raises(InvalidUsage):
        KeyRange(3, 3)
    with pytest.raises(InvalidUsage):
        KeyRange(b"b", b"a")
    assert KeyRange().whole


def test_unsplittable_keys_and_trivial_plans() -> None:
    blob = MemoryBlob()
    t = pa.struct([("a", pa.int64())])
    assert not split.splittable(t)
    assert split.plan([], 2, t) is None
    assert split.plan([], 2, pa.list_(pa.int64())) is None
    assert split.plan([], 1, pa.int64()) == [KeyRange()]
    with pytest.raises(InvalidUsage):
        split.plan([], 0, pa.int64())
    with pytest.raises(InvalidUsage):
        split.mask(pa.array([{"a": 1}], t), KeyRange(None, 1))
    # no stats at all: nothing to choose boundaries from
    table = table_of([(k, 0, 0, 1) for k in range(1000)], pa.int64())
    p = new_part(blob, collection(pa.int64()), table, consolidated=True, inline_threshold=0,
                 stats_bytes=0)
    assert split.plan([p], 2, pa.int64()) == [KeyRange()]
    # unsorted parts (an older persist's) whose every batch spans every key: no range could
    # skip anything
    rng = np.random.default_rng(1)
    table = table_of([(int(k), 0, 0, 1) for k in rng.permutation(1000)], pa.int64())
    p = legacy_part(blob, collection(pa.int64()), table, batch_rows=100)
    assert split.plan([p], 2, pa.int64()) == [KeyRange()]


def test_key_disjoint_parts_without_batch_stats_split_by_part() -> None:
    """Compaction output with long string keys: part-level bounds only, still one part per
    task."""
    blob = MemoryBlob()
    t = pa.string()
    metas = []
    for prefix in ("a", "m"):
        rows = [(f"{prefix}{i:030d}", 0, 0, 1) for i in range(2000)]
        metas.append(new_part(blob, collection(t), table_of(rows, t), consolidated=True,
                              inline_threshold=0, batch_rows=100, stats_bytes=200, full=True))
    for p in metas:
        assert isinstance(p.stats, stats.PartStats)
        assert not p.stats.batch_rows
    ranges = split.plan(metas, 2, t)
    assert ranges is not None
    assert len(ranges) == 2
    assert [split.part_in(p, ranges[0], t) for p in metas] == [True, False]
    assert [split.part_in(p, ranges[1], t) for p in metas] == [False, True]


def test_sorted_float_part_with_nan_recovers_batch_uppers() -> None:
    """A NaN drops every batch upper bound of a float key; a sorted part's next lower bound
    stands in, so a range below the NaN still skips the upper half."""
    blob = MemoryBlob()
    t = pa.float64()
    rows = [(float(i), 0, 0, 1) for i in range(1000)] + [(math.nan, 0, 0, 1)]
    table = columnar.consolidate(table_of(rows, t))
    p = new_part(blob, collection(t), table, consolidated=True, inline_threshold=0,
                 batch_rows=100)
    assert isinstance(p.stats, stats.PartStats)
    assert all(hi is None for b in p.stats.batches if b.path == "key" for hi in b.hi)
    ranges = [KeyRange(None, 500.0), KeyRange(500.0, None)]
    keep = split.batches_in(p, ranges[0], t)
    # 500.0 starts batch 5, so batch 4 ends below it; batch 10 holds only the NaN (no bounds)
    assert keep == [True] * 5 + [False] * 5 + [True]
    # the last range holds the NaN, which a sort puts at one end: it reads its own batches
    # (from the boundary batch 4 on) and the ends of the part (batch 0 too)
    assert split.batches_in(p, ranges[1], t) == [True] + [False] * 3 + [True] * 7
    check_ranges(ranges, [p], t, PartReader(blob))
    planned = split.plan([p], 2, t)
    assert planned is not None
    check_ranges(planned, [p], t, PartReader(blob))


def test_a_sorted_million_row_part_splits_in_half() -> None:
    """Each of two tasks decodes at most half the batches and one boundary batch, and gets
    about half the rows."""
    blob = MemoryBlob()
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(-(1 << 62), 1 << 62, 1_050_000))[:1_000_000]
    n = len(keys)
    table = pa.Table.from_arrays(
        [pa.array(keys), pa.array(rng.integers(0, 1000, n)), pa.array(np.zeros(n, np.uint64)),
         pa.array(np.ones(n, np.int64))], schema=columnar.part_schema(pa.int64(), pa.int64()))
    p = new_part(blob, collection(pa.int64()), table, consolidated=True, inline_threshold=0)
    assert isinstance(p.stats, stats.PartStats)
    batches = len(p.stats.batch_rows)
    assert batches == math.ceil(n / columnar.BATCH_ROWS)
    ranges = split.plan([p], 2, pa.int64())
    assert ranges is not None
    assert len(ranges) == 2
    reader = PartReader(blob, cache_bytes=0)
    schema = table.schema
    got = []
    for r in ranges:
        keep = split.batches_in(p, r, pa.int64())
        assert keep is not None
        assert sum(keep) <= math.ceil(batches / 2) + 1
        rows, decoded = split.load(reader, p, schema, r)
        assert decoded <= n // 2 + 2 * columnar.BATCH_ROWS
        assert abs(len(rows) - n / 2) <= columnar.BATCH_ROWS
        got.append(rows)
    assert sum(len(g) for g in got) == n
    assert pa.concat_tables(got).column("key").equals(table.column("key"))
