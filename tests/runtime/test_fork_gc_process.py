"""Forks across locations while the source's GC runs in other processes.

The source location's writer (tests/runtime/gc_writer.py, a process of its own) appends,
compacts and collects garbage as fast as it can, with no GC grace and a short leaked-blob
sweep; meanwhile ``persist verify --delete-leaked`` runs on the source again and again from a
third process. This process forks the source into a second location over and over and reads
every fork as of its time, again and again: every read must succeed and be what the source held
then, whatever the source's GC deleted meanwhile. At the end the second location goes away, and
the source's GC deletes every blob the forks kept alive and releases every pin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa

import persist
from persist import layout
from persist.blob.file import FileBlob
from persist.distributed import describe, read_task
from persist.indexed.state import pins
from tests.runtime.gc_writer import expected
from tests.support.patience import PATIENCE, eventually

ROOT = Path(__file__).resolve().parents[2]


def _contents(client: persist.Client, name: str, as_of: int) -> set[tuple[int, int]]:
    _, r = client.create_or_load(name, key_type=pa.int64(), value_type=pa.int64())
    return {kv for kv, _, d in r.snapshot(as_of).to_python() if d == 1}


def test_forks_survive_the_sources_gc_in_other_processes(tmp_path: Path) -> None:
    a, b, stop = tmp_path / "a", tmp_path / "b", tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writer = subprocess.Popen([sys.executable, "-m", "tests.runtime.gc_writer", str(a), str(stop)],
                              stdout=subprocess.PIPE, env=env, cwd=ROOT)
    sweeps: list[int] = []
    problems: list[str] = []
    done = threading.Event()

    def sweep() -> None:  # the operator's command, in a process of its own, again and again
        while not done.is_set():
            got = subprocess.run([sys.executable, "-m", "persist", "verify", str(a),
                                  "--delete-leaked", "--grace", "1.0", "--no-progress"],
                                 capture_output=True, env=env, cwd=ROOT)
            sweeps.append(got.returncode)
            if got.returncode:
                problems.append((got.stdout + got.stderr).decode(errors="replace")[-2000:])

    sweeper = threading.Thread(target=sweep, daemon=True)
    try:
        assert writer.stdout is not None
        assert json.loads(writer.stdout.readline()) == {"ready": True}
        sweeper.start()
        forks: dict[str, int] = {}
        reads = 0
        retried = 0
        with persist.open(b, options=persist.Options(commit_deadline_seconds=2.0)) as dst:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline or len(forks) < 5:
                name = f"f{len(forks)}"
                # NB: as of the latest sealed time when it plans (the source's since moves
                # too fast to name one ahead)
                try:
                    persist.fork(str(a), "c", str(b), into=name, client=dst)
                except persist.Determinate:
                    # the documented answer when the source's compaction keeps retiring what
                    # the fork pinned (tiny parts merged at fanin 2 on a busy machine): try
                    # again; nothing was committed, and the pins it made are gone
                    assert name not in dst.collections
                    retried += 1
                    assert retried <= 50, "a fork never got through the source's compaction"
                    continue
                as_of = forks[name] = dst.state.collections[name].upper - 1
                for fork, at in forks.items():
                    assert _contents(dst, fork, at) == expected(at), fork
                    reads += 1
                # and distributed reads of a fork, planned here, read "anywhere"
                scan = describe(str(b), name).snapshot(as_of)
                got = {(k, v) for task in scan.tasks(consolidated=True)
                       for t in read_task(task)
                       for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                                       strict=True)}
                assert got == expected(as_of)
                time.sleep(0.2)
        done.set()
        sweeper.join(timeout=120)
        assert sweeps, "the operator's sweep never ran"
        assert set(sweeps) <= {0}, problems[:2]  # verify never found a problem
        print(f"{len(forks)} forks ({retried} retried), {reads} reads of them, {len(sweeps)} "
              f"sweeps from another process, while the source compacted and collected")
        pinned = {k for p in pins.listing(FileBlob(a)) for k in p.keys}
        assert pinned
        # the forks go away: the source's GC (in the writer process) releases the pins and
        # deletes what only they kept alive
        shutil.rmtree(b)
        # NB: with no retired blob to judge, the source's GC tidies its pins once a minute
        # (PinGuard.tidy_seconds): on a loaded machine that can take minutes, so the hang
        # detector's patience, not a fixed 120 s
        eventually(lambda: not pins.listing(FileBlob(a)), "the source released every pin",
                   interval=0.1)
        stored = set(FileBlob(a).list_keys(layout.DATA_PREFIX))
        with persist.open(a, read_only=True) as replica:
            live = {p.blob_key for p in replica.state.collections["c"].parts}
        wait = time.monotonic() + PATIENCE
        while (pinned & stored) - live and time.monotonic() < wait:
            time.sleep(0.1)
            stored = set(FileBlob(a).list_keys(layout.DATA_PREFIX))
        assert not (pinned & stored) - live
    finally:
        done.set()
        stop.touch()
        writer.wait(timeout=120)
        if writer.stdout is not None:
            writer.stdout.close()
        sweeper.join(timeout=120)
