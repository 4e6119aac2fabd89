"""Smoke test of ``python -m bench.compaction_base offgil`` at a small size: it runs to the end,
the merging cases bring the bulk load into the base, the worker case merges in the worker, and
the cases beside a busy child run the baseline's appends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_offgil_runs_every_case_and_the_worker_case_uses_the_worker() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    # 2 x 150 k rows: past the default merge_worker_rows (256 Ki), so the base merge goes to
    # the worker in the worker case
    out = subprocess.run(
        [sys.executable, "-m", "bench.compaction_base", "offgil", "--rows", "150000",
         "--appends", "2", "--rounds", "1", "--baseline-appends", "20",
         "--cases", "baseline,in-process,worker,cpu,io,io-chunked",
         "--beside-part-mib", "2", "--beside-flush-mib", "1"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=600).stdout
    result = json.loads(out[out.index("{\n"):])
    runs = {r["case"]: r for r in result["runs"]}
    assert set(runs) == {"baseline", "in-process", "worker", "cpu", "io", "io-chunked"}
    # the baseline's appends, alone or beside a child doing one kind of the worker's work
    for case in ("baseline", "cpu", "io", "io-chunked"):
        assert runs[case]["appends"] == 20
        assert runs[case]["into_base_s"] is None
        assert runs[case]["workers_started"] == 0
    assert runs["in-process"]["workers_started"] == 0
    assert runs["worker"]["workers_started"] >= 1
    for case in ("in-process", "worker"):
        assert runs[case]["into_base_s"] is not None
        assert runs[case]["appends"] >= 1
