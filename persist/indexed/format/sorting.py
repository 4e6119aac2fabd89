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

from collections.abc import Callable

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


def in_order(table: pa.Table) -> bool:
    """Whether ``table``'s rows are in ``(key, value, time)`` order exactly as
    :func:`sort_indices` sorts (ties, rows equal in all three, in any order): for a part file
    another writer sorted, whose order is recorded (``PartMeta.sorted``) only if it holds.

    Checked on adjacent rows, vectorised: the keys of every pair; the values only of pairs
    whose keys tie; the times only of pairs whose keys and values tie. Each column's order is
    Arrow's sort's: values in their natural order (strings and binaries by their unsigned
    bytes, decimals and temporal types by their stored integers, ``false < true``), ``-0.0``
    tied with ``0.0``, then NaN (every payload one), then null. False (no order known) for a
    column Arrow cannot compare this way (records, lists, dictionaries...) and for any
    ``table`` that is not in the order: never True for one that is not.
    """
    return ordered_by(table.column, len(table))


def ordered_by(column: Callable[[str], pa.ChunkedArray], n: int) -> bool:
    """:func:`in_order` of the ``n`` rows whose columns ``column`` gives by name, asked for
    only as needed: the value column only if some adjacent keys tie, the time column only if
    some adjacent keys and values tie (a caller may decode them lazily)."""
    if n < 2:
        return True
    # NB: pairs (i, i + 1) still undecided: those whose earlier columns all tie (None: every
    # pair, taken as zero-copy slices rather than gathered).
    pairs: npt.NDArray[np.int64] | None = None
    for name in ("key", "value", "time"):
        col = column(name)
        if len(col) != n:
            raise ValueError(f"in_order: column {name!r} has {len(col)} rows, not {n}")
        if not _comparable(col.type):
            return False
        try:
            if pairs is None or len(pairs) > n // 4:
                # NB: every pair (or many: comparing all of them as zero-copy slices is
                # cheaper than gathering both sides of each), then the undecided ones kept
                lt, eq = _compare(col.slice(0, n - 1), col.slice(1))
                if pairs is not None:
                    lt, eq = lt[pairs], eq[pairs]
            else:
                lt, eq = _compare(col.take(pa.array(pairs)), col.take(pa.array(pairs + 1)))
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return False
        if not bool(np.all(lt | eq)):
            return False
        pairs = np.flatnonzero(eq) if pairs is None else pairs[eq]
        if not len(pairs):
            return True
    return True


def _comparable(t: pa.DataType) -> bool:
    """Whether Arrow's comparison kernels order ``t`` as its sort does (see :func:`in_order`)."""
    kinds = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
             pa.types.is_decimal, pa.types.is_date, pa.types.is_timestamp, pa.types.is_time,
             pa.types.is_duration, pa.types.is_string, pa.types.is_large_string,
             pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary)
    return any(bool(kind(t)) for kind in kinds)


def _classes(x: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.int8] | None:
    """Each value's class in the order, 0 a value, 1 NaN, 2 null (None: all values)."""
    floating = pa.types.is_floating(x.type)
    if not x.null_count and not (floating and pc.any(pc.is_nan(x)).as_py()):
        return None
    cls = np.where(_np(pc.is_valid(x)), 0, 2).astype(np.int8)
    if floating:
        cls[_np(pc.fill_null(pc.is_nan(x), False))] = 1
    return cls


def _np(x: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.bool_]:
    """A boolean Arrow array without nulls as numpy."""
    return np.asarray(x.to_numpy(zero_copy_only=False) if isinstance(x, pa.Array)
                      else x.to_numpy(), dtype=bool)


def _compare(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array
             ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Element-wise ``a < b`` and ``a`` tied with ``b`` in the order of :func:`in_order`."""
    ca, cb = _classes(a), _classes(b)
    if ca is None and cb is None:
        return _np(pc.less(a, b)), _np(pc.equal(a, b))
    n = len(a)
    ca = np.zeros(n, np.int8) if ca is None else ca
    cb = np.zeros(n, np.int8) if cb is None else cb
    values = (ca == 0) & (cb == 0)
    # NB: comparisons with a null are null (filled False) and with NaN False: only pairs of
    # two values take the comparison's answer, the rest their classes'.
    lt = (ca < cb) | (values & _np(pc.fill_null(pc.less(a, b), False)))
    eq = (ca == cb) & ((ca != 0) | _np(pc.fill_null(pc.equal(a, b), False)))
    return lt, eq


__all__ = ["BUCKET_ROWS", "in_order", "is_sorted", "ordered_by", "sort_indices", "sort_updates"]
