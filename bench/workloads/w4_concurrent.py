"""W4 concurrent writers: 1, 4 and 32 threads (``--w4-threads``), each making
``--w4-rows``-record acknowledged appends back to back for ``--w4-seconds``, all into one table.

persist: every thread calls ``append(batch, upper=t+1)`` on the same handle; the runtime's group
commit makes each group of queued appends durable with one metadata commit. The floor: every
thread writes its own fsync'd files (the W4 target compares against its *single-threaded* rate).
delta-rs: ``write_deltalake`` from every thread (it retries conflicting blind appends itself).
pyiceberg: one table object per thread; a ``CommitFailedException`` is counted as a conflict,
then the thread refreshes and retries, as an application must.
"""

from __future__ import annotations

import threading
import time

from bench.common import make_batch, rotate, settle
from bench.results import WorkloadResult
from bench.systems import Skip
from bench.workloads.context import Context

WID = "W4"
TITLE = "concurrent writers"


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    threads_list: list[int] = list(a.w4_threads)
    res = WorkloadResult(
        WID, f"{TITLE}: {'/'.join(map(str, threads_list))} threads x {a.w4_rows}-record "
        f"acknowledged appends for {a.w4_seconds:g} s, one table",
        params={"threads": threads_list, "rows": a.w4_rows, "seconds": a.w4_seconds,
                "repeats": ctx.repeats})
    templates = [make_batch(4000 + k, a.w4_rows, time_lo=0) for k in range(max(threads_list))]
    errors: dict[str, str] = {}
    for threads in threads_list:
        for r in range(ctx.repeats):
            for name in rotate(ctx.systems, r + threads):
                ctx.log(f"W4 {threads} threads, round {r + 1}/{ctx.repeats}: {name}")
                s = ctx.new_system(name, f"w4-{threads}-r{r}")
                try:
                    try:
                        append = s.concurrent_appender()
                    except Skip as e:
                        res.skip(name, str(e))
                        continue
                    append(templates[0])  # warm up (not counted)
                    settle()
                    stats0 = _persist_stats(s)
                    done, conflicts, failed, elapsed, first_error = _drive(
                        append, templates[:threads], a.w4_seconds)
                    res.add(f"appends/s @{threads} threads", "1/s", "higher", name,
                            done / elapsed)
                    res.add(f"conflicts retried/s @{threads} threads", "1/s", None, name,
                            conflicts / elapsed)
                    res.add(f"failed appends @{threads} threads", "count", None, name, failed)
                    if first_error and name not in errors:
                        errors[name] = first_error
                    stats1 = _persist_stats(s)
                    if stats1 is not None and stats0 is not None:
                        commits = stats1["commits"] - stats0["commits"]
                        res.add(f"persist appends per commit @{threads} threads", "x", None,
                                name, (stats1["commands"] - stats0["commands"])
                                / max(1, commits))
                finally:
                    ctx.dispose(s)
    for name, err in errors.items():
        res.notes.append(f"{name}: first failure: {err}")
    return [res]


def _persist_stats(s: object) -> dict[str, int] | None:
    client = getattr(s, "client", None)
    return None if client is None else dict(client.stats)


def _drive(append: object, templates: list[object], seconds: float
           ) -> tuple[int, int, int, float, str | None]:
    n = len(templates)
    counts = [0] * n
    conflicts = [0] * n
    failures = [0] * n
    first_error: list[str] = []
    barrier = threading.Barrier(n + 1)
    deadline = [0.0]

    def worker(k: int) -> None:
        tpl = templates[k]
        barrier.wait()
        end = deadline[0]
        while time.perf_counter() < end:
            try:
                conflicts[k] += append(tpl)  # type: ignore[operator]
                counts[k] += 1
            except Exception as e:
                failures[k] += 1
                if not first_error:
                    first_error.append(f"{type(e).__name__}: {str(e)[:200]}")
                if failures[k] > 1000:
                    return

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(n)]
    for t in ts:
        t.start()
    deadline[0] = time.perf_counter() + seconds
    start = time.perf_counter()
    barrier.wait()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - start
    return (sum(counts), sum(conflicts), sum(failures), elapsed,
            first_error[0] if first_error else None)
