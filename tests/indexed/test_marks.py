"""Marks (``persist.indexed.read.marks``, DESIGN.md §11a *Marks*): a compacted base minus the
positions of the rows the runs supersede, plus the delta, is exactly the consolidated contents
at every as-of time the runs are cut at, against a model (``columnar.contents_at`` of every
row), for int64 and float64 keys with null keys, NaNs of other payloads, ``-0.0`` against
``0.0``, and retractions that cancel base rows."""

from __future__ import annotations

import itertools
import struct
from collections import Counter
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings

from persist import InvalidUsage
from persist.indexed.format import columnar
from persist.indexed.read import marks as marks_mod

T0 = 10


def _norm(k: Any) -> Any:
    if isinstance(k, float):
        return "nan" if k != k else struct.pack("<d", k)
    return k


def rows_of(t: pa.Table) -> Counter[tuple[Any, Any, int, int]]:
    return Counter(zip(map(_norm, t.column("key").to_pylist()), t.column("value").to_pylist(),
                       t.column("time").to_pylist(), t.column("diff").to_pylist(), strict=True))


def _table(rows: list[tuple[Any, int, int, int]], key_type: pa.DataType) -> pa.Table:
    return pa.table({"key": pa.array([r[0] for r in rows], key_type),
                     "value": pa.array([r[1] for r in rows], pa.int64()),
                     "time": pa.array([r[2] for r in rows], pa.uint64()),
                     "diff": pa.array([r[3] for r in rows], pa.int64())})


_NAN_B = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0]
INT_KEYS = st.one_of(st.none(), st.integers(-4, 4))
FLOAT_KEYS = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, -2.0, float("nan"), _NAN_B]))


def _other_nan(k: Any) -> Any:
    if isinstance(k, float) and k != k:
        return float("nan") if struct.pack("<d", k) == struct.pack("<d", _NAN_B) else _NAN_B
    return k


def _base_parts(contents: pa.Table, cuts: list[int]) -> list[pa.Table]:
    """``contents`` (sorted by key) cut into key-disjoint parts at key changes."""
    keys = [_norm(k) for k in contents.column("key").to_pylist()]
    starts = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    at = sorted({starts[c % len(starts)] for c in cuts}) if starts else []
    bounds = [0, *at, len(keys)]
    return [contents.slice(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]


@pytest.mark.parametrize("key_type", [pa.int64(), pa.float64()])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_base_minus_marks_plus_delta_is_the_contents_at_every_as_of(
        key_type: pa.DataType, data: st.DataObject) -> None:
    keys = INT_KEYS if pa.types.is_integer(key_type) else FLOAT_KEYS
    values = st.integers(0, 2)
    old = data.draw(st.lists(st.tuples(keys, values, st.integers(0, T0),
                                       st.integers(-2, 2)), max_size=25))
    # the base: compaction's output, consolidated at T0, sorted, cut into key-disjoint parts
    contents = columnar.contents_at(_table(old, key_type), T0)
    parts = _base_parts(contents, data.draw(st.lists(st.integers(0, 99), max_size=3)))
    # the runs: new rows, and retractions / more copies of base rows
    new = data.draw(st.lists(st.tuples(keys, values, st.integers(T0 + 1, T0 + 4),
                                       st.integers(-2, 2)), max_size=12))
    base_rows = contents.to_pylist()
    again = data.draw(st.lists(st.tuples(st.integers(0, 99), st.integers(T0 + 1, T0 + 4),
                                         st.integers(-2, 2)), max_size=8))
    if base_rows:
        # a NaN key of the base comes back with other NaN bits: the same key to persist
        new += [(_other_nan(base_rows[i % len(base_rows)]["key"]),
                 base_rows[i % len(base_rows)]["value"], t, d) for i, t, d in again]
    runs = _table(new, key_type)
    everything = pa.concat_tables([*parts, runs]) if parts else runs
    for as_of in range(T0, T0 + 5):
        cut = runs.filter(pa.compute.less_equal(runs.column("time"),
                                                pa.scalar(as_of, pa.uint64())))
        marks, delta = marks_mod.find(parts, cut, as_of)
        assert len(marks) == len(parts)
        kept = [marks_mod.unmarked(p, m) for p, m in zip(parts, marks, strict=True)]
        got = pa.concat_tables([*kept, delta]) if kept else delta
        got = got.set_column(2, "time", columnar.constant_times(as_of, len(got)))
        assert rows_of(got) == rows_of(columnar.contents_at(everything, as_of)), as_of
        # nothing marked that no run touches; the bitmap holds the same positions
        for p, m in zip(parts, marks, strict=True):
            assert list(m) == sorted(set(m.tolist()))
            words = marks_mod.bitmap(m, len(p))
            assert len(words) == (len(p) + 63) // 64
            assert marks_mod.positions(words, len(p)).tolist() == m.tolist()
        if not len(cut):
            assert all(not len(m) for m in marks)
            assert not len(delta)


@given(rows=st.integers(1, 300), data=st.data())
def test_bitmap_bits_are_getbit_of_the_word(rows: int, data: st.DataObject) -> None:
    m = np.array(sorted(data.draw(st.sets(st.integers(0, rows - 1)))), dtype=np.int64)
    words = marks_mod.bitmap(m, rows)
    for i in range(rows):
        bit = (int(words[i // 64]) >> (i % 64)) & 1  # Spark's getbit(word, i % 64)
        assert bit == (i in set(m.tolist()))


def test_marks_outside_the_part_are_refused() -> None:
    t = _table([(1, 1, 0, 1), (2, 1, 0, 1)], pa.int64())
    for bad in ([2], [-1]):
        with pytest.raises(InvalidUsage, match="outside the part's 2 rows"):
            marks_mod.unmarked(t, np.array(bad, np.int64))
        with pytest.raises(InvalidUsage, match="outside the part's 2 rows"):
            marks_mod.bitmap(np.array(bad, np.int64), 2)
    other = t.cast(pa.schema([("key", pa.float64()), ("value", pa.int64()),
                              ("time", pa.uint64()), ("diff", pa.int64())]))
    with pytest.raises(InvalidUsage, match="schema"):
        marks_mod.find([t], other, 1)
