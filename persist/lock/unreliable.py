"""Fault injection for writer locks: a seeded wrapper over any lock's compare-and-set primitive.

``UnreliableLock(inner, seed=...)`` is a :class:`~persist.lock.base.WriterLock` whose
primitive operations ``_read`` and ``_cas`` forward to ``inner``'s, under the same seeded dice
as :class:`persist.blob.unreliable.UnreliableBlob`: latency, Determinate failures before the
call, and (for ``cas`` only) Indeterminate after the call did its work. All protocol logic
(reentrance, leases, heartbeats, resolving an ambiguous heartbeat with a consistent read) is the
base class's, so the wrapper tests exactly the code production runs.

Operation names for per-operation faults: ``read`` and ``cas``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping

from typing_extensions import override

from persist.blob.unreliable import NO_FAULTS, FaultPlan, Faults, Recover
from persist.lock.base import LockRecord, WriterLock

LOCK_OPS: tuple[str, ...] = ("read", "cas")


class UnreliableLock(WriterLock):
    """Wraps ``inner`` (a handle on some lock) and injects seeded faults into its primitive.

    The lease and skew settings are ``inner``'s, so the wrapper behaves as that lock would.
    ``plan`` shares the dice and outage switch of another wrapper (see ``UnreliableBlob``).
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
        super().__init__(lease_seconds=inner.lease_seconds, max_skew_rate=inner.max_skew_rate)
        self.inner = inner
        self.same_clock = inner.same_clock
        self.plan = plan if plan is not None else FaultPlan(seed, faults, ops=LOCK_OPS, name=name)

    def set_faults(self, faults: Faults | Mapping[str, Faults]) -> None:
        """Replaces the fault rates (one for both ops, or ``{"read": ..., "cas": ...}``)."""
        self.plan.set_faults(faults)

    def outage(self) -> contextlib.AbstractContextManager[None]:
        """Every lock operation fails with Determinate until :meth:`recover` (or ``with`` exit)."""
        self.plan.start_outage()
        return Recover(self.plan)

    def recover(self) -> None:
        self.plan.end_outage()

    @property
    def injected(self) -> Counter[str]:
        return self.plan.injected

    @override
    def _read(self) -> LockRecord | None:
        return self.plan.run("read", self.inner._read, mutates=False)

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord) -> bool:
        return self.plan.run("cas", lambda: self.inner._cas(expected, new), mutates=True)

    @override
    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<UnreliableLock {self.plan.name} over {self.inner!r}>"


__all__ = ["LOCK_OPS", "UnreliableLock"]
