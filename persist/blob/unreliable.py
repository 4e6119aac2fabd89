"""Fault injection for blob stores: a seeded wrapper that makes any Blob misbehave on purpose.

``UnreliableBlob(inner, seed=...)`` forwards every raw operation to ``inner`` but, decided by
its own ``random.Random(seed)``, may first

* sleep (latency),
* fail with :class:`~persist.errors.Determinate` *without* doing the work, or
* (writes only) *do the work and still* raise :class:`~persist.errors.Indeterminate`, the case
  a client sees when a request reached the store but its answer was lost (a timeout), or
* (writes only) raise Indeterminate *without* doing the work (the request itself was lost):
  a caller resolving an ambiguous outcome must handle both.

Each operation (``get``, ``list``, ``set``, ``set_if_absent``, ``delete``) has its own
:class:`Faults`; :meth:`UnreliableBlob.outage` makes every operation fail until
:meth:`UnreliableBlob.recover` (or the end of a ``with`` block). With all rates at zero the
wrapper is transparent: it passes the shared Blob conformance suite.

The wrapper sits below the envelope (it wraps the raw ``_`` methods), so framing and checksums
are exercised exactly as in production. Reads never raise Indeterminate: a read has no effect,
so "it may have happened" carries no information beyond Determinate.

NB: one RNG serves every thread, behind a lock. A seed therefore replays the sequence of dice
but not, with several threads, which operation gets which die; runs are reproducible in
distribution and, single-threaded, exactly.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from typing_extensions import override

from persist.blob.base import Blob, Wrapping
from persist.blob.envelope import Framed
from persist.errors import Determinate, Indeterminate, InvalidUsage

log = logging.getLogger("persist.unreliable")

BlobOp = Literal["get", "list", "set", "set_if_absent", "delete"]
BLOB_OPS: tuple[BlobOp, ...] = ("get", "list", "set", "set_if_absent", "delete")
_WRITES = frozenset({"set", "set_if_absent", "delete"})

T = TypeVar("T")


@dataclass(frozen=True)
class Faults:
    """How one kind of operation misbehaves. Probabilities are per call, in ``[0, 1]``.

    Invariant: ``fail + indeterminate + lost <= 1`` (a call suffers at most one of them).
    """

    #: Fail with Determinate before touching the store.
    fail: float = 0.0
    #: Do the work, then raise Indeterminate (ignored for reads).
    indeterminate: float = 0.0
    #: Raise Indeterminate without doing the work (ignored for reads).
    lost: float = 0.0
    #: Probability of sleeping before the call...
    delay: float = 0.0
    #: ...for a uniformly random time up to this many seconds.
    max_delay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fail", "indeterminate", "lost", "delay"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise InvalidUsage(f"fault probability {name}={p} is not in [0, 1]")
        if self.fail + self.indeterminate + self.lost > 1.0:
            raise InvalidUsage("fail + indeterminate + lost must not exceed 1")
        if self.max_delay < 0:
            raise InvalidUsage("max_delay must be >= 0")


NO_FAULTS = Faults()


class FaultPlan:
    """The seeded dice shared by the unreliable blob and lock wrappers.

    Thread-safe. Counts what it injected in ``injected`` (``"<op>.<kind>"`` -> count) so a test
    can report (and assert) that faults really happened.
    """

    def __init__(
        self,
        seed: int,
        faults: Faults | Mapping[str, Faults] = NO_FAULTS,
        *,
        ops: tuple[str, ...],
        name: str,
    ) -> None:
        self.name = name
        self._ops = ops
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._faults: dict[str, Faults] = {}
        self._outage = 0
        self.injected: Counter[str] = Counter()
        self.set_faults(faults)

    def set_faults(self, faults: Faults | Mapping[str, Faults]) -> None:
        """Replaces the fault rates: one :class:`Faults` for every op, or a mapping per op
        (ops not named keep no faults)."""
        if isinstance(faults, Faults):
            table = dict.fromkeys(self._ops, faults)
        else:
            unknown = set(faults) - set(self._ops)
            if unknown:
                raise InvalidUsage(f"unknown operations {sorted(unknown)}; known: {self._ops}")
            table = {op: faults.get(op, NO_FAULTS) for op in self._ops}
        with self._lock:
            self._faults = table

    def faults(self, op: str) -> Faults:
        """The fault rates in force for operation ``op``."""
        return self._faults[op]

    # -- outages ----------------------------------------------------------------------------

    def start_outage(self) -> None:
        """Every operation fails (Determinate) until :meth:`end_outage`. Nests."""
        with self._lock:
            self._outage += 1
        log.info("%s: storage outage begins", self.name)

    def end_outage(self) -> None:
        """Ends one :meth:`start_outage` (outages nest; the last end restores service)."""
        with self._lock:
            self._outage = max(0, self._outage - 1)
        log.info("%s: storage outage ends", self.name)

    @property
    def in_outage(self) -> bool:
        """True while at least one outage is in force."""
        return self._outage > 0

    # -- the dice ---------------------------------------------------------------------------

    def run(self, op: str, work: Callable[[], T], *, mutates: bool) -> T:
        """Runs ``work`` (the real operation) under the faults configured for ``op``."""
        f = self._faults[op]
        with self._lock:
            if self._outage:
                self.injected[f"{op}.outage"] += 1
                kind: str | None = "outage"
                delay = 0.0
            else:
                delay = (self._rng.uniform(0.0, f.max_delay)
                         if f.delay and self._rng.random() < f.delay else 0.0)
                die = self._rng.random()
                kind = ("fail" if die < f.fail
                        else "indeterminate" if mutates and die < f.fail + f.indeterminate
                        else "lost" if mutates and die < f.fail + f.indeterminate + f.lost
                        else None)
                if delay:
                    self.injected[f"{op}.delay"] += 1
                if kind is not None:
                    self.injected[f"{op}.{kind}"] += 1
        if kind == "outage":
            raise Determinate(f"injected outage: {self.name} {op} unavailable")
        if delay:
            time.sleep(delay)
        if kind == "fail":
            log.debug("%s: injecting Determinate into %s", self.name, op)
            raise Determinate(f"injected failure: {self.name} {op} failed before running")
        if kind == "lost":
            log.debug("%s: injecting Indeterminate into %s (it did not run)", self.name, op)
            raise Indeterminate(f"injected timeout: {self.name} {op} request was lost")
        result = work()
        if kind == "indeterminate":
            log.debug("%s: injecting Indeterminate into %s (after it ran)", self.name, op)
            raise Indeterminate(f"injected timeout: {self.name} {op} ran but its reply was lost")
        return result


class FaultInjecting:
    """The fault-dice surface of a wrapper whose operations run through ``self.plan``.

    Shared by :class:`UnreliableBlob` and :class:`persist.lock.unreliable.UnreliableLock`; the
    wrapper sets ``plan`` in its constructor and routes each operation through ``plan.run``.
    """

    plan: FaultPlan

    def set_faults(self, faults: Faults | Mapping[str, Faults]) -> None:
        """Replaces the fault rates (see :meth:`FaultPlan.set_faults`)."""
        self.plan.set_faults(faults)

    def outage(self) -> contextlib.AbstractContextManager[None]:
        """Starts a full outage: every operation fails with Determinate until :meth:`recover`.

        Also usable as ``with wrapper.outage(): ...``, which recovers on exit.
        """
        self.plan.start_outage()
        return Recover(self.plan)

    def recover(self) -> None:
        """Ends an outage started by :meth:`outage`."""
        self.plan.end_outage()

    @property
    def injected(self) -> Counter[str]:
        """How many faults of each ``"<op>.<kind>"`` were injected so far."""
        return self.plan.injected


class UnreliableBlob(FaultInjecting, Wrapping):
    """Wraps ``inner`` and injects seeded faults into its raw operations.

    Args:
        inner: the store that does the real work (memory, file, S3, ...).
        seed: seeds the dice; the same seed gives the same sequence of faults.
        faults: one :class:`Faults` for every operation, or a mapping ``op -> Faults`` over
            ``get``, ``list``, ``set``, ``set_if_absent``, ``delete``.
        plan: share the dice, rates and outage switch of another wrapper (``seed`` and
            ``faults`` are then ignored): several handles on one store fail together, as
            clients of one real service do.
    """

    def __init__(
        self,
        inner: Blob,
        *,
        seed: int = 0,
        faults: Faults | Mapping[str, Faults] = NO_FAULTS,
        name: str = "unreliable-blob",
        plan: FaultPlan | None = None,
    ) -> None:
        self.inner = inner
        self.plan = plan if plan is not None else FaultPlan(seed, faults, ops=BLOB_OPS, name=name)
        # NB: capabilities are the inner store's: faults change when things work, not what
        # the store can do.
        self.supports_conditional_create = inner.supports_conditional_create
        self.is_local = inner.is_local

    @override
    def _get(self, key: str) -> bytes | memoryview | None:
        return self.plan.run("get", lambda: self.inner._get(key), mutates=False)

    @override
    def _get_range(self, key: str, start: int, end: int | None) -> bytes | memoryview | None:
        return self.plan.run("get", lambda: self.inner._get_range(key, start, end),
                             mutates=False)

    @override
    def _list(self, prefix: str) -> list[str]:
        return self.plan.run("list", lambda: self.inner._list(prefix), mutates=False)

    @override
    def _list_after(self, prefix: str, start_after: str) -> list[str]:
        return self.plan.run("list", lambda: self.inner._list_after(prefix, start_after),
                             mutates=False)

    @override
    def _external_url(self, key: str) -> str | None:
        # NB: no dice: naming a key's URL asks the store nothing (no request to fail).
        return self.inner._external_url(key)

    @override
    def _set(self, key: str, data: bytes | Framed) -> None:
        self.plan.run("set", lambda: self.inner._set(key, data), mutates=True)

    @override
    def _set_if_absent(self, key: str, data: bytes | Framed) -> bool:
        return self.plan.run("set_if_absent", lambda: self.inner._set_if_absent(key, data),
                             mutates=True)

    @override
    def _delete(self, key: str) -> None:
        self.plan.run("delete", lambda: self.inner._delete(key), mutates=True)

    @override
    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<UnreliableBlob {self.plan.name} over {self.inner!r}>"


class Recover(contextlib.AbstractContextManager[None]):
    """Returned by ``outage()``: ends the outage when used as a context manager (nothing
    happens if it is not used as one)."""

    def __init__(self, plan: FaultPlan) -> None:
        self._plan = plan

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        self._plan.end_outage()


@contextlib.contextmanager
def outage_of(*blobs: UnreliableBlob) -> Iterator[None]:
    """``with outage_of(a, b): ...``: several stores down at once."""
    for b in blobs:
        b.plan.start_outage()
    try:
        yield
    finally:
        for b in blobs:
            b.plan.end_outage()


__all__ = [
    "BLOB_OPS",
    "NO_FAULTS",
    "FaultInjecting",
    "FaultPlan",
    "Faults",
    "Recover",
    "UnreliableBlob",
    "outage_of",
]
