"""Compaction: merging parts so reads stay fast however many small writes came before.

Policy (size-tiered, like an LSM): a part's level is ``floor(log4(rows))``. Whenever some level
holds ``FANIN`` parts, they are merged with every smaller part into one, consolidated and sorted
by (key, value, time), with times below the effective since forwarded to it. Each level thus
holds fewer than ``FANIN`` parts, so a read touches ``O(FANIN * log4(rows))`` parts after any
number of seals. Parts of ``final_rows`` rows or more are left alone: they are already cheap to
read and rewriting them again and again would cost more than it saves.

Merging never changes the contents as of any time at or after the frontier it forwards to, so
it is invisible to every definite read. It runs off the commit path and lands as one
``ReplaceParts`` op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa

from persist import crashpoints
from persist.blob.base import Blob
from persist.errors import InvalidUsage
from persist.indexed import columnar, evolve
from persist.indexed.meta import CollectionMeta, PartMeta, ReplaceParts
from persist.indexed.read import PartReader
from persist.indexed.state import effective_since
from persist.indexed.write import new_part

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

    def __post_init__(self) -> None:
        for name, lo in (("fanin", 2), ("final_rows", 1), ("inline_flush_bytes", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise InvalidUsage(f"CompactionPolicy.{name} must be an integer >= {lo}, "
                                   f"not {value!r}")


def level(p: PartMeta) -> int:
    """The size tier of ``p``: ``floor(log4(rows))`` (an empty part is level 0)."""
    return int(math.log(max(p.rows, 1), FANIN))


def plan(c: CollectionMeta, policy: CompactionPolicy) -> tuple[PartMeta, ...]:
    """Chooses parts of ``c`` to merge now, or () if none need it."""
    live = [p for p in c.parts if p.rows < policy.final_rows]
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


def merge(
    blob: Blob, reader: PartReader, c: CollectionMeta, parts: tuple[PartMeta, ...],
    *, inline_threshold: int, frontier: int | None = None,
) -> ReplaceParts:
    """Merges ``parts`` of ``c`` into at most one new part (written to ``blob``), forwarding
    times to ``frontier`` (default and maximum: the effective since). Parts written with
    older schema versions are migrated to the current one, which the new part is."""
    since = effective_since(c)
    frontier = since if frontier is None else min(frontier, since)
    view = evolve.View.of(c)
    table = pa.concat_tables([view.read(reader, p) for p in parts])
    merged = columnar.consolidate(columnar.forward(table, frontier))
    added: tuple[PartMeta, ...] = ()
    if len(merged):
        added = (evolve.tag(new_part(blob, c, merged, inline_threshold=inline_threshold,
                                     consolidated=True), view.target),)
    crashpoints.hit("compact.part_written")
    return ReplaceParts(name=c.name, removed=tuple(p.id for p in parts), added=added,
                        frontier=frontier)
