"""Child process of the S3 fencing and race tests (``tests/s3/test_fencing.py``).

Two modes, each reporting what happens as JSON lines on stdout (flushed one by one, so a parent
that SIGSTOPs this process knows exactly which writes were acknowledged before the pause):

``python -m tests.s3.fencing_writer trials``
    Runs one fencing trial per JSON line read from stdin, so many trials share one interpreter
    start-up. A trial opens ``spec["url"]`` as a writer (short lease), then appends one row at a
    time, keeping ``spec["pipeline"]`` appends in flight, until one fails terminally (Fenced,
    RuntimeShutdown, Indeterminate); then it stops its client and waits for the next line.
    With ``spec["late_heartbeat"]`` the heartbeat thread notices a lost lock only after a delay,
    so the loss must be caught by the storage CAS of the next commit (see ``_late_heartbeat``).

``python -m tests.s3.fencing_writer contend SPEC_JSON``
    One contender for the lock of each location in ``spec["locations"]`` (one thread each).
    Warms up (boto3 clients, Arrow encoding), reports ``ready`` and waits for a ``go`` line on
    stdin; then, until stdin says ``stop`` (or closes), opens the location (waiting up to a
    random ``lock_timeout``), appends a few rows, and stops, releasing the lock; LockHeld means
    another contender holds it, so it tries again. The parent SIGSTOPs contenders at random so
    leases lapse and holders are fenced.

Events (``ev``; in contend mode each also names its location, ``loc``)::

    ready                         contend: warmed up, waiting for ``go``
    opened  gen, seq              the lock generation (fence token) and the seq of its fence
    ack     i, key, seq           append i (row key ``key``) is durable, committed at ``seq``
    failed  i, key, error         append i definitely did not happen (a Determinate error)
    lost    i, key, error, cause, fenced_by, first
                                  append i failed terminally (``first``: the first such;
                                  ``fenced_by``: the Fenced message; i = -1: registering)
    held    error                 contend: another contender kept the lock for the timeout
    open_fenced  error            contend: a successor fenced before this open's own fence
    closed  lock_lost             the client was stopped
    done                          contend: every location's thread has finished
"""

from __future__ import annotations

import collections
import json
import random
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

import persist
from persist.errors import Determinate, Fenced, LockHeld, PersistError
from persist.lock.base import Lease, WriterLock

KEY_TYPE = pa.string()
VALUE_TYPE = pa.int64()

_OUT = threading.Lock()


def emit(**event: Any) -> None:
    """Writes one event line (stamped with the wall clock) to stdout and flushes it."""
    event["at"] = round(time.time(), 3)
    line = json.dumps(event) + "\n"
    with _OUT:
        sys.stdout.write(line)
        sys.stdout.flush()


def _late_heartbeat() -> None:
    """Makes the heartbeat thread notice a lost lock only a lease late.

    NB: after SIGCONT the heartbeat thread and the commit thread resume together, and either may
    find out first that a successor took over. Delaying the heartbeat's verdict makes the commit
    reach storage first, so the trial checks the fence that matters for safety: the conditional
    create of the next log key, not the lease.
    """
    original = WriterLock.heartbeat

    def heartbeat(self: WriterLock, lease: Lease) -> None:
        try:
            original(self, lease)
        except Fenced:
            time.sleep(self.lease_seconds)
            raise

    WriterLock.heartbeat = heartbeat  # type: ignore[method-assign]


def _error_name(e: BaseException | None) -> str | None:
    return None if e is None else type(e).__name__


def _fence_message(e: BaseException) -> str | None:
    """The message of the Fenced that ended the writer (``e`` or its cause), if any: it tells a
    commit refused by storage from a lease the heartbeat found lost ("writer lock ...")."""
    for err in (e, e.__cause__):
        if isinstance(err, Fenced):
            return str(err)
    return None


def write_until_lost(client: persist.Client, tag: str, pipeline: int, *,
                     stop: threading.Event | None = None, max_writes: int | None = None,
                     **labels: Any) -> bool:
    """Appends one row at a time (``pipeline`` in flight) until a terminal failure, ``stop``
    or ``max_writes``, emitting an event (with ``labels``) for each outcome.

    Row ``i`` is ``(("<tag>-<i>", i), t0 + i, +1)`` sealed to ``t0 + i + 1``, where ``t0`` is
    the upper found on opening, so every append is valid whatever failed before it.

    Returns:
        True if it ended on a terminal failure (the client is no longer usable).
    """
    try:
        w, r = client.create_or_load("c", key_type=KEY_TYPE, value_type=VALUE_TYPE)
    except PersistError as e:
        # NB: paused right after open() and fenced before registering: the register commit is
        # the first to find the successor's fence.
        emit(ev="lost", i=-1, key=None, error=_error_name(e), cause=_error_name(e.__cause__),
             fenced_by=_fence_message(e), first=True, **labels)
        return True
    t0 = r.upper
    inflight: collections.deque[tuple[int, str, Future[Any]]] = collections.deque()
    i = 0
    lost = False

    def may_submit() -> bool:
        return not lost and (max_writes is None or i < max_writes) and (
            stop is None or not stop.is_set())

    while True:
        while len(inflight) < pipeline and may_submit():
            key = f"{tag}-{i}"
            inflight.append((i, key, w.append([((key, i), t0 + i, 1)], t0 + i + 1)))
            i += 1
        if not inflight:
            return lost
        n, key, fut = inflight.popleft()
        try:
            seq = fut.result()
        except Determinate as e:
            emit(ev="failed", i=n, key=key, error=_error_name(e), **labels)
        except PersistError as e:
            emit(ev="lost", i=n, key=key, error=_error_name(e), cause=_error_name(e.__cause__),
                 fenced_by=_fence_message(e), first=not lost, **labels)
            lost = True
        else:
            emit(ev="ack", i=n, key=key, seq=seq, **labels)


def run_trials() -> None:
    """The ``trials`` mode: one fencing trial per stdin line."""
    patched = False
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        if spec.get("late_heartbeat") and not patched:
            _late_heartbeat()
            patched = True
        elif not spec.get("late_heartbeat") and patched:
            raise SystemExit("late_heartbeat cannot be turned off again in one process")
        client = persist.open(spec["url"], reentrance_id=spec["id"],
                              storage_options=spec["options"], lease_seconds=spec["lease"])
        emit(ev="opened", gen=client.state.epoch, seq=client.state.seq)
        try:
            write_until_lost(client, spec["tag"], spec["pipeline"])
        finally:
            # NB: read after stop(), which joins the heartbeat thread: that thread fails the
            # futures before it records lock_lost, so reading earlier races it.
            client.stop()
            emit(ev="closed", lock_lost=_error_name(client.lock_lost))


def _warm_up(url: str, options: dict[str, Any]) -> None:
    """Pays the one-time costs (boto3 service models, Arrow IPC and zstd) before contending, so
    the first hold is not seconds slower than the others."""
    from persist.indexed.format import columnar
    from persist.location import resolve

    resolve(url, storage_options=options).lock().current()
    columnar.encode_part(pa.table({"key": pa.array(["k"]), "value": pa.array([1]),
                                   "time": pa.array([0], pa.uint64()),
                                   "diff": pa.array([1], pa.int64())}))


def _watch_stdin(go: threading.Event, stop: threading.Event) -> None:
    for line in sys.stdin:
        if line.strip() == "go":
            go.set()
        elif line.strip() == "stop":
            break
    go.set()
    stop.set()


def contend(me: str, loc: dict[str, Any], lease: float, rng: random.Random,
            stop: threading.Event) -> None:
    """Takes the lock of one location, writes a little, lets go; repeats until ``stop``."""
    holds = 0
    name = loc["name"]
    while not stop.is_set():
        try:
            client = persist.open(loc["url"], reentrance_id=me, storage_options=loc["options"],
                                  lease_seconds=lease,
                                  lock_timeout=rng.uniform(lease * 2, lease * 3))
        except LockHeld as e:
            emit(ev="held", error=_error_name(e), loc=name)
            time.sleep(rng.uniform(0.0, 0.2))
            continue
        except Fenced as e:
            # paused between taking the lock and committing its fence, and a successor fenced
            # first: open() itself is refused
            emit(ev="open_fenced", error=_error_name(e), loc=name)
            continue
        holds += 1
        emit(ev="opened", gen=client.state.epoch, seq=client.state.seq, loc=name)
        try:
            write_until_lost(client, f"{me}.{holds}", rng.choice((1, 1, 3)), stop=stop,
                             max_writes=rng.randint(2, 8), loc=name)
        finally:
            client.stop()  # NB: then read lock_lost (see run_trials)
            emit(ev="closed", lock_lost=_error_name(client.lock_lost), loc=name)
        time.sleep(rng.uniform(0.0, 0.2))


def run_contender(spec: dict[str, Any]) -> None:
    """The ``contend`` mode: one contending thread per location, until told to stop."""
    for loc in spec["locations"]:
        _warm_up(loc["url"], loc["options"])
    go, stop = threading.Event(), threading.Event()
    threading.Thread(target=_watch_stdin, args=(go, stop), daemon=True).start()
    emit(ev="ready")
    go.wait()
    errors: list[BaseException] = []

    def run(n: int, loc: dict[str, Any]) -> None:
        try:
            contend(spec["id"], loc, spec["lease"], random.Random(spec["seed"] * 10 + n), stop)
        except BaseException as e:
            errors.append(e)
            raise

    threads = [threading.Thread(target=run, args=(n, loc), name=loc["name"])
               for n, loc in enumerate(spec["locations"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit(ev="done")
    if errors:
        raise SystemExit(f"a contender thread failed: {errors[0]!r}")


def main() -> None:
    """Dispatches on the mode (see the module docstring)."""
    mode = sys.argv[1]
    if mode == "trials":
        run_trials()
    elif mode == "contend":
        run_contender(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
