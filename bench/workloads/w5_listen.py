"""W5 write -> listen latency: the writer makes ``--w5-appends`` appends of ``--w5-rows`` records,
one every ``--w5-interval-ms``; the latency of append *i* is from the start of its ``append``
call until it is seen

* on the writer (persist only): by a ``ReadHandle.listen`` iterator on the writing client, in
  another thread of the same process;
* on a replica in another process (``bench.workloads.w5_follow``): persist with a read-only
  replica and ``listen`` (default polling); the peers by polling for new versions every
  ``--w5-poll-ms`` (they have no change feed).

Clocks: ``time.monotonic`` (CLOCK_MONOTONIC) is shared by the processes of one machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import persist
from bench.common import fresh_dir, make_batch, percentile, rotate, settle
from bench.results import WorkloadResult
from bench.systems import System
from bench.systems.persist import HAS_NOTIFY, PersistSystem
from bench.workloads.context import Context

WID = "W5"
TITLE = "write -> listen latency"
REPO = Path(__file__).resolve().parents[2]
#: Appends made (and seen by the follower, one by one) before the measured ones.
WARM = 5


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    n = a.w5_appends
    res = WorkloadResult(
        WID, f"{TITLE}: {n} appends x {a.w5_rows} records, one every {a.w5_interval_ms:g} ms",
        params={"appends": n, "rows": a.w5_rows, "interval_ms": a.w5_interval_ms,
                "peer_poll_ms": a.w5_poll_ms, "repeats": ctx.repeats})
    batches = [make_batch(5000 + i, a.w5_rows, time_lo=i) for i in range(WARM + n + 1)]
    runs: list[tuple[str, bool]] = [(name, False) for name in ctx.systems]
    if "persist" in ctx.systems and HAS_NOTIFY:
        runs.insert(1, ("persist", True))
    for r in range(ctx.repeats):
        for name, push in rotate(runs, r):
            if ctx.peer_skips_round(name, r):
                continue
            ctx.log(f"W5 round {r + 1}/{ctx.repeats}: {name}{' (push)' if push else ''}")
            if push:
                root = fresh_dir(ctx.work, f"w5-r{r}-persist-push")
                s: System = PersistSystem(root, notify=True)
                s.create()
            else:
                s = ctx.new_system(name, f"w5-r{r}")
            try:
                _one(ctx, s, batches, res, push=push)
            finally:
                ctx.dispose(s)
    for name in ctx.systems:
        if name != "persist":
            res.skip(name, "no in-process change feed (writer-side listen is persist only)")
    res.notes.append("replica: persist = read-only replica in another process + listen "
                     "(default poll_interval); peers = another process polling every "
                     f"{a.w5_poll_ms:g} ms for a new version")
    return [res]


def _one(ctx: Context, s: System, batches: list[object], res: WorkloadResult, *,
         push: bool = False) -> None:
    a = ctx.args
    n = len(batches) - 1 - WARM
    total = WARM + n  # appends after the first; append i has time i and upper i + 1
    s.append(batches[0], 1)  # the table exists and has one version before anyone follows it
    settle()
    writer_seen: dict[int, float] = {}
    listener_thread = None
    listener = None
    if isinstance(s, PersistSystem):
        assert s.client is not None
        _, read = s.client.create_or_load("t", key_type=_i64(), value_type=_i64())
        listener = read.listen(0, poll=0.5)

        def listen() -> None:
            last = 0
            for ev in listener:
                if isinstance(ev, persist.ListenProgress):
                    now = time.monotonic()
                    for k in range(last + 1, ev.upper + 1):
                        writer_seen[k] = now
                    last = max(last, ev.upper)
                    if last >= total + 1:
                        return

        listener_thread = threading.Thread(target=listen, daemon=True)
        listener_thread.start()
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.workloads.w5_follow",
         "persist-push" if push else s.name, str(s.root), str(WARM + 1),
         str(total + 1), str(a.w5_poll_ms / 1000)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"W5 follower for {s.name} did not start: {line!r}")
        # Warm-up: each append waits until the follower has seen it.
        for i in range(1, WARM + 1):
            s.append(batches[i], i + 1)
            while True:
                line = child.stdout.readline().strip()
                if not line:
                    raise RuntimeError(f"W5 follower for {s.name} ended during warm-up")
                if line.startswith("SEEN ") and int(line.split()[1]) >= i + 1:
                    break
        submitted: dict[int, float] = {}
        acked: list[float] = []
        interval = a.w5_interval_ms / 1000
        next_at = time.monotonic()
        for i in range(WARM + 1, total + 1):
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            start = time.monotonic()
            submitted[i + 1] = start
            s.append(batches[i], i + 1)
            acked.append((time.monotonic() - start) * 1000)
            next_at = start + interval
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    seen = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1])["seen"].items()}
    replica = [(seen[k] - t0) * 1000 for k, t0 in submitted.items() if k in seen]
    if len(replica) != n:
        raise AssertionError(f"{s.name}: follower saw {len(replica)} of {n} appends")
    if push:
        res.add("replica with push (notify=True) median (ms)", "ms", "lower", s.name,
                statistics.median(replica))
        res.add("replica with push (notify=True) p99 (ms)", "ms", "lower", s.name,
                percentile(replica, 99))
        return
    res.add("ack latency median (ms)", "ms", "lower", s.name, statistics.median(acked))
    res.add("replica (other process) median (ms)", "ms", "lower", s.name,
            statistics.median(replica))
    res.add("replica (other process) p99 (ms)", "ms", "lower", s.name, percentile(replica, 99))
    if listener_thread is not None:
        listener_thread.join(30)
        assert listener is not None
        listener.close()
        writer = [(writer_seen[k] - t0) * 1000 for k, t0 in submitted.items() if k in writer_seen]
        res.add("writer listen median (ms)", "ms", "lower", s.name, statistics.median(writer))
        res.add("writer listen p99 (ms)", "ms", "lower", s.name, percentile(writer, 99))


def _i64() -> object:
    import pyarrow as pa

    return pa.int64()
