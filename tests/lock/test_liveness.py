"""Liveness of the file lock against real misbehaving processes: a holder SIGSTOPped in the
middle of the lock's compare-and-set blocks nobody, and a SIGKILLed holder's rerun (no
reentrance id) does not wait out the lease. Children run ``tests/lock/holder.py``."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import persist
from persist.errors import LockHeld
from tests.support.bounded import within
from tests.support.patience import PATIENCE

ROOT = Path(__file__).resolve().parents[2]


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    return within(seconds, fn, what='still blocked')


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()[0].decode()


@pytest.fixture
def spawn() -> Iterator[Callable[[str, Path, str], subprocess.Popen[bytes]]]:
    """Starts ``holder.py MODE LOCATION`` and waits for it to print ``line``; kills it after."""
    children: list[subprocess.Popen[bytes]] = []

    def start(mode: str, location: Path, line: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-m", "tests.lock.holder", mode, str(location)],
                                 cwd=ROOT, stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        children.append(child)
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 60)
        got = child.stdout.readline().decode().strip() if ready else ""
        assert got == line, f"holder printed {got!r}, exit code {child.poll()}"
        return child

    yield start
    for child in children:
        child.kill()
        # NB: a SIGKILLed process dies even while stopped; SIGCONT is for good measure.
        os.kill(child.pid, signal.SIGCONT) if child.poll() is None else None
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def test_a_holder_stopped_inside_the_lock_write_blocks_nobody(tmp_path: Path, spawn: Any) -> None:
    child = spawn("pause", tmp_path, "stopping")
    deadline = time.monotonic() + PATIENCE
    while _state(child.pid) != "T":
        assert time.monotonic() < deadline, "the holder did not stop"
        time.sleep(0.01)

    start = time.monotonic()
    err = _within(PATIENCE, lambda: persist.open(tmp_path, reentrance_id="other",
                                                 lock_timeout=2))
    assert isinstance(err, LockHeld), err
    assert "'svc'" in str(err)
    # NB: at least its lock_timeout; far less than the holder's 30 s lease, which is what a
    # wait that depended on the (stopped) holder would take
    assert 2 <= time.monotonic() - start < 20

    # The blue/green handover: the same id takes over at once, whatever the old holder does.
    start = time.monotonic()
    client = _within(PATIENCE, lambda: persist.open(tmp_path, reentrance_id="svc"))
    assert isinstance(client, persist.Client), client
    assert time.monotonic() - start < 20  # not the 30 s lease
    client.stop()


def test_a_killed_holders_rerun_opens_at_once(tmp_path: Path, spawn: Any) -> None:
    child = spawn("crash", tmp_path, "ready")
    child.kill()
    child.wait(10)

    # No reentrance id: a fresh id, and lock_timeout=0. The lease (30 s) has not lapsed, but
    # the record names a process of this machine that is gone.
    client = _within(PATIENCE, lambda: persist.open(tmp_path))
    assert isinstance(client, persist.Client), client
    client.stop()


def test_a_live_holder_in_another_process_is_still_refused(tmp_path: Path, spawn: Any) -> None:
    spawn("crash", tmp_path, "ready")
    with pytest.raises(LockHeld, match="process"):
        persist.open(tmp_path)
