"""Hold requests: how a consumer in another process sets, advances, renews or releases a named
hold while a writer runs elsewhere.

Only the writer commits to the metadata log, and a long-running writer holds the location's
lock, so a consumer cannot commit a hold itself then. It writes a **request** instead
(:func:`submit`, at ``layout.hold_request_key(id)``, no lock needed), and the writer's
maintenance thread finds it (one LIST every few tenths of a second), plans it against its
newest state (:func:`persist.indexed.state.holds.plan`), commits it through its queue like any
change, and writes the **answer** in the request's place (:func:`answer`): the seq that
committed it, or the error that refused it. The consumer polls its key (:func:`poll`) and
deletes the answer. With no writer running the consumer takes the lock briefly and serves the
requests itself (:mod:`persist.distributed.holds`).

Why since cannot race past a hold this way: a request is only a wish. ``since`` moves only by
commits in the log, and the consumer counts on its hold only once a commit that sets it is
there (its answer names the seq); from that commit on, every reader computes ``since`` at or
below the hold, until a later commit moves, lapses or releases it, which every reader sees in
the same log. A create that lands too late (since passed the time meanwhile) is refused when
the writer plans it (``InvalidUsage``), never applied below since; an advance that is late
only holds more history than needed. So the request's latency costs history, never a read.

An answer nobody collects (its consumer gave up) is deleted by the writer after
:data:`ANSWER_TTL_SECONDS`; a request past its expiry is answered ``Timeout`` unapplied.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import TypeAlias

import msgspec

from persist import layout
from persist.blob.base import Blob, BlobRead
from persist.indexed.state import stored

#: The format of request and answer records.
REQUEST_FORMAT_VERSION = 1
#: An answer is deleted by the writer once it is this old (its consumer gave up on it).
ANSWER_TTL_SECONDS = 3600.0


class HoldRequest(msgspec.Struct, frozen=True, kw_only=True, tag="request"):
    """A consumer's request (see :func:`persist.indexed.state.holds.plan` for the actions)."""

    version: int = REQUEST_FORMAT_VERSION
    id: str
    collection: str
    hold: str
    action: str
    frontier: int | None = None
    lease_ms: int = 0
    #: Who asked (for operators): ``host:pid``.
    requester: str = ""
    #: The requester's wall clock (ms): when it was made, and after when the writer answers it
    #: ``Timeout`` without applying it (its consumer has long stopped waiting).
    made_ms: int = 0
    expires_ms: int = 0


class HoldAnswer(msgspec.Struct, frozen=True, kw_only=True, tag="answer"):
    """The writer's answer, written in the request's place."""

    version: int = REQUEST_FORMAT_VERSION
    id: str
    #: The seq of the commit that carried the request out (or of the state that already
    #: had it), or None if it was refused.
    seq: int | None = None
    #: The refusal: the name of a :mod:`persist.errors` class and its message.
    error: str | None = None
    message: str = ""
    #: The writer's wall clock (ms) when it answered.
    answered_ms: int = 0


Record: TypeAlias = HoldRequest | HoldAnswer

_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(Record)


def _now_ms() -> int:
    return int(time.time() * 1000)


def new(collection: str, hold: str, action: str, frontier: int | None = None, *,
        lease_ms: int = 0, timeout: float = 60.0) -> HoldRequest:
    """A fresh request, expiring ``timeout`` seconds from now (the requester's clock)."""
    now = _now_ms()
    return HoldRequest(id=uuid.uuid4().hex, collection=collection, hold=hold, action=action,
                       frontier=frontier, lease_ms=lease_ms,
                       requester=f"{socket.gethostname()}:{os.getpid()}", made_ms=now,
                       expires_ms=now + int(timeout * 1000))


def submit(blob: Blob, request: HoldRequest) -> None:
    """Stores ``request`` for the writer.

    Raises:
        ExternalError: storage failed (it may be stored; the writer then answers it).
    """
    blob.set(layout.hold_request_key(request.id), _ENC.encode(request))


def read(blob: BlobRead, key: str) -> Record | None:
    """The request or answer at ``key``, or None.

    Raises:
        Corruption: undecodable.
        IncompatibleFormat: a newer format.
        ExternalError: storage failed.
    """
    rec: Record | None = stored.read(blob, key, _DEC, what="hold request",
                                     newest=REQUEST_FORMAT_VERSION)
    return rec


def poll(blob: BlobRead, request_id: str) -> HoldAnswer | None:
    """The answer to request ``request_id``, or None while it waits (or if it is gone).

    Raises:
        Corruption, IncompatibleFormat, ExternalError: as :func:`read`.
    """
    rec = read(blob, layout.hold_request_key(request_id))
    return rec if isinstance(rec, HoldAnswer) else None


def pending(blob: Blob, *, now_ms: int | None = None) -> list[HoldRequest]:
    """The requests waiting for an answer, oldest first; answers older than
    :data:`ANSWER_TTL_SECONDS` are deleted on the way (and undecodable records reported).

    Raises:
        Corruption, IncompatibleFormat: a record persist cannot read.
        ExternalError: storage failed.
    """
    now = _now_ms() if now_ms is None else now_ms
    out = []
    for key in blob.list_keys(layout.HOLD_REQUEST_PREFIX):
        rec = read(blob, key)
        if isinstance(rec, HoldRequest):
            out.append(rec)
        elif isinstance(rec, HoldAnswer) and now - rec.answered_ms > ANSWER_TTL_SECONDS * 1000:
            blob.delete(key)
    return sorted(out, key=lambda r: (r.made_ms, r.id))


def answer(blob: Blob, request: HoldRequest, *, seq: int | None = None,
           error: BaseException | None = None) -> None:
    """Writes the answer to ``request`` in its place: the seq that carried it out, or the
    error that refused it.

    Raises:
        ExternalError: storage failed (the request stays; it is served again, and serving a
            request twice does what serving it once does).
    """
    ans = HoldAnswer(id=request.id, seq=seq,
                     error=None if error is None else type(error).__name__,
                     message="" if error is None else str(error), answered_ms=_now_ms())
    blob.set(layout.hold_request_key(request.id), _ENC.encode(ans))


def discard(blob: Blob, request_id: str) -> None:
    """Deletes request ``request_id`` or its answer (idempotent).

    Raises:
        ExternalError: storage failed.
    """
    blob.delete(layout.hold_request_key(request_id))


__all__ = ["ANSWER_TTL_SECONDS", "REQUEST_FORMAT_VERSION", "HoldAnswer", "HoldRequest", "Record",
           "answer", "discard", "new", "pending", "poll", "read", "submit"]
