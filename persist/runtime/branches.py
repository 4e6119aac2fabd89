"""The runtime's side of forks, tags and named holds: what the client submits (plans decided
against the working copy, :class:`~persist.runtime.commands.Plan`) and what the maintenance
thread does for named holds (:class:`HoldDesk`: commits lapses, answers the requests of
consumers in other processes).

The rules themselves are pure and live in the engine (:mod:`persist.indexed.state.refs`,
:mod:`persist.indexed.state.holds`); this module only decides when and where they run.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import msgspec

from persist.blob.base import Blob
from persist.errors import HoldLapsed, InvalidUsage, Timeout
from persist.indexed.engine import Txn
from persist.indexed.format.meta import CollectionMeta, Op, Register, State
from persist.indexed.state import holds, refs, requests
from persist.indexed.state.holds import HoldInfo
from persist.indexed.state.transitions import collection
from persist.runtime import commands as cmd

log = logging.getLogger("persist.runtime")

Plan = Callable[[Txn], Sequence[Op]]


def _next_cid(txn: Txn) -> int:
    """An id no collection of ``txn``'s state or working copy uses."""
    return txn.free_cid()


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidUsage(f"{what} must be a non-empty string, not {name!r}")
    return name


def _free(txn: Txn, source: str, into: str) -> None:
    if into in txn.collections:
        raise InvalidUsage(f"cannot fork {source!r} into {into!r}: a collection named {into!r} "
                           f"exists already")


def fork_plan(name: str, into: str, as_of: int | None) -> Plan:
    """The plan of a fork of ``name`` into ``into`` as of ``as_of`` in the same location.

    Raises:
        InvalidUsage: (now) a name that is not a non-empty string; (when staged) ``into``
            exists, ``as_of`` is not readable.
        UnknownCollection: (when staged) no collection ``name``.
    """
    _check_name("a collection name", name)
    _check_name("the fork's name (into)", into)

    def plan(txn: Txn) -> list[Op]:
        src = collection(txn.collections, name)
        _free(txn, name, into)
        return [Register(refs.forked(src, name=into, cid=_next_cid(txn), as_of=as_of,
                                     src_seq=txn.base.seq))]

    return plan


def adopt_plan(planned: CollectionMeta, into: str) -> Plan:
    """The plan that registers ``planned`` (a fork of another location's collection, its
    parts referencing that location's blobs) as ``into``, under a fresh id."""
    _check_name("the fork's name (into)", into)

    source = planned.lineage.source if planned.lineage is not msgspec.UNSET else None

    def plan(txn: Txn) -> list[Op]:
        _free(txn, source or planned.name, into)
        return [Register(msgspec.structs.replace(planned, name=into, id=_next_cid(txn)))]

    return plan


def hold_plan(name: str, action: str, hold_id: str, frontier: int | None = None, *,
              lease_ms: int = 0, missing_ok: bool = False) -> Plan:
    """The plan of ``action`` on named hold ``hold_id`` of ``name`` (see
    :func:`persist.indexed.state.holds.plan`), decided against the working copy."""

    def plan(txn: Txn) -> list[Op]:
        op = holds.plan(collection(txn.collections, name), action, hold_id, frontier,
                        lease_ms=lease_ms, missing_ok=missing_ok)
        return [] if op is None else [op]

    return plan


def lapse_plan(txn: Txn, names: Sequence[str] | None = None) -> list[Op]:
    """The lapses due now (the writer's clock), against the working copy: a renewal staged
    before it in the same commit wins. ``names``: only those collections' (None: all)."""
    colls: Mapping[str, CollectionMeta] = txn.collections
    if names is not None:
        colls = {n: colls[n] for n in names if n in colls}
    return list(holds.lapses(colls, int(time.time() * 1000)))


Submit = Callable[[cmd.Command], "Future[Any]"]


class HoldDesk:
    """The writer's desk for named holds, run by its maintenance thread: commits the lapses
    that are due, and answers the requests of consumers in other processes
    (:mod:`persist.indexed.state.requests`), polling for them at most every
    ``poll_seconds``."""

    def __init__(self, poll_seconds: float) -> None:
        """A desk LISTing the requests at most every ``poll_seconds``."""
        self.poll_seconds = poll_seconds
        self._next = float("-inf")

    def round(self, blob: Blob, state: Callable[[], State], submit: Submit,
              lapsing: Callable[[State, int], Sequence[str]] | None = None) -> bool:
        """One round: lapses, then the pending requests. Returns whether it committed or
        answered anything. ``lapsing(state, now_ms)``: the collections that may have a hold
        to lapse (the engine's work index); None: look at every one.

        Raises:
            ExternalError: storage failed (a request not answered is served again later).
            RuntimeShutdown: the runtime stopped.
        """
        did = False
        st, now_ms = state(), int(time.time() * 1000)
        names = None if lapsing is None else list(lapsing(st, now_ms))
        colls = st.collections if names is None else {n: st.collections[n] for n in names
                                                      if n in st.collections}
        if holds.lapses(colls, now_ms):
            seq = submit(cmd.Plan(functools.partial(lapse_plan, names=names))).result()
            log.info("committed the lapse of named holds whose lease ran out (seq %d)", seq)
            did = True
        now = time.monotonic()
        if now < self._next:
            return did
        self._next = now + self.poll_seconds
        for req in requests.pending(blob):
            serve(blob, req, submit)
            did = True
        return did


def serve(blob: Blob, req: requests.HoldRequest, submit: Submit) -> None:
    """Carries out request ``req`` through ``submit`` and answers it in place: its seq, or
    the refusal (a request past its expiry: ``Timeout``, unapplied).

    Raises:
        ExternalError: storage failed (the request stays, and is served again).
        RuntimeShutdown: the runtime stopped.
    """
    if req.expires_ms < int(time.time() * 1000):
        requests.answer(blob, req, error=Timeout(f"hold request {req.id} expired before a "
                                                 f"writer served it; not applied"))
        return
    try:
        plan = hold_plan(req.collection, req.action, req.hold, req.frontier,
                         lease_ms=req.lease_ms, missing_ok=True)
        seq = submit(cmd.Plan(plan)).result()
    except (InvalidUsage, HoldLapsed) as e:
        requests.answer(blob, req, error=e)
    else:
        requests.answer(blob, req, seq=seq)


class HoldHandle:
    """A consumer's named hold on one collection (``Client.hold``): advanced and renewed by
    the consumer, released when done. While it holds at ``t``, ``since`` never passes ``t``.

    If it is not renewed (an advance renews) within its lease, the writer commits its lapse:
    it then holds nothing, and :meth:`advance` and :meth:`renew` fail with ``HoldLapsed``.
    """

    def __init__(self, submit: Submit, meta: Callable[[], CollectionMeta], name: str,
                 hold_id: str) -> None:
        """A handle on hold ``hold_id`` of collection ``name`` (``meta`` returns its newest
        metadata; ``submit`` queues a command on its writer)."""
        self._submit = submit
        self._meta = meta
        self.collection = name
        self.name = hold_id

    @property
    def info(self) -> HoldInfo:
        """The hold as the newest state shows it.

        Raises:
            HoldLapsed: it no longer exists (released).
        """
        for h in holds.listing(self._meta()):
            if h.name == self.name:
                return h
        raise HoldLapsed(f"hold {self.name!r} on {self.collection!r} no longer exists (it was "
                         f"released)")

    @property
    def frontier(self) -> int:
        """The time it holds at (a lapsed hold: where it held when it lapsed)."""
        return self.info.frontier

    @property
    def lapsed(self) -> bool:
        """True once the writer committed its lapse (or it was released)."""
        try:
            return self.info.lapsed
        except HoldLapsed:
            return True

    def advance(self, frontier: int) -> Future[Any]:
        """Moves the hold forward to ``frontier`` (releasing the history before it) and renews
        its lease. The future resolves with the commit's seq once durable; it fails with
        ``HoldLapsed`` if the hold lapsed (or was released), ``InvalidUsage`` if ``frontier``
        is below where it holds."""
        return self._submit(cmd.Plan(hold_plan(self.collection, "advance", self.name,
                                               frontier)))

    def renew(self) -> Future[Any]:
        """Renews the lease where the hold is; fails like :meth:`advance`."""
        return self._submit(cmd.Plan(hold_plan(self.collection, "renew", self.name)))

    def release(self) -> Future[Any]:
        """Releases the hold (lapsed or not); idempotent."""
        return self._submit(cmd.Plan(hold_plan(self.collection, "release", self.name,
                                               missing_ok=True)))

    def __repr__(self) -> str:
        return f"<HoldHandle {self.name!r} on {self.collection!r}>"


__all__ = ["HoldDesk", "HoldHandle", "adopt_plan", "fork_plan", "hold_plan", "lapse_plan",
           "serve"]
