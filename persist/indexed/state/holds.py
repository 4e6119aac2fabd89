"""Named holds: tags, and consumer holds with leases. Pure: no I/O, and no clock but the one a
caller passes in.

A collection's ``holds`` (hold id -> frontier) keep its effective since at or below each
frontier, so compaction never forwards a time past one of them and reads as of it stay
definite (DESIGN.md §1). A *named* hold also has terms (:class:`HoldTerms`, in
``CollectionMeta.terms``):

* a **tag** pins one time ``t`` (``since <= t < upper`` when it is made) for as long as it
  exists, whatever ``allow_compaction`` says; it never moves, and is deleted by its name;
* a consumer **hold** is taken at a time with a lease, then advanced (never backwards) and
  renewed by its consumer; every set renews it, at the wall-clock time of the commit that sets
  it (``HoldTerms.renewed_ms``: the committing writer's clock).

**Lapse.** A hold whose lease ran out is not dropped by anyone's clock reading of the log:
that would make ``since`` depend on who reads it, and reads would stop being definite. The
writer decides (its maintenance round, :func:`lapses`) and commits the decision, a
``SetHold(lapse=renewed_ms)``: a compare-and-set on the renewal it judged, so a renewal that
lands first wins. From that commit on the hold is out of ``holds`` (compaction may pass it) and
stays in ``terms`` with its last frontier (``lapsed_at``) until it is released; its consumer's
next advance or renewal fails with :class:`~persist.errors.HoldLapsed`. Every reader, replica
and distributed planner computes the same effective since from the log. Clocks decide only
*when* a hold lapses (liveness), never what a read returns (safety).

An older persist reads a named hold as a plain one and a lapse as a release: the same
effective since.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from persist.errors import HoldLapsed, InvalidUsage, UnknownHold
from persist.indexed.format.meta import CollectionMeta, HoldTerms, SetHold

replace = msgspec.structs.replace

#: The kind of a tag's terms.
TAG = "tag"
#: The kind of a consumer hold's terms.
HOLD = "hold"

#: What a consumer (or an operator) asks of a named hold (:func:`plan`).
Action = Literal["take", "advance", "renew", "release", "tag", "untag"]
ACTIONS: tuple[str, ...] = ("take", "advance", "renew", "release", "tag", "untag")


def terms_of(c: CollectionMeta) -> Mapping[str, HoldTerms]:
    """``c``'s named holds' terms (live and lapsed)."""
    return c.terms if c.terms is not msgspec.UNSET else {}


def effective_since(c: CollectionMeta) -> int:
    """``since`` held back by every hold in ``holds`` (lapsed ones are not there)."""
    return min(c.since, *c.holds.values()) if c.holds else c.since


def tags(c: CollectionMeta) -> dict[str, int]:
    """``c``'s tags: name -> the time each pins."""
    return {h: c.holds[h] for h, t in sorted(terms_of(c).items())
            if t.kind == TAG and h in c.holds}


def tag_time(c: CollectionMeta, name: str) -> int:
    """The time tag ``name`` of ``c`` pins.

    Raises:
        UnknownHold: ``c`` has no tag of that name (the message lists its tags).
    """
    have = tags(c)
    if name not in have:
        raise UnknownHold(f"{c.name!r} has no tag {name!r}; its tags: {sorted(have)[:20]}")
    return have[name]


# -- the rules of the op (replay and staging) -----------------------------------------------


def check(c: CollectionMeta, op: SetHold) -> None:
    """The rules a ``SetHold`` with terms (or on a named hold) obeys, beyond the frontier
    check every hold has (``frontier >= effective since``).

    Raises:
        InvalidUsage: ``op`` may not follow ``c`` (and changes nothing).
    """
    h = op.hold_id
    have = terms_of(c).get(h)
    if op.lapse is not msgspec.UNSET:
        if (op.frontier is not None or have is None or have.kind != HOLD
                or have.lapsed_at is not None or h not in c.holds
                or have.renewed_ms != op.lapse):
            raise InvalidUsage(f"lapse of hold {h!r} on {c.name!r} does not match it (renewed "
                               f"since, released, or not a live consumer hold)")
        return
    if op.frontier is None:
        return  # a release: of anything, or of nothing
    kind = op.kind
    if kind is msgspec.UNSET:
        if have is not None:
            raise InvalidUsage(f"{h!r} on {c.name!r} is a named {have.kind}: set it through "
                               f"its own API (a tag never moves; a consumer hold is advanced "
                               f"by its handle)")
        return
    lease = 0 if op.lease_ms is msgspec.UNSET else op.lease_ms
    if kind == TAG:
        if lease:
            raise InvalidUsage(f"tag {h!r} on {c.name!r}: a tag has no lease")
        if op.frontier >= c.upper:
            raise InvalidUsage(f"tag {h!r} on {c.name!r} at {op.frontier} is not below its upper "
                               f"{c.upper}: only a sealed time can be tagged")
        if have is not None and (have.kind != TAG or c.holds.get(h) != op.frontier):
            raise InvalidUsage(f"{c.name!r} already has a {have.kind} named {h!r}"
                               + (f" (at {c.holds[h]})" if h in c.holds else "")
                               + ": a tag never moves; delete it first")
        if have is None and h in c.holds:
            raise InvalidUsage(f"{c.name!r} already has a read hold named {h!r}")
    elif kind == HOLD:
        if lease < 0:
            raise InvalidUsage(f"hold {h!r} on {c.name!r}: a lease is a positive number of "
                               f"milliseconds (0: none), not {lease}")
        if have is not None and have.kind == TAG:
            raise InvalidUsage(f"{c.name!r} already has a tag named {h!r}")
    else:
        raise InvalidUsage(f"unknown kind of hold {kind!r} (a tag or a hold)")


def applied(c: CollectionMeta, op: SetHold, *, wall_ms: int) -> CollectionMeta:
    """``c`` with the checked ``op`` applied by a commit made at ``wall_ms``."""
    h = op.hold_id
    holds = dict(c.holds)
    terms = dict(terms_of(c))
    if op.lapse is not msgspec.UNSET:
        terms[h] = replace(terms[h], lapsed_at=holds.pop(h))
    elif op.frontier is None:
        holds.pop(h, None)
        terms.pop(h, None)
    else:
        holds[h] = op.frontier
        if op.kind is not msgspec.UNSET:
            lease = 0 if op.lease_ms is msgspec.UNSET else op.lease_ms
            terms[h] = HoldTerms(kind=op.kind, lease_ms=lease, renewed_ms=wall_ms)
    return replace(c, holds=holds, terms=terms or msgspec.UNSET)


# -- what a request means now (staging) --------------------------------------------------------


def plan(c: CollectionMeta, action: str, hold_id: str, frontier: int | None = None, *,
         lease_ms: int = 0, missing_ok: bool = False) -> SetHold | None:
    """The op that carries out ``action`` on hold ``hold_id`` of ``c`` now, or None when it is
    already done (an idempotent repeat).

    Actions: ``take`` (a consumer hold at ``frontier`` with ``lease_ms``: created, moved, or
    taken again after a lapse), ``advance`` (to ``frontier``, never backwards; renews),
    ``renew``, ``release`` (any named or plain hold), ``tag`` (at ``frontier``), ``untag``.

    Raises:
        HoldLapsed: ``advance``/``renew`` of a hold that lapsed, or that no longer exists.
        UnknownHold: ``release``/``untag`` of a hold that does not exist (unless
            ``missing_ok``).
        InvalidUsage: a malformed request, a time below the effective since (or a tag not
            below upper), a tag moved, a backwards advance, a lease that is not positive.
    """
    if not isinstance(hold_id, str) or not hold_id:
        raise InvalidUsage(f"a hold or tag name is a non-empty string, not {hold_id!r}")
    if action not in ACTIONS:
        raise InvalidUsage(f"unknown hold action {action!r}; one of {ACTIONS}")
    have = terms_of(c).get(hold_id)
    where = f"{hold_id!r} on {c.name!r}"
    if action in ("release", "untag"):
        if have is None and hold_id not in c.holds:
            if missing_ok:
                return None
            raise UnknownHold(f"{c.name!r} has no {'tag' if action == 'untag' else 'hold'} "
                              f"named {hold_id!r}")
        if action == "untag" and (have is None or have.kind != TAG):
            raise InvalidUsage(f"{where} is not a tag")
        return SetHold(name=c.name, hold_id=hold_id, frontier=None)
    if action == "tag":
        frontier = _at_or_after_since(c, "tag", where, frontier)
        if have is not None and have.kind == TAG and c.holds.get(hold_id) == frontier:
            return None
        return SetHold(name=c.name, hold_id=hold_id, frontier=frontier, kind=TAG)
    _check_lease(lease_ms, allow_none=action != "take")
    if action == "take":
        frontier = _at_or_after_since(c, "hold", where, frontier)
        return SetHold(name=c.name, hold_id=hold_id, frontier=frontier, kind=HOLD,
                       lease_ms=lease_ms)
    # advance / renew: the consumer's own hold, which must still hold
    if have is None or have.kind != HOLD:
        if have is not None:
            raise InvalidUsage(f"{where} is a {have.kind}, not a consumer hold")
        raise HoldLapsed(f"hold {where} no longer exists (it was released, or never taken): it "
                         f"holds nothing; take it again at or after the collection's since")
    if have.lapsed_at is not None:
        raise HoldLapsed(
            f"hold {where} lapsed at {have.lapsed_at}: it was not renewed within its lease of "
            f"{have.lease_ms / 1000:g}s, and since may have passed it; release it and take a new "
            f"hold at or after the collection's since ({effective_since(c)})")
    current = c.holds[hold_id]
    target = current if action == "renew" or frontier is None else frontier
    _check_time("hold", target)
    if target < current:
        raise InvalidUsage(f"hold {where} cannot move backwards from {current} to {target}")
    lease = lease_ms if lease_ms else have.lease_ms
    return SetHold(name=c.name, hold_id=hold_id, frontier=target, kind=HOLD, lease_ms=lease)


def _at_or_after_since(c: CollectionMeta, what: str, where: str, t: int | None) -> int:
    """``t``, checked to be a time at or after ``c``'s effective since."""
    _check_time(what, t)
    assert t is not None
    since = effective_since(c)
    if t < since:
        raise InvalidUsage(f"{what} {where} at {t} is below its since {since}: that history may "
                           f"be compacted already")
    return t


def _check_time(what: str, t: object) -> None:
    if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < 2**64:
        raise InvalidUsage(f"a {what} time is an integer in [0, 2**64), not {t!r}")


def _check_lease(lease_ms: object, *, allow_none: bool) -> None:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int):
        raise InvalidUsage(f"a lease is a whole number of milliseconds, not {lease_ms!r}")
    if lease_ms < 0 or (lease_ms == 0 and not allow_none):
        raise InvalidUsage(f"a hold's lease must be positive, not {lease_ms / 1000:g}s")


def lease_ms_of(lease: object) -> int:
    """``lease`` (a ``timedelta`` or seconds) in whole milliseconds, at least 1.

    Raises:
        InvalidUsage: not a positive duration.
    """
    if isinstance(lease, datetime.timedelta):
        seconds = lease.total_seconds()
    elif isinstance(lease, (int, float)) and not isinstance(lease, bool):
        seconds = float(lease)
    else:
        raise InvalidUsage(f"a lease is a datetime.timedelta or a number of seconds, not "
                           f"{lease!r}")
    if not seconds > 0:
        raise InvalidUsage(f"a hold's lease must be positive, not {seconds:g}s")
    return max(1, round(seconds * 1000))


# -- the writer's decisions ------------------------------------------------------------------


def lapses(collections: Mapping[str, CollectionMeta], now_ms: int) -> list[SetHold]:
    """The lapses the writer commits at ``now_ms`` (its clock): every live consumer hold with
    a lease not renewed for longer than it."""
    out = []
    for c in collections.values():
        for h, t in terms_of(c).items():
            if (t.kind == HOLD and t.lease_ms > 0 and t.lapsed_at is None and h in c.holds
                    and now_ms - t.renewed_ms > t.lease_ms):
                out.append(SetHold(name=c.name, hold_id=h, frontier=None, lapse=t.renewed_ms))
    return out


# -- listing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldInfo:
    """One hold of a collection, as ``persist holds`` and ``Client.holds`` list it."""

    collection: str
    name: str
    #: ``"tag"``, ``"hold"`` (a consumer's, maybe with a lease) or ``"plain"`` (a hold set
    #: by ``WriteHandle.hold``, or by an older persist).
    kind: str
    #: The time it holds at (a lapsed hold: the time it held at when it lapsed).
    frontier: int
    #: Its lease in seconds (None: none).
    lease_seconds: float | None
    #: The wall-clock time of its last renewal (the committing writer's clock; None: unknown).
    renewed_at: datetime.datetime | None
    #: The writer committed its lapse: it holds nothing any more.
    lapsed: bool

    @property
    def expires_at(self) -> datetime.datetime | None:
        """When the writer may find its lease run out (None: no lease, or lapsed)."""
        if self.lapsed or self.lease_seconds is None or self.renewed_at is None:
            return None
        return self.renewed_at + datetime.timedelta(seconds=self.lease_seconds)


def listing(c: CollectionMeta) -> Iterator[HoldInfo]:
    """Every hold of ``c``, named or plain, live or lapsed, by name."""
    terms = terms_of(c)
    for h in sorted(set(c.holds) | set(terms)):
        t = terms.get(h)
        if t is None:
            yield HoldInfo(c.name, h, "plain", c.holds[h], None, None, False)
            continue
        at = datetime.datetime.fromtimestamp(t.renewed_ms / 1000, tz=datetime.UTC)
        lapsed = t.lapsed_at is not None
        frontier = t.lapsed_at if t.lapsed_at is not None else c.holds[h]
        yield HoldInfo(c.name, h, t.kind, frontier, t.lease_ms / 1000 if t.lease_ms else None,
                       at, lapsed)


__all__ = ["ACTIONS", "HOLD", "TAG", "Action", "HoldInfo", "applied", "check", "effective_since",
           "lapses", "lease_ms_of", "listing", "plan", "tag_time", "tags", "terms_of"]
