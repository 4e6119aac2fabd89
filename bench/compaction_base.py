"""Compaction into the base: what a bulk load and a stream of updates cost, measured.

    python -m bench.compaction_base bulk [--appends 5] [--rows 1000000]
    python -m bench.compaction_base amplification [--appends 100] [--rows 10000] [--updates 0.01]
    python -m bench.compaction_base offgil [--appends 5] [--rows 1000000] [--rounds 2]
        [--cases baseline,in-process,worker,cpu,io,io-chunked]

``bulk``: ``--appends`` appends of ``--rows`` random int64 keys (W9's shape: ``key, value``
int64, one time per append) with background compaction off, since advanced to the upper, then
one ``Client.maintain()``: its wall and CPU time (this process's), the layout it leaves (parts,
rows, whether the base's key ranges are disjoint and every part is a base part) and the bytes
it wrote (the blobs of the parts its merges added), and this process's RSS before it and its
peak during it, and the peak of Arrow's allocated bytes during it over those before (what the
merge itself holds: RSS also counts what the allocator keeps after freeing).

``amplification``: ``--appends`` appends of ``--rows`` rows each, of which ``--updates`` retract
an earlier row and insert its new value (the rest are new keys), the since following
the upper and maintenance run until idle after each append (what the background does given
the time; ``--background`` leaves it to the background instead, which a fast loop outruns). Reports the lifetime
write amplification: rows written by appends and merges over rows appended, and the same in
bytes, and the layout at the end. ``--part-target`` scales the part target down with the rows
(default 640 KiB: 64 MiB over 100, as the default rows are 1 M over 100).

``offgil``: W2's appends (100 records each, acknowledged one by one, by one writer) on a file
location that also holds a bulk load (``--appends`` of ``--rows`` random keys, W9's shape) not
yet in the base, in three cases, each on a fresh location, interleaved over ``--rounds``:
``baseline`` (the bulk load's since stays behind, so nothing is merged: ``--baseline-appends``
appends), ``in-process`` and ``worker`` (the since is advanced and the background brings the
bulk load into the base, with ``Options.merge_worker_rows`` None, every merge in the writer's
process, or the default, in its merge worker process; appends run until the base is formed).
Two more cases tell which of the merge worker's kinds of work costs the appends: ``cpu`` and
``io`` run the baseline's appends beside a child process at the worker's niceness that only
spins, or only writes and fsyncs files of ``--beside-part-mib`` into the location's file
system; ``io-chunked`` writes the same files but also flushes each every
``--beside-flush-mib`` as it is written (``fdatasync``), as persist's file store writes a part.
``--flush-bytes`` sets the locations' ``flush_bytes`` storage option (0: off). Reports the
append latency p50/p99 while the base is rewritten (baseline: all), the time from advancing
the since to the bulk load being in the base (no call from the user), and the load average
before and after each case (the machine is shared).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

import persist
from bench.common import RssSampler, make_batch, percentile
from persist.indexed.format.meta import AddPart, ReplaceParts
from persist.indexed.maintenance import compact, offload


def _table(keys: np.ndarray, values: np.ndarray, t: int, diffs: np.ndarray) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array(values, pa.int64()),
                     "time": pa.array(np.full(len(keys), t), pa.uint64()),
                     "diff": pa.array(diffs, pa.int64())})


def _layout(client: persist.Client, name: str) -> dict[str, Any]:
    c = client.state.collections[name]
    base, runs = compact.layout(c, c.since)
    bounds = [compact.key_bounds(p) for p in base]
    disjoint = all(a is not None and b is not None and a[1] is not None and b[0] is not None
                   and a[1] < b[0] for a, b in itertools.pairwise(bounds))
    return {"parts": len(c.parts), "base_parts": len(base), "runs": len(runs),
            "rows": sum(p.rows for p in c.parts), "base_rows": sum(p.rows for p in base),
            "base_disjoint": disjoint,
            "base_single_time": all(p.min_time == p.max_time for p in base),
            "base_consolidated": all(p.consolidated for p in base),
            "stored_bytes": sum(p.nbytes for p in c.parts)}


def _written(client: persist.Client) -> dict[str, int]:
    """Rows and bytes of the parts appends and merges wrote, from the commit log.

    A marks step (DESIGN.md §8) adds each base part again, marked: its data blob is the one
    it replaced (shared, not written again), so only its marks blob counts (``merge_bytes``
    and ``marks_bytes``, no rows), and only when the step wrote a new one (an unchanged set
    keeps its blob). ``marks_steps``: how many of the ``merges`` were marks steps."""
    ix = client._writer().ix
    out = {"append_rows": 0, "append_bytes": 0, "merge_rows": 0, "merge_bytes": 0, "merges": 0,
           "marks_steps": 0, "marks_bytes": 0}
    from persist import layout
    from persist.indexed.format.meta import decode_commit, log_from
    blobs: set[str] = set()
    marks: set[str] = set()
    for seq in range(1, ix.state.seq + 1):
        key = layout.log_key(seq, log_from(ix.state))
        data = ix.store.get(key)
        if data is None:
            continue
        for op in decode_commit(key, data).ops:
            if isinstance(op, AddPart):
                out["append_rows"] += op.part.rows
                out["append_bytes"] += op.part.nbytes
                if op.part.blob_key is not None:
                    blobs.add(op.part.blob_key)
            elif isinstance(op, ReplaceParts):
                out["merges"] += 1
                out["marks_steps"] += any(p.marks is not None for p in op.added)
                for p in op.added:
                    m = p.marks
                    if m is not None and m.key not in marks:
                        marks.add(m.key)
                        out["merge_bytes"] += m.nbytes
                        out["marks_bytes"] += m.nbytes
                    if p.blob_key is not None and p.blob_key in blobs:
                        continue  # a marked base part: its data blob is shared
                    if p.blob_key is not None:
                        blobs.add(p.blob_key)
                    out["merge_rows"] += p.rows
                    out["merge_bytes"] += p.nbytes
    return out


def bulk(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    # NB: the merge in this process (``--worker``: in the merge worker, whose CPU this
    # process's process_time() does not count)
    opts = persist.Options(background_compaction=False, rollup_every=1 << 20,
                           gc_grace_seconds=3600.0,
                           merge_worker_rows=0 if args.worker else None)
    client_dir = tempfile.mkdtemp()
    with persist.open(client_dir, options=opts) as client:
        write, _ = client.create_or_load("w9", key_type=pa.int64(), value_type=pa.int64())
        for t in range(args.appends):
            keys = rng.integers(-(1 << 62), 1 << 62, args.rows, dtype=np.int64)
            write.append(_table(keys, rng.integers(0, 1 << 40, args.rows), t,
                                np.ones(args.rows, np.int64)), upper=t + 1).result()
        write.allow_compaction(args.appends - 1).result()
        before = _layout(client, "w9")
        gc.collect()
        rss0 = RssSampler.rss()
        sampler = RssSampler().start()
        arrow_peak = [pa.total_allocated_bytes()]
        arrow0 = arrow_peak[0]
        done = threading.Event()

        def sample_arrow() -> None:
            while not done.wait(0.002):
                arrow_peak[0] = max(arrow_peak[0], pa.total_allocated_bytes())

        arrow_thread = threading.Thread(target=sample_arrow, daemon=True)
        arrow_thread.start()
        w0, c0 = time.perf_counter(), time.process_time()
        rounds = 0
        while client.maintain():
            rounds += 1
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        sampler.stop()
        done.set()
        arrow_thread.join()
        written = _written(client)
        return {"before": before, "after": _layout(client, "w9"), "maintain_rounds": rounds,
                "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                "rss_before_mib": round(rss0 / (1 << 20)),
                "rss_peak_during_maintain_mib": round(sampler.peak / (1 << 20)),
                "arrow_allocated_peak_over_before_mib": round(
                    (arrow_peak[0] - arrow0) / (1 << 20)),
                "merge_bytes_written": written["merge_bytes"],
                "merge_rows_written": written["merge_rows"], "merges": written["merges"]}


def amplification(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    # NB: the policy's row thresholds scaled with the rows per append as the part target is
    # (the defaults are sized for 1 M-row appends: final_rows 512 Ki, marks_rows 256 Ki)
    marks_rows = args.marks_rows if args.marks_rows is not None else max(
        1, args.rows * persist.CompactionPolicy().marks_rows // 1_000_000)
    policy = persist.CompactionPolicy(part_target_bytes=args.part_target,
                                      final_rows=max(1, args.rows // 2), marks_rows=marks_rows)
    opts = persist.Options(compaction=policy, rollup_every=1 << 20, gc_grace_seconds=3600.0,
                           background_compaction=not args.maintain_each)
    live_keys = np.zeros(0, np.int64)
    live_vals = np.zeros(0, np.int64)
    # NB: a memory store: the counts do not depend on the store, and a file store's fsync per
    # blob would make the small scale's many small parts the whole run time
    with persist.open(f"mem://amplification-{uuid.uuid4().hex}", options=opts) as client:
        write, _ = client.create_or_load("u", key_type=pa.int64(), value_type=pa.int64())
        for t in range(args.appends):
            nu = int(args.rows * args.updates) if len(live_keys) else 0
            pick = rng.choice(len(live_keys), nu, replace=False) if nu else np.zeros(0, int)
            old_k, old_v = live_keys[pick], live_vals[pick]
            new_v = rng.integers(0, 1 << 40, nu)
            fresh = rng.integers(-(1 << 62), 1 << 62, args.rows - 2 * nu, dtype=np.int64)
            keys = np.concatenate([old_k, old_k, fresh])
            vals = np.concatenate([old_v, new_v, rng.integers(0, 1 << 40, len(fresh))])
            diffs = np.concatenate([-np.ones(nu, np.int64), np.ones(nu + len(fresh), np.int64)])
            write.append(_table(keys, vals, t, diffs), upper=t + 1).result()
            write.allow_compaction(t).result()
            while args.maintain_each and client.maintain():
                pass
            live_vals[pick] = new_v
            live_keys = np.concatenate([live_keys, fresh])
            live_vals = np.concatenate([live_vals, vals[2 * nu:]])
        while client.maintain():
            pass
        written = _written(client)
        appended = written["append_rows"]
        return {"layout": _layout(client, "u"), "marks_rows": marks_rows, **written,
                "write_amplification_rows": round(
                    (appended + written["merge_rows"]) / appended, 2),
                "write_amplification_bytes": round(
                    (written["append_bytes"] + written["merge_bytes"])
                    / written["append_bytes"], 2)}


def _in_base(client: persist.Client, name: str) -> bool:
    c = client.state.collections[name]
    base, runs = compact.layout(c, c.since)
    return bool(base) and not any(p.max_time <= c.since for p in runs)


#: The ``offgil`` cases that run the baseline's appends beside a child process doing one
#: kind of the merge worker's work, at its niceness, to tell which kind costs the appends:
#: ``cpu`` spins, ``io`` writes and fsyncs files of a merged part's size into the location's
#: file system, at full speed.
_BESIDE = {
    "cpu": "while True: pass",
    # NB: io-chunked also flushes each file every --beside-flush-mib as it is written
    # (fdatasync), as persist's file store writes a part; io (every 0) only at its end
    "io": ("import os, sys\n"
           "buf = os.urandom(1 << 20)\n"
           "every = int(sys.argv[3])\n"
           "i = 0\n"
           "while True:\n"
           "    path = os.path.join(sys.argv[1], f'part-{i % 4}')\n"
           "    with open(path, 'wb') as f:\n"
           "        for n in range(1, int(sys.argv[2]) + 1):\n"
           "            f.write(buf)\n"
           "            if every and n % every == 0:\n"
           "                f.flush()\n"
           "                os.fdatasync(f.fileno())\n"
           "        f.flush()\n"
           "        os.fsync(f.fileno())\n"
           "    i += 1\n"),
}


def _beside(case: str, where: str, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    script = _BESIDE.get("io" if case == "io-chunked" else case)
    if script is None:
        return None  # NB: before reading the io options, which callers of other cases lack
    every = args.beside_flush_mib if case == "io-chunked" else 0
    os.makedirs(where)
    # NB: niced by itself, as the worker is (a preexec_fn would run in a fork of this
    # threaded process)
    code = f"import os\nos.nice({offload.WORKER_NICE})\n{script}"
    return subprocess.Popen([sys.executable, "-c", code, where, str(args.beside_part_mib),
                             str(every)])


def _offgil_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    opts = persist.Options(background_compaction=True, rollup_every=1 << 20,
                           gc_grace_seconds=3600.0,
                           merge_worker_rows=None if case == "in-process" else
                           persist.Options().merge_worker_rows)
    load0 = os.getloadavg()[0]
    client_dir = tempfile.mkdtemp()
    flush = getattr(args, "flush_bytes", None)
    storage = None if flush is None else {"flush_bytes": flush}
    with persist.open(client_dir, options=opts, storage_options=storage) as client:
        bulk_w, _ = client.create_or_load("w9", key_type=pa.int64(), value_type=pa.int64())
        # NB: at times 1.., the since at 0: no part is ready for the base until the since is
        # advanced (a run at the since would start a base during the load)
        for t in range(1, args.appends + 1):
            keys = rng.integers(-(1 << 62), 1 << 62, args.rows, dtype=np.int64)
            bulk_w.append(_table(keys, rng.integers(0, 1 << 40, args.rows), t,
                                 np.ones(args.rows, np.int64)), upper=t + 1).result()
        w2, _ = client.create_or_load("w2", key_type=pa.int64(), value_type=pa.int64())
        batches = [make_batch(2000 + i, args.w2_rows, time_lo=i) for i in range(64)]
        # NB: warm up the small collection (its first parts and merges) before measuring
        t = 0
        for _ in range(50):
            w2.append(batches[t % 64].set_column(2, "time", pa.array(
                np.full(args.w2_rows, t), pa.uint64())), upper=t + 1).result()
            t += 1
        gc.collect()
        lat: list[float] = []
        merging = case in ("in-process", "worker")
        beside = _beside(case, client_dir + "-beside", args)
        w0 = time.perf_counter()
        if merging:
            bulk_w.allow_compaction(args.appends).result()
        into_base_s = None
        while True:
            batch = batches[t % 64].set_column(2, "time", pa.array(
                np.full(args.w2_rows, t), pa.uint64()))
            a0 = time.perf_counter()
            w2.append(batch, upper=t + 1).result()
            lat.append((time.perf_counter() - a0) * 1000)
            t += 1
            if merging and _in_base(client, "w9"):
                into_base_s = time.perf_counter() - w0
                break
            if not merging and len(lat) >= args.baseline_appends:
                break
        elapsed = time.perf_counter() - w0
        if beside is not None:
            beside.kill()
            beside.wait()
        merger = client._writer().ix.merger
        workers = merger.started if merger is not None else 0
        worker_start = merger.start_seconds if merger is not None else None
        worker_merge = merger.merge_seconds if merger is not None else None
        assert not merging or _in_base(client, "w9")
    for d in (client_dir, client_dir + "-beside"):
        shutil.rmtree(d, ignore_errors=True)
    return {"case": case, "appends": len(lat), "p50_ms": round(statistics.median(lat), 2),
            "p99_ms": round(percentile(lat, 99), 2), "mean_ms": round(statistics.mean(lat), 2),
            "appends_per_s": round(len(lat) / elapsed, 1),
            "into_base_s": None if into_base_s is None else round(into_base_s, 2),
            "workers_started": workers,
            "worker_start_s": None if worker_start is None else round(worker_start, 2),
            "worker_merge_s": None if worker_merge is None else round(worker_merge, 2), "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2)}


def _print(line: str) -> None:
    print(line, flush=True)


def offgil(args: argparse.Namespace, log: Callable[[str], None] = _print) -> dict[str, Any]:
    """``--rounds`` rounds of ``--cases`` (comma-separated), order rotated; ``log`` gets each
    case's result as a JSON line."""
    cases = args.cases.split(",")
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for case in cases[r % len(cases):] + cases[:r % len(cases)]:
            runs.append(_offgil_case(case, args))
            log(json.dumps(runs[-1]))
    out: dict[str, Any] = {"runs": runs}
    for case in cases:
        mine = [x for x in runs if x["case"] == case]
        out[case] = {k: statistics.median(x[k] for x in mine)
                     for k in ("p50_ms", "p99_ms", "mean_ms", "appends_per_s")}
        if case in ("in-process", "worker"):
            out[case]["into_base_s"] = statistics.median(x["into_base_s"] for x in mine)
    for case in ("in-process", "worker", *_BESIDE, "io-chunked"):
        if case in out and "baseline" in out:
            out[f"{case}_p50_over_baseline"] = round(
                out[case]["p50_ms"] / out["baseline"]["p50_ms"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bulk")
    b.add_argument("--appends", type=int, default=5)
    b.add_argument("--rows", type=int, default=1_000_000)
    b.add_argument("--worker", action="store_true",
                   help="merge in the merge worker process (its CPU is not counted)")
    a = sub.add_parser("amplification")
    a.add_argument("--appends", type=int, default=100)
    a.add_argument("--rows", type=int, default=10_000)
    a.add_argument("--updates", type=float, default=0.01)
    a.add_argument("--part-target", type=int, default=640 << 10)
    a.add_argument("--marks-rows", type=int, default=None,
                   help="CompactionPolicy.marks_rows (default: 256 Ki scaled by --rows / 1 M)")
    a.add_argument("--background", dest="maintain_each", action="store_false",
                   help="leave compaction to the background (timing-dependent) instead of "
                        "running maintenance to idle after each append")
    o = sub.add_parser("offgil")
    o.add_argument("--appends", type=int, default=5)
    o.add_argument("--rows", type=int, default=1_000_000)
    o.add_argument("--w2-rows", type=int, default=100)
    o.add_argument("--baseline-appends", type=int, default=500)
    o.add_argument("--rounds", type=int, default=2)
    o.add_argument("--cases", default="baseline,in-process,worker",
                   help="comma-separated, of baseline, in-process, worker, cpu, io, io-chunked")
    o.add_argument("--beside-part-mib", type=int, default=16,
                   help="io: the size of each file written and fsynced (MiB)")
    o.add_argument("--flush-bytes", type=int, default=None,
                   help="the location's flush_bytes storage option (0: off; default: "
                        "persist's)")
    o.add_argument("--beside-flush-mib", type=int, default=1,
                   help="io-chunked: fdatasync after each this many MiB written")
    args = ap.parse_args()
    what = {"bulk": bulk, "amplification": amplification, "offgil": offgil}[args.what]
    out = what(args)
    print(json.dumps(out, indent=1, default=msgspec.to_builtins))


if __name__ == "__main__":
    main()
