"""Sorting a part where it is made: every blob part is sorted by ``(key, value, time)``.

The order is consolidation's (:func:`persist.indexed.format.columnar.sort_indices`: Arrow's, NaN
after every number, nulls last, records by their frame columns), so a consolidated sorted part
is a consolidated run and a key-range read (:mod:`persist.indexed.read.split`) decodes only the
row groups that may hold its keys.

**Cost on the acknowledgement path.** Sorting 1 M rows with Arrow's ``sort_indices`` on three
columns cost 105-130 ms here, more than encoding the part (45 ms). Most keys are integers
(ids, dates, timestamps) without nulls; those take a faster path: each row becomes one uint64,
the key's order-preserving high bits above the row number, and numpy sorts those words
(a radix pass on their leading bits, then a sort of the nearly sorted result, see ``_sort``). Rows whose words tie (equal keys, or
keys equal in the kept bits) are then put in full ``(key, value, time)`` order by Arrow, on
those rows alone; when the words hold the whole key it is rebuilt from them rather than
gathered, and columns with one value (an append's time, its diffs) are not moved at all. Every
other key type sorts with Arrow.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist.indexed.format import columnar, records

#: Parts with at least this many rows sort their words in buckets (see ``_sort``).
BUCKET_ROWS = 1 << 16

_U64 = np.uint64


def sort_updates(table: pa.Table) -> pa.Table:
    """``table`` (a part's rows) sorted by ``(key, value, time)`` in consolidation's order."""
    if len(table) < 2:
        return table
    words = _integer_key(table.column("key"))
    if words is None:
        return table.take(columnar.sort_indices(table))
    order, key = _by_words(table, *words)
    rows = pa.array(order)
    columns = []
    for i, name in enumerate(table.column_names):
        col = table.column(i)
        if name == "key" and key is not None:
            columns.append(key)
        elif _constant(col):
            columns.append(col)  # NB: the same in any order (an append's one time, its diffs)
        else:
            columns.append(col.take(rows))
    return pa.Table.from_arrays(columns, schema=table.schema)


def sort_indices(table: pa.Table) -> pa.Array:
    """The permutation that sorts ``table`` by ``(key, value, time)`` in consolidation's order
    (ties, rows equal in all three, in any order)."""
    words = _integer_key(table.column("key"))
    if words is None:
        return columnar.sort_indices(table)
    return pa.array(_by_words(table, *words)[0])


#: ``(offset of each key from the smallest, the smallest, the key's type)``.
_Words = tuple[npt.NDArray[np.uint64], int, pa.DataType]


def _integer_key(key: pa.ChunkedArray) -> _Words | None:
    """The key as uint64 words in the key's order (its offset from its minimum), or None if
    it takes Arrow's sort (not an integer-like type, nulls, or too few rows to bother)."""
    t = key.type
    if key.null_count or len(key) < 4096:
        return None
    if pa.types.is_integer(t):
        signed = pa.types.is_signed_integer(t)
    elif pa.types.is_date32(t) or pa.types.is_timestamp(t):
        signed = True
    else:
        return None
    arr = key.combine_chunks() if key.num_chunks != 1 else key.chunk(0)
    values = np.asarray(arr.to_numpy(zero_copy_only=False))
    if values.dtype.kind == "M":
        values = values.view(np.int64)
    if signed:
        wide = values.astype(np.int64, copy=False)
        lo = int(wide.min())
        # NB: modular arithmetic: k - lo fits in uint64 for every k >= lo (span < 2**64).
        out: npt.NDArray[np.uint64] = wide.view(_U64) - _U64(lo & 0xFFFF_FFFF_FFFF_FFFF)
        return out, lo, t
    wide_u = values.astype(_U64, copy=False)
    lo = int(wide_u.min())
    return wide_u - _U64(lo), lo, t


def _by_words(table: pa.Table, offsets: npt.NDArray[np.uint64], lo: int, t: pa.DataType
              ) -> tuple[npt.NDArray[np.int64], pa.Array | None]:
    """The sorting permutation, and the sorted key when the words hold it whole (else
    None: the caller takes it)."""
    n = len(offsets)
    index_bits = max(1, (n - 1).bit_length())
    span_bits = int(offsets.max()).bit_length()
    # NB: the key's high bits above the row number: words sort by key (up to the bits dropped
    # when the key's span and the row number do not fit 64 bits together), ties by row.
    shift = max(0, span_bits - (64 - index_bits))
    words = ((offsets >> _U64(shift)) << _U64(index_bits)) | np.arange(n, dtype=_U64)
    words = _sort(words)
    mask = _U64((1 << index_bits) - 1)
    order = (words & mask).astype(np.int64)
    top = words >> _U64(index_bits)
    tied = top[1:] == top[:-1]
    ties = int(np.count_nonzero(tied))
    if ties > n // 8:
        # NB: many repeated keys (many updates per key): Arrow's sort of every row is then
        # cheaper than the words plus a second sort of most rows.
        return np.asarray(columnar.sort_indices(table).to_numpy(), dtype=np.int64), None
    if ties:
        # NB: each run of tied words holds keys equal in their kept bits; put every such row
        # in full (key, value, time) order. The runs are disjoint and ordered, so sorting all
        # their rows together and writing them back into the same positions sorts each run.
        involved = np.zeros(n, dtype=bool)
        involved[:-1] |= tied
        involved[1:] |= tied
        positions = np.flatnonzero(involved)
        rows = order[positions]
        sub = columnar.sort_indices(table.take(pa.array(rows))).to_numpy()
        order[positions] = rows[sub]
    if shift:
        return order, None
    # NB: the words hold every key bit: the sorted key is their top bits plus the minimum, a
    # sequential pass instead of gathering the column by the permutation.
    keys = (top + _U64(lo & 0xFFFF_FFFF_FFFF_FFFF))
    physical = pa.int64() if not pa.types.is_integer(t) else (
        pa.int64() if pa.types.is_signed_integer(t) else pa.uint64())
    arr = pa.array(keys.view(np.int64) if physical == pa.int64() else keys, physical)
    if pa.types.is_integer(t):
        return order, arr.cast(t, safe=False) if t != physical else arr
    narrow = arr.cast(pa.int32(), safe=False) if pa.types.is_date32(t) else arr
    return order, narrow.view(t)


#: The leading bits that bucket words before they are sorted (see ``_sort``).
_BUCKET_BITS = 16


def _sort(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``words`` sorted.

    NB: large arrays are first bucketed by their leading 16 bits (numpy's stable argsort of
    16-bit digits is a radix sort, 6 ms per 1 M), which leaves every word within its bucket of
    its place; numpy's stable sort (a timsort) then finishes such nearly sorted data in 11 ms:
    25 ms for 1 M random words here, against 54 ms for one ``np.sort``, none of it holding
    the GIL (parts are sorted on several threads, ``write.new_parts``). Words that are not
    spread (few leading bits, or skewed keys) only make the second sort a plain one.
    """
    n = len(words)
    if n < BUCKET_ROWS:
        return np.sort(words)
    top = int(words.max()).bit_length()
    digit = (words >> _U64(max(0, top - _BUCKET_BITS))).astype(np.uint16)
    bucketed = words[np.argsort(digit, kind="stable")]
    return np.sort(bucketed, kind="stable")


def _constant(col: pa.ChunkedArray) -> bool:
    """Whether every value of ``col`` (a fixed-width column without nulls) is the same."""
    if col.null_count or not pa.types.is_integer(col.type) or not len(col):
        return False
    first = col[0].as_py()
    return all(bool(np.all(c.to_numpy() == first)) for c in col.chunks)


def is_sorted(table: pa.Table) -> bool:
    """Whether ``table`` is in ``(key, value, time)`` order (ties in any order), checked by
    sorting it and comparing row by row: for ``persist verify`` and tests."""
    if len(table) < 2:
        return True
    ordered = table.take(columnar.sort_indices(table))
    for name in ("key", "value", "time"):
        for a, b in zip(records.frame(table.column(name)), records.frame(ordered.column(name)),
                        strict=True):
            # NB: rows the order ties (null with null, NaN with NaN, -0.0 with 0.0) may sit in
            # either order; weak equality is exactly "tied".
            if not pc.all(records.weak_equal(a, b)).as_py():
                return False
    return True


__all__ = ["BUCKET_ROWS", "is_sorted", "sort_indices", "sort_updates"]
