"""Three plain processes (no Spark) write one collection through ``persist.distributed.Committer``
and are killed with SIGKILL between a commit and its acknowledgement; restarted from their first
unacknowledged batch, they commit every batch exactly once.

Each worker (``tests/runtime/committer_worker.py``) stages a batch, commits it under its token
and then acknowledges it on stdout. Two workers are armed to die at the crash point
``committer.landed`` (the commit landed, its acknowledgement never printed), one at its second
batch and one at its fourth; the third is killed by this test as soon as it acknowledged its
third batch (wherever its next commit has got to). A restarted worker commits its unacknowledged
batch again, and the token turns a batch that already landed into a replay. The contents read
back decide: every row of every batch, once.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

import persist
from tests.runtime.committer_worker import batch, rid

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 8
#: Seconds to wait for the next line of any worker: a start-up (imports) and a few commits
#: under lock contention take a few seconds here; a loaded CI machine may take many times that.
QUIET_TIMEOUT = 300.0


@dataclass
class Worker:
    """One worker slot: its current process, what it acknowledged, how it died."""

    n: int
    proc: subprocess.Popen[str] | None = None
    acked: list[tuple[int, str]] = field(default_factory=list)
    kills: int = 0
    done: bool = False

    @property
    def next_batch(self) -> int:
        return self.acked[-1][0] + 1 if self.acked else 0


def _start(w: Worker, url: str, lines: queue.Queue[tuple[int, str | None]],
           crash_at: str | None) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PERSIST_CRASH_AT", None)
    if crash_at is not None:
        env["PERSIST_CRASH_AT"] = crash_at
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.committer_worker", url, str(w.n),
         str(w.next_batch), str(BATCHES)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    w.proc = proc

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.put((w.n, line.strip()))
        lines.put((w.n, None))  # the process ended (or was killed)

    threading.Thread(target=pump, daemon=True).start()


def test_three_processes_commit_every_batch_exactly_once_through_kills(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/loc"
    with persist.open(url) as client:
        client.create_or_load("events", key_type=pa.string(), value_type=pa.int64())
    workers = [Worker(n) for n in range(3)]
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    # workers 0 and 1 die between a commit landing and its acknowledgement, at their 2nd and
    # 4th batch; worker 2 is killed by this test once it acknowledged its 3rd batch
    for w, crash in zip(workers, ("committer.landed:2", "committer.landed:4", None),
                        strict=True):
        _start(w, url, lines, crash)
    try:
        while not all(w.done for w in workers):
            n, line = lines.get(timeout=QUIET_TIMEOUT)
            w = workers[n]
            assert w.proc is not None
            if line is None:
                code = w.proc.wait(timeout=60)
                assert w.proc.stderr is not None
                with w.proc.stderr:
                    err = w.proc.stderr.read()
                if w.done:
                    assert code == 0, err[-3000:]
                    continue
                assert code == -signal.SIGKILL, f"worker {n} exited {code}: {err[-3000:]}"
                w.kills += 1
                _start(w, url, lines, None)  # restarted under the same reentrance id
            elif line == "done":
                w.done = True
            elif line.startswith("ack "):
                _, b, how = line.split()
                assert int(b) == w.next_batch, (n, line, w.acked)
                w.acked.append((int(b), how))
                if n == 2 and len(w.acked) == 3 and w.kills == 0:
                    w.proc.send_signal(signal.SIGKILL)
    finally:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(timeout=60)
            if w.proc is not None and w.proc.stderr is not None:
                w.proc.stderr.close()

    assert [w.kills for w in workers] == [1, 1, 1]
    for w in workers:
        assert [b for b, _ in w.acked] == list(range(BATCHES))
    # the crash-point kills came after their batch landed: the restart found it a replay
    assert [b for b, how in workers[0].acked if how == "replay"] == [1]
    assert [b for b, how in workers[1].acked if how == "replay"] == [3]
    assert all(how in ("landed", "replay") for w in workers for _, how in w.acked)

    with persist.open(url) as client:
        write, read = client.create_or_load("events", key_type=pa.string(),
                                            value_type=pa.int64())
        write.seal(BATCHES).result()
        got = {t: read.snapshot(t).to_arrow() for t in (0, 3, BATCHES - 1)}
        for w in workers:
            assert client.token(rid(w.n)) == BATCHES - 1
    for t, table in got.items():
        want = Counter(k for w in workers for b in range(t + 1)
                       for k in batch(w.n, b).column("key").to_pylist())
        assert Counter(table.column("key").to_pylist()) == want  # every row once, none twice
        assert set(table.column("diff").to_pylist()) == {1}
