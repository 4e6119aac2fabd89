from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from persist import layout
from persist.blob.file import FileBlob
from persist.blob.unreliable import Faults
from persist.errors import ExternalError, IncompatibleFormat, Indeterminate, LockHeld, Timeout
from persist.lock.base import LockRecord, decode_record, encode_record
from persist.lock.file import FileLock
from persist.lock.memory import MemoryLock
from persist.lock.unreliable import UnreliableLock
from tests.lock.conformance import LockConformance, MakeLock
from tests.support.bounded import within
from tests.support.patience import PATIENCE


class TestMemoryLock(LockConformance):
    @pytest.fixture
    def make_lock(self) -> MakeLock:
        name = uuid.uuid4().hex
        return lambda **kw: MemoryLock(name, **kw)


class TestFileLock(LockConformance):
    @pytest.fixture
    def make_lock(self, tmp_path: Path) -> MakeLock:
        def make(**kw: Any) -> FileLock:
            return FileLock(tmp_path, **kw)

        return make


# -- deadlines: no lock loop runs forever ---------------------------------------------------------


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    return within(seconds, fn)


def _lost_writes() -> UnreliableLock:
    """A lock whose every compare-and-set is lost on the way (Indeterminate, nothing stored)."""
    lock = UnreliableLock(MemoryLock(uuid.uuid4().hex), faults={"cas": Faults(lost=1.0)})
    lock.store_timeout = 1.0
    return lock


def test_acquire_against_a_failing_store_ends_in_indeterminate_by_its_deadline() -> None:
    lock = _lost_writes()
    start = time.monotonic()
    err = _within(PATIENCE, lambda: lock.acquire("a", timeout=0.5))
    assert isinstance(err, Indeterminate), err
    assert "kept failing" in str(err)
    assert time.monotonic() - start < 3


def test_force_release_against_a_failing_store_ends_by_its_deadline() -> None:
    lock = _lost_writes()
    inner = lock.inner
    inner.acquire("a")
    err = _within(PATIENCE, lock.force_release)
    assert isinstance(err, Indeterminate), err
    rec = inner.current()
    assert rec is not None
    assert not rec.released


def test_heartbeat_against_a_failing_store_ends_within_a_third_of_the_lease() -> None:
    lock = _lost_writes()
    lease = lock.inner.acquire("a")
    start = time.monotonic()
    err = _within(PATIENCE, lambda: lock.heartbeat(lease))
    assert isinstance(err, ExternalError), err
    assert time.monotonic() - start < lock.lease_seconds / 3 + 2


# -- the file lock's record chain and its migration from a single LOCK file ---------------------


def _legacy_lock(tmp_path: Path, rec: LockRecord) -> None:
    """Writes ``LOCK`` as persists before the record chain did."""
    FileBlob(tmp_path).set(layout.LOCK_KEY, encode_record(rec))


def test_an_older_persists_lock_file_is_honoured_then_retired(tmp_path: Path) -> None:
    held = LockRecord(holder="a", generation=5, lease_ms=30_000, wall_ms=int(time.time() * 1000))
    _legacy_lock(tmp_path, held)
    assert FileLock(tmp_path).current() == held
    with pytest.raises(LockHeld, match="'a'"):
        FileLock(tmp_path).acquire("b")
    lease = FileLock(tmp_path).acquire("a")
    assert lease.generation == 6
    # An older persist reading LOCK now refuses the location instead of locking beside the chain.
    data = FileBlob(tmp_path).get(layout.LOCK_KEY)
    assert data is not None
    with pytest.raises(IncompatibleFormat):
        decode_record(bytes(data))
    assert FileLock(tmp_path).current() == FileLock(tmp_path)._load(time.monotonic() + 1)[1]
    assert FileLock(tmp_path).acquire("a").generation == 7


def test_a_late_link_below_the_head_never_wins(tmp_path: Path) -> None:
    lock = FileLock(tmp_path)
    lease = lock.acquire("a")
    stale = lock.current()
    assert stale is not None
    for _ in range(4):  # versions 2..5; versions 1..3 are reaped
        lock.heartbeat(lease)
    head = lock.current()
    assert not os.path.exists(os.path.join(tmp_path, layout.lock_chain_key(2)))

    class Paused(FileLock):
        """Read version 1 before the heartbeats, resumed after: it links version 2 again."""

        def _load(self, deadline: float) -> tuple[int, LockRecord | None]:
            return 1, stale

    taker = LockRecord(holder="b", generation=2, lease_ms=30_000, wall_ms=0)
    assert not Paused(tmp_path)._cas(stale, taker)
    assert FileLock(tmp_path).current() == head


def test_a_stuck_legacy_mutex_ends_in_timeout_not_a_hang(tmp_path: Path) -> None:
    os.makedirs(tmp_path, exist_ok=True)
    fd = os.open(tmp_path / layout.LOCK_MUTEX_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # an older persist stopped inside its critical section
        lock = FileLock(tmp_path, store_timeout=0.5)
        err = _within(PATIENCE, lambda: lock.acquire("a"))
        assert isinstance(err, Timeout), err
    finally:
        os.close(fd)
    assert FileLock(tmp_path).acquire("a").generation == 1
