"""W9's reads and writes from Spark with Delta's Spark peer, at W9's sizes, without W9's streaming
parts (first micro-batch, seal latency, sink overhead) and stages, which take most of its time:

    PYTHONPATH=. .venv/bin/python -m bench.w9_peers [--rows 5000000] [--part-rows 1000000]
        [--repeats 3] [--out FILE.json]

The same functions as ``python -m bench.run --workloads W9`` (``bench.workloads.w9_spark``):
``prepare`` (the rows to persist and to zstd Parquet), ``reads`` and ``writes`` in one
``local[2]`` session (default JIT), then ``delta_peer`` (``.venv-delta``, ``./dev delta-env``)
after that session ended. Prints W9's table for persist, the floor and delta, and the load
average before and after; ``--out`` also writes the workload's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import fresh_dir, remove, settle
from bench.report import render_workload
from bench.results import WorkloadResult
from bench.workloads import w9_spark as w9


class _Context:
    """What W9's functions use of ``bench.workloads.context.Context``."""

    def __init__(self) -> None:
        self.systems = ["persist", "floor", "delta"]
        self.started = time.monotonic()

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--part-rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp"))
    a = ap.parse_args(argv)
    why = w9.unavailable()
    if why is not None:
        print(f"W9 cannot run here: {why}", file=sys.stderr)
        return 1
    ctx: Any = _Context()
    res = WorkloadResult("W9", f"Spark reads and writes, {a.rows:,} records: persist, "
                               f"Parquet, Delta", params=vars(a) | {"out": str(a.out),
                                                                    "work": str(a.work)})
    res.columns["floor"] = "floor (spark.read.parquet)"
    root = fresh_dir(a.work, "persist-w9-peers")
    before = os.getloadavg()
    try:
        url, parquet = w9.prepare(root, a.rows, a.part_rows)
        settle()
        with w9.spark_session(fast_start=False) as spark:
            ctx.log("reads")
            w9.reads(ctx, res, spark, url, parquet, rows=a.rows, repeats=a.repeats,
                     with_parquet=True)
            ctx.log("writes")
            w9.writes(ctx, res, spark, parquet, root, rows=a.rows, repeats=a.repeats,
                      with_parquet=True)
        w9.delta_peer(ctx, res, parquet, root, repeats=a.repeats, quick=False)
    finally:
        remove(root)
    after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {before[0]:.1f} {before[1]:.1f} {before[2]:.1f}"
          f", after {after[0]:.1f} {after[1]:.1f} {after[2]:.1f}; {os.cpu_count()} CPUs")
    print(render_workload(res, ["persist", "floor", "delta"]))
    if a.out is not None:
        a.out.write_text(json.dumps(res.to_json(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
