"""W9's compaction rows (``bench/workloads/w9_base.py``) on the suite's shared Spark session:
``optimize()`` and ``maintain()`` leave the same key-disjoint base and the rows become the
issue's targets (behaviour, never timing). Here, not in tests/bench, because the bench's own
session helper starts and ends a JVM of its own, which a process that already runs the
suite's session must not do (that ended the shared JVM in two CI runs: the test below)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench.report import targets
from bench.results import WorkloadResult
from bench.workloads import w9_base
from bench.workloads.context import Context


def test_quick_compaction_rows_on_spark(spark: Any, tmp_path: Path) -> None:
    res = WorkloadResult("W9", "Spark")
    ctx = Context(argparse.Namespace(repeats=1, peer_repeats=1), tmp_path, ["persist", "floor"])
    times, layouts = w9_base.compaction(ctx, res, spark, tmp_path / "w9", appends=2,
                                        part_rows=5_000, repeats=1, quick=True)
    for case in ("maintain", "optimize", "optimize_warm", "spark"):
        assert len(times[case]) == 1, case  # the warm-up round is not counted
    # optimize() and maintain() each brought every row into one key-disjoint base
    for case in ("maintain", "optimize"):
        lay = layouts[case]
        assert lay["base_rows"] == lay["rows"] == 10_000, (case, lay)
        assert lay["runs"] == 0, (case, lay)
        assert lay["base_disjoint"], (case, lay)
        assert lay["base_consolidated"], (case, lay)
    for metric in (w9_base.OPTIMIZE, w9_base.OPTIMIZE_WARM):
        assert set(res.metrics[metric].samples) == {"persist", "floor", w9_base.MAINTAIN}
    ids = {t.id for t in targets({"W9": res})}
    assert {"W9.optimize/spark", "W9.optimize/maintain", "W9.optimize-warm/spark",
            "W9.optimize-warm/maintain"} <= ids
    assert not (tmp_path / "w9" / "compaction").exists()


def test_the_bench_session_refuses_to_take_over_a_running_one(spark: Any) -> None:
    from bench.workloads import w9_spark

    with pytest.raises(RuntimeError, match="already runs in this process"), \
            w9_spark.spark_session(fast_start=True):
        pass
    # the suite's session is untouched: same JVM, still answering
    assert spark.range(3).count() == 3
