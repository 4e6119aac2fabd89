"""A base's files read once by Spark minus their marks (``operators.marks.unmarked``, DESIGN.md
§11a *Marks*): the rows Spark keeps are exactly persist's ``marks.unmarked`` of each file, for
files of several row groups and pages, marks at the first and last rows and across row-group
bounds, a file with no marks and one not in the mapping; a bitmap too short for its file fails
the query; two files of one name are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators.marks import unmarked
from persist import InvalidUsage
from persist.indexed.read import marks

pytestmark = pytest.mark.spark

SCHEMA = "key long, value long, time long, diff long"


def _file(path: Path, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    t = pa.table({"key": pa.array(np.sort(rng.integers(-10**6, 10**6, rows))),
                  "value": pa.array(rng.integers(0, 9, rows)),
                  "time": pa.array(np.full(rows, 7, np.int64)),
                  "diff": pa.array(rng.integers(1, 3, rows))})
    pq.write_table(t, path, row_group_size=700, data_page_size=1024, write_page_index=True)
    return t


def _rows(t: Any) -> list[tuple[int, int, int, int]]:
    return sorted(tuple(r) for r in t)


def test_spark_keeps_exactly_the_unmarked_rows(spark: Any, tmp_path: Path) -> None:
    sizes = [2500, 1301, 64, 900]
    paths = [tmp_path / f"part-{i}" for i in range(len(sizes))]
    tables = [_file(p, n, i) for i, (p, n) in enumerate(zip(paths, sizes, strict=True))]
    rng = np.random.default_rng(5)
    picks = [
        np.unique(np.concatenate([[0, 699, 700, 1399, 1400, 2499],
                                  rng.integers(0, 2500, 300)])).astype(np.int64),
        np.unique(rng.integers(0, 1301, 40)).astype(np.int64),
        np.empty(0, np.int64),  # in the mapping, nothing marked
    ]  # the last file is not in the mapping: every row kept
    urls = [p.as_uri() for p in paths]
    bitmaps = {u: marks.bitmap(m, len(t))
               for u, m, t in zip(urls, picks, tables, strict=False)}
    df = unmarked(spark, spark.read.schema(SCHEMA).parquet(*[str(p) for p in paths]), bitmaps)
    got = _rows(df.collect())
    want = [marks.unmarked(t, m) for t, m in zip(tables, picks, strict=False)] + [tables[-1]]
    expected = _rows(zip(*(pa.concat_tables(want).column(c).to_pylist()
                           for c in ("key", "value", "time", "diff")), strict=True))
    assert len(got) == sum(sizes) - sum(len(m) for m in picks)
    assert got == expected

    # a bitmap that does not cover its file's rows fails the query, never a silent answer
    short = {urls[0]: marks.bitmap(picks[0], 2500)[:-1]}
    with pytest.raises(Exception, match=r"(?i)index|bound|ARRAY"):
        unmarked(spark, spark.read.schema(SCHEMA).parquet(str(paths[0])), short).collect()

    # two files of one name cannot be told apart by name
    other = tmp_path / "elsewhere"
    other.mkdir()
    twin = (other / "part-0").as_uri()
    with pytest.raises(InvalidUsage, match="name two files alike"):
        unmarked(spark, spark.read.schema(SCHEMA).parquet(str(paths[0])),
                 {urls[0]: bitmaps[urls[0]], twin: bitmaps[urls[0]]})
