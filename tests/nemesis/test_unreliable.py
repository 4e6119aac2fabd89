"""The fault-injecting wrappers: transparent at zero rates (the shared conformance suites), and
doing exactly what they promise when faults are on."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from persist.blob.memory import MemoryBlob
from persist.blob.unreliable import Faults, UnreliableBlob, outage_of
from persist.errors import Determinate, Fenced, Indeterminate, InvalidUsage
from persist.lock.memory import MemoryLock
from persist.lock.unreliable import UnreliableLock
from tests.blob.conformance import BlobConformance
from tests.lock.conformance import LockConformance, MakeLock


class TestUnreliableBlob(BlobConformance):
    @pytest.fixture
    def blob(self) -> UnreliableBlob:
        return UnreliableBlob(MemoryBlob(f"unreliable-{uuid.uuid4().hex}"), seed=1)


class TestUnreliableLock(LockConformance):
    @pytest.fixture
    def make_lock(self) -> MakeLock:
        name = uuid.uuid4().hex

        def make(**kw: Any) -> UnreliableLock:
            return UnreliableLock(MemoryLock(name, **kw), seed=3)

        return make


def _fresh() -> tuple[MemoryBlob, UnreliableBlob]:
    inner = MemoryBlob()
    return inner, UnreliableBlob(inner, seed=7)


def test_determinate_failure_does_no_work() -> None:
    inner, blob = _fresh()
    blob.set_faults(Faults(fail=1.0))
    for op in (lambda: blob.set("k", b"v"), lambda: blob.set_if_absent("k", b"v"),
               lambda: blob.get("k"), lambda: blob.list_keys("")):
        with pytest.raises(Determinate, match="injected failure"):
            op()
    assert inner.list_keys("") == []
    inner.set("k", b"v")
    with pytest.raises(Determinate):
        blob.delete("k")
    assert inner.get("k") == b"v"
    assert blob.injected["set.fail"] == 1
    assert blob.injected["delete.fail"] == 1


def test_indeterminate_does_the_work_then_raises() -> None:
    inner, blob = _fresh()
    blob.set_faults({"set": Faults(indeterminate=1.0), "set_if_absent": Faults(indeterminate=1.0),
                     "delete": Faults(indeterminate=1.0), "get": Faults(indeterminate=1.0)})
    with pytest.raises(Indeterminate):
        blob.set("a", b"1")
    assert inner.get("a") == b"1"
    with pytest.raises(Indeterminate):
        blob.set_if_absent("b", b"2")
    assert inner.get("b") == b"2"
    with pytest.raises(Indeterminate):
        blob.delete("a")
    assert inner.get("a") is None
    # Reads have no effect, so they are never reported indeterminate.
    assert blob.get("b") == b"2"
    # A lost request: ambiguous to the caller, but nothing happened.
    blob.set_faults(Faults(lost=1.0))
    with pytest.raises(Indeterminate, match="lost"):
        blob.set("c", b"3")
    assert inner.get("c") is None


def test_outage_and_recovery() -> None:
    inner, blob = _fresh()
    blob.set("k", b"v")
    with blob.outage():
        with pytest.raises(Determinate, match="outage"):
            blob.get("k")
        with pytest.raises(Determinate, match="outage"):
            blob.set("k2", b"v")
    assert blob.get("k") == b"v"
    blob.outage()
    assert blob.plan.in_outage
    blob.recover()
    assert blob.get("k") == b"v"
    other = UnreliableBlob(inner, seed=1)
    with outage_of(blob, other), pytest.raises(Determinate):
        other.list_keys("")
    assert other.list_keys("") == ["k"]


def test_same_seed_same_faults() -> None:
    def run(seed: int) -> list[str]:
        blob = UnreliableBlob(MemoryBlob(), seed=seed,
                              faults=Faults(fail=0.3, indeterminate=0.2))
        out = []
        for i in range(200):
            try:
                blob.set(f"k{i}", b"v")
                out.append("ok")
            except Determinate:
                out.append("det")
            except Indeterminate:
                out.append("ind")
        return out

    assert run(11) == run(11)
    assert run(11) != run(12)
    outcomes = run(11)
    assert {"ok", "det", "ind"} <= set(outcomes)


def test_latency_is_injected() -> None:
    blob = UnreliableBlob(MemoryBlob(), seed=0, faults=Faults(delay=1.0, max_delay=0.001))
    blob.set("k", b"v")
    assert blob.injected["set.delay"] == 1


def test_bad_rates_are_refused() -> None:
    with pytest.raises(InvalidUsage):
        Faults(fail=1.5)
    with pytest.raises(InvalidUsage):
        Faults(fail=0.6, indeterminate=0.6)
    with pytest.raises(InvalidUsage, match="unknown operations"):
        UnreliableBlob(MemoryBlob(), faults={"put": Faults()})


def test_lock_cas_indeterminate_that_landed_keeps_the_lease() -> None:
    """An ambiguous heartbeat whose write landed is resolved by a read: the hold continues."""
    name = uuid.uuid4().hex
    lock = UnreliableLock(MemoryLock(name), seed=5)
    lease = lock.acquire("a")
    lock.set_faults({"cas": Faults(indeterminate=1.0)})
    lock.heartbeat(lease)  # raises nothing: the read finds our own record
    assert lock.injected["cas.indeterminate"] == 1
    rec = MemoryLock(name).current()
    assert rec is not None
    assert rec.beat == 1


def test_lock_faults_and_outage() -> None:
    name = uuid.uuid4().hex
    lock = UnreliableLock(MemoryLock(name), seed=5, faults={"cas": Faults(fail=1.0)})
    with pytest.raises(Determinate):
        lock.acquire("a")
    assert MemoryLock(name).current() is None
    lock.set_faults(Faults())
    lease = lock.acquire("a")
    with lock.outage(), pytest.raises(Determinate):
        lock.heartbeat(lease)
    lock.heartbeat(lease)
    MemoryLock(name).acquire("a")  # a takeover under the same id
    with pytest.raises(Fenced):
        lock.heartbeat(lease)


def test_acquire_whose_ambiguous_write_landed_holds_the_lock() -> None:
    """Found by fault injection: an acquire whose compare-and-set landed but reported
    Indeterminate used to raise, leaving a lease nobody heartbeats that blocks every other
    writer until it lapses. Like ``heartbeat``, it now resolves the ambiguity by reading."""
    name = uuid.uuid4().hex
    lock = UnreliableLock(MemoryLock(name, lease_seconds=30), seed=5,
                          faults={"cas": Faults(indeterminate=1.0)})
    lease = lock.acquire("anon-1")
    rec = MemoryLock(name).current()
    assert rec is not None
    assert (rec.holder, rec.generation) == (lease.holder, lease.generation)


def test_ambiguous_acquires_always_end_in_a_consistent_hold() -> None:
    """Half the ambiguous writes landed, half were lost: every acquire still ends holding
    exactly the lease the store records."""
    name = uuid.uuid4().hex
    lock = UnreliableLock(MemoryLock(name, lease_seconds=30), seed=5,
                          faults={"cas": Faults(indeterminate=0.4, lost=0.4)})
    for _ in range(30):
        lease = lock.acquire("svc")
        rec = MemoryLock(name).current()
        assert rec is not None
        assert (rec.holder, rec.generation) == ("svc", lease.generation)
    assert lock.injected["cas.indeterminate"] > 0
    assert lock.injected["cas.lost"] > 0


def test_release_whose_ambiguous_write_landed_is_released() -> None:
    name = uuid.uuid4().hex
    lock = UnreliableLock(MemoryLock(name, lease_seconds=30), seed=5)
    lease = lock.acquire("a")
    lock.set_faults({"cas": Faults(indeterminate=1.0)})
    lock.release(lease)  # must not raise: the read shows it released
    rec = MemoryLock(name).current()
    assert rec is not None
    assert rec.released
    MemoryLock(name).acquire("b")  # free at once, no lapse to wait for
