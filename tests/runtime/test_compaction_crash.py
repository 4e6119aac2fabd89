"""Kill -9 a distributed compaction's driver and its tasks at random points while its writer
appends and compacts the same collection; nothing acknowledged may be lost, no part read twice,
``persist verify`` clean.

Each round starts tests/runtime/compaction_crash_driver.py (a writer that appends, runs
distributed compactions with tasks in two other processes, and compacts and collects by itself
meanwhile), and kills it by one of:

* SIGKILL of its whole process group (the driver and its task processes) at a random moment;
* a crash point armed in it (``PERSIST_CRASH_AT``, inherited by its task processes): a task
  killed as it starts or after it staged a part (the driver goes on: the job fails, its lease
  is released), the driver killed after its commit, in a commit, or in its own merge; then the
  process group is killed.

After each round the location is reopened under the same reentrance id and checked: every
acknowledged append is present, nothing never attempted, every row with diff 1 (a part read
twice, or a merge committed over parts it did not replace, would double it); and the last
round runs ``verify``, which must find no problem.

``PERSIST_COMPACTION_KILLS`` sets the number of kills (default: 6; 10 took 382 s on this shared 2-core machine under a load average of 16-19; the slow test: 120, which took 4,642 s
under a load average of 1-16, with 1,268 acknowledged appends and 111 distributed
compactions committed, 257 refused, 20 whose tasks failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.indexed.maintenance import verify
from persist.location import resolve
from tests.support.patience import PATIENCE

ROOT = Path(__file__).resolve().parents[2]
#: Crash points, with how many hits to let pass: tasks' (in the task processes) and the
#: driver's.
POINTS = ("distributed.compaction.task", "distributed.compaction.staged",
          "distributed.compaction.committed", "commit.meta_written", "compact.part_written",
          "gc.before_delete")


def _run_round(location: Path, seed: int, rng: random.Random) -> tuple[
        set[int], dict[int, list[int]], list[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERSIST_CRASH_AT", None)
    point = None
    if rng.random() < 0.6:
        point = f"{rng.choice(POINTS)}:{rng.randint(1, 4)}"
        env["PERSIST_CRASH_AT"] = point
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.compaction_crash_driver", str(location),
         str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append(raw.decode(errors="replace"))
            if not ready.is_set() and '"ack"' in lines[-1]:
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    # NB: a crash point may kill the driver before its first ack while its task processes
    # (same group) still hold stdout open: stop waiting once the driver is gone
    deadline = time.monotonic() + PATIENCE
    while not ready.wait(0.2) and proc.poll() is None and time.monotonic() < deadline:
        pass
    # NB: long enough for a few compactions (a task pool starts in ~2 s) when a crash point
    # is armed; a random moment otherwise
    time.sleep(rng.uniform(2.0, 6.0) if point else rng.uniform(0.0, 5.0))
    # the driver and its task processes (none left: a crash point killed them all)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    reader.join(timeout=30)
    assert proc.stderr is not None
    assert proc.stdout is not None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.stdout.close()
    with_point = f" (armed: {point})" if point else ""
    assert proc.returncode == -signal.SIGKILL, f"driver exited{with_point}: {err[-3000:]}"
    acked: set[int] = set()
    attempted: dict[int, list[int]] = {}
    outcomes: list[str] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "attempt" in rec:
            attempted[rec["attempt"]] = rec["keys"]
        elif "ack" in rec:
            acked.add(rec["ack"])
        elif "compaction" in rec:
            outcomes.append(rec["compaction"])
    return acked, attempted, outcomes


def _kills(default: int) -> int:
    return int(os.environ.get("PERSIST_COMPACTION_KILLS", default))


def _crash_rounds(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    location = tmp_path / "loc"
    acked: set[int] = set()
    attempted: dict[int, list[int]] = {}
    outcomes: list[str] = []
    for round_ in range(kills):
        got_acked, got_attempted, got = _run_round(location, rng.randrange(2**32), rng)
        acked |= got_acked
        attempted.update(got_attempted)
        outcomes.extend(got)
        if not (location / "meta").exists():
            continue
        with persist.open(location, reentrance_id="crash-compactor") as client:
            if "c" not in client.collections:
                assert not acked
                continue
            _, read = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
            upper = read.upper
            assert all(t < upper for t in acked), (round_, sorted(acked)[-3:], upper)
            if upper == 0:
                continue
            snap = read.snapshot(upper - 1).to_arrow()
            keys = snap.column("key").to_pylist()
            present = set(keys)
            assert len(present) == len(keys), f"round {round_}: a key read twice"
            want = {k for t in acked for k in attempted[t]}
            assert want <= present, f"round {round_}: lost {sorted(want - present)[:5]}"
            allowed = {k for ks in attempted.values() for k in ks}
            assert present <= allowed, f"round {round_}: phantom {sorted(present - allowed)[:5]}"
            assert set(snap.column("diff").to_pylist()) <= {1}, f"round {round_}: a part twice"
    report = verify.verify(resolve(str(location)).blob.read_only())
    assert report.problems == []
    print(f"compaction crash test: {kills} kills, {len(acked)} acknowledged appends, "
          f"compactions: {sorted((o, outcomes.count(o)) for o in set(outcomes))}")
    assert len(acked) >= kills, "the writer barely made progress; the test proves little"
    assert "committed" in outcomes, "no distributed compaction ever committed"


@pytest.mark.crash
@pytest.mark.timeout(1200)
def test_kills_never_lose_acknowledged_writes_nor_read_a_part_twice(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, _kills(6),
                  seed=int(os.environ.get("PERSIST_CRASH_SEED", "5")))


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(7200)  # 120 kills, each a fresh interpreter and task pool (~39 s under load)
def test_kills_many(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, _kills(120),
                  seed=int(os.environ.get("PERSIST_CRASH_SEED", "13")))
