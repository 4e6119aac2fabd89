"""Compaction: merging parts so reads stay fast however many small writes came before.

Policy (size-tiered, like an LSM): a part's level is ``floor(log4(rows))``. Whenever some level
holds ``FANIN`` parts, they are merged with every smaller part into one, consolidated and sorted
by (key, value, time), with times below the effective since forwarded to it. Each level thus
holds fewer than ``FANIN`` parts, so a read touches ``O(FANIN * log4(rows))`` parts after any
number of seals. Parts of ``final_rows`` rows or more are left alone: they are already cheap to
read and rewriting them again and again would cost more than it saves.

**Bounded, key-ordered output.** A merge's output, sorted by key, is cut into parts of about
``part_target_bytes`` (Arrow bytes) each, only where the key changes: a key's rows are never
split across two parts, so a large collection becomes parts with disjoint key ranges (what a
filtered read prunes by, :mod:`persist.indexed.read.prune`). Every part but the last of a merge
reached the target and is marked ``full``: like a final part it is never merged again. That is
what keeps the planner from re-merging split output forever: each merge of two or more
mergeable parts leaves at most one mergeable part (the remainder), so the number of mergeable
parts strictly falls with every merge of the same parts. (A single key holding more than the
target makes a part larger than it.)

**Rewriting old parts.** A blob part not in part format 4 (an Arrow stream of an older persist,
unsorted) is rewritten on its own (:func:`plan_rewrite`: a merge of one part) into a sorted
Parquet part, final and full parts included, which merging never picks: a bulk load written by
an older persist ends up sorted, and key-range reads then split it. The runtime rewrites one
part at a time, only while no command waits, and spends at most
``CompactionPolicy.rewrite_share`` of the maintenance thread's time on it (a rewrite that took
``d`` seconds is followed by ``d * (1 / share - 1)`` seconds without one), so rewrites never
starve the commit path.

Merging never changes the contents as of any time at or after the frontier it forwards to, so
it is invisible to every definite read. It runs off the commit path and lands as one
``ReplaceParts`` op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from persist import crashpoints
from persist.blob.base import Blob
from persist.errors import InvalidUsage
from persist.indexed.format import columnar, evolve, records, stats
from persist.indexed.format.meta import CollectionMeta, PartMeta, ReplaceParts
from persist.indexed.format.write import new_part
from persist.indexed.read.parts import PartReader
from persist.indexed.state.transitions import effective_since

FANIN = 4


@dataclass(frozen=True)
class CompactionPolicy:
    """When to merge (see the module docstring). Behaviour-preserving like every option.

    Raises:
        InvalidUsage: (on construction) a value that is not an integer in range.
    """

    #: Merge once a level holds this many parts (>= 2). Large: compaction (nearly) never runs.
    fanin: int = FANIN
    #: Parts of this many rows or more are never merged again (>= 1). Small: many small parts.
    final_rows: int = 1 << 19
    #: Inline parts are flushed into a blob part once they hold this many bytes together (>= 0).
    inline_flush_bytes: int = 1 << 20
    #: A merge's output is cut, at key boundaries, into parts of about this many Arrow
    #: (decoded) bytes (>= 1; stored parts are typically 2-5x smaller). Small: many small,
    #: key-disjoint parts.
    part_target_bytes: int = 64 << 20
    #: The share of the maintenance thread's time spent rewriting old parts into part format
    #: 4 (in ``[0, 1]``; 0: the background never rewrites them, an explicit maintenance round
    #: still does). Large: old parts become sorted sooner, at more CPU beside the commit path.
    rewrite_share: float = 0.25

    def __post_init__(self) -> None:
        for name, lo in (("fanin", 2), ("final_rows", 1), ("inline_flush_bytes", 0),
                         ("part_target_bytes", 1)):
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


def plan(c: CollectionMeta, policy: CompactionPolicy) -> tuple[PartMeta, ...]:
    """Chooses parts of ``c`` to merge now, or () if none need it. Final parts (of
    ``final_rows`` or more) and full ones (``PartMeta.full``) are never chosen."""
    live = [p for p in c.parts if p.rows < policy.final_rows and p.full is not True]
    if len(live) < 2:
        return ()
    inline = [p for p in live if p.inline is not None]
    by_level: dict[int, list[PartMeta]] = {}
    for p in live:
        by_level.setdefault(level(p), []).append(p)
    for lvl in sorted(by_level):
        if len(by_level[lvl]) >= policy.fanin:
            chosen = [p for p in live if level(p) <= lvl]
            return tuple(chosen)
    if len(inline) > 1 and sum(p.nbytes for p in inline) >= policy.inline_flush_bytes:
        return tuple(inline)
    return ()


def outdated(p: PartMeta) -> bool:
    """Whether ``p`` is a blob part not in the form persist writes now (a sorted Parquet
    part, format 4): what :func:`plan_rewrite` picks."""
    return p.blob_key is not None and p.rows > 0 and not (p.parquet and p.ordered)


def plan_rewrite(c: CollectionMeta) -> PartMeta | None:
    """The oldest blob part of ``c`` to rewrite into part format 4 (see the module
    docstring), or None if every one is current. Final and full parts included."""
    return next((p for p in c.parts if outdated(p)), None)


def merge(
    blob: Blob, reader: PartReader, c: CollectionMeta, parts: tuple[PartMeta, ...],
    *, inline_threshold: int, frontier: int | None = None, stats_bytes: int = stats.STATS_BYTES,
    batch_rows: int = columnar.BATCH_ROWS, part_target_bytes: int | None = None,
    keep_full: bool = False,
) -> ReplaceParts:
    """Merges ``parts`` of ``c`` into new parts (written to ``blob``), forwarding times to
    ``frontier`` (default and maximum: the effective since), cut by key into parts of about
    ``part_target_bytes`` (None: one part; see the module docstring). Parts written with older
    schema versions are migrated to the current one, which the new parts are.

    ``keep_full``: the last part is full too (a rewrite of one full part: it stays out of
    merges, as it was)."""
    since = effective_since(c)
    frontier = since if frontier is None else min(frontier, since)
    view = evolve.View.of(c)
    table = pa.concat_tables([view.read(reader, p) for p in parts])
    merged = columnar.consolidate(columnar.forward(table, frontier))
    added: list[PartMeta] = []
    for chunk, cut in split_by_key(merged, part_target_bytes):
        full = cut or keep_full
        # NB: a full part is never merged again, so it must not ride inline: every rollup
        # would carry it forever (inline parts are otherwise flushed into blobs by merging).
        added.append(evolve.tag(new_part(blob, c, chunk, consolidated=True, full=full,
                                         inline_threshold=0 if full else inline_threshold,
                                         stats_bytes=stats_bytes, batch_rows=batch_rows),
                                view.target))
    crashpoints.hit("compact.part_written")
    return ReplaceParts(name=c.name, removed=tuple(p.id for p in parts), added=tuple(added),
                        frontier=frontier)


def split_by_key(table: pa.Table, target_bytes: int | None) -> list[tuple[pa.Table, bool]]:
    """``table`` (sorted by key) cut into consecutive slices of about ``target_bytes`` Arrow
    bytes, each cut where the key changes; ``(slice, full)`` pairs, ``full`` for every slice
    but the last. An empty table gives none; None or a table within the target, one slice.

    NB: the size of a slice is estimated from the table's average bytes per row (exact for
    fixed-width columns); a cut lands at the first key change at or after the estimate.
    """
    n = len(table)
    if n == 0:
        return []
    nbytes = table.nbytes
    if target_bytes is None or nbytes <= target_bytes:
        return [(table, False)]
    rows = max(1, int(target_bytes * n // nbytes))
    starts = key_starts(table.column("key"))
    out: list[tuple[pa.Table, bool]] = []
    at = 0
    while True:
        i = int(np.searchsorted(starts, at + rows))
        if i >= len(starts):
            out.append((table.slice(at), False))
            return out
        cut = int(starts[i])
        out.append((table.slice(at, cut - at), True))
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
