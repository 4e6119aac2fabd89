"""Marks: the base rows that fresh runs supersede, by position (DESIGN.md §11a, *Marks*).

A compacted base (``Scan.layers``: consolidated parts, one time each, key-disjoint) with small
runs on top is, as of a time ``as_of``, the base's rows *minus* the rows of every key a run holds,
*plus* one consolidated *delta*: the summed rows of those keys (base rows and runs' rows
together, zero sums dropped). :func:`find` computes both from the base parts' rows and the runs'
rows; :func:`unmarked` takes a base part's rows minus its marks. The marks are positions in the
part's rows as stored (row order of the part's file, ``_metadata.row_index`` to Spark's Parquet
source), so a reader can apply them while it scans the file once (:func:`bitmap`: one bit per
row, the form Spark tests with ``getbit``; ``bench/read_marks.py`` measures it).

Exact for the same reason as the layered read (``scan._applied``): every group of rows that
consolidation sums has one key, so a group is wholly in the delta (its base row marked) or
wholly in the base (no run row in it). Keys are matched as the layered read matches them
(``is_in`` with every NaN made one NaN, null equal to null); a coarser match (``-0.0`` equal to
``0.0``) only moves base rows into the delta, which persist's consolidation sums exactly.

Compaction's marks step (:func:`persist.indexed.maintenance.compact.mark`, DESIGN.md §8)
computes the same marks and delta incrementally (positions in the blob's rows, earlier marks
kept) and stores them; every part read applies a marked part's marks
(:meth:`persist.indexed.read.parts.PartReader.marks`), and the native plan hands each marked
file's :func:`bitmap` to Spark (``persist.distributed.FileRead.marks``). This module keeps the
one-shot computation and the bitmap form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from persist.errors import InvalidUsage
from persist.indexed.format import records
from persist.indexed.read import buckets


def find(base: Sequence[pa.Table], runs: pa.Table, as_of: int
         ) -> tuple[tuple[np.ndarray, ...], pa.Table]:
    """The marks of each base part and the delta, as of ``as_of``.

    Args:
        base: each base part's rows, in the part's stored order (a base part is consolidated
            and holds one time at or before ``as_of``; the parts are key-disjoint).
        runs: the runs' rows at or before ``as_of`` (any times, any diffs; the base's schema).
        as_of: the time the delta's rows are forwarded to.

    Returns:
        ``(marks, delta)``: per base part, the sorted int64 positions of its rows whose key a
        run holds; and the consolidated rows of those keys (``buckets.consolidate``: summed
        per ``(key, value)``, zero sums dropped, time ``as_of``, unordered).

    Raises:
        InvalidUsage: a table's schema is not the runs' (nothing is computed).
    """
    for t in base:
        if not t.schema.equals(runs.schema):
            raise InvalidUsage(f"a base part's schema {t.schema} is not the runs' {runs.schema}")
    if not len(runs):
        return tuple(np.empty(0, np.int64) for _ in base), runs.schema.empty_table()
    keys = pc.unique(records.one_nan(runs.column("key")))
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    marks: list[np.ndarray] = []
    touched: list[pa.Table] = []
    for t in base:
        hit = pc.is_in(records.one_nan(t.column("key")), value_set=keys)
        where = np.flatnonzero(hit.to_numpy(zero_copy_only=False)).astype(np.int64)
        marks.append(where)
        if len(where):
            touched.append(t.take(pa.array(where)))
    delta = buckets.consolidate(pa.concat_tables([*touched, runs]), as_of)
    return tuple(marks), delta


def unmarked(rows: pa.Table, marks: np.ndarray) -> pa.Table:
    """A base part's rows (stored order) minus the rows at the positions ``marks``.

    Raises:
        InvalidUsage: a position outside the part's rows.
    """
    if not len(marks):
        return rows
    if int(marks.min()) < 0 or int(marks.max()) >= len(rows):
        raise InvalidUsage(f"a mark outside the part's {len(rows)} rows: "
                           f"{int(marks.min())}..{int(marks.max())}")
    keep = np.ones(len(rows), dtype=bool)
    keep[marks] = False
    return rows.filter(pa.array(keep))


def bitmap(marks: np.ndarray, rows: int) -> np.ndarray:
    """``marks`` (positions in a part of ``rows`` rows) as ``ceil(rows / 64)`` int64 words:
    position ``i`` is bit ``i % 64`` of word ``i // 64`` (Spark's ``getbit(word, i % 64)``).

    Raises:
        InvalidUsage: a position outside ``[0, rows)``.
    """
    if len(marks) and (int(marks.min()) < 0 or int(marks.max()) >= rows):
        raise InvalidUsage(f"a mark outside the part's {rows} rows: "
                           f"{int(marks.min())}..{int(marks.max())}")
    words = np.zeros((rows + 63) // 64, dtype=np.uint64)
    np.bitwise_or.at(words, marks >> 6, np.uint64(1) << (marks & 63).astype(np.uint64))
    return words.view(np.int64)


def positions(words: np.ndarray, rows: int) -> np.ndarray:
    """The inverse of :func:`bitmap`: the sorted positions whose bit is set (bits at or
    beyond ``rows`` are ignored)."""
    bits = np.unpackbits(words.view(np.uint64).astype("<u8").view(np.uint8),
                         bitorder="little")[:rows]
    return np.flatnonzero(bits).astype(np.int64)
