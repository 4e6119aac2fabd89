"""W9's issue-28 compaction rows (``bench/workloads/w9_base.py``): they become the issue's
targets as ratios of the same run (cheap: the report only), and their quick mode does what
each row says (behaviour, never timing): the write amplification counts merges and marks
steps, the background brings the bulk load into the base through the merge worker while W2's
appends run (``optimize()`` and ``maintain()`` on Spark: tests/spark/test_bench_w9.py, on the
suite's shared session)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.report import render_workload, targets
from bench.results import WorkloadResult
from bench.workloads import w9_base
from bench.workloads.context import Context


def _ctx(tmp_path: Path) -> Context:
    return Context(argparse.Namespace(repeats=1, peer_repeats=1), tmp_path, ["persist", "floor"])


def test_issue_28s_compaction_rows_are_its_targets_as_ratios() -> None:
    res = WorkloadResult("W9", "Spark")
    for metric, ours in ((w9_base.OPTIMIZE, 8.0), (w9_base.OPTIMIZE_WARM, 3.0)):
        res.add(metric, "s", "lower", "persist", ours)
        res.add(metric, "s", "lower", "floor", 30.0)
        res.add(metric, "s", "lower", w9_base.MAINTAIN, 3.0)
    res.add(w9_base.AMPLIFICATION, "x", "lower", "persist", 12.5)
    for column, p50 in (("persist", 1.1), (w9_base.NO_MERGE, 1.0)):
        res.add(w9_base.APPEND_P50, "ms", "lower", column, p50)
    got = {t.id: t for t in targets({"W9": res})}
    assert got["W9.optimize/spark"].value == pytest.approx(30 / 8)
    assert got["W9.optimize/spark"].met
    assert got["W9.optimize/maintain"].value == pytest.approx(8 / 3)
    assert not got["W9.optimize/maintain"].met
    assert got["W9.optimize-warm/spark"].value == pytest.approx(10.0)
    assert got["W9.optimize-warm/maintain"].value == pytest.approx(1.0)
    assert got["W9.optimize-warm/maintain"].met
    assert got["W9.write-amplification"].value == pytest.approx(12.5)
    assert not got["W9.write-amplification"].met
    assert got["W9.append-p50/no-merge"].value == pytest.approx(1.1)
    assert got["W9.append-p50/no-merge"].met


def test_rows_that_did_not_run_list_no_target() -> None:
    got = {t.id for t in targets({"W9": WorkloadResult("W9", "Spark")})}
    assert not any(t.startswith(("W9.optimize", "W9.write-amplification", "W9.append-p50"))
                   for t in got)


def test_quick_rows_without_spark(tmp_path: Path) -> None:
    res = WorkloadResult("W9", "Spark")
    ctx = _ctx(tmp_path)
    amp = w9_base.amplification(ctx, res, quick=True)
    default, no_marks = amp["default"], amp["no marks"]
    # the default policy takes marks steps once the base passes marks_rows; without them,
    # only merges; both wrote more than they appended, and the marked parts' shared data
    # blobs are not counted as written again
    assert default["marks_steps"] >= 1
    assert no_marks["marks_steps"] == 0
    assert no_marks["merges"] >= 1
    for case in (default, no_marks):
        assert case["write_amplification_rows"] > 1
        assert case["merge_rows"] < case["merges"] * case["layout"]["rows"]
        assert case["layout"]["base_disjoint"]
    assert res.median(w9_base.AMPLIFICATION, "persist") == default["write_amplification_rows"]
    assert res.median(w9_base.AMPLIFICATION_NO_MARKS, "persist") == \
        no_marks["write_amplification_rows"]

    out = w9_base.appends(ctx, res, bulk_appends=2, part_rows=150_000, repeats=1, quick=True)
    runs = {r["case"]: r for r in out["runs"]}
    assert set(runs) == {"baseline", "worker", "in-process", "cpu", "io", "io-chunked"}
    for case in ("baseline", "cpu", "io", "io-chunked"):  # the appends alone or beside a busy child
        assert runs[case]["into_base_s"] is None
        assert runs[case]["appends"] == 20
    # the background brought the bulk load into the base, in its merge worker or in the
    # writer's process, while the appends ran (no call from the user)
    for case in ("worker", "in-process"):
        assert runs[case]["into_base_s"] is not None
        assert runs[case]["appends"] >= 1
    assert runs["worker"]["workers_started"] >= 1
    assert runs["in-process"]["workers_started"] == 0
    for metric in (w9_base.APPEND_P50, w9_base.APPEND_P50_IN_PROCESS, w9_base.APPEND_P50_CPU,
                   w9_base.APPEND_P50_IO, w9_base.APPEND_P50_IO_CHUNKED):
        assert set(res.metrics[metric].samples) == {"persist", w9_base.NO_MERGE}
    for metric in (w9_base.INTO_BASE, w9_base.INTO_BASE_IN_PROCESS):
        assert len(res.metrics[metric].samples["persist"]) == 1
    ids = {t.id for t in targets({"W9": res})}
    assert {"W9.write-amplification", "W9.append-p50/no-merge"} <= ids
    head = render_workload(res, ["persist", "floor"]).splitlines()[1]
    assert f"p/{w9_base.NO_MERGE}" in head
