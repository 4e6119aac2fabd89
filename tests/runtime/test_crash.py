"""Kill -9 a writer at random moments; nothing acknowledged may be lost, nothing may change.

Each round starts a writer subprocess (tests/runtime/crash_writer.py) that appends and seals
continuously (with background compaction and an aggressive GC), SIGKILLs it after a random
delay, reopens the location under the same reentrance id, and checks:

* every acknowledged write is present, and nothing that was never attempted;
* every snapshot recorded in an earlier round (as of a time still >= since) is unchanged;
* the location always reopens.

``PERSIST_CRASH_KILLS`` sets the number of kills (CI: 50; the slow run: 300).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

import persist

ROOT = Path(__file__).resolve().parents[2]


def _run_round(location: Path, seed: int, delay: float) -> tuple[set[int], dict[int, list[int]]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.crash_writer", str(location), str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    acked: set[int] = set()
    attempted: dict[int, list[int]] = {}
    for line in out.decode().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the kill cut a line short
        if "attempt" in rec:
            attempted[rec["attempt"]] = rec["keys"]
        elif "ack" in rec:
            acked.add(rec["ack"])
    return acked, attempted


def _kills(default: int) -> int:
    return int(os.environ.get("PERSIST_CRASH_KILLS", default))


def _crash_rounds(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    location = tmp_path / "loc"
    acked: set[int] = set()
    attempted: dict[int, list[int]] = {}
    recorded: dict[int, pa.Table] = {}
    startup_done = 0
    for round_ in range(kills):
        # NB: the first rounds use longer delays so the writer gets past interpreter start-up.
        delay = rng.uniform(0.8, 1.6) if startup_done < 2 else rng.uniform(0.02, 1.2)
        got_acked, got_attempted = _run_round(location, rng.randrange(2**32), delay)
        if got_acked:
            startup_done += 1
        acked |= got_acked
        attempted.update(got_attempted)
        if not (location / "meta").exists():
            continue  # killed before the location was created
        with persist.open(location, reentrance_id="crash-writer") as client:
            if "c" not in client.collections:
                assert not acked
                continue
            _, read = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
            upper, since = read.upper, read.since
            assert all(t < upper for t in acked), (round_, sorted(acked)[-3:], upper)
            if upper == 0:
                continue
            snap = read.snapshot(upper - 1).to_arrow()
            present = set(snap.column("key").to_pylist())
            want = {k for t in acked for k in attempted[t]}
            assert want <= present, f"round {round_}: lost {sorted(want - present)[:5]}"
            allowed = {k for keys in attempted.values() for k in keys}
            assert present <= allowed, f"round {round_}: phantom {sorted(present - allowed)[:5]}"
            assert set(snap.column("diff").to_pylist()) <= {1}
            for as_of, table in recorded.items():
                if since <= as_of < upper:
                    assert read.snapshot(as_of).to_arrow().equals(table), (round_, as_of)
            as_of = rng.randrange(since, upper)
            recorded.setdefault(as_of, read.snapshot(as_of).to_arrow())
    print(f"crash test: {kills} kills, {len(acked)} acknowledged appends, {len(recorded)} snapshots rechecked")
    assert len(acked) > kills // 2, "the writer barely made progress; the test proves little"


@pytest.mark.crash
def test_sigkill_never_loses_acknowledged_writes(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, _kills(50), seed=int(os.environ.get("PERSIST_CRASH_SEED", "7")))


@pytest.mark.crash
@pytest.mark.slow
def test_sigkill_many(tmp_path: Path) -> None:
    _crash_rounds(tmp_path, _kills(300), seed=int(os.environ.get("PERSIST_CRASH_SEED", "11")))
