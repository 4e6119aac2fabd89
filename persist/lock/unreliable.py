"""Fault injection for writer locks: a seeded wrapper over any lock's compare-and-set primitive.

``UnreliableLock(inner, seed=...)`` is a :class:`~persist.lock.base.WriterLock` whose
primitive operations ``_read`` and ``_cas`` forward to ``inner``'s, under the same seeded dice
as :class:`persist.blob.unreliable.UnreliableBlob` (the shared
:class:`~persist.blob.unreliable.FaultInjecting` surface): latency, Determinate failures before
the call, and (for ``cas`` only) Indeterminate after the call did its work. All protocol logic
(reentrance, leases, heartbeats, resolving an ambiguous heartbeat with a consistent read) is the
base class's, so the wrapper tests exactly the code production runs.

Operation names for per-operation faults: ``read`` and ``cas``.
"""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import override

from persist.blob.unreliable import NO_FAULTS, FaultInjecting, FaultPlan, Faults
from persist.lock.base import LockRecord, WriterLock

LOCK_OPS: tuple[str, ...] = ("read", "cas")


class UnreliableLock(FaultInjecting, WriterLock):
    """Wraps ``inner`` (a handle on some lock) and injects seeded faults into its primitive.

    The lease, skew and store-timeout settings are ``inner``'s, so the wrapper behaves as that
    lock would. ``plan`` shares the dice and outage switch of another wrapper (see
    ``UnreliableBlob``); ``set_faults``, ``outage``, ``recover`` and ``injected`` are
    :class:`~persist.blob.unreliable.FaultInjecting`'s, over ops ``read`` and ``cas``.
    """

    def __init__(
        self,
        inner: WriterLock,
        *,
        seed: int = 0,
        faults: Faults | Mapping[str, Faults] = NO_FAULTS,
        name: str = "unreliable-lock",
        plan: FaultPlan | None = None,
    ) -> None:
        """Args:
            inner: the lock that does the real work.
            seed: seeds the dice; the same seed gives the same sequence of faults.
            faults: one :class:`Faults` for both ops, or ``{"read": ..., "cas": ...}``.
            name: names the wrapper in logs and injected errors.
            plan: share the dice, rates and outage switch of another wrapper (``seed`` and
                ``faults`` are then ignored).
        """
        super().__init__(lease_seconds=inner.lease_seconds, max_skew_rate=inner.max_skew_rate,
                         store_timeout=inner.store_timeout)
        self.inner = inner
        self.same_clock = inner.same_clock
        self.plan = plan if plan is not None else FaultPlan(seed, faults, ops=LOCK_OPS, name=name)

    @override
    def _read(self, *, deadline: float | None = None) -> LockRecord | None:
        return self.plan.run("read", lambda: self.inner._read(deadline=deadline), mutates=False)

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord, *,
             deadline: float | None = None) -> bool:
        return self.plan.run("cas", lambda: self.inner._cas(expected, new, deadline=deadline),
                             mutates=True)

    @override
    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<UnreliableLock {self.plan.name} over {self.inner!r}>"


__all__ = ["LOCK_OPS", "UnreliableLock"]
