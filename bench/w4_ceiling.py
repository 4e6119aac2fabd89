"""W4's ceiling in CPython: what 32 threads reach when the runtime does nothing.

    python -m bench.w4_ceiling [--seconds S] [--threads N] [--sync-ms M] [--rounds R]

Issue 29 asks W4 (32 threads appending 100-row tables to one collection, each waiting for its
append) for 6x the floor's sequential rate (one fsync'd file per append). This runs, in turn
and ``R`` rounds each, two appenders under W4's own loop (``bench.workloads.w4_concurrent``'s
shape: one lock hands out times and enqueues in order, the wait is outside it):

* **null**: the same per-append steps a W4 caller takes outside persist (the time column
  set, a ``concurrent.futures.Future`` queued under the lock, the wait for it) against a
  consumer thread that takes every queued future, sleeps ``M`` ms (one durable write per
  group, the GIL released, as an fsync releases it) and resolves them: group commit with no
  validation, staging, encoding or commit record;
* **persist**: ``PersistSystem.concurrent_appender`` on a fresh local location (W4 itself).

For each it reports appends/s and the process's CPU time per append (user + system, from
``getrusage``), so the part of an append that is thread machinery (GIL hand-offs, futex waits,
futures) and the part that is persist's own work can be told apart. It asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import make_batch
from bench.systems.persist import PersistSystem

Appender = Callable[[pa.Table], object]


class _Null:
    """Group commit with nothing to commit: a consumer thread resolves what was queued, one
    simulated durable write (``sync`` seconds of sleep) per group."""

    def __init__(self, sync: float) -> None:
        self._sync = sync
        self._queue: collections.deque[Future[int]] = collections.deque()
        self._ready = threading.Condition()
        self._stop = False
        self._lock = threading.Lock()
        self._next = 0
        self._thread = threading.Thread(target=self._run, name="null-runtime", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stop:
                    self._ready.wait()
                if self._stop:
                    return
                group = list(self._queue)
                self._queue.clear()
            time.sleep(self._sync)
            for f in group:
                f.set_result(1)

    def append(self, table: pa.Table) -> object:
        field = table.schema.field(2)
        with self._lock:
            t = self._next
            self._next = t + 1
            table.set_column(2, field, pa.array(np.full(len(table), t, dtype=np.int64)))
            fut: Future[int] = Future()
            with self._ready:
                self._queue.append(fut)
                self._ready.notify()
        return fut.result()

    def close(self) -> None:
        with self._ready:
            self._stop = True
            self._ready.notify()
        self._thread.join()


def burst(append: Appender, table: pa.Table, seconds: float, threads: int
          ) -> tuple[float, float]:
    """``threads`` threads calling ``append(table)`` for ``seconds``: (appends/s, CPU seconds
    of the process per append)."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        while time.monotonic() < stop:
            append(table)
            counts[i] += 1

    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    after, took = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t0
    n = max(1, sum(counts))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return n / took, cpu / n


def measure(seconds: float = 3.0, threads: int = 32, sync_ms: float = 0.8, rounds: int = 3,
            root: Path | None = None) -> dict[str, dict[str, list[float]]]:
    """``rounds`` bursts of each appender in turn (after one warm-up burst each): per
    appender, ``rate`` (appends/s) and ``cpu_us`` (CPU µs per append) of each round."""
    table = make_batch(1, 100, time_lo=0)
    null = _Null(sync_ms / 1000)
    store = PersistSystem(Path(tempfile.mkdtemp(dir=root)))
    store.create()
    appenders: dict[str, Appender] = {"null": null.append,
                                      "persist": store.concurrent_appender()}
    out: dict[str, dict[str, list[float]]] = {k: {"rate": [], "cpu_us": []} for k in appenders}
    try:
        for append in appenders.values():
            burst(append, table, min(seconds, 1.0), threads)
        for _ in range(rounds):
            for name, append in appenders.items():
                rate, cpu = burst(append, table, seconds, threads)
                out[name]["rate"].append(rate)
                out[name]["cpu_us"].append(cpu * 1e6)
    finally:
        null.close()
        store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--sync-ms", type=float, default=0.8,
                    help="the null runtime's simulated durable write per group")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    got = measure(a.seconds, a.threads, a.sync_ms, a.rounds)
    for name, m in got.items():
        print(f"{name:8s} {statistics.median(m['rate']):8.0f} appends/s "
              f"(rounds: {', '.join(f'{x:.0f}' for x in m['rate'])}); "
              f"CPU {statistics.median(m['cpu_us']):5.0f} us/append "
              f"(rounds: {', '.join(f'{x:.0f}' for x in m['cpu_us'])})")


if __name__ == "__main__":
    main()
