"""The native read over a compacted base (DESIGN.md §11a, the read plan): Spark reads the
base's files raw and applies the runs by key (``FileRead.runs``: an anti join of the base
against the runs' keys, broadcast, and the touched rows summed with the runs' contents).

Checked against the client's snapshot and the Python source (``format("persist")``) on the
same collection, at every as-of time in ``[since, upper)``: retractions that cancel base rows
exactly, new keys, new values of existing keys, null keys, a filter after the read; float keys
(NaN, ``-0.0``: summed by persist, not Spark's grouping) and string keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from operators import PersistTable
from persist import distributed
from persist.blob.file import FileBlob
from persist.indexed.engine import Options
from persist.indexed.maintenance.compact import CompactionPolicy
from tests.indexed.test_base import engine
from tests.spark.test_native import _client, _native, _python, canon

pytestmark = pytest.mark.spark

I64 = pa.int64()


def _table(rows: list[tuple[Any, Any, int]], t: int, key_type: pa.DataType = I64,
           value_type: pa.DataType = I64) -> pa.Table:
    return pa.table({"key": pa.array([k for k, _, _ in rows], key_type),
                     "value": pa.array([v for _, v, _ in rows], value_type),
                     "time": pa.array([t] * len(rows), pa.uint64()),
                     "diff": pa.array([d for _, _, d in rows], I64)})


@st.composite
def _histories(draw: st.DrawFn) -> tuple[list[Any], list[list[Any]]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # NB: the runs stay within RUNS_SHARE (2%) of the base: 2,000 rows over 4,000 (key, value)
    # pairs consolidate to ~1,570 base rows (2%: 31), so two batches of at most 12 rows each
    # (up to 20 let two large batches exceed it: a busy CI run drew such a history)
    n = draw(st.integers(2000, 3000))
    base = [(None if i % 101 == 3 else int(k), int(v), 1)
            for i, (k, v) in enumerate(zip(rng.integers(-500, 500, n).tolist(),
                                           rng.integers(0, 4, n).tolist(), strict=True))]
    batches = []
    for _ in range(draw(st.integers(1, 2))):
        b: list[Any] = []
        for _ in range(draw(st.integers(1, 12))):
            kind = draw(st.sampled_from(["retract", "new", "other", "null"]))
            k, v, _ = base[draw(st.integers(0, n - 1))]
            if kind == "retract":
                b.append((k, v, -1))
            elif kind == "new":
                b.append((draw(st.integers(600, 700)), draw(st.integers(0, 3)), 1))
            elif kind == "other":
                b.append((k, draw(st.integers(4, 6)), draw(st.sampled_from([1, -1]))))
            else:
                b.append((None, draw(st.integers(0, 6)), draw(st.sampled_from([1, -1]))))
        batches.append(b)
    return base, batches


def _layered_plan(url: str, as_of: int) -> bool:
    info = distributed.describe(url, "c")
    plan = distributed.plan_native(info.snapshot(as_of))
    return any(f.runs is not None for f in plan.files)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=_histories())
def test_the_base_with_runs_applied_reads_as_the_client_and_the_python_source(
        spark: Any, tmp_path_factory: pytest.TempPathFactory,
        h: tuple[list[Any], list[list[Any]]]) -> None:
    base, batches = h
    root = tmp_path_factory.mktemp("base")
    ix = engine(FileBlob(root), inline_threshold=0, batch_rows=64)
    ix.register("c", I64, I64)
    ix.write({"c": _table(base, 0)})
    ix.seal("c", 1)
    ix.allow_compaction("c", 0)
    while ix.maintain():
        pass
    for t, b in enumerate(batches, start=1):
        ix.write({"c": _table(b, t)})
        ix.seal("c", t + 1)
    url = str(root)
    for as_of in range(len(batches) + 1):
        want = _client(root, as_of, consolidated=True)
        assert _layered_plan(url, as_of) == (as_of > 0)
        assert _native(spark, url, as_of, consolidated=True) == want
        assert _python(spark, url, as_of, consolidated=True) == want
    where = "key > 0 AND value != 2"
    assert _native(spark, url, len(batches), consolidated=True, where=where) == \
        _python(spark, url, len(batches), consolidated=True, where=where)


@pytest.mark.parametrize("kind", ["float", "string"])
def test_float_and_string_keys_over_a_base(spark: Any, tmp_path: Path, kind: str) -> None:
    """Float keys are summed by persist (Spark's grouping makes ``-0.0`` ``0.0``), whatever
    the join took as touched; strings by Spark."""
    key_type = pa.float64() if kind == "float" else pa.string()
    keys: list[Any] = ([float(i) / 4 for i in range(-400, 400)] + [float("nan"), -0.0]
                       if kind == "float" else [f"k{i:05d}" for i in range(800)])
    ix = engine(FileBlob(tmp_path), inline_threshold=0, batch_rows=64,
                compaction={"final_rows": 1 << 30, "fanin": 2, "part_target_bytes": 4 << 10})
    ix.register("c", key_type, I64)
    half = len(keys) // 2
    ix.write({"c": _table([(k, 1, 1) for k in keys[:half]], 0, key_type)})
    ix.write({"c": _table([(k, 1, 1) for k in keys[half:]], 1, key_type)})
    ix.seal("c", 2)
    ix.allow_compaction("c", 1)
    while ix.maintain():
        pass
    ix.set_options(Options(inline_threshold=0, batch_rows=64, background_compaction=False,
                           compaction=CompactionPolicy(final_rows=1 << 30, fanin=1 << 20)))
    upd = [(keys[3], 1, -1), (keys[-1], 1, -1), (keys[-2], 2, 1), (keys[10], 5, 1)]
    if kind == "float":
        upd += [(0.0, 1, 1), (float("nan"), 3, 1)]
    ix.write({"c": _table(upd, 2, key_type)})
    ix.seal("c", 3)
    url = str(tmp_path)
    assert _layered_plan(url, 2)
    want = _client(tmp_path, 2, consolidated=True)
    got = _native(spark, url, 2, consolidated=True)
    assert got == want
    assert canon(PersistTable.forPath(spark, url, "c").toDF(as_of=1).toArrow()) == \
        _client(tmp_path, 1, consolidated=True)
