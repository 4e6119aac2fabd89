"""W9's rows for issue 28 beyond the read stages (which :func:`bench.workloads.w9_spark.stages`
measures), each against its target in one run, by the functions of the benches that measured
them alone:

* **Distributed compaction** (:func:`compaction`; :func:`bench.compaction_optimize.measure`):
  W9's shape (appends of ``part_rows`` random int64 keys, since at the last time) compacted
  on fresh copies of one location by ``PersistTable.optimize(partitions=2)`` on W9's
  ``local[2]`` session, with fresh Python workers (held until 65 s after the last Python
  task: what a lone call costs) and with live ones, by ``Client.maintain()`` in this process
  (:data:`MAINTAIN` column), and the same rows through Spark's ``read.parquet -> groupBy(key,
  value).sum(diff) -> filter -> sortWithinPartitions -> zstd parquet`` (floor column).
  Targets: Spark's pipeline >= 3x ``optimize()``'s wall, ``optimize()`` <= 2x
  ``maintain()``'s.
* **Lifetime write amplification** (:func:`amplification`;
  :func:`bench.compaction_base.amplification`): 100 appends with 1% updates each, the since
  following, maintenance to idle after each; rows (and bytes) written by appends and merges
  over those appended, with the default policy and without its marks step. At 10,000 rows an
  append (the policy's row and byte thresholds scaled down with the rows), not the issue's
  1 M: 100 M rows do not fit W9's run. Target <= 10.
* **Appends while the background brings a bulk load into the base** (:func:`appends`;
  :func:`bench.compaction_base.offgil`): W2's appends (100 records, acknowledged one by one)
  on a location that also holds W9's bulk load, not yet in the base; ``worker`` (the since
  advanced: the background merges it, in its merge worker by default, without any call) in
  the persist column, ``baseline`` (nothing to merge) in the :data:`NO_MERGE` column, and
  ``in-process`` (the merge in the writer's process) in rows of its own. Target: p50 <= 1.2x
  (the default, the worker); the time to the base is reported. Two rows without a target say
  what a miss is made of: the same appends beside a child at the worker's niceness that only
  spins (``cpu``), or only writes and fsyncs 16 MiB files (``io``); a third, the same files
  also flushed every 1 MiB as they are written (``io-chunked``), as persist's file store
  writes a part (``FileBlob.flush_bytes``).

``--quick`` (``bench.run --quick``, :func:`main`): the same steps at small sizes, one round,
``optimize``'s fresh workers not waited for (its row then measures live workers too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from bench import compaction_base, compaction_optimize
from bench.results import WorkloadResult
from bench.workloads.context import Context

#: W9's columns of this module: ``maintain()`` beside ``optimize()``, and W2's appends with
#: nothing to merge beside the same appends during the merge (not systems: no status).
MAINTAIN = "maintain()"
NO_MERGE = "no merge"
OPTIMIZE = ("compaction of the bulk load into the base, wall (s): optimize(partitions=2), "
            "fresh Python workers (floor: Spark's aggregate-sort-write; maintain(): in one "
            "process)")
OPTIMIZE_WARM = ("compaction of the bulk load into the base, wall (s): optimize(partitions=2), "
                 "live Python workers (floor: Spark's aggregate-sort-write; maintain(): in one "
                 "process)")
AMPLIFICATION = "lifetime write amplification, appends with 1% updates (rows written / appended)"
AMPLIFICATION_BYTES = ("lifetime write amplification, appends with 1% updates (bytes written / "
                       "appended)")
AMPLIFICATION_NO_MARKS = ("lifetime write amplification without the marks step (rows written "
                          "/ appended)")
APPEND_P50 = ("W2 append p50 while the background brings a bulk load into the base (ms; no "
              "merge: the same appends, nothing to merge)")
APPEND_P99 = ("W2 append p99 while the background brings a bulk load into the base (ms; no "
              "merge: the same appends, nothing to merge)")
INTO_BASE = "bulk load into the base by background compaction, no call (s)"
#: The same two with the merge in the writer's process (``merge_worker_rows=None``): what the
#: merge worker is weighed against (no target).
APPEND_P50_IN_PROCESS = ("W2 append p50 while the background brings a bulk load into the base, "
                         "merge in the writer's process (ms; no merge: as above)")
#: W2's appends with nothing to merge beside a child at the merge worker's niceness doing one
#: kind of its work (:data:`bench.compaction_base._BESIDE`): what a miss of the p50 target is
#: made of, in the same run (no target).
APPEND_P50_CPU = ("W2 append p50 beside a niced process that only spins (ms; no merge: the "
                  "same appends alone)")
APPEND_P50_IO = ("W2 append p50 beside a niced process that only writes and fsyncs 16 MiB "
                 "files (ms; no merge: the same appends alone)")
APPEND_P50_IO_CHUNKED = ("W2 append p50 beside a niced process that writes the same files, "
                         "flushed every 1 MiB as persist writes parts (ms; no merge: the same "
                         "appends alone)")
INTO_BASE_IN_PROCESS = ("bulk load into the base by background compaction, no call, merge in "
                        "the writer's process (s)")
_BESIDE_ROWS = {"cpu": APPEND_P50_CPU, "io": APPEND_P50_IO, "io-chunked": APPEND_P50_IO_CHUNKED}
#: The issue's size of an append for the amplification target, and the one W9 runs at.
AMPLIFICATION_ISSUE_ROWS = 1_000_000
AMPLIFICATION_ROWS = 10_000


def _columns(res: WorkloadResult) -> None:
    for column, heading in ((MAINTAIN, "Client.maintain() (one process)"),
                            (NO_MERGE, "no merge (W2's appends alone)")):
        if column not in res.extra:
            res.extra.append(column)
            res.columns[column] = heading


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def compaction(ctx: Context, res: WorkloadResult, spark: Any, root: Path, *, appends: int,
               part_rows: int, repeats: int, quick: bool
               ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """:data:`OPTIMIZE` and :data:`OPTIMIZE_WARM` (see the module docstring), ``repeats``
    rounds after one warm-up round, on ``spark`` (W9's session). Returns what
    :func:`bench.compaction_optimize.measure` did."""
    _columns(res)
    work = root / "compaction"
    ctx.log(f"W9: distributed compaction: building {appends} appends of {part_rows:,} rows")
    loc, files = compaction_optimize._build(work, appends, part_rows)
    load0 = _load()
    idle = 0.0 if quick else compaction_optimize.IDLE_S
    try:
        times, layouts = compaction_optimize.measure(spark, work, loc, files, repeats,
                                                     idle_s=idle, log=ctx.log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for metric, case in ((OPTIMIZE, "optimize"), (OPTIMIZE_WARM, "optimize_warm")):
        for v in times[case]:
            res.add(metric, "s", "lower", "persist", v)
        for v in times["spark"]:
            res.add(metric, "s", "lower", "floor", v)
        for v in times["maintain"]:
            res.add(metric, "s", "lower", MAINTAIN, v)
    lay = {k: (v["base_parts"], v["base_rows"], v["base_disjoint"], v["parts"])
           for k, v in layouts.items()}
    res.notes.append(
        f"distributed compaction (issue 28): {appends} appends of {part_rows:,} random int64 "
        f"keys, since at the last time, one warm-up round then {repeats} round(s), each case on "
        f"a fresh copy: maintain() until False with its merge in this process (CPU median "
        f"{statistics.median(times['maintain_cpu']):.2f} s), optimize(partitions=2) "
        + ("(--quick: not held for fresh workers, so both optimize rows had live ones)"
           if quick else f"held {idle:g} s after the round's last Python task (fresh Python "
                         f"workers), then again at once (live workers)")
        + f", Spark's read.parquet -> groupBy(key, value).sum(diff) -> filter(!= 0) -> "
        f"sortWithinPartitions -> zstd parquet over the same rows as {appends} zstd files; "
        f"layouts left (base parts, base rows, key-disjoint, parts): {lay}; load average "
        f"(1/5/15 min) {load0} before, {_load()} after")
    return times, layouts


def amplification(ctx: Context, res: WorkloadResult, *, quick: bool) -> dict[str, dict[str, Any]]:
    """:data:`AMPLIFICATION` (and in bytes) with the default policy, and
    :data:`AMPLIFICATION_NO_MARKS` with its marks step off (``marks_rows`` never reached).
    ``quick``: 30 appends of 4,000 rows (enough for base merges and marks steps). Returns
    what :func:`bench.compaction_base.amplification` did, per case (``default``, ``no
    marks``)."""
    appends, rows = (30, 4_000) if quick else (100, AMPLIFICATION_ROWS)
    scale = rows / AMPLIFICATION_ISSUE_ROWS
    out: dict[str, dict[str, Any]] = {}
    for case, marks_rows in (("default", None), ("no marks", 1 << 62)):
        ctx.log(f"W9: write amplification, {appends} appends of {rows:,} rows, {case}")
        args = argparse.Namespace(appends=appends, rows=rows, updates=0.01,
                                  part_target=max(1, int((64 << 20) * scale)),
                                  marks_rows=marks_rows, maintain_each=True)
        out[case] = compaction_base.amplification(args)
    d, n = out["default"], out["no marks"]
    res.add(AMPLIFICATION, "x", "lower", "persist", d["write_amplification_rows"])
    res.add(AMPLIFICATION_BYTES, "x", "lower", "persist", d["write_amplification_bytes"])
    res.add(AMPLIFICATION_NO_MARKS, "x", "lower", "persist", n["write_amplification_rows"])
    res.notes.append(
        f"write amplification (issue 28): {appends} appends of {rows:,} rows, 1% of them "
        f"retractions of earlier rows and as many new values, the rest new keys; since "
        f"following the upper, maintain() to idle after each append (a memory store); the "
        f"policy's thresholds scaled by {scale:g} from 1 M-row appends (part target "
        f"{int((64 << 20) * scale):,} B, final_rows {max(1, rows // 2):,}, marks_rows "
        f"{d['marks_rows']:,}); written = appended + the parts merges added (a marked base "
        f"part's shared data blob not counted, its marks blob in the bytes). Default policy: "
        f"{d['merges']} commits of merges, {d['marks_steps']} of them marks steps, "
        f"{d['merge_rows']:,} rows merged, {d['write_amplification_rows']} (rows), "
        f"{d['write_amplification_bytes']} (bytes); without the marks step: {n['merges']} "
        f"merges, {n['write_amplification_rows']} (rows), {n['write_amplification_bytes']} "
        f"(bytes)")
    return out


def appends(ctx: Context, res: WorkloadResult, *, bulk_appends: int, part_rows: int,
            repeats: int, quick: bool) -> dict[str, Any]:
    """:data:`APPEND_P50`, :data:`APPEND_P99` and :data:`INTO_BASE` (see the module
    docstring), and :data:`APPEND_P50_IN_PROCESS` and :data:`INTO_BASE_IN_PROCESS` with the
    merge in the writer's process, ``repeats`` rounds of the three cases, order rotated.
    ``--quick``: 2 appends of
    150,000 rows (past the merge worker's default threshold, so the worker merges). Returns
    what :func:`bench.compaction_base.offgil` did."""
    _columns(res)
    args = argparse.Namespace(
        appends=2 if quick else bulk_appends, rows=150_000 if quick else part_rows,
        w2_rows=100, baseline_appends=20 if quick else 500, rounds=repeats,
        cases="baseline,worker,in-process,cpu,io,io-chunked", beside_part_mib=16,
        beside_flush_mib=1)
    ctx.log(f"W9: W2's appends while a bulk load of {args.appends} x {args.rows:,} rows is "
            f"brought into the base, {repeats} round(s)")
    out = compaction_base.offgil(args, log=ctx.log)
    for run in out["runs"]:
        if run["case"] == "baseline":
            for metric in (APPEND_P50, APPEND_P50_IN_PROCESS, APPEND_P50_CPU, APPEND_P50_IO,
                           APPEND_P50_IO_CHUNKED):
                res.add(metric, "ms", "lower", NO_MERGE, run["p50_ms"])
            res.add(APPEND_P99, "ms", "lower", NO_MERGE, run["p99_ms"])
        elif run["case"] == "worker":
            res.add(APPEND_P50, "ms", "lower", "persist", run["p50_ms"])
            res.add(APPEND_P99, "ms", "lower", "persist", run["p99_ms"])
            res.add(INTO_BASE, "s", "lower", "persist", run["into_base_s"])
        elif run["case"] in _BESIDE_ROWS:
            res.add(_BESIDE_ROWS[run["case"]], "ms", "lower", "persist", run["p50_ms"])
        else:
            res.add(APPEND_P50_IN_PROCESS, "ms", "lower", "persist", run["p50_ms"])
            res.add(INTO_BASE_IN_PROCESS, "s", "lower", "persist", run["into_base_s"])
    worker = [r for r in out["runs"] if r["case"] == "worker"]
    res.notes.append(
        f"appends during the base merge (issue 28): W2's appends (100 records, acknowledged "
        f"one by one, one writer) on a file location that also holds {args.appends} appends "
        f"of {args.rows:,} random keys at times after its since; persist: the since advanced, "
        f"appends until the background (no call) has brought them into the base, latencies of "
        f"those appends, the merge in its merge worker (the default) or, in the rows so named, "
        f"in the writer's process; no merge: the since left behind, {args.baseline_appends} "
        f"appends; the rows 'beside a niced process': the no-merge appends beside a child at "
        f"the merge worker's niceness that only spins, or only writes and fsyncs 16 MiB files "
        f"into the same file system, once at each file's end or also every 1 MiB as persist's "
        f"file store writes a part (what a p50 miss is made of: CPU or disk); "
        f"each case on a fresh location, {repeats} round(s) rotated; merge worker processes "
        f"started per worker case: {[r['workers_started'] for r in worker]}, its start "
        f"{[r['worker_start_s'] for r in worker]} s and merge {[r['worker_merge_s'] for r in worker]} "
        f"s; load average (1 min) before and after each case: "
        f"{[(r['case'], r['load_before'], r['load_after']) for r in out['runs']]}")
    return out


def run_spark(ctx: Context, res: WorkloadResult, spark: Any, root: Path, *, rows: int,
              part_rows: int, repeats: int, quick: bool) -> None:
    """The rows that need W9's Spark session (:func:`compaction`)."""
    compaction(ctx, res, spark, root, appends=max(1, rows // part_rows), part_rows=part_rows,
               repeats=repeats, quick=quick)


def run_local(ctx: Context, res: WorkloadResult, *, rows: int, part_rows: int, repeats: int,
              quick: bool) -> None:
    """The rows that need no Spark (:func:`amplification`, :func:`appends`): W9 runs them
    after its session ended, so that its JVM does not share the cores with them."""
    amplification(ctx, res, quick=quick)
    appends(ctx, res, bulk_appends=max(1, rows // part_rows), part_rows=part_rows,
            repeats=repeats, quick=quick)


def main(argv: list[str] | None = None) -> int:
    """Issue 28's compaction rows of W9 alone (what ``bench.run --workloads W9`` runs beside
    its read stages): ``python -m bench.workloads.w9_base [--rows N] [--part-rows N]
    [--repeats N] [--quick] [--no-spark]``. Prints the rows and their targets."""
    import tempfile

    from bench.common import fresh_dir, remove
    from bench.report import render_targets, render_workload, targets
    from bench.workloads import w9_spark

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__
                                 else None)
    ap.add_argument("--rows", type=int, default=None, help="5 M (--quick: 20,000)")
    ap.add_argument("--part-rows", type=int, default=None, help="1 M (--quick: 10,000)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-spark", action="store_true", help="the rows that need no Spark only")
    a = ap.parse_args(argv)
    rows = a.rows or (20_000 if a.quick else 5_000_000)
    part_rows = a.part_rows or (10_000 if a.quick else 1_000_000)
    work = Path(tempfile.mkdtemp(prefix="persist-w9-base-"))
    ctx = Context(argparse.Namespace(repeats=a.repeats, peer_repeats=1), work,
                  ["persist", "floor"])
    res = WorkloadResult(w9_spark.WID, "issue 28's compaction rows of W9")
    res.columns["floor"] = "floor (Spark's aggregate-sort-write)"
    root = fresh_dir(work, "w9")
    try:
        if not a.no_spark:
            with w9_spark.spark_session(fast_start=a.quick) as spark:
                run_spark(ctx, res, spark, root, rows=rows, part_rows=part_rows,
                          repeats=a.repeats, quick=a.quick)
        run_local(ctx, res, rows=rows, part_rows=part_rows, repeats=a.repeats, quick=a.quick)
    finally:
        remove(work)
    print(render_workload(res, ["persist", "floor"]))
    print(render_targets(targets({w9_spark.WID: res})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
