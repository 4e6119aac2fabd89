"""Named holds from processes that are not the location's writer: a streaming query's driver,
a batch export job, an operator's command.

Only the writer commits to the metadata log. :func:`request` therefore takes one of two paths:

* *no writer runs* (the lock is free): it takes the writer lock briefly (acquire, fence,
  commit, release) and commits the change itself, serving every other pending request and due
  lapse on the way, as the writer would;
* *a writer runs* (the lock is held): it writes a request record without the lock
  (:mod:`persist.indexed.state.requests`), which the writer's maintenance thread commits and
  answers in place within about a second; the caller waits for the answer (or, with
  ``wait=False``, collects it later).

Either way the hold counts only once its commit is in the log (see the requests module for why
``since`` cannot race past it). :class:`ConsumerHold` wraps this for one consumer's hold.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from persist import errors
from persist.blob.base import Blob
from persist.errors import HoldLapsed, LockHeld, PersistError, Timeout
from persist.indexed.engine import Indexed, Txn
from persist.indexed.state import holds, requests
from persist.location import open_writer, resolve
from persist.runtime import commands as cmd
from persist.runtime.branches import HoldDesk, hold_plan

log = logging.getLogger("persist.distributed")

#: The first wait between polls for an answer, and the longest.
_POLL = (0.01, 0.1)


def request(url: str, collection: str, hold: str, action: str, frontier: int | None = None,
            *, lease_ms: int = 0, storage_options: Mapping[str, Any] | None = None,
            wait: bool = True, timeout: float = 30.0) -> int | str:
    """Carries out ``action`` on named hold ``hold`` of ``collection`` at ``url`` (see
    :func:`persist.indexed.state.holds.plan` for the actions: take, advance, renew, release,
    tag, untag) from any process.

    Returns:
        The seq of the commit that carried it out (or of a state that already had it); with
        ``wait=False`` while a writer runs, the id of the request instead (collect its answer
        with :func:`answer`).

    Raises:
        HoldLapsed, UnknownHold, UnknownCollection, InvalidUsage: refused (see ``plan``);
            nothing changed.
        Timeout: a writer holds the lock and did not answer within ``timeout`` seconds (the
            request stays and may still be applied; asking again is safe).
        ExternalError: storage failed.
    """
    loc = resolve(url, storage_options=dict(storage_options or {}))
    plan = hold_plan(collection, action, hold, frontier, lease_ms=lease_ms,
                     missing_ok=action == "release")
    try:
        w = open_writer(loc, f"persist-hold:{hold}", lock_timeout=0.0)
    except LockHeld:
        pass  # a writer runs: it serves a request
    else:
        try:
            ix = w.engine
            submit = _direct(ix)
            HoldDesk(0.0).round(loc.blob, lambda: ix.state, submit)
            seq: int = submit(cmd.Plan(plan)).result()
            return seq
        finally:
            w.close()
    req = requests.new(collection, hold, action, frontier, lease_ms=lease_ms,
                       timeout=max(timeout, 60.0))
    requests.submit(loc.blob, req)
    if not wait:
        return req.id
    deadline = time.monotonic() + timeout
    pause = _POLL[0]
    while True:
        got = answer(loc.blob, req.id)
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise Timeout(f"no writer answered the {action} of hold {hold!r} on {collection!r} "
                          f"within {timeout:g}s (a writer holds the lock but serves no "
                          f"requests: a persist older than named holds?); the request stays "
                          f"and may still be applied")
        time.sleep(pause)
        pause = min(pause * 2, _POLL[1])


def answer(blob: Blob, request_id: str) -> int | None:
    """The seq that carried out request ``request_id``, once the writer answered it (the
    answer is then deleted); None while it waits.

    Raises:
        PersistError: the error that refused it (its class, from :mod:`persist.errors`).
        ExternalError: storage failed.
    """
    got = requests.poll(blob, request_id)
    if got is None:
        return None
    requests.discard(blob, request_id)
    if got.error is None:
        assert got.seq is not None
        return got.seq
    cls = getattr(errors, got.error, None)
    if not (isinstance(cls, type) and issubclass(cls, PersistError)):
        cls = PersistError
    try:
        err = cls(got.message)
    except TypeError:  # a class with another constructor (none that plan raises)
        err = PersistError(f"{got.error}: {got.message}")
    raise err


def _direct(ix: Indexed) -> Any:
    """A ``submit`` that stages and commits each plan at once on ``ix`` (this process holds
    the lock: there is no runtime queue)."""

    def submit(c: cmd.Command) -> Future[Any]:
        done: Future[Any] = Future()
        assert isinstance(c, cmd.Plan)
        try:
            txn = Txn(ix.state)
            with txn.atomically():
                for op in c.plan(txn):
                    txn.stage(op)
            done.set_result(ix.commit(txn).seq)
        except PersistError as e:
            done.set_exception(e)
        return done

    return submit


class ConsumerHold:
    """One consumer's named hold, from a process that is not the writer (picklable: it is
    its location, collection, name and lease).

    ``take`` it at the time the consumer reads from; :meth:`advance` it as the consumer
    reads on (which renews it), or :meth:`renew` it, at least once per lease; :meth:`release`
    it when the consumer is gone for good. If the consumer stops renewing for longer than the
    lease, the writer commits its lapse, and the next advance or renewal raises
    ``HoldLapsed``: what it protected may have been compacted.
    """

    def __init__(self, url: str, collection: str, name: str, *, lease_ms: int,
                 storage_options: Mapping[str, Any] | None = None,
                 timeout: float = 30.0) -> None:
        """A handle on hold ``name`` (taken already, or to be taken with :meth:`take`)."""
        self.url = url
        self.collection = collection
        self.name = name
        self.lease_ms = lease_ms
        self.storage_options = dict(storage_options or {})
        self.timeout = timeout
        self._pending: list[str] = []

    @classmethod
    def take(cls, url: str, collection: str, name: str, at: int, *,
             lease: datetime.timedelta | float,
             storage_options: Mapping[str, Any] | None = None,
             timeout: float = 30.0) -> ConsumerHold:
        """Takes hold ``name`` on ``collection`` at time ``at`` with ``lease`` (a timedelta or
        seconds), and waits until it is durable. A hold of that name is moved (or taken again
        after a lapse).

        Raises:
            InvalidUsage: ``at`` is below the collection's since; a lease that is not
                positive; ``name`` is a tag.
            UnknownCollection: no such collection.
            Timeout, ExternalError: as :func:`request`.
        """
        h = cls(url, collection, name, lease_ms=holds.lease_ms_of(lease),
                storage_options=storage_options, timeout=timeout)
        h._ask("take", at, wait=True)
        return h

    def _ask(self, action: str, frontier: int | None, *, wait: bool) -> None:
        got = request(self.url, self.collection, self.name, action, frontier,
                      lease_ms=self.lease_ms if action == "take" else 0,
                      storage_options=self.storage_options, wait=wait, timeout=self.timeout)
        if isinstance(got, str):
            self._pending.append(got)

    def check(self) -> None:
        """Collects the answers to earlier requests made without waiting.

        Raises:
            HoldLapsed: one found the hold lapsed (or released).
            InvalidUsage: one was refused.
            ExternalError: storage failed.
        """
        blob = resolve(self.url, storage_options=self.storage_options).blob
        for rid in list(self._pending):
            try:
                got = answer(blob, rid)
            except PersistError:
                self._pending.remove(rid)
                raise
            if got is not None:
                self._pending.remove(rid)

    def advance(self, frontier: int, *, wait: bool = True) -> None:
        """Moves the hold forward to ``frontier`` and renews it. Without ``wait`` (a writer
        runs), the answer is collected by a later call or by :meth:`check`.

        Raises:
            HoldLapsed: it lapsed, or was released (from this or an earlier request).
            InvalidUsage: ``frontier`` is below where it holds.
            Timeout, ExternalError: as :func:`request`.
        """
        self.check()
        self._ask("advance", frontier, wait=wait)

    def renew(self, *, wait: bool = True) -> None:
        """Renews the lease where the hold is; raises like :meth:`advance`."""
        self.check()
        self._ask("renew", None, wait=wait)

    def release(self) -> None:
        """Releases the hold (lapsed or not); idempotent.

        Raises:
            Timeout, ExternalError: as :func:`request`.
        """
        with contextlib.suppress(HoldLapsed):
            self.check()
        self._ask("release", None, wait=True)

    def __repr__(self) -> str:
        return f"<ConsumerHold {self.name!r} on {self.collection!r} of {self.url}>"


#: The lease of a hold :func:`set_read_hold` takes: a century, so it never lapses in practice.
PLAIN_LEASE = datetime.timedelta(days=36525)


def set_read_hold(url: str, collection_name: str, hold_id: str, frontier: int | None, *,
                  lock_timeout: float, storage_options: Mapping[str, Any] | None = None
                  ) -> bool:
    """Sets (or, with None, releases) hold ``hold_id`` of a collection from a process that is
    not the writer: the older, one-call form of :class:`ConsumerHold` (prefer that: a hold
    with a lease the consumer renews cannot outlive it). A thin alias over the same path
    (:func:`request`, whether a writer runs or not): ``take`` at ``frontier`` with a lease of a
    century (:data:`PLAIN_LEASE`), or ``release``.

    Returns:
        True once committed; False (logged) if no writer answered within ``lock_timeout``
        or the frontier is below the collection's since: failing to set a hold is never
        unsafe, only less protective, so the caller retries later.

    Raises:
        ExternalError, Corruption: storage failed.
    """
    try:
        if frontier is None:
            with contextlib.suppress(errors.UnknownHold):
                request(url, collection_name, hold_id, "release",
                        storage_options=storage_options, timeout=lock_timeout)
        else:
            ConsumerHold.take(url, collection_name, hold_id, frontier, lease=PLAIN_LEASE,
                              storage_options=storage_options, timeout=lock_timeout)
    except (Timeout, errors.InvalidUsage) as e:
        log.warning("read hold %r on %r not set to %s: %s (retry later)", hold_id,
                    collection_name, frontier, e)
        return False
    return True


__all__ = ["PLAIN_LEASE", "ConsumerHold", "answer", "request", "set_read_hold"]
