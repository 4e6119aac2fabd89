"""Trimming the metadata by sequence number (DESIGN.md §9): no LIST of the log to trim it or to
open a writer, progress recorded in the rollups so the next writer goes on, a crash in the
middle of a trim left to the next writer, and a one-time LIST on a location an older persist
trimmed."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from typing_extensions import override

import persist
from persist import layout
from persist.blob.base import Blob, Wrapping
from persist.blob.envelope import Framed
from persist.blob.file import FileBlob
from persist.blob.memory import MemoryBlob
from persist.indexed.engine import Options
from persist.indexed.format import meta
from persist.location import Location, open_writer
from persist.lock.memory import MemoryLock
from persist.runtime.client import Client
from persist.runtime.runtime import Runtime
from tests.nemesis.seam_writer import OPTIONS, RID
from tests.nemesis.test_crashpoints import _check_recovery, _parse, _spawn


class CountingBlob(Wrapping):
    """A real store that counts its LISTs: per call the prefix, whether it started after a key,
    and how many keys it returned."""

    def __init__(self, inner: Blob) -> None:
        self.inner = inner
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local
        self.lists: list[tuple[str, str | None, int]] = []
        self._lock = threading.Lock()

    def full_log_lists(self) -> int:
        """LISTs of the whole metadata log (from its start)."""
        with self._lock:
            return sum(1 for p, after, _ in self.lists
                       if layout.LOG_PREFIX.startswith(p) and after is None)

    def log_keys_listed(self) -> int:
        with self._lock:
            return sum(n for p, _, n in self.lists if layout.LOG_PREFIX.startswith(p))

    def reset(self) -> None:
        with self._lock:
            self.lists.clear()

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        return self.inner._get(key)

    @override
    def _list(self, prefix: str) -> list[str]:
        keys = self.inner._list(prefix)
        with self._lock:
            self.lists.append((prefix, None, len(keys)))
        return keys

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        keys = self.inner._list_after(prefix, start_after)
        with self._lock:
            self.lists.append((prefix, start_after, len(keys)))
        return keys

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        self.inner._set(key, data)

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        return self.inner._set_if_absent(key, data)

    @override
    def _delete(self, key: str) -> None:
        self.inner._delete(key)


def _open(blob: Blob, name: str, options: Options) -> Client:
    """A writer opened as ``persist.open`` opens one (lock, load, fence), with maintenance
    rounds only when the test asks (``client.maintain()``)."""
    loc = Location(f"mem://{name}", blob, lambda: MemoryLock(name))
    w = open_writer(loc, "w", lock_timeout=5.0, options=options)
    runtime = Runtime(w.engine, lock=w.lock, lease=w.lease, maintenance=False)
    return Client(loc.url, w.engine, runtime=runtime)


def _commits(client: Client, n: int, *, maintain_every: int = 16) -> None:
    w, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
    for i in range(n):
        t = r.upper
        w.append([((t, i), t, 1)], t + 1).result()
        if i % maintain_every == maintain_every - 1:
            client.maintain()
    client.maintain()


def _seqs(blob: Blob, prefix: str) -> list[int]:
    return [layout.seq_of(k) for k in blob.list_keys(prefix)]


def test_trimming_and_opening_never_list_the_log() -> None:
    name = uuid.uuid4().hex
    blob = CountingBlob(MemoryBlob(name))
    opts = Options(rollup_every=8, gc_grace_seconds=0.0)
    client = _open(blob, name, opts)
    try:
        _commits(client, 300)
    finally:
        client.stop()
    assert blob.full_log_lists() == 0
    # everything up to the newest rollup was trimmed, by key
    rollups = _seqs(blob.inner, layout.ROLLUP_PREFIX)
    assert len(rollups) <= 2
    assert min(_seqs(blob.inner, layout.LOG_PREFIX)) > rollups[0]

    # a reopen lists the rollups and the log after the newest one: its tail, nothing before
    blob.reset()
    tail = len(_seqs(blob.inner, layout.LOG_PREFIX)) - sum(
        1 for s in _seqs(blob.inner, layout.LOG_PREFIX) if s <= rollups[-1])
    client = _open(blob, name, opts)
    try:
        assert blob.full_log_lists() == 0
        assert blob.log_keys_listed() == tail < opts.rollup_every + 2
        assert [p for p, _, _ in blob.lists].count(layout.LOG_PREFIX) == 1  # no second for the fence
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert len(r.snapshot(r.upper - 1).to_arrow()) == 300
    finally:
        client.stop()


def test_short_lived_writers_leave_a_bounded_log() -> None:
    """30 writers of 200 commits each, none living a grace period: each trims what the ones
    before it left (their rollups' records say when they were written)."""
    name = uuid.uuid4().hex
    blob = CountingBlob(MemoryBlob(name))
    grace = 0.3
    opts = Options(rollup_every=16, gc_grace_seconds=grace)
    sessions, per = 30, 200
    for _ in range(sessions):
        client = _open(blob, name, opts)
        try:
            _commits(client, per, maintain_every=50)
        finally:
            client.stop()
        time.sleep(grace)  # the session's rollups are a grace old when the next one opens
    assert blob.full_log_lists() == 0
    logs = _seqs(blob.inner, layout.LOG_PREFIX)
    rollups = _seqs(blob.inner, layout.ROLLUP_PREFIX)
    # without the trim: every commit of every session (6,000+) and every rollup (375+)
    assert len(logs) <= per + 2 * opts.rollup_every
    assert len(rollups) <= per // opts.rollup_every + 2
    assert logs[-1] - logs[0] + 1 == len(logs)  # what is left is dense
    # and the next writer reads everything back
    client = _open(blob, name, opts)
    try:
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert len(r.snapshot(r.upper - 1).to_arrow()) == sessions * per
    finally:
        client.stop()


def test_a_location_an_older_persist_trimmed_is_listed_once() -> None:
    name = uuid.uuid4().hex
    inner = MemoryBlob(name)
    blob = CountingBlob(inner)
    keep = Options(rollup_every=8, gc_grace_seconds=3600.0)
    client = _open(inner, name, keep)
    try:
        _commits(client, 100)
    finally:
        client.stop()
    # as an older persist left it: rollups without a record of the trim, the log from seq 1
    # (one of its trims cut the log at the first rollup, the rollups before it went too)
    for key in inner.list_keys(layout.ROLLUP_PREFIX):
        data = inner.get(key)
        assert data is not None
        inner.set(key, meta.encode(meta.decode_state(key, data)))
    first_rollup = _seqs(inner, layout.ROLLUP_PREFIX)[0]
    for seq in range(1, first_rollup // 2):
        inner.delete(layout.log_key(seq))
    before = len(_seqs(inner, layout.LOG_PREFIX))
    trim = Options(rollup_every=8, gc_grace_seconds=0.0)
    client = _open(blob, name, trim)
    try:
        client.maintain()
        assert blob.full_log_lists() == 1  # the one survey of the log
        client.maintain()
        assert blob.full_log_lists() == 1
    finally:
        client.stop()
    assert len(_seqs(inner, layout.LOG_PREFIX)) < before // 4
    blob.reset()
    client = _open(blob, name, trim)  # the survey is recorded: the next writer lists nothing
    try:
        client.maintain()
        _commits(client, 40)
        assert blob.full_log_lists() == 0
        _, r = client.create_or_load("c", key_type=pa.int64(), value_type=pa.int64())
        assert len(r.snapshot(r.upper - 1).to_arrow()) == 140
    finally:
        client.stop()


@pytest.mark.crash
@pytest.mark.parametrize("n", [1, 12])
def test_a_writer_killed_in_a_trim_loses_nothing_and_the_next_trims(
        n: int, tmp_path: Path) -> None:
    location = tmp_path / "loc"
    proc = _spawn(location, "trim.log_deleted", n)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, (
        f"trim.log_deleted:{n} was not reached (exit {proc.returncode}): {err.decode()[-2000:]}")
    acked, tried = _parse(out)
    assert acked
    _check_recovery(location, acked, tried)  # every acknowledged write, nothing else
    blob = FileBlob(str(location))
    with persist.open(location, reentrance_id=RID, options=OPTIONS) as client:
        client.maintain()
        client.maintain()
    rollups = _seqs(blob, layout.ROLLUP_PREFIX)
    assert len(rollups) == 1
    assert all(s > rollups[0] for s in _seqs(blob, layout.LOG_PREFIX))
