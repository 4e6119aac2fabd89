"""A collection's history: its recent seals, each with its wall-clock time and what it added.

The ``DESCRIBE HISTORY`` of persist. Every commit that advances a collection's upper appends a
:class:`~persist.indexed.format.meta.HistoryEntry` to ``CollectionMeta.history`` when it is replayed
(:func:`persist.indexed.state.transitions.apply_op`): the new upper, the commit's seq and wall-clock time
(the writer's clock), and the rows added since the previous seal with the sums of their positive
and negative diffs. The most recent ``state.HISTORY_ENTRIES`` seals are kept.

It also maps a wall-clock time to a frontier (:func:`as_of_at`): the contents "as of 09:00" are
the contents as of the last time sealed at or before 09:00, which is definite like any other
read (``timestampAsOf`` in Spark).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import msgspec

from persist.errors import InvalidUsage
from persist.indexed.format.meta import CollectionMeta, HistoryEntry
from persist.indexed.state.transitions import effective_since


@dataclass(frozen=True)
class Seal:
    """One seal of a collection, as :func:`entries` reports it."""

    #: The upper this seal advanced to: times below it became final.
    upper: int
    #: When its commit was made (the writer's clock, UTC).
    committed_at: datetime.datetime
    #: The metadata log's sequence number of the commit.
    seq: int
    #: Rows added since the previous seal, and the sums of their positive diffs and of their
    #: negative diffs' magnitudes (None: some were added by a persist too old to count them).
    updates: int
    inserted: int | None
    retracted: int | None


def entries(c: CollectionMeta) -> list[Seal]:
    """``c``'s recorded seals, oldest first."""
    return [_seal(e) for e in _history(c)]


def _history(c: CollectionMeta) -> tuple[HistoryEntry, ...]:
    return c.history if c.history is not msgspec.UNSET else ()


def _seal(e: HistoryEntry) -> Seal:
    at = datetime.datetime.fromtimestamp(e.wall_ms / 1000, tz=datetime.UTC)
    return Seal(e.upper, at, e.seq, e.updates, e.inserted, e.retracted)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def wall_ms_of(when: datetime.datetime | str | int | float) -> int:
    """Milliseconds since the epoch of ``when``: an aware datetime, an ISO-8601 string with a
    zone (``2026-11-25T09:00:00Z``), or seconds since the epoch.

    Raises:
        InvalidUsage: a naive datetime or string (no zone: ambiguous), or not a time at all.
    """
    if isinstance(when, str):
        try:
            when = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError as e:
            raise InvalidUsage(f"{when!r} is not an ISO-8601 timestamp: {e}") from e
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            raise InvalidUsage(f"timestamp {when.isoformat()} has no time zone: say which "
                               f"(e.g. {when.isoformat()}Z for UTC)")
        # NB: integer arithmetic: ``timestamp() * 1000`` lands a hair below an exact
        # millisecond (a seal's own committed_at) and would miss that seal.
        return (when - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        raise InvalidUsage(f"a timestamp is an aware datetime, an ISO-8601 string with a zone, "
                           f"or seconds since the epoch, not {when!r}")
    return int(when * 1000)


def as_of_at(c: CollectionMeta, when: datetime.datetime | str | int | float) -> int:
    """The frontier to read ``c`` as of at wall-clock time ``when``: the last time sealed by a
    commit made at or before ``when`` (that seal's upper minus one).

    Raises:
        InvalidUsage: ``when`` is not a timestamp (see :func:`wall_ms_of`); or it lies before
            the oldest seal the history keeps, or before the collection's since (that history
            is compacted), or before anything was sealed; each message says which.
    """
    at = wall_ms_of(when)
    hist = _history(c)
    if not hist:
        raise InvalidUsage(f"{c.name!r} has no recorded seals: nothing to read as of a "
                           f"timestamp")
    if at < hist[0].wall_ms:
        raise InvalidUsage(
            f"{c.name!r} as of {_iso(at)} lies before its oldest recorded seal "
            f"({_iso(hist[0].wall_ms)}; the history keeps the most recent seals)")
    chosen = hist[0]
    for e in hist:
        if e.wall_ms > at:
            break
        chosen = e
    as_of = chosen.upper - 1
    since = effective_since(c)
    if as_of < since:
        raise InvalidUsage(
            f"{c.name!r} as of {_iso(at)} is time {as_of}, below its since {since}: that "
            f"history may be compacted and is no longer distinguishable")
    return as_of


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).isoformat()


__all__ = ["Seal", "as_of_at", "entries", "wall_ms_of"]
