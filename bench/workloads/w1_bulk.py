"""W1 bulk ingest: ``--w1-appends`` appends of ``--w1-rows`` records each, every one acknowledged
(persist: write + seal durable) before the next, then a full read of the latest version.

Systems run one after another within a round, in an order rotated every round; dirty pages are
flushed between systems (not timed) so delta-rs's and pyiceberg's unsynced writes do not land on
the next system's fsyncs. Every system first makes one untimed round (the process's first
full-size write and read pay one-off costs that would otherwise land on round 1's first system).
"""

from __future__ import annotations

from bench.common import MiB, du, make_batch, rotate, settle, timed, timed_full_read
from bench.results import WorkloadResult
from bench.systems.persist import PersistSystem
from bench.workloads.context import Context

WID = "W1"
TITLE = "bulk ingest"
#: Consolidated reads planned for this many tasks: what all of them decode, over the bytes
#: stored, must stay within 1.5 however many are asked for (DESIGN.md section 11a).
DECODE_TASKS = (1, 8, 64)


def run(ctx: Context) -> list[WorkloadResult]:
    a = ctx.args
    n, rows = a.w1_appends, a.w1_rows
    res = WorkloadResult(WID, f"{TITLE}: {n} appends x {rows:,} records, then a full read",
                         params={"appends": n, "rows": rows, "repeats": ctx.repeats})
    batches = [make_batch(1000 + i, rows, time_lo=i * rows, time_hi=(i + 1) * rows)
               for i in range(n)]
    total = n * rows
    nbytes = sum(b.nbytes for b in batches)
    # NB: one untimed round first. The first full-size write and read in the process pay its
    # one-off costs (the memory pool growing to ~600 MiB, page faults): in round 1 that landed
    # on whichever system ran first (persist, every time) and made its write and read ~2x
    # slower than in the other rounds.
    for name in ctx.systems:
        ctx.log(f"W1 warm-up (not measured): {name}")
        s = ctx.new_system(name, "w1-warmup")
        try:
            for i, b in enumerate(batches):
                s.append(b, upper=(i + 1) * rows)
            s.read()
        finally:
            ctx.dispose(s)
    for r in range(ctx.repeats):
        for name in rotate(ctx.systems, r):
            ctx.log(f"W1 round {r + 1}/{ctx.repeats}: {name}")
            s = ctx.new_system(name, f"w1-r{r}")
            try:
                settle()
                with timed() as t:
                    for i, b in enumerate(batches):
                        s.append(b, upper=(i + 1) * rows)
                res.add("write records/s", "rec/s", "higher", name, total / t.seconds)
                res.add("write MiB/s (Arrow bytes)", "MiB/s", "higher", name,
                        nbytes / MiB / t.seconds)
                seconds = timed_full_read(s, total, name)
                res.add("raw read records/s", "rec/s", "higher", name, total / seconds)
                res.add("raw read MiB/s", "MiB/s", "higher", name, nbytes / MiB / seconds)
                if isinstance(s, PersistSystem):
                    with timed() as t:
                        out = s.read_consolidated()
                    del out
                    res.add("consolidated read records/s (persist to_arrow)", "rec/s", "higher",
                            name, total / t.seconds)
                    for want in DECODE_TASKS:
                        ratio, planned = s.decode_amplification(want)
                        res.add(f"consolidated read in up to {want} tasks: bytes decoded / "
                                f"stored", "x", "lower", name, ratio)
                        res.add(f"consolidated read in up to {want} tasks: tasks planned",
                                "tasks", "higher", name, planned)
                res.add("stored MiB", "MiB", "lower", name, du(s.root) / MiB)
            finally:
                ctx.dispose(s)
    res.notes.append("one untimed warm-up round per system first (the process's one-off costs "
                     "of its first full-size write and read)")
    res.notes.append("raw read = every stored row as of the latest version, read through a "
                     "freshly opened handle (persist: a read-only replica, snapshot().batches())")
    res.notes.append("decoded / stored: a consolidated read planned for up to n tasks and read "
                     "task by task (persist.distributed.read_task): the stored bytes the part reader decoded "
                     "(Parquet column chunks of the row groups read) over the bytes stored; "
                     "the plan has as many key ranges as keep it within 1.5")
    return [res]
