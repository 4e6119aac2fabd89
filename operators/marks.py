"""A base's files read once by Spark's Parquet source, minus their marked rows (DESIGN.md §11a,
*Marks*): each file's marks as a bitmap (:func:`persist.indexed.read.marks.bitmap`, one bit per
row in the file's row order), tested against the row's position in its file
(``_metadata.row_index``).

    df = spark.read.parquet(*urls)
    kept = unmarked(spark, df, {url: marks.bitmap(positions, rows) for ...})

Measured (``bench/read_marks.py``, W9's stage (c), 1% updates): one scan of the 3 base files
with this filter, plus the delta read raw, 0.61-0.86x ``spark.read.parquet`` raw by wall at
load 10-16 on 2 cores, where a broadcast anti join on ``row_index`` reached 0.36-0.47x.

The native read plan's marked base files (``persist.distributed.FileRead.marks``, planned by
``plan_native`` from the stored marks of compaction's marks step) are read through it
(``operators/native.py``). Needs a classic (non-Connect) session: each bitmap crosses py4j as
one byte array and becomes a ``long[]`` literal in the JVM (pyspark's ``lit`` of an array is
one py4j call per element).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from persist import InvalidUsage


def _name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _longs(spark: Any, words: np.ndarray) -> Any:
    """``words`` (int64) as an ``array<bigint>`` literal Column, built in the JVM from one
    byte array."""
    from pyspark.sql.classic.column import Column

    jvm = spark._jvm
    buf = jvm.java.nio.ByteBuffer.wrap(bytearray(words.astype(">i8").tobytes()))
    longs = jvm.java.nio.LongBuffer.allocate(len(words))
    longs.put(buf.asLongBuffer())
    return Column(jvm.org.apache.spark.sql.functions.lit(longs.array()))


def unmarked(spark: Any, df: Any, bitmaps: Mapping[str, np.ndarray]) -> Any:
    """``df`` (a scan of Parquet files by Spark's file source) without the rows whose bit is
    set in their file's bitmap (``bitmaps``: file URL to the words of
    :func:`persist.indexed.read.marks.bitmap`, sized for the file's rows). Rows of a file not in
    ``bitmaps`` are kept. Files are told apart by name (``_metadata.file_name``).

    A bitmap shorter than its file's rows fails the query (Spark's ``element_at`` out of
    bounds), never keeps or drops a row it does not cover.

    Raises:
        InvalidUsage: two URLs of ``bitmaps`` share a file name.
    """
    from pyspark.sql import functions as F

    names = [_name(u) for u in bitmaps]
    if len(set(names)) != len(names):
        raise InvalidUsage(f"marks name two files alike ({sorted(names)!r:.200}): a file is "
                           f"told by its name")
    if not bitmaps:
        return df
    pos = F.col("_metadata.row_index")
    word_at = F.shiftright(pos, 6).cast("int") + 1
    bit = pos.bitwiseAND(63).cast("int")
    name = F.col("_metadata.file_name")
    table = None
    for n, words in zip(names, bitmaps.values(), strict=True):
        lit = _longs(spark, np.asarray(words, np.int64))
        table = F.when(name == n, lit) if table is None else table.when(name == n, lit)
    assert table is not None
    # NB: the words are picked by file name and tested once (measured 0.76x Parquet against
    # 0.67x for a CASE of one test per file); a file not in ``bitmaps`` has no words (null),
    # and its rows are kept
    kept = F.getbit(F.element_at(table, word_at), bit) == 0
    return df.where(F.coalesce(kept, F.lit(True)))
