"""Compaction: a base of consolidated, key-disjoint parts, with a few newer runs on top.

**The goal layout.** Per collection, compaction keeps a *base*: blob parts that are
consolidated (sorted by ``(key, value, time)``, no two rows sharing all three, no zero diffs),
each at a single time (the since frontier the merge that wrote it forwarded to:
``min_time == max_time``), with exact key bounds in their stats (the ``key`` leaf's ``lo`` and
``hi``) that are disjoint from every other base part's: a key never straddles two base parts.
Everything else is a *run*: what appends, sink batches and forks added since. A read as of a
time at or after the base's reads the base without merging it and applies the runs on top.

Which parts are the base is a function of the metadata alone (:func:`layout`): among the parts
that qualify (above), the largest first, each one whose key range is disjoint from those already
taken. A key type without exact, totally ordered bounds (floats, strings, records) has no base:
its collections keep only the tiered runs below.

**Leveled merging into the base.** A run whose rows are all at or before the frontier the merge
may forward to (the effective since, or a lower in-process hold) is *ready*. Once the ready runs
hold at least ``1 / base_ratio`` of the rows of the base parts their key ranges overlap (part
key stats; a run without them overlaps every base part), or ``max_runs`` of them are big, they
are merged with exactly those base parts (:func:`merge`). The output is cut by key into parts of about ``part_target_bytes``, also
at every untouched base part's key range, so it joins the base as key-disjoint parts and the
untouched ones stay as they are. The merge works key range by key range: a range's rows of the
runs (sorted Parquet runs decoded only in the record batches the range reaches), and the base
parts in it, one range at a time. Big appends, sink batches and
``full`` parts an older persist wrote are runs like any other: a bulk load ends up in the base.
A collection with no base starts one once a ready run is a blob or its ready inline runs hold
``inline_flush_bytes`` (a small collection stays inline).

**Tiered runs.** Below the base, runs of fewer than ``final_rows`` rows are merged size-tiered:
a run's level is ``floor(log4(rows))``, and a level of ``fanin`` runs is merged with every
smaller run, consolidated, times forwarded (what a collection whose since stays behind its
writes gets, since only rows at or before the since can join the base). The output is cut by
key into parts of about ``part_target_bytes``; every piece but the last is marked ``full``
(``PartMeta.full``), as is every piece of a big append (:func:`persist.indexed.format.write.
new_parts`): a full run, like one of ``final_rows`` rows, is not tiered again and waits for a
merge into the base. Inline parts are also flushed into a blob part once they total
``inline_flush_bytes``. Each tier merge of two or more runs leaves at most one run that can be
tiered again, so tiering always ends; each base merge leaves no ready run, so the planner never
loops.

**Write amplification** (DESIGN.md §8 derives it): each base merge rewrites the base parts it
overlaps; with runs spread over the whole key range that is the base, which has then grown by at
least ``1 / base_ratio`` since its last rewrite, so over a collection's life every row is
rewritten about ``1 + base_ratio`` times by base merges, plus ``log_fanin(final_rows / append
rows)`` times while tiered. Runs on top: fewer than ``fanin`` per level below ``final_rows``,
plus fewer than ``max_runs`` bigger ones (that cap makes a base merge come sooner than the ratio
alone once the base holds more than ``base_ratio * max_runs`` big runs' rows).

**Rewriting old parts.** A blob part not in part format 4 (an Arrow stream of an older persist,
unsorted) is rewritten on its own (:func:`plan_rewrite`: a merge of one part) into a sorted
Parquet part. The runtime rewrites one part at a time, only while no command waits, and spends
at most ``CompactionPolicy.rewrite_share`` of the maintenance thread's time on it and on
merges of :data:`BUDGETED_ROWS` input rows or more (one that took ``d`` seconds is followed by
``d * (1 / share - 1)`` seconds without another), so big merges never starve the commit path.
While the background holds such a merge back, it runs :func:`interim` instead: the ready
inline runs flushed into a blob part and the other runs tiered, so they do not pile up in the
collection's metadata (and every rollup) until the big merge comes.

Merging never changes the contents as of any time at or after the frontier it forwards to, so
it is invisible to every definite read. It runs off the commit path and lands as one
``ReplaceParts`` op.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from persist import crashpoints
from persist.blob.base import Blob
from persist.errors import InvalidUsage, PersistError
from persist.indexed.format import columnar, evolve, records, sorting, stats
from persist.indexed.format.meta import CollectionMeta, PartMeta, ReplaceParts
from persist.indexed.format.write import new_part
from persist.indexed.read import split
from persist.indexed.read.parts import PartReader, encode_marks
from persist.indexed.state.transitions import effective_since
from persist.layout import DATA_PREFIX, data_key, parse_ref

FANIN = 4
#: A background merge of this many input rows or more (about 0.1 s of CPU) runs within the
#: rewrite budget (``CompactionPolicy.rewrite_share``); smaller ones run at once.
BUDGETED_ROWS = 1 << 18
#: The smallest stats budget of a base part: its ``key`` leaf with both bounds always fits,
#: whatever ``Options.stats_bytes`` (the base's reads and its merges rely on the bounds).
KEY_STATS_BYTES = 64

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompactionPolicy:
    """When to merge (see the module docstring). Behaviour-preserving like every option.

    Raises:
        InvalidUsage: (on construction) a value that is not an integer in range.
    """

    #: Merge once a level of runs holds this many parts (>= 2). Large: runs pile up on top of
    #: the base (reads merge more of them).
    fanin: int = FANIN
    #: Runs of this many rows or more are not tiered with other runs: they wait for a merge
    #: into the base (and an append this big is written as key-disjoint pieces in parallel)
    #: (>= 1).
    final_rows: int = 1 << 19
    #: Ready runs are merged into the base once their rows times this reach the rows of the
    #: base parts they overlap (>= 1). Large: more base rewrites (write amplification about
    #: ``1 + base_ratio``), fewer runs on top; small: the opposite.
    base_ratio: int = 4
    #: ... or once this many ready runs of ``final_rows`` rows or more (or ``full``) wait
    #: (>= 1): what bounds the parts a read merges on top of a large base, at the cost of
    #: rewriting it more often than ``base_ratio`` alone would.
    max_runs: int = 64
    #: Inline parts are flushed into a blob part once they hold this many bytes together, and
    #: a collection starts a base once its ready runs hold this many (>= 0).
    inline_flush_bytes: int = 1 << 20
    #: A base merge's output is cut, at key boundaries, into parts of about this many Arrow
    #: (decoded) bytes (>= 1; stored parts are typically 2-5x smaller). Small: many small,
    #: key-disjoint parts.
    part_target_bytes: int = 64 << 20
    #: The share of the maintenance thread's time spent rewriting old parts into part format
    #: 4 and on merges of ``BUDGETED_ROWS`` rows or more (in ``[0, 1]``; 0: the background
    #: does neither, an explicit maintenance round still does). Large: sooner, at more CPU
    #: beside the commit path.
    rewrite_share: float = 0.25
    #: A base of this many rows or more takes a *marks step* (:func:`mark`) when ready runs
    #: wait that do not yet call for a merge (and ``delta_ratio`` says so): the runs' rows and the base rows of the keys
    #: they touch are summed into one consolidated delta part, and those base rows are marked
    #: (hidden) in place instead of rewritten, so a read passes the base and the delta
    #: without summing (>= 1). Large: never (the runs wait for the merge, and reads apply
    #: them by key).
    marks_rows: int = 1 << 18
    #: A marks step since the last base merge waits until the ready runs outside the delta
    #: hold rows that, times this, reach the delta's rows (>= 1; the first step waits for
    #: nothing). A step re-makes the delta whole, so at 2 the delta grows by half or more a
    #: step and the steps between two base merges write at most 3x the last delta. Large: a
    #: step for nearly every run (reads apply fewer runs by key; the steps write about
    #: ``steps^2 x runs`` rows: 19.4x lifetime write amplification measured for 100 appends of
    #: mostly new keys, against 5.4x without steps).
    delta_ratio: int = 2

    def __post_init__(self) -> None:
        for name, lo in (("fanin", 2), ("final_rows", 1), ("base_ratio", 1), ("max_runs", 1),
                         ("inline_flush_bytes", 0), ("part_target_bytes", 1),
                         ("marks_rows", 1), ("delta_ratio", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise InvalidUsage(f"CompactionPolicy.{name} must be an integer >= {lo}, "
                                   f"not {value!r}")
        share = self.rewrite_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or \
                not 0.0 <= share <= 1.0:
            raise InvalidUsage(f"CompactionPolicy.rewrite_share must be a number in [0, 1], "
                               f"not {share!r}")


def level(p: PartMeta) -> int:
    """The size tier of ``p``: ``floor(log4(rows))`` (an empty part is level 0)."""
    return int(math.log(max(p.rows, 1), FANIN))


# -- the base ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _keyed(key_type: bytes, key_codec: str | None) -> bool:
    """Whether keys of this stored type have exact, totally ordered integer bounds: integers,
    dates and timestamps (a base needs them to tell its parts' key ranges apart)."""
    if key_codec is not None:
        return False
    t = columnar.deserialize_type(key_type)
    return bool(pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t))


def has_base(c: CollectionMeta) -> bool:
    """Whether ``c``'s key type allows a base (see the module docstring)."""
    return _keyed(c.key_type, c.key_codec)


#: A part's key bounds: ``(lo, hi, nulls)``, ``lo``/``hi`` None when every key is null.
Bounds = tuple[int | None, int | None, int]


def key_bounds(p: PartMeta) -> Bounds | None:
    """``p``'s key bounds from its stats, or None when unknown (no stats, or bounds trimmed)."""
    if p.stats is msgspec.UNSET:
        return None
    for leaf in p.stats.leaves:
        if leaf.path != "key":
            continue
        if isinstance(leaf.lo, int) and isinstance(leaf.hi, int):
            return leaf.lo, leaf.hi, leaf.nulls
        if leaf.nulls == p.rows:
            return None, None, leaf.nulls
        return None
    return None


def _same_key_type(c: CollectionMeta, p: PartMeta) -> bool:
    versions = evolve.history(c)
    sid = evolve.part_version(p)
    return 0 <= sid < len(versions) and versions[sid].key_type == c.key_type


def qualifies(c: CollectionMeta, p: PartMeta, frontier: int) -> bool:
    """Whether ``p`` may be a base part of ``c`` whose since frontier is ``frontier``: a
    consolidated blob part at one time, at or before it, with known key bounds of the
    collection's current key type."""
    return (p.blob_key is not None and p.consolidated and p.rows > 0
            and p.min_time == p.max_time <= frontier and key_bounds(p) is not None
            and _same_key_type(c, p))


def overlap(a: Bounds | None, b: Bounds | None) -> bool:
    """Whether two parts with these key bounds may share a key (None: unknown, they may).
    Null keys count as one key."""
    if a is None or b is None:
        return True
    (alo, ahi, anulls), (blo, bhi, bnulls) = a, b
    if anulls and bnulls:
        return True
    return (alo is not None and ahi is not None and blo is not None and bhi is not None
            and alo <= bhi and blo <= ahi)


def layout(c: CollectionMeta, frontier: int) -> tuple[tuple[PartMeta, ...], tuple[PartMeta, ...]]:
    """``(base, runs)``: ``c``'s parts split into its base (key-disjoint qualifying parts,
    the largest first, never a marks step's delta; ordered by key) and the rest, in the order
    of ``c.parts``. Pure."""
    if not has_base(c):
        return (), c.parts
    # NB: a marks step's delta is a run, never a base part: its key bounds overlap the marked
    # parts' (their stats bound their blobs' rows, marked ones included), so a delta taken
    # into the base first (it may be the largest part) pushed the marked base parts out as
    # runs, and the leveled rule then merged the whole base (17 base merges became 37 for 100
    # appends: 19.4x lifetime write amplification against 5.4x without marks)
    deltas = {p.marks.delta for p in c.parts if p.marks is not None}
    taken: list[tuple[PartMeta, Bounds]] = []
    for p in sorted((p for p in c.parts if p.id not in deltas and qualifies(c, p, frontier)),
                    key=lambda p: (-p.rows, p.id)):
        b = key_bounds(p)
        if all(not overlap(b, o) for _, o in taken):
            taken.append((p, b))  # type: ignore[arg-type]
    ids = {p.id for p, _ in taken}
    base = tuple(p for p, _ in sorted(taken, key=lambda pb: _order(pb[1])))
    return base, tuple(p for p in c.parts if p.id not in ids)


def _order(b: Bounds) -> tuple[int, int]:
    lo = b[0]
    return (1, 0) if lo is None else (0, lo)


def _frontier(c: CollectionMeta, frontier: int | None) -> int:
    since = effective_since(c)
    return since if frontier is None else min(frontier, since)


def plan(c: CollectionMeta, policy: CompactionPolicy, frontier: int | None = None
         ) -> tuple[PartMeta, ...]:
    """Chooses parts of ``c`` to merge now, or () if none need it: the ready runs with the
    base parts they overlap (a base merge), else a level of runs (a tier merge). ``frontier``:
    how far the merge may forward times (default and maximum: the effective since)."""
    f = _frontier(c, frontier)
    base, runs = layout(c, f)
    merged = _base_merge(c, policy, f, base, runs)
    if merged:
        return merged
    marked = _marks_step(c, policy, f, base, runs)
    if marked:
        return marked
    return _tiered([p for p in runs if p.rows < policy.final_rows and p.full is not True],
                   policy)


def _tiered(live: Sequence[PartMeta], policy: CompactionPolicy) -> tuple[PartMeta, ...]:
    """The tier merge of :func:`plan` among ``live`` (runs below ``final_rows``, not
    ``full``), or (): the lowest level holding ``fanin`` runs with every smaller run, else
    the inline runs once they hold ``inline_flush_bytes``."""
    if len(live) < 2:
        return ()
    inline = [p for p in live if p.inline is not None]
    by_level: dict[int, list[PartMeta]] = {}
    for p in live:
        by_level.setdefault(level(p), []).append(p)
    for lvl in sorted(by_level):
        if len(by_level[lvl]) >= policy.fanin:
            return tuple(p for p in live if level(p) <= lvl)
    if len(inline) > 1 and sum(p.nbytes for p in inline) >= policy.inline_flush_bytes:
        return tuple(inline)
    return ()


def interim(c: CollectionMeta, policy: CompactionPolicy, frontier: int | None = None
            ) -> tuple[PartMeta, ...]:
    """A merge of ``c``'s runs that may run while the one :func:`plan` chose waits (a base
    merge or a marks step of :data:`BUDGETED_ROWS` rows or more, which the background runs
    only within the rewrite budget), or (). Never a base part: the base is the waiting
    merge's.

    Why: while such a merge is due, :func:`plan` tiers nothing, and the ready runs (at or
    before the frontier) can leave only by it. Inline ones ride in every rollup of their
    collection until then: a long run of 100-row appends with the since following upper,
    against a base of 800 k rows, left 2,077 inline parts (8.1 MB) in one collection, and
    every rollup rewrote them. So meanwhile the ready inline runs, however few, are flushed
    into one blob part (:func:`flushes`: the runtime writes it as a blob whatever its size;
    a lone one is moved out of the metadata), else the ready runs below ``final_rows`` are
    tiered among themselves (into blob parts too), else the others, as :func:`plan` tiers
    runs (which bounds the inline ones past the frontier). The waiting merge then takes the
    flushed runs like any other. Its cost: a blob and a commit per round in which the
    frontier passed inline runs, and only while a big merge waits."""
    f = _frontier(c, frontier)
    _, runs = layout(c, f)
    live = [p for p in runs if p.rows < policy.final_rows and p.full is not True]
    ready = [p for p in live if p.rows == 0 or p.max_time <= f]
    inline = [p for p in ready if p.inline is not None]
    if inline:
        # NB: never big itself, or it would wait for the budget too: a merge that held the
        # maintenance thread for seconds let thousands of inline runs pile up meanwhile
        # (a 39 MB piece in bench.rollup_pieces), and flushing them all at once was big:
        # the oldest first, under BUDGETED_ROWS rows (the next plan takes the rest)
        out: list[PartMeta] = []
        rows = 0
        for p in inline:
            if out and rows + p.rows >= BUDGETED_ROWS:
                break
            out.append(p)
            rows += p.rows
        return tuple(out)
    ids = {p.id for p in ready}
    return _tiered(ready, policy) or _tiered([p for p in live if p.id not in ids], policy)


def flushes(c: CollectionMeta, parts: Sequence[PartMeta], frontier: int | None = None) -> bool:
    """Whether a merge of ``parts`` (an :func:`interim` one) writes a blob part whatever its
    size: every row of them is at or before the frontier, so the output can leave only by a
    merge into the base, and must not ride in every rollup until then."""
    f = _frontier(c, frontier)
    return has_base(c) and bool(parts) and all(p.rows == 0 or p.max_time <= f for p in parts)


def _base_merge(c: CollectionMeta, policy: CompactionPolicy, f: int,
                base: tuple[PartMeta, ...], runs: tuple[PartMeta, ...]) -> tuple[PartMeta, ...]:
    """The parts of the base merge :func:`plan` wants now (``base``, ``runs``: ``layout(c,
    f)``), or ()."""
    if not has_base(c):
        return ()
    ready = [p for p in runs if p.rows == 0 or p.max_time <= f]
    if not ready:
        return ()
    bounds = [key_bounds(p) for p in ready]
    hit = {b.id for b in base if any(overlap(x, key_bounds(b)) for x in bounds)}
    # NB: a delta's keys came from the base parts whose marks name it: it is merged with all
    # of them (their marks then go), never alone (the parts would name a delta gone, and
    # hide rows a new base part holds: exact, but no read could pair them again)
    ids = {p.id for p in ready}
    hit |= {b.id for b in base if b.marks is not None and b.marks.delta in ids}
    rows = sum(p.rows for p in ready)
    big = sum(1 for p in ready if p.full is True or p.rows >= policy.final_rows)
    if (base or any(p.blob_key is not None for p in ready)
            or sum(p.nbytes for p in ready) >= policy.inline_flush_bytes) and (
            rows * policy.base_ratio >= sum(b.rows for b in base if b.id in hit)
            or big >= policy.max_runs):
        chosen = {p.id for p in ready} | hit
        return tuple(p for p in c.parts if p.id in chosen)
    return ()


def _marks_step(c: CollectionMeta, policy: CompactionPolicy, f: int,
                base: tuple[PartMeta, ...], runs: tuple[PartMeta, ...]
                ) -> tuple[PartMeta, ...]:
    """The parts of the marks step (:func:`mark`) :func:`plan` wants now when no base merge
    is due, or (): every base part and every ready run, when the base holds
    ``policy.marks_rows`` rows or more and a ready run with rows is not the base's delta
    already (the one its marks name). Every part of the current schema version (an older
    one is the merge's to migrate)."""
    if not has_base(c) or not base or sum(b.rows for b in base) < policy.marks_rows:
        return ()
    target = evolve.version(c)
    ready = [p for p in runs if p.rows and p.max_time <= f]
    if any(evolve.part_version(p) != target for p in (*base, *ready)):
        return ()
    # NB: marks are positions in a blob's rows; a fork's part whose time cut hides some of
    # them reads fewer rows than its blob holds (the merge's to rewrite)
    if any(b.blob_key is None or parse_ref(b.blob_key)[2] is not None for b in base):
        return ()
    delta = split.paired(base, ready, f, columnar.deserialize_type(c.key_type))
    fresh = [p for p in ready if delta is None or p.id != delta.id]
    if not fresh:
        return ()
    # NB: a step re-makes the delta whole; taken for every new run, the k-th step since a
    # base merge writes k runs' rows (see CompactionPolicy.delta_ratio)
    if delta is not None and sum(p.rows for p in fresh) * policy.delta_ratio < delta.rows:
        return ()
    chosen = {p.id for p in ready} | {b.id for b in base}
    return tuple(p for p in c.parts if p.id in chosen)


def marking(c: CollectionMeta, parts: Sequence[PartMeta], policy: CompactionPolicy,
            frontier: int | None = None) -> bool:
    """Whether ``parts`` (planned by :func:`plan`) are a marks step (:func:`mark`), not a
    merge."""
    f = _frontier(c, frontier)
    base, runs = layout(c, f)
    if _base_merge(c, policy, f, base, runs):
        return False
    step = _marks_step(c, policy, f, base, runs)
    return bool(step) and {p.id for p in step} == {p.id for p in parts}


def into_base(c: CollectionMeta, parts: Sequence[PartMeta], frontier: int | None = None, *,
              flush_bytes: int = 0) -> bool:
    """Whether merging ``parts`` of ``c`` (forwarded to ``frontier``) writes base parts: every
    row is at or before the frontier, every base part a run among them overlaps is among
    them, and they hold a base part, a blob part or ``flush_bytes`` (inline parts alone
    stay inline until then). Else the merge writes a run."""
    if not has_base(c) or not parts:
        return False
    f = _frontier(c, frontier)
    if any(p.rows and p.max_time > f for p in parts):
        return False
    base, _ = layout(c, f)
    ids = {p.id for p in parts}
    base_ids = {b.id for b in base}
    runs = [key_bounds(p) for p in parts if p.id not in base_ids]
    if any(overlap(r, key_bounds(b)) for b in base if b.id not in ids for r in runs):
        return False
    return (bool(ids & base_ids) or any(p.blob_key is not None for p in parts)
            or sum(p.nbytes for p in parts) >= flush_bytes)


def outdated(p: PartMeta) -> bool:
    """Whether ``p`` is a blob part not in the form persist writes now (a sorted Parquet
    part, format 4): what :func:`plan_rewrite` picks."""
    return p.blob_key is not None and p.rows > 0 and not (p.parquet and p.ordered)


def plan_rewrite(c: CollectionMeta) -> PartMeta | None:
    """The oldest blob part of ``c`` to rewrite into part format 4 (see the module
    docstring), or None if every one is current."""
    return next((p for p in c.parts if outdated(p)), None)


# -- merging ----------------------------------------------------------------------------------


def merge(
    blob: Blob, reader: PartReader, c: CollectionMeta, parts: tuple[PartMeta, ...],
    *, inline_threshold: int, frontier: int | None = None, stats_bytes: int = stats.STATS_BYTES,
    batch_rows: int = columnar.BATCH_ROWS, part_target_bytes: int | None = None,
    base: bool = False, keep_full: bool = False,
) -> ReplaceParts:
    """Merges ``parts`` of ``c`` into new parts (written to ``blob``), forwarding times to
    ``frontier`` (default and maximum: the effective since). Parts written with older schema
    versions are migrated to the current one, which the new parts are.

    ``base`` (see :func:`into_base`): the output joins the base, key range by key range, cut
    by key into blob parts of about ``part_target_bytes`` and at every untouched base part.
    Else the output is a run, cut the same way by size (None: one part), every piece but the
    last ``full`` (not tiered again); ``keep_full``: the last too (a rewrite of one full part).
    A run of at most ``inline_threshold`` bytes rides inline.

    Raises:
        ExternalError: reading or writing a part failed (the parts it wrote are deleted again,
            best effort).
    """
    f = _frontier(c, frontier)
    view = evolve.View.of(c)
    added: list[PartMeta] = []
    try:
        if base:
            for chunk in _base_chunks(reader, view, c, parts, f, part_target_bytes):
                merged = columnar.consolidate(chunk)
                for piece in split_by_key(merged, part_target_bytes):
                    added.append(evolve.tag(new_part(
                        blob, c, piece, consolidated=True, inline_threshold=0,
                        stats_bytes=max(stats_bytes, KEY_STATS_BYTES), batch_rows=batch_rows),
                        view.target))
        else:
            table = pa.concat_tables([view.read(reader, p) for p in parts])
            merged = columnar.consolidate(columnar.forward(table, f))
            pieces = split_by_key(merged, part_target_bytes)
            for i, piece in enumerate(pieces):
                full = keep_full or i < len(pieces) - 1
                # NB: a full run is never tiered again, only merged into a base, so it must
                # not ride inline: every rollup would carry it until then.
                added.append(evolve.tag(new_part(
                    blob, c, piece, consolidated=True, full=full,
                    inline_threshold=0 if full else inline_threshold,
                    stats_bytes=stats_bytes, batch_rows=batch_rows), view.target))
    except BaseException:
        for p in added:
            if p.blob_key is not None:
                with contextlib.suppress(PersistError):
                    blob.delete(p.blob_key)
        raise
    crashpoints.hit("compact.part_written")
    return ReplaceParts(name=c.name, removed=tuple(p.id for p in parts), added=tuple(added),
                        frontier=f)


def mark(blob: Blob, reader: PartReader, c: CollectionMeta, parts: tuple[PartMeta, ...], *,
         frontier: int | None = None, stats_bytes: int = stats.STATS_BYTES,
         batch_rows: int = columnar.BATCH_ROWS) -> ReplaceParts:
    """The marks step over ``parts`` (:func:`plan`'s, :func:`marking`: every base part of
    ``c`` and its ready runs), forwarding times to ``frontier`` (default and maximum: the
    effective since): instead of rewriting the base, it writes

    * one consolidated *delta* part: the runs' rows and the base rows of every key they hold,
      summed, at the frontier (a blob part; none when everything cancels);
    * per base part, a *marked* part: the same data blob, its rows at those keys hidden by
      a marks blob (:class:`~persist.indexed.format.stats.Marks`: the positions it hid
      before and the new ones; an unchanged set keeps its blob), naming the delta.

    The op replaces the base parts and the runs (a previous delta is one) with those parts,
    in one commit; the state refuses it if one of them is gone meanwhile. Exact as every
    merge: a group of rows consolidation sums has one key, so a key's rows are either all
    in the delta (its base rows marked) or all in the base (no run holds it).

    Raises:
        DiffOverflow: a diff sum left int64 (nothing written).
        ExternalError: reading or writing failed (what it wrote is deleted again, best effort).
    """
    f = _frontier(c, frontier)
    view = evolve.View.of(c)
    base, _ = layout(c, f)
    ids = {p.id for p in parts}
    base = tuple(b for b in base if b.id in ids)
    base_ids = {b.id for b in base}
    runs = [p for p in parts if p.id not in base_ids and p.rows]
    table = (pa.concat_tables([view.read(reader, p) for p in runs]) if runs
             else view.schema.empty_table())
    keys = pc.unique(records.one_nan(table.column("key")))
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    touched: list[pa.Table] = []
    positions: list[tuple[PartMeta, npt.NDArray[np.int64], bool]] = []
    for b in base:
        # NB: the blob's rows as stored (positions are in them), then its live rows
        whole = view.read(reader, unmarked_meta(b))
        old = reader.marks(b)
        live = np.ones(len(whole), dtype=bool)
        if old is not None and len(old):
            live[old] = False
        hit = np.asarray(pc.is_in(records.one_nan(whole.column("key")), value_set=keys)
                         .to_numpy(zero_copy_only=False), dtype=bool) & live
        new = np.flatnonzero(hit).astype(np.int64)
        if len(new):
            touched.append(whole.take(pa.array(new)))
        pos = new if old is None else np.union1d(old, new).astype(np.int64)
        positions.append((b, pos, bool(len(new)) or old is None))
    merged = columnar.consolidate(columnar.forward(pa.concat_tables([*touched, table]), f))
    added: list[PartMeta] = []
    written: list[str] = []
    try:
        delta = None
        if len(merged):
            delta = evolve.tag(new_part(
                blob, c, merged, consolidated=True, inline_threshold=0,
                stats_bytes=max(stats_bytes, KEY_STATS_BYTES), batch_rows=batch_rows),
                view.target)
            assert delta.blob_key is not None
            written.append(delta.blob_key)
        delta_id = "" if delta is None else delta.id
        for b, pos, changed in positions:
            pid = uuid.uuid4().hex
            old_marks = b.marks
            if not changed and old_marks is not None:
                m = msgspec.structs.replace(old_marks, delta=delta_id)
            elif not len(pos):
                m = stats.Marks(key="", nbytes=0, crc=0, count=0, delta=delta_id)
            else:
                key = data_key(c.id, f"{pid}{MARKS_SUFFIX}")
                data = encode_marks(pos)
                written.append(key)
                m = stats.Marks(key=key, nbytes=len(data), crc=blob.set_plain(key, data),
                                count=len(pos), delta=delta_id)
            st = b.stats
            assert not isinstance(st, msgspec.UnsetType)  # a base part has key stats
            added.append(msgspec.structs.replace(b, id=pid,
                                                 stats=msgspec.structs.replace(st, marks=m)))
        if delta is not None:
            added.append(delta)
    except BaseException:
        for key in written:
            with contextlib.suppress(PersistError):
                blob.delete(key)
        raise
    crashpoints.hit("compact.marks_written")
    return ReplaceParts(name=c.name, removed=tuple(p.id for p in parts), added=tuple(added),
                        frontier=f)


#: The name a marks blob's key ends with: ``data/<cid>/<marked part id>.marks``.
MARKS_SUFFIX = ".marks"


def unmarked_meta(p: PartMeta) -> PartMeta:
    """``p`` without its marks: what reads its whole blob."""
    st = p.stats
    if isinstance(st, msgspec.UnsetType) or st.marks is None:
        return p
    return msgspec.structs.replace(p, stats=msgspec.structs.replace(st, marks=None))


def written(op: ReplaceParts) -> list[str]:
    """The keys of the blobs a merge or a marks step (``op``, not committed) wrote: each
    added part's own blob (named after its id, ``data/<cid>/<id>``) and marks blob
    (``<id>.marks``), never a data blob a marked part shares with the part it replaces."""
    out = []
    for p in op.added:
        if p.blob_key is not None and p.blob_key.startswith(DATA_PREFIX) \
                and p.blob_key.rsplit("/", 1)[-1] == p.id:
            out.append(p.blob_key)
        m = p.marks
        if m is not None and m.key.startswith(DATA_PREFIX) \
                and m.key.rsplit("/", 1)[-1] == f"{p.id}{MARKS_SUFFIX}":
            out.append(m.key)
    return out


def _keys(table: pa.Table) -> npt.NDArray[np.generic]:
    """The non-null keys of ``table`` (sorted by key, nulls last) as integers."""
    col = table.column("key")
    col = col.slice(0, len(col) - col.null_count)
    t = col.type
    if pa.types.is_date32(t):
        col = col.cast(pa.int32())
    elif pa.types.is_timestamp(t):
        col = col.cast(pa.int64())
    return np.asarray(col.to_numpy())


@dataclass(frozen=True)
class _Lazy:
    """A run of a base merge read range by range: its stored bytes (verified, compressed) and
    the key bounds of its record batches, which are decoded only for the ranges they reach.
    Without its bytes (``data`` None), each range fetches only the row groups it reaches
    (:meth:`PartReader.read_groups`): a reader of one range of it (a distributed compaction's
    task) reads that much of it, not the whole."""

    part: PartMeta
    data: memoryview | None
    rows: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]

    @classmethod
    def of(cls, reader: PartReader, view: evolve.View, p: PartMeta, *,
           fetch: bool = True) -> _Lazy | None:
        """``p`` read lazily (``fetch``: its whole bytes fetched now, for several ranges;
        else each range fetches its own), or None when it cannot be: not a sorted Parquet part
        of the target schema version, one batch, null keys, or no exact per-batch key
        bounds."""
        st = p.stats
        if (st is msgspec.UNSET or not (p.parquet and p.ordered) or p.blob_key is None
                or evolve.part_version(p) != view.target or len(st.batch_rows) < 2):
            return None
        leaf = next((leaf for leaf in st.leaves if leaf.path == "key"), None)
        b = next((b for b in st.batches if b.path == "key"), None)
        if leaf is None or leaf.nulls or b is None or len(b.lo) != len(st.batch_rows):
            return None
        if not all(isinstance(x, int) for x in (*b.lo, *b.hi)):
            return None
        return cls(p, reader.fetch(p) if fetch else None, st.batch_rows, tuple(b.lo),  # type: ignore[arg-type]
                   tuple(b.hi))  # type: ignore[arg-type]

    def read(self, reader: PartReader, view: evolve.View, f: int,
             lower: tuple[int, str] | None, upper: tuple[int, str] | None) -> pa.Table:
        """Its rows with keys from ``lower`` to ``upper`` (cuts as in :func:`_base_chunks`;
        None: unbounded), forwarded to ``f``."""
        keep = [(lower is None or (h >= lower[0] if lower[1] == "left" else h > lower[0]))
                and (upper is None or (lo < upper[0] if upper[1] == "left" else lo <= upper[0]))
                for lo, h in zip(self.lo, self.hi, strict=True)]
        if not any(keep):
            return view.schema.empty_table()
        t = (reader.read_groups(self.part, view.schema, keep, self.rows) if self.data is None
             else reader.decode_batches(self.part, self.data, view.schema, keep, self.rows))
        k = _keys(t)
        a = 0 if lower is None else int(np.searchsorted(k, lower[0], side=_side(lower[1])))
        b = len(k) if upper is None else int(np.searchsorted(k, upper[0], side=_side(upper[1])))
        return columnar.forward(t.slice(a, max(0, b - a)), f)


#: A run read range by range, and a sorted table's keys as integers: public for the tasks of a
#: distributed compaction (:mod:`persist.distributed.compaction`), which merge as this module does.
LazyRun = _Lazy
sorted_keys = _keys


def _side(s: str) -> Literal["left", "right"]:
    return "left" if s == "left" else "right"


def _base_chunks(reader: PartReader, view: evolve.View, c: CollectionMeta,
                 parts: tuple[PartMeta, ...], f: int, target_bytes: int | None
                 ) -> Iterator[pa.Table]:
    """The rows of a base merge of ``parts``, forwarded to ``f``, as tables of consecutive
    key ranges in key order (a key's rows all in one), cut where an untouched base part or a
    rewritten one starts and, between them, about every part target of run rows.

    Memory: a sorted Parquet run with per-batch key bounds is held as its stored bytes and
    only the record batches a range reaches are decoded (:class:`_Lazy`); other runs (inline,
    unsorted, of another schema version, with null keys) are decoded once. Each rewritten
    base part is read only for its range. Null keys, which sort last, go to the range of the
    base part holding null keys (at most one does), else to the last range."""
    base, _ = layout(c, f)
    ids = {p.id for p in parts}
    base_ids = {b.id for b in base}
    hit = [b for b in base if b.id in ids]
    runs: list[pa.Table] = []
    lazy: list[_Lazy] = []
    for p in parts:
        if p.id in base_ids or not p.rows:
            continue
        lz = _Lazy.of(reader, view, p)
        if lz is not None:
            lazy.append(lz)
            continue
        t = columnar.forward(view.read(reader, p), f)
        same = p.ordered and evolve.part_version(p) == view.target
        runs.append(t if same else sorting.sort_updates(t))
    keys = [_keys(t) for t in runs]
    # A range starts at the first row whose key is >= a "left" cut's value, > a "right" one's.
    cuts: set[tuple[int, str]] = set()
    for b in base:
        lo, hi, _ = key_bounds(b) or (None, None, 0)
        if lo is None or hi is None:
            continue
        cuts.add((lo, "left"))
        if b.id not in ids:
            cuts.add((hi, "right"))
    spans = [(lo, hi) for b in hit for lo, hi, _ in (key_bounds(b) or (None, None, 0),)
             if lo is not None and hi is not None]
    n = sum(len(k) for k in keys) + sum(lz.part.rows for lz in lazy)
    if n and target_bytes is not None:
        # NB: candidate cuts from the biggest run: its keys, or its batches' lower bounds
        # (each standing for a batch of rows), spaced about a part target of all runs apart
        # (a range of two targets peaked at ~480 MiB more RSS merging 5 M rows of 4 int64s)
        if runs:
            per_row = max(1, sum(t.nbytes for t in runs) // max(1, sum(len(t) for t in runs)))
        else:
            first = lazy[0].read(reader, view, f, None, (lazy[0].hi[0], "right"))
            per_row = max(1, first.nbytes // max(1, len(first)))
        share = max(1, target_bytes // per_row)
        eager = max(range(len(keys)), key=lambda i: len(keys[i]), default=None)
        big_lazy = max(lazy, key=lambda lz: lz.part.rows, default=None)
        values: list[int]
        if big_lazy is not None and (eager is None or big_lazy.part.rows > len(keys[eager])):
            per_batch = max(1, big_lazy.part.rows // len(big_lazy.rows))
            step = max(1, share * big_lazy.part.rows // n // per_batch)
            values = list(big_lazy.lo[step::step])
        elif eager is not None:
            step = max(1, share * len(keys[eager]) // n)
            values = keys[eager][step::step].tolist()
        else:
            values = []
        for v in values:
            if not any(lo < v <= hi for lo, hi in spans):
                cuts.add((int(v), "left"))
    order = sorted(cuts, key=lambda cut: (cut[0], cut[1] == "right"))
    index = {cut: i + 1 for i, cut in enumerate(order)}
    pos = [[0, *(int(np.searchsorted(k, v, side=_side(s))) for v, s in order), len(k)]
           for k in keys]
    last = len(order)
    null_range = last
    where: dict[str, int] = {}
    for b in hit:
        lo, _, nulls = key_bounds(b) or (None, None, 0)
        r = last if lo is None else index[(lo, "left")]
        where[b.id] = r
        if nulls:
            null_range = r
    for r in range(last + 1):
        pieces = [t.slice(p[r], p[r + 1] - p[r]) for t, p in zip(runs, pos, strict=True)
                  if p[r + 1] > p[r]]
        lower = order[r - 1] if r > 0 else None
        upper = order[r] if r < last else None
        pieces.extend(t for t in (lz.read(reader, view, f, lower, upper) for lz in lazy)
                      if len(t))
        pieces.extend(columnar.forward(view.read(reader, b), f) for b in hit
                      if where[b.id] == r)
        if r == null_range:
            pieces.extend(t.slice(len(k)) for t, k in zip(runs, keys, strict=True)
                          if len(t) > len(k))
        if pieces:
            yield pa.concat_tables(pieces)


def split_by_key(table: pa.Table, target_bytes: int | None) -> list[pa.Table]:
    """``table`` (sorted by key) cut into consecutive slices of about ``target_bytes`` Arrow
    bytes, each cut where the key changes. An empty table gives none; None or a table within
    the target, one slice.

    NB: the size of a slice is estimated from the table's average bytes per row (exact for
    fixed-width columns); a cut lands at the first key change at or after the estimate.
    """
    n = len(table)
    if n == 0:
        return []
    nbytes = table.nbytes
    if target_bytes is None or nbytes <= target_bytes:
        return [table]
    rows = max(1, int(target_bytes * n // nbytes))
    starts = key_starts(table.column("key"))
    out: list[pa.Table] = []
    at = 0
    while True:
        i = int(np.searchsorted(starts, at + rows))
        if i >= len(starts):
            out.append(table.slice(at))
            return out
        cut = int(starts[i])
        out.append(table.slice(at, cut - at))
        at = cut


def key_starts(key: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.int64]:
    """The positions ``i > 0`` where a sorted ``key`` column changes: the row at ``i`` may be
    another key than the row before it. Conservative: rows that sort as ties but are different
    keys (``-0.0`` and ``0.0``, NaNs with other payloads) are not told apart, so no key's rows
    are on both sides of a position."""
    n = len(key)
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    same = np.ones(n - 1, dtype=bool)
    for col in records.frame(key):
        eq = records.weak_equal(col.slice(1), col.slice(0, n - 1))
        same &= np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)
    return np.flatnonzero(~same).astype(np.int64) + 1
