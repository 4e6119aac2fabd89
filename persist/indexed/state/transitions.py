"""Pure state transitions: ``state + op -> new state | InvalidUsage``. No I/O here.

Everything that decides whether a write, seal, compaction or GC step is allowed lives in this
module, so it can be tested (and fuzzed with hypothesis) with no storage at all. The runtime
plans commands against a working copy with :func:`check` + :func:`apply_op`; readers replay
the metadata log with :func:`apply`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping

import msgspec

from persist import layout
from persist.errors import Corruption, Fenced, InvalidUsage, UnknownCollection
from persist.indexed.format import evolve
from persist.indexed.format.columnar import MAX_TIME
from persist.indexed.format.meta import (
    AddPart,
    AllowCompaction,
    CollectionMeta,
    Commit,
    EvolveSchema,
    Forget,
    HistoryEntry,
    Op,
    PartMeta,
    Register,
    ReplaceParts,
    Restore,
    Retired,
    Seal,
    SetHold,
    State,
    log_from,
)
from persist.indexed.state import holds as named
from persist.indexed.state import pieces, refs
from persist.indexed.state.holds import effective_since as effective_since

replace = msgspec.structs.replace


class _Gone:
    """The overlay's mark of a collection deleted from its working copy."""


_GONE = _Gone()


class Overlay(MutableMapping[str, CollectionMeta]):
    """A working copy of a state's collections that copies none of them: reads fall through to
    the (never mutated) ``base``, writes land in an overlay of the names changed.

    NB: staging used to copy the whole map per commit and once more per command (a savepoint),
    each an O(collections) copy however few a commit touched; with 10,000 collections a group
    of 32 commands copied 330,000 entries. Iteration order is a dict's: the base's names in
    their order (with changed values), then the names added, in the order they were added.
    """

    __slots__ = ("_base", "_cleared", "_over")

    def __init__(self, base: Mapping[str, CollectionMeta],
                 over: dict[str, CollectionMeta | _Gone] | None = None,
                 cleared: bool = False) -> None:
        self._base = base
        self._over: dict[str, CollectionMeta | _Gone] = {} if over is None else over
        self._cleared = cleared

    def __getitem__(self, name: str) -> CollectionMeta:
        v = self._over.get(name)
        if v is None:
            if self._cleared:
                raise KeyError(name)
            return self._base[name]
        if isinstance(v, _Gone):
            raise KeyError(name)
        return v

    def __setitem__(self, name: str, c: CollectionMeta) -> None:
        if not self._cleared and isinstance(self._over.get(name), _Gone):
            # NB: a name of the base deleted and added again goes last, as in a dict: become a
            # whole copy (O(collections), and nothing stages that: a restore clears instead)
            self._over, self._cleared = dict(self.items()), True
        self._over[name] = c

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._over[name] = _GONE

    def __iter__(self) -> Iterator[str]:
        over = self._over
        if not self._cleared:
            for name in self._base:
                if not isinstance(over.get(name), _Gone):
                    yield name
        for name, v in list(over.items()):
            if not isinstance(v, _Gone) and (self._cleared or name not in self._base):
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def values(self) -> Iterator[CollectionMeta]:  # type: ignore[override]
        """The collections, in iteration order (a pass over the base at a dict's speed, not
        a lookup per name as the mixin's view would)."""
        over = self._over
        if not self._cleared:
            if not over:
                yield from self._base.values()
                return
            for name, c in self._base.items():
                v = over.get(name)
                if v is None:
                    yield c
                elif not isinstance(v, _Gone):
                    yield v
        for name, v in list(over.items()):
            if not isinstance(v, _Gone) and (self._cleared or name not in self._base):
                yield v

    def items(self) -> Iterator[tuple[str, CollectionMeta]]:  # type: ignore[override]
        """The names and collections, in iteration order (see :meth:`values`)."""
        for name in self:
            yield name, self[name]

    def clear(self) -> None:
        """Forgets every name: the overlay then holds only what is set after (the base is
        never touched)."""
        self._over = {}
        self._cleared = True

    def where(self, pred: Callable[[CollectionMeta], bool]) -> list[CollectionMeta]:
        """The collections for which ``pred`` holds, in no particular order (over a base
        that answers it itself, :meth:`persist.indexed.state.pieces.Collections.where`, a
        pass over the names changed only)."""
        over = self._over
        base_where = getattr(self._base, "where_items", None)
        if self._cleared or base_where is None:
            return [c for c in self.values() if pred(c)]
        out = [c for n, c in base_where(pred) if n not in over]
        out.extend(v for v in over.values() if not isinstance(v, _Gone) and pred(v))
        return out

    def copy(self) -> Overlay:
        """A copy sharing the base (O(names changed))."""
        return Overlay(self._base, dict(self._over), self._cleared)

    def changed(self) -> Iterator[str]:
        """The names written (set, added or deleted) since the base, or every name if the
        copy was cleared."""
        return iter(self) if self._cleared else iter(list(self._over))

    def __repr__(self) -> str:
        return f"Overlay({len(self._over)} changed over {len(self._base)})"


def touches_retired(op: Op) -> bool:
    """Whether ``op``'s check or apply reads or writes the retired blobs (few kinds do: the
    others need no working copy of them)."""
    return isinstance(op, (ReplaceParts, Forget, Restore))


def touched(op: Op) -> tuple[str, ...] | None:
    """The names of the collections ``op`` changes; None for every one (a restore)."""
    match op:
        case Register(collection=c):
            return (c.name,)
        case AddPart(name=n) | Seal(name=n) | AllowCompaction(name=n) | ReplaceParts(name=n):
            return (n,)
        case SetHold(name=n) | EvolveSchema(name=n):
            return (n,)
        case Forget():
            return ()
    return None


def collection(collections: Mapping[str, CollectionMeta], name: str) -> CollectionMeta:
    """Returns collection ``name`` of ``collections``.

    Raises:
        UnknownCollection: no such name (the message lists up to 20 known ones).
    """
    try:
        return collections[name]
    except KeyError:
        raise UnknownCollection(
            f"unknown collection {name!r}; known: {sorted(collections)[:20]}"
        ) from None


def check_time(what: str, t: object) -> None:
    """Checks that ``t`` is a time: an int (not a bool) in ``[0, 2**64)``.

    Raises:
        InvalidUsage: naming ``what`` (say, "seal frontier") and the value.
    """
    if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= MAX_TIME:
        raise InvalidUsage(f"{what} {t!r} is not an integer time in [0, 2**64)")


def check(collections: Mapping[str, CollectionMeta], op: Op,
          retired: Iterable[Retired] = ()) -> None:
    """Raises InvalidUsage (and changes nothing) if ``op`` may not follow ``collections``
    (and the ``retired`` blobs, which a restore may still take back)."""
    match op:
        case Register(collection=c):
            if c.name in collections:
                raise InvalidUsage(f"collection {c.name!r} is already registered")
            refs.check_register(collections, c)
        case AddPart(name=name, part=p):
            c = collection(collections, name)
            if p.rows and p.min_time < c.upper:
                raise InvalidUsage(
                    f"write to {name!r} at time {p.min_time} is below its upper {c.upper}: "
                    f"times below upper are sealed"
                )
            if evolve.part_version(p) != evolve.version(c):  # (compared first: cheap)
                evolve.check_writer(c, evolve.part_version(p), f"part {p.id}")
        case Seal(name=name, upper=u):
            check_time("seal frontier", u)
            c = collection(collections, name)
            if u < c.upper:
                raise InvalidUsage(
                    f"seal of {name!r} to {u} would move its upper backwards from {c.upper}"
                )
        case AllowCompaction(name=name, since=s):
            check_time("compaction frontier", s)
            c = collection(collections, name)
            if s < c.since:
                raise InvalidUsage(
                    f"allow_compaction of {name!r} to {s} would move its since backwards "
                    f"from {c.since}"
                )
            if s > c.upper:
                raise InvalidUsage(
                    f"allow_compaction of {name!r} to {s} is beyond its upper {c.upper}: "
                    f"seal first"
                )
        case ReplaceParts(name=name, removed=removed, frontier=f):
            c = collection(collections, name)
            have = {p.id for p in c.parts}
            gone = [r for r in removed if r not in have]
            if gone:
                raise InvalidUsage(f"compaction of {name!r} replaces parts that are gone: {gone}")
            if f > effective_since(c):
                raise InvalidUsage(
                    f"compaction of {name!r} forwarded to {f} beyond since {effective_since(c)}"
                )
            newer = [p.id for p in op.added if evolve.part_version(p) > evolve.version(c)]
            if newer:
                raise InvalidUsage(f"compaction of {name!r} adds parts of a schema version it "
                                   f"does not have: {newer}")
        case SetHold(name=name, frontier=f):
            c = collection(collections, name)
            if f is not None and f < effective_since(c):
                raise InvalidUsage(
                    f"read hold on {name!r} at {f} is below its since {effective_since(c)}"
                )
            named.check(c, op)
        case Forget():
            pass
        case EvolveSchema(name=name):
            evolve.check(collection(collections, name), op)
        case Restore():
            refs.check_restore(collections, retired, op)


def apply_op(
    collections: MutableMapping[str, CollectionMeta],
    retired: list[Retired],
    op: Op,
    *,
    seq: int,
    wall_ms: int,
) -> None:
    """Applies a checked ``op`` to mutable working copies of a state's parts."""
    match op:
        case Register(collection=c):
            collections[c.name] = c
        case AddPart(name=name, part=p):
            c = collections[name]
            collections[name] = replace(c, parts=(*c.parts, p), unsealed=_tally(c, p))
        case Seal(name=name, upper=u):
            c = collections[name]
            if u > c.upper:
                collections[name] = _sealed(c, u, seq=seq, wall_ms=wall_ms)
        case AllowCompaction(name=name, since=s):
            collections[name] = replace(collections[name], since=s)
        case ReplaceParts(name=name, removed=removed, added=added):
            c = collections[name]
            gone = set(removed)
            keep = tuple(p for p in c.parts if p.id not in gone)
            collections[name] = replace(c, parts=keep + tuple(added))
            # NB: a blob is retired only once no collection reads it (a fork may still).
            retired.extend(refs.retired_of(collections, (p for p in c.parts if p.id in gone),
                                           seq=seq, wall_ms=wall_ms,
                                           changed=collections[name]))
        case SetHold(name=name):
            collections[name] = named.applied(collections[name], op, wall_ms=wall_ms)
        case Forget(keys=keys):
            drop = set(keys)
            retired[:] = [r for r in retired if r.key not in drop]
        case EvolveSchema(name=name, schema=schema):
            collections[name] = evolve.evolved(collections[name], schema)
        case Restore():
            refs.apply_restore(collections, retired, op, seq=seq, wall_ms=wall_ms)


#: A collection's history keeps its most recent seals, this many (bounded so that a rollup of
#: many collections sealed often stays small).
HISTORY_ENTRIES = 256


def _tally(c: CollectionMeta, p: PartMeta) -> HistoryEntry:
    """``c``'s counts since its last seal with part ``p`` added."""
    u = c.unsealed if c.unsealed is not msgspec.UNSET else HistoryEntry(c.upper, 0, 0, 0, 0, 0)
    ins = p.inserted if p.inserted is not msgspec.UNSET else None
    ret = p.retracted if p.retracted is not msgspec.UNSET else None
    return HistoryEntry(
        u.upper, u.wall_ms, u.seq, u.updates + p.rows,
        None if u.inserted is None or ins is None else u.inserted + ins,
        None if u.retracted is None or ret is None else u.retracted + ret)


def _sealed(c: CollectionMeta, upper: int, *, seq: int, wall_ms: int) -> CollectionMeta:
    """``c`` with upper advanced to ``upper`` by commit ``seq`` at ``wall_ms``, the seal and
    what was added since the previous one recorded in its history."""
    u = c.unsealed if c.unsealed is not msgspec.UNSET else HistoryEntry(c.upper, 0, 0, 0, 0, 0)
    entry = HistoryEntry(upper, wall_ms, seq, u.updates, u.inserted, u.retracted)
    old = c.history if c.history is not msgspec.UNSET else ()
    history = (*old[-(HISTORY_ENTRIES - 1):], entry)
    return replace(c, upper=upper, history=history,
                   unsealed=HistoryEntry(upper, wall_ms, seq, 0, 0, 0))


def apply(state: State, commit: Commit) -> State:
    """Replays a stored commit on ``state`` (the reader's path).

    Raises:
        Corruption: the commit does not follow ``state`` (a gap, a lower epoch, an op that
            fails its check): storage holds something persist never commits.
    """
    key = layout.log_key(commit.seq, log_from(state))
    if commit.seq != state.seq + 1:
        raise Corruption(key, f"does not follow seq {state.seq}")
    if commit.epoch < state.epoch:
        raise Corruption(key, f"epoch {commit.epoch} follows a commit of epoch {state.epoch}")
    sharded = state.log_from
    if commit.log_from is not msgspec.UNSET:
        # NB: the log is sharded once, by the commit right before the first sharded entry.
        if sharded is not msgspec.UNSET or commit.log_from != commit.seq + 1:
            raise Corruption(key, f"shards the log from seq {commit.log_from} "
                                  f"(already sharded from {sharded})")
        sharded = commit.log_from
    # NB: one copy of the map per commit (readers hold the old state: it is never mutated); the
    # retired blobs only for a commit that changes them (most commit no ReplaceParts or Forget).
    collections = (dict(state.collections) if any(isinstance(op, Restore) for op in commit.ops)
                   else pieces.copy_collections(state.collections))
    touching = any(touches_retired(op) for op in commit.ops)
    retired: list[Retired] = list(state.retired) if touching else []
    for op in commit.ops:
        try:
            check(collections, op, retired)
        except InvalidUsage as e:
            raise Corruption(key, f"invalid op {op!r}: {e}") from e
        apply_op(collections, retired, op, seq=commit.seq, wall_ms=commit.wall_ms)
    return State(
        seq=commit.seq,
        epoch=commit.epoch,
        writer=commit.writer,
        wall_ms=commit.wall_ms,
        next_cid=max([state.next_cid, *(op.collection.id + 1 for op in commit.ops
                                        if isinstance(op, Register))]),
        collections=collections,
        retired=tuple(retired) if touching else state.retired,
        log_from=sharded,
    )


def plan(state: State, ops: Iterable[Op], *, epoch: int, writer: str, wall_ms: int) -> Commit:
    """Builds the commit that follows ``state`` with ``ops`` (already checked by the caller).

    Raises:
        Fenced: ``state`` was committed by a newer writer than ``epoch``.
    """
    if state.epoch > epoch:
        raise Fenced(
            f"location taken over by writer {state.writer!r} (generation {state.epoch}); "
            f"this writer holds generation {epoch}"
        )
    # NB: the first commit on a log that is not sharded shards it (format 7): it is stored at
    # its flat key (arbitrated against an older writer's commit of that seq), the entries
    # after it under shards.
    shard: int | msgspec.UnsetType = (state.seq + 2 if state.log_from is msgspec.UNSET
                                      else msgspec.UNSET)
    return Commit(seq=state.seq + 1, epoch=epoch, writer=writer, wall_ms=wall_ms, ops=tuple(ops),
                  log_from=shard)
