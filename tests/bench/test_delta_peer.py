"""W9's Delta peer (``bench/systems/delta_spark.py``): its report protocol and how W9 renders it
(cheap, everywhere), the versions ``./dev delta-env`` installs, and the peer itself in its own
environment (only where ``./dev delta-env`` created it: a ~500 MB download CI does not make).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from bench.common import make_batch
from bench.report import render_workload
from bench.results import WorkloadResult
from bench.systems import delta_spark as ds

ROOT = Path(__file__).resolve().parents[2]


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "protocol": ds.PROTOCOL, "pyspark": "4.0.5", "delta": "4.0.1", "rows": 1000,
        "rounds": 2,
        "seconds": {"delta write": [2.0, 4.0, 4.0], "parquet write": [1.0, 1.0],
                    "delta read": [0.5, 0.5], "parquet read": [0.25, 0.25],
                    ds.DELTA_FILES: [0.5, 0.5],
                    ds.MERGED_READ: [1.0, 1.0], ds.PARQUET_RDD: [0.5, 0.5],
                    ds.MERGE: [3.0]},
        "merge": {"deleted": 10, "inserted": 10, "rows_after": 1000, "deletion_vectors": True},
    }
    doc.update(over)
    return doc


def test_parse_takes_the_marked_line_among_spark_noise() -> None:
    out = "\n".join(["Setting default log level to WARN", ds.MARKER + json.dumps(_doc()),
                     "26/11/29 INFO ShutdownHookManager: deleting"])
    assert ds.parse(out) == _doc()


@pytest.mark.parametrize(("out", "says"), [
    ("Spark said something\n", "no result line"),
    (ds.MARKER + "{not json", "not JSON"),
    (ds.MARKER + json.dumps(_doc(protocol=99)), "protocol 99"),
    (ds.MARKER + json.dumps(_doc(seconds={"delta write": [1.0]})), "parquet write"),
    (ds.MARKER + json.dumps(_doc(rows=0)), "rows=0"),
])
def test_parse_refuses_a_bad_report_saying_what_was_wrong(out: str, says: str) -> None:
    with pytest.raises(ds.PeerError, match=re.escape(says)):
        ds.parse(out)


def test_w9_reports_delta_beside_persist_with_the_sessions_ratios() -> None:
    res = WorkloadResult("W9", "Spark")
    res.add("write", "rec/s", "higher", "persist", 1000.0)
    res.add("read", "rec/s", "higher", "persist", 4000.0)
    ds.add_to(res, ds.parse(ds.MARKER + json.dumps(_doc())), write="write", reads=("read",),
              updated="updated", merge="merge")
    # medians of records/s: write 250; read 2000; merged 1000 (1000 rows)
    assert res.median("write", "delta") == pytest.approx(250)
    assert res.median("write", ds.PARQUET_COLUMN) == pytest.approx(1000)
    assert res.median("read", "delta") == pytest.approx(2000)
    assert res.median("read", ds.PARQUET_COLUMN) == pytest.approx(4000)
    assert res.median("updated", "delta") == pytest.approx(1000)
    assert res.median("updated", ds.PARQUET_COLUMN) == pytest.approx(2000)
    assert res.median("merge", "delta") == pytest.approx(3.0)
    assert res.status["delta"] == "ok"
    assert ds.PARQUET_COLUMN not in res.status  # a column, not a system
    note = res.notes[-1]
    assert "delta-spark 4.0.1 on pyspark 4.0.5" in note
    assert "write 0.25x" in note
    assert "read 0.50x" in note
    assert "Delta's own data files read as plain Parquet 0.50x" in note
    assert "10 deletes and 10 inserts (deletion vectors on) 0.50x" in note
    table = render_workload(res, ["persist", "floor", "delta"])
    head = table.splitlines()[1]
    assert "parquet (pyspark 4.0.5, Delta's JVM)" in head
    assert "p/delta" in head
    read_row = next(ln for ln in table.splitlines() if ln.strip().startswith("read"))
    assert "2.00" in read_row.split()  # persist 4000 / delta 2000


def test_without_its_environment_the_peer_is_skipped_naming_the_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ds, "VENV", tmp_path / "absent")
    why = ds.unavailable()
    assert why is not None
    assert "./dev delta-env" in why
    assert "pyspark 4.3" in why
    with pytest.raises(ds.PeerError, match="delta-env"):
        ds.measure(str(tmp_path), tmp_path / "work", rounds=1, quick=True)


def test_the_versions_agree_across_dev_the_pom_and_the_peer() -> None:
    dev = (ROOT / "dev").read_text()
    assert f'"pyspark=={ds.PYSPARK}"' in dev
    assert f'"delta-spark=={ds.DELTA}"' in dev
    pom = (ROOT / "tests" / "support" / "maven" / ds.JAR_SET / "pom.xml").read_text()
    assert f"<delta.version>{ds.DELTA}</delta.version>" in pom
    # delta-spark 4.0.x is built for Spark 4.0 with Scala 2.13, as pyspark 4.0 is
    assert ds.PYSPARK.split(".")[:2] == ds.DELTA.split(".")[:2] == ["4", "0"]
    assert "<delta.artifact>delta-spark_2.13</delta.artifact>" in pom


@pytest.mark.spark
@pytest.mark.skipif(ds.unavailable() is not None, reason=str(ds.unavailable()))
def test_the_peer_writes_and_reads_delta_in_its_own_environment(tmp_path: Path) -> None:
    src = tmp_path / "parquet"
    src.mkdir()
    for i in range(2):
        pq.write_table(make_batch(9000 + i, 3000, time_lo=i), src / f"part-{i}.parquet")
    doc = ds.measure(str(src), tmp_path / "work", rounds=1, quick=True, timeout=900)
    assert doc["rows"] == 6000
    assert (doc["pyspark"], doc["delta"]) == (ds.PYSPARK, ds.DELTA)
    for case in (*ds.CASES, ds.DELTA_FILES, ds.MERGED_READ, ds.PARQUET_RDD, ds.MERGE):
        assert len(doc["seconds"][case]) >= 1
        assert all(s > 0 for s in doc["seconds"][case])
    # 1% of the rows deleted and as many inserted, through deletion vectors
    assert doc["merge"] == {"deleted": 60, "inserted": 60, "rows_after": 6000,
                            "deletion_vectors": True}
    assert not (tmp_path / "work").exists()
