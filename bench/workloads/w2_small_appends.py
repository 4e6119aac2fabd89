"""W2 small durable appends and W3 time travel, in one pass.

W2: ``--w2-appends`` sequential appends of ``--w2-rows`` records, each acknowledged before the
next (persist: ``append(batch, upper=t+1)``, one durable step). persist and the floor are
interleaved append by append (their order alternating), so drift hits both alike; delta-rs and
pyiceberg run alone (their unsynced writes would otherwise be flushed by the others' fsyncs).

W3: at 1/20, 1/4, 1/2 and all of the appends (100, 500, 1,000, 2,000 by default) every system
reads, through a freshly opened handle, the version after half of the appends so far ("middle")
and the latest one. persist never gets a compaction call (its maintenance thread compacts in the
background); the peers are read again after their manual compaction at the end, and the floor
after rewriting its files as one (the reference for the W3 target).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.common import make_batch, percentile, rotate, settle, timed
from bench.results import WorkloadResult
from bench.systems import System
from bench.systems.persist import PersistSystem
from bench.workloads.context import Context

WID = "W2"
TITLE = "small durable appends"
W3_TITLE = "time travel during W2"


def checkpoints(n: int) -> list[int]:
    return sorted({max(1, n * k // 20) for k in (1, 5, 10, 20)})


def _read_ms(s: System, version: Any, expect: int, reads: int) -> float:
    times = []
    for _ in range(reads):
        with timed() as t:
            out = s.read(version)
        if len(out) != expect:
            raise AssertionError(f"{s.name} read {len(out)} rows at {version}, expected {expect}")
        times.append(t.seconds * 1000)
    return statistics.median(times)


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    n, rows, reads = a.w2_appends, a.w2_rows, a.w3_reads
    window = max(1, n // 20)
    w2 = WorkloadResult(
        WID, f"{TITLE}: {n:,} sequential appends x {rows} records, each acknowledged",
        params={"appends": n, "rows": rows, "repeats": ctx.repeats,
                "peer_repeats": a.peer_repeats, "window": window})
    w3 = WorkloadResult(
        "W3", f"{W3_TITLE}: reads as of the middle and the latest version at "
        f"{', '.join(f'{c:,}' for c in checkpoints(n))} appends",
        params={"checkpoints": checkpoints(n), "reads_per_point": reads})
    batches = [make_batch(2000 + i, rows, time_lo=i) for i in range(n)]
    fast = [s for s in ("persist", "floor") if s in ctx.systems]
    groups = ([fast] if fast else []) + [[s] for s in ctx.systems if s not in fast]
    points = checkpoints(n)
    w2.series["latency_ms"] = {}
    for r in range(ctx.repeats):
        for group in rotate(groups, r):
            if r >= a.peer_repeats and not set(group) <= {"persist", "floor"}:
                continue
            ctx.log(f"W2/W3 round {r + 1}/{ctx.repeats}: {' + '.join(group)} x {n} appends")
            cap = a.iceberg_appends if group == ["iceberg"] else n
            _run_group(ctx, group, batches[:cap], rows, points, reads, window, r, w2, w3)
    for name in ctx.systems:
        if name not in {"persist", "floor"} and ctx.repeats > a.peer_repeats:
            w2.notes.append(f"{name}: {a.peer_repeats} round(s) (--peer-repeats), persist and "
                            f"floor {ctx.repeats}")
            break
    w2.notes.append(f"first/last window: median latency of appends 1-{window} and "
                    f"{n - window + 1}-{n}")
    if "iceberg" in ctx.systems and a.iceberg_appends < n:
        m = a.iceberg_appends
        note = (f"iceberg: only {m:,} appends (--iceberg-appends; its metadata JSON grows with "
                f"every snapshot, so 2,000 appends take over half an hour here)")
        w2.notes.append(note + f"; its last window is appends {m - window + 1}-{m}")
        w3.notes.append(note + f"; its 'after compaction' rows are at {m:,} appends")
    w3.notes.append("reads open a fresh handle and return raw rows; persist: a read-only "
                    "replica, snapshot(as_of).batches()")
    w3.notes.append("after compaction: delta optimize.compact()+create_checkpoint(); iceberg "
                    "overwrite with its own scan; floor one rewritten file; persist: no call")
    return [w2, w3]


def _run_group(
    ctx: Context, group: list[str], batches: list[Any], rows: int, points: list[int], reads: int,
    window: int, r: int, w2: WorkloadResult, w3: WorkloadResult,
) -> None:
    n = len(batches)
    systems = [ctx.new_system(name, f"w2-r{r}") for name in group]
    try:
        settle()
        lat: dict[str, list[float]] = {s.name: [] for s in systems}
        versions: dict[str, list[Any]] = {s.name: [] for s in systems}
        for i, b in enumerate(batches):
            for s in rotate(systems, i):
                start = time.perf_counter()
                v = s.append(b, i + 1)
                lat[s.name].append((time.perf_counter() - start) * 1000)
                versions[s.name].append(v)
            if i + 1 in points:
                c = i + 1
                for s in systems:
                    mid = max(1, c // 2)
                    w3.add(f"read middle @{c:,} (ms)", "ms", "lower", s.name,
                           _read_ms(s, versions[s.name][mid - 1], mid * rows, reads))
                    w3.add(f"read latest @{c:,} (ms)", "ms", "lower", s.name,
                           _read_ms(s, versions[s.name][c - 1], c * rows, reads))
                    if isinstance(s, PersistSystem) and c == n:
                        times = []
                        for _ in range(reads):
                            with timed() as t:
                                s.read_open(versions[s.name][c - 1])
                            times.append(t.seconds * 1000)
                        w3.add(f"persist read latest @{c:,} from the open writer (ms)", "ms",
                               "lower", s.name, statistics.median(times))
                        with timed() as t:
                            s.read_consolidated()
                        w3.add(f"persist consolidated read latest @{c:,} (ms)", "ms", "lower",
                               s.name, t.seconds * 1000)
        for s in systems:
            xs = lat[s.name]
            w2.add("median latency (ms)", "ms", "lower", s.name, statistics.median(xs))
            w2.add("p99 latency (ms)", "ms", "lower", s.name, percentile(xs, 99))
            first, last = statistics.median(xs[:window]), statistics.median(xs[-window:])
            w2.add("first window median (ms)", "ms", "lower", s.name, first)
            w2.add("last window median (ms)", "ms", "lower", s.name, last)
            w2.add("growth last/first", "x", "lower", s.name, last / first)
            w2.series["latency_ms"].setdefault(s.name, []).append([round(x, 4) for x in xs])
            if isinstance(s, PersistSystem) and s.client is not None:
                st = s.client.stats
                w2.add("persist commits per append", "x", None, s.name,
                       st.get("commits", 0) / max(1, n))
        # After the peers' manual compaction (persist: none; floor: one rewritten file).
        settle()
        for s in systems:
            with timed() as t:
                what = s.compact()
            w3.add("manual compaction (s)", "s", "lower", s.name, t.seconds)
            if what not in w3.series.setdefault("compaction", {}).values():
                w3.series["compaction"][s.name] = what
            mid = max(1, n // 2)
            w3.add("after compaction: read middle (ms)", "ms", "lower", s.name,
                   _read_ms(s, versions[s.name][mid - 1], mid * rows, reads))
            w3.add("after compaction: read latest (ms)", "ms", "lower", s.name,
                   _read_ms(s, None, n * rows, reads))
    finally:
        for s in systems:
            ctx.dispose(s)
