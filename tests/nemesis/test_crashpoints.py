"""Deterministic crashes at every named seam between durable steps.

For each seam of :mod:`persist.crashpoints` a writer subprocess (tests/nemesis/seam_writer.py)
runs with ``PERSIST_CRASH_AT=<seam>:<n>`` for a few ``n`` (the first time the seam is passed,
and later ones mid-workload), and is SIGKILLed by the seam itself. Then, per crash:

* the child really died at the seam (SIGKILL, not a clean exit: the seam was reached);
* the location reopens for writing under the same reentrance id, and for reading;
* every acknowledged write is present, and nothing that was never attempted;
* the reopened writer can write and seal again;
* ``persist verify`` finds no corruption and no metadata inconsistency; leaked data blobs (the
  expected residue of a crash between a data blob and its commit) are then deleted by
  ``delete_leaked`` without touching the contents.

The random-moment SIGKILL test lives in tests/runtime/test_crash.py; these are its
deterministic complement, one per seam.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from persist.indexed.maintenance.verify import delete_leaked, verify
from persist.location import resolve
from tests.nemesis.seam_writer import OPTIONS, RID

ROOT = Path(__file__).resolve().parents[2]

#: seam -> the hit counts to crash at (1 = the first time; the writer passes each seam
#: 7-70 times in a full run, so the later counts land mid-workload).
SEAMS: dict[str, tuple[int, ...]] = {
    "file.tmp_written": (1, 9, 40),
    "file.tmp_synced": (1, 9, 40),
    "file.linked": (1, 9, 40),
    "commit.data_written": (1, 3, 25),
    "commit.meta_written": (1, 7, 25),
    "compact.part_written": (1, 4),
    "gc.before_delete": (1, 6),
    "gc.after_delete": (1, 6),
    "rollup.written": (1, 5),
    "trim.log_deleted": (1, 12),
}


def _spawn(location: Path, seam: str, n: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PERSIST_CRASH_AT=f"{seam}:{n}")
    return subprocess.Popen([sys.executable, "-m", "tests.nemesis.seam_writer", str(location)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)


def _parse(out: bytes) -> tuple[set[int], dict[int, list[int]]]:
    acked: set[int] = set()
    tried: dict[int, list[int]] = {}
    for line in out.decode().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # cut short by the kill
        if "try" in rec:
            tried[rec["try"]] = rec["keys"]
        elif "ack" in rec:
            acked.add(rec["ack"])
    return acked, tried


def _contents(location: Path) -> pa.Table:
    with persist.open(location, read_only=True) as replica:
        _, read = replica.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        return read.snapshot(read.upper - 1).to_arrow()


def _check_recovery(location: Path, acked: set[int], tried: dict[int, list[int]]) -> int:
    """Checks the location after a crash; returns the number of leaked blobs it had."""
    if not (location / "meta").exists():
        assert not acked, "writes were acknowledged but the location has no metadata"
        return 0
    with persist.open(location, reentrance_id=RID, options=OPTIONS) as client:
        write, read = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        upper = read.upper
        present: set[int] = set()
        if upper > 0:
            snap = read.snapshot(upper - 1).to_arrow()
            assert set(snap.column("diff").to_pylist()) <= {1}
            present = set(snap.column("key").to_pylist())
        want = {k for t in acked for k in tried[t]}
        assert want <= present, f"lost acknowledged keys {sorted(want - present)[:5]}"
        allowed = {k for keys in tried.values() for k in keys}
        assert present <= allowed, f"phantom keys {sorted(present - allowed)[:5]}"
        # The reopened writer is fully usable.
        write.append([((-1, -1), upper, 1)], upper + 1).result()
        assert ((-1, -1), upper, 1) in read.snapshot(upper).to_python()
    before = _contents(location)
    loc = resolve(str(location))
    report = verify(loc.read_half(), url=loc.url)
    assert report.problems == [], report.problems
    if report.leaked:
        # A crash between a data blob and its commit leaves the blob behind: the operator
        # command removes it, and nothing referenced goes with it.
        assert delete_leaked(loc.blob, report.leaked, 0.0, lambda _: None) == report.leaked
        again = verify(loc.read_half(), url=loc.url)
        assert again.problems == []
        assert again.leaked == []
        assert _contents(location).equals(before)
    return len(report.leaked)


@pytest.mark.crash
@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_crash_at_seam(seam: str, tmp_path: Path) -> None:
    procs = {n: (tmp_path / f"loc-{n}", None) for n in SEAMS[seam]}
    running = {n: _spawn(loc, seam, n) for n, (loc, _) in procs.items()}
    for n, proc in running.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, (
            f"{seam}:{n} was not reached (exit {proc.returncode}): {err.decode()[-2000:]}"
        )
        acked, tried = _parse(out)
        leaked = _check_recovery(procs[n][0], acked, tried)
        print(f"{seam}:{n}: {len(acked)} writes acknowledged before the crash, "
              f"{leaked} leaked blobs cleaned up")
