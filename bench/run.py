"""The one command: ``python -m bench.run [--quick] [--out DIR] [--workloads W10] [sizes...]``.

Runs W1..W12 through every available system (persist, the floor, delta-rs, pyiceberg), prints a
table of median [min-max] over the repeats with the ratios persist/peer measured in this run,
the targets, and writes ``results.json``, ``table.txt`` and ``w2_latency.png`` into ``--out``.
A system whose package is missing is skipped, with the reason recorded in every workload; so is
W8 (S3 on a moto server) without boto3/moto, and W9 (the Spark source) without pyspark or Java.
W12 (issue 29's metadata at scale) measures persist against itself; the peers' columns say so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import SCHEMA, make_batch, remove, settle
from bench.plot import plot_w2
from bench.report import render_targets, render_workload, targets
from bench.results import WorkloadResult
from bench.systems import SYSTEMS
from bench.workloads import ALL_IDS, WORKLOADS
from bench.workloads.context import Context

REPO = Path(__file__).resolve().parents[1]

#: Default sizes (the issue's workloads; a few minutes here) and the --quick ones (about a
#: minute, W8's moto server and W9's Spark start-up included).
DEFAULTS: dict[str, Any] = {
    "repeats": 3, "peer_repeats": 1,
    "w1_appends": 10, "w1_rows": 1_000_000,
    "w2_appends": 2000, "w2_rows": 100, "w3_reads": 3, "iceberg_appends": 250,
    "w4_threads": [1, 4, 32], "w4_seconds": 2.0, "w4_rows": 100,
    "w5_appends": 100, "w5_rows": 100, "w5_interval_ms": 20.0, "w5_poll_ms": 5.0,
    "w6_collections": [10, 1000], "w6_seals": [10, 10_000], "w6_appends": 200, "w6_rows": 100,
    "w6_repeats": 2,
    "w7_appends": 10, "w7_rows": 1_000_000, "w7_repeats": 1,
    "w8_appends": 100, "w8_rows": 100, "w8_bulk": 5, "w8_bulk_rows": 200_000, "w8_repeats": 1,
    "w9_rows": 5_000_000, "w9_part_rows": 1_000_000, "w9_repeats": 3, "w9_seals": 20,
    "w9_gap": 1.0, "w9_s3_rows": 2_000_000,
    "w10_rows": 5_000_000, "w10_chunk_rows": 1_000_000, "w10_lookups": 5,
    "w10_consolidate_rows": 1_000_000, "w10_python_rows": 1_000_000,
    "w11_rows": 10_000_000, "w11_appends": 10, "w11_forks": 5,
    "w12_steady_seconds": 150.0, "w12_bin": 10.0, "w12_grace": 30.0, "w12_sessions": 100,
    "w12_commits": 1000, "w12_opens": 7, "w12_collections": 10_000, "w12_seconds": 60.0,
    "w12_retained_from": 40.0, "w12_blocks": 6, "w12_block": 300,
}
QUICK: dict[str, Any] = {
    "repeats": 1, "peer_repeats": 1,
    "w1_appends": 3, "w1_rows": 20_000,
    "w2_appends": 40, "w2_rows": 100, "w3_reads": 1, "iceberg_appends": 40,
    "w4_threads": [1, 4], "w4_seconds": 0.3, "w4_rows": 100,
    "w5_appends": 10, "w5_rows": 100, "w5_interval_ms": 10.0, "w5_poll_ms": 5.0,
    "w6_collections": [2, 5], "w6_seals": [2, 10], "w6_appends": 5, "w6_rows": 100,
    "w6_repeats": 1,
    "w7_appends": 2, "w7_rows": 20_000, "w7_repeats": 1,
    "w8_appends": 10, "w8_rows": 100, "w8_bulk": 2, "w8_bulk_rows": 20_000, "w8_repeats": 1,
    "w9_rows": 20_000, "w9_part_rows": 10_000, "w9_repeats": 1, "w9_seals": 3, "w9_gap": 0.5,
    "w9_s3_rows": 20_000,
    "w10_rows": 20_000, "w10_chunk_rows": 5_000, "w10_lookups": 2,
    "w10_consolidate_rows": 20_000, "w10_python_rows": 20_000,
    "w11_rows": 20_000, "w11_appends": 4, "w11_forks": 2,
    "w12_steady_seconds": 6.0, "w12_bin": 1.0, "w12_grace": 1.5, "w12_sessions": 4,
    "w12_commits": 100, "w12_opens": 2, "w12_collections": 200, "w12_seconds": 4.0,
    "w12_retained_from": 2.0, "w12_blocks": 2, "w12_block": 30,
}


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="persist against delta-rs, pyiceberg and the storage floor (see bench/README.md)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, one repeat: a smoke test (about a minute); asserts nothing")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default bench/results/<timestamp>)")
    p.add_argument("--work", type=Path, default=None,
                   help="scratch directory for the tables (default <out>/scratch, removed)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated subset of: " + ", ".join(SYSTEMS))
    p.add_argument("--workloads", default=",".join(ALL_IDS),
                   help="comma-separated subset of W1..W12 (W2 and W3 run together); "
                        "e.g. --workloads W10 runs that one alone")
    g = p.add_argument_group("sizes (defaults in brackets: full run / --quick)")

    def opt(name: str, kind: Any, help_: str) -> None:
        key = name.lstrip("-").replace("-", "_")
        g.add_argument(name, type=kind, default=None,
                       help=f"{help_} [{DEFAULTS[key]} / {QUICK[key]}]")

    opt("--repeats", int, "rounds of every workload (systems rotated each round)")
    opt("--peer-repeats", int, "rounds of W2/W3, W5 and W6 for delta and iceberg (slow)")
    opt("--w1-appends", int, "W1 appends")
    opt("--w1-rows", int, "W1 records per append")
    opt("--w2-appends", int, "W2 sequential appends")
    opt("--w2-rows", int, "W2 records per append")
    opt("--w3-reads", int, "W3 reads per point (median)")
    opt("--iceberg-appends", int, "W2/W3 appends for pyiceberg (its commits slow down "
        "with every snapshot)")
    opt("--w4-threads", _ints, "W4 thread counts")
    opt("--w4-seconds", float, "W4 seconds per run")
    opt("--w4-rows", int, "W4 records per append")
    opt("--w5-appends", int, "W5 appends")
    opt("--w5-rows", int, "W5 records per append")
    opt("--w5-interval-ms", float, "W5 ms between appends")
    opt("--w5-poll-ms", float, "W5 peers' follower poll interval")
    opt("--w6-collections", _ints, "W6 collection counts")
    opt("--w6-seals", _ints, "W6 prior seal counts")
    opt("--w6-appends", int, "W6 measured appends")
    opt("--w6-rows", int, "W6 records per append")
    opt("--w6-repeats", int, "W6 rounds (10,000 awaited seals take a while)")
    opt("--w7-appends", int, "W7 appends")
    opt("--w7-rows", int, "W7 records per append")
    opt("--w7-repeats", int, "W7 rounds (one fresh process per system each)")
    opt("--w8-appends", int, "W8 (S3) small appends, contenders alternating")
    opt("--w8-rows", int, "W8 records per small append")
    opt("--w8-bulk", int, "W8 bulk appends")
    opt("--w8-bulk-rows", int, "W8 records per bulk append")
    opt("--w8-repeats", int, "W8 rounds (fresh tables on the same moto server)")
    opt("--w9-rows", int, "W9 (Spark) records read")
    opt("--w9-part-rows", int, "W9 records per persist append / Parquet file")
    opt("--w9-repeats", int, "W9 rounds of the reads")
    opt("--w9-seals", int, "W9 seals timed to their micro-batch")
    opt("--w9-gap", float, "W9 seconds between seals")
    opt("--w9-s3-rows", int, "W9 records read and written through S3A per S3 server (issue 30)")
    opt("--w10-rows", int, "W10 (records) updates written and queried")
    opt("--w10-chunk-rows", int, "W10 updates per append")
    opt("--w10-lookups", int, "W10 point lookups per round (distinct keys; median)")
    opt("--w10-consolidate-rows", int, "W10 rows of the consolidated part")
    opt("--w10-python-rows", int, "W10 records appended and read as msgspec Structs")
    opt("--w11-rows", int, "W11 records in the forked table")
    opt("--w11-appends", int, "W11 appends making it")
    opt("--w11-forks", int, "W11 forks per version (median)")
    opt("--w12-steady-seconds", float, "W12 (metadata at scale) seconds of one-row appends "
        "through trims")
    opt("--w12-bin", float, "W12 seconds per window of that run")
    opt("--w12-grace", float, "W12 GC grace of that run and of the collections' runs (s)")
    opt("--w12-sessions", int, "W12 short writer sessions before the writer open")
    opt("--w12-commits", int, "W12 one-row commits per session")
    opt("--w12-opens", int, "W12 writer opens of each location, alternating")
    opt("--w12-collections", int, "W12 collections measured against one")
    opt("--w12-seconds", float, "W12 seconds of 100-row appends at each collection count")
    opt("--w12-retained-from", float, "W12 metadata retained: the most from this many "
        "seconds into those appends on")
    opt("--w12-blocks", int, "W12 alternating blocks of appends per collection count")
    opt("--w12-block", int, "W12 appends per block")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in ("persist", "pyarrow", "deltalake", "pyiceberg", "SQLAlchemy", "numpy",
                "matplotlib", "psutil", "boto3", "moto", "pyspark"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _fs_type(path: Path) -> str | None:
    try:
        best: tuple[str, str | None] = ("", None)
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt, fs = parts[1], parts[2]
                if str(path.resolve()).startswith(mnt) and len(mnt) > len(best[0]):
                    best = (mnt, fs)
        return best[1]
    except OSError:
        return None


def warm_up(ctx: Context) -> None:
    """Imports and first-call costs of every system, outside every measurement."""
    for name in ctx.systems:
        s = ctx.new_system(name, "warmup")
        try:
            for i in range(3):
                s.append(make_batch(i, 100, time_lo=i), i + 1)
            s.read()
            s.read(None)
        finally:
            ctx.dispose(s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or (REPO / "bench" / "results" / stamp)
    out.mkdir(parents=True, exist_ok=True)
    work: Path = args.work or (out / "scratch")
    work.mkdir(parents=True, exist_ok=True)

    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    unavailable: dict[str, str] = {}
    for name in SYSTEMS:
        if name not in wanted:
            unavailable[name] = "not selected (--systems)"
        elif (why := SYSTEMS[name].unavailable()) is not None:
            unavailable[name] = why
    systems = [s for s in SYSTEMS if s not in unavailable]
    ids = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    if unknown := [w for w in ids if w not in ALL_IDS]:
        raise SystemExit(f"unknown workloads {unknown}; choose from {list(ALL_IDS)}")
    ctx = Context(args=args, work=work, systems=systems, unavailable=unavailable)
    for name, why in unavailable.items():
        ctx.log(f"skipping {name}: {why}")

    started = time.time()
    load_before = os.getloadavg()
    ctx.log(f"systems: {', '.join(systems)}; workloads: {', '.join(ids)}; out: {out}")
    warm_up(ctx)
    settle()
    results: dict[str, WorkloadResult] = {}
    for wid, module in WORKLOADS.items():
        produces = ["W2", "W3"] if wid == "W2" else [wid]
        if not any(p in ids for p in produces):
            continue
        t0 = time.monotonic()
        for res in module.run(ctx):
            res.seconds = time.monotonic() - t0
            for name, why in unavailable.items():
                res.skip(name, why)
            results[res.wid] = res
        settle()
    ts = targets(results)

    order = list(SYSTEMS)
    shown = [s for s in order if s in systems]
    text = "\n\n".join(render_workload(results[w], shown) for w in ALL_IDS if w in results)
    text += "\n\n" + render_targets(ts)
    load_after = os.getloadavg()
    header = (f"persist benchmark, {stamp}, {os.cpu_count()} CPUs, {platform.platform()}, "
              f"work dir on {_fs_type(work)}, load average {load_before[1]:.1f} before / "
              f"{load_after[1]:.1f} after (5 min), {time.time() - started:.0f} s\n"
              f"cells: median [min-max] over rounds; p/X = persist median / X median "
              f"(↑ higher is better, ↓ lower is better)")
    text = header + "\n\n" + text
    print(text)
    (out / "table.txt").write_text(text + "\n")

    plot = None
    if "W2" in results and results["W2"].series.get("latency_ms"):
        plot = plot_w2(results["W2"].series["latency_ms"], out / "w2_latency.png",
                       title=results["W2"].title)
    doc = {
        "meta": {
            "started": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "seconds": time.time() - started,
            "argv": sys.argv[1:] if argv is None else argv,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "fs": _fs_type(work),
            "versions": _versions(),
            "schema": [f"{f.name}:{f.type}" for f in SCHEMA],
            "plot": str(plot) if plot else None,
        },
        "systems": {
            name: {"available": name not in unavailable, "reason": unavailable.get(name),
                   "guarantee": SYSTEMS[name].guarantee}
            for name in SYSTEMS
        },
        "workloads": {wid: results[wid].to_json() for wid in ALL_IDS if wid in results},
        "targets": [t.to_json() for t in ts],
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        remove(work)
    ctx.log(f"done in {time.time() - started:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
