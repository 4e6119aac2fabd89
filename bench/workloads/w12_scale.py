"""W12 metadata at scale: issue 29's targets ("metadata that scales"), each against its
baseline in the same run, by the functions of the benches that measured them alone. Every
part runs on a fresh local file location with ``fsync`` off (as those benches do: the
metadata's bytes, listings and decoding are measured, not the disk), persist only: each
target is persist at scale over persist at the small size, so the peers' columns are skipped
with the reason.

* **Steady appends through trims** (:func:`steady`; :func:`bench.trim_steady.steady`):
  ``--w12-steady-seconds`` of one-row appends, one after another (each its own commit), with
  a GC grace of ``--w12-grace`` seconds, so the metadata trim starts about a grace into the
  run; appends/s per bin of ``--w12-bin`` seconds. The first trim is the first delete of a
  ``meta/log/`` key (timed by patching the file store during the run). Row: the lowest bin
  that ended after it, against the last bin that ended before it. Target >= 0.8x.
* **Writer open after many short sessions** (:func:`sessions`;
  :func:`bench.trim_sessions.sessions`): ``--w12-sessions`` writer sessions of
  ``--w12-commits`` one-row commits each, one after another, with persist's default grace
  (nothing is due for trimming inside the run: every session's metadata is still there);
  then the location as it was after the first session and after the last opened in turn in
  this process, ``--w12-opens`` rounds. Rows: each open (ms), the median compared. Targets:
  <= 1.5x the open after one session, and <= 50 ms.
* **Many collections against one** (:func:`collections`; :func:`bench.rollup_pieces.measure`):
  locations of 1 and ``--w12-collections`` collections (each with one 100-row append, rolled
  up); writer opens right after the setup, alternating, each in a fresh process (timed
  there); ``--w12-seconds`` of 100-row appends to one collection of each in turn (since
  following upper every 100 appends, background maintenance on, the grace ``--w12-grace``),
  sampling the bytes under ``meta/`` (log, rollups, pieces) every second; then both writers
  open in this process for ``--w12-blocks`` alternating blocks of ``--w12-block`` appends
  (after a warm-up block each), and the opens again. Targets: append p50 <= 1.2x, writer open
  right after the setup <= 3x, and the metadata retained <= 200 MB: the most bytes under
  ``meta/`` at once (every log entry, rollup or manifest, and piece on disk, sampled once a
  second) from ``--w12-retained-from`` seconds into the appends on (by then the setup's own
  metadata has had a grace period to be trimmed, DESIGN.md §9).

The issue's other targets are W2's and W4's (``bench/report.py``: ``W2.median/floor-29``,
``W2.growth``, ``W4.persist/floor-seq``): ``python -m bench.run --workloads W2,W4,W5,W12``
reports them all in one run. ``--quick``: the same steps at small sizes, bins of a second.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from bench import rollup_pieces, trim_sessions, trim_steady
from bench.common import fresh_dir
from bench.results import WorkloadResult
from bench.workloads.context import Context

WID = "W12"
TITLE = "metadata at scale (issue 29)"
#: The column of each row's baseline (the window before the first trim, one session, one
#: collection): a workload column, not a system.
BASELINE = "baseline"
TRIM_RATE = ("appends/s in a window: the lowest after the first metadata trim (baseline: the "
             "window before it)")
OPEN_SESSIONS = ("writer open after many short sessions, in this process, alternating (ms; "
                 "baseline: after one session)")
COLLECTIONS_P50 = ("append p50 at many collections, alternating blocks (ms; baseline: one "
                   "collection)")
COLLECTIONS_P99 = ("append p99 at many collections, alternating blocks (ms; baseline: one "
                   "collection)")
COLLECTIONS_OPEN = ("writer open at many collections right after the setup, fresh process "
                    "(ms; baseline: one collection)")
COLLECTIONS_OPEN_AFTER = ("writer open at many collections after the appends, fresh process "
                          "(ms; baseline: one collection)")
RETAINED = ("metadata under meta/, most at once from the stated time into the appends on (MB; "
            "baseline: one collection)")
RETAINED_PEAK = "metadata under meta/, most at once over all the appends (MB; baseline: as above)"
ROLLUP_BYTES = "bytes written per rollup (KB; baseline: as above)"
#: Why the peers' columns are empty.
PERSIST_ONLY = ("not measured in W12: issue 29's targets are persist at scale against persist "
                "at the small size, in the same run")


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _column(res: WorkloadResult) -> None:
    if BASELINE not in res.extra:
        res.extra.append(BASELINE)
        res.columns[BASELINE] = "baseline (see each row)"


def steady(ctx: Context, res: WorkloadResult, root: Path, *, seconds: float, grace: float,
           bin_s: float) -> dict[str, Any]:
    """:data:`TRIM_RATE` (the module docstring). Returns what
    :func:`bench.trim_steady.steady` did."""
    _column(res)
    ctx.log(f"W12: {seconds:g} s of one-row appends, grace {grace:g} s, bins of {bin_s:g} s")
    load0 = _load()
    out = trim_steady.steady(root / "steady", seconds, grace, bin_s=bin_s,
                             log=lambda line: ctx.log(f"W12 steady: {line.strip()}"))
    if out["ratio"] is not None:
        res.add(TRIM_RATE, "1/s", "higher", "persist", out["lowest_after"])
        res.add(TRIM_RATE, "1/s", "higher", BASELINE, out["before"])
    res.series["trim_bins"] = out["bins"]
    first = out["first_trim_s"]
    bins = ", ".join("{end_s:.0f}: {rate:.0f}".format(**b) for b in out["bins"])
    res.notes.append(
        f"steady appends through trims: {out['appends']:,} one-row appends in {seconds:g} s, "
        f"grace {grace:g} s, bins of {bin_s:g} s; first trim (first delete of a log entry) "
        + ("none" if first is None else f"{first:.1f} s in")
        + f"; appends/s per bin (end s: rate): {bins}; log entries "
        f"at the end {out['bins'][-1]['log_entries'] if out['bins'] else 0:,}; load average "
        f"(1/5/15 min) {load0} before, {_load()} after")
    return out


def sessions(ctx: Context, res: WorkloadResult, root: Path, *, count: int, commits: int,
             opens: int) -> dict[str, Any]:
    """:data:`OPEN_SESSIONS` (the module docstring). Returns what
    :func:`bench.trim_sessions.sessions` did, with ``opens``: the opens (ms) after one
    session and after the last."""
    _column(res)
    grace = trim_sessions.GRACE
    ctx.log(f"W12: {count} sessions of {commits:,} commits")
    load0 = _load()
    loc = root / "sessions" / "loc"
    loc.parent.mkdir(parents=True)
    out = trim_sessions.sessions(loc, count, commits, grace,
                                 log=lambda line: ctx.log(f"W12 sessions: {line.strip()}"))
    load1 = _load()
    one, many = trim_sessions.alternating_opens([out["after_one"], loc], grace, opens)
    for ms in one:
        res.add(OPEN_SESSIONS, "ms", "lower", BASELINE, ms)
    for ms in many:
        res.add(OPEN_SESSIONS, "ms", "lower", "persist", ms)
    out["opens"] = {"one": one, "many": many}
    own = ", ".join("{session}: {open_ms:.1f}".format(**r) for r in out["rows"])
    res.notes.append(
        f"writer open after {count} sessions of {commits:,} one-row commits (grace {grace:g} "
        f"s: nothing trimmed) against after one: the two locations opened in turn in this "
        f"process, {opens} rounds (ms, in order: after one {', '.join(f'{x:.1f}' for x in one)}"
        f"; after {count} {', '.join(f'{x:.1f}' for x in many)}); the sessions took "
        f"{out['seconds']:.0f} s and left {out['log_entries']:,} log entries and "
        f"{out['rollups']:,} rollups ({out['meta_bytes'] / 1e6:.1f} MB); each session's own "
        f"open (ms), in the sessions' order: "
        f"{own}; load "
        f"average (1/5/15 min) {load0} before the sessions, {load1} before the opens, "
        f"{_load()} after")
    return out


def collections(ctx: Context, res: WorkloadResult, root: Path, *, count: int, seconds: float,
                grace: float, retained_from: float, blocks: int, block: int,
                opens: int) -> list[dict[str, Any]]:
    """:data:`COLLECTIONS_P50`, :data:`COLLECTIONS_OPEN` and :data:`RETAINED`, with
    context rows (the module docstring). Returns what :func:`bench.rollup_pieces.measure`
    did, one dict per count (1, then ``count``)."""
    _column(res)
    load0 = _load()
    work = root / "collections"
    work.mkdir(parents=True)
    try:
        one, many = rollup_pieces.measure(
            work, [1, count], seconds=seconds, grace=grace, rounds=blocks, block=block,
            opens=opens, retained_from=retained_from, log=lambda line: ctx.log(f"W12: {line}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for column, r in (("persist", many), (BASELINE, one)):
        res.add(COLLECTIONS_P50, "ms", "lower", column, r["append_p50_ms"])
        res.add(COLLECTIONS_P99, "ms", "lower", column, r["append_p99_ms"])
        for ms in r["open_fresh_ms"]:
            res.add(COLLECTIONS_OPEN, "ms", "lower", column, ms)
        for ms in r["open_ms"]:
            res.add(COLLECTIONS_OPEN_AFTER, "ms", "lower", column, ms)
        res.add(RETAINED, "MB", "lower", column, r["steady_peak_meta_bytes"] / 1e6)
        res.add(RETAINED_PEAK, "MB", "lower", column, r["peak_meta_bytes"] / 1e6)
        res.add(ROLLUP_BYTES, "KB", "lower", column, r["bytes_per_rollup"] / 1e3)

    def kinds(r: dict[str, Any]) -> str:
        return (f"{r['steady_peak_meta_bytes'] / 1e6:.1f} MB = log "
                f"{r['steady_log_bytes'] / 1e6:.1f} + rollups "
                f"{r['steady_rollup_bytes'] / 1e6:.1f} + pieces "
                f"{r['steady_piece_bytes'] / 1e6:.1f}")

    res.notes.append(
        f"{count:,} collections against 1 (MB = 10^6 bytes): setup {one['setup_s']:.0f} / "
        f"{many['setup_s']:.0f} s, one whole rollup {one['whole_rollup_bytes'] / 1e6:.3f} / "
        f"{many['whole_rollup_bytes'] / 1e6:.1f} MB; {seconds:g} s of 100-row appends each, "
        f"grace {grace:g} s: {one['appends']:,} / {many['appends']:,} appends, "
        f"{one['rollups']} / {many['rollups']} rollups, {many['pieces_per_rollup']:.1f} pieces "
        f"per rollup at {count:,}, largest piece written {many['largest_piece_bytes'] / 1e3:.0f}"
        f" KB; retained (most at once from {retained_from:g} s into the appends on, sampled "
        f"once a second, the log, rollups and manifests, and pieces on disk): 1 collection "
        f"{kinds(one)}; {count:,} collections {kinds(many)}; append p50/p99 over {blocks} "
        f"alternating blocks of {block} (after a warm-up block each); writer opens, {opens} "
        f"each alternating in fresh processes, right after the setup (ms: 1 "
        f"{', '.join(f'{x:.1f}' for x in one['open_fresh_ms'])}; {count:,} "
        f"{', '.join(f'{x:.1f}' for x in many['open_fresh_ms'])}) and after the appends; "
        f"load average (1 min) before each count's appends {one['load_before_run']:.1f} / "
        f"{many['load_before_run']:.1f}, after {one['load_after_run']:.1f} / "
        f"{many['load_after_run']:.1f}; (1/5/15 min) {load0} before, {_load()} after")
    return [one, many]


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    res = WorkloadResult(
        WID, f"{TITLE}: appends through trims ({a.w12_steady_seconds:g} s), writer open after "
        f"{a.w12_sessions} sessions of {a.w12_commits:,} commits, {a.w12_collections:,} "
        f"collections against 1; persist at scale / persist at the small size",
        params={"steady_seconds": a.w12_steady_seconds, "bin_s": a.w12_bin,
                "grace": a.w12_grace, "sessions": a.w12_sessions, "commits": a.w12_commits,
                "opens": a.w12_opens, "collections": a.w12_collections,
                "seconds": a.w12_seconds, "retained_from": a.w12_retained_from,
                "blocks": a.w12_blocks, "block": a.w12_block})
    _column(res)
    for name in ctx.systems:
        if name != "persist":
            res.skip(name, PERSIST_ONLY)
    if "persist" not in ctx.systems:
        return [res]
    root = fresh_dir(ctx.work, "w12")
    try:
        steady(ctx, res, root, seconds=a.w12_steady_seconds, grace=a.w12_grace,
               bin_s=a.w12_bin)
        sessions(ctx, res, root, count=a.w12_sessions, commits=a.w12_commits,
                 opens=a.w12_opens)
        collections(ctx, res, root, count=a.w12_collections, seconds=a.w12_seconds,
                    grace=a.w12_grace, retained_from=a.w12_retained_from,
                    blocks=a.w12_blocks, block=a.w12_block, opens=a.w12_opens)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [res]
