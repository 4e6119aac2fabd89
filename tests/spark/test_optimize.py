"""``PersistTable.optimize()``: a distributed compaction run as a Spark job (tasks merge and
stage key ranges on executors, the driver commits once)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import persist
from operators import PersistTable
from persist.indexed.maintenance import compact
from persist.indexed.state.transitions import effective_since

pytestmark = pytest.mark.spark


def _options() -> persist.Options:
    # NB: pinned: no background compaction (the test decides what merges), record batches
    # small enough that a task decodes only its range's batches
    return persist.Options(background_compaction=False, batch_rows=1 << 12, stats_bytes=4096)


def _batch(seed: int, t: int, n: int = 30_000) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = rng.integers(-(1 << 50), 1 << 50, n)
    keys[: n // 5] = rng.integers(0, 500, n // 5)
    return pa.table({"key": pa.array(keys), "value": pa.array(rng.integers(0, 4, n)),
                     "time": pa.array(np.full(n, t), pa.uint64()),
                     "diff": pa.array(rng.choice([-1, 1, 1, 3], n).astype(np.int64))})


def _sums(t: pa.Table) -> Counter[tuple[int, int]]:
    out: Counter[tuple[int, int]] = Counter()
    for k, v, d in zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                       t.column("diff").to_pylist(), strict=True):
        out[(k, v)] += d
    return +out


def test_optimize_merges_the_collection_into_a_base_with_spark_tasks(
        tmp_path: Path, spark: Any) -> None:
    url = f"file://{tmp_path}"
    with persist.open(tmp_path, options=_options()) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(4):
            w.append(_batch(t, t), upper=t + 1).result()
        w.allow_compaction(2).result()
        w.append([((1, 1), 4, 1)], upper=5).result()  # a run beyond the since: kept as it is
        want = {t: _sums(r.snapshot(t).to_arrow()) for t in (2, 3, 4)}
        before = {p.id for p in client.state.collections["c"].parts}
    table = PersistTable.forPath(spark, url, "c")
    done = table.optimize(partitions=3)
    assert done is not None
    assert done.tasks == 3
    assert done.rows_in == 3 * 30_000
    assert 0 < done.rows_out < done.rows_in  # repeated keys merged
    with persist.open(tmp_path, options=_options()) as client:
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert {t: _sums(r.snapshot(t).to_arrow()) for t in (2, 3, 4)} == want
        c = client.state.collections["c"]
        base, runs = compact.layout(c, effective_since(c))
        assert len(base) == done.added
        assert sorted(p.max_time for p in runs) == [3, 4]  # appends past the since stay runs
        assert len(before - {p.id for p in c.parts}) == done.removed
        assert done.removed == 3
    got = table.toDF(as_of=2).toArrow()
    assert _sums(got) == want[2]
    assert table.optimize() is None  # nothing left to merge


def test_optimize_refuses_bad_arguments(tmp_path: Path, spark: Any) -> None:
    with persist.open(tmp_path) as client:
        client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    table = PersistTable.forPath(spark, f"file://{tmp_path}", "c")
    with pytest.raises(persist.InvalidUsage, match="partitions"):
        table.optimize(partitions=0)
    with pytest.raises(persist.InvalidUsage, match="zorder"):
        table.optimize(zorder="key")
    assert table.optimize() is None  # an empty collection: nothing to merge


def test_optimize_of_a_small_collection_runs_one_task(tmp_path: Path, spark: Any) -> None:
    """With ``partitions=None`` the task count follows the planned rows (one task per
    ``TASK_ROWS``), not the session's cores: 90,000 rows are merged by one task."""
    from operators.optimize import TASK_ROWS

    assert int(spark.sparkContext.defaultParallelism) >= 2
    assert TASK_ROWS > 3 * 30_000
    with persist.open(tmp_path, options=_options()) as client:
        w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        for t in range(3):
            w.append(_batch(t, t), upper=t + 1).result()
        w.allow_compaction(2).result()
        want = _sums(r.snapshot(2).to_arrow())
    done = PersistTable.forPath(spark, f"file://{tmp_path}", "c").optimize()
    assert done is not None
    assert done.tasks == 1
    assert done.rows_in == 3 * 30_000
    with persist.open(tmp_path, options=_options()) as client:
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert _sums(r.snapshot(2).to_arrow()) == want


_DAEMON_DRIVER = """
import json, os, sys
import pyarrow as pa
import persist
from operators import PersistTable
from tests.spark.support import session_builder

def loaded(_):
    return "persist.distributed" in sys.modules and "pyarrow" in sys.modules

out = {}
for daemon in (None, "operators.daemon"):
    b = session_builder("daemon")
    if daemon:
        b = b.config("spark.python.daemon.module", daemon)
    spark = b.getOrCreate()
    out[str(daemon)] = spark.sparkContext.parallelize([0], 1).map(loaded).collect()[0]
    if daemon:
        loc = sys.argv[1]
        with persist.open(loc) as client:
            w, _ = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
            for t in range(3):
                w.append([((k, k), t, 1) for k in range(100)], upper=t + 1).result()
            w.allow_compaction(2).result()
        done = PersistTable.forPath(spark, "file://" + loc, "c").optimize()
        out["optimized"] = [done.tasks, done.rows_in, done.rows_out]
    spark.stop()
print(json.dumps(out))
"""


def test_the_preloading_daemon_starts_workers_with_persist_imported(tmp_path: Path) -> None:
    """``operators.daemon`` (``spark.python.daemon.module``): its forked Python workers have
    persist and pyarrow loaded before a task runs (Spark's own daemon's do not), and
    ``optimize()`` runs in them. Its own sessions, in a child process (the shared session
    uses Spark's daemon)."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [str(root),
                                                        os.environ.get("PYTHONPATH")])))
    got = subprocess.run([sys.executable, "-c", _DAEMON_DRIVER, str(tmp_path / "loc")],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out == {"None": False, "operators.daemon": True, "optimized": [1, 300, 100]}
