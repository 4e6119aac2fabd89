"""``sorting.in_order``: whether a table is in persist's ``(key, value, time)`` order, the check
that decides whether a part file another writer sorted is recorded sorted. It must agree with
the order persist sorts in (``sorting.is_sorted``, which sorts and compares) on every type it
answers for, and never say True of a table that is not in order."""

from __future__ import annotations

import datetime
import itertools
import random
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from persist.indexed.format import columnar, sorting

_NAN2 = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0ABC))[0]  # another payload

#: Per type, a small pool of values (many ties), extremes and nulls included.
POOLS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "bool": (pa.bool_(), [False, True, None]),
    "int8": (pa.int8(), [-128, -1, 0, 1, 127, None]),
    "int16": (pa.int16(), [-32768, -1, 0, 5, 32767, None]),
    "int32": (pa.int32(), [-(2**31), -1, 0, 7, 2**31 - 1, None]),
    "int64": (pa.int64(), [-(2**63), -1, 0, 2**32, 2**63 - 1, None]),
    "uint64": (pa.uint64(), [0, 1, 2**63, 2**64 - 1, None]),
    "string": (pa.string(), ["", "a", "ab", "b", "é", "\U0010ffff", "a\x00", None]),
    "large_string": (pa.large_string(), ["", "a", "ab", "é", None]),
    "binary": (pa.binary(), [b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"\xff\x00", None]),
    "date32": (pa.date32(), [datetime.date(1, 1, 1), datetime.date(1970, 1, 1),
                             datetime.date(2020, 2, 29), datetime.date(9999, 12, 31), None]),
    "float64": (pa.float64(), [float("-inf"), -1.5, -0.0, 0.0, 2.5, float("inf"),
                               float("nan"), _NAN2, None]),
    "float32": (pa.float32(), [float("-inf"), -0.0, 0.0, 1.0, float("nan"), None]),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  [datetime.datetime(1900, 1, 1, tzinfo=datetime.UTC),
                   datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
                   datetime.datetime(2030, 6, 1, 0, 0, 0, 1, tzinfo=datetime.UTC), None]),
    "decimal": (pa.decimal128(10, 2), [Decimal("-99999999.99"), Decimal("-0.01"),
                                       Decimal("0.00"), Decimal("0.10"), Decimal("1.00"),
                                       None]),
}


def _table(kt: pa.DataType, keys: list[Any], vt: pa.DataType, values: list[Any],
           times: list[int], chunks: int = 1) -> pa.Table:
    schema = pa.schema([("key", kt), ("value", vt), ("time", pa.int64()), ("diff", pa.int64())])
    n = len(keys)
    t = pa.table([pa.array(keys, kt), pa.array(values, vt), pa.array(times, pa.int64()),
                  pa.array([1] * n, pa.int64())], schema=schema)
    if chunks > 1 and n > 1:  # several chunks: slices and gathers cross their boundaries
        cuts = sorted(random.sample(range(1, n), min(chunks - 1, n - 1)))
        bounds = [0, *cuts, n]
        t = pa.Table.from_batches([b for lo, hi in itertools.pairwise(bounds)
                                   for b in t.slice(lo, hi - lo).to_batches()], schema=schema)
    return t


def _random(rng: random.Random, kname: str, vname: str, n: int) -> pa.Table:
    kt, kpool = POOLS[kname]
    vt, vpool = POOLS[vname]
    return _table(kt, [rng.choice(kpool) for _ in range(n)], vt,
                  [rng.choice(vpool) for _ in range(n)], [rng.randrange(3) for _ in range(n)],
                  chunks=rng.randrange(1, 4))


@pytest.mark.parametrize("kname", sorted(POOLS))
def test_it_agrees_with_persists_sort_on_random_tables(kname: str) -> None:
    rng = random.Random(f"in-order-{kname}")
    for i in range(300):
        vname = rng.choice(sorted(POOLS))
        t = _random(rng, kname, vname, rng.randrange(0, 9))
        assert sorting.in_order(t) == sorting.is_sorted(t), (i, t.to_pydict())
        # sorted by persist's own sort: in order, whatever the ties, NaNs and nulls
        ordered = t.take(columnar.sort_indices(t))
        assert sorting.in_order(ordered), (i, ordered.to_pydict())


@pytest.mark.parametrize("kname", sorted(POOLS))
def test_one_pair_out_of_order_anywhere_is_caught(kname: str) -> None:
    """A sorted table with one adjacent pair swapped that is not tied: not in order, wherever
    the pair lies and whichever column decides it."""
    rng = random.Random(f"swap-{kname}")
    vname = rng.choice(sorted(POOLS))
    for _ in range(60):
        t = _random(rng, kname, vname, 40)
        t = t.take(columnar.sort_indices(t))
        rows = t.to_pylist()
        for i in range(len(rows) - 1):
            swapped = [*rows[:i], rows[i + 1], rows[i], *rows[i + 2:]]
            s = pa.Table.from_pylist(swapped, schema=t.schema)
            assert sorting.in_order(s) == sorting.is_sorted(s)
            if not sorting.is_sorted(s):
                assert not sorting.in_order(s)


def test_ties_across_keys_values_and_times() -> None:
    k, v = pa.int64(), pa.string()
    assert sorting.in_order(_table(k, [1, 1, 1, 2], v, ["a", "a", "b", "a"], [0, 1, 0, 0]))
    # keys tie, values out of order (the key-only sort a native write does, many updates)
    assert not sorting.in_order(_table(k, [1, 1, 2], v, ["b", "a", "a"], [0, 0, 0]))
    # keys and values tie, times out of order
    assert not sorting.in_order(_table(k, [1, 1, 2], v, ["a", "a", "a"], [1, 0, 0]))
    # rows equal in all three: tied, either order
    assert sorting.in_order(_table(k, [1, 1], v, ["a", "a"], [0, 0]))
    # nulls last, and tie with each other
    assert sorting.in_order(_table(k, [1, None, None], v, [None, "a", None], [0, 0, 0]))
    assert not sorting.in_order(_table(k, [None, 1], v, ["a", "a"], [0, 0]))
    assert not sorting.in_order(_table(k, [1, 1], v, [None, "a"], [0, 0]))
    # a value out of order far from any other: only the tied pairs are compared, all of them
    n = 100_000
    keys = [i // 2 for i in range(n)]
    values = ["x"] * n
    values[n - 2], values[n - 1] = "b", "a"
    assert not sorting.in_order(_table(k, keys, v, values, [0] * n, chunks=3))
    values[n - 2] = "a"
    assert sorting.in_order(_table(k, keys, v, values, [0] * n, chunks=3))


def test_floats_nan_after_numbers_before_null_and_signed_zeros_tie() -> None:
    f, k = pa.float64(), pa.int64()
    nan = float("nan")
    assert sorting.in_order(_table(f, [-0.0, 0.0, -0.0, 1.0, nan, _NAN2, None], k,
                                   [0] * 7, [0] * 7))
    assert not sorting.in_order(_table(f, [nan, 1.0], k, [0, 0], [0, 0]))
    assert not sorting.in_order(_table(f, [None, nan], k, [0, 0], [0, 0]))
    assert not sorting.in_order(_table(f, [float("inf"), 1.0], k, [0, 0], [0, 0]))
    # -0.0 and 0.0 tie, so the value decides
    assert not sorting.in_order(_table(f, [0.0, -0.0], k, [1, 0], [0, 0]))
    assert sorting.in_order(_table(f, [0.0, -0.0], k, [0, 1], [0, 0]))
    # NaNs tie whatever their payload, so the value decides
    assert not sorting.in_order(_table(f, [nan, _NAN2], k, [1, 0], [0, 0]))


def test_strings_and_binaries_by_unsigned_bytes() -> None:
    b, k = pa.binary(), pa.int64()
    assert sorting.in_order(_table(b, [b"", b"\x00", b"\x7f", b"\x80", b"\xff"], k,
                                   [0] * 5, [0] * 5))
    assert not sorting.in_order(_table(b, [b"\xff", b"\x00"], k, [0, 0], [0, 0]))
    s = pa.string()
    assert sorting.in_order(_table(s, ["Z", "a", "é", "\U0010ffff"], k, [0] * 4, [0] * 4))
    assert not sorting.in_order(_table(s, ["é", "z"], k, [0, 0], [0, 0]))


def test_a_type_it_cannot_compare_is_never_called_in_order() -> None:
    rec = pa.struct([("a", pa.int64())])
    t = _table(rec, [{"a": 1}, {"a": 2}], pa.int64(), [0, 0], [0, 0])
    assert sorting.is_sorted(t)
    assert not sorting.in_order(t)  # no order known, never a wrong one
    lst = pa.list_(pa.int64())
    assert not sorting.in_order(_table(pa.int64(), [1, 1], lst, [[1], [2]], [0, 0]))
    # but a table whose keys alone decide it needs no value comparison
    assert sorting.in_order(_table(pa.int64(), [1, 2], lst, [[2], [1]], [0, 0]))


def test_the_value_and_time_are_asked_for_only_where_earlier_columns_tie() -> None:
    t = _table(pa.int64(), [1, 2, 3], pa.string(), ["c", "b", "a"], [2, 1, 0])
    asked: list[str] = []

    def column(name: str) -> pa.ChunkedArray:
        asked.append(name)
        return t.column(name)

    assert sorting.ordered_by(column, 3)
    assert asked == ["key"]  # unique keys: the order is decided
    t = _table(pa.int64(), [1, 1, 3], pa.string(), ["a", "b", "a"], [2, 1, 0])
    asked.clear()
    assert sorting.ordered_by(column, 3)
    assert asked == ["key", "value"]
    t = _table(pa.int64(), [1, 1, 3], pa.string(), ["a", "a", "a"], [2, 1, 0])
    asked.clear()
    assert not sorting.ordered_by(column, 3)
    assert asked == ["key", "value", "time"]
    with pytest.raises(ValueError, match="rows"):
        sorting.ordered_by(column, 4)
