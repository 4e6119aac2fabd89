"""References between collections: forks, and what keeps a shared blob alive. Pure: no I/O.

A **fork** (``client.fork(name, as_of=t, into=...)``) is a new collection whose parts are the
source's, as of ``t``: each of its parts references the blob the source's part is stored in
(:func:`forked`), so a fork costs one metadata commit and no data. A part whose rows reach past
``t`` carries a *time cut*: its ``blob_key`` is a reference (:func:`persist.layout.ref_key`)
that hides the rows after ``t`` from every read (the part reader applies it), and its
``max_time`` is ``t``. A fork across locations of one store references the source location's
blobs by that location's root (:mod:`persist.indexed.state.pins` keeps them from the source's
GC). Fork and source then evolve independently: each writes, seals, compacts (a merge reads
through the cut and writes a blob of its own) and evolves its schema alone.

**A blob is retired only when no collection references it any more** (:func:`retired_of`): a
merge that replaces a part retires its blob only if no other collection (a fork, the source)
still holds it, and the last collection to let go retires it. That is a function of the state
alone, so the writer and every replica agree on it, and the GC (which deletes only retired
blobs) never deletes a blob a live collection references. Only forks reference blobs they do
not own (the state transitions refuse a collection that does without saying where it was
forked from), so only the owner of a key and forks are ever asked.

A **restore** (:func:`restore_op`, the op :class:`~persist.indexed.format.meta.Restore`) puts
the collections back as they were at an earlier seq in one new commit: it retires what only the
current state references and un-retires what the restored one needs, and refuses if a blob it
needs is already gone (forgotten by GC).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from persist import layout
from persist.errors import InvalidUsage
from persist.indexed.format import columnar, evolve
from persist.indexed.format.meta import (
    CollectionMeta,
    HistoryEntry,
    Lineage,
    PartMeta,
    Restore,
    Retired,
    State,
    borrows,
)
from persist.indexed.format.write import diff_sums
from persist.indexed.state.holds import effective_since

replace = msgspec.structs.replace


def blob_of(p: PartMeta) -> tuple[str | None, str] | None:
    """The blob part ``p`` reads: ``(root, key)`` (root None: this location), or None for an
    inline part."""
    if p.blob_key is None:
        return None
    root, key, _ = layout.parse_ref(p.blob_key)
    return root, key


def blobs_of(p: PartMeta) -> Iterator[tuple[str | None, str]]:
    """Every blob part ``p`` reads: its data blob (:func:`blob_of`) and, for a marked part,
    its marks blob, each as ``(root, key)`` (root None: this location)."""
    b = blob_of(p)
    if b is not None:
        yield b
    m = p.marks
    if m is not None and m.count:
        root, key, _ = layout.parse_ref(m.key)
        yield root, key


def local_keys(c: CollectionMeta) -> Iterator[str]:
    """The keys of this location's blobs that ``c``'s parts read (marks blobs included)."""
    for p in c.parts:
        for root, key in blobs_of(p):
            if root is None:
                yield key


def referenced(collections: Iterable[CollectionMeta]) -> set[str]:
    """Every key of this location's blobs that a part of ``collections`` reads."""
    return {k for c in collections for k in local_keys(c)}


def foreign(collections: Iterable[CollectionMeta]) -> dict[str, set[str]]:
    """The blobs of other locations that parts of ``collections`` read: root -> keys."""
    out: dict[str, set[str]] = {}
    for c in collections:
        for p in c.parts:
            for root, key in blobs_of(p):
                if root is not None:
                    out.setdefault(root, set()).add(key)
    return out


def restored_at(c: CollectionMeta) -> int | None:
    """The seq of the restore that last rewound ``c`` (None: never)."""
    return c.lineage.restored if c.lineage is not msgspec.UNSET else None


def is_fork(c: CollectionMeta) -> bool:
    """Whether ``c`` was made by a fork (it may reference blobs it does not own)."""
    return c.lineage is not msgspec.UNSET and c.lineage.source is not None


def retired_of(collections: Mapping[str, CollectionMeta], removed: Iterable[PartMeta], *,
               seq: int, wall_ms: int, changed: CollectionMeta | None = None
               ) -> list[Retired]:
    """The blobs of ``removed`` parts (just dropped from a collection of ``collections``,
    which already holds the collection without them: ``changed``, if given) that no
    collection references any more: what the commit ``seq`` at ``wall_ms`` retires. Blobs of
    other locations are never retired here (their own location's GC decides,
    :mod:`persist.indexed.state.pins`)."""
    keys = list(dict.fromkeys(key for p in removed for root, key in blobs_of(p)
                              if root is None))
    if not keys:
        return []
    # NB: only a key's owner and forks can reference it (check_register refuses any other
    # borrower). The owner always counts: a marks step (compaction) replaces a base part by
    # a marked part reading the same data blob, which stays live.
    # NB: a map that answers it itself (a state loaded lazily, its working copy) keeps each
    # piece's answer: no pass over 10,000 collections per compaction commit
    where = getattr(collections, "where", None)
    holders = list(where(is_fork) if where is not None
                   else [c for c in collections.values() if is_fork(c)])
    owners = {layout.owner_of(k) for k in keys}
    if changed is not None and owners <= {str(changed.id)}:
        holders.append(changed)  # the usual case: the collection owns what it dropped
    else:
        holders += [c for c in collections.values() if str(c.id) in owners]
    want = set(keys)
    still = {k for c in holders for k in local_keys(c) if k in want}
    return [Retired(k, seq, wall_ms) for k in keys if k not in still]


def check_register(collections: Mapping[str, CollectionMeta], c: CollectionMeta) -> None:
    """A collection registered with parts that reference blobs it does not own (a fork) must
    say where it was forked from, and every blob of this location it reads must be one a
    live part reads now (not retired: GC may be deleting it).

    Raises:
        InvalidUsage: either rule is broken; nothing changes.
    """
    if not borrows(c):
        return
    if not is_fork(c):
        raise InvalidUsage(f"collection {c.name!r} references blobs it does not own but does "
                           f"not say where it was forked from")
    live = referenced(collections.values())
    gone = [k for k in local_keys(c) if k not in live]
    if gone:
        raise InvalidUsage(f"fork {c.name!r} references blobs no collection holds any more "
                           f"(retired or deleted): {gone[:5]}; fork from a newer state")


# -- forks ---------------------------------------------------------------------------------


def fork_time(src: CollectionMeta, as_of: int | None) -> int | None:
    """The time a fork of ``src`` is made as of: ``as_of``, checked to be readable, or by
    default the latest sealed time (None: nothing is sealed, the fork is empty).

    Raises:
        InvalidUsage: ``as_of`` is not a time in ``[since, upper)``.
    """
    if as_of is None:
        return src.upper - 1 if src.upper > 0 else None
    if isinstance(as_of, bool) or not isinstance(as_of, int):
        raise InvalidUsage(f"fork as_of must be an integer time, not {as_of!r}")
    since = effective_since(src)
    if not since <= as_of < src.upper:
        raise InvalidUsage(f"fork of {src.name!r} as of {as_of} is outside [{since}, {src.upper})"
                           f" (since, upper): only a sealed time that is still distinguishable "
                           f"can be forked")
    return as_of


def forked(src: CollectionMeta, *, name: str, cid: int, as_of: int | None, src_seq: int,
           root: str | None = None, location: str | None = None) -> CollectionMeta:
    """The fork of ``src`` as of ``as_of`` (see :func:`fork_time`) named ``name`` with id
    ``cid``: ``src``'s types, schema history, since and history up to ``as_of``, and a part
    per part of ``src`` with a row at or before ``as_of``, referencing its blob. A part with
    rows past ``as_of`` hides them (a time cut; an inline part is cut by re-encoding the
    bytes it carries). No data blob is read or written.

    Args:
        root: ``src``'s location's root when the fork goes to another location (its blobs
            are then referenced there); None for a fork in the same location.
        location: the same root, recorded in the fork's lineage.

    Raises:
        InvalidUsage: ``as_of`` is not a readable time of ``src``.
    """
    t = fork_time(src, as_of)
    kept_parts = [] if t is None else [p for p in src.parts if p.rows and p.min_time <= t]
    # NB: each part gets an id of its own in the fork; a marked part's marks name their delta
    # by id (Marks.delta), so they are renamed with it, or the fork's read would not pair
    # the delta with the marked base (exact, but summed as a run)
    ids = {p.id: uuid.uuid4().hex for p in kept_parts}
    parts = () if t is None else tuple(_borrowed(src, p, t, root, ids) for p in kept_parts)
    upper = 0 if t is None else t + 1
    old = src.history if src.history is not msgspec.UNSET else ()
    kept = tuple(e for e in old if e.upper <= upper)
    last = kept[-1] if kept else None
    return CollectionMeta(
        id=cid, name=name, key_type=src.key_type, value_type=src.value_type,
        key_codec=src.key_codec, value_codec=src.value_codec,
        since=min(effective_since(src), upper), upper=upper, parts=parts, holds={},
        schemas=src.schemas,
        history=kept if kept else msgspec.UNSET,
        unsealed=HistoryEntry(last.upper, last.wall_ms, last.seq, 0, 0, 0) if last
        else msgspec.UNSET,
        lineage=Lineage(source=src.name, location=location, as_of=t, seq=src_seq))


def _borrowed(src: CollectionMeta, p: PartMeta, t: int, root: str | None,
              ids: Mapping[str, str]) -> PartMeta:
    """``p`` (a part of ``src``) as a part of its fork as of ``t``, with id ``ids[p.id]``
    (``ids``: the fork's id of each part of ``src`` it holds)."""
    pid = ids[p.id]
    if p.inline is not None:
        if p.max_time <= t:
            return replace(p, id=pid)
        schema = evolve.View.of(src).schemas.part_schema(evolve.part_version(p))
        table = columnar.decode_part(f"inline part {p.id}", p.inline, schema)
        table = table.filter(pc.less_equal(table.column("time"), pa.scalar(t, pa.uint64())))
        data, _ = columnar.encode_batches(table, columnar.BATCH_ROWS)
        inline = columnar.pack_inline(data)
        lo, hi = columnar.time_range(table)
        ins, ret = diff_sums(table)
        return replace(p, id=pid, rows=len(table), nbytes=len(inline), min_time=lo, max_time=hi,
                       inline=inline, inserted=ins, retracted=ret,
                       stats=msgspec.UNSET)
    assert p.blob_key is not None
    ref_root, key, upto = layout.parse_ref(p.blob_key)
    # NB: p.max_time already bounds the rows p shows (a cut part's is its cut), so a part
    # entirely at or before t keeps the cut it has, and one reaching past t is cut at t.
    cut = t if p.max_time > t else upto
    out = replace(p, id=pid, max_time=min(p.max_time, t),
                  blob_key=layout.ref_key(key, root=ref_root if ref_root is not None else root,
                                          upto=cut))
    m = p.marks
    if m is not None:
        if m.count and root is not None:
            # NB: a marked part's marks blob is read from the same location as its data blob.
            m_root, m_key, _ = layout.parse_ref(m.key)
            m = replace(m, key=layout.ref_key(m_key,
                                              root=m_root if m_root is not None else root))
        m = replace(m, delta=ids.get(m.delta, m.delta))
        assert not isinstance(out.stats, msgspec.UnsetType)
        out = replace(out, stats=replace(out.stats, marks=m))
    return out


# -- restore -------------------------------------------------------------------------------


def restore_op(target: State) -> Restore:
    """The op that puts the collections back as they were in ``target`` (a state replayed
    from the log, up to its seq)."""
    return Restore(seq=target.seq, collections=dict(target.collections))


def check_restore(collections: Mapping[str, CollectionMeta], retired: Iterable[Retired],
                  op: Restore) -> None:
    """A restore needs every blob of this location its collections read to be still there:
    read by a live part now, or retired and not yet forgotten.

    Raises:
        InvalidUsage: some are gone (GC deleted them); nothing changes.
    """
    have = referenced(collections.values()) | {r.key for r in retired}
    gone = sorted(referenced(op.collections.values()) - have)
    if gone:
        raise InvalidUsage(f"cannot restore seq {op.seq}: {len(gone)} blobs it reads were "
                           f"garbage collected, e.g. {gone[:3]}")
    for name, c in op.collections.items():
        if c.name != name:
            raise InvalidUsage(f"restore of seq {op.seq} stores {c.name!r} under {name!r}")


def apply_restore(collections: MutableMapping[str, CollectionMeta], retired: list[Retired], op: Restore,
                  *, seq: int, wall_ms: int) -> None:
    """Applies a checked restore to mutable working copies of a state's parts: every
    collection as ``op`` has it (those that changed marked ``restored`` at ``seq``), the blobs
    only the old collections read retired, those the new ones read un-retired."""
    before = referenced(collections.values())
    out: dict[str, CollectionMeta] = {}
    for name, c in op.collections.items():
        cur = collections.get(name)
        if cur is not None and cur == c:
            out[name] = cur
            continue
        lin = c.lineage if c.lineage is not msgspec.UNSET else Lineage()
        out[name] = replace(c, lineage=replace(lin, restored=seq))
    need = referenced(out.values())
    was = {r.key for r in retired}
    kept = [r for r in retired if r.key not in need]
    kept.extend(Retired(k, seq, wall_ms) for k in sorted(before - need - was))
    retired[:] = kept
    collections.clear()
    collections.update(out)


# -- costs ---------------------------------------------------------------------------------


@dataclass
class Costs:
    """What one collection's blobs cost, from the metadata (``persist inspect``)."""

    #: Bytes of every part it reads (blobs and inline parts): what its current state needs.
    live: int = 0
    #: Of those, bytes of parts holding updates at times in ``[effective since, since)``:
    #: history that only its holds and tags keep from being compacted.
    held: int = 0
    #: Bytes of blobs it reads that another collection here reads too, or that a fork in
    #: another location has pinned (:mod:`persist.indexed.state.pins`), by the other's name.
    shared: dict[str, int] = field(default_factory=dict)
    #: Bytes of blobs it reads that it does not own (a fork's view of its source).
    borrowed: int = 0
    #: Bytes of blobs it wrote that it no longer reads, kept alive only because forks do.
    for_forks: int = 0


def costs(state: State, pinned: Mapping[str, str] | None = None) -> dict[str, Costs]:
    """Per collection of ``state``, its :class:`Costs`.

    Args:
        pinned: keys of this location's blobs that forks in other locations pin, each with a
            name for who pins it (:func:`persist.indexed.state.pins.pinned`).
    """
    pinned = pinned or {}
    readers: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for name, c in state.collections.items():
        for p in c.parts:
            b = blob_of(p)
            if b is not None and b[0] is None:
                readers.setdefault(b[1], []).append(name)
                sizes[b[1]] = p.nbytes
    by_id = {str(c.id): name for name, c in state.collections.items()}
    out: dict[str, Costs] = {}
    for name, c in state.collections.items():
        k = out[name] = Costs()
        since, held_from = c.since, effective_since(c)
        own = layout.data_prefix(c.id)
        for p in c.parts:
            k.live += p.nbytes
            if held_from < since and p.rows and p.min_time < since and p.max_time >= held_from:
                k.held += p.nbytes
            b = blob_of(p)
            if b is None:
                continue
            if b[0] is not None or not b[1].startswith(own):
                k.borrowed += p.nbytes
            if b[0] is None:
                for other in dict.fromkeys(readers.get(b[1], ())):
                    if other != name:
                        k.shared[other] = k.shared.get(other, 0) + p.nbytes
                if b[1] in pinned:
                    who = pinned[b[1]]
                    k.shared[who] = k.shared.get(who, 0) + p.nbytes
    for key, names in readers.items():
        owner = by_id.get(layout.owner_of(key) or "")
        if owner is not None and owner not in names:
            out[owner].for_forks += sizes[key]
    return out


__all__ = ["Costs", "apply_restore", "blob_of", "blobs_of", "check_register", "check_restore", "costs",
           "foreign", "fork_time", "forked", "is_fork", "local_keys", "referenced",
           "restore_op", "restored_at", "retired_of"]
