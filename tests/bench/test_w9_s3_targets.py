"""W9's issue-30 rows (``bench/workloads/w9_s3.py``) become the issue's targets as ratios of
the same run: native write against the sorted Parquet write and against the sink, native read
and its requests through S3A against Parquet's, and the seconds to the typed error against
Spark's. Cheap: the report only (the rows themselves run in W9's quick smoke test)."""

from __future__ import annotations

import pytest

from bench.report import render_workload, targets
from bench.results import WorkloadResult
from bench.workloads import w9_s3


def test_issue_30s_rows_are_its_targets_as_ratios() -> None:
    res = WorkloadResult("W9", "Spark")
    res.extra.append(w9_s3.SINK)
    write = w9_s3.WRITE_SORTED.format(where="local files")
    for column, v in (("persist", 900.0), ("floor", 1000.0), (w9_s3.SINK, 450.0)):
        res.add(write, "rec/s", "higher", column, v)
    read = w9_s3.S3_READ.format(server="moto")
    res.add(read, "rec/s", "higher", "persist", 950.0)
    res.add(read, "rec/s", "higher", "floor", 1000.0)
    for which, ours in (("first", 14.0), ("later", 6.0)):
        m = w9_s3.S3_REQUESTS.format(which=which, server="moto")
        res.add(m, "requests", "lower", "persist", ours)
        res.add(m, "requests", "lower", "floor", 16.0 if which == "first" else 11.0)
    err = w9_s3.TYPED_ERROR.format(server="moto")
    res.add(err, "s", "lower", "persist", 0.5)
    res.add(err, "s", "lower", "floor", 0.4)
    got = {t.id: t for t in targets({"W9": res})}
    assert got["W9.write-local/parquet-sorted"].value == pytest.approx(0.9)
    assert got["W9.write-local/parquet-sorted"].met
    assert got["W9.write-local/sink"].value == pytest.approx(2.0)
    assert got["W9.write-local/sink"].met
    assert got["W9.s3-read-moto/parquet"].value == pytest.approx(0.95)
    assert got["W9.s3-requests-first-moto/parquet"].value == pytest.approx(14 / 16)
    assert got["W9.s3-requests-first-moto/parquet"].met
    assert got["W9.s3-requests-later-moto/parquet"].value == pytest.approx(6 / 11)
    assert got["W9.s3-typed-error-moto/spark"].value == pytest.approx(1.25)
    assert not got["W9.s3-typed-error-moto/spark"].met
    # rows that did not run (ministack, S3 writes) are not listed
    assert not any("ministack" in t or t.startswith("W9.write-moto") for t in got)
    table = render_workload(res, ["persist", "floor"])
    assert "p/sink" in table.splitlines()[1]
