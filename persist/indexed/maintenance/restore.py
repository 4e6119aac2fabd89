"""Restore (``persist restore URL --to-seq N``): putting a location's state back to an earlier
committed one, as a new commit (:class:`~persist.indexed.format.meta.Restore`).

A seq ``N`` is **restorable** while (a) its state can still be replayed: a rollup at or below
``N`` and every log entry after it up to ``N`` are stored (the writer trims log entries and
rollups a grace period after a newer rollup, :mod:`persist.indexed.maintenance.gc`), and (b)
every blob its parts read is still stored: read by the current state, or retired and not yet
deleted (GC deletes a retired blob a grace period after it was retired), and, for a fork across
locations, still read by the current state (its pin keeps it only while something reads it).
``persist verify`` lists the restorable seqs.

This module plans and reports; the writer commits (``Client.restore``), with its GC paused so
that nothing it un-retires is deleted meanwhile. **A restore is an undo**: frontiers may move
backwards, collections registered since ``N`` disappear, holds and tags return to what they
were (the plan lists the holds and tags that disappear, return or move). Listeners and
streams that read past ``N`` must start again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from persist import layout
from persist.blob.base import BlobRead
from persist.errors import InvalidUsage
from persist.indexed.format import meta
from persist.indexed.format.meta import CollectionMeta, Restore, State
from persist.indexed.state import holds, pieces, refs
from persist.indexed.state.transitions import apply


def state_at(blob: BlobRead, seq: int) -> State:
    """The state as of commit ``seq``, replayed from the newest rollup at or below it.

    Raises:
        InvalidUsage: ``seq`` cannot be replayed any more (its log entries or rollup were
            trimmed), naming the oldest seq that can; or it was never committed.
        Corruption, ExternalError: as reading the log.
    """
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidUsage(f"a seq to restore is a positive integer, not {seq!r}")
    rollups = [layout.seq_of(k) for k in blob.list_keys(layout.ROLLUP_PREFIX)]
    logs = {layout.seq_of(k) for k in blob.list_keys(layout.LOG_PREFIX)}
    base = max((r for r in rollups if r <= seq), default=0)
    state = State()
    if base:
        data = blob.get(layout.rollup_key(base))
        if data is None:
            raise InvalidUsage(f"seq {seq} is no longer restorable: rollup {base} vanished "
                               f"(trimmed meanwhile)")
        try:
            state = pieces.read_rollup(blob, layout.rollup_key(base), data).state
        except pieces.PieceMissing as e:
            raise InvalidUsage(f"seq {seq} is no longer restorable: rollup {base} lost a "
                               f"piece (trimmed meanwhile): {e}") from e
    for s in range(base + 1, seq + 1):
        key = layout.log_key(s, meta.log_from(state))
        data = blob.get(key) if s in logs else None
        if data is None:
            top = max([*logs, *rollups, 0])
            if seq > top:
                raise InvalidUsage(f"seq {seq} was never committed (the newest is {top})")
            raise InvalidUsage(f"seq {seq} is no longer restorable: log entry {s} was trimmed "
                               f"(after a rollup, a grace period old); the oldest restorable "
                               f"seq is {oldest(blob)}")
        state = apply(state, meta.decode_commit(key, data))
    return state


def oldest(blob: BlobRead) -> int | None:
    """The oldest seq whose state can still be replayed (None: none)."""
    rollups = sorted(layout.seq_of(k) for k in blob.list_keys(layout.ROLLUP_PREFIX))
    logs = {layout.seq_of(k) for k in blob.list_keys(layout.LOG_PREFIX)}
    if 1 in logs:
        return 1
    return rollups[0] if rollups else None


@dataclass(frozen=True)
class HoldChange:
    """A hold or tag a restore removes, brings back or moves."""

    name: str
    #: ``"tag"``, ``"hold"`` or ``"plain"`` (:class:`~persist.indexed.state.holds.HoldInfo`).
    kind: str
    #: The time it holds at now (None: absent now, the restore brings it back).
    now: int | None
    #: The time it holds at after the restore (None: it disappears).
    then: int | None

    def __str__(self) -> str:
        what = f"{'plain hold' if self.kind == 'plain' else self.kind} {self.name!r}"
        if self.then is None:
            return f"{what} at {self.now} disappears"
        if self.now is None:
            return f"{what} returns at {self.then}"
        return f"{what} moves {self.now} -> {self.then}"


def hold_changes(now: CollectionMeta | None, then: CollectionMeta | None) -> tuple[HoldChange, ...]:
    """The holds and tags of a collection that differ between ``now`` and ``then`` (None: the
    collection is absent), by name."""
    a = {h.name: h for h in holds.listing(now)} if now is not None else {}
    b = {h.name: h for h in holds.listing(then)} if then is not None else {}
    out = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        now_at, then_at = (None if x is None else x.frontier), (None if y is None else y.frontier)
        kind = y.kind if y is not None else x.kind if x is not None else ""
        if x is not None and y is not None and (now_at, x.kind) == (then_at, y.kind):
            continue
        out.append(HoldChange(name, kind, now_at, then_at))
    return tuple(out)


@dataclass(frozen=True)
class Change:
    """What a restore does to one collection."""

    name: str
    #: ``rewound`` (its state differs), ``unchanged``, ``dropped`` (registered after the seq),
    #: ``returns`` (absent now: cannot happen while collections are never dropped, except by
    #: an earlier restore).
    status: str
    since: tuple[int | None, int | None]
    upper: tuple[int | None, int | None]
    parts: tuple[int, int]
    #: Its holds and tags that disappear, return or move (a dropped collection's all go).
    holds: tuple[HoldChange, ...] = ()

    @property
    def backwards(self) -> bool:
        """Whether a frontier moves backwards (or the collection disappears)."""
        if self.status == "dropped":
            return True
        (s0, s1), (u0, u1) = self.since, self.upper
        return (s0 is not None and s1 is not None and s1 < s0) or \
            (u0 is not None and u1 is not None and u1 < u0)


@dataclass
class RestorePlan:
    """A restore of a location from its current seq to an earlier one: what it does, and why
    it cannot, if it cannot."""

    url: str
    seq: int
    to_seq: int
    changes: list[Change] = field(default_factory=list)
    #: Why the restore cannot be done (empty: it can).
    problems: list[str] = field(default_factory=list)
    #: Blobs the restored state reads that are retired now (the restore un-retires them).
    unretired: int = 0
    #: Blobs only the current state reads (the restore retires them).
    retired: int = 0
    op: Restore | None = None

    @property
    def backwards(self) -> bool:
        """Whether any frontier moves backwards (what an undo means)."""
        return any(c.backwards for c in self.changes)


def plan(blob: BlobRead, current: State, seq: int, *, url: str = "") -> RestorePlan:
    """Plans a restore of the location (whose newest state is ``current``) to ``seq``.

    Raises:
        InvalidUsage: ``seq`` is not an earlier committed seq.
        Corruption, ExternalError: as reading the log.
    """
    out = RestorePlan(url, current.seq, seq)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidUsage(f"a seq to restore is a positive integer, not {seq!r}")
    if seq >= current.seq:
        raise InvalidUsage(f"seq {seq} is not before the current seq {current.seq}: nothing to "
                           f"restore")
    try:
        target = state_at(blob, seq)
    except InvalidUsage as e:
        out.problems.append(str(e))
        return out
    for name in sorted(set(current.collections) | set(target.collections)):
        a, b = current.collections.get(name), target.collections.get(name)
        status = ("dropped" if b is None else "returns" if a is None
                  else "unchanged" if a == b else "rewound")
        out.changes.append(Change(
            name, status, (None if a is None else a.since, None if b is None else b.since),
            (None if a is None else a.upper, None if b is None else b.upper),
            (0 if a is None else len(a.parts), 0 if b is None else len(b.parts)),
            hold_changes(a, b)))
    need = refs.referenced(target.collections.values())
    live = refs.referenced(current.collections.values())
    retired = {r.key for r in current.retired}
    stored = set(blob.list_keys(layout.DATA_PREFIX))
    gone = sorted(k for k in need if k not in stored or (k not in live and k not in retired))
    if gone:
        out.problems.append(f"{len(gone)} blobs seq {seq} reads were garbage collected, e.g. "
                            f"{gone[:3]}")
    now_foreign = refs.foreign(current.collections.values())
    lost = sorted(f"{k} of {root}" for root, ks in refs.foreign(target.collections.values())
                  .items() for k in ks if k not in now_foreign.get(root, set()))
    if lost:
        out.problems.append(f"{len(lost)} blobs of other locations that seq {seq} reads are no "
                            f"longer read here, so their pins may be released (e.g. {lost[:2]})")
    out.unretired = len(need & retired)
    out.retired = len(live - need - retired)
    if not out.problems:
        out.op = refs.restore_op(target)
    return out


__all__ = ["Change", "HoldChange", "RestorePlan", "hold_changes", "oldest", "plan", "state_at"]
