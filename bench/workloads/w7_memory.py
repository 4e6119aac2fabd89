"""W7 memory: peak RSS while writing and while reading W1's data (``--w7-appends`` x
``--w7-rows``), each system in a fresh process (``bench.workloads.w7_child``).

Reported: the baseline (interpreter + the system's imports + an empty table), and the peaks
*above that baseline* while writing and while reading, so the import footprint of each package
does not blur the comparison (the baseline is reported too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.common import MiB, fresh_dir, remove, rotate
from bench.results import WorkloadResult
from bench.workloads.context import Context

WID = "W7"
TITLE = "memory"
REPO = Path(__file__).resolve().parents[2]


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    n, rows = a.w7_appends, a.w7_rows
    res = WorkloadResult(WID, f"{TITLE}: peak RSS writing {n} x {rows:,} records, then reading "
                         "them (fresh process per system)",
                         params={"appends": n, "rows": rows, "repeats": a.w7_repeats})
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for r in range(a.w7_repeats):
        for name in rotate(ctx.systems, r):
            ctx.log(f"W7 round {r + 1}/{a.w7_repeats}: {name}")
            root = fresh_dir(ctx.work, f"w7-r{r}-{name}")
            try:
                out = subprocess.run(
                    [sys.executable, "-m", "bench.workloads.w7_child", name, str(root),
                     str(n), str(rows)],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"W7 child for {name} failed:\n{out.stderr[-3000:]}")
                m = json.loads(out.stdout.strip().splitlines()[-1])
                if m["rows"] != n * rows + 10:
                    raise AssertionError(f"{name} read {m['rows']} rows")
            finally:
                remove(root)
            base = m["baseline"]
            res.add("peak RSS above baseline, writing (MiB)", "MiB", "lower", name,
                    (m["write_peak"] - base) / MiB)
            res.add("peak RSS above baseline, reading (MiB)", "MiB", "lower", name,
                    (m["read_peak"] - base) / MiB)
            res.add("baseline RSS (MiB)", "MiB", None, name, base / MiB)
            res.add("peak RSS, reading (MiB)", "MiB", "lower", name, m["read_peak"] / MiB)
    res.notes.append(f"raw data: {n * rows * 32 / MiB:,.0f} MiB of Arrow (4 int64 columns); "
                     "a full read must hold all of it")
    return [res]
