"""A writer lock over a store with conditional writes, resolving ambiguous writes by read-back.

:class:`ConditionalStoreLock` is the compare-and-set that :class:`~persist.lock.s3.S3Lock`
(a conditional ``PutObject``) and :class:`~persist.lock.dynamodb.DynamoLock` (a conditional
``PutItem``) share. A subclass sends one conditional write (:meth:`_put_if`); this class retries
it when its outcome is ambiguous (a timeout after sending, a 5xx):

* a consistent read shows ``new`` stored: the write landed;
* it shows something other than ``expected``: another party moved first (False);
* it still shows ``expected``: the write has not landed (yet), and the same conditional write is
  sent again after a backoff. A late landing of the first makes the second fail its condition,
  and the next read finds ``new``.

Retries end after ``retry.max_attempts`` or at the caller's deadline, whichever comes first,
with :class:`~persist.errors.Indeterminate`. Each retry is logged.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod

from typing_extensions import override

from persist.blob import aws
from persist.errors import Determinate, Indeterminate
from persist.lock.base import STORE_TIMEOUT, LockRecord, WriterLock

log = logging.getLogger("persist.lock")


class ConditionalStoreLock(WriterLock):
    """A writer lock kept in a remote store with a conditional write (see the module docstring).

    Subclasses provide ``_read`` (a consistent read) and :meth:`_put_if` (one conditional write).
    """

    #: Holders run on other machines: liveness only by observing the record unchanged.
    same_clock = False

    def __init__(self, *, lease_seconds: float, max_skew_rate: float,
                 retry: aws.RetryPolicy | None, store_timeout: float = STORE_TIMEOUT) -> None:
        """Args:
            lease_seconds: the lease a holder claims.
            max_skew_rate: tolerated clock rate difference (see ``persist.lock.base``).
            retry: backoff for transient store failures (default :class:`aws.RetryPolicy`).
            store_timeout: seconds an operation retries a failing store (at least).

        Raises:
            InvalidUsage: a parameter is out of range.
        """
        super().__init__(lease_seconds=lease_seconds, max_skew_rate=max_skew_rate,
                         store_timeout=store_timeout)
        self.retry = retry or aws.RetryPolicy()

    @property
    @abstractmethod
    def where(self) -> str:
        """Names the record in messages (``s3://bucket/key``, ``<lock id> in table <t>``)."""

    @abstractmethod
    def _put_if(self, expected: LockRecord | None, new: LockRecord, *,
                deadline: float | None) -> bool:
        """Sends one conditional write of ``new``, through :func:`aws.call` with ``deadline``.

        Returns:
            True if ``new`` was stored; False if the condition failed (the stored record is not
            ``expected``).

        Raises:
            Indeterminate: the write may or may not have landed.
            Determinate: the write definitely failed.
        """

    @override
    def _cas(self, expected: LockRecord | None, new: LockRecord, *,
             deadline: float | None = None) -> bool:
        last: Indeterminate | None = None
        for attempt in range(self.retry.max_attempts):
            try:
                return self._put_if(expected, new, deadline=deadline)
            except Indeterminate as e:
                last = e
            log.warning("lock write of %s (generation %d) ambiguous, reading it back: %s",
                        self.where, new.generation, last)
            try:
                stored = self._read(deadline=deadline)
            except Determinate as e:
                raise Indeterminate(f"lock write of {self.where} unresolved: {e}") from e
            if stored == new:
                return True
            if stored != expected:
                return False
            pause = self.retry.delay(attempt)
            if deadline is not None and time.monotonic() + pause >= deadline:
                break
            log.warning("lock write of %s did not land; sending it again in %.2fs (attempt "
                        "%d of %d)", self.where, pause, attempt + 2, self.retry.max_attempts)
            time.sleep(pause)
        raise Indeterminate(f"lock write of {self.where} failed ambiguously: {last}") from last


__all__ = ["ConditionalStoreLock"]
