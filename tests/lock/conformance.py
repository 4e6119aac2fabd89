"""The writer-lock contract as tests: every implementation subclasses ``LockConformance`` and
provides ``make_lock`` (a factory of handles on one fresh lock, with the given lease)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import msgspec
import pytest

from persist.errors import Fenced, LockHeld
from persist.lock.base import WriterLock, this_process
from tests.support.patience import PATIENCE

MakeLock = Callable[..., WriterLock]


class LockConformance:
    @pytest.fixture
    def make_lock(self) -> MakeLock:
        raise NotImplementedError("subclasses return a factory: make_lock(lease_seconds=...)")

    def test_first_acquire_gets_generation_one(self, make_lock: MakeLock) -> None:
        lease = make_lock().acquire("a")
        assert lease.generation == 1
        assert make_lock().current() is not None

    def test_other_id_is_refused_while_held(self, make_lock: MakeLock) -> None:
        make_lock().acquire("a")
        with pytest.raises(LockHeld, match="'a'"):
            make_lock().acquire("b")

    def test_other_id_waits_then_gives_up(self, make_lock: MakeLock) -> None:
        lock = make_lock(lease_seconds=30)
        lease = lock.acquire("a")
        start = time.monotonic()
        with pytest.raises(LockHeld):
            make_lock(lease_seconds=30).acquire("b", timeout=0.3)
        assert time.monotonic() - start >= 0.3
        lock.heartbeat(lease)  # still ours

    def test_same_id_takes_over_and_fences(self, make_lock: MakeLock) -> None:
        old = make_lock()
        lease1 = old.acquire("svc")
        lease2 = make_lock().acquire("svc")
        assert lease2.generation > lease1.generation
        with pytest.raises(Fenced):
            old.heartbeat(lease1)

    def test_release_lets_others_in(self, make_lock: MakeLock) -> None:
        lock = make_lock()
        lease = lock.acquire("a")
        lock.release(lease)
        lease_b = make_lock().acquire("b")
        assert lease_b.generation == lease.generation + 1
        lock.release(lease)  # stale release is a no-op
        make_lock().heartbeat(lease_b)

    def test_lapsed_lease_is_taken_over(self, make_lock: MakeLock) -> None:
        lease = make_lock(lease_seconds=0.2).acquire("a")
        taker = make_lock(lease_seconds=0.2)
        got = taker.acquire("b", timeout=PATIENCE)
        assert got.generation == lease.generation + 1
        with pytest.raises(Fenced):
            make_lock(lease_seconds=0.2).heartbeat(lease)

    def test_heartbeat_keeps_the_lease(self, make_lock: MakeLock) -> None:
        # NB: heartbeats every 0.05 s keep a 1 s lease: a thread starved for 20 beats on a
        # loaded machine would let it lapse (it did with a 0.3 s lease), so the margin is wide
        holder = make_lock(lease_seconds=1.0)
        lease = holder.acquire("a")
        stop = threading.Event()

        def beat() -> None:
            while not stop.is_set():
                holder.heartbeat(lease)
                time.sleep(0.05)

        t = threading.Thread(target=beat)
        t.start()
        try:
            with pytest.raises(LockHeld):
                make_lock(lease_seconds=1.0).acquire("b", timeout=2.5)
        finally:
            stop.set()
            t.join()

    def test_racing_acquirers_one_winner_per_generation(self, make_lock: MakeLock) -> None:
        wins: list[tuple[str, int]] = []
        barrier = threading.Barrier(6)

        def go(i: int) -> None:
            barrier.wait()
            try:
                lease = make_lock().acquire(f"w{i}")
                wins.append((lease.holder, lease.generation))
            except LockHeld:
                pass

        threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1

    def test_force_release(self, make_lock: MakeLock) -> None:
        make_lock().acquire("a")
        old = make_lock().force_release()
        assert old is not None
        assert old.holder == "a"
        assert make_lock().acquire("b").generation == 2

    def test_record_names_the_holder_process(self, make_lock: MakeLock) -> None:
        make_lock().acquire("a")
        rec = make_lock().current()
        assert rec is not None
        me = this_process()
        assert (rec.host, rec.host_id, rec.pid, rec.pid_start) == (
            me.host, me.host_id, me.pid, me.pid_start)

    @pytest.mark.parametrize("how", ["exited", "pid reused"])
    def test_gone_holder_on_this_machine_is_taken_over_at_once(
        self, make_lock: MakeLock, how: str
    ) -> None:
        if not this_process().host_id:
            pytest.skip("no /proc: the holder's process cannot be checked here")
        lock = make_lock(lease_seconds=30)
        lease = lock.acquire("a")
        rec = lock.current()
        assert rec is not None
        if how == "exited":
            gone = subprocess.Popen([sys.executable, "-c", "pass"])
            gone.wait()
            forged = msgspec.structs.replace(rec, pid=gone.pid)
        else:  # a live process under the holder's pid, started at another time
            forged = msgspec.structs.replace(rec, pid_start=rec.pid_start + 1)
        # NB: forged through the primitive: the record as the crashed holder left it.
        assert lock._cas(rec, forged)
        got = make_lock(lease_seconds=30).acquire("b")
        assert got.generation == lease.generation + 1
