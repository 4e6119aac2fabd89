"""Child process for the distributed compaction crash test: a writer that appends forever and,
between appends, runs distributed compactions of the collection it writes, their tasks in a
pool of two other processes, while its own background compaction and GC merge and delete the
same parts.

Usage: python -m tests.runtime.compaction_crash_driver LOCATION SEED

Stdout lines (JSON): {"attempt": t, "keys": [...]} before an append is submitted, {"ack": t}
once it is durable, {"compaction": outcome} per distributed compaction (committed, refused,
task_failed: a task process killed or a part collected under it). The parent SIGKILLs this
process and its tasks (its process group), or arms crash points (``PERSIST_CRASH_AT``, which
the task processes inherit).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import random
import sys
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pyarrow as pa

import persist
from persist import PartsChanged, PersistError, distributed
from persist.indexed.maintenance.compact import CompactionPolicy
from tests import knobs

knobs.activate_from_env()

OPTIONS = persist.Options(
    background_compaction=True,
    inline_threshold=512,
    rollup_every=8,
    gc_grace_seconds=2.0,
    batch_rows=256,
    stats_bytes=2048,
    compaction=CompactionPolicy(final_rows=4096, inline_flush_bytes=16384, fanin=8),
)


def _task(data: bytes) -> list[distributed.StagedPart]:
    return distributed.run_compaction_task(distributed.CompactionTask.from_bytes(data))


def _say(rec: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def _pool() -> concurrent.futures.ProcessPoolExecutor:
    return concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("spawn"))


def main() -> None:
    location, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    url = f"file://{location}"
    # NB: the writer's background compaction merges the ready runs as soon as they are ready
    # (a distributed merge of the same parts is then nearly always refused): on in half the
    # runs, and explicit maintain() calls between a merge and its commit in the others
    options = dataclasses.replace(OPTIONS, background_compaction=rng.random() < 0.5)
    client = persist.open(location, reentrance_id="crash-compactor", options=options)
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    _say({"background": options.background_compaction})
    pool = _pool()
    list(pool.map(int, ["1", "2"]))  # the task processes started (a spawn takes ~1-2 s)

    def append() -> None:
        t = r.upper
        rows = rng.randint(1, 400)
        keys = [t * 1000 + i for i in range(rows)]
        _say({"attempt": t, "keys": keys})
        w.append(pa.table({"key": pa.array(keys, pa.int64()),
                           "value": pa.array(keys, pa.int64()),
                           "time": pa.array([t] * rows, pa.uint64()),
                           "diff": pa.array([1] * rows, pa.int64())}), t + 1).result()
        _say({"ack": t})
        if t > 2 and rng.random() < 0.5:
            w.allow_compaction(max(r.since, t - rng.randint(0, 2))).result()

    while True:
        append()
        if rng.random() < 0.2:
            continue
        plan = distributed.plan_compaction(url, "c", n=2)
        if plan is None:
            continue
        try:
            staged = [s for out in pool.map(_task, [t.to_bytes() for t in plan.tasks])
                      for s in out]
        except (BrokenProcessPool, PersistError) as e:
            plan.stager.release()
            _say({"compaction": "task_failed", "why": type(e).__name__})
            if isinstance(e, BrokenProcessPool):
                pool = _pool()
            continue
        if rng.random() < 0.3:
            append()  # an append between the merge and its commit
        if rng.random() < 0.3:
            client.maintain()  # the writer compacts (and collects) the same parts meanwhile
            _say({"maintained": True})
        try:
            distributed.commit_compaction(plan, staged, client=client)
            _say({"compaction": "committed"})
        except PartsChanged as e:
            _say({"compaction": "refused", "why": str(e)})


if __name__ == "__main__":
    main()
