"""The consolidation of a read task's rows (:func:`consolidate`: diffs summed per ``(key,
value)``, zeros dropped), and the 64-bit key hash it groups by.

Parallel reads no longer split by key hash: hash buckets had every task decode every part, so
consolidated reads split by key range (:mod:`persist.indexed.read.split`). The hash remains
consolidation's grouping aid.

The hash must agree across processes and machines (Python's ``hash`` is salted per process),
be vectorized (no Python per row) and never split keys that Arrow's ``group_by`` treats as
equal. It may *merge* keys group_by tells apart (``-0.0`` and ``0.0``, NaN payloads, null and
the zero value): that only puts two groups in one bucket, never one group in two.

Records (struct and list keys or values) and the other version-2 types (decimals, dates,
timestamps, ...) are hashed through the engine's canonical row encoding
(:func:`persist.indexed.format.records.row_bytes`): equal records, by the engine's record equality
(the one consolidation groups by), have equal bytes and so one hash, whatever their chunking.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist.indexed.format import records
from persist.indexed.format.columnar import constant_times, sum_by_key_value

_U = np.uint64
_Hashes = npt.NDArray[np.uint64]

#: Elements hashed per step for variable-width keys (bounds the per-byte temporaries).
_BLOCK = 1 << 18


def _mix(x: _Hashes) -> _Hashes:
    """splitmix64's finalizer: a bijection on uint64 that spreads every input bit."""
    x = x + _U(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    out: _Hashes = x ^ (x >> _U(31))
    return out


#: Per-byte-position weights for variable-width keys; fixed, so identical in every process.
_WEIGHTS = _mix(np.arange(1, 257, dtype=np.uint64))


def hash_keys(col: pa.ChunkedArray | pa.Array) -> _Hashes:
    """A 64-bit hash of every element of ``col``, equal for elements Arrow considers equal."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = [_hash_array(c) for c in chunks if len(c)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def _hash_array(arr: pa.Array) -> _Hashes:
    t = arr.type
    if pa.types.is_null(t):
        return np.zeros(len(arr), dtype=np.uint64)
    if pa.types.is_floating(t):
        v = arr.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        # NB: x + 0.0 turns -0.0 into 0.0, and every NaN payload becomes one NaN: equal keys
        # (by any Arrow notion of equality) must share a bucket.
        v = v + 0.0
        v[np.isnan(v)] = np.nan
        return _mix(v.view(np.uint64))
    if pa.types.is_boolean(t):
        return _mix(arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64))
    if pa.types.is_integer(t):
        # NB: astype wraps negative ints into uint64 bit patterns, which is all a hash needs.
        return _mix(arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64))
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        return np.concatenate([
            _hash_var_width(arr.slice(i, _BLOCK)) for i in range(0, len(arr), _BLOCK)
        ])
    # NB: records, decimals, dates, timestamps: their canonical bytes, equal iff the values are
    # equal as the engine groups them (a null record, a null field and an empty list differ).
    return np.concatenate([
        _hash_var_width(records.row_bytes(arr.slice(i, _BLOCK)))
        for i in range(0, len(arr), _BLOCK)
    ])


def _hash_var_width(arr: pa.Array) -> _Hashes:
    """Position-weighted byte sums per element, computed on the raw Arrow buffers."""
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32,
                            count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    lens = np.diff(offsets)
    base = int(offsets[0])
    data = (np.frombuffer(data_buf, dtype=np.uint8)[base:int(offsets[-1])]
            if data_buf is not None else np.zeros(0, dtype=np.uint8))
    starts = offsets[:-1] - base
    sums = np.zeros(n, dtype=np.uint64)
    nonempty = lens > 0
    if nonempty.any():
        element = np.repeat(np.arange(n), lens)
        position = np.arange(len(data)) - starts[element]
        weighted = (data.astype(np.uint64) + _U(1)) * _WEIGHTS[position & 255]
        # NB: reduceat over the starts of non-empty elements only: a segment then spans one
        # element's bytes (empty elements in between contribute none).
        sums[nonempty] = np.add.reduceat(weighted, starts[nonempty])
    return _mix(sums ^ _mix(lens.astype(np.uint64)))


def consolidate(table: pa.Table, as_of: int, *, key_hashes: _Hashes | None = None) -> pa.Table:
    """Sums ``diff`` per ``(key, value)``, drops zero sums, sets every time to ``as_of``.

    Args:
        table: updates at or before ``as_of`` (a part's schema, which the result keeps).
        key_hashes: ``hash_keys(table.column("key"))`` if the caller has it already.

    Unlike ``persist.indexed.format.columnar.contents_at`` this does not sort its output: Spark never
    promises an order, and sorting would cost as much again as the aggregation.
    """
    schema = table.schema
    if len(table) == 0:
        return schema.empty_table()
    hk = hash_keys(table.column("key")) if key_hashes is None else key_hashes
    # NB: most (key, value) pairs of a snapshot occur once (compaction already summed them),
    # and a hash aggregation costs several times a sort of 64-bit hashes. A row whose
    # (key, value) hash no other row shares has no partner to sum with, so only rows with a
    # repeated hash (equal pairs, or rare collisions that group_by then tells apart) go
    # through group_by.
    shared = _repeated(_mix(hk ^ _mix(hash_keys(table.column("value")) + _U(1))))
    alone = table.filter(pa.array(~shared)) if shared.any() else table
    alone = alone.filter(pc.not_equal(alone.column("diff"), 0))
    pieces = [pa.Table.from_arrays(
        [alone.column("key"), alone.column("value"), constant_times(as_of, len(alone)),
         alone.column("diff")], schema=schema)]
    if shared.any():
        rest = table.filter(pa.array(shared))
        # NB: the engine's grouping: hash-grouping for flat types, record equality (field by
        # field) for structs and lists, which group_by cannot take as keys.
        agg = sum_by_key_value(rest)
        agg = agg.filter(pc.not_equal(agg.column("diff_sum"), 0))
        pieces.append(pa.Table.from_arrays(
            [agg.column("key"), agg.column("value"), constant_times(as_of, len(agg)),
             agg.column("diff_sum")], schema=schema))
    return pa.concat_tables(pieces)


def _repeated(h: _Hashes) -> npt.NDArray[np.bool_]:
    """A mask of the elements of ``h`` whose value occurs more than once."""
    ordered = np.sort(h)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return np.zeros(len(h), dtype=bool)
    # NB: a plain sort is ~2x faster than argsort, and the repeated values are usually few:
    # a hash lookup (is_in) maps them back to rows.
    repeated = pa.array(np.unique(ordered[1:][same]))
    mask: npt.NDArray[np.bool_] = pc.is_in(pa.array(h), value_set=repeated).to_numpy(
        zero_copy_only=False)
    return mask
