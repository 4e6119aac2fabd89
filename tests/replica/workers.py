"""Processes for the multi-process replica tests: ``python -m tests.replica.workers ROLE ...``.

Every role prints JSON lines on stdout (flushed at once, so a SIGKILL loses nothing it
reported) and the tests read them as that process's report. The data model is shared:

* ``events``: key string, value int64. Time ``t`` holds the insert ``(("k<t>", t), t, +1)``;
  with ``--churn W`` it also retracts key ``t - W`` at ``t`` (so the contents as of ``a`` are
  exactly the keys ``a-W+1 .. a``), which gives compaction something to consolidate.
* A writer appends one time per commit (``append(..., upper=t + 1)``) from the upper it finds,
  so every time below upper holds exactly one insert whoever wrote it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

import persist
from persist.indexed.engine import Options
from tests import knobs
from tests.support.patience import PATIENCE

NAME = "events"


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def key(t: int) -> str:
    return f"k{t:06d}"


def updates_at(t: int, churn: int) -> list[tuple[tuple[str, int], int, int]]:
    out = [((key(t), t), t, 1)]
    if churn and t >= churn:
        out.append(((key(t - churn), t - churn), t, -1))
    return out


def expected_keys(as_of: int, churn: int) -> list[str]:
    lo = max(0, as_of - churn + 1) if churn else 0
    return [key(t) for t in range(lo, as_of + 1)]


def aggressive_options() -> Options:
    """Everything in blobs, rollups every few commits, GC with no grace at all."""
    # NB: pins background compaction on (the knob matrix turns it off): the tests using these
    # wait for merged parts to be collected under their readers
    return Options(gc_grace_seconds=0, rollup_every=4, inline_threshold=0,
                   background_compaction=True)


#: ``--storage-options`` of this process (JSON), passed to every open.
STORAGE_OPTIONS: dict[str, Any] | None = None


def open_events(url: str, **kw: Any) -> tuple[persist.Client, Any, Any]:
    client = persist.open(url, storage_options=STORAGE_OPTIONS, **kw)
    try:
        if client.read_only:
            deadline = time.monotonic() + PATIENCE
            while NAME not in client.collections:
                if time.monotonic() > deadline:
                    raise TimeoutError("the writer never created the collection")
                time.sleep(0.01)
                client._sync()
        w, r = client.create_or_load(NAME, key_type=pa.string(), value_type=pa.int64())
    except BaseException:
        client.stop()
        raise
    return client, w, r


def writer(a: argparse.Namespace) -> None:
    stop, go = threading.Event(), threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
            elif line.strip() == "stop":
                break
        stop.set()
        go.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    options = aggressive_options() if a.aggressive else None
    emit(ev="opening")
    client, w, r = open_events(a.url, reentrance_id=a.rid, lock_timeout=a.lock_timeout,
                               notify=a.notify, options=options)
    t = r.upper
    emit(ev="open", upper=t, seq=client.state.seq, epoch=client.state.epoch)
    try:
        stop_at = a.until if a.count is None else t + a.count
        while not stop.is_set() and (stop_at is None or t < stop_at):
            if t == a.pause_at:
                # NB: an event, not a sleep: the test starts its readers, waits until they
                # have read what they need, then says go (or stop)
                emit(ev="paused", t=t)
                go.wait()
                if stop.is_set():
                    break
            try:
                w.append(updates_at(t, a.churn), upper=t + 1).result()
            except (persist.Fenced, persist.RuntimeShutdown) as e:
                emit(ev="fenced", t=t, error=type(e).__name__)
                return
            emit(ev="ack", t=t)
            t += 1
            if a.since_lag and t % 8 == 0 and t > a.since_lag:
                w.allow_compaction(t - a.since_lag).result()
            if a.interval:
                time.sleep(a.interval)
        emit(ev="done", upper=t)
    finally:
        client.stop()
        emit(ev="stopped")


class Until:
    """Where a replica stops: ``--until``, or a later ``until N`` line on stdin (the test sends
    it once the last writer is done and the final upper is known)."""

    def __init__(self, until: int | None) -> None:
        self._value = until
        if until is None:
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        for line in sys.stdin:
            word, _, n = line.partition(" ")
            if word == "until":
                self._value = int(n)
                return

    def reached(self, frontier: int) -> bool:
        return self._value is not None and frontier >= self._value


def check_snapshots(r: Any, until: Until, churn: int, deadline: float) -> dict[str, Any]:
    """Consolidated snapshots in a loop until ``upper`` reaches ``until``, each checked against
    the model.

    Reads as of the newest time and as of one between since and upper. A snapshot refused
    because since moved past the chosen ``as_of`` meanwhile is counted apart: a refusal is
    a typed answer, not a wrong one.
    """
    n, bad, errors = 0, 0, []
    while True:
        upper, since = r.upper, r.since
        if until.reached(upper) or time.monotonic() > deadline:
            break
        for as_of in {upper - 1, (since + upper - 1) // 2}:
            try:
                got = r.snapshot(as_of).to_python()
            except persist.InvalidUsage as e:
                errors.append(f"refused: {e}")
                continue
            except persist.PersistError as e:
                errors.append(f"{type(e).__name__}: {e}")
                continue
            n += 1
            keys = [k for (k, _v), _t, d in got if d == 1]
            if keys != expected_keys(as_of, churn) or any(d != 1 for _, _, d in got):
                bad += 1
    return {"snapshots": n, "bad": bad, "errors": errors[:20],
            "failures": sum(not e.startswith("refused") for e in errors)}


def listener(a: argparse.Namespace) -> None:
    """Listens from the start until ``--until`` (or ``until N`` on stdin); with ``--snapshots``
    also checks snapshots in a second thread the whole time (continuous reads)."""
    client, _, r = open_events(a.url, read_only=True, missing_ok=True, notify=a.notify)
    until = Until(a.until)
    deadline = time.monotonic() + a.timeout
    checked: dict[str, Any] = {}
    reads = threading.Thread(
        target=lambda: checked.update(check_snapshots(r, until, a.churn, deadline)))
    try:
        snap = r.snapshot(0, timeout=PATIENCE)
        # NB: a snapshot at 0 holds time 0 exactly; listen(0) then has every later time.
        rows = [[k, t, d] for (k, _v), t, d in snap.to_python()]
        listen = r.listen(0, poll=0.5)
        if a.snapshots:
            reads.start()
        if a.notify:
            # NB: "ready" means pushes can arrive: the subscriber connects in its own thread,
            # so a test that counts pushes must not start the writer's updates before it is
            while not client.stats.get("push", {}).get("live"):
                if time.monotonic() > deadline:
                    emit(ev="timeout", frontier=listen.frontier, push=client.stats.get("push"))
                    return
                time.sleep(0.01)
        emit(ev="ready")
        progress: list[int] = []
        while not until.reached(listen.frontier):
            if time.monotonic() > deadline:
                emit(ev="timeout", frontier=listen.frontier)
                return
            for e in listen.poll(0.5):
                if isinstance(e, persist.ListenUpdates):
                    for k, t, d in zip(e.batch.column("key").to_pylist(),
                                       e.batch.column("time").to_pylist(),
                                       e.batch.column("diff").to_pylist(), strict=True):
                        rows.append([k, t, d])
                else:
                    progress.append(e.upper)
        listen.close()
        if a.snapshots:
            reads.join()
        emit(ev="done", rows=rows, progress=progress, snapshots=checked, stats=client.stats)
    finally:
        client.stop()


def reader(a: argparse.Namespace) -> None:
    """Only the snapshot checks, until ``--until``."""
    client, _, r = open_events(a.url, read_only=True, missing_ok=True, notify=a.notify)
    try:
        r.snapshot(0, timeout=PATIENCE)
        emit(ev="ready")
        checked = check_snapshots(r, Until(a.until), a.churn, time.monotonic() + a.timeout)
        emit(ev="done", snapshots=checked, stats=client.stats)
    finally:
        client.stop()


def replica_probe(a: argparse.Namespace) -> None:
    """A replica that reads everything it can and tries every kind of write."""
    client, w, r = open_events(a.url, read_only=True, missing_ok=True)
    try:
        upper = r.upper
        rows = len(r.snapshot(upper - 1).to_python())
        listen = r.listen(upper - 1)
        listen.poll(0.05)
        listen.close()
        refused: list[str] = []
        unknown: list[str] = []
        attempts: list[tuple[str, Callable[[], object]]] = [
            ("write", lambda: w.write([((key(upper), upper), upper, 1)])),
            ("append", lambda: w.append([((key(upper), upper), upper, 1)], upper=upper + 1)),
            ("seal", lambda: w.seal(upper + 1)),
            ("allow_compaction", lambda: w.allow_compaction(0)),
            ("apply", lambda: client.apply(seals={NAME: upper + 1})),
            ("register", lambda: client.create_or_load("other", key_type=pa.string(),
                                                        value_type=pa.int64())),
        ]
        for what, call in attempts:
            try:
                call()
            except persist.ReadOnly:
                refused.append(what)
            except persist.UnknownCollection:
                unknown.append(what)  # a replica cannot create a collection either
        emit(ev="done", upper=upper, rows=rows, refused=refused, unknown=unknown,
             stats=client.stats)
    finally:
        client.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["writer", "listener", "reader", "replica_probe"])
    p.add_argument("--url", required=True)
    p.add_argument("--rid")
    p.add_argument("--until", type=int)
    p.add_argument("--count", type=int)
    p.add_argument("--pause-at", type=int,
                   help="before appending this time, report 'paused' and wait for 'go' on stdin")
    p.add_argument("--interval", type=float, default=0.0)
    p.add_argument("--lock-timeout", type=float, default=0.0)
    p.add_argument("--notify", action="store_true")
    p.add_argument("--aggressive", action="store_true")
    p.add_argument("--churn", type=int, default=0)
    p.add_argument("--since-lag", type=int, default=0)
    p.add_argument("--snapshots", action="store_true")
    p.add_argument("--storage-options", type=json.loads)
    p.add_argument("--timeout", type=float, default=PATIENCE)
    a = p.parse_args(argv)
    global STORAGE_OPTIONS
    STORAGE_OPTIONS = a.storage_options
    {"writer": writer, "listener": listener, "reader": reader,
     "replica_probe": replica_probe}[a.role](a)


if __name__ == "__main__":
    # NB: the parent test runs under a knob set (tests/knobs.py); so does this process (not
    # when imported by a test: the test's own set is active then).
    knobs.activate_from_env()
    main()
